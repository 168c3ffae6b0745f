// SelectNearest (hamming_kernel.h): a counting selection over the histogram of distances, then
// the dispatched pass that collects the selected indices (nearest_collect.h).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/attention/kernels/hamming_kernel.h"
#include "common/attention/kernels/nearest_collect.h"
#include "common/attention/kernels/selection_start.h"

namespace magicpig::attention {

void SelectNearest(const uint16_t* distances, int64_t n, int64_t m, int max_distance,
                   std::vector<int32_t>* out, SimdLevel level) {
  if (internal::StartSelection(&n, &m, out)) return;
  // Bucket max_distance + 1 holds every distance above max_distance.
  const int top = std::clamp(max_distance, 0, 32766) + 1;
  // Four histograms, summed after: the distances of neighbouring keys are often equal, and one
  // histogram's increments of the same bucket would wait on each other through memory.
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
  // The threshold t: every key closer than t is taken, and the first `at_threshold` keys at t.
  auto count = [&](int d) { return static_cast<int64_t>(h0[d]) + h1[d] + h2[d] + h3[d]; };
  int t = 0;
  int64_t below = 0;
  while (below + count(t) < m) below += count(t++);
  out->resize(static_cast<size_t>(m));
  internal::NearestCollect a;
  a.distances = distances;
  a.n = n;
  a.t = t;
  a.top = top;
  a.ties = m - below;
  a.want = m;
  out->resize(static_cast<size_t>(internal::CollectNearest(level, a, out->data())));
}

}  // namespace magicpig::attention
