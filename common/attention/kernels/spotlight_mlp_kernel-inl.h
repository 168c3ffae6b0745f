// Template body of the Spotlight MLP kernel (spotlight_mlp_kernel.h); included once per ISA unit
// after it brings a common/simd/vec16_<isa>-inl.h namespace into
// magicpig::attention::internal::MAGICPIG_SPOTLIGHT_NS and defines there Div(a, b) = a / b on V
// and the register blocking:
//   kSpotlightRows    rows per block,
//   kSpotlightChunks  16-column chunks per block,
// so that kSpotlightRows x kSpotlightChunks accumulators, the W chunks and a broadcast fit the
// ISA's registers (as in simhash_kernel-inl.h).
//
// Loop order per layer: column blocks outside, rows inside, so the W block (d x 16
// kSpotlightChunks floats: 8 KiB at d = 64) stays in L1 while every row of the call uses it. The
// first product writes h for the whole block of rows; the second reads it back.
#include <cstdint>

#include "common/attention/kernels/spotlight_mlp_kernel.h"

namespace magicpig::attention::internal {
namespace MAGICPIG_SPOTLIGHT_NS {

static_assert(kSpotlightColBlock % (kSpotlightChunks * kLanes) == 0,
              "the column padding must be a multiple of the kernel's column block");

// silu(a) = a / (1 + exp(-a)), evaluated as (max(a, 0) + min(a, 0) e) / (1 + e) with
// e = exp(-|a|) <= 1, so the exponential never overflows.
inline V Silu(V a) {
  const V pos = Max(a, Zero());
  const V neg = Sub(a, pos);
  const V e = ExpV(Sub(neg, pos));
  return Div(Fma(neg, e, pos), Add(Set1(1.0f), e));
}

// One product for rows [v0, v0 + kNv) and columns [c0, c0 + kSpotlightChunks * 16):
// acc = bias + in[row][0 .. d) . w[0 .. d)[col]. kHidden: hidden = scaled + silu(acc); else the
// outputs (columns < bits only).
template <int kNv, bool kHidden>
inline void Block(const SpotlightMlpArgs& a, const float* in, const float* w, const float* bias,
                  int64_t cols, int64_t v0, int64_t c0) {
  const int64_t dp = SpotlightPadded(a.d);
  V acc[kNv][kSpotlightChunks];
  for (int c = 0; c < kSpotlightChunks; ++c) {
    const V b = LoadF32(bias + c0 + c * kLanes);
    for (int v = 0; v < kNv; ++v) acc[v][c] = b;
  }
  const float* rows = in + v0 * dp;
  for (int64_t i = 0; i < a.d; ++i) {
    const float* wr = w + i * cols + c0;
    V wc[kSpotlightChunks];
    for (int c = 0; c < kSpotlightChunks; ++c) wc[c] = LoadF32(wr + c * kLanes);
    for (int v = 0; v < kNv; ++v) {
      const V xb = Set1(rows[v * dp + i]);
      for (int c = 0; c < kSpotlightChunks; ++c) acc[v][c] = Fma(xb, wc[c], acc[v][c]);
    }
  }
  for (int v = 0; v < kNv; ++v) {
    const int64_t row = v0 + v;
    for (int c = 0; c < kSpotlightChunks; ++c) {
      const int64_t col = c0 + c * kLanes;
      if constexpr (kHidden) {
        const V s = LoadF32(a.scaled + row * dp + col);
        Store(a.hidden + row * dp + col, Add(s, Silu(acc[v][c])));
      } else if (col < a.bits) {
        if (a.z != nullptr) Store(a.z + row * a.bits + col, acc[v][c]);
        if (a.codes != nullptr) {
          a.codes[row * (a.bits / 16) + col / 16] = static_cast<uint16_t>(PositiveMask(acc[v][c]));
        }
      }
    }
  }
}

// The last n - v0 < kSpotlightRows rows, as one block of exactly that many.
template <int kNv, bool kHidden>
inline void Tail(const SpotlightMlpArgs& a, const float* in, const float* w, const float* bias,
                 int64_t cols, int64_t v0, int64_t c0) {
  if constexpr (kNv > 0) {
    if (a.n - v0 == kNv) {
      Block<kNv, kHidden>(a, in, w, bias, cols, v0, c0);
    } else {
      Tail<kNv - 1, kHidden>(a, in, w, bias, cols, v0, c0);
    }
  }
}

template <bool kHidden>
inline void Product(const SpotlightMlpArgs& a, const float* in, const float* w, const float* bias,
                    int64_t cols) {
  constexpr int64_t kCols = kSpotlightChunks * kLanes;
  const int64_t full = a.n - a.n % kSpotlightRows;
  for (int64_t c0 = 0; c0 < cols; c0 += kCols) {
    for (int64_t v0 = 0; v0 < full; v0 += kSpotlightRows) {
      Block<kSpotlightRows, kHidden>(a, in, w, bias, cols, v0, c0);
    }
    Tail<kSpotlightRows - 1, kHidden>(a, in, w, bias, cols, full, c0);
  }
}

inline void Run(const SpotlightMlpArgs& a) {
  const int64_t dp = SpotlightPadded(a.d);
  for (int64_t r = 0; r < a.n; ++r) {
    const float* x = a.x + r * a.d;
    float* s = a.scaled + r * dp;
    for (int64_t i = 0; i < a.d; ++i) s[i] = a.in_scale * x[i];
    for (int64_t i = a.d; i < dp; ++i) s[i] = 0.0f;
  }
  Product<true>(a, a.scaled, a.w1t, a.b1, dp);
  Product<false>(a, a.hidden, a.w2t, a.b2, SpotlightPadded(a.bits));
}

}  // namespace MAGICPIG_SPOTLIGHT_NS
}  // namespace magicpig::attention::internal
