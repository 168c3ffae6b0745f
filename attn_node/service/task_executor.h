// TaskExecutor: the attention node's application executor (DESIGN §7, style anchor L67: never
// block in a gRPC reaction). gRPC reactions hand attention, table builds and other store work to
// it with Submit; the task runs on a oneTBB worker inside the executor's own task_arena (so the
// store's parallel loops use that arena's threads) and finishes the RPC from there.
//
// Thread-safety: Submit may be called from any thread, including from a running task.
// The destructor waits for every submitted task to finish (WaitIdle).
#ifndef MAGICPIG_ATTN_NODE_SERVICE_TASK_EXECUTOR_H_
#define MAGICPIG_ATTN_NODE_SERVICE_TASK_EXECUTOR_H_

#include <cstdint>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "tbb/task_arena.h"

namespace magicpig {

class TaskExecutor {
 public:
  // threads <= 0: one per core (oneTBB's default).
  explicit TaskExecutor(int threads);
  ~TaskExecutor();
  TaskExecutor(const TaskExecutor&) = delete;
  TaskExecutor& operator=(const TaskExecutor&) = delete;

  // Runs fn() later on a worker of the arena; never blocks. fn must not throw.
  void Submit(std::function<void()> fn);

  // Blocks until every task submitted so far (and those they submitted) has returned.
  void WaitIdle();

  int threads() const { return threads_; }

 private:
  int threads_;
  tbb::task_arena arena_;
  absl::Mutex mu_;
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace magicpig

#endif  // MAGICPIG_ATTN_NODE_SERVICE_TASK_EXECUTOR_H_
