// AVX-512 build of the attention tile kernel (compiled with AVX-512 flags only here).
#include "common/simd/vec16_avx512-inl.h"

namespace magicpig::backend::cpu_internal::avx512 {
using namespace ::magicpig::simd16::avx512;  // NOLINT(build/namespaces): the kernel's vector ops
}  // namespace magicpig::backend::cpu_internal::avx512

#define MAGICPIG_ATTN_NS avx512
#include "gpu_node/backend/cpu/attention_kernel-inl.h"

namespace magicpig::backend::cpu_internal {
void AttentionTileAvx512(const AttentionTile& tile) { avx512::RunTile(tile); }
}  // namespace magicpig::backend::cpu_internal
