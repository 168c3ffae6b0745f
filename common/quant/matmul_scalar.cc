// Portable MatMul kernels (x86-64 baseline, no SIMD flags): the fallback for old CPUs and the
// plain-C++ statement of the integer arithmetic the SIMD kernels vectorise.
#include <cstring>
#include <vector>

#include "common/half.h"
#include "common/quant/dequantize.h"
#include "common/quant/matmul_kernels.h"

namespace magicpig::quant_internal {
namespace {

float F16At(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return Fp16ToFloat(h);
}

// Unpacks one 32-value weight block to integers w[32] and returns the block's scale d; *offset_coef
// is c such that the block's contribution is d * dx * sum(w * q) + c * s (s = dx * sum(q)).
float UnpackBlock(GgmlType type, const uint8_t* b, int w[32], float* offset_coef) {
  float d = F16At(b);
  switch (type) {
    case GgmlType::kQ4_0:
      for (int j = 0; j < 16; ++j) {
        w[j] = b[2 + j] & 0xF;
        w[j + 16] = b[2 + j] >> 4;
      }
      *offset_coef = -8.0f * d;
      return d;
    case GgmlType::kQ4_1:
      for (int j = 0; j < 16; ++j) {
        w[j] = b[4 + j] & 0xF;
        w[j + 16] = b[4 + j] >> 4;
      }
      *offset_coef = F16At(b + 2);
      return d;
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1: {
      const bool has_min = type == GgmlType::kQ5_1;
      uint32_t h;
      std::memcpy(&h, b + (has_min ? 4 : 2), sizeof(h));
      const uint8_t* qs = b + (has_min ? 8 : 6);
      for (int j = 0; j < 16; ++j) {
        w[j] = (qs[j] & 0xF) | static_cast<int>(((h >> j) & 1) << 4);
        w[j + 16] = (qs[j] >> 4) | static_cast<int>(((h >> (j + 16)) & 1) << 4);
      }
      *offset_coef = has_min ? F16At(b + 2) : -16.0f * d;
      return d;
    }
    case GgmlType::kQ8_0:
    default:
      for (int j = 0; j < 32; ++j) w[j] = static_cast<int8_t>(b[2 + j]);
      *offset_coef = 0.0f;
      return d;
  }
}

void IntegerRows(const MatMulArgs& a, int64_t r0, int64_t r1) {
  const int64_t nb = a.cols / kActBlock;
  const int64_t block_bytes = a.row_bytes / nb;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = a.w + r * a.row_bytes;
    for (int64_t t = 0; t < a.n_tokens; ++t) {
      const int8_t* xq = a.xq + t * a.cols;
      float main_sum = 0.0f, offset_sum = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        int w[32];
        float c;
        const float d = UnpackBlock(a.type, row + b * block_bytes, w, &c);
        int dot = 0;
        for (int j = 0; j < 32; ++j) dot += w[j] * xq[b * kActBlock + j];
        main_sum += d * a.xd[(t * nb + b) * kScaleRepeat] * static_cast<float>(dot);
        offset_sum += c * a.xs[t * nb + b];
      }
      a.y[t * a.ldy + r] = main_sum + offset_sum;
    }
  }
}

// Float and K-quant types: dequantise the row once (the reference path), reuse it for all tokens.
void FloatRows(const MatMulArgs& a, int64_t r0, int64_t r1) {
  std::vector<float> row(static_cast<size_t>(a.cols));
  for (int64_t r = r0; r < r1; ++r) {
    // Cannot fail: the dispatcher validated type and shape.
    (void)DequantizeRow(a.type, a.w + r * a.row_bytes, row.data(), a.cols);
    for (int64_t t = 0; t < a.n_tokens; ++t) {
      const float* x = a.x + t * a.ldx;
      float sum = 0.0f;
      for (int64_t k = 0; k < a.cols; ++k) sum += row[k] * x[k];
      a.y[t * a.ldy + r] = sum;
    }
  }
}

}  // namespace

void MatMulRowsScalar(const MatMulArgs& args, int64_t row_begin, int64_t row_end) {
  if (UsesQuantizedActivations(args.type)) {
    IntegerRows(args, row_begin, row_end);
  } else {
    FloatRows(args, row_begin, row_end);
  }
}

}  // namespace magicpig::quant_internal
