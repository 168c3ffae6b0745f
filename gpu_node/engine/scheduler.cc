#include "gpu_node/engine/scheduler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace magicpig::engine {
namespace {

double SecondsBetween(Scheduler::Clock::time_point a, Scheduler::Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

Scheduler::Scheduler(Engine* engine, SchedulerOptions options, ServingMetrics* metrics)
    : engine_(engine), options_(options), metrics_(metrics) {
  thread_ = std::thread([this] { Loop(); });
}

Scheduler::~Scheduler() { Shutdown(absl::ZeroDuration()); }

absl::StatusOr<std::shared_ptr<RequestHandle>> Scheduler::Submit(GenerateRequest request,
                                                                 RequestCallbacks callbacks,
                                                                 Clock::time_point arrival) {
  auto r = std::make_unique<Request>();
  r->request = std::move(request);
  r->callbacks = std::move(callbacks);
  r->handle = std::make_shared<RequestHandle>();
  r->arrival = arrival;
  std::shared_ptr<RequestHandle> handle = r->handle;
  absl::MutexLock lock(&mu_);
  if (draining_) return absl::UnavailableError("the server is shutting down");
  // Requests about to take a free batch place do not count against the queue.
  const int free_places = std::max(0, options_.max_batch - running_count_);
  if (static_cast<int>(waiting_.size()) >= options_.max_queue + free_places) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the request queue is full (", options_.max_queue, " waiting requests); retry later"));
  }
  waiting_.push_back(std::move(r));
  if (metrics_ != nullptr) metrics_->requests_waiting.Set(static_cast<double>(waiting_.size()));
  return handle;
}

int Scheduler::running() const {
  absl::MutexLock lock(&mu_);
  return running_count_;
}

bool Scheduler::stopping() const {
  absl::MutexLock lock(&mu_);
  return stop_;
}

int Scheduler::waiting() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(waiting_.size());
}

void Scheduler::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    draining_ = true;
    auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return stop_ || (waiting_.empty() && running_count_ == 0);
    };
    mu_.AwaitWithTimeout(absl::Condition(&idle), grace);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void Scheduler::OnToken(Request& r, const TokenOutput& t) {
  if (t.token >= 0) {
    const Clock::time_point now = Clock::now();
    if (metrics_ != nullptr) {
      if (!r.got_token) {
        metrics_->time_to_first_token.Observe(SecondsBetween(r.arrival, now));
      } else {
        metrics_->inter_token_latency.Observe(SecondsBetween(r.last_token, now));
      }
      metrics_->generation_tokens.Increment();
    }
    r.got_token = true;
    r.last_token = now;
  }
  if (r.callbacks.on_token) r.callbacks.on_token(t);
}

void Scheduler::Complete(Request& r, absl::StatusOr<GenerateResult> result) {
  if (metrics_ != nullptr && result.ok()) {
    metrics_->Finished(result->finish).Increment();
    metrics_->e2e_latency.Observe(SecondsBetween(r.arrival, Clock::now()));
    if (result->stats.attention_keys_offloaded > 0) {
      metrics_->sampled_fraction.Observe(result->stats.sampled_fraction());
    }
    metrics_->recoveries.Increment(static_cast<double>(result->stats.attention_recoveries));
  }
  r.seq.reset();  // frees the cache and releases the shards before the client hears back
  if (r.callbacks.on_done) r.callbacks.on_done(std::move(result));
}

void Scheduler::Admit() {
  while (static_cast<int>(running_.size()) < options_.max_batch) {
    std::unique_ptr<Request> r;
    {
      absl::MutexLock lock(&mu_);
      if (waiting_.empty() || stop_) return;
      r = std::move(waiting_.front());
      waiting_.pop_front();
      ++running_count_;
      if (metrics_ != nullptr) {
        metrics_->requests_waiting.Set(static_cast<double>(waiting_.size()));
        metrics_->requests_running.Set(running_count_);
      }
    }
    if (metrics_ != nullptr) metrics_->queue_time.Observe(SecondsBetween(r->arrival, Clock::now()));
    if (r->handle->cancelled()) {
      GenerateResult aborted;
      aborted.finish = FinishReason::kAbort;
      Complete(*r, std::move(aborted));
      absl::MutexLock lock(&mu_);
      --running_count_;
      continue;
    }
    Request* raw = r.get();
    GenerateCallbacks callbacks;
    callbacks.on_token = [this, raw](const TokenOutput& t) { OnToken(*raw, t); };
    absl::StatusOr<std::unique_ptr<Sequence>> seq = engine_->Start(r->request, callbacks);
    if (!seq.ok()) {
      Complete(*r, seq.status());
      absl::MutexLock lock(&mu_);
      --running_count_;
      if (metrics_ != nullptr) metrics_->requests_running.Set(running_count_);
      continue;
    }
    if (metrics_ != nullptr) metrics_->prompt_tokens.Increment(r->request.prompt.size());
    r->seq = *std::move(seq);
    running_.push_back(std::move(r));
  }
}

void Scheduler::Loop() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      auto has_work = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stop_ || running_count_ > 0 || !waiting_.empty();
      };
      mu_.Await(absl::Condition(&has_work));
      if (stop_) break;
    }
    Admit();
    // Cancelled requests leave before the step.
    for (auto& r : running_) {
      if (r->handle->cancelled()) r->seq->Abort();
    }
    std::vector<Sequence*> batch;
    for (auto& r : running_) {
      if (!r->seq->finished()) batch.push_back(r->seq.get());
    }
    if (!batch.empty()) {
      StepTimings timings;
      double sampling = 0;
      const Clock::time_point start = Clock::now();
      absl::Status status = engine_->Step(batch, &timings, &sampling);
      if (metrics_ != nullptr) {
        metrics_->batch_size.Observe(static_cast<double>(batch.size()));
        metrics_->decode_step.Observe(SecondsBetween(start, Clock::now()));
        metrics_->phase_dense.Increment(timings.dense);
        metrics_->phase_attention.Increment(timings.attention);
        metrics_->phase_sampling.Increment(sampling);
        if (timings.micro_batches == 1) metrics_->steps_one_batch.Increment();
        if (timings.micro_batches == 2) metrics_->steps_two_micro_batches.Increment();
      }
      if (!status.ok()) {
        // A failed step (e.g. attention nodes gone beyond recovery) fails the batch it ran.
        for (auto& r : running_) {
          const bool in_step = std::find(batch.begin(), batch.end(), r->seq.get()) != batch.end();
          r->seq->Abort();
          if (in_step) {
            Complete(*r, status);
          } else {
            Complete(*r, r->seq->TakeResult());
          }
        }
        running_.clear();
      }
    }
    // Finished sequences leave the batch.
    for (auto it = running_.begin(); it != running_.end();) {
      if ((*it)->seq->finished()) {
        Complete(**it, (*it)->seq->TakeResult());
        it = running_.erase(it);
      } else {
        ++it;
      }
    }
    absl::MutexLock lock(&mu_);
    running_count_ = static_cast<int>(running_.size());
    if (metrics_ != nullptr) metrics_->requests_running.Set(running_count_);
  }
  // Shutting down: whatever is left is aborted.
  std::deque<std::unique_ptr<Request>> waiting;
  {
    absl::MutexLock lock(&mu_);
    waiting.swap(waiting_);
  }
  for (auto& r : running_) {
    r->seq->Abort();
    Complete(*r, r->seq->TakeResult());
  }
  running_.clear();
  for (auto& r : waiting) {
    GenerateResult aborted;
    aborted.finish = FinishReason::kAbort;
    Complete(*r, std::move(aborted));
  }
  absl::MutexLock lock(&mu_);
  running_count_ = 0;
  if (metrics_ != nullptr) {
    metrics_->requests_running.Set(0);
    metrics_->requests_waiting.Set(0);
  }
}

}  // namespace magicpig::engine
