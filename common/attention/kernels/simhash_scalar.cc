// Baseline (x86-64) build of the SimHash projection kernel.
#include "common/simd/vec16_scalar-inl.h"

namespace magicpig::attention::internal::scalar {
using namespace ::magicpig::simd16::scalar;  // NOLINT(build/namespaces): the kernel's vector ops
constexpr int kProjectRows = 4;
constexpr int kProjectChunks = 2;
}  // namespace magicpig::attention::internal::scalar

#define MAGICPIG_PROJECT_NS scalar
#include "common/attention/kernels/simhash_kernel-inl.h"

namespace magicpig::attention::internal {
void ProjectScalar(const ProjectArgs& args) { scalar::Run(args); }
}  // namespace magicpig::attention::internal
