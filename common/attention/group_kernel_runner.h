// What the estimators share around the SIMD group kernel (kernels/group_attention_kernel.h): the
// argument checks of AttendGroup, the kernel for a SIMD level, and one call of it over a row list
// of a shard with the results copied into PartialAttentions. Internal to the attention library.
//
// Thread-safety: pure functions; each call uses only the scratch it is given.
#ifndef MAGICPIG_COMMON_ATTENTION_GROUP_KERNEL_RUNNER_H_
#define MAGICPIG_COMMON_ATTENTION_GROUP_KERNEL_RUNNER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/attention/estimators.h"
#include "common/attention/kernels/group_attention_kernel.h"

namespace magicpig::attention::internal {

// INVALID_ARGUMENT (prefixed with `who`) for a null scratch, or a null q with a non-empty shard.
absl::Status CheckCommon(const KvShard& shard, const float* q, const Estimator::Scratch* scratch,
                         const char* who);
// CheckCommon, and g >= 1, a non-null out, a head dim the kernels take.
absl::Status CheckGroup(const KvShard& shard, const float* q, int g,
                        const Estimator::Scratch* scratch, const PartialAttention* out,
                        const char* who);
// For estimators that read the tables: INVALID_ARGUMENT (prefixed with `who`) unless the shard's
// tables are (k, l) and q_codes is non-null.
absl::Status CheckTables(const KvShard& shard, int k, int l, const uint16_t* q_codes,
                         const char* who);
// Whether the SIMD kernels take this shard's rows (a head dim that is a multiple of 16, <= 256).
bool KernelTakes(const KvShard& shard);

using GroupKernel = void (*)(const GroupAttentionArgs&);
GroupKernel SelectGroupKernel(SimdLevel level);

// Runs the group kernel for heads [0, g) (g <= kMaxGroup) over the given rows (all rows of the
// shard when rows is null) and copies the results into out[0 .. g) (n_touched is left to the
// caller). lnu_table: MagicPIG's correction, or null for exact logits.
void RunGroupKernel(GroupKernel kernel, const KvShard& shard, const float* q, int g, float scale,
                    const int32_t* rows, int64_t n_rows, const uint32_t* masks,
                    const float* lnu_table, Estimator::Scratch* scratch, PartialAttention* out);

// lse[h] = ln sum exp(x) and lse2[h] = ln sum exp(2 x) over the rows of head h (x = scale q_h.k,
// exact logits), reading keys only: the sums vattention sizes its sample with.
void GroupExpSums(GroupKernel kernel, const KvShard& shard, const float* q, int g, float scale,
                  const int32_t* rows, int64_t n_rows, const uint32_t* masks,
                  Estimator::Scratch* scratch, float* lse, float* lse2);

// scratch->scores[h][i] = scale * q_h . k_i for heads [0, g) (g <= kMaxGroup) and every key of
// the shard, on the SIMD kernel's score pass (fp32).
void GroupLogits(SimdLevel level, const KvShard& shard, const float* q, int g, float scale,
                 Estimator::Scratch* scratch);

// The same over a row list: scratch->scores[h][j] = scale * q_h . k_(rows[j]) for j < n_rows, -inf
// where masks (optional) has bit h of masks[j] clear. rows == nullptr: the range [0, n_rows).
void GroupListLogits(SimdLevel level, const KvShard& shard, const float* q, int g, float scale,
                     const int32_t* rows, int64_t n_rows, const uint32_t* masks,
                     Estimator::Scratch* scratch);

// The sorted union of per-head sorted lists, with bit h of masks[j] set iff rows[j] is in
// lists[h] (at most kMaxGroup lists): a merge of the lists.
void UnionWithMasks(const std::vector<std::vector<int32_t>>& lists, std::vector<int32_t>* rows,
                    std::vector<uint32_t>* masks);

// RunGroupKernel over lists[h] (sorted) for heads [0, g): their union, each row attended by the
// heads whose list holds it, exact logits; n_touched left to the caller.
void RunOnLists(GroupKernel kernel, const KvShard& shard, const float* q, int g, float scale,
                const std::vector<std::vector<int32_t>>& lists, Estimator::Scratch* scratch,
                PartialAttention* out);

// The float64 reference's softmax-weighted value sum over scratch->sample with logits
// scratch->logits (same length); n_touched = the sample's size.
PartialAttention SoftmaxOver(const KvShard& shard, Estimator::Scratch* scratch);

}  // namespace magicpig::attention::internal

#endif  // MAGICPIG_COMMON_ATTENTION_GROUP_KERNEL_RUNNER_H_
