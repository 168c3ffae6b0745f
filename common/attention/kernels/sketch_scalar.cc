// Scalar sketch scores (sketch_kernel.h), the selection, and the dispatch.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "common/attention/kernels/selection_start.h"
#include "common/attention/kernels/sketch_kernel.h"

namespace magicpig::attention {
namespace internal {

void SketchScalar(const uint16_t* query_code, const uint16_t* key_codes, int64_t n, int words,
                  int32_t* out) {
  int32_t q[32];
  for (int w = 0; w < words; ++w) {
    q[2 * w] = static_cast<int8_t>(query_code[w] & 0xFF);
    q[2 * w + 1] = static_cast<int8_t>(query_code[w] >> 8);
  }
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t* k = key_codes + i * words;
    int32_t s = 0;
    for (int w = 0; w < words; ++w) {
      s += q[2 * w] * static_cast<int8_t>(k[w] & 0xFF) +
           q[2 * w + 1] * static_cast<int8_t>(k[w] >> 8);
    }
    out[i] = s;
  }
}

}  // namespace internal

void SketchScores(SimdLevel level, const uint16_t* query_code, const uint16_t* key_codes, int64_t n,
                  int words, int32_t* out) {
  if (n <= 0 || words < 1 || words > 16) return;
  level = ClampToDetected(level);
  if (level == SimdLevel::kAvx512 && words == 16) {
    internal::SketchAvx512(query_code, key_codes, n, out);
  } else if (level >= SimdLevel::kAvx2 && words % 8 == 0) {
    internal::SketchAvx2(query_code, key_codes, n, words, out);
  } else {
    internal::SketchScalar(query_code, key_codes, n, words, out);
  }
}

void SelectLargest(const int32_t* scores, int64_t n, int64_t m, std::vector<int32_t>* out) {
  if (internal::StartSelection(&n, &m, out)) return;
  // u = kSketchMaxScore - score in [0, 2 kSketchMaxScore] = [0, 2^20]: the m smallest u. A
  // histogram of the high part (u >> 10) finds the bucket h that holds the m-th; a second pass
  // takes every key of a lower bucket and sets aside those of bucket h, among which a histogram of
  // the low part picks the rest (ties to the lower index); the two sorted lists then merge.
  constexpr int kLowBits = 10;
  constexpr int kLow = 1 << kLowBits;
  constexpr int kHigh = ((2 * kSketchMaxScore) >> kLowBits) + 1;
  auto key = [&](int64_t i) {
    return static_cast<uint32_t>(kSketchMaxScore -
                                 std::clamp(scores[i], -kSketchMaxScore, kSketchMaxScore));
  };
  int32_t high[kHigh] = {};
  for (int64_t i = 0; i < n; ++i) ++high[key(i) >> kLowBits];
  int64_t below = 0;
  uint32_t h = 0;
  while (below + high[h] < m) below += high[h++];
  std::vector<std::pair<uint32_t, int32_t>> bucket;  // (u, index) of bucket h, by index
  bucket.reserve(static_cast<size_t>(high[h]));
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = key(i);
    if ((u >> kLowBits) < h) {
      out->push_back(static_cast<int32_t>(i));
    } else if ((u >> kLowBits) == h) {
      bucket.emplace_back(u, static_cast<int32_t>(i));
    }
  }
  int32_t low[kLow] = {};
  for (const auto& [u, i] : bucket) ++low[u & (kLow - 1)];
  uint32_t l = 0;
  while (below + low[l] < m) below += low[l++];
  const uint32_t t = (h << kLowBits) | l;
  int64_t at_threshold = m - below;
  const size_t taken = out->size();
  for (const auto& [u, i] : bucket) {
    if (u < t || (u == t && at_threshold-- > 0)) out->push_back(i);
  }
  std::inplace_merge(out->begin(), out->begin() + static_cast<std::ptrdiff_t>(taken), out->end());
}

}  // namespace magicpig::attention
