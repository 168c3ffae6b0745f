// Dispatch for HammingDistances plus its portable kernel (baseline ISA): 64-bit XOR + popcount
// per chunk of four words, then the 32- and 16-bit remainder, unrolled per code length.
#include <bit>
#include <cstring>
#include <utility>

#include "common/attention/kernels/hamming_kernel.h"

namespace magicpig::attention {
namespace internal {
namespace {

template <int kWords>
void HammingFixed(const uint16_t* query_code, const uint16_t* key_codes, int64_t n, uint16_t* out) {
  constexpr int kChunks = kWords / 4;
  constexpr int kRest = kWords % 4;
  uint64_t q[kChunks > 0 ? kChunks : 1] = {};
  uint64_t q_rest = 0;
  std::memcpy(q, query_code, sizeof(uint64_t) * kChunks);
  std::memcpy(&q_rest, query_code + 4 * kChunks, sizeof(uint16_t) * kRest);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t* key = key_codes + i * kWords;
    int count = 0;
    for (int c = 0; c < kChunks; ++c) {
      uint64_t k;
      std::memcpy(&k, key + 4 * c, sizeof(k));
      count += std::popcount(k ^ q[c]);
    }
    if constexpr (kRest > 0) {
      uint64_t k = 0;
      std::memcpy(&k, key + 4 * kChunks, sizeof(uint16_t) * kRest);
      count += std::popcount(k ^ q_rest);
    }
    out[i] = static_cast<uint16_t>(count);
  }
}

template <int... kWords>
void HammingByWords(int words, const uint16_t* query_code, const uint16_t* key_codes, int64_t n,
                    uint16_t* out, std::integer_sequence<int, kWords...>) {
  ((words == kWords + 1 ? HammingFixed<kWords + 1>(query_code, key_codes, n, out) : void()), ...);
}

}  // namespace

void HammingScalar(const uint16_t* query_code, const uint16_t* key_codes, int64_t n, int words,
                   uint16_t* out) {
  HammingByWords(words, query_code, key_codes, n, out,
                 std::make_integer_sequence<int, kHammingMaxWords>());
}

}  // namespace internal

void HammingDistances(SimdLevel level, const uint16_t* query_code, const uint16_t* key_codes,
                      int64_t n, int words, uint16_t* out) {
  if (n <= 0 || words < 1 || words > kHammingMaxWords) return;
  level = ClampToDetected(level);
  if (level == SimdLevel::kAvx512 && CpuHasAvx512Vpopcntdq()) {
    internal::HammingAvx512(query_code, key_codes, n, words, out);
  } else if (level >= SimdLevel::kAvx2) {
    internal::HammingAvx2(query_code, key_codes, n, words, out);
  } else {
    internal::HammingScalar(query_code, key_codes, n, words, out);
  }
}

}  // namespace magicpig::attention
