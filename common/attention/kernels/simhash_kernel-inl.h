// Template body of the SimHash projection kernel (simhash_kernel.h); included once per ISA unit
// after it brings a common/simd/vec16_<isa>-inl.h namespace into
// magicpig::attention::internal::MAGICPIG_PROJECT_NS and defines there the register blocking:
//   kProjectRows    vectors per block,
//   kProjectChunks  16-column chunks per block,
// so that kProjectRows x kProjectChunks accumulators, kProjectChunks W chunks and a broadcast fit
// the ISA's registers (AVX2: 6 x 1 = 12 of 16 ymm, as V is two of them).
//
// Loop order: column blocks outside, vectors inside, so the W block (d x 16 kProjectChunks
// floats: 4 KiB at d = 64) stays in L1 while every vector uses it and W streams from L2 once per
// call. Each accumulator goes straight to its sign bits; the projections are never stored.
#include <cstdint>

#include "common/attention/kernels/simhash_kernel.h"

namespace magicpig::attention::internal {
namespace MAGICPIG_PROJECT_NS {

static_assert(kProjectColBlock % (kProjectChunks * kLanes) == 0,
              "W's column padding must be a multiple of the kernel's column block");

template <int kNv>
inline void Block(const ProjectArgs& a, int64_t v0, int64_t c0) {
  V acc[kNv][kProjectChunks];
  for (int v = 0; v < kNv; ++v) {
    for (int c = 0; c < kProjectChunks; ++c) acc[v][c] = Zero();
  }
  const float* x = a.x + v0 * a.d;
  for (int64_t i = 0; i < a.d; ++i) {
    const float* wr = a.w + i * a.cols + c0;
    V w[kProjectChunks];
    for (int c = 0; c < kProjectChunks; ++c) w[c] = LoadF32(wr + c * kLanes);
    for (int v = 0; v < kNv; ++v) {
      const V xb = Set1(x[v * a.d + i]);
      for (int c = 0; c < kProjectChunks; ++c) acc[v][c] = Fma(xb, w[c], acc[v][c]);
    }
  }
  for (int v = 0; v < kNv; ++v) {
    uint16_t* out = a.bits + (v0 + v) * a.bits_stride + c0 / kLanes;
    for (int c = 0; c < kProjectChunks; ++c) {
      out[c] = static_cast<uint16_t>(PositiveMask(acc[v][c]));
    }
  }
}

// The last n - v0 < kProjectRows vectors, as one block of exactly that many.
template <int kNv>
inline void Tail(const ProjectArgs& a, int64_t v0, int64_t c0) {
  if constexpr (kNv > 0) {
    if (a.n - v0 == kNv) {
      Block<kNv>(a, v0, c0);
    } else {
      Tail<kNv - 1>(a, v0, c0);
    }
  }
}

inline void Run(const ProjectArgs& a) {
  constexpr int64_t kCols = kProjectChunks * kLanes;
  const int64_t full = a.n - a.n % kProjectRows;
  const int64_t col_end = a.col_end > 0 ? a.col_end : a.cols;
  for (int64_t c0 = a.col_begin; c0 < col_end; c0 += kCols) {
    for (int64_t v0 = 0; v0 < full; v0 += kProjectRows) Block<kProjectRows>(a, v0, c0);
    Tail<kProjectRows - 1>(a, full, c0);
  }
}

}  // namespace MAGICPIG_PROJECT_NS
}  // namespace magicpig::attention::internal
