// Template body of the SimHash projection kernel (simhash_kernel.h); included once per ISA unit
// after it brings a common/simd/vec16_<isa>-inl.h namespace into
// magicpig::attn_internal::MAGICPIG_PROJECT_NS.
//
// Register blocking: 4 vectors x 32 columns (8 accumulators), W streamed row by row, so each W
// chunk loaded is used by 4 vectors and each broadcast x value by 2 chunks.
#include <cstdint>

#include "attn_node/core/kernels/simhash_kernel.h"

namespace magicpig::attn_internal {
namespace MAGICPIG_PROJECT_NS {

constexpr int kRows = 4;

template <int kNv>
inline void Block(const ProjectArgs& a, int64_t v0, int64_t c0) {
  V acc[kNv][2];
  for (int v = 0; v < kNv; ++v) acc[v][0] = acc[v][1] = Zero();
  for (int64_t i = 0; i < a.d; ++i) {
    const float* wr = a.w + i * a.cols + c0;
    const V w0 = LoadF32(wr), w1 = LoadF32(wr + kLanes);
    for (int v = 0; v < kNv; ++v) {
      const V xb = Set1(a.x[(v0 + v) * a.d + i]);
      acc[v][0] = Fma(xb, w0, acc[v][0]);
      acc[v][1] = Fma(xb, w1, acc[v][1]);
    }
  }
  for (int v = 0; v < kNv; ++v) {
    float* yr = a.y + (v0 + v) * a.cols + c0;
    Store(yr, acc[v][0]);
    Store(yr + kLanes, acc[v][1]);
  }
}

inline void Run(const ProjectArgs& a) {
  int64_t v0 = 0;
  for (; v0 + kRows <= a.n; v0 += kRows) {
    for (int64_t c0 = 0; c0 < a.cols; c0 += kProjectColBlock) Block<kRows>(a, v0, c0);
  }
  for (; v0 < a.n; ++v0) {
    for (int64_t c0 = 0; c0 < a.cols; c0 += kProjectColBlock) Block<1>(a, v0, c0);
  }
}

}  // namespace MAGICPIG_PROJECT_NS
}  // namespace magicpig::attn_internal
