#include "attn_node/service/task_executor.h"

#include <utility>

#include "tbb/info.h"

namespace magicpig {

TaskExecutor::TaskExecutor(int threads)
    : threads_(threads > 0 ? threads : tbb::info::default_concurrency()),
      // Enqueued tasks need no slot for an external thread; the dispatcher does.
      arena_(threads_, /*reserved_for_masters=*/threads_ == 1 ? 1 : 0) {
  if (threads_ == 1) dispatcher_ = std::thread([this] { Dispatch(); });
}

TaskExecutor::~TaskExecutor() {
  WaitIdle();
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (dispatcher_.joinable()) dispatcher_.join();
}

void TaskExecutor::Submit(std::function<void()> fn) {
  {
    absl::MutexLock lock(&mu_);
    ++in_flight_;
    if (threads_ == 1) {
      queue_.push_back(std::move(fn));
      return;
    }
  }
  arena_.enqueue([this, fn = std::move(fn)] {
    fn();
    Done();
  });
}

void TaskExecutor::Done() {
  absl::MutexLock lock(&mu_);
  --in_flight_;
}

void TaskExecutor::WaitIdle() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int64_t* n) { return *n == 0; }, &in_flight_));
}

bool TaskExecutor::HasWorkOrStopping() const { return stopping_ || !queue_.empty(); }

void TaskExecutor::Dispatch() {
  for (;;) {
    std::function<void()> fn;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &TaskExecutor::HasWorkOrStopping));
      if (queue_.empty()) return;  // stopping, and nothing left
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    arena_.execute([&fn] { fn(); });
    fn = nullptr;  // the task's captures die before it counts as done
    Done();
  }
}

}  // namespace magicpig
