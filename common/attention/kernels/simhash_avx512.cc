// AVX-512 build (compiled with AVX-512 flags only here) of the SimHash projection kernel.
#include "common/simd/vec16_avx512-inl.h"

namespace magicpig::attention::internal::avx512 {
using namespace ::magicpig::simd16::avx512;  // NOLINT(build/namespaces): the kernel's vector ops
constexpr int kProjectRows = 6;
constexpr int kProjectChunks = 2;
}  // namespace magicpig::attention::internal::avx512

#define MAGICPIG_PROJECT_NS avx512
#include "common/attention/kernels/simhash_kernel-inl.h"

namespace magicpig::attention::internal {
void ProjectAvx512(const ProjectArgs& args) { avx512::Run(args); }
}  // namespace magicpig::attention::internal
