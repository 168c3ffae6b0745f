// MatMul/GetRow: argument checks, activation quantisation and the one-per-call choice of the
// per-ISA kernel. Compiled at the x86-64 baseline; the SIMD code lives in matmul_<isa>.cc.
#include "common/quant/matmul.h"

#include <emmintrin.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/quant/dequantize.h"
#include "common/quant/matmul_kernels.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"
#include "tbb/partitioner.h"
#include "tbb/task_arena.h"

namespace magicpig {
namespace {

using quant_internal::kActBlock;
using quant_internal::kScaleRepeat;
using quant_internal::MatMulArgs;

}  // namespace

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
  if (w.layout == WeightLayout::kRows16 && !CanInterleave(w.type, w.rows, w.cols)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a ", std::string(info->name), " matrix of ", w.rows, "x", w.cols,
        " cannot be in the 16-row interleaved layout (needs Q4_K, Q6_K, Q4_1 or Q8_0, rows a "
        "multiple of 16)"));
  }
  return absl::OkStatus();
}

namespace quant_internal {
namespace {

// q[0..8) = round(clamp(x[i] * id, -127, 127)); returns their sum in every lane of an SSE2 vector
// (x86-64 baseline): _mm_cvtps_epi32 rounds with MXCSR, i.e. half to even like std::nearbyint in
// the default mode, without nearbyint's per-value library call. Clamping before rounding is
// equivalent to clamping after, since +-127 are integers.
__m128i Quantize8(const float* x, __m128 id, int8_t* q) {
  const __m128 lim = _mm_set1_ps(127.0f), neg_lim = _mm_set1_ps(-127.0f);
  const __m128i a =
      _mm_cvtps_epi32(_mm_min_ps(_mm_max_ps(_mm_mul_ps(_mm_loadu_ps(x), id), neg_lim), lim));
  const __m128i c =
      _mm_cvtps_epi32(_mm_min_ps(_mm_max_ps(_mm_mul_ps(_mm_loadu_ps(x + 4), id), neg_lim), lim));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(q),
                   _mm_packs_epi16(_mm_packs_epi32(a, c), _mm_setzero_si128()));
  return _mm_add_epi32(a, c);
}

int HorizontalSum(__m128i v) {
  v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0x4E));
  v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0xB1));
  return _mm_cvtsi128_si32(v);
}

// max |x[i]| over n values (a multiple of 4).
float AbsMax(const float* x, int64_t n) {
  const __m128 abs_mask = _mm_castsi128_ps(_mm_set1_epi32(0x7FFFFFFF));
  __m128 m = _mm_setzero_ps();
  for (int64_t i = 0; i < n; i += 4) m = _mm_max_ps(m, _mm_and_ps(_mm_loadu_ps(x + i), abs_mask));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

}  // namespace

// Rounding here is the only approximation the integer kernels make; every level uses this one
// function, so all levels see identical integer inputs.
void QuantizeActivationRow(const float* x, int64_t cols, int8_t* q, float* d_rep, float* s) {
  const int64_t nb = cols / kActBlock;
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * kActBlock;
    const float d = AbsMax(xb, kActBlock) / 127.0f;
    const __m128 id = _mm_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
    __m128i sum = _mm_setzero_si128();
    for (int64_t i = 0; i < kActBlock; i += 8)
      sum = _mm_add_epi32(sum, Quantize8(xb + i, id, q + b * kActBlock + i));
    for (int64_t i = 0; i < kScaleRepeat; ++i) d_rep[b * kScaleRepeat + i] = d;
    s[b] = d * static_cast<float>(HorizontalSum(sum));
  }
}

KActOrder KActOrderFor(GgmlType type, bool avx512) {
  return avx512 && (type == GgmlType::kQ4_K || type == GgmlType::kQ5_K) ? KActOrder::kPairedNibbles
                                                                        : KActOrder::kNatural;
}

bool IsKQuant(GgmlType type) {
  return type == GgmlType::kQ4_K || type == GgmlType::kQ5_K || type == GgmlType::kQ6_K;
}

// The same rounding as QuantizeActivationRow, over 256 values per scale.
void QuantizeActivationRowK(const float* x, int64_t cols, KActOrder order, int8_t* q, float* d,
                            int16_t* bsums) {
  const int64_t nsb = cols / kSuperBlock;
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const float* xs = x + sb * kSuperBlock;
    const float ds = AbsMax(xs, kSuperBlock) / 127.0f;
    const __m128 id = _mm_set1_ps(ds > 0.0f ? 1.0f / ds : 0.0f);
    d[sb] = ds;
    for (int p = 0; p < 8; ++p) {
      const int sub = order == KActOrder::kPairedNibbles ? kPairedNibbleOrder[p] : p;
      const float* xb = xs + 32 * sub;
      int8_t* qb = q + sb * kSuperBlock + 32 * p;
      for (int i = 0; i < 32; i += 16) {
        const __m128i sum =
            _mm_add_epi32(Quantize8(xb + i, id, qb + i), Quantize8(xb + i + 8, id, qb + i + 8));
        bsums[sb * kBsumsPerSuperBlock + 2 * p + i / 16] = static_cast<int16_t>(HorizontalSum(sum));
      }
    }
  }
}

}  // namespace quant_internal

namespace {

// Calls quantize(t) for every token: inline for the few tokens of a decode step (a parallel region
// would cost more than the work), in parallel for a prefill chunk.
template <typename Fn>
void ForEachToken(int64_t n_tokens, Fn quantize) {
  if (n_tokens <= 16) {
    for (int64_t t = 0; t < n_tokens; ++t) quantize(t);
  } else {
    tbb::parallel_for(int64_t{0}, n_tokens, quantize);
  }
}

// Rows per task: enough that a task reads a few tens of KiB of weights (TBB overhead is a few
// microseconds per task), few enough that every thread gets several tasks (decode matrices of
// only 192 rows must still keep both cores busy). Prefill tasks are capped at 64 rows so their
// weights stay in L2 while the kernel walks blocks of tokens.
int64_t RowGrain(int64_t rows, int64_t row_bytes, int64_t n_tokens) {
  constexpr int64_t kTargetWork = 32 * 1024;
  const int64_t work_per_row = row_bytes * std::max<int64_t>(1, n_tokens);
  const int64_t by_work =
      std::clamp<int64_t>(kTargetWork / std::max<int64_t>(1, work_per_row), 4, 256);
  const int64_t threads = std::max(1, tbb::this_task_arena::max_concurrency());
  const int64_t by_balance = std::max<int64_t>(4, rows / (4 * threads));
  return n_tokens > 1 ? std::clamp<int64_t>(by_balance, 4, 64) : std::min(by_work, by_balance);
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
  level = ClampToDetected(level);
  const bool rows16 = w.layout == WeightLayout::kRows16;
  if (rows16 && level != SimdLevel::kAvx512) {
    return absl::InvalidArgumentError(
        absl::StrCat("the 16-row interleaved layout needs the AVX-512 kernels; SIMD level is ",
                     std::string(SimdLevelName(level))));
  }

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
    const bool avx512 = level == SimdLevel::kAvx512;
    // Per-token strides of the layout the chosen kernels read (see matmul_kernels.h).
    const int64_t q_stride = avx512 ? quant_internal::Avx512QStride(w.cols) : w.cols;
    const int64_t d_stride = avx512 ? quant_internal::Avx512DStride(w.cols) : nb * kScaleRepeat;
    const int64_t s_stride = avx512 ? quant_internal::Avx512SStride(w.cols) : nb;
    xq.resize(static_cast<size_t>(n_tokens * q_stride));
    xd.resize(static_cast<size_t>(n_tokens * d_stride));
    xs.resize(static_cast<size_t>(n_tokens * s_stride));
    ForEachToken(n_tokens, [&](int64_t t) {
      (avx512 ? quant_internal::QuantizeActivationRowAvx512
              : quant_internal::QuantizeActivationRow)(
          x + t * ldx, w.cols, xq.data() + t * q_stride, xd.data() + t * d_stride,
          xs.data() + t * s_stride);
    });
    args.xq = xq.data();
    args.xd = xd.data();
    args.xs = xs.data();
  }
  std::vector<int8_t> kq;
  std::vector<float> kd;
  std::vector<int16_t> kbs;
  if (quant_internal::IsKQuant(w.type)) {
    const int64_t nsb = w.cols / quant_internal::kSuperBlock;
    const quant_internal::KActOrder order =
        rows16 ? quant_internal::KActOrder::kNatural
               : quant_internal::KActOrderFor(w.type, level == SimdLevel::kAvx512);
    kq.resize(static_cast<size_t>(n_tokens * w.cols));
    kd.resize(static_cast<size_t>(n_tokens * nsb));
    kbs.resize(static_cast<size_t>(n_tokens * nsb * quant_internal::kBsumsPerSuperBlock));
    ForEachToken(n_tokens, [&](int64_t t) {
      quant_internal::QuantizeActivationRowK(
          x + t * ldx, w.cols, order, kq.data() + t * w.cols, kd.data() + t * nsb,
          kbs.data() + t * nsb * quant_internal::kBsumsPerSuperBlock);
    });
    args.kq = kq.data();
    args.kd = kd.data();
    args.kbs = kbs.data();
  }

  const bool vnni = CpuHasAvx512Vnni();
  auto run = [&](int64_t r0, int64_t r1) {
    switch (level) {
      case SimdLevel::kAvx512:
        if (rows16 && (w.type == GgmlType::kQ4_1 || w.type == GgmlType::kQ8_0)) {
          quant_internal::Block32Rows16Avx512(args, r0, r1, vnni);
        } else if (rows16) {
          quant_internal::KQuantRows16Avx512(args, r0, r1, vnni);
        } else {
          quant_internal::MatMulRowsAvx512(args, r0, r1, vnni);
        }
        break;
      case SimdLevel::kAvx2:
        quant_internal::MatMulRowsAvx2(args, r0, r1);
        break;
      case SimdLevel::kScalar:
        quant_internal::MatMulRowsScalar(args, r0, r1);
        break;
    }
  };
  // Interleaved matrices are split in whole groups of 16 rows.
  const int64_t unit = rows16 ? kInterleaveRows : 1;
  const int64_t units = w.rows / unit;
  const int64_t grain = std::max<int64_t>(1, RowGrain(w.rows, args.row_bytes, n_tokens) / unit);
  if (units <= grain) {
    run(0, w.rows);
  } else {
    // simple_partitioner: chunks of grain/2..grain units exactly as chosen above (the auto
    // partitioner would merge them into one chunk per thread and lose the balancing).
    tbb::parallel_for(
        tbb::blocked_range<int64_t>(0, units, grain),
        [&](const tbb::blocked_range<int64_t>& r) { run(r.begin() * unit, r.end() * unit); },
        tbb::simple_partitioner());
  }
  return absl::OkStatus();
}

absl::Status GetRow(const QuantMatrix& w, int64_t row, float* dst) {
  if (absl::Status s = CheckMatrix(w); !s.ok()) return s;
  if (row < 0 || row >= w.rows) {
    return absl::InvalidArgumentError(absl::StrCat("row ", row, " out of range [0, ", w.rows, ")"));
  }
  if (dst == nullptr) return absl::InvalidArgumentError("null destination");
  const int64_t row_bytes = GgmlRowBytes(w.type, w.cols);
  const uint8_t* src = static_cast<const uint8_t*>(w.data) + row * row_bytes;
  std::vector<uint8_t> file_row;
  if (w.layout == WeightLayout::kRows16) {
    file_row.resize(static_cast<size_t>(row_bytes));
    DeinterleaveRow(w.type, static_cast<const uint8_t*>(w.data), w.cols, row, file_row.data());
    src = file_row.data();
  }
  return DequantizeRow(w.type, src, dst, w.cols);
}

}  // namespace magicpig
