// The scalar pass of CollectNearest (the reference) and the dispatch.
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
