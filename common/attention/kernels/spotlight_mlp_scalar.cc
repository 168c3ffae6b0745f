// Baseline (x86-64) build of the Spotlight MLP kernel.
#include "common/simd/vec16_scalar-inl.h"

namespace magicpig::attention::internal::spotlight_scalar {
using namespace ::magicpig::simd16::scalar;  // NOLINT(build/namespaces): the kernel's vector ops
constexpr int kSpotlightRows = 4;
constexpr int kSpotlightChunks = 2;
inline V Div(V a, V b) {
  for (int i = 0; i < 16; ++i) a.x[i] /= b.x[i];
  return a;
}
}  // namespace magicpig::attention::internal::spotlight_scalar

#define MAGICPIG_SPOTLIGHT_NS spotlight_scalar
#include "common/attention/kernels/spotlight_mlp_kernel-inl.h"

namespace magicpig::attention::internal {
void SpotlightMlpScalar(const SpotlightMlpArgs& args) { spotlight_scalar::Run(args); }
}  // namespace magicpig::attention::internal
