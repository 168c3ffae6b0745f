#include "gpu_node/server/serving_metrics.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "common/metrics/metrics.h"

namespace magicpig::server {

using engine::FinishReason;

using metrics::NewCounter;
using metrics::NewGauge;
using metrics::NewHistogram;

namespace {

// 1, 2, 4, .. 2^24 keys (and +Inf): engine::KeysPerHeadHistogram's buckets.
prometheus::Histogram::BucketBoundaries KeysPerHeadBuckets() {
  prometheus::Histogram::BucketBoundaries b;
  for (int i = 0; i < engine::KeysPerHeadHistogram::kBuckets - 1; ++i) {
    b.push_back(static_cast<double>(int64_t{1} << i));
  }
  return b;
}

}  // namespace

ServingMetrics::ServingMetrics(prometheus::Registry& r)
    : requests_running(
          NewGauge(r, "magicpig_num_requests_running", "Requests in the running batch")),
      requests_waiting(
          NewGauge(r, "magicpig_num_requests_waiting", "Requests queued for a place in the batch")),
      time_to_first_token(NewHistogram(r, "magicpig_time_to_first_token_seconds",
                                       "From HTTP arrival to the first generated token",
                                       metrics::LatencyBuckets())),
      inter_token_latency(NewHistogram(r, "magicpig_inter_token_latency_seconds",
                                       "Between consecutive generated tokens of a request",
                                       metrics::LatencyBuckets())),
      e2e_latency(NewHistogram(r, "magicpig_e2e_request_latency_seconds",
                               "From HTTP arrival to the last token", metrics::LatencyBuckets())),
      queue_time(NewHistogram(r, "magicpig_request_queue_time_seconds",
                              "From arrival until the request's prefill starts",
                              metrics::LatencyBuckets())),
      prompt_tokens(NewCounter(r, "magicpig_prompt_tokens_total", "Prompt tokens prefilled")),
      generation_tokens(NewCounter(r, "magicpig_generation_tokens_total", "Tokens generated")),
      request_success(prometheus::BuildCounter()
                          .Name("magicpig_request_success_total")
                          .Help("Requests finished, by finish reason (stop, length, abort)")
                          .Register(r)),
      request_failure(prometheus::BuildCounter()
                          .Name("magicpig_request_failure_total")
                          .Help("Admitted requests that ended with an error, by status code")
                          .Register(r)),
      batch_size(NewHistogram(r, "magicpig_batch_size", "Sequences per batched decode step",
                              metrics::CountBuckets())),
      decode_step(NewHistogram(r, "magicpig_decode_step_seconds",
                               "One batched decode step (sampling + forward pass)",
                               metrics::RpcBuckets())),
      decode_phase(prometheus::BuildCounter()
                       .Name("magicpig_decode_phase_seconds_total")
                       .Help("Decode step time by phase: dense (norms, products, LM head), "
                             "attention (KV store, exact and sampled attention, waiting for "
                             "attention nodes), sampling")
                       .Register(r)),
      phase_dense(decode_phase.Add({{"phase", "dense"}})),
      phase_attention(decode_phase.Add({{"phase", "attention"}})),
      phase_sampling(decode_phase.Add({{"phase", "sampling"}})),
      decode_split(prometheus::BuildCounter()
                       .Name("magicpig_decode_micro_batch_steps_total")
                       .Help("Decode steps by how the batch ran: as one batch (micro_batches=1) "
                             "or as two ping-pong micro-batches (2)")
                       .Register(r)),
      steps_one_batch(decode_split.Add({{"micro_batches", "1"}})),
      steps_two_micro_batches(decode_split.Add({{"micro_batches", "2"}})),
      sampled_fraction(NewHistogram(r, "magicpig_lsh_sampled_fraction",
                                    "Per finished request: keys the estimator touched / keys in "
                                    "the shards, over its sparse decode steps",
                                    metrics::RatioBuckets())),
      keys_per_head(NewHistogram(r, "magicpig_attention_keys_per_head",
                                 "Keys the decode estimator touched per (sparse layer, query head, "
                                 "step): the realised per-head budgets (vattention sizes each one "
                                 "for its (epsilon, delta) bound)",
                                 KeysPerHeadBuckets())),
      recoveries(NewCounter(r, "magicpig_attn_recoveries_total",
                            "Shard rebuilds after an attention node failed")) {
  for (FinishReason reason : {FinishReason::kStop, FinishReason::kLength, FinishReason::kAbort}) {
    Finished(reason);  // every outcome series exists from the start (rate() needs a zero)
  }
  for (absl::StatusCode code : {absl::StatusCode::kInvalidArgument, absl::StatusCode::kOutOfRange,
                                absl::StatusCode::kResourceExhausted,
                                absl::StatusCode::kUnavailable, absl::StatusCode::kInternal}) {
    Failed(code);
  }
}

prometheus::Counter& ServingMetrics::Finished(FinishReason reason) {
  return request_success.Add({{"finished_reason", std::string(engine::FinishReasonName(reason))}});
}

prometheus::Counter& ServingMetrics::Failed(absl::StatusCode code) {
  std::string name = absl::StatusCodeToString(code);  // "UNAVAILABLE"
  absl::AsciiStrToLower(&name);
  return request_failure.Add({{"code", name}});
}

void ServingMetrics::OnFailed(const absl::Status& status, double e2e_seconds) {
  Failed(status.code()).Increment();
  e2e_latency.Observe(e2e_seconds);
}

void ServingMetrics::OnOccupancy(int waiting, int running) {
  requests_waiting.Set(waiting);
  requests_running.Set(running);
}

void ServingMetrics::OnDequeued(double queue_seconds) { queue_time.Observe(queue_seconds); }

void ServingMetrics::OnStarted(int64_t prompt_tokens) {
  this->prompt_tokens.Increment(static_cast<double>(prompt_tokens));
}

void ServingMetrics::OnToken(bool first, double seconds) {
  (first ? time_to_first_token : inter_token_latency).Observe(seconds);
  generation_tokens.Increment();
}

void ServingMetrics::OnFinished(const engine::GenerateResult& result, double e2e_seconds) {
  Finished(result.finish).Increment();
  e2e_latency.Observe(e2e_seconds);
  if (result.stats.attention_keys_offloaded > 0) {
    sampled_fraction.Observe(result.stats.sampled_fraction());
    const engine::KeysPerHeadHistogram& h = result.stats.attention_keys_per_head;
    keys_per_head.ObserveMultiple(std::vector<double>(h.counts.begin(), h.counts.end()), h.sum);
  }
  recoveries.Increment(static_cast<double>(result.stats.attention_recoveries));
}

void ServingMetrics::OnStep(int batch_size, double seconds, const engine::StepTimings& timings,
                            double sampling_seconds) {
  this->batch_size.Observe(batch_size);
  decode_step.Observe(seconds);
  phase_dense.Increment(timings.dense);
  phase_attention.Increment(timings.attention);
  phase_sampling.Increment(sampling_seconds);
  if (timings.micro_batches == 1) steps_one_batch.Increment();
  if (timings.micro_batches == 2) steps_two_micro_batches.Increment();
}

}  // namespace magicpig::server
