// The compute node's request-level Prometheus metrics (names in docs/metrics.md), registered in
// the registry the process passes in. The scheduler reports through the SchedulerObserver
// interface this implements; the HTTP layer adds its own per-handler counter.
//
// Thread-safety: prometheus-cpp metrics are thread-safe; the members are fixed after creation.
#ifndef MAGICPIG_GPU_NODE_SERVER_SERVING_METRICS_H_
#define MAGICPIG_GPU_NODE_SERVER_SERVING_METRICS_H_

#include "gpu_node/engine/engine.h"
#include "gpu_node/engine/scheduler_observer.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace magicpig::server {

class ServingMetrics : public engine::SchedulerObserver {
 public:
  explicit ServingMetrics(prometheus::Registry& registry);

  void OnOccupancy(int waiting, int running) override;
  void OnDequeued(double queue_seconds) override;
  void OnStarted(int64_t prompt_tokens) override;
  void OnToken(bool first, double seconds) override;
  void OnFinished(const engine::GenerateResult& result, double e2e_seconds) override;
  void OnFailed(const absl::Status& status, double e2e_seconds) override;
  void OnStep(int batch_size, double seconds, const engine::StepTimings& timings,
              double sampling_seconds) override;

  prometheus::Gauge& requests_running;
  prometheus::Gauge& requests_waiting;
  prometheus::Histogram& time_to_first_token;
  prometheus::Histogram& inter_token_latency;
  prometheus::Histogram& e2e_latency;
  prometheus::Histogram& queue_time;
  prometheus::Counter& prompt_tokens;
  prometheus::Counter& generation_tokens;
  prometheus::Family<prometheus::Counter>& request_success;
  prometheus::Family<prometheus::Counter>& request_failure;
  prometheus::Histogram& batch_size;
  prometheus::Histogram& decode_step;
  prometheus::Family<prometheus::Counter>& decode_phase;
  prometheus::Counter& phase_dense;
  prometheus::Counter& phase_attention;
  prometheus::Counter& phase_sampling;
  prometheus::Family<prometheus::Counter>& decode_split;
  prometheus::Counter& steps_one_batch;
  prometheus::Counter& steps_two_micro_batches;
  prometheus::Histogram& sampled_fraction;
  prometheus::Histogram& keys_per_head;
  prometheus::Counter& recoveries;

  // The outcome counter for one finish reason ("stop", "length", "abort").
  prometheus::Counter& Finished(engine::FinishReason reason);
  // The failure counter for one status code ("invalid_argument", "unavailable", ...).
  prometheus::Counter& Failed(absl::StatusCode code);
};

}  // namespace magicpig::server

#endif  // MAGICPIG_GPU_NODE_SERVER_SERVING_METRICS_H_
