#include "common/attention/simhash.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/attention/kernels/simhash_kernel.h"
#include "common/half.h"
#include "common/status_macros.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"
#include "tbb/task_arena.h"

namespace magicpig::attention {

static_assert(std::endian::native == std::endian::little,
              "SimHash::Codes reads the sign bits as little-endian words");

absl::StatusOr<SimHash> SimHash::Create(int64_t d, int k, int l, uint64_t seed) {
  if (d < 1) return absl::InvalidArgumentError(absl::StrCat("SimHash: d must be >= 1, got ", d));
  if (absl::Status s = kLshK.Check(k, "SimHash: K"); !s.ok()) return s;
  // Any table count up to the parameter's maximum: one table is a valid structure (the accuracy
  // evaluator hashes with L = 1 where no estimator samples). The sampling rule's lower bound of 2
  // is the estimator parameter's (kLshL), checked where an estimator is configured.
  if (l < 1 || l > kLshL.max) {
    return absl::InvalidArgumentError(
        absl::StrCat("SimHash: L must be in [1, ", kLshL.max, "], got ", l));
  }
  const int64_t cols = static_cast<int64_t>(k) * l;
  std::vector<float> w(static_cast<size_t>(d * cols));
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (float& v : w) v = Bf16ToFloat(FloatToBf16(static_cast<float>(normal(rng))));
  const int64_t block = internal::kProjectColBlock;
  const int64_t padded = (cols + block - 1) / block * block;
  std::vector<float> wp(static_cast<size_t>(d * padded), 0.0f);
  for (int64_t i = 0; i < d; ++i) {
    std::copy(w.begin() + i * cols, w.begin() + (i + 1) * cols, wp.begin() + i * padded);
  }
  // The bf16 kernel's layout, only where that kernel can run.
  std::vector<uint16_t> pairs;
  if (CpuHasAvx512Bf16()) {
    const int64_t d2 = (d + 1) / 2 * 2;
    pairs.assign(static_cast<size_t>(d2 * padded), 0);
    for (int64_t i = 0; i < d; ++i) {
      for (int64_t j = 0; j < padded; ++j) {
        pairs[static_cast<size_t>(((i / 2) * padded + j) * 2 + i % 2)] =
            FloatToBf16(wp[i * padded + j]);
      }
    }
  }
  return SimHash(d, k, l, seed, std::move(w), std::move(wp), std::move(pairs), padded);
}

namespace {

// out[i] = in[i] rounded to bf16 (nearest even), as a float, for i < n.
void RoundToBf16(const float* in, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = Bf16ToFloat(FloatToBf16(in[i]));
}

absl::Status CheckCodesArgs(int64_t d_expected, int64_t d, int64_t n) {
  if (d != d_expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SimHash::Codes: d must equal the projection's d = ", d_expected, ", got ", d));
  }
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("SimHash::Codes: n < 0: ", n));
  return absl::OkStatus();
}

}  // namespace

void SimHash::CutCodes(const uint16_t* bits, int64_t stride, int64_t n, uint16_t* codes) const {
  const uint32_t code_mask = (uint32_t{1} << k_) - 1;
  for (int64_t v = 0; v < n; ++v) {
    // Column j is bit j % 8 of byte j / 8 (little-endian words), so table t's K bits start at bit
    // t*K: one unaligned 32-bit read covers them (K <= 16, plus up to 7 bits of shift).
    const auto* bytes = reinterpret_cast<const unsigned char*>(bits + v * stride);
    uint16_t* out = codes + v * l_;
    for (int t = 0; t < l_; ++t) {
      const int64_t bit = static_cast<int64_t>(t) * k_;
      uint32_t word;
      std::memcpy(&word, bytes + bit / 8, sizeof(word));
      out[t] = static_cast<uint16_t>((word >> (bit % 8)) & code_mask);
    }
  }
}

absl::Status SimHash::Codes(const float* x, int64_t n, int64_t d, uint16_t* codes) const {
  return CodesAtLevel(x, n, d, codes, ActiveSimdLevel());
}

absl::Status SimHash::CodesAtLevel(const float* x, int64_t n, int64_t d, uint16_t* codes,
                                   SimdLevel level) const {
  return Hash(x, n, d, codes, level, Input::kFloat);
}

absl::Status SimHash::KeyCodes(const float* x, int64_t n, int64_t d, uint16_t* codes) const {
  return KeyCodesAtLevel(x, n, d, codes, ActiveSimdLevel());
}

absl::Status SimHash::KeyCodesAtLevel(const float* x, int64_t n, int64_t d, uint16_t* codes,
                                      SimdLevel level, bool bf16_kernel) const {
  const bool bf16 = bf16_kernel && level == SimdLevel::kAvx512 && CpuHasAvx512Bf16();
  return Hash(x, n, d, codes, level, bf16 ? Input::kBf16 : Input::kRoundedFloat);
}

absl::Status SimHash::Hash(const float* x, int64_t n, int64_t d, uint16_t* codes, SimdLevel level,
                           Input input) const {
  MAGICPIG_RETURN_IF_ERROR(CheckCodesArgs(d_, d, n));
  void (*project)(const internal::ProjectArgs&) =
      level == SimdLevel::kAvx512 ? internal::ProjectAvx512
      : level == SimdLevel::kAvx2 ? internal::ProjectAvx2
                                  : internal::ProjectScalar;
  // Blocks of vectors, each projected to sign bits in its own buffer and cut into codes.
  constexpr int64_t kVectors = 64;
  const int64_t n_blocks = (n + kVectors - 1) / kVectors;
  // Two spare words per vector: the 32-bit read of the last code may run past cols_padded_ bits.
  const int64_t stride = cols_padded_ / 16 + 2;
  const int64_t d2 = (d_ + 1) / 2 * 2;
  // The kernel's input for vectors [v0, v0 + nv): x itself (Input::kFloat), or the vectors
  // rounded to bf16 in `staged` (as floats for the fp32 kernel, as bf16 bits, d2 per vector, for
  // the bf16 kernel).
  struct Staged {
    std::vector<float> f;
    std::vector<uint16_t> b;
  };
  auto stage = [&](int64_t v0, int64_t nv, Staged& staged) -> const void* {
    const float* xv = x + v0 * d_;
    if (input == Input::kFloat) return xv;
    if (input == Input::kRoundedFloat) {
      staged.f.resize(static_cast<size_t>(nv * d_));
      RoundToBf16(xv, nv * d_, staged.f.data());
      return staged.f.data();
    }
    staged.b.assign(static_cast<size_t>(nv * d2), 0);
    for (int64_t v = 0; v < nv; ++v) {
      for (int64_t i = 0; i < d_; ++i) staged.b[v * d2 + i] = FloatToBf16(xv[v * d_ + i]);
    }
    return staged.b.data();
  };
  // nv staged vectors' columns [col_begin, col_end) (0, 0: all), their sign bits into `bits`.
  auto project_block = [&](const void* in, int64_t nv, int64_t col_begin, int64_t col_end,
                           uint16_t* bits) {
    // The fields both kernels' arguments share.
    auto common = [&](auto& a) {
      a.n = nv;
      a.cols = cols_padded_;
      a.col_begin = col_begin;
      a.col_end = col_end;
      a.bits = bits;
      a.bits_stride = stride;
    };
    if (input == Input::kBf16) {
      internal::ProjectBf16Args a;
      common(a);
      a.x = static_cast<const uint16_t*>(in);
      a.d2 = d2;
      a.w = w_pairs_.data();
      internal::ProjectBf16Avx512(a);
      return;
    }
    internal::ProjectArgs a;
    common(a);
    a.x = static_cast<const float*>(in);
    a.d = d_;
    a.w = w_padded_.data();
    project(a);
  };
  auto run_blocks = [&](int64_t b0, int64_t b1) {
    std::vector<uint16_t> bits(static_cast<size_t>(std::min(kVectors, n - b0 * kVectors) * stride),
                               0);
    Staged staged;
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t v0 = b * kVectors;
      const int64_t nv = std::min(kVectors, n - v0);
      project_block(stage(v0, nv, staged), nv, 0, 0, bits.data());
      CutCodes(bits.data(), stride, nv, codes + v0 * l_);
    }
  };
  // One block of a few vectors (a decode step's query heads) would keep one thread busy for a
  // K x L-column product (~30 us for SmolLM2's 9 heads at (10, 150)) while the others wait:
  // split its columns over the arena's threads instead, then cut the codes.
  const int64_t threads = tbb::this_task_arena::max_concurrency();
  const int64_t col_blocks = cols_padded_ / internal::kProjectColBlock;
  constexpr int64_t kMinColBlocksPerThread = 8;  // 256 columns: below that the split costs more
  if (n_blocks == 1 && threads > 1 && col_blocks >= 2 * kMinColBlocksPerThread) {
    const int64_t parts = std::min(threads, col_blocks / kMinColBlocksPerThread);
    std::vector<uint16_t> bits(static_cast<size_t>(n * stride), 0);
    Staged staged;
    const void* in = stage(0, n, staged);  // once, for every part
    tbb::parallel_for(int64_t{0}, parts, [&](int64_t part) {
      project_block(in, n, col_blocks * part / parts * internal::kProjectColBlock,
                    col_blocks * (part + 1) / parts * internal::kProjectColBlock, bits.data());
    });
    CutCodes(bits.data(), stride, n, codes);
    return absl::OkStatus();
  }
  if (n_blocks <= 1) {
    run_blocks(0, n_blocks);
  } else {
    tbb::parallel_for(
        tbb::blocked_range<int64_t>(0, n_blocks),
        [&](const tbb::blocked_range<int64_t>& r) { run_blocks(r.begin(), r.end()); });
  }
  return absl::OkStatus();
}

absl::Status SimHash::CodesReference(const float* x, int64_t n, int64_t d, uint16_t* codes) const {
  MAGICPIG_RETURN_IF_ERROR(CheckCodesArgs(d_, d, n));
  const int64_t cols = static_cast<int64_t>(k_) * l_;
  std::vector<double> acc(static_cast<size_t>(cols));
  for (int64_t v = 0; v < n; ++v) {
    const float* xv = x + v * d_;
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t i = 0; i < d_; ++i) {
      const double xi = xv[i];
      const float* row = w_.data() + i * cols;
      for (int64_t j = 0; j < cols; ++j) acc[j] += xi * static_cast<double>(row[j]);
    }
    uint16_t* out = codes + v * l_;
    for (int t = 0; t < l_; ++t) {
      uint32_t code = 0;
      const double* a = acc.data() + static_cast<int64_t>(t) * k_;
      for (int b = 0; b < k_; ++b) code |= static_cast<uint32_t>(a[b] > 0.0) << b;
      out[t] = static_cast<uint16_t>(code);
    }
  }
  return absl::OkStatus();
}

absl::Status SimHash::KeyCodesReference(const float* x, int64_t n, int64_t d,
                                        uint16_t* codes) const {
  MAGICPIG_RETURN_IF_ERROR(CheckCodesArgs(d_, d, n));
  std::vector<float> rounded(static_cast<size_t>(n * d_));
  RoundToBf16(x, n * d_, rounded.data());
  return CodesReference(rounded.data(), n, d, codes);
}

}  // namespace magicpig::attention
