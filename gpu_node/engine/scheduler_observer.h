// SchedulerObserver: what the Scheduler reports while it runs (queue and batch occupancy, token
// timing, finished requests, decode steps), so that the serving layer can turn it into metrics
// (gpu_node/server/serving_metrics.h) without the engine knowing about Prometheus.
//
// Thread-safety: the scheduler calls OnOccupancy from Submit's thread and its own, the others from
// its own thread; implementations must be thread-safe and must not block.
#ifndef MAGICPIG_GPU_NODE_ENGINE_SCHEDULER_OBSERVER_H_
#define MAGICPIG_GPU_NODE_ENGINE_SCHEDULER_OBSERVER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "gpu_node/engine/engine.h"
#include "gpu_node/engine/transformer.h"

namespace magicpig::engine {

class SchedulerObserver {
 public:
  virtual ~SchedulerObserver() = default;

  // Requests queued for a batch place and requests in the running batch, after every change.
  virtual void OnOccupancy(int waiting, int running) = 0;
  // A request left the queue `queue_seconds` after it arrived.
  virtual void OnDequeued(double queue_seconds) = 0;
  // A request's prompt of `prompt_tokens` was prefilled and it joined the batch.
  virtual void OnStarted(int64_t prompt_tokens) = 0;
  // A request generated a token: its first (`seconds` since arrival) or a later one (`seconds`
  // since the previous).
  virtual void OnToken(bool first, double seconds) = 0;
  // A request finished with a result (any finish reason, abort included), `e2e_seconds` after it
  // arrived.
  virtual void OnFinished(const GenerateResult& result, double e2e_seconds) = 0;
  // An admitted request ended with an error instead (its validation, its prefill or a decode step
  // failed), `e2e_seconds` after it arrived.
  virtual void OnFailed(const absl::Status& status, double e2e_seconds) = 0;
  // One batched decode step of `batch_size` sequences took `seconds`; `timings` splits the forward
  // pass, `sampling_seconds` the sampling.
  virtual void OnStep(int batch_size, double seconds, const StepTimings& timings,
                      double sampling_seconds) = 0;
};

}  // namespace magicpig::engine

#endif  // MAGICPIG_GPU_NODE_ENGINE_SCHEDULER_OBSERVER_H_
