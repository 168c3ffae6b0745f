// Exact causal attention over an fp16 KV cache: per-ISA kernel entry points (private to cpu/).
//
// Each entry point is compiled in its own translation unit with that ISA's flags from the same
// template (attention_kernel-inl.h); CpuBackend picks one per call.
#ifndef MAGICPIG_GPU_NODE_BACKEND_CPU_ATTENTION_KERNEL_H_
#define MAGICPIG_GPU_NODE_BACKEND_CPU_ATTENTION_KERNEL_H_

#include <cstdint>

namespace magicpig::backend::cpu_internal {

// One work item: the queries of one kv head's group (n_group heads) for tokens [t0, t1).
struct AttentionTile {
  const float* q;     // [n_tokens][n_head * head_dim]
  float* out;         // same layout
  const uint16_t* k;  // cache rows [pos][n_head_kv * head_dim], fp16
  const uint16_t* v;
  int64_t n_head;
  int64_t n_head_kv;
  int64_t head_dim;
  int64_t kv_head;    // g
  int64_t t0, t1;     // token range of this tile
  int64_t first_pos;  // position of token 0
  float scale;
  // Optional key segment [key_begin, key_end) (key_begin a multiple of 32; key_end 0 = all keys
  // the queries see). With a segment, `out` receives the segment's normalised partial and `lse`
  // ([n_tokens][n_head], natural log) its log-sum-exp, for an exact merge across segments.
  int64_t key_begin = 0;
  int64_t key_end = 0;
  float* lse = nullptr;
  float* scratch;  // AttentionScratchFloats(...) floats, owned by the caller
};

// Kernel units must not instantiate std templates (their COMDAT copies, compiled with AVX flags,
// could be picked by the linker for baseline code), so the caller provides all scratch memory.
// head_dim must be a multiple of 16 and at most 256 (CpuBackend checks).
// Enough for both layouts: narrow [row][d] q and acc, m, l, scores; wide (rows padded to 16)
// [d][row] q and acc, m, l, corr, scores, and the converted key and value tiles.
inline int64_t AttentionScratchFloats(int64_t rows, int64_t head_dim) {
  constexpr int64_t kKeyTile = 32;
  const int64_t padded = (rows + 15) / 16 * 16;
  return padded * head_dim * 2 + padded * 3 + padded * kKeyTile + 2 * kKeyTile * head_dim;
}

void AttentionTileScalar(const AttentionTile& tile);
void AttentionTileAvx2(const AttentionTile& tile);
void AttentionTileAvx512(const AttentionTile& tile);

}  // namespace magicpig::backend::cpu_internal

#endif  // MAGICPIG_GPU_NODE_BACKEND_CPU_ATTENTION_KERNEL_H_
