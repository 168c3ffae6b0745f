// MicroBatchTuner against scripted step times: it warms up on both choices, keeps the faster,
// probes the other at its fixed rate, follows a change in either one, and one slow step does not
// decide.
#include "gpu_node/remote/micro_batch_tuner.h"

#include <functional>
#include <vector>

#include "gtest/gtest.h"

namespace magicpig::remote {
namespace {

// Runs `steps` steps of `batch` sequences whose time is cost(micro_batches, step index); returns
// the choices made.
std::vector<int> RunSteps(MicroBatchTuner& tuner, int64_t batch, int steps,
                          const std::function<double(int, int)>& cost) {
  std::vector<int> chosen;
  for (int i = 0; i < steps; ++i) {
    const int m = tuner.Choose(batch);
    EXPECT_TRUE(m == 1 || m == 2) << m;
    tuner.Report(batch, m, cost(m, i));
    chosen.push_back(m);
  }
  return chosen;
}

int Count(const std::vector<int>& v, int x, size_t from = 0) {
  int n = 0;
  for (size_t i = from; i < v.size(); ++i) n += v[i] == x;
  return n;
}

// The first index at or after `from` from which `x` runs twice in a row: where the tuner made it
// the current choice (a probe runs once). -1 if none.
int SwitchTo(const std::vector<int>& c, int x, size_t from) {
  for (size_t i = from; i + 1 < c.size(); ++i) {
    if (c[i] == x && c[i + 1] == x) return static_cast<int>(i);
  }
  return -1;
}

constexpr int kWarm = 2 * MicroBatchTuner::kRatios;  // current, probe, current, probe, ...

TEST(MicroBatchTunerTest, WarmsUpAlternatingPingPongFirst) {
  MicroBatchTuner tuner;
  const std::vector<int> c =
      RunSteps(tuner, 4, kWarm, [](int m, int) { return m == 2 ? 1.0 : 2.0; });
  EXPECT_EQ(c, (std::vector<int>{2, 1, 2, 1, 2, 1}));
}

TEST(MicroBatchTunerTest, KeepsTheFasterAndProbesTheOther) {
  for (const int faster : {1, 2}) {
    SCOPED_TRACE(faster);
    MicroBatchTuner tuner;
    const int after = 10 * MicroBatchTuner::kProbeEvery;
    const std::vector<int> c =
        RunSteps(tuner, 4, kWarm + after, [&](int m, int) { return m == faster ? 0.010 : 0.015; });
    // After the warm-up: one probe of the slower choice per kProbeEvery steps, no more.
    EXPECT_EQ(Count(c, 3 - faster, kWarm), after / MicroBatchTuner::kProbeEvery);
    EXPECT_EQ(Count(c, faster, kWarm), after - after / MicroBatchTuner::kProbeEvery);
  }
}

TEST(MicroBatchTunerTest, SwitchesWhenTheCurrentOneSlowsDown) {
  MicroBatchTuner tuner;
  const int change = 50, steps = 150;
  // Ping-pong is faster until step `change`, then it is the slower one (say the attention nodes
  // got busy elsewhere): the probes of one batch show it.
  const std::vector<int> c = RunSteps(tuner, 4, steps, [&](int m, int i) {
    if (m == 1) return 0.015;
    return i < change ? 0.010 : 0.020;
  });
  EXPECT_EQ(SwitchTo(c, 1, kWarm), SwitchTo(c, 1, change));  // not before the change
  // A majority of the kRatios comparisons must turn: two probes, then the switch.
  const int at = SwitchTo(c, 1, change);
  ASSERT_GE(at, change);
  EXPECT_LE(at, change + 2 * MicroBatchTuner::kProbeEvery);
  // From there ping-pong runs only as a probe.
  EXPECT_LE(Count(c, 2, at), (steps - at) / MicroBatchTuner::kProbeEvery + 1);
}

TEST(MicroBatchTunerTest, SwitchesWhenTheProbedOneSpeedsUp) {
  MicroBatchTuner tuner;
  const int change = 40, steps = 150;
  // One batch becomes the faster at step `change`; only the probes see it.
  const std::vector<int> c = RunSteps(tuner, 4, steps, [&](int m, int i) {
    if (m == 2) return 0.010;
    return i < change ? 0.015 : 0.005;
  });
  const int at = SwitchTo(c, 1, kWarm);
  ASSERT_GE(at, change);
  EXPECT_LE(at, change + 2 * MicroBatchTuner::kProbeEvery);
  EXPECT_LE(Count(c, 2, at), (steps - at) / MicroBatchTuner::kProbeEvery + 1);
}

TEST(MicroBatchTunerTest, OneSlowStepDoesNotDecide) {
  for (const int slow_step : {36, 37}) {  // the current step before a probe; the probe itself
    SCOPED_TRACE(slow_step);
    MicroBatchTuner tuner;
    const std::vector<int> c = RunSteps(tuner, 4, 80, [&](int m, int i) {
      if (i == slow_step) return 1.0;  // a preempted step
      return m == 2 ? 0.010 : 0.015;
    });
    ASSERT_EQ(c[37], 1);  // the probe this test is built around
    EXPECT_EQ(SwitchTo(c, 1, kWarm), -1);
    EXPECT_EQ(Count(c, 1, kWarm), (80 - kWarm) / MicroBatchTuner::kProbeEvery);
  }
}

TEST(MicroBatchTunerTest, BatchSizesAreTunedApart) {
  MicroBatchTuner tuner;
  // Batch 4 prefers one batch and batch 8 ping-pong: steps interleaved.
  std::vector<int> c4, c8;
  for (int i = 0; i < 100; ++i) {
    const int m4 = tuner.Choose(4);
    tuner.Report(4, m4, m4 == 1 ? 0.010 : 0.012);
    const int m8 = tuner.Choose(8);
    tuner.Report(8, m8, m8 == 2 ? 0.020 : 0.025);
    c4.push_back(m4);
    c8.push_back(m8);
  }
  const int probes = (100 - kWarm) / MicroBatchTuner::kProbeEvery;
  EXPECT_EQ(Count(c4, 1, kWarm), 100 - kWarm - probes);
  EXPECT_EQ(Count(c8, 2, kWarm), 100 - kWarm - probes);
}

TEST(MicroBatchTunerTest, ReportsWithBadCountsAreIgnored) {
  MicroBatchTuner tuner;
  tuner.Report(4, 3, 0.001);  // not a valid choice: dropped
  tuner.Report(4, 0, 0.001);
  EXPECT_EQ(tuner.Choose(4), 2);  // nothing to compare with yet: the current choice
  tuner.Report(4, 2, 0.010);
  EXPECT_EQ(tuner.Choose(4), 1);  // the first probe
}

}  // namespace
}  // namespace magicpig::remote
