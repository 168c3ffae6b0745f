// Baseline (x86-64) build of the attention tile kernel: 16-float vectors in plain C++.
#include "common/simd/vec16_scalar-inl.h"

namespace magicpig::backend::cpu_internal::scalar {
using namespace ::magicpig::simd16::scalar;  // NOLINT(build/namespaces): the kernel's vector ops
}  // namespace magicpig::backend::cpu_internal::scalar

#define MAGICPIG_ATTN_NS scalar
#include "gpu_node/backend/cpu/attention_kernel-inl.h"

namespace magicpig::backend::cpu_internal {
void AttentionTileScalar(const AttentionTile& tile) { scalar::RunTile(tile); }
}  // namespace magicpig::backend::cpu_internal
