// TaskExecutor: the attention node's application executor (docs/architecture.md §14: never block in
// a gRPC reaction). gRPC reactions hand attention, table builds and other store work to
// it with Submit; the task runs inside the executor's own oneTBB task_arena of `threads` slots (so
// the store's parallel loops use that arena's threads) and finishes the RPC from there.
//
// Two ways in, by width:
// - threads >= 2: tasks are enqueued into the arena (task_arena::enqueue) and up to `threads` run
//   at once on oneTBB workers, each also helped by idle workers in its parallel loops.
// - threads == 1: a dispatcher thread runs the tasks one after another inside an arena with no
//   worker at all (its one slot is reserved for the dispatcher), and sleeps on a condition
//   variable when there is none. Why: an idle oneTBB worker looks for work for a while (pause,
//   sched_yield) before it sleeps, and an attention node goes idle between the many small Attend
//   requests of a decode step, so a one-thread node spent about a third of its CPU spinning
//   (perf, docs/benchmarks.md, issue #4), CPU that a compute node sharing the machine needs.
// Tasks start in submission order with one thread, about in that order (oneTBB's enqueue) with
// more.
//
// Thread-safety: Submit may be called from any thread, including from a running task.
// The destructor waits for every submitted task to finish (WaitIdle).
#ifndef MAGICPIG_ATTN_NODE_SERVICE_TASK_EXECUTOR_H_
#define MAGICPIG_ATTN_NODE_SERVICE_TASK_EXECUTOR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <thread>

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

  // Runs fn() later inside the arena; never blocks. fn must not throw and must not wait for a
  // task submitted after it.
  void Submit(std::function<void()> fn);

  // Blocks until every task submitted so far (and those they submitted) has returned.
  void WaitIdle();

  int threads() const { return threads_; }

 private:
  void Dispatch();
  bool HasWorkOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Done();

  int threads_;
  // threads_ slots; with one, it is reserved for the dispatcher (which joins through execute).
  tbb::task_arena arena_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);  // dispatcher's (threads 1)
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;                    // queued or running
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread dispatcher_;  // threads 1 only; last: starts once the members above exist
};

}  // namespace magicpig

#endif  // MAGICPIG_ATTN_NODE_SERVICE_TASK_EXECUTOR_H_
