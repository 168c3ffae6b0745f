// SelectNearest (hamming_kernel.h): a counting selection over the histogram of distances.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/attention/kernels/hamming_kernel.h"
#include "common/attention/kernels/selection_start.h"

namespace magicpig::attention {

void SelectNearest(const uint16_t* distances, int64_t n, int64_t m, int max_distance,
                   std::vector<int32_t>* out) {
  if (internal::StartSelection(&n, &m, out)) return;
  // Bucket max_distance + 1 holds every distance above max_distance.
  const int top = std::max(max_distance, 0) + 1;
  std::vector<int64_t> histogram(static_cast<size_t>(top) + 1, 0);
  for (int64_t i = 0; i < n; ++i) ++histogram[std::min<int>(distances[i], top)];
  // The threshold t: every key closer than t is taken, and the first `at_threshold` keys at t.
  int t = 0;
  int64_t below = 0;
  while (below + histogram[t] < m) below += histogram[t++];
  int64_t at_threshold = m - below;
  for (int64_t i = 0; i < n; ++i) {
    const int d = std::min<int>(distances[i], top);
    if (d < t || (d == t && at_threshold-- > 0)) out->push_back(static_cast<int32_t>(i));
  }
}

}  // namespace magicpig::attention
