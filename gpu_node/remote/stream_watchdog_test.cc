// StreamWatchdog: an armed deadline that passes cancels the contexts and Disarm reports it; a
// Disarm in time reports nothing. The watchdog's thread is woken by an Arm only when it must be:
// these tests check that a deadline earlier than the one the thread sleeps to still fires on time
// and that a later one fires after the thread's earlier sleep ends (the end-to-end path, a hung
// node, is tests/integration/distributed_decode_test.cc).
#include "gpu_node/remote/stream_watchdog.h"

#include <chrono>
#include <thread>

#include "grpcpp/client_context.h"
#include "gtest/gtest.h"

namespace magicpig::remote {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

TEST(StreamWatchdogTest, DisarmInTimeReportsNoTimeout) {
  StreamWatchdog watchdog;
  grpc::ClientContext context;
  for (int i = 0; i < 1000; ++i) {
    watchdog.Arm(Clock::now() + seconds(30), {&context});
    EXPECT_FALSE(watchdog.Disarm()) << "cycle " << i;
  }
}

TEST(StreamWatchdogTest, PassedDeadlineFires) {
  StreamWatchdog watchdog;
  grpc::ClientContext context;
  watchdog.Arm(Clock::now() + milliseconds(20), {&context});
  std::this_thread::sleep_for(milliseconds(1000));
  EXPECT_TRUE(watchdog.Disarm());
  // Fired once; the next arming starts clean.
  watchdog.Arm(Clock::now() + seconds(30), {&context});
  EXPECT_FALSE(watchdog.Disarm());
}

// The thread sleeps until the 30 s deadline of the earlier arming; a new, earlier deadline must
// wake it, or this deadline would pass unnoticed for 30 s.
TEST(StreamWatchdogTest, EarlierDeadlineThanTheSleepingOneFires) {
  StreamWatchdog watchdog;
  grpc::ClientContext context;
  watchdog.Arm(Clock::now() + seconds(30), {&context});
  std::this_thread::sleep_for(milliseconds(50));  // the thread is asleep until +30 s now
  EXPECT_FALSE(watchdog.Disarm());
  watchdog.Arm(Clock::now() + milliseconds(20), {&context});
  std::this_thread::sleep_for(milliseconds(1000));
  EXPECT_TRUE(watchdog.Disarm());
}

// Re-armed with later deadlines without waking the thread: it wakes at the first deadline, finds
// the newer one and fires at that.
TEST(StreamWatchdogTest, LaterDeadlineFiresAfterTheEarlierSleepEnds) {
  StreamWatchdog watchdog;
  grpc::ClientContext context;
  watchdog.Arm(Clock::now() + milliseconds(100), {&context});
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_FALSE(watchdog.Disarm());
  const Clock::time_point later = Clock::now() + milliseconds(250);
  watchdog.Arm(later, {&context});
  std::this_thread::sleep_until(later + milliseconds(1000));
  EXPECT_TRUE(watchdog.Disarm());
}

}  // namespace
}  // namespace magicpig::remote
