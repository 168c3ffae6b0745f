// AVX-512 build (compiled with AVX-512 flags only here) of the group attention kernel.
#include "common/simd/vec16_avx512-inl.h"

namespace magicpig::attention::internal::avx512 {
using namespace ::magicpig::simd16::avx512;  // NOLINT(build/namespaces): the kernel's vector ops
}  // namespace magicpig::attention::internal::avx512

#define MAGICPIG_GROUP_NS avx512
#include "common/attention/kernels/group_attention_kernel-inl.h"

namespace magicpig::attention::internal {
void GroupAttentionAvx512(const GroupAttentionArgs& args) { avx512::Run(args); }
void GroupScoresAvx512(const GroupAttentionArgs& args, float* x) { avx512::Scores(args, x); }
}  // namespace magicpig::attention::internal
