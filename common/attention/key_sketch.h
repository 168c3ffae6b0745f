// A low-rank int8 sketch of one (layer, kv head)'s keys, the code behind the `sketch` estimator
// (the idea of Loki, Singhania et al., 2024: keys of real models sit near a low-dimensional
// subspace, so q . k is ranked almost as well through `dims` principal directions as through all
// d coordinates; docs/spotlight.md measures how often it keeps the dominant key).
//
// Fit: the `dims` leading principal directions U ([dims][d], orthonormal rows, by decreasing
// variance) of the centred keys given, found by subspace iteration on their second-moment matrix
// (d x d, float64) and a Jacobi rotation of the Rayleigh quotient (dims x dims); then per direction
// j the scale s_j = max_i |U_j . k_i| / 127 over those keys (1 where that is 0). The basis is fixed
// at fit: keys coded later (a sequence's window overflow) reuse it; their coordinates clamp at
// +-127.
//
// Codes, both for keys and queries, are `dims` int8 coordinates packed two per uint16 word
// (coordinate 2w in the low byte of word w, 2w + 1 in the high byte): words() = dims / 2, so the
// codes travel and are stored like learned codes (KvIndex::kCodes shards, 16-bit words).
// - Key k (centred): c_j = round(U_j . k / s_j), clamped to [-127, 127].
// - Query q (raw): z_j = (U_j . q) s_j, c_j = round(127 z_j / max_j |z_j|) (all 0 for z = 0).
// Then sum_j c_q,j c_k,j is proportional to q . U^T U k up to rounding, with one positive factor
// per query: ranking a head's keys by it (SketchScores, kernels/sketch_kernel.h) approximates
// ranking them by q . k.
//
// Why our own eigen-solver and not LAPACK: one symmetric d x d problem (d <= 256) per (layer, kv
// head) and sequence, where subspace iteration with a small Jacobi step is ~80 lines; LAPACK would
// be a new dependency for one call.
//
// Thread-safety: immutable after Fit; every method is const and safe to call concurrently.
#ifndef MAGICPIG_COMMON_ATTENTION_KEY_SKETCH_H_
#define MAGICPIG_COMMON_ATTENTION_KEY_SKETCH_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace magicpig::attention {

class KeySketch {
 public:
  // Most coordinates a sketch keeps: 16 words (kHammingMaxWords), the most a codes shard checks.
  static constexpr int kMaxDims = 32;

  // keys: [n][d] centred keys (n >= 0; with n = 0 the basis is the first `dims` coordinate axes).
  // INVALID_ARGUMENT for d < 1 or d > 1024, dims odd, dims < 2, dims > min(d, kMaxDims), a null
  // keys with n > 0, or a non-finite key.
  static absl::StatusOr<KeySketch> Fit(const float* keys, int64_t n, int64_t d, int dims);

  int dims() const { return dims_; }
  int words() const { return dims_ / 2; }
  int64_t dim() const { return d_; }
  // U, [dims][d], rows orthonormal, by decreasing variance of the fitted keys along them.
  const std::vector<float>& basis() const { return basis_; }
  // s_j, [dims].
  const std::vector<float>& scales() const { return scales_; }

  // codes [n][words()] for n centred keys [n][d].
  void KeyCodes(const float* keys, int64_t n, uint16_t* codes) const;
  // code [words()] for one raw query [d].
  void QueryCode(const float* q, uint16_t* code) const;

 private:
  KeySketch(int64_t d, int dims, std::vector<float> basis, std::vector<float> scales)
      : d_(d), dims_(dims), basis_(std::move(basis)), scales_(std::move(scales)) {
    basis_t_.resize(basis_.size());
    for (int j = 0; j < dims_; ++j)
      for (int64_t a = 0; a < d_; ++a) basis_t_[a * dims_ + j] = basis_[j * d_ + a];
  }
  // y[j] = U_j . k in float32 (sums in order of the coordinates of k).
  void Project(const float* k, float* y) const;

  int64_t d_;
  int dims_;
  std::vector<float> basis_;    // [dims][d]
  std::vector<float> basis_t_;  // [d][dims]: the basis transposed, for Project
  std::vector<float> scales_;   // [dims]
};

// The int8 coordinate j of a packed sketch code (the layout above).
inline int SketchCoordinate(const uint16_t* code, int j) {
  const uint16_t w = code[j / 2];
  return static_cast<int8_t>(static_cast<uint8_t>(j % 2 == 0 ? (w & 0xFF) : (w >> 8)));
}

}  // namespace magicpig::attention

#endif  // MAGICPIG_COMMON_ATTENTION_KEY_SKETCH_H_
