// The inner loop of every fast estimator: softmax attention of the G query heads of one GQA group
// over a list of key/value rows of one shard (all rows, or a gathered sample with a per-row mask
// of the heads that sampled it), with optional MagicPIG importance correction of the logits.
// Compiled once per ISA (group_attention_{scalar,avx2,avx512}.cc from
// group_attention_kernel-inl.h); estimators pick one entry point per call (dispatch is hoisted
// out of the row loop).
//
// For head h and row r (r in the row list, and bit h of the row's mask set):
//   s = q_h . k_r                                (fp32, keys/values stored as bf16 or fp32)
//   x = scale * s                                (exact)
//   x = scale * s - LnU(s / (|q_h| |k_r|))       (with lnu_table: the MagicPIG logit,
//   docs/architecture.md §4.4;
//                                                 cos clamped to [-1, 1], a zero norm gives cos 0)
// and per head the normalised o_h = sum p v / sum p and lse_h = m + ln sum exp(x - m) (natural
// log); a head that attends to no row gets o = 0, lse = -inf. Online softmax (no buffer
// proportional to the row count): over tiles of kGroupTile rows for a contiguous exact range, of
// kSampledTile gathered rows for a row list with values, one row at a time otherwise; each key and
// value row is read from memory once for every head of the group that uses it. Sums run in an order
// of the kernel's own (see the -inl.h file), so results agree with a float64 reference to float
// rounding, not bit for bit with another order.
//
// Kernel units must not instantiate std templates (their COMDAT copies, compiled with AVX flags,
// could be picked by the linker for baseline code), so the caller provides all memory.
#ifndef MAGICPIG_COMMON_ATTENTION_KERNELS_GROUP_ATTENTION_KERNEL_H_
#define MAGICPIG_COMMON_ATTENTION_KERNELS_GROUP_ATTENTION_KERNEL_H_

#include <cstdint>

namespace magicpig::attention::internal {

inline constexpr int kGroupTile = 64;
inline constexpr int kMaxGroup = 32;  // heads per call (row masks are uint32)

struct GroupAttentionArgs {
  const void* keys;    // [rows][d] centred keys, bf16 bits (uint16_t) or float
  const void* values;  // [rows][d], same type
  bool bf16 = true;
  int64_t d = 0;  // multiple of 16, <= 256
  // Rows: rows[0 .. n_rows) when rows != nullptr, else the contiguous range
  // [row_begin, row_begin + n_rows).
  const int32_t* rows = nullptr;
  int64_t row_begin = 0;
  int64_t n_rows = 0;
  // masks[j] (parallel to the row list): bit h set iff head h attends to row j. nullptr: every
  // head attends to every row.
  const uint32_t* masks = nullptr;
  int g = 1;                 // heads, 1 .. kMaxGroup
  const float* q = nullptr;  // [g][d]
  float scale = 1.0f;
  // MagicPIG correction; lnu_table == nullptr means exact logits.
  const float* lnu_table = nullptr;  // ln(u(c) + 1e-4) at c = -1 + 2 i / (lnu_size - 1)
  int lnu_size = 0;
  const float* key_norms = nullptr;  // |k_r| indexed by row
  const float* q_norms = nullptr;    // [g]
  float* scratch = nullptr;          // GroupAttentionScratchFloats(g, d) floats
  float* o = nullptr;                // [g][d] out (may be null without values)
  float* lse = nullptr;              // [g] out
  // Sums only: with values == nullptr no value row is read and o stays unwritten when null; lse2
  // (optional, [g] out) = ln sum exp(2 x), the second moment of the weights (vattention's spread).
  float* lse2 = nullptr;
};

// Rows per tile of a gathered row list (the sampled path; see the -inl.h file).
inline constexpr int kSampledTile = 32;
static_assert(kSampledTile <= kGroupTile && kSampledTile % 16 == 0);

// Queries, accumulators and softmax state per head, then the larger of the two tile paths' needs
// (the sampled one: logits and row lists per head, key norms, and the tile's gathered key and
// value rows, as floats at most 4 bytes per element).
inline int64_t GroupAttentionScratchFloats(int g, int64_t d) {
  const int64_t gl = g;
  const int64_t dense_tile = gl * (1 + kGroupTile);  // rescale factors, logits
  const int64_t sampled_tile = 2 * gl * kSampledTile + kSampledTile + gl + 2 * kSampledTile * d;
  return gl * (2 * d + 2) + (dense_tile > sampled_tile ? dense_tile : sampled_tile);
}

void GroupAttentionScalar(const GroupAttentionArgs& args);
void GroupAttentionAvx2(const GroupAttentionArgs& args);
void GroupAttentionAvx512(const GroupAttentionArgs& args);

// Logits only, for estimators that must see every score before choosing keys (top-k, oracle
// sampling, spotlight's rescoring): x[h * n_rows + j] = scale * q_h . k_r for r = row_begin + j
// (contiguous range) or r = rows[j] (row list; with masks, heads whose bit is clear get -inf).
// The correction, values, o and lse are not used; scratch needs g * d floats. Same dot products
// as the attention kernel's tiles.
void GroupScoresScalar(const GroupAttentionArgs& args, float* x);
void GroupScoresAvx2(const GroupAttentionArgs& args, float* x);
void GroupScoresAvx512(const GroupAttentionArgs& args, float* x);

}  // namespace magicpig::attention::internal

#endif  // MAGICPIG_COMMON_ATTENTION_KERNELS_GROUP_ATTENTION_KERNEL_H_
