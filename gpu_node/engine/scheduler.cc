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

Scheduler::Scheduler(Engine* engine, SchedulerOptions options, SchedulerObserver* observer)
    : engine_(engine), options_(options), observer_(observer) {
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
  ReportOccupancy();
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

void Scheduler::ReportOccupancy() {
  if (observer_ != nullptr)
    observer_->OnOccupancy(static_cast<int>(waiting_.size()), running_count_);
}

void Scheduler::OnToken(Request& r, const TokenOutput& t) {
  if (t.token >= 0) {
    const Clock::time_point now = Clock::now();
    if (observer_ != nullptr) {
      observer_->OnToken(!r.got_token, SecondsBetween(r.got_token ? r.last_token : r.arrival, now));
    }
    r.got_token = true;
    r.last_token = now;
  }
  if (r.callbacks.on_token) r.callbacks.on_token(t);
}

void Scheduler::Complete(Request& r, absl::StatusOr<GenerateResult> result) {
  if (observer_ != nullptr) {
    const double e2e = SecondsBetween(r.arrival, Clock::now());
    if (result.ok()) {
      observer_->OnFinished(*result, e2e);
    } else {
      observer_->OnFailed(result.status(), e2e);
    }
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
      // A request whose KV cache does not fit the GPU budget beside the running sequences waits
      // (first in, first out) until a step frees enough; with nothing running it goes on to
      // Start, which fails it if it cannot fit at all.
      if (!running_.empty() &&
          absl::IsUnavailable(engine_->CheckKvBudget(waiting_.front()->request))) {
        return;
      }
      r = std::move(waiting_.front());
      waiting_.pop_front();
      ++running_count_;
      ReportOccupancy();
    }
    if (observer_ != nullptr) observer_->OnDequeued(SecondsBetween(r->arrival, Clock::now()));
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
      ReportOccupancy();
      continue;
    }
    if (observer_ != nullptr) {
      observer_->OnStarted(static_cast<int64_t>(r->request.prompt.size()));
    }
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
      if (observer_ != nullptr) {
        observer_->OnStep(static_cast<int>(batch.size()), SecondsBetween(start, Clock::now()),
                          timings, sampling);
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
    // Finished sequences leave the batch (with their own error, when one failed alone).
    for (auto it = running_.begin(); it != running_.end();) {
      if ((*it)->seq->finished()) {
        const absl::Status& error = (*it)->seq->error();
        if (!error.ok()) {
          Complete(**it, error);
        } else {
          Complete(**it, (*it)->seq->TakeResult());
        }
        it = running_.erase(it);
      } else {
        ++it;
      }
    }
    absl::MutexLock lock(&mu_);
    running_count_ = static_cast<int>(running_.size());
    ReportOccupancy();
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
  ReportOccupancy();
}

}  // namespace magicpig::engine
