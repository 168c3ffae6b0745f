#include "attn_node/service/node_metrics.h"

#include <string>

#include "common/metrics/metrics.h"

namespace magicpig {

using metrics::NewGauge;
using metrics::NewHistogram;

NodeMetrics::NodeMetrics(prometheus::Registry& registry)
    : sequences_(NewGauge(registry, "magicpig_attn_sequences", "Sequence shards held")),
      kv_tokens_(NewGauge(registry, "magicpig_attn_kv_tokens",
                          "Tokens of KV held, summed over sequence shards (each counts its "
                          "fullest layer)")),
      kv_bytes_(
          NewGauge(registry, "magicpig_attn_kv_bytes",
                   "Bytes of keys, values, key norms and centers held (row storage as reserved)")),
      table_bytes_(NewGauge(registry, "magicpig_attn_hash_table_bytes",
                            "Bytes of LSH tables held (bucket offsets, key indices, codes of the "
                            "append segments)")),
      budget_bytes_(NewGauge(registry, "magicpig_attn_memory_budget_bytes",
                             "The memory budget (--memory-budget) the node admits within")),
      usage_ratio_(NewGauge(registry, "magicpig_attn_memory_usage_ratio",
                            "Admitted bytes (reserved or held, per sequence the larger) / budget")),
      attend_requests_(prometheus::BuildCounter()
                           .Name("magicpig_attn_attend_requests_total")
                           .Help("Attend requests (stream messages) answered")
                           .Register(registry)
                           .Add({})),
      step_duration_(NewHistogram(registry, "magicpig_attn_step_duration_seconds",
                                  "Retrieval + sampled attention for one Attend request",
                                  metrics::RpcBuckets())),
      sampled_fraction_(NewHistogram(registry, "magicpig_attn_sampled_fraction",
                                     "Keys touched / keys held per Attend request, over its "
                                     "(sequence, query head) pairs",
                                     metrics::RatioBuckets())),
      table_build_(NewHistogram(registry, "magicpig_attn_table_build_seconds",
                                "Time to commit one AppendKV stream: LSH table builds of new "
                                "shards, appends into built ones",
                                metrics::RpcBuckets())),
      rejected_(prometheus::BuildCounter()
                    .Name("magicpig_attn_rejected_total")
                    .Help("Requests refused, by reason: budget (RESOURCE_EXHAUSTED), invalid "
                          "(INVALID_ARGUMENT, ALREADY_EXISTS), draining, not_found")
                    .Register(registry)),
      rejected_budget_(rejected_.Add({{"reason", "budget"}})),
      rejected_invalid_(rejected_.Add({{"reason", "invalid"}})),
      rejected_draining_(rejected_.Add({{"reason", "draining"}})),
      rejected_not_found_(rejected_.Add({{"reason", "not_found"}})),
      expired_(prometheus::BuildCounter()
                   .Name("magicpig_attn_sequences_expired_total")
                   .Help("Sequences released because no call named them for --sequence-ttl")
                   .Register(registry)
                   .Add({})) {}

void NodeMetrics::Attended(double seconds, int64_t touched, int64_t held) {
  attend_requests_.Increment();
  step_duration_.Observe(seconds);
  if (held > 0) {
    sampled_fraction_.Observe(static_cast<double>(touched) / static_cast<double>(held));
  }
}

void NodeMetrics::Committed(double seconds) { table_build_.Observe(seconds); }

void NodeMetrics::Expired() { expired_.Increment(); }

void NodeMetrics::Finished(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kResourceExhausted:
      rejected_budget_.Increment();
      break;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kAlreadyExists:
      rejected_invalid_.Increment();
      break;
    case absl::StatusCode::kUnavailable:
      rejected_draining_.Increment();
      break;
    case absl::StatusCode::kNotFound:
      rejected_not_found_.Increment();
      break;
    default:
      break;
  }
}

void NodeMetrics::Refresh(const StoreStats& stats) {
  sequences_.Set(static_cast<double>(stats.sequences));
  kv_tokens_.Set(static_cast<double>(stats.kv_tokens));
  kv_bytes_.Set(static_cast<double>(stats.kv_bytes));
  table_bytes_.Set(static_cast<double>(stats.table_bytes));
  budget_bytes_.Set(static_cast<double>(stats.memory_budget_bytes));
  usage_ratio_.Set(stats.memory_budget_bytes > 0
                       ? static_cast<double>(stats.memory_used_bytes) /
                             static_cast<double>(stats.memory_budget_bytes)
                       : 0.0);
}

}  // namespace magicpig
