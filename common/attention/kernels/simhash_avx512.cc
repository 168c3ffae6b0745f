// AVX-512 build (compiled with AVX-512 flags only here) of the SimHash projection kernel.
#include "common/simd/vec16_avx512-inl.h"

namespace magicpig::attention::internal::avx512 {
using namespace ::magicpig::simd16::avx512;  // NOLINT(build/namespaces): the kernel's vector ops
// 12 x 2 accumulators of AVX-512's 32 registers: a decode step's few query heads (SmolLM2's 9)
// fit one block, so W streams once per call (QueryHashSmall 21.2 -> 17.5 us against 6 rows).
constexpr int kProjectRows = 12;
constexpr int kProjectChunks = 2;
}  // namespace magicpig::attention::internal::avx512

#define MAGICPIG_PROJECT_NS avx512
#include "common/attention/kernels/simhash_kernel-inl.h"

namespace magicpig::attention::internal {
void ProjectAvx512(const ProjectArgs& args) { avx512::Run(args); }
}  // namespace magicpig::attention::internal
