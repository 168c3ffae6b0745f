// The transformer's weights as views into a memory-mapped GGUF file.
//
// Matrices stay in their file format (QuantMatrix views, no fp32 copy); norm weights and biases are
// small and are held as float32 (converted at load when stored in another type). Every tensor the
// architecture needs is checked for presence, shape and type at load: a missing or misshapen tensor
// is INVALID_ARGUMENT naming it.
//
// Thread-safety: immutable after Load.
#ifndef MAGICPIG_GPU_NODE_MODEL_MODEL_WEIGHTS_H_
#define MAGICPIG_GPU_NODE_MODEL_MODEL_WEIGHTS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/quant/matmul.h"
#include "gpu_node/model/gguf_file.h"
#include "gpu_node/model/model_config.h"

namespace magicpig::model {

struct LayerWeights {
  std::vector<float> attn_norm;   // [n_embd]
  QuantMatrix wq;                 // [q_dim rows][n_embd cols]
  QuantMatrix wk;                 // [kv_dim][n_embd]
  QuantMatrix wv;                 // [kv_dim][n_embd]
  QuantMatrix wo;                 // [n_embd][q_dim]
  std::vector<float> bq, bk, bv;  // qwen2 only; empty otherwise
  std::vector<float> ffn_norm;    // [n_embd]
  QuantMatrix w_gate;             // [n_ff][n_embd]
  QuantMatrix w_up;               // [n_ff][n_embd]
  QuantMatrix w_down;             // [n_embd][n_ff]
};

class ModelWeights {
 public:
  // Keeps `file` alive (the views point into it).
  static absl::StatusOr<std::unique_ptr<ModelWeights>> Load(std::shared_ptr<const GgufFile> file);

  const ModelConfig& config() const { return config_; }
  const GgufFile& file() const { return *file_; }
  const QuantMatrix& token_embd() const { return token_embd_; }  // [n_vocab][n_embd]
  const QuantMatrix& output() const { return output_; }          // LM head; token_embd when tied
  bool tied_embeddings() const { return tied_; }
  const std::vector<float>& output_norm() const { return output_norm_; }
  const LayerWeights& layer(int64_t i) const { return layers_[i]; }
  // Bytes of weight data read per decoded token (all matrices once).
  int64_t weight_bytes() const { return weight_bytes_; }

 private:
  ModelWeights() = default;

  std::shared_ptr<const GgufFile> file_;
  ModelConfig config_;
  QuantMatrix token_embd_;
  QuantMatrix output_;
  bool tied_ = false;
  std::vector<float> output_norm_;
  std::vector<LayerWeights> layers_;
  int64_t weight_bytes_ = 0;
};

}  // namespace magicpig::model

#endif  // MAGICPIG_GPU_NODE_MODEL_MODEL_WEIGHTS_H_
