// AVX2 + FMA build (compiled with those flags only here) of the SimHash projection kernel.
#include "common/simd/vec16_avx2-inl.h"

namespace magicpig::attention::internal::avx2 {
using namespace ::magicpig::simd16::avx2;  // NOLINT(build/namespaces): the kernel's vector ops
constexpr int kProjectRows = 6;
constexpr int kProjectChunks = 1;
}  // namespace magicpig::attention::internal::avx2

#define MAGICPIG_PROJECT_NS avx2
#include "common/attention/kernels/simhash_kernel-inl.h"

namespace magicpig::attention::internal {
void ProjectAvx2(const ProjectArgs& args) { avx2::Run(args); }
}  // namespace magicpig::attention::internal
