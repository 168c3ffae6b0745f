// One query head's partial attention result over one part of the keys (the static tokens, or one
// sampled shard), and the LSE merge of such parts (docs/architecture.md §5.2, natural log
// throughout).
//
// A part p with logits x_j (j in the part) and values v_j carries
//   lse_p = ln sum_j exp(x_j)                      (natural log, computed as m + ln sum exp(x - m))
//   o_p   = sum_j exp(x_j - lse_p) * v_j           (the part's own softmax-weighted value sum)
// An empty part has lse = -inf and o = 0 (o may also be left empty: size 0). Parts merge as
//   M = max_p lse_p,  lse = M + ln sum_p exp(lse_p - M),  o = sum_p exp(lse_p - lse) * o_p.
// n_touched counts the keys the part attended to (|S| for a sampled part); it adds up on merge.
//
// Thread-safety: plain value type and pure functions.
#ifndef MAGICPIG_COMMON_ATTENTION_PARTIAL_ATTENTION_H_
#define MAGICPIG_COMMON_ATTENTION_PARTIAL_ATTENTION_H_

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace magicpig::attention {

struct PartialAttention {
  std::vector<float> o;  // [d] value dimension
  float lse = -std::numeric_limits<float>::infinity();
  int64_t n_touched = 0;

  bool empty() const { return !(lse > -std::numeric_limits<float>::infinity()); }
};

// The empty part of value dimension d: o = 0 (d zeros), lse = -inf, n_touched = 0.
PartialAttention EmptyPartial(int64_t d);

// LSE merge of `parts` (computed in float64, rounded to float at the end). The result's dimension
// is the largest o.size() among the parts; every non-empty part (finite lse) must have exactly that
// size (precondition; checked with assert). Empty parts (lse = -inf, or NaN) contribute nothing
// but their n_touched. If every part is empty (or `parts` is empty) the result is o = 0, lse =
// -inf.
PartialAttention MergePartials(std::span<const PartialAttention> parts);

}  // namespace magicpig::attention

#endif  // MAGICPIG_COMMON_ATTENTION_PARTIAL_ATTENTION_H_
