#include "eval/fork_decoder.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/attention/local_attention_shards.h"
#include "common/status_macros.h"
#include "gpu_node/engine/sampler.h"

namespace magicpig::eval {

using ::magicpig::attention::AttentionRunner;
using ::magicpig::attention::SimHash;

using engine::KvCache;

Branch::~Branch() {
  router_.reset();
  shards_.reset();
}

absl::Status Branch::Feed(int32_t token) {
  engine::DecodeItem item{token, kv_.get(), router_.get()};
  return transformer_->ForwardBatch({&item, 1}, &logits_);
}

int64_t Branch::keys_touched() const { return router_ ? router_->stats().keys_touched : 0; }
int64_t Branch::keys_offloaded() const { return router_ ? router_->stats().keys_offloaded : 0; }

ForkDecoder::ForkDecoder(engine::Engine* engine, int num_threads, int64_t prefill_chunk)
    : engine_(engine),
      transformer_(std::make_unique<engine::Transformer>(&engine->weights(), &engine->backend())),
      runner_(std::make_unique<AttentionRunner>(num_threads)),
      prefill_chunk_(prefill_chunk) {}

ForkDecoder::~ForkDecoder() = default;

absl::StatusOr<Prefix> ForkDecoder::Prefill(absl::Span<const int32_t> tokens, int64_t capacity) {
  const model::ModelConfig& c = engine_->config();
  Prefix p;
  MAGICPIG_ASSIGN_OR_RETURN(
      p.kv, KvCache::Create(c.n_layer, c.n_head_kv, c.head_dim,
                            std::max<int64_t>(capacity, static_cast<int64_t>(tokens.size()))));
  engine::ForwardOptions options;
  options.logits = engine::LogitsMode::kLast;
  options.max_chunk = prefill_chunk_;
  MAGICPIG_RETURN_IF_ERROR(transformer_->Forward(tokens, *p.kv, options, &p.logits));
  return p;
}

absl::StatusOr<std::unique_ptr<KvCache>> ForkDecoder::Copy(const Prefix& prefix, int64_t capacity) {
  const model::ModelConfig& c = engine_->config();
  const int64_t n = prefix.size();
  if (capacity < n) return absl::InvalidArgumentError("capacity below the prefix length");
  MAGICPIG_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> kv,
                            KvCache::Create(c.n_layer, c.n_head_kv, c.head_dim, capacity));
  const int64_t row = c.n_head_kv * c.head_dim;  // the cache is position-major
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const backend::KvLayerView src = prefix.kv->layer(l);
    const backend::KvLayerView dst = kv->layer(l);
    std::memcpy(dst.k, src.k, static_cast<size_t>(n * row) * sizeof(uint16_t));
    std::memcpy(dst.v, src.v, static_cast<size_t>(n * row) * sizeof(uint16_t));
  }
  kv->set_size(n);
  return kv;
}

absl::StatusOr<Prefix> ForkDecoder::Extend(const Prefix& prefix, absl::Span<const int32_t> tokens,
                                           int64_t capacity) {
  Prefix p;
  MAGICPIG_ASSIGN_OR_RETURN(
      p.kv, Copy(prefix,
                 std::max<int64_t>(capacity, prefix.size() + static_cast<int64_t>(tokens.size()))));
  if (tokens.empty()) {
    p.logits = prefix.logits;
    return p;
  }
  engine::ForwardOptions options;
  options.logits = engine::LogitsMode::kLast;
  options.max_chunk = prefill_chunk_;
  MAGICPIG_RETURN_IF_ERROR(transformer_->Forward(tokens, *p.kv, options, &p.logits));
  return p;
}

absl::StatusOr<std::unique_ptr<Branch>> ForkDecoder::Fork(
    const Prefix& prefix, const engine::SparseAttentionOptions& attention, int64_t extra) {
  const model::ModelConfig& c = engine_->config();
  std::unique_ptr<Branch> b(new Branch());
  b->transformer_ = transformer_.get();
  b->logits_ = prefix.logits;
  MAGICPIG_ASSIGN_OR_RETURN(b->kv_, Copy(prefix, prefix.size() + extra));
  if (!attention::SpecOf(attention.mode).sparse) return b;
  // As Engine::SetUpSparseAttention (embedded).
  MAGICPIG_ASSIGN_OR_RETURN(
      SimHash h, SimHash::Create(c.head_dim, attention.lsh_k, attention.lsh_l, attention.lsh_seed));
  b->hash_ = std::make_unique<SimHash>(std::move(h));
  const int64_t offloaded = prefix.size() - attention.n_sinks - attention.n_local;
  b->offloaded_at_fork_ = std::max<int64_t>(1, offloaded);
  const attention::EstimatorParams params = attention.estimator_params();
  b->budget_ = attention::EstimatorBudget(attention.mode, params, offloaded);
  MAGICPIG_ASSIGN_OR_RETURN(b->estimator_,
                            attention::MakeEstimator(attention.mode, params, offloaded));
  MAGICPIG_ASSIGN_OR_RETURN(const engine::ShardCodes codes,
                            engine::ShardCodesFor(attention, engine_->spotlight()));
  b->shards_ = std::make_unique<attention::LocalAttentionShards>(
      c.n_layer, c.n_head_kv, static_cast<int>(c.n_head / c.n_head_kv), c.head_dim, codes.k,
      codes.l, codes.index, attention.storage, attention.shard_block, b->estimator_.get(),
      runner_.get());
  b->router_ = std::make_unique<engine::SparseAttentionRouter>(c, attention, b->hash_.get(),
                                                               codes.spot, b->shards_.get(),
                                                               &engine_->backend(), b->kv_.get());
  // What the engine's prefill does after each layer (Transformer::Forward -> OnLayerStored).
  MAGICPIG_RETURN_IF_ERROR(engine_->backend().Execute([&]() -> absl::Status {
    for (int64_t l = 0; l < c.n_layer; ++l) {
      MAGICPIG_RETURN_IF_ERROR(b->router_->OnLayerStored(l, b->kv_->layer(l), prefix.size()));
    }
    return absl::OkStatus();
  }));
  return b;
}

absl::Status ForkDecoder::FeedBatch(absl::Span<Branch* const> branches,
                                    absl::Span<const int32_t> tokens) {
  if (branches.size() != tokens.size()) {
    return absl::InvalidArgumentError("FeedBatch: one token per branch");
  }
  if (branches.empty()) return absl::OkStatus();
  std::vector<engine::DecodeItem> items;
  items.reserve(branches.size());
  for (size_t i = 0; i < branches.size(); ++i) {
    items.push_back({tokens[i], branches[i]->kv_.get(), branches[i]->router_.get()});
  }
  std::vector<float> logits;
  MAGICPIG_RETURN_IF_ERROR(transformer_->ForwardBatch(items, &logits));
  const size_t vocab = logits.size() / branches.size();
  for (size_t i = 0; i < branches.size(); ++i) {
    branches[i]->logits_.assign(logits.begin() + i * vocab, logits.begin() + (i + 1) * vocab);
  }
  return absl::OkStatus();
}

engine::SparseAttentionOptions OneBlock() {
  engine::SparseAttentionOptions a;
  a.shard_block = int64_t{1} << 20;
  a.min_offload_keys = 1;
  return a;
}

int32_t Argmax(const std::vector<float>& logits) {
  engine::Sampler greedy(engine::SamplingParams{});
  return greedy.Sample(logits);
}

}  // namespace magicpig::eval
