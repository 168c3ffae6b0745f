// Transformer hyper-parameters read from GGUF metadata, for the architectures magicpig runs.
//
// Supported: `llama` (SmolLM2, Llama 3.x; adjacent-pair "NORM" RoPE because llama.cpp's converter
// permutes Q/K rows) and `qwen2` (Q/K/V biases, half-offset "NEOX" RoPE). Anything else is
// UNIMPLEMENTED with the architecture named.
#ifndef MAGICPIG_GPU_NODE_MODEL_MODEL_CONFIG_H_
#define MAGICPIG_GPU_NODE_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "gpu_node/model/gguf_file.h"

namespace magicpig::model {

enum class RopeStyle {
  kNorm,  // rotate (x[2i], x[2i+1])
  kNeox,  // rotate (x[i], x[i + n_rot/2])
};

struct ModelConfig {
  std::string architecture;
  std::string name;
  int64_t n_layer = 0;
  int64_t n_embd = 0;
  int64_t n_ff = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;  // n_embd / n_head unless attention.key_length says otherwise
  int64_t n_rot = 0;     // rope.dimension_count (defaults to head_dim)
  int64_t n_vocab = 0;
  int64_t context_length = 0;
  double rope_freq_base = 10000.0;
  double rms_eps = 1e-5;
  RopeStyle rope_style = RopeStyle::kNorm;
  bool qkv_bias = false;

  int64_t q_dim() const { return n_head * head_dim; }
  int64_t kv_dim() const { return n_head_kv * head_dim; }
};

// Reads and checks the hyper-parameters (positive sizes, n_head divisible by n_head_kv, even n_rot
// <= head_dim). n_vocab comes from the tokenizer token list when `%s.vocab_size` is absent.
absl::StatusOr<ModelConfig> ReadModelConfig(const GgufFile& file);

}  // namespace magicpig::model

#endif  // MAGICPIG_GPU_NODE_MODEL_MODEL_CONFIG_H_
