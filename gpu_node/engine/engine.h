// Engine: a loaded model ready to generate text — weights, tokenizer, chat template and a
// compute backend — and the generation loop (prefill, decode, sampling, stop conditions).
//
//   MAGICPIG_ASSIGN_OR_RETURN(auto engine, Engine::Load({.model_path = "models/x.gguf"}));
//   GenerateRequest req{.prompt = engine->tokenizer().Encode(text, true), .max_tokens = 64};
//   MAGICPIG_ASSIGN_OR_RETURN(GenerateResult r, engine->Generate(req, {}));
//
// Thread-safety: Generate calls are serialised (one sequence at a time in this version).
#ifndef MAGICPIG_GPU_NODE_ENGINE_ENGINE_H_
#define MAGICPIG_GPU_NODE_ENGINE_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "attn_node/core/attention_runner.h"
#include "gpu_node/backend/backend.h"
#include "gpu_node/engine/attention_router.h"
#include "gpu_node/engine/remote_attention_shards.h"
#include "gpu_node/engine/sampler.h"
#include "gpu_node/engine/transformer.h"
#include "gpu_node/model/chat_template.h"
#include "gpu_node/model/model_weights.h"
#include "gpu_node/model/tokenizer.h"

namespace magicpig::engine {

struct EngineOptions {
  std::string model_path;
  int num_threads = 0;          // 0: all cores
  int64_t context_length = 0;   // 0: the model's
  int64_t prefill_chunk = 256;  // tokens per layer step during prefill
  // Reference precision: float32 activations in weight products (slower; for verification).
  bool float_activations = false;
  // Decode-time attention: MagicPIG by default; kFull keeps every step exact.
  SparseAttentionOptions attention;
  // Attention nodes ("host:port") holding the offloaded keys; empty: in this process (embedded).
  std::vector<std::string> attention_nodes;
};

struct GenerateRequest {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 256;
  SamplingParams sampling;
  std::vector<std::string> stop;
  bool ignore_eos = false;
};

enum class FinishReason { kStop, kLength };
std::string_view FinishReasonName(FinishReason r);

struct GenerateStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;  // from the first decode step to the last token
  // Sparse decode steps: keys the estimator touched / keys offloaded to the attention core,
  // summed over (sparse layer, query head, step); 0 / 0 for full attention.
  int64_t attention_keys_touched = 0;
  int64_t attention_keys_offloaded = 0;
  int64_t attention_shard_bytes = 0;  // memory of the sequence's shards (KV + tables) at the end
  int64_t attention_recoveries = 0;   // shard rebuilds after attention-node failures
  double sampled_fraction() const;
  double prefill_tokens_per_second() const;
  double decode_tokens_per_second() const;
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids (excluding the prompt; including a final EOS)
  std::string text;             // detokenised, cut before any stop string
  FinishReason finish = FinishReason::kLength;
  GenerateStats stats;
};

struct GenerateCallbacks {
  std::function<void(std::string_view)> on_text;  // streamed text pieces
  std::function<void(int64_t layer, int64_t n_layer)> on_prefill_layer;
};

class Engine {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> Load(const EngineOptions& options);
  // For tests: an engine over an already-open file and a given backend.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(std::shared_ptr<const model::GgufFile> f,
                                                        std::unique_ptr<backend::Backend> backend,
                                                        const EngineOptions& options);

  const model::ModelConfig& config() const { return weights_->config(); }
  const model::Tokenizer& tokenizer() const { return *tokenizer_; }
  const model::ChatTemplate& chat_template() const { return *chat_template_; }
  const model::ModelWeights& weights() const { return *weights_; }
  backend::Backend& backend() { return *backend_; }
  int64_t context_length() const { return context_length_; }

  // Prompt ids for a chat: template text may hold special tokens, message content may not.
  absl::StatusOr<std::vector<int32_t>> EncodeChat(
      absl::Span<const model::ChatMessage> messages) const;

  absl::StatusOr<GenerateResult> Generate(const GenerateRequest& request,
                                          const GenerateCallbacks& callbacks);

  // Teacher-forced logits for every position of `tokens` ([n][n_vocab]); for evaluation and tests.
  absl::StatusOr<std::vector<float>> ScoreAll(const std::vector<int32_t>& tokens);

 private:
  Engine() = default;
  std::unique_ptr<AttentionShards> MakeRemoteShards(int64_t n_prompt, int64_t max_tokens,
                                                    int64_t budget);

  std::unique_ptr<backend::Backend> backend_;
  std::shared_ptr<const model::GgufFile> file_;
  std::unique_ptr<model::ModelWeights> weights_;
  std::unique_ptr<model::Tokenizer> tokenizer_;
  std::unique_ptr<model::ChatTemplate> chat_template_;
  std::unique_ptr<Transformer> transformer_;
  SparseAttentionOptions attention_;
  std::unique_ptr<SimHash> hash_;  // when attention_.mode != kFull
  std::unique_ptr<AttentionRunner> attention_runner_;
  std::vector<std::unique_ptr<AttentionNodeClient>> attention_nodes_;
  int64_t next_sequence_ = 0;
  int64_t context_length_ = 0;
  int64_t prefill_chunk_ = 256;
  absl::Mutex mu_;
};

}  // namespace magicpig::engine

#endif  // MAGICPIG_GPU_NODE_ENGINE_ENGINE_H_
