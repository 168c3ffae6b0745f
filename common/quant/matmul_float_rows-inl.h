// Row drivers shared by the AVX2 and AVX-512 MatMul units: float-type rows over every token (in
// tiles of kMaxTokens). Included inside each unit's
// anonymous namespace after that unit defines `kMaxTokens`, `FloatRow<Loader, NT>(row, cols, x,
// out)` and `F32Loader`, so each ISA gets its own copy compiled with its own flags.
// No include guard: included once per ISA translation unit.

template <typename L>
void FloatRowAllTokens(const MatMulArgs& a, const uint8_t* row, int64_t r) {
  const float* x[kMaxTokens];
  float out[kMaxTokens];
  for (int64_t t = 0; t < a.n_tokens; t += kMaxTokens) {
    const int nt = static_cast<int>(a.n_tokens - t < kMaxTokens ? a.n_tokens - t : kMaxTokens);
    for (int i = 0; i < nt; ++i) x[i] = a.x + (t + i) * a.ldx;
    switch (nt) {
      case 4:
        FloatRow<L, 4>(row, a.cols, x, out);
        break;
      case 3:
        FloatRow<L, 3>(row, a.cols, x, out);
        break;
      case 2:
        FloatRow<L, 2>(row, a.cols, x, out);
        break;
      default:
        FloatRow<L, 1>(row, a.cols, x, out);
        break;
    }
    for (int i = 0; i < nt; ++i) a.y[(t + i) * a.ldy + r] = out[i];
  }
}

template <typename L>
void FloatRows(const MatMulArgs& a, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) FloatRowAllTokens<L>(a, a.w + r * a.row_bytes, r);
}
