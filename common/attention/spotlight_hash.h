// Spotlight learned hash codes (issue #39): the trained per-head MLP hashes of a ".spot" file and
// their forward pass, which turns keys and queries into binary codes compared by Hamming distance
// (kernels/hamming_kernel.h).
//
// File format and forward: eval/spotlight/spotfile.py is normative (its docstring). For each
// hashed layer the file holds a key MLP per kv head and a query MLP per query head; each maps a
// head_dim vector x to `bits` outputs
//
//   x' = in_scale * x;  h = x' + silu(W1 x' + b1);  z = W2 h + b2;  bit i = z_i > 0 (strict)
//
// packed into bits / 16 uint16 words per row, bit i in word i / 16 at position i % 16 (LSB
// first): codes are [n][words()], the layout SimHash codes already use.
//
// The forward is fp32 (kernels/spotlight_mlp_kernel.h: two register-blocked matrix products per
// block of 64 rows, in parallel over blocks with oneTBB) at a caller-chosen SIMD level. It agrees
// with spotfile.outputs64 (float64) on every bit except where z_i is within fp32 rounding of 0.
//
//   SpotlightShape model{.n_layer_model = 30, .n_head = 9, .n_head_kv = 3, .head_dim = 64,
//                        .model_name = "SmolLM2 135M Instruct"};
//   MAGICPIG_ASSIGN_OR_RETURN(SpotlightHashes h, SpotlightHashes::Load(path, &model));
//   std::vector<uint16_t> codes(n * h.words());
//   MAGICPIG_RETURN_IF_ERROR(h.KeyCodes(layer, kv_head, keys, n, codes.data()));
//
// Thread-safety: immutable after Parse/Load; every const method may be called concurrently.
#ifndef MAGICPIG_COMMON_ATTENTION_SPOTLIGHT_HASH_H_
#define MAGICPIG_COMMON_ATTENTION_SPOTLIGHT_HASH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/cpu_features.h"

namespace magicpig::attention {

// The model a .spot file must match (Parse/Load check it when given).
struct SpotlightShape {
  int64_t n_layer_model = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  std::string model_name;  // GGUF general.name; empty: the name is not checked
};

// Bit packing of outputs: codes[r * bits / 16 + i / 16] bit i % 16 = z[r * bits + i] > 0 (strict;
// NaN gives 0), for r < n. INVALID_ARGUMENT for bits not a multiple of 16 in [16, 256], n < 0, or
// null pointers with n > 0. The reference for what the forward packs.
absl::Status PackSpotlightCodes(const float* z, int64_t n, int bits, uint16_t* codes);

class SpotlightHashes {
 public:
  // The file's magic and version.
  static constexpr absl::string_view kMagic = "MPSPOT01";
  static constexpr uint32_t kVersion = 1;

  // Parses a whole .spot file. expected (nullable) is the model it must match.
  //  DATA_LOSS: bad magic, unsupported version, truncation (naming the part), trailing bytes,
  //    checksum mismatch.
  //  INVALID_ARGUMENT: bits not a multiple of 16 in [16, 256], head_dim not in [1, 1024], no
  //    layers, layers not strictly increasing or >= n_layer_model, n_head not a positive multiple
  //    of n_head_kv, a non-finite in_scale or weight; a shape (n_layer_model, n_head, n_head_kv,
  //    head_dim) or model name (unless either is empty) that differs from *expected.
  // Sizes are checked against the bytes present before anything is allocated.
  static absl::StatusOr<SpotlightHashes> Parse(absl::string_view bytes,
                                               const SpotlightShape* expected);
  // Reads and parses the file at path (errors are Parse's, prefixed with the path); NOT_FOUND
  // when it does not exist.
  static absl::StatusOr<SpotlightHashes> Load(const std::string& path,
                                              const SpotlightShape* expected);

  int bits() const { return bits_; }
  int words() const { return bits_ / 16; }
  int64_t head_dim() const { return head_dim_; }
  int64_t n_layer_model() const { return n_layer_model_; }
  int64_t n_head() const { return n_head_; }
  int64_t n_head_kv() const { return n_head_kv_; }
  // The hashed model layers, strictly increasing.
  const std::vector<int64_t>& layers() const { return layers_; }
  const std::string& model_name() const { return model_name_; }
  bool HasLayer(int64_t layer) const { return Slot(layer) >= 0; }
  // Heap bytes held for the weights.
  int64_t bytes() const;

  // codes [n][words()] for the rows x [n][head_dim()] through the key MLP of kv head kv_head of
  // `layer`. INVALID_ARGUMENT for a layer not in the file, a head out of range, n < 0, or null
  // pointers with n > 0; n = 0 writes nothing. A level above the CPU's is clamped to it.
  absl::Status KeyCodes(int64_t layer, int64_t kv_head, const float* x, int64_t n, uint16_t* codes,
                        SimdLevel level = ActiveSimdLevel()) const;
  // The same through the query MLP of query head `head`.
  absl::Status QueryCodes(int64_t layer, int64_t head, const float* x, int64_t n, uint16_t* codes,
                          SimdLevel level = ActiveSimdLevel()) const;
  // The outputs z [n][bits()] behind KeyCodes / QueryCodes (the codes are exactly
  // PackSpotlightCodes of these).
  absl::Status KeyOutputs(int64_t layer, int64_t kv_head, const float* x, int64_t n, float* z,
                          SimdLevel level = ActiveSimdLevel()) const;
  absl::Status QueryOutputs(int64_t layer, int64_t head, const float* x, int64_t n, float* z,
                            SimdLevel level = ActiveSimdLevel()) const;

 private:
  // Where one MLP's weights sit in weights_: w1t [d][dp], b1 [dp], w2t [d][bp], b2 [bp], with
  // dp, bp the padded widths of kernels/spotlight_mlp_kernel.h (transposed, zero-padded).
  struct Mlp {
    float in_scale = 1.0f;
    int64_t offset = 0;
  };

  SpotlightHashes() = default;

  // Index of layer in layers_, or -1.
  int64_t Slot(int64_t layer) const;
  // The forward of the key (is_query false) or query MLP; codes and z may each be null.
  // `what` names the public method in errors.
  absl::Status Forward(const char* what, bool is_query, int64_t layer, int64_t head, const float* x,
                       int64_t n, uint16_t* codes, float* z, SimdLevel level) const;

  int bits_ = 0;
  int64_t head_dim_ = 0;
  int64_t n_layer_model_ = 0;
  int64_t n_head_ = 0;
  int64_t n_head_kv_ = 0;
  std::string model_name_;
  std::vector<int64_t> layers_;
  std::vector<Mlp> mlps_;  // [slot][n_head_kv key MLPs, then n_head query MLPs]
  std::vector<float> weights_;
};

}  // namespace magicpig::attention

#endif  // MAGICPIG_COMMON_ATTENTION_SPOTLIGHT_HASH_H_
