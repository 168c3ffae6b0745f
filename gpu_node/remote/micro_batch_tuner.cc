#include "gpu_node/remote/micro_batch_tuner.h"

#include <algorithm>
#include <vector>

namespace magicpig::remote {
namespace {

double Median(const std::deque<double>& v) {
  std::vector<double> s(v.begin(), v.end());
  std::sort(s.begin(), s.end());
  const size_t n = s.size();
  return n % 2 == 1 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

}  // namespace

int MicroBatchTuner::Choose(int64_t batch_size) {
  PerSize& s = sizes_[batch_size];
  const int other = 3 - s.current;
  if (s.last_current <= 0) return s.current;  // a probe needs a step to compare with
  if (s.ratios.size() < static_cast<size_t>(kRatios)) {
    return s.last_was_probe ? s.current : other;  // warming up: alternate
  }
  return ++s.steps % kProbeEvery == 0 ? other : s.current;
}

void MicroBatchTuner::Report(int64_t batch_size, int micro_batches, double seconds) {
  if (micro_batches != 1 && micro_batches != 2) return;
  PerSize& s = sizes_[batch_size];
  if (micro_batches == s.current) {
    s.last_current = seconds;
    s.last_was_probe = false;
    return;
  }
  s.last_was_probe = true;
  if (s.last_current <= 0) return;
  s.ratios.push_back(seconds / s.last_current);
  if (s.ratios.size() > static_cast<size_t>(kRatios)) s.ratios.pop_front();
  if (s.ratios.size() == static_cast<size_t>(kRatios) && Median(s.ratios) < 1.0) {
    // The other choice was faster: it becomes current, and the comparisons, inverted, are now
    // relative to it.
    s.current = micro_batches;
    s.last_current = seconds;
    s.last_was_probe = false;
    for (double& r : s.ratios) r = 1.0 / r;
  }
}

}  // namespace magicpig::remote
