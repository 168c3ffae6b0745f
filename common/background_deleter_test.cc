#include "common/background_deleter.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace magicpig {
namespace {

// Records the thread and the order of its destruction.
struct Probe {
  Probe(std::vector<int>* order, absl::Mutex* mu, std::thread::id* where, int id)
      : order(order), mu(mu), where(where), id(id) {}
  ~Probe() {
    absl::MutexLock lock(mu);
    order->push_back(id);
    *where = std::this_thread::get_id();
  }
  std::vector<int>* order;
  absl::Mutex* mu;
  std::thread::id* where;
  int id;
};

TEST(BackgroundDeleterTest, DestroysInOrderOnItsOwnThreadAndDrainWaits) {
  absl::Mutex mu;
  std::vector<int> order;
  std::thread::id where;
  BackgroundDeleter deleter;
  for (int i = 0; i < 5; ++i) deleter.Add(std::make_unique<Probe>(&order, &mu, &where, i));
  deleter.Drain();
  EXPECT_EQ(deleter.pending(), 0);
  absl::MutexLock lock(&mu);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_NE(where, std::this_thread::get_id());
}

TEST(BackgroundDeleterTest, AddReturnsBeforeASlowDestructorFinishes) {
  std::atomic<bool> release{false};
  std::atomic<bool> destroyed{false};
  struct Slow {
    std::atomic<bool>* release;
    std::atomic<bool>* destroyed;
    ~Slow() {
      while (!release->load()) std::this_thread::yield();
      destroyed->store(true);
    }
  };
  BackgroundDeleter deleter;
  deleter.Add(std::unique_ptr<Slow>(new Slow{&release, &destroyed}));
  // Add returned while the destructor cannot finish: it did not run on this thread.
  EXPECT_FALSE(destroyed.load());
  EXPECT_EQ(deleter.pending(), 1);
  release.store(true);
  deleter.Drain();
  EXPECT_TRUE(destroyed.load());
}

TEST(BackgroundDeleterTest, DestructorDestroysWhatIsLeft) {
  absl::Mutex mu;
  std::vector<int> order;
  std::thread::id where;
  {
    BackgroundDeleter deleter;
    for (int i = 0; i < 100; ++i) deleter.Add(std::make_unique<Probe>(&order, &mu, &where, i));
  }
  absl::MutexLock lock(&mu);
  EXPECT_EQ(order.size(), 100u);
}

TEST(BackgroundDeleterTest, ManyThreadsAddAndDrain) {
  std::atomic<int> destroyed{0};
  struct Counted {
    std::atomic<int>* n;
    ~Counted() { ++*n; }
  };
  BackgroundDeleter deleter;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 250; ++i) {
        deleter.Add(std::unique_ptr<Counted>(new Counted{&destroyed}));
        if (i % 50 == 0) deleter.Drain();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  deleter.Drain();
  EXPECT_EQ(destroyed.load(), 1000);
}

}  // namespace
}  // namespace magicpig
