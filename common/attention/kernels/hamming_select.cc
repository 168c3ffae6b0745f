// SelectNearest (hamming_kernel.h): the threshold distance from exact counts (over a window that a
// sample places, or a histogram of every distance), then the dispatched pass that collects the
// selected indices (nearest_collect.h).
#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "common/attention/kernels/hamming_kernel.h"
#include "common/attention/kernels/nearest_collect.h"
#include "common/attention/kernels/selection_start.h"

namespace magicpig::attention {

namespace {

// The threshold of selecting the m smallest of d = min(distances[i], top): every key with d < t
// is taken, and the first `ties` keys with d == t.
struct Threshold {
  int t = 0;
  int64_t ties = 0;
};

// From a histogram of every distance (four of them, summed: neighbouring keys' distances are often
// equal, and one histogram's increments of the same bucket would wait on each other).
Threshold ByHistogram(const uint16_t* distances, int64_t n, int64_t m, int top) {
  const size_t stride = static_cast<size_t>(top) + 1;
  std::vector<uint32_t> histograms(4 * stride, 0);
  uint32_t* h0 = histograms.data();
  uint32_t* h1 = h0 + stride;
  uint32_t* h2 = h1 + stride;
  uint32_t* h3 = h2 + stride;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    ++h0[std::min<int>(distances[i], top)];
    ++h1[std::min<int>(distances[i + 1], top)];
    ++h2[std::min<int>(distances[i + 2], top)];
    ++h3[std::min<int>(distances[i + 3], top)];
  }
  for (; i < n; ++i) ++h0[std::min<int>(distances[i], top)];
  auto count = [&](int d) { return static_cast<int64_t>(h0[d]) + h1[d] + h2[d] + h3[d]; };
  int t = 0;
  int64_t below = 0;
  while (below + count(t) < m) below += count(t++);
  return {t, m - below};
}

// Below this many keys the histogram of every distance is cheap enough.
constexpr int64_t kMinKeysForWindow = 2048;
constexpr int64_t kSampleStride = 16;

// From a histogram of every 16th distance, which places a window of kWindow candidate thresholds
// around the sample's m / n quantile, and exact counts over that window (one vector pass); nullopt
// when the true threshold falls outside the window (the caller then counts every distance).
std::optional<Threshold> ByWindow(const uint16_t* distances, int64_t n, int64_t m, int top,
                                  SimdLevel level) {
  std::vector<uint32_t> sample(static_cast<size_t>(top) + 1, 0);
  int64_t taken = 0;
  for (int64_t i = 0; i < n; i += kSampleStride, ++taken)
    ++sample[std::min<int>(distances[i], top)];
  // The sample's quantile m / n, as the value where its cumulative count reaches m * taken / n.
  const int64_t target = std::max<int64_t>(1, m * taken / n);
  int q = 0;
  for (int64_t cum = sample[0]; cum < target && q < top; cum += sample[++q]) {
  }
  const int lo = std::max(0, q - internal::kWindow / 2);
  const internal::WindowCounts w = internal::CountWindow(level, distances, n, top, lo);
  if (w.below >= m) return std::nullopt;  // t < lo
  int64_t below = w.below;
  for (int j = 0; j < internal::kWindow; ++j) {
    if (below + w.at[j] >= m) return Threshold{lo + j, m - below};
    below += w.at[j];
  }
  return std::nullopt;  // t >= lo + kWindow
}

}  // namespace

void SelectNearest(const uint16_t* distances, int64_t n, int64_t m, int max_distance,
                   std::vector<int32_t>* out, SimdLevel level) {
  if (internal::StartSelection(&n, &m, out)) return;
  // Bucket max_distance + 1 holds every distance above max_distance.
  const int top = std::clamp(max_distance, 0, 32766) + 1;
  std::optional<Threshold> th;
  if (n >= kMinKeysForWindow) th = ByWindow(distances, n, m, top, level);
  if (!th.has_value()) th = ByHistogram(distances, n, m, top);
  out->resize(static_cast<size_t>(m));
  internal::NearestCollect a;
  a.distances = distances;
  a.n = n;
  a.t = th->t;
  a.top = top;
  a.ties = th->ties;
  a.want = m;
  out->resize(static_cast<size_t>(internal::CollectNearest(level, a, out->data())));
}

}  // namespace magicpig::attention
