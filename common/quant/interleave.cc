#include "common/quant/interleave.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/quant/dequantize.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"

namespace magicpig {
namespace {

// Values per interleaved block: a K-quant super-block, or a Q4_1 or Q8_0 block.
int64_t BlockValues(GgmlType type) {
  return type == GgmlType::kQ4_1 || type == GgmlType::kQ8_0 ? 32 : 256;
}

// Bytes of one file block: 144 (Q4_K), 210 (Q6_K: ql[128], qh[64], scales[16], d), 20 (Q4_1), 34
// (Q8_0).
int64_t BlockBytes(GgmlType type) { return GgmlRowBytes(type, BlockValues(type)); }

// One Q4_1 block of 16 rows (file blocks at src + r * row_bytes) into dst (320 bytes).
void InterleaveQ41GroupBlock(const uint8_t* src, int64_t row_bytes, uint8_t* dst) {
  for (int r = 0; r < kInterleaveRows; ++r) {
    const uint8_t* b = src + r * row_bytes;
    std::memcpy(dst + 2 * r, b, 2);           // d
    std::memcpy(dst + 32 + 2 * r, b + 2, 2);  // m
    for (int k = 0; k < 4; ++k) std::memcpy(dst + 64 + 64 * k + 4 * r, b + 4 + 4 * k, 4);
  }
}

// One Q8_0 block of 16 rows into dst (544 bytes), the quants biased by 128.
void InterleaveQ80GroupBlock(const uint8_t* src, int64_t row_bytes, uint8_t* dst) {
  for (int r = 0; r < kInterleaveRows; ++r) {
    const uint8_t* b = src + r * row_bytes;
    std::memcpy(dst + 2 * r, b, 2);  // d
    for (int k = 0; k < 8; ++k) {
      for (int i = 0; i < 4; ++i) dst[32 + 64 * k + 4 * r + i] = b[2 + 4 * k + i] ^ 0x80;
    }
  }
}

// Row r's file block of one Q8_0 group block.
void DeinterleaveQ80Block(const uint8_t* src, int r, uint8_t* b) {
  std::memcpy(b, src + 2 * r, 2);
  for (int k = 0; k < 8; ++k) {
    for (int i = 0; i < 4; ++i) b[2 + 4 * k + i] = src[32 + 64 * k + 4 * r + i] ^ 0x80;
  }
}

// Row r's file block of one Q4_1 group block.
void DeinterleaveQ41Block(const uint8_t* src, int r, uint8_t* b) {
  std::memcpy(b, src + 2 * r, 2);
  std::memcpy(b + 2, src + 32 + 2 * r, 2);
  for (int k = 0; k < 4; ++k) std::memcpy(b + 4 + 4 * k, src + 64 + 64 * k + 4 * r, 4);
}

// Inverse of KScaleMin (dequantize.h): ggml's 12-byte packing of 8 six-bit scales and mins.
void PackScales(const uint8_t sc[8], const uint8_t mn[8], uint8_t* p) {
  for (int j = 0; j < 4; ++j) {
    p[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    p[j + 4] = static_cast<uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
    p[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0x0F) | ((mn[j + 4] & 0x0F) << 4));
  }
}

// One Q4_K super-block of 16 rows (file blocks at src + r * row_bytes) into dst (2304 bytes).
void InterleaveQ4GroupSb(const uint8_t* src, int64_t row_bytes, uint8_t* dst) {
  std::memset(dst, 0, kInterleaveRows * BlockBytes(GgmlType::kQ4_K));
  for (int r = 0; r < kInterleaveRows; ++r) {
    const uint8_t* b = src + r * row_bytes;
    std::memcpy(dst + 2 * r, b, 2);           // d
    std::memcpy(dst + 32 + 2 * r, b + 2, 2);  // dmin
    for (int s = 0; s < 8; ++s) {
      int sc, mn;
      KScaleMin(b + 4, s, &sc, &mn);
      dst[64 + 16 * s + r] = static_cast<uint8_t>((sc & 0x0F) | ((mn & 0x0F) << 4));
      const int shift = 4 * (s % 2);
      dst[192 + 16 * (s / 2) + r] |=
          static_cast<uint8_t>((((sc >> 4) & 3) | (((mn >> 4) & 3) << 2)) << shift);
    }
    // File byte 32 p + l of qs holds value l of sub-block 2p (low nibble) and of 2p + 1 (high):
    // chunk (p, g) is bytes 32 p + 4 g .. + 3 of each row, side by side.
    const uint8_t* qs = b + 16;
    for (int p = 0; p < 4; ++p) {
      for (int g = 0; g < 8; ++g) {
        std::memcpy(dst + 256 + 64 * (8 * p + g) + 4 * r, qs + 32 * p + 4 * g, 4);
      }
    }
  }
}

// Q6_K quant v (0..255) of a file block: half h = v / 128 has ql[64 h..), qh[32 h..); within it
// value 32 k + l takes the low (k < 2) or high nibble of ql[64 h + l + 32 (k % 2)] and bits
// 2k, 2k + 1 of qh[32 h + l].
int Q6Quant(const uint8_t* b, int v) {
  const int h = v / 128, k = (v % 128) / 32, l = v % 32;
  const uint8_t lo = b[64 * h + l + 32 * (k % 2)];
  const int low4 = k < 2 ? (lo & 0x0F) : (lo >> 4);
  return low4 | (((b[128 + 32 * h + l] >> (2 * k)) & 3) << 4);
}

void SetQ6Quant(uint8_t* b, int v, int q) {
  const int h = v / 128, k = (v % 128) / 32, l = v % 32;
  uint8_t& lo = b[64 * h + l + 32 * (k % 2)];
  lo = static_cast<uint8_t>(k < 2 ? (lo & 0xF0) | (q & 0x0F) : (lo & 0x0F) | ((q & 0x0F) << 4));
  uint8_t& hi = b[128 + 32 * h + l];
  hi = static_cast<uint8_t>((hi & ~(3 << (2 * k))) | (((q >> 4) & 3) << (2 * k)));
}

// The same for one Q6_K super-block (3360 bytes).
void InterleaveQ6GroupSb(const uint8_t* src, int64_t row_bytes, uint8_t* dst) {
  std::memset(dst, 0, kInterleaveRows * BlockBytes(GgmlType::kQ6_K));
  for (int r = 0; r < kInterleaveRows; ++r) {
    const uint8_t* b = src + r * row_bytes;
    std::memcpy(dst + 2 * r, b + 208, 2);
    for (int j = 0; j < 16; ++j) {
      dst[32 + 16 * j + r] = b[192 + j];
      uint8_t* chunk = dst + 288 + 192 * j;
      for (int i = 0; i < 4; ++i) {
        int v[4];
        for (int k = 0; k < 4; ++k) v[k] = Q6Quant(b, 16 * j + 4 * k + i);
        chunk[4 * r + i] = static_cast<uint8_t>((v[0] & 0x0F) | ((v[1] & 0x0F) << 4));
        chunk[64 + 4 * r + i] = static_cast<uint8_t>((v[2] & 0x0F) | ((v[3] & 0x0F) << 4));
        chunk[128 + 4 * r + i] = static_cast<uint8_t>((v[0] >> 4) | ((v[1] >> 4) << 2) |
                                                      ((v[2] >> 4) << 4) | ((v[3] >> 4) << 6));
      }
    }
  }
}

// Row r's file block of one Q6_K group super-block.
void DeinterleaveQ6Block(const uint8_t* src, int r, uint8_t* b) {
  std::memcpy(b + 208, src + 2 * r, 2);
  for (int j = 0; j < 16; ++j) {
    b[192 + j] = src[32 + 16 * j + r];
    const uint8_t* chunk = src + 288 + 192 * j;
    for (int i = 0; i < 4; ++i) {
      const uint8_t l0 = chunk[4 * r + i], l1 = chunk[64 + 4 * r + i], h = chunk[128 + 4 * r + i];
      const int low[4] = {l0 & 0x0F, l0 >> 4, l1 & 0x0F, l1 >> 4};
      for (int k = 0; k < 4; ++k) {
        SetQ6Quant(b, 16 * j + 4 * k + i, low[k] | (((h >> (2 * k)) & 3) << 4));
      }
    }
  }
}

// Row r's file block of one Q4_K group super-block.
void DeinterleaveQ4Block(const uint8_t* src, int r, uint8_t* b) {
  std::memcpy(b, src + 2 * r, 2);
  std::memcpy(b + 2, src + 32 + 2 * r, 2);
  uint8_t sc[8], mn[8];
  for (int s = 0; s < 8; ++s) {
    const uint8_t lo = src[64 + 16 * s + r];
    const uint8_t hi = static_cast<uint8_t>(src[192 + 16 * (s / 2) + r] >> (4 * (s % 2)));
    sc[s] = static_cast<uint8_t>((lo & 0x0F) | ((hi & 3) << 4));
    mn[s] = static_cast<uint8_t>((lo >> 4) | (((hi >> 2) & 3) << 4));
  }
  PackScales(sc, mn, b + 4);
  for (int p = 0; p < 4; ++p) {
    for (int g8 = 0; g8 < 8; ++g8) {
      std::memcpy(b + 16 + 32 * p + 4 * g8, src + 256 + 64 * (8 * p + g8) + 4 * r, 4);
    }
  }
}

}  // namespace

bool CanInterleave(GgmlType type, int64_t rows, int64_t cols) {
  return (type == GgmlType::kQ4_K || type == GgmlType::kQ6_K || type == GgmlType::kQ4_1 ||
          type == GgmlType::kQ8_0) &&
         rows > 0 && rows % kInterleaveRows == 0 && cols > 0 && cols % BlockValues(type) == 0;
}

absl::Status Interleave(GgmlType type, uint8_t* data, int64_t rows, int64_t cols) {
  if (!CanInterleave(type, rows, cols)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot interleave a ", std::string(GgmlTypeName(type)), " matrix of ", rows, " x ", cols,
        " (needs Q4_K, Q6_K, Q4_1 or Q8_0, rows a multiple of 16, cols of its block)"));
  }
  const int64_t block_bytes = BlockBytes(type), nsb = cols / BlockValues(type),
                row_bytes = nsb * block_bytes;
  // Groups are independent (each rewrites its own byte range from a copy of itself).
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, rows / kInterleaveRows, 16),
                    [&](const tbb::blocked_range<int64_t>& range) {
                      std::vector<uint8_t> group(static_cast<size_t>(kInterleaveRows * row_bytes));
                      for (int64_t g = range.begin(); g < range.end(); ++g) {
                        uint8_t* base = data + g * kInterleaveRows * row_bytes;
                        std::memcpy(group.data(), base, group.size());
                        for (int64_t sb = 0; sb < nsb; ++sb) {
                          const uint8_t* src = group.data() + sb * block_bytes;
                          uint8_t* dst = base + sb * kInterleaveRows * block_bytes;
                          if (type == GgmlType::kQ6_K) {
                            InterleaveQ6GroupSb(src, row_bytes, dst);
                          } else if (type == GgmlType::kQ4_1) {
                            InterleaveQ41GroupBlock(src, row_bytes, dst);
                          } else if (type == GgmlType::kQ8_0) {
                            InterleaveQ80GroupBlock(src, row_bytes, dst);
                          } else {
                            InterleaveQ4GroupSb(src, row_bytes, dst);
                          }
                        }
                      }
                    });
  return absl::OkStatus();
}

void DeinterleaveRow(GgmlType type, const uint8_t* data, int64_t cols, int64_t row, uint8_t* out) {
  const int64_t block_bytes = BlockBytes(type), nsb = cols / BlockValues(type),
                row_bytes = nsb * block_bytes;
  const int r = static_cast<int>(row % kInterleaveRows);
  const uint8_t* group = data + row / kInterleaveRows * kInterleaveRows * row_bytes;
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* src = group + sb * kInterleaveRows * block_bytes;
    if (type == GgmlType::kQ6_K) {
      DeinterleaveQ6Block(src, r, out + sb * block_bytes);
    } else if (type == GgmlType::kQ4_1) {
      DeinterleaveQ41Block(src, r, out + sb * block_bytes);
    } else if (type == GgmlType::kQ8_0) {
      DeinterleaveQ80Block(src, r, out + sb * block_bytes);
    } else {
      DeinterleaveQ4Block(src, r, out + sb * block_bytes);
    }
  }
}

}  // namespace magicpig
