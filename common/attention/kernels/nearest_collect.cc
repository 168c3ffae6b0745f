// The scalar passes of CountWindow and CollectNearest (the references) and the dispatch.
#include "common/attention/kernels/nearest_collect.h"

#include <algorithm>

namespace magicpig::attention::internal {

int64_t CollectNearestScalar(const NearestCollect& a, int32_t* out) {
  int64_t c = 0;
  int64_t ties = a.ties;
  for (int64_t i = 0; i < a.n && c < a.want; ++i) {
    const int d = std::min<int>(a.distances[i], a.top);
    if (d < a.t || (d == a.t && ties-- > 0)) out[c++] = static_cast<int32_t>(i);
  }
  return c;
}

WindowCounts CountWindowScalar(const uint16_t* distances, int64_t n, int top, int lo) {
  WindowCounts w;
  for (int64_t i = 0; i < n; ++i) {
    const int d = std::min<int>(distances[i], top);
    if (d < lo) {
      ++w.below;
    } else if (d < lo + kWindow) {
      ++w.at[d - lo];
    }
  }
  return w;
}

WindowCounts CountWindow(SimdLevel level, const uint16_t* distances, int64_t n, int top, int lo) {
  switch (ClampToDetected(level)) {
    case SimdLevel::kAvx512:
      return CountWindowAvx512(distances, n, top, lo);
    case SimdLevel::kAvx2:
      return CountWindowAvx2(distances, n, top, lo);
    default:
      return CountWindowScalar(distances, n, top, lo);
  }
}

int64_t CollectNearest(SimdLevel level, const NearestCollect& a, int32_t* out) {
  switch (ClampToDetected(level)) {
    case SimdLevel::kAvx512:
      return CollectNearestAvx512(a, out);
    case SimdLevel::kAvx2:
      return CollectNearestAvx2(a, out);
    default:
      return CollectNearestScalar(a, out);
  }
}

}  // namespace magicpig::attention::internal
