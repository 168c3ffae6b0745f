// MatMul/GetRow: argument checks, activation quantisation and the one-per-call choice of the
// per-ISA kernel. Compiled at the x86-64 baseline; the SIMD code lives in matmul_<isa>.cc.
#include "common/quant/matmul.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/quant/dequantize.h"
#include "common/quant/matmul_kernels.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"

namespace magicpig {
namespace {

using quant_internal::kActBlock;
using quant_internal::kScaleRepeat;
using quant_internal::MatMulArgs;

absl::Status CheckMatrix(const QuantMatrix& w) {
  const std::optional<GgmlTypeInfo> info = LookupGgmlType(static_cast<uint32_t>(w.type));
  if (!info.has_value() || !info->supported) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported weight type code ", static_cast<uint32_t>(w.type)));
  }
  if (w.rows < 0 || w.cols <= 0 || w.cols % info->block_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("bad ", std::string(info->name),
                                                   " matrix shape ", w.rows, "x", w.cols,
                                                   " (block size ", info->block_size, ")"));
  }
  if (w.rows > 0 && w.data == nullptr) return absl::InvalidArgumentError("null weight data");
  return absl::OkStatus();
}

}  // namespace

namespace quant_internal {

// Rounding here is the only approximation the integer kernels make; every level uses this one
// function, so all levels see identical integer inputs.
void QuantizeActivationRow(const float* x, int64_t cols, int8_t* q, float* d_rep, float* s) {
  const int64_t nb = cols / kActBlock;
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * kActBlock;
    float amax = 0.0f;
    for (int64_t i = 0; i < kActBlock; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float d = amax / 127.0f;
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    int sum = 0;
    for (int64_t i = 0; i < kActBlock; ++i) {
      const int v = std::clamp(static_cast<int>(std::nearbyint(xb[i] * id)), -127, 127);
      q[b * kActBlock + i] = static_cast<int8_t>(v);
      sum += v;
    }
    for (int64_t i = 0; i < kScaleRepeat; ++i) d_rep[b * kScaleRepeat + i] = d;
    s[b] = d * static_cast<float>(sum);
  }
}

}  // namespace quant_internal

namespace {

// Rows per task: enough that a task reads a few tens of KiB of weights (TBB overhead is a few
// microseconds per task), few enough that decode-sized matrices still split over the cores.
int64_t RowGrain(int64_t row_bytes, int64_t n_tokens) {
  constexpr int64_t kTargetWork = 32 * 1024;
  const int64_t work_per_row = row_bytes * std::max<int64_t>(1, n_tokens);
  return std::clamp<int64_t>(kTargetWork / std::max<int64_t>(1, work_per_row), 4, 256);
}

}  // namespace

namespace quant_internal {

bool UsesQuantizedActivations(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ8_0:
      return true;
    default:
      return false;
  }
}

}  // namespace quant_internal

absl::Status MatMul(const QuantMatrix& w, const float* x, int64_t ldx, int64_t n_tokens, float* y,
                    int64_t ldy, SimdLevel level) {
  if (absl::Status s = CheckMatrix(w); !s.ok()) return s;
  if (n_tokens < 0) return absl::InvalidArgumentError("negative n_tokens");
  if (n_tokens == 0 || w.rows == 0) return absl::OkStatus();
  if (x == nullptr || y == nullptr) return absl::InvalidArgumentError("null activations/output");
  if (ldx < w.cols || ldy < w.rows) {
    return absl::InvalidArgumentError(absl::StrCat("leading dimensions ldx=", ldx, " ldy=", ldy,
                                                   " too small for ", w.rows, "x", w.cols));
  }
  // A level above the CPU's would fault; treat it as a request for the best available.
  if (static_cast<int>(level) > static_cast<int>(DetectedSimdLevel())) level = DetectedSimdLevel();

  MatMulArgs args;
  args.type = w.type;
  args.w = static_cast<const uint8_t*>(w.data);
  args.row_bytes = GgmlRowBytes(w.type, w.cols);
  args.cols = w.cols;
  args.n_tokens = n_tokens;
  args.x = x;
  args.ldx = ldx;
  args.y = y;
  args.ldy = ldy;

  std::vector<int8_t> xq;
  std::vector<float> xd, xs;
  if (quant_internal::UsesQuantizedActivations(w.type)) {
    const int64_t nb = w.cols / kActBlock;
    xq.resize(static_cast<size_t>(n_tokens * w.cols));
    xd.resize(static_cast<size_t>(n_tokens * nb * kScaleRepeat));
    xs.resize(static_cast<size_t>(n_tokens * nb));
    auto quantize = [&](int64_t t) {
      quant_internal::QuantizeActivationRow(x + t * ldx, w.cols, xq.data() + t * w.cols,
                                            xd.data() + t * nb * kScaleRepeat, xs.data() + t * nb);
    };
    if (n_tokens == 1) {
      quantize(0);
    } else {
      tbb::parallel_for(int64_t{0}, n_tokens, quantize);
    }
    args.xq = xq.data();
    args.xd = xd.data();
    args.xs = xs.data();
  }

  const bool vnni = CpuHasAvx512Vnni();
  auto run = [&](int64_t r0, int64_t r1) {
    switch (level) {
      case SimdLevel::kAvx512:
        quant_internal::MatMulRowsAvx512(args, r0, r1, vnni);
        break;
      case SimdLevel::kAvx2:
        quant_internal::MatMulRowsAvx2(args, r0, r1);
        break;
      case SimdLevel::kScalar:
        quant_internal::MatMulRowsScalar(args, r0, r1);
        break;
    }
  };
  const int64_t grain = RowGrain(args.row_bytes, n_tokens);
  if (w.rows <= grain) {
    run(0, w.rows);
  } else {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, w.rows, grain),
                      [&](const tbb::blocked_range<int64_t>& r) { run(r.begin(), r.end()); });
  }
  return absl::OkStatus();
}

absl::Status GetRow(const QuantMatrix& w, int64_t row, float* dst) {
  if (absl::Status s = CheckMatrix(w); !s.ok()) return s;
  if (row < 0 || row >= w.rows) {
    return absl::InvalidArgumentError(absl::StrCat("row ", row, " out of range [0, ", w.rows, ")"));
  }
  if (dst == nullptr) return absl::InvalidArgumentError("null destination");
  const uint8_t* src = static_cast<const uint8_t*>(w.data) + row * GgmlRowBytes(w.type, w.cols);
  return DequantizeRow(w.type, src, dst, w.cols);
}

}  // namespace magicpig
