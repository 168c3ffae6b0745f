// NodeMetrics: the attention node's Prometheus metrics (docs/metrics.md, "Attention node"), in the
// process's registry. The service reports events as they happen; the gauges are set from
// ShardStore::Stats() by Refresh, which the /metrics handler calls before rendering, so they are
// exact at scrape time.
//
//   magicpig_attn_sequences                  gauge      sequences (shards) held
//   magicpig_attn_kv_tokens                  gauge      tokens held, summed over sequences (a
//                                                       sequence counts its fullest layer)
//   magicpig_attn_kv_bytes                   gauge      keys, values, norms, centers
//   magicpig_attn_hash_table_bytes           gauge      LSH tables and pending (append) codes
//   magicpig_attn_memory_budget_bytes        gauge      --memory-budget
//   magicpig_attn_memory_usage_ratio         gauge      admitted (charged) bytes / budget
//   magicpig_attn_attend_requests_total      counter    Attend messages answered
//   magicpig_attn_step_duration_seconds      histogram  retrieval + sampled attention of one
//                                                       Attend message (ShardStore::Attend)
//   magicpig_attn_sampled_fraction           histogram  per Attend message: keys touched / keys
//                                                       held, summed over its (sequence, query
//                                                       head) pairs (messages with no keys held
//                                                       are not observed)
//   magicpig_attn_table_build_seconds        histogram  one AppendKV commit: the LSH table build
//                                                       of a layer's first append, or an append
//                                                       into built tables (ShardStore::Commit)
//   magicpig_attn_rejected_total{reason}     counter    calls refused: budget (RESOURCE_EXHAUSTED),
//                                                       invalid (INVALID_ARGUMENT, ALREADY_EXISTS),
//                                                       draining (UNAVAILABLE), not_found
//   magicpig_attn_sequences_expired_total    counter    sequences released because no call named
//                                                       them for --sequence-ttl
//
// Thread-safety: every method may be called concurrently (prometheus-cpp metrics are atomic).
#ifndef MAGICPIG_ATTN_NODE_SERVICE_NODE_METRICS_H_
#define MAGICPIG_ATTN_NODE_SERVICE_NODE_METRICS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "attn_node/service/shard_store.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace magicpig {

class NodeMetrics {
 public:
  // Registers the families in `registry`, which must outlive this object; every
  // rejected_total{reason} series starts at 0.
  explicit NodeMetrics(prometheus::Registry& registry);
  NodeMetrics(const NodeMetrics&) = delete;
  NodeMetrics& operator=(const NodeMetrics&) = delete;

  // One Attend message answered in `seconds`; its queries touched `touched` keys out of `held`
  // (summed over query heads).
  void Attended(double seconds, int64_t touched, int64_t held);
  // One AppendKV stream committed in `seconds`.
  void Committed(double seconds);
  // One sequence released for want of renewal (its lease ran out).
  void Expired();
  // A call finished with `status`: counted in rejected_total when it is a refusal (see the file
  // comment); OK and other codes (CANCELLED, INTERNAL) are not.
  void Finished(const absl::Status& status);
  // Sets the gauges from the store's statistics.
  void Refresh(const StoreStats& stats);

 private:
  prometheus::Gauge& sequences_;
  prometheus::Gauge& kv_tokens_;
  prometheus::Gauge& kv_bytes_;
  prometheus::Gauge& table_bytes_;
  prometheus::Gauge& budget_bytes_;
  prometheus::Gauge& usage_ratio_;
  prometheus::Counter& attend_requests_;
  prometheus::Histogram& step_duration_;
  prometheus::Histogram& sampled_fraction_;
  prometheus::Histogram& table_build_;
  prometheus::Family<prometheus::Counter>& rejected_;
  prometheus::Counter& rejected_budget_;
  prometheus::Counter& rejected_invalid_;
  prometheus::Counter& rejected_draining_;
  prometheus::Counter& rejected_not_found_;
  prometheus::Counter& expired_;
};

}  // namespace magicpig

#endif  // MAGICPIG_ATTN_NODE_SERVICE_NODE_METRICS_H_
