// AVX2 + FMA + F16C build of the attention tile kernel (compiled with those flags only here).
#include "common/simd/vec16_avx2-inl.h"

namespace magicpig::backend::cpu_internal::avx2 {
using namespace ::magicpig::simd16::avx2;  // NOLINT(build/namespaces): the kernel's vector ops
}  // namespace magicpig::backend::cpu_internal::avx2

#define MAGICPIG_ATTN_NS avx2
#include "gpu_node/backend/cpu/attention_kernel-inl.h"

namespace magicpig::backend::cpu_internal {
void AttentionTileAvx2(const AttentionTile& tile) { avx2::RunTile(tile); }
}  // namespace magicpig::backend::cpu_internal
