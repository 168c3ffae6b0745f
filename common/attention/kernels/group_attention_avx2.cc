// AVX2 + FMA + F16C build (compiled with those flags only here) of the group attention kernel.
#include "common/simd/vec16_avx2-inl.h"

namespace magicpig::attention::internal::avx2 {
using namespace ::magicpig::simd16::avx2;  // NOLINT(build/namespaces): the kernel's vector ops
}  // namespace magicpig::attention::internal::avx2

#define MAGICPIG_GROUP_NS avx2
#include "common/attention/kernels/group_attention_kernel-inl.h"

namespace magicpig::attention::internal {
void GroupAttentionAvx2(const GroupAttentionArgs& args) { avx2::Run(args); }
void GroupScoresAvx2(const GroupAttentionArgs& args, float* x) { avx2::Scores(args, x); }
}  // namespace magicpig::attention::internal
