// Scalar reference dequantisation, one function per block type, written straight from the block
// layouts in docs (gguf-and-tokenizer.md §3). Speed is not a goal here; clarity is.
#include "common/quant/dequantize.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/half.h"

namespace magicpig {
namespace {

uint16_t ReadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));  // GGUF is little-endian, as is every host we build for
  return v;
}

uint32_t ReadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

float ReadF16(const uint8_t* p) { return Fp16ToFloat(ReadU16(p)); }

void DequantQ4_0(const uint8_t* b, float* y) {
  const float d = ReadF16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>((qs[j] & 0xF) - 8);
    y[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
  }
}

void DequantQ4_1(const uint8_t* b, float* y) {
  const float d = ReadF16(b);
  const float m = ReadF16(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(qs[j] & 0xF) + m;
    y[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
  }
}

void DequantQ5_0(const uint8_t* b, float* y) {
  const float d = ReadF16(b);
  const uint32_t h = ReadU32(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0xF) | (((h >> j) & 1) << 4);
    const int hi = (qs[j] >> 4) | (((h >> (j + 16)) & 1) << 4);
    y[j] = d * static_cast<float>(lo - 16);
    y[j + 16] = d * static_cast<float>(hi - 16);
  }
}

void DequantQ5_1(const uint8_t* b, float* y) {
  const float d = ReadF16(b);
  const float m = ReadF16(b + 2);
  const uint32_t h = ReadU32(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0xF) | (((h >> j) & 1) << 4);
    const int hi = (qs[j] >> 4) | (((h >> (j + 16)) & 1) << 4);
    y[j] = d * static_cast<float>(lo) + m;
    y[j + 16] = d * static_cast<float>(hi) + m;
  }
}

void DequantQ8_0(const uint8_t* b, float* y) {
  const float d = ReadF16(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(qs[j]);
}

// Q4_K, and Q5_K (q5: Q4_K's layout with a fifth bit per value in qh[32] after the scales; bit
// 2c of qh[l] is the high bit of value l of sub-block 2c, bit 2c + 1 that of sub-block 2c + 1).
void DequantQ45K(const uint8_t* b, float* y, bool q5) {
  const float d = ReadF16(b);
  const float dmin = ReadF16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + (q5 ? 48 : 16);
  for (int c = 0; c < 4; ++c) {
    int sc0, mn0, sc1, mn1;
    KScaleMin(scales, 2 * c, &sc0, &mn0);
    KScaleMin(scales, 2 * c + 1, &sc1, &mn1);
    const float d0 = d * static_cast<float>(sc0), m0 = dmin * static_cast<float>(mn0);
    const float d1 = d * static_cast<float>(sc1), m1 = dmin * static_cast<float>(mn1);
    const uint8_t* q = qs + 32 * c;
    for (int l = 0; l < 32; ++l) {
      int lo = q[l] & 0xF, hi = q[l] >> 4;
      if (q5) {
        lo |= ((qh[l] >> (2 * c)) & 1) << 4;
        hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
      }
      y[64 * c + l] = d0 * static_cast<float>(lo) - m0;
      y[64 * c + 32 + l] = d1 * static_cast<float>(hi) - m1;
    }
  }
}

void DequantQ4_K(const uint8_t* b, float* y) { DequantQ45K(b, y, /*q5=*/false); }
void DequantQ5_K(const uint8_t* b, float* y) { DequantQ45K(b, y, /*q5=*/true); }

void DequantQ6_K(const uint8_t* b, float* y) {
  const float d = ReadF16(b + 208);
  for (int half = 0; half < 2; ++half) {
    const uint8_t* ql = b + 64 * half;
    const uint8_t* qh = b + 128 + 32 * half;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192 + 8 * half);
    float* out = y + 128 * half;
    for (int l = 0; l < 32; ++l) {
      const int i = l / 16;
      const int q0 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q1 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q2 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q3 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      out[l] = d * static_cast<float>(sc[i]) * static_cast<float>(q0);
      out[l + 32] = d * static_cast<float>(sc[i + 2]) * static_cast<float>(q1);
      out[l + 64] = d * static_cast<float>(sc[i + 4]) * static_cast<float>(q2);
      out[l + 96] = d * static_cast<float>(sc[i + 6]) * static_cast<float>(q3);
    }
  }
}

using BlockFn = void (*)(const uint8_t*, float*);

BlockFn BlockDequantizer(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
      return DequantQ4_0;
    case GgmlType::kQ4_1:
      return DequantQ4_1;
    case GgmlType::kQ5_0:
      return DequantQ5_0;
    case GgmlType::kQ5_1:
      return DequantQ5_1;
    case GgmlType::kQ8_0:
      return DequantQ8_0;
    case GgmlType::kQ4_K:
      return DequantQ4_K;
    case GgmlType::kQ5_K:
      return DequantQ5_K;
    case GgmlType::kQ6_K:
      return DequantQ6_K;
    default:
      return nullptr;
  }
}

}  // namespace

void KScaleMin(const uint8_t* scales, int j, int* sc, int* mn) {
  if (j < 4) {
    *sc = scales[j] & 63;
    *mn = scales[j + 4] & 63;
  } else {
    *sc = (scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4);
    *mn = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
  }
}

absl::Status DequantizeRow(GgmlType type, const void* src, float* dst, int64_t n) {
  const std::optional<GgmlTypeInfo> info = LookupGgmlType(static_cast<uint32_t>(type));
  if (!info.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown ggml type code ", static_cast<uint32_t>(type)));
  }
  if (n < 0 || n % info->block_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("row of ", n, " values is not a multiple of the ", std::string(info->name),
                     " block size ", info->block_size));
  }
  const uint8_t* bytes = static_cast<const uint8_t*>(src);
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return absl::OkStatus();
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = Fp16ToFloat(ReadU16(bytes + 2 * i));
      return absl::OkStatus();
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFloat(ReadU16(bytes + 2 * i));
      return absl::OkStatus();
    default:
      break;
  }
  const BlockFn fn = BlockDequantizer(type);
  if (fn == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("dequantisation of ", std::string(info->name), " is not supported"));
  }
  const int64_t blocks = n / info->block_size;
  for (int64_t b = 0; b < blocks; ++b) {
    fn(bytes + b * info->block_bytes, dst + b * info->block_size);
  }
  return absl::OkStatus();
}

}  // namespace magicpig
