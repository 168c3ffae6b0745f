// TaskExecutor: order, re-entrant Submit, WaitIdle, the arena's parallelism and the destructor.
#include "attn_node/service/task_executor.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"
#include "tbb/task_arena.h"

namespace magicpig {
namespace {

TEST(TaskExecutorTest, OneThreadRunsTasksInSubmissionOrderOnItsDispatcher) {
  TaskExecutor executor(1);
  absl::Mutex mu;
  std::vector<int> order;
  std::set<std::thread::id> threads;
  for (int i = 0; i < 200; ++i) {
    executor.Submit([&, i] {
      absl::MutexLock lock(&mu);
      order.push_back(i);
      threads.insert(std::this_thread::get_id());
    });
  }
  executor.WaitIdle();
  absl::MutexLock lock(&mu);
  ASSERT_EQ(order.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(order[static_cast<size_t>(i)], i);
  EXPECT_EQ(threads.size(), 1u);
  EXPECT_EQ(threads.count(std::this_thread::get_id()), 0u);
}

TEST(TaskExecutorTest, SeveralThreadsRunEveryTaskOffTheCallingThread) {
  const std::thread::id caller = std::this_thread::get_id();
  TaskExecutor executor(2);
  absl::Mutex mu;
  std::multiset<int> seen;
  bool on_caller = false;
  for (int i = 0; i < 200; ++i) {
    executor.Submit([&, i] {
      absl::MutexLock lock(&mu);
      seen.insert(i);
      on_caller = on_caller || std::this_thread::get_id() == caller;
    });
  }
  executor.WaitIdle();
  absl::MutexLock lock(&mu);
  ASSERT_EQ(seen.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(seen.count(i), 1u);
  EXPECT_FALSE(on_caller);
}

TEST(TaskExecutorTest, WaitIdleCoversTasksSubmittedByTasks) {
  TaskExecutor executor(1);
  std::atomic<int> done{0};
  std::function<void(int)> chain = [&](int left) {
    done.fetch_add(1);
    if (left > 0) executor.Submit([&, left] { chain(left - 1); });
  };
  executor.Submit([&] { chain(50); });
  executor.WaitIdle();
  EXPECT_EQ(done.load(), 51);
}

TEST(TaskExecutorTest, TasksRunInsideAnArenaOfTheRequestedWidth) {
  for (int threads : {1, 2, 3}) {
    TaskExecutor executor(threads);
    EXPECT_EQ(executor.threads(), threads);
    std::atomic<int> width{0};
    std::atomic<int64_t> sum{0};
    executor.Submit([&] {
      width = tbb::this_task_arena::max_concurrency();
      tbb::parallel_for(tbb::blocked_range<int64_t>(0, 10000),
                        [&](const tbb::blocked_range<int64_t>& r) {
                          int64_t s = 0;
                          for (int64_t i = r.begin(); i < r.end(); ++i) s += i;
                          sum.fetch_add(s);
                        });
    });
    executor.WaitIdle();
    EXPECT_EQ(width.load(), threads);
    EXPECT_EQ(sum.load(), int64_t{10000} * 9999 / 2);
  }
}

TEST(TaskExecutorTest, DestructorRunsEveryQueuedTask) {
  std::atomic<int> done{0};
  for (int threads : {1, 2}) {
    TaskExecutor executor(threads);
    for (int i = 0; i < 50; ++i) {
      executor.Submit([&] {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        done.fetch_add(1);
      });
    }
  }
  EXPECT_EQ(done.load(), 100);
}

}  // namespace
}  // namespace magicpig
