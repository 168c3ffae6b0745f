// AVX-512 build (compiled with AVX-512 flags only here) of the Spotlight MLP kernel.
#include "common/simd/vec16_avx512-inl.h"

namespace magicpig::attention::internal::spotlight_avx512 {
using namespace ::magicpig::simd16::avx512;  // NOLINT(build/namespaces): the kernel's vector ops
constexpr int kSpotlightRows = 6;
constexpr int kSpotlightChunks = 2;
inline V Div(V a, V b) { return _mm512_div_ps(a, b); }
}  // namespace magicpig::attention::internal::spotlight_avx512

#define MAGICPIG_SPOTLIGHT_NS spotlight_avx512
#include "common/attention/kernels/spotlight_mlp_kernel-inl.h"

namespace magicpig::attention::internal {
void SpotlightMlpAvx512(const SpotlightMlpArgs& args) { spotlight_avx512::Run(args); }
}  // namespace magicpig::attention::internal
