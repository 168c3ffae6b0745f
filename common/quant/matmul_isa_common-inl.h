// Small helpers shared by the per-ISA MatMul units (matmul_avx2.cc, matmul_avx512.cc and their
// K-quant siblings; all compiled with at least AVX2 + FMA + F16C). Included inside each unit's
// anonymous namespace after that unit defines `kMaxTokens` (4), so every ISA gets its own copy
// compiled with its own flags: shared out-of-line helpers across units with different -m flags
// could let the linker pick a wider-ISA copy for a narrower unit.
// No include guard: included once per ISA translation unit.

inline uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// The fp16 at p as a float (F16C).
inline float LoadF16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return _cvtsh_ss(h);
}

inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Calls fn(t, std::integral_constant<int, NT>()) for the tokens [t0, t1) in chunks [t, t + NT):
// kMaxTokens at a time, then one chunk of the 1-3 left, so that the kernels are instantiated for
// a compile-time token count.
template <typename Fn>
void ForTokenChunks(int64_t t0, int64_t t1, Fn fn) {
  static_assert(kMaxTokens == 4, "the tail below covers 1-3 tokens");
  int64_t t = t0;
  for (; t + kMaxTokens <= t1; t += kMaxTokens) fn(t, std::integral_constant<int, kMaxTokens>());
  switch (t1 - t) {
    case 3:
      return fn(t, std::integral_constant<int, 3>());
    case 2:
      return fn(t, std::integral_constant<int, 2>());
    case 1:
      return fn(t, std::integral_constant<int, 1>());
    default:
      return;
  }
}

// Tokens per cache block: their quantised activations (~1-9 KiB each) stay in L1/L2 while every
// row of a task passes over them.
constexpr int64_t kTokenBlock = 64;

// Calls fn(tb, te) for the token blocks [tb, te) of [0, n_tokens), kTokenBlock tokens each.
template <typename Fn>
void ForTokenBlocks(int64_t n_tokens, Fn fn) {
  for (int64_t tb = 0; tb < n_tokens; tb += kTokenBlock) {
    fn(tb, n_tokens < tb + kTokenBlock ? n_tokens : tb + kTokenBlock);
  }
}
