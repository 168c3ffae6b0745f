// Baseline (x86-64) build of the group attention kernel.
#include "common/simd/vec16_scalar-inl.h"

namespace magicpig::attention::internal::scalar {
using namespace ::magicpig::simd16::scalar;  // NOLINT(build/namespaces): the kernel's vector ops
}  // namespace magicpig::attention::internal::scalar

#define MAGICPIG_GROUP_NS scalar
#include "common/attention/kernels/group_attention_kernel-inl.h"

namespace magicpig::attention::internal {
void GroupAttentionScalar(const GroupAttentionArgs& args) { scalar::Run(args); }
void GroupScoresScalar(const GroupAttentionArgs& args, float* x) { scalar::Scores(args, x); }
}  // namespace magicpig::attention::internal
