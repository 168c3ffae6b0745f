#include "attn_node/service/task_executor.h"

#include <utility>

#include "tbb/info.h"

namespace magicpig {

TaskExecutor::TaskExecutor(int threads)
    : threads_(threads > 0 ? threads : tbb::info::default_concurrency()),
      // No slot reserved for an external thread: nobody joins, tasks are only enqueued.
      arena_(threads_, /*reserved_for_masters=*/0) {}

TaskExecutor::~TaskExecutor() { WaitIdle(); }

void TaskExecutor::Submit(std::function<void()> fn) {
  {
    absl::MutexLock lock(&mu_);
    ++in_flight_;
  }
  arena_.enqueue([this, fn = std::move(fn)] {
    fn();
    absl::MutexLock lock(&mu_);
    --in_flight_;
  });
}

void TaskExecutor::WaitIdle() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int64_t* n) { return *n == 0; }, &in_flight_));
}

}  // namespace magicpig
