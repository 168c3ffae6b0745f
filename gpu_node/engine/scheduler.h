// Scheduler: continuous batching over an Engine. Requests queue (bounded); between decode steps
// waiting requests are prefilled and join the running batch (up to max_batch); every step gives
// each running sequence one token; finished, failed and cancelled requests leave the batch and
// free their memory (cache and attention shards) at once.
//
//   Scheduler s(engine, {.max_batch = 8, .max_queue = 64}, &observer);
//   auto handle = s.Submit(request, {.on_token = ..., .on_done = ...}, arrival);
//   ... handle->Cancel();  // e.g. the HTTP client went away
//
// Prefill runs a whole prompt at once (the layer-major prefill that builds the shards' tables),
// so a long prompt delays the running batch's next step by its prefill time.
//
// Thread-safety: Submit, Cancel, Shutdown and the counters may be called from any thread. The
// callbacks run on the scheduler's own thread, one request's in order, on_done exactly once; they
// must not block (hand the data to the waiting thread).
#ifndef MAGICPIG_GPU_NODE_ENGINE_SCHEDULER_H_
#define MAGICPIG_GPU_NODE_ENGINE_SCHEDULER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gpu_node/engine/engine.h"
#include "gpu_node/engine/scheduler_observer.h"

namespace magicpig::engine {

struct SchedulerOptions {
  int max_batch = 8;   // sequences decoded together
  int max_queue = 64;  // requests waiting beyond the batch's free places; more are refused
};

struct RequestCallbacks {
  std::function<void(const TokenOutput&)> on_token;
  // The result (finish reason kAbort when cancelled or shut down) or the error that ended it.
  std::function<void(absl::StatusOr<GenerateResult>)> on_done;
};

// The submitter's side of a request.
class RequestHandle {
 public:
  // Asks the scheduler to drop the request (waiting or running) before its next step.
  void Cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

 private:
  std::atomic<bool> cancelled_{false};
};

class Scheduler {
 public:
  using Clock = std::chrono::steady_clock;

  // engine and observer outlive the scheduler; observer may be null.
  Scheduler(Engine* engine, SchedulerOptions options, SchedulerObserver* observer);
  ~Scheduler();  // Shutdown(zero grace)

  // Queues a request that arrived at `arrival` (for the latency metrics). RESOURCE_EXHAUSTED when
  // the queue is full, UNAVAILABLE once shutting down. Validation errors of the request come
  // through on_done.
  absl::StatusOr<std::shared_ptr<RequestHandle>> Submit(GenerateRequest request,
                                                        RequestCallbacks callbacks,
                                                        Clock::time_point arrival = Clock::now());

  // Stops admitting; lets queued and running requests finish for up to `grace`, then aborts the
  // rest and stops the scheduler thread. Idempotent.
  void Shutdown(absl::Duration grace);

  int running() const;
  int waiting() const;
  // True once Shutdown's grace has ended: the running requests are aborted at the next step.
  bool stopping() const;
  const SchedulerOptions& options() const { return options_; }

 private:
  struct Request {
    GenerateRequest request;
    RequestCallbacks callbacks;
    std::shared_ptr<RequestHandle> handle;
    Clock::time_point arrival;
    Clock::time_point last_token;
    bool got_token = false;
    std::unique_ptr<Sequence> seq;
  };

  void Loop();
  // Prefills the waiting requests that fit into the batch.
  void Admit();
  void Complete(Request& r, absl::StatusOr<GenerateResult> result);
  void OnToken(Request& r, const TokenOutput& t);
  // Reports the queue and batch sizes to the observer.
  void ReportOccupancy() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Engine* const engine_;
  const SchedulerOptions options_;
  SchedulerObserver* const observer_;

  mutable absl::Mutex mu_;
  std::deque<std::unique_ptr<Request>> waiting_ ABSL_GUARDED_BY(mu_);
  int running_count_ ABSL_GUARDED_BY(mu_) = 0;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;

  // Only the scheduler thread touches the running batch.
  std::vector<std::unique_ptr<Request>> running_;
  std::thread thread_;
};

}  // namespace magicpig::engine

#endif  // MAGICPIG_GPU_NODE_ENGINE_SCHEDULER_H_
