// AVX2 + FMA build (compiled with those flags only here) of the Spotlight MLP kernel.
#include "common/simd/vec16_avx2-inl.h"

namespace magicpig::attention::internal::spotlight_avx2 {
using namespace ::magicpig::simd16::avx2;  // NOLINT(build/namespaces): the kernel's vector ops
constexpr int kSpotlightRows = 6;
constexpr int kSpotlightChunks = 1;
inline V Div(V a, V b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
}  // namespace magicpig::attention::internal::spotlight_avx2

#define MAGICPIG_SPOTLIGHT_NS spotlight_avx2
#include "common/attention/kernels/spotlight_mlp_kernel-inl.h"

namespace magicpig::attention::internal {
void SpotlightMlpAvx2(const SpotlightMlpArgs& args) { spotlight_avx2::Run(args); }
}  // namespace magicpig::attention::internal
