// Tiny synthetic llama/qwen2 GGUF models for unit tests: the real SmolLM2 tensor layout and
// metadata keys at toy sizes, seeded random weights in valid quantised blocks, and a small GPT-2
// byte-level BPE vocabulary (256 byte tokens, ChatML specials, a few merges).
//
//   SyntheticModelOptions o;
//   o.weight_type = GgmlType::kQ4_1;
//   MAGICPIG_ASSIGN_OR_RETURN(std::string path, WriteSyntheticModel(o, TempPath("m.gguf")));
#ifndef MAGICPIG_TESTS_TESTING_SYNTHETIC_MODEL_H_
#define MAGICPIG_TESTS_TESTING_SYNTHETIC_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/quant/ggml_type.h"

namespace magicpig::testing {

struct SyntheticModelOptions {
  std::string architecture = "llama";  // "llama" or "qwen2" (others are written as given)
  std::string name = "synthetic";
  int64_t n_layer = 2;
  int64_t n_embd = 64;
  int64_t n_ff = 128;
  int64_t n_head = 4;
  int64_t n_head_kv = 2;
  int64_t n_vocab = 300;  // >= kSyntheticBaseVocab; extra merged tokens pad it
  int64_t context_length = 256;
  float rope_freq_base = 10000.0f;
  float rms_eps = 1e-5f;
  // Type of the 2-D weights: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K.
  GgmlType weight_type = GgmlType::kF32;
  GgmlType embd_type = GgmlType::kF32;  // type of token_embd.weight
  bool tied_embeddings = true;          // false adds output.weight (of weight_type)
  uint32_t seed = 1;
  // Keys to leave out (to test missing-key reporting).
  std::vector<std::string> omit_keys;
  // Tensors to leave out, and one matrix written with its two dims swapped (to test tensor checks).
  std::vector<std::string> omit_tensors;
  std::string transposed_tensor;
};

// 3 specials + 256 byte tokens + the built-in merges.
inline constexpr int64_t kSyntheticBaseVocab = 3 + 256 + 8;

// Token ids of the specials (as in SmolLM2).
inline constexpr int64_t kSyntheticEndOfText = 0;
inline constexpr int64_t kSyntheticImStart = 1;  // also BOS
inline constexpr int64_t kSyntheticImEnd = 2;    // also EOS and PAD

// GPT-2 byte-to-unicode mapping: the vocabulary string (UTF-8) of byte b.
std::string Gpt2ByteToken(uint8_t b);

// Random but valid weights: `n` values of `type` (n a multiple of the block size), finite small
// fp16 scales.
absl::StatusOr<std::string> RandomTensorBytes(GgmlType type, int64_t n, uint32_t seed);

// The whole GGUF image; INVALID_ARGUMENT on inconsistent options.
absl::StatusOr<std::string> BuildSyntheticModel(const SyntheticModelOptions& options);
// Writes it to `path` and returns the path.
absl::StatusOr<std::string> WriteSyntheticModel(const SyntheticModelOptions& options,
                                                const std::string& path);

}  // namespace magicpig::testing

#endif  // MAGICPIG_TESTS_TESTING_SYNTHETIC_MODEL_H_
