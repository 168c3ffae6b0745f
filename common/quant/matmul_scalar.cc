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

// One K-quant super-block in integers: q[256] unsigned in value order, the integer scale of each
// 16 values, and per 16 values the integer `offset` whose product with that 16's activation sum
// is subtracted, in units of `offset_unit` (Q4_K/Q5_K: the sub-block's min, unit dmin; Q6_K: the
// scale, unit 32 * d, since q is stored offset by 32).
struct KBlock {
  int q[256];
  int scale16[16];
  int offset16[16];
  float d, offset_unit;
};

void UnpackK(GgmlType type, const uint8_t* b, KBlock* k) {
  if (type == GgmlType::kQ6_K) {
    k->d = F16At(b + 208);
    k->offset_unit = 32.0f * k->d;
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = b + 64 * half;
      const uint8_t* qh = b + 128 + 32 * half;
      int* o = k->q + 128 * half;
      for (int l = 0; l < 32; ++l) {
        o[l] = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
        o[l + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
        o[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
        o[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
      }
    }
    for (int j = 0; j < 16; ++j) k->scale16[j] = k->offset16[j] = static_cast<int8_t>(b[192 + j]);
    return;
  }
  k->d = F16At(b);
  k->offset_unit = F16At(b + 2);
  for (int j = 0; j < 8; ++j) {
    int s, m;
    KScaleMin(b + 4, j, &s, &m);
    k->scale16[2 * j] = k->scale16[2 * j + 1] = s;
    k->offset16[2 * j] = k->offset16[2 * j + 1] = m;
  }
  const bool q5 = type == GgmlType::kQ5_K;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + (q5 ? 48 : 16);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      int lo = qs[32 * c + l] & 0xF, hi = qs[32 * c + l] >> 4;
      if (q5) {
        lo |= ((qh[l] >> (2 * c)) & 1) << 4;
        hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
      }
      k->q[64 * c + l] = lo;
      k->q[64 * c + 32 + l] = hi;
    }
  }
}

// y = sum over super-blocks of d_x * (d * sum_16 scale * dot - offset_unit * sum_16 offset * bsum).
void KQuantRows(const MatMulArgs& a, int64_t r0, int64_t r1) {
  const int64_t nsb = a.cols / kSuperBlock;
  const int64_t block_bytes = a.row_bytes / nsb;
  KBlock k;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = a.w + r * a.row_bytes;
    for (int64_t t = 0; t < a.n_tokens; ++t) a.y[t * a.ldy + r] = 0.0f;
    for (int64_t sb = 0; sb < nsb; ++sb) {
      UnpackK(a.type, row + sb * block_bytes, &k);
      for (int64_t t = 0; t < a.n_tokens; ++t) {
        const int8_t* xq = a.kq + t * a.cols + sb * kSuperBlock;
        const int16_t* bs = a.kbs + (t * nsb + sb) * kBsumsPerSuperBlock;
        int main = 0, offset = 0;
        for (int j = 0; j < 16; ++j) {
          int dot = 0;
          for (int i = 16 * j; i < 16 * j + 16; ++i) dot += k.q[i] * xq[i];
          main += k.scale16[j] * dot;
          offset += k.offset16[j] * bs[j];
        }
        const float dx = a.kd[t * nsb + sb];
        // Q4_K/Q5_K offsets are per 32 values: offset16 repeats each, and bs splits the sum.
        a.y[t * a.ldy + r] +=
            k.d * dx * static_cast<float>(main) - k.offset_unit * dx * static_cast<float>(offset);
      }
    }
  }
}

// Float types: dequantise the row once (the reference path), reuse it for all tokens.
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
  } else if (IsKQuant(args.type)) {
    KQuantRows(args, row_begin, row_end);
  } else {
    FloatRows(args, row_begin, row_end);
  }
}

}  // namespace magicpig::quant_internal
