// Scalar sketch scores and collecting pass (sketch_kernel.h), and the dispatch of the scores.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

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

int64_t CollectAtLeastScalar(const int32_t* scores, int64_t n, int32_t t, int32_t* out) {
  int64_t c = 0;
  for (int64_t i = 0; i < n; ++i) {
    out[c] = static_cast<int32_t>(i);
    c += scores[i] >= t ? 1 : 0;
  }
  return c;
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

void SketchScoresGroup(SimdLevel level, const uint16_t* query_codes, int g,
                       const uint16_t* key_codes, int64_t n, int words, int32_t* out) {
  if (n <= 0 || g < 1 || words < 1 || words > 16) return;
  if (internal::UsesVnniGroup(level, words)) {
    internal::SketchGroupAvx512Vnni(query_codes, g, key_codes, n, words, out);
    return;
  }
  // 256 keys are at most 8 KB of codes: the first head's pass brings a block into L1 and the
  // others read it there.
  constexpr int64_t kBlock = 256;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t len = std::min(kBlock, n - b);
    for (int h = 0; h < g; ++h) {
      SketchScores(level, query_codes + static_cast<int64_t>(h) * words, key_codes + b * words, len,
                   words, out + h * n + b);
    }
  }
}

}  // namespace magicpig::attention
