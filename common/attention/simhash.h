// SimHash (sign random projection) codes for MagicPIG, docs/architecture.md §4.1.
//
// Projection: W is d x (K*L) with i.i.d. N(0, 1) entries, stored row-major as float32:
// W[i][j] = projection()[i * K*L + j]. It is drawn from std::mt19937_64(seed) with
// std::normal_distribution<double>(0, 1), filling W in that row-major order (row 0 first), each
// draw rounded to float and then to bfloat16 (round to nearest even), so that every entry is a
// bf16 value (below). The same seed gives the same W with the same standard library (the
// normal_distribution algorithm is library-specific: record the seed *and* the build).
//
// Codes: table l (0-based) uses columns l*K ... l*K + K - 1. Bit b (0 ... K-1) of table l's code is
// 1 iff x . W[:, l*K + b] > 0 (strict: a projection of exactly 0, e.g. from x = 0, gives bit 0),
// and bit b has weight 2^b, so a code is an integer in [0, 2^K). This is the reference's bit order
// and sign convention.
//
// Queries are hashed as they are (Codes); keys as the bf16 values a shard stores (KeyCodes: each
// element rounded to bf16 first). With W in bf16 too, a key's products are exact in fp32, which
// lets CPUs with AVX512_BF16 hash keys with vdpbf16ps at twice the fp32 rate; the sampling
// probability is then u(cos(q, k)) of the stored key k, the one the estimators correct with.
//
// Two implementations of each: the product path (an fp32 SIMD GEMM, kernels/simhash_kernel.h, at
// the active SIMD level, or the bf16 one for keys where the CPU has AVX512_BF16; in parallel over
// blocks of vectors with oneTBB) and the references (float64 accumulation over i = 0 ... d-1 in
// order). They agree on every bit except where a projection is within fp32 rounding of 0
// (docs/architecture.md §16).
//
// What is hashed (the caller's job): keys centred with the mean key c, queries raw (normalising
// does not change signs).
//
// Thread-safety: immutable after Create; Codes may be called concurrently.
#ifndef MAGICPIG_COMMON_ATTENTION_SIMHASH_H_
#define MAGICPIG_COMMON_ATTENTION_SIMHASH_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/attention/estimator_params.h"
#include "common/cpu_features.h"

namespace magicpig::attention {

class SimHash {
 public:
  // INVALID_ARGUMENT (naming the field) unless d >= 1, 1 <= k <= 16, 1 <= l <= 512.
  static absl::StatusOr<SimHash> Create(int64_t d, int k, int l, uint64_t seed);

  // codes[v * L + l] = code of vector v (x + v * d) in table l, for v < n.
  // INVALID_ARGUMENT if d differs from dim() or n < 0; n = 0 writes nothing.
  absl::Status Codes(const float* x, int64_t n, int64_t d, uint16_t* codes) const;
  absl::Status CodesAtLevel(const float* x, int64_t n, int64_t d, uint16_t* codes,
                            SimdLevel level) const;
  absl::Status CodesReference(const float* x, int64_t n, int64_t d, uint16_t* codes) const;

  // Codes of x rounded to bf16 element by element (what a bf16 shard stores of a centred key):
  // the same contract as Codes. At kAvx512 on a CPU with AVX512_BF16 the bf16 kernel runs;
  // otherwise, or with bf16_kernel = false (what such CPUs run; tests and benchmarks cover it
  // everywhere this way), the rounded vectors go through the fp32 kernel of `level`.
  absl::Status KeyCodes(const float* x, int64_t n, int64_t d, uint16_t* codes) const;
  absl::Status KeyCodesAtLevel(const float* x, int64_t n, int64_t d, uint16_t* codes,
                               SimdLevel level, bool bf16_kernel = true) const;
  absl::Status KeyCodesReference(const float* x, int64_t n, int64_t d, uint16_t* codes) const;

  int64_t dim() const { return d_; }
  int k() const { return k_; }
  int l() const { return l_; }
  uint64_t seed() const { return seed_; }
  // Row-major d x (K*L).
  const std::vector<float>& projection() const { return w_; }

 private:
  SimHash(int64_t d, int k, int l, uint64_t seed, std::vector<float> w, std::vector<float> w_padded,
          std::vector<uint16_t> w_pairs, int64_t cols_padded)
      : d_(d),
        k_(k),
        l_(l),
        seed_(seed),
        w_(std::move(w)),
        w_padded_(std::move(w_padded)),
        w_pairs_(std::move(w_pairs)),
        cols_padded_(cols_padded) {}

  // How the vectors reach the projection: as they are, rounded to bf16 through the fp32 kernel,
  // or as bf16 through the AVX512_BF16 kernel.
  enum class Input { kFloat, kRoundedFloat, kBf16 };
  absl::Status Hash(const float* x, int64_t n, int64_t d, uint16_t* codes, SimdLevel level,
                    Input input) const;

  // Cuts n vectors' sign bits (vector v's at bits + v * stride, column j = bit j % 16 of word
  // j / 16) into their L codes of K bits, codes [n][L].
  void CutCodes(const uint16_t* bits, int64_t stride, int64_t n, uint16_t* codes) const;

  int64_t d_;
  int k_;
  int l_;
  uint64_t seed_;
  std::vector<float> w_;
  std::vector<float> w_padded_;  // [d][cols_padded_]: W with zero columns up to the kernel block
  // W_padded as bf16 pairs of rows, [d2 / 2][cols_padded_][2] (d2 = d rounded up to even; an odd
  // d's last pair is padded with 0): the bf16 kernel's layout, built only where the CPU has
  // AVX512_BF16 (the only place that kernel runs; empty elsewhere).
  std::vector<uint16_t> w_pairs_;
  int64_t cols_padded_;
};

}  // namespace magicpig::attention

#endif  // MAGICPIG_COMMON_ATTENTION_SIMHASH_H_
