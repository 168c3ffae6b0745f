// Reference quantisers for tests. Scales are rounded *up* to fp16 so that every value's quantised
// integer stays inside its field without clamping; the error of each element is then at most half
// the rounding step of its (sub-)block, plus float rounding. The bounds in QuantizationErrorBound
// are written from x alone (not from the produced blocks), so they test the stored layout too.
#include "tests/testing/quantize_reference.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/half.h"

namespace magicpig::testing {
namespace {

// Slack for the float arithmetic of quantiser and dequantiser: a few ulps of the block's range.
constexpr double kFloatSlack = 8 * FLT_EPSILON;
// fp16 has an 11-bit significand: rounding up scales by at most 2^-10 relative (we allow 2^-9,
// plus a tiny absolute term for the subnormal range).
constexpr double kHalfUp = 1.0 + 1.0 / 512;

uint16_t RoundUpFp16(float v) {  // v >= 0: smallest fp16 >= v
  uint16_t h = FloatToFp16(v);
  if (Fp16ToFloat(h) < v) ++h;
  return h;
}

uint16_t RoundDownFp16(float v) {  // largest fp16 <= v
  uint16_t h = FloatToFp16(v);
  if (Fp16ToFloat(h) > v) {
    if (h == 0x0000) return 0x8001;
    h = (h & 0x8000) ? h + 1 : h - 1;
  }
  return h;
}

void Put16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, sizeof(v)); }

int RoundClamp(double v, int lo, int hi) {
  return std::clamp(static_cast<int>(std::nearbyint(v)), lo, hi);
}

// Symmetric 32-value blocks: Q4_0 (levels +-7, offset 8), Q5_0 (+-15, offset 16), Q8_0 (+-127).
void QuantSymmetric(GgmlType type, const float* x, uint8_t* b) {
  const int levels = type == GgmlType::kQ4_0 ? 7 : type == GgmlType::kQ5_0 ? 15 : 127;
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  const uint16_t dh = RoundUpFp16(amax / static_cast<float>(levels) * (1.0f + 1e-6f));
  const double d = Fp16ToFloat(dh);
  int q[32];
  for (int i = 0; i < 32; ++i) q[i] = d > 0 ? RoundClamp(x[i] / d, -levels, levels) : 0;
  Put16(b, dh);
  if (type == GgmlType::kQ8_0) {
    for (int i = 0; i < 32; ++i) b[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(q[i]));
  } else if (type == GgmlType::kQ4_0) {
    for (int j = 0; j < 16; ++j)
      b[2 + j] = static_cast<uint8_t>((q[j] + 8) | ((q[j + 16] + 8) << 4));
  } else {  // Q5_0
    uint32_t h = 0;
    for (int j = 0; j < 32; ++j) h |= static_cast<uint32_t>(((q[j] + 16) >> 4) & 1) << j;
    std::memcpy(b + 2, &h, 4);
    for (int j = 0; j < 16; ++j) {
      b[6 + j] = static_cast<uint8_t>(((q[j] + 16) & 0xF) | (((q[j + 16] + 16) & 0xF) << 4));
    }
  }
}

// Blocks with a minimum: Q4_1 (q in 0..15), Q5_1 (0..31).
void QuantWithMin(GgmlType type, const float* x, uint8_t* b) {
  const int top = type == GgmlType::kQ4_1 ? 15 : 31;
  float lo = x[0], hi = x[0];
  for (int i = 0; i < 32; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  const uint16_t mh = RoundDownFp16(lo);
  const double m = Fp16ToFloat(mh);
  const uint16_t dh = RoundUpFp16(static_cast<float>((hi - m) / top) * (1.0f + 1e-6f));
  const double d = Fp16ToFloat(dh);
  int q[32];
  for (int i = 0; i < 32; ++i) q[i] = d > 0 ? RoundClamp((x[i] - m) / d, 0, top) : 0;
  Put16(b, dh);
  Put16(b + 2, mh);
  if (type == GgmlType::kQ4_1) {
    for (int j = 0; j < 16; ++j) b[4 + j] = static_cast<uint8_t>(q[j] | (q[j + 16] << 4));
  } else {
    uint32_t h = 0;
    for (int j = 0; j < 32; ++j) h |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
    std::memcpy(b + 4, &h, 4);
    for (int j = 0; j < 16; ++j)
      b[8 + j] = static_cast<uint8_t>((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
  }
}

// Q4_K (top = 15) and Q5_K (top = 31): per sub-block j of 32, an offset dmin*mn_j >=
// -min(0, min x_j) and a step d*sc_j that covers max x_j + offset in `top` steps (6-bit sc and
// mn, rounded up so nothing clamps).
void QuantQ45K(GgmlType type, const float* x, uint8_t* b) {
  const int top = type == GgmlType::kQ4_K ? 15 : 31;
  double neg[8], hi[8];
  double max_neg = 0;
  for (int j = 0; j < 8; ++j) {
    neg[j] = 0;
    hi[j] = 0;
    for (int i = 0; i < 32; ++i) {
      neg[j] = std::max(neg[j], -static_cast<double>(x[32 * j + i]));
      hi[j] = std::max(hi[j], static_cast<double>(x[32 * j + i]));
    }
    max_neg = std::max(max_neg, neg[j]);
  }
  const uint16_t dminh = RoundUpFp16(static_cast<float>(max_neg / 63 * (1 + 1e-6)));
  const double dmin = Fp16ToFloat(dminh);
  int mn[8], sc[8];
  double range[8], max_range = 0;
  for (int j = 0; j < 8; ++j) {
    mn[j] = dmin > 0 ? std::min(63, static_cast<int>(std::ceil(neg[j] / dmin))) : 0;
    range[j] = hi[j] + dmin * mn[j];
    max_range = std::max(max_range, range[j]);
  }
  const uint16_t dh = RoundUpFp16(static_cast<float>(max_range / (top * 63) * (1 + 1e-6)));
  const double d = Fp16ToFloat(dh);
  for (int j = 0; j < 8; ++j) {
    sc[j] = d > 0 ? std::min(63, static_cast<int>(std::ceil(range[j] / (top * d)))) : 0;
  }
  Put16(b, dh);
  Put16(b + 2, dminh);
  uint8_t* scales = b + 4;
  for (int j = 0; j < 4; ++j) {
    scales[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    scales[j + 4] = static_cast<uint8_t>((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
    scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4));
  }
  int q[256];
  for (int i = 0; i < 256; ++i) {
    const int j = i / 32;
    const double step = d * sc[j];
    q[i] = step > 0 ? RoundClamp((x[i] + dmin * mn[j]) / step, 0, top) : 0;
  }
  uint8_t* qs = b + (top == 15 ? 16 : 48);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      qs[32 * c + l] =
          static_cast<uint8_t>((q[64 * c + l] & 0xF) | ((q[64 * c + 32 + l] & 0xF) << 4));
    }
  }
  if (top == 31) {
    uint8_t* qh = b + 16;
    for (int l = 0; l < 32; ++l) {
      int h = 0;
      for (int j = 0; j < 8; ++j) h |= (q[32 * j + l] >> 4) << j;
      qh[l] = static_cast<uint8_t>(h);
    }
  }
}

// Q6_K: per sub-block j of 16 a step d*sc_j >= max|x_j| / 31, so q - 32 stays in [-31, 31].
void QuantQ6K(const float* x, uint8_t* b) {
  double need[16], max_need = 0;
  for (int j = 0; j < 16; ++j) {
    double amax = 0;
    for (int i = 0; i < 16; ++i)
      amax = std::max(amax, std::fabs(static_cast<double>(x[16 * j + i])));
    need[j] = amax / 31;
    max_need = std::max(max_need, need[j]);
  }
  const uint16_t dh = RoundUpFp16(static_cast<float>(max_need / 127 * (1 + 1e-6)));
  const double d = Fp16ToFloat(dh);
  int sc[16], q[256];
  for (int j = 0; j < 16; ++j) {
    sc[j] = d > 0 ? std::min(127, static_cast<int>(std::ceil(need[j] / d))) : 0;
  }
  for (int i = 0; i < 256; ++i) {
    const double step = d * sc[i / 16];
    q[i] = (step > 0 ? RoundClamp(x[i] / step, -31, 31) : 0) + 32;
  }
  uint8_t* ql = b;
  uint8_t* qh = b + 128;
  for (int h = 0; h < 2; ++h) {
    const int* o = q + 128 * h;
    for (int l = 0; l < 32; ++l) {
      ql[64 * h + l] = static_cast<uint8_t>((o[l] & 0xF) | ((o[l + 64] & 0xF) << 4));
      ql[64 * h + l + 32] = static_cast<uint8_t>((o[l + 32] & 0xF) | ((o[l + 96] & 0xF) << 4));
      qh[32 * h + l] = static_cast<uint8_t>((o[l] >> 4) | ((o[l + 32] >> 4) << 2) |
                                            ((o[l + 64] >> 4) << 4) | ((o[l + 96] >> 4) << 6));
    }
  }
  for (int j = 0; j < 16; ++j) b[192 + j] = static_cast<uint8_t>(static_cast<int8_t>(sc[j]));
  Put16(b + 208, dh);
}

}  // namespace

absl::StatusOr<std::vector<uint8_t>> QuantizeReference(GgmlType type, const float* x, int64_t n) {
  const GgmlTypeInfo& info = GetGgmlTypeInfo(type);
  if (n % info.block_size != 0) return absl::InvalidArgumentError("n not a multiple of block");
  std::vector<uint8_t> out(static_cast<size_t>(GgmlRowBytes(type, n)));
  const int64_t blocks = n / info.block_size;
  for (int64_t i = 0; i < blocks; ++i) {
    const float* xb = x + i * info.block_size;
    uint8_t* b = out.data() + i * info.block_bytes;
    switch (type) {
      case GgmlType::kF32:
        std::memcpy(b, xb, 4);
        break;
      case GgmlType::kF16:
        Put16(b, FloatToFp16(*xb));
        break;
      case GgmlType::kBF16:
        Put16(b, FloatToBf16(*xb));
        break;
      case GgmlType::kQ4_0:
      case GgmlType::kQ5_0:
      case GgmlType::kQ8_0:
        QuantSymmetric(type, xb, b);
        break;
      case GgmlType::kQ4_1:
      case GgmlType::kQ5_1:
        QuantWithMin(type, xb, b);
        break;
      case GgmlType::kQ4_K:
      case GgmlType::kQ5_K:
        QuantQ45K(type, xb, b);
        break;
      case GgmlType::kQ6_K:
        QuantQ6K(xb, b);
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat("no reference quantiser for ", info.name));
    }
  }
  return out;
}

std::vector<double> QuantizationErrorBound(GgmlType type, const float* x, int64_t n) {
  std::vector<double> bound(static_cast<size_t>(n), 0.0);
  const int64_t bs = GgmlBlockSize(type);
  for (int64_t start = 0; start < n; start += bs) {
    const float* xb = x + start;
    double amax = 0, lo = xb[0], hi = xb[0];
    for (int64_t i = 0; i < bs; ++i) {
      amax = std::max(amax, std::fabs(static_cast<double>(xb[i])));
      lo = std::min(lo, static_cast<double>(xb[i]));
      hi = std::max(hi, static_cast<double>(xb[i]));
    }
    const double slack = kFloatSlack * amax + 1e-7;  // 1e-7: fp16 subnormal granularity of scales
    auto set_all = [&](double v) {
      for (int64_t i = 0; i < bs; ++i) bound[start + i] = v + slack;
    };
    switch (type) {
      case GgmlType::kF32:
        set_all(0);
        break;
      case GgmlType::kF16:  // half an ulp of an 11-bit significand, 2^-25 in the subnormal range
        set_all(amax / 2048 + std::ldexp(1.0, -25));
        break;
      case GgmlType::kBF16:  // 8-bit significand
        set_all(amax / 256);
        break;
      case GgmlType::kQ4_0:  // step = amax / 7 (rounded up to fp16)
        set_all(0.5 * amax / 7 * kHalfUp);
        break;
      case GgmlType::kQ5_0:
        set_all(0.5 * amax / 15 * kHalfUp);
        break;
      case GgmlType::kQ8_0:
        set_all(0.5 * amax / 127 * kHalfUp);
        break;
      case GgmlType::kQ4_1:  // step = (max - m) / 15, m = min rounded down to fp16
        set_all(0.5 * (hi - lo + std::fabs(lo) / 1024) / 15 * kHalfUp);
        break;
      case GgmlType::kQ5_1:
        set_all(0.5 * (hi - lo + std::fabs(lo) / 1024) / 31 * kHalfUp);
        break;
      case GgmlType::kQ4_K:
      case GgmlType::kQ5_K: {
        // Sub-block j: step_j = d*sc_j <= range_j/top + d, range_j <= hi_j + neg_j + dmin,
        // dmin <= max_neg/63, d <= max_range/(top*63) (each times the fp16 round-up); top = 15
        // for Q4_K, 31 for Q5_K.
        const double top_q = type == GgmlType::kQ4_K ? 15 : 31;
        double neg[8], top[8], max_neg = 0, max_range = 0;
        for (int j = 0; j < 8; ++j) {
          neg[j] = top[j] = 0;
          for (int i = 0; i < 32; ++i) {
            neg[j] = std::max(neg[j], -static_cast<double>(xb[32 * j + i]));
            top[j] = std::max(top[j], static_cast<double>(xb[32 * j + i]));
          }
          max_neg = std::max(max_neg, neg[j]);
        }
        const double dmin = max_neg / 63 * kHalfUp;
        for (int j = 0; j < 8; ++j) max_range = std::max(max_range, top[j] + neg[j] + dmin);
        const double d = max_range / (top_q * 63) * kHalfUp;
        for (int j = 0; j < 8; ++j) {
          const double step = (top[j] + neg[j] + dmin) / top_q + d;
          for (int i = 0; i < 32; ++i) bound[start + 32 * j + i] = 0.5 * step + slack;
        }
        break;
      }
      case GgmlType::kQ6_K: {
        // Sub-block j of 16: step_j = d*sc_j <= amax_j/31 + d, d <= max(amax_j)/(31*127).
        const double d = amax / (31 * 127) * kHalfUp;
        for (int j = 0; j < 16; ++j) {
          double a = 0;
          for (int i = 0; i < 16; ++i)
            a = std::max(a, std::fabs(static_cast<double>(xb[16 * j + i])));
          for (int i = 0; i < 16; ++i) bound[start + 16 * j + i] = 0.5 * (a / 31 + d) + slack;
        }
        break;
      }
      default:
        set_all(0);
        break;
    }
  }
  return bound;
}

}  // namespace magicpig::testing
