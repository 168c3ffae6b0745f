#include "common/periodic_thread.h"

#include <atomic>

#include "gtest/gtest.h"

namespace magicpig {
namespace {

TEST(PeriodicThreadTest, TicksUntilStoppedAndNotAfter) {
  std::atomic<int> ticks{0};
  PeriodicThread t(absl::Milliseconds(5), [&] { ++ticks; });
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (ticks.load() < 3 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_GE(ticks.load(), 3);
  t.Stop();
  const int stopped_at = ticks.load();
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(ticks.load(), stopped_at);
  t.Stop();  // idempotent
}

TEST(PeriodicThreadTest, StopDoesNotWaitForAPeriod) {
  const absl::Time start = absl::Now();
  {
    PeriodicThread t(absl::Hours(1), [] {});
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));  // woken, not an hour
}

}  // namespace
}  // namespace magicpig
