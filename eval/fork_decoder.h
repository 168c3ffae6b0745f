// ForkDecoder: one exact prefill, many decodes (issue #6).
//
// The evaluation compares up to ten attention modes on the same prompt. Prefilling an 8K prompt
// costs about 90 s on this 2-core machine, so instead of calling Engine::Generate once per mode
// (each call prefills again), the evaluators prefill once and fork the KV cache per mode. The
// pieces are the engine's own: its Transformer (over the engine's weights and backend), KvCache,
// SparseAttentionRouter, LocalAttentionShards and estimators, wired as Engine::Start and
// Engine::SetUpSparseAttention wire them (embedded mode). A fork copies the prefix's fp16 cache and
// then calls the router's OnLayerStored for every layer with the prefix length, which is exactly
// what the engine's prefill does after each layer, so the offloaded region, its centres, hash codes
// and tables are the ones Engine::Generate would build. fork_decoder_test checks that greedy tokens
// from a fork equal Engine::Generate's for full and MagicPIG attention.
//
//   ForkDecoder dec(engine.get(), threads);
//   MAGICPIG_ASSIGN_OR_RETURN(Prefix p, dec.Prefill(prompt, prompt.size() + 128));
//   MAGICPIG_ASSIGN_OR_RETURN(auto branch, dec.Fork(p, options, 128));   // options.mode: any
//   int32_t t = Argmax(branch->logits()); branch->Feed(t); ...
//
// Thread-safety: one ForkDecoder and its branches on one thread (the Transformer owns scratch).
#ifndef MAGICPIG_EVAL_FORK_DECODER_H_
#define MAGICPIG_EVAL_FORK_DECODER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/attention/attention_runner.h"
#include "common/attention/estimators.h"
#include "common/attention/simhash.h"
#include "gpu_node/engine/attention_router.h"
#include "gpu_node/engine/engine.h"
#include "gpu_node/engine/kv_cache.h"
#include "gpu_node/engine/transformer.h"

namespace magicpig::eval {

// An exactly prefilled prefix: its cache and the logits of its next token.
struct Prefix {
  std::unique_ptr<engine::KvCache> kv;
  std::vector<float> logits;
  int64_t size() const { return kv->size(); }
};

// One decode of a prefix under one attention mode.
class Branch {
 public:
  ~Branch();
  // Appends `token` through the single-token decode path (sparse for sparse modes); logits() then
  // predicts the token after it.
  absl::Status Feed(int32_t token);
  const std::vector<float>& logits() const { return logits_; }
  int64_t size() const { return kv_->size(); }
  // Sums over (sparse layer, query head, decode step); 0 / 0 for full attention.
  int64_t keys_touched() const;
  int64_t keys_offloaded() const;
  // Keys offloaded per (sparse layer, kv head) when the branch was forked (the prefix region).
  int64_t offloaded_at_fork() const { return offloaded_at_fork_; }
  // The per-head budget topk/oracle got (Table 9 default when options.budget == 0).
  int64_t budget() const { return budget_; }

 private:
  friend class ForkDecoder;
  Branch() = default;
  engine::Transformer* transformer_ = nullptr;
  std::unique_ptr<engine::KvCache> kv_;
  std::unique_ptr<attention::SimHash> hash_;
  std::unique_ptr<const attention::Estimator> estimator_;
  std::unique_ptr<attention::AttentionShards> shards_;
  std::unique_ptr<engine::SparseAttentionRouter> router_;
  std::vector<float> logits_;
  int64_t offloaded_at_fork_ = 0;
  int64_t budget_ = 0;
};

class ForkDecoder {
 public:
  ForkDecoder(engine::Engine* engine, int num_threads, int64_t prefill_chunk = 256);
  ~ForkDecoder();

  const engine::Engine& engine() const { return *engine_; }

  // Exact prefill of `tokens` into a new cache of `capacity` positions (>= tokens.size()).
  absl::StatusOr<Prefix> Prefill(absl::Span<const int32_t> tokens, int64_t capacity);
  // A copy of `prefix` extended exactly (dense prefill) by `tokens`.
  absl::StatusOr<Prefix> Extend(const Prefix& prefix, absl::Span<const int32_t> tokens,
                                int64_t capacity);
  // A branch of `prefix` decoding with `attention` (any mode), room for `extra` more tokens.
  absl::StatusOr<std::unique_ptr<Branch>> Fork(const Prefix& prefix,
                                               const engine::SparseAttentionOptions& attention,
                                               int64_t extra);
  // branches[i]->Feed(tokens[i]) for every i in one batched decode step (the engine's
  // Transformer::ForwardBatch: the weights are read once for all branches; each branch keeps its
  // own cache and attention). Each branch's logits are the ones its own Feed would give (the
  // batch's rows do not mix; EngineTest.BatchedStepsGiveEachSequenceItsOwnTokens).
  absl::Status FeedBatch(absl::Span<Branch* const> branches, absl::Span<const int32_t> tokens);

 private:
  absl::StatusOr<std::unique_ptr<engine::KvCache>> Copy(const Prefix& prefix, int64_t capacity);

  engine::Engine* engine_;
  std::unique_ptr<engine::Transformer> transformer_;
  std::unique_ptr<attention::AttentionRunner> runner_;
  int64_t prefill_chunk_;
};

// Attention options with the whole prompt region in one shard block. The evaluation matches
// budgets: top-k and oracle sampling apply their budget per block, so with the engine's default
// 4096-token blocks a 6K prompt would give them twice the keys MagicPIG touched. It also judges
// the estimators at every length: a layer samples as soon as its offloaded region holds a key
// (the serving default waits for SparseAttentionOptions::kDefaultMinOffloadKeys).
engine::SparseAttentionOptions OneBlock();

// The greedy choice (the engine's Sampler at temperature 0).
int32_t Argmax(const std::vector<float>& logits);

}  // namespace magicpig::eval

#endif  // MAGICPIG_EVAL_FORK_DECODER_H_
