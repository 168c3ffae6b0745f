#include "gpu_node/engine/engine.h"

#include <unistd.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gpu_node/backend/cpu/cpu_backend.h"
#include "gpu_node/engine/local_attention_shards.h"
#include "gpu_node/engine/text_stream.h"

namespace magicpig::engine {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

std::string_view FinishReasonName(FinishReason r) {
  return r == FinishReason::kStop ? "stop" : "length";
}

double GenerateStats::prefill_tokens_per_second() const {
  return prefill_seconds > 0 ? prompt_tokens / prefill_seconds : 0;
}

double GenerateStats::decode_tokens_per_second() const {
  // The first generated token comes from the prefill; decode steps produce the rest.
  return decode_seconds > 0 && generated_tokens > 1 ? (generated_tokens - 1) / decode_seconds : 0;
}

double GenerateStats::sampled_fraction() const {
  return attention_keys_offloaded > 0
             ? static_cast<double>(attention_keys_touched) / attention_keys_offloaded
             : 0.0;
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Load(const EngineOptions& options) {
  MAGICPIG_ASSIGN_OR_RETURN(std::unique_ptr<model::GgufFile> file,
                            model::GgufFile::Open(options.model_path));
  return Create(std::shared_ptr<const model::GgufFile>(std::move(file)),
                std::make_unique<backend::CpuBackend>(options.num_threads, ActiveSimdLevel(),
                                                      options.float_activations),
                options);
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(std::shared_ptr<const model::GgufFile> f,
                                                       std::unique_ptr<backend::Backend> backend,
                                                       const EngineOptions& options) {
  std::unique_ptr<Engine> e(new Engine());
  e->file_ = f;
  e->backend_ = std::move(backend);
  MAGICPIG_ASSIGN_OR_RETURN(e->weights_, model::ModelWeights::Load(f));
  MAGICPIG_ASSIGN_OR_RETURN(e->tokenizer_, model::Tokenizer::FromGguf(*f));
  absl::StatusOr<model::ChatTemplate> chat = model::ChatTemplate::FromGguf(*f);
  if (absl::IsNotFound(chat.status())) {
    chat = model::ChatTemplate::ChatMl("");  // no template in the file: plain ChatML
  }
  if (!chat.ok()) return chat.status();
  e->chat_template_ = std::make_unique<model::ChatTemplate>(*std::move(chat));
  e->transformer_ = std::make_unique<Transformer>(e->weights_.get(), e->backend_.get());
  e->context_length_ =
      options.context_length > 0 ? options.context_length : e->weights_->config().context_length;
  e->prefill_chunk_ = options.prefill_chunk;
  e->attention_ = options.attention;
  if (e->attention_.mode != AttentionMode::kFull) {
    const model::ModelConfig& c = e->weights_->config();
    MAGICPIG_ASSIGN_OR_RETURN(
        SimHash hash, SimHash::Create(c.head_dim, options.attention.lsh_k, options.attention.lsh_l,
                                      options.attention.lsh_seed));
    e->hash_ = std::make_unique<SimHash>(std::move(hash));
    if (c.head_dim % 16 != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sparse attention needs a head dim that is a multiple of 16; this model has ", c.head_dim,
          " (use --attention full)"));
    }
    e->attention_runner_ = std::make_unique<AttentionRunner>(options.num_threads);
    for (const std::string& address : options.attention_nodes) {
      e->attention_nodes_.push_back(std::make_unique<AttentionNodeClient>(address));
    }
  }
  return e;
}

std::unique_ptr<AttentionShards> Engine::MakeRemoteShards(int64_t n_prompt, int64_t max_tokens,
                                                          int64_t budget) {
  const model::ModelConfig& c = weights_->config();
  magicpig::v1::ShardShape shape;
  const std::vector<bool> dense = DenseLayers(c.n_layer, attention_);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    if (!dense[static_cast<size_t>(l)]) shape.add_layers(static_cast<int32_t>(l));
  }
  shape.set_n_kv_heads(static_cast<int32_t>(c.n_head_kv));
  shape.set_group(static_cast<int32_t>(c.n_head / c.n_head_kv));
  shape.set_head_dim(static_cast<int32_t>(c.head_dim));
  shape.set_lsh_k(attention_.lsh_k);
  shape.set_lsh_l(attention_.lsh_l);
  shape.set_dtype(attention_.storage == KvStorage::kF32 ? magicpig::v1::KV_DTYPE_F32
                                                        : magicpig::v1::KV_DTYPE_BF16);
  switch (attention_.mode) {
    case AttentionMode::kTopK:
      shape.set_estimator(magicpig::v1::ESTIMATOR_TOPK);
      break;
    case AttentionMode::kOracle:
      shape.set_estimator(magicpig::v1::ESTIMATOR_ORACLE);
      break;
    default:
      shape.set_estimator(magicpig::v1::ESTIMATOR_MAGICPIG);
      break;
  }
  shape.set_budget(budget);
  shape.set_seed(attention_.lsh_seed);
  std::vector<AttentionNodeClient*> nodes;
  for (auto& n : attention_nodes_) nodes.push_back(n.get());
  // Tokens that may later leave the static window: everything generated.
  return std::make_unique<RemoteAttentionShards>(
      std::move(nodes),
      absl::StrCat("seq-", getpid(), "-", reinterpret_cast<uintptr_t>(this), "-", next_sequence_++),
      shape, max_tokens + attention_.window_budget, attention_.shard_block);
}

absl::StatusOr<GenerateResult> Engine::Generate(const GenerateRequest& request,
                                                const GenerateCallbacks& callbacks) {
  MAGICPIG_RETURN_IF_ERROR(ValidateSamplingParams(request.sampling));
  const int64_t n_prompt = static_cast<int64_t>(request.prompt.size());
  if (n_prompt == 0) return absl::InvalidArgumentError("the prompt is empty");
  if (request.max_tokens < 0) return absl::InvalidArgumentError("max_tokens must be >= 0");
  if (n_prompt >= context_length_) {
    return absl::OutOfRangeError(absl::StrCat("the prompt has ", n_prompt,
                                              " tokens; the context length is ", context_length_));
  }
  absl::MutexLock lock(&mu_);
  const model::ModelConfig& c = weights_->config();
  const int64_t capacity = std::min(context_length_, n_prompt + request.max_tokens);
  MAGICPIG_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> kv,
                            KvCache::Create(c.n_layer, c.n_head_kv, c.head_dim, capacity));
  GenerateResult result;
  result.stats.prompt_tokens = n_prompt;
  Sampler sampler(request.sampling);
  TextStream stream(request.stop);
  std::vector<float> logits;

  // Sparse decoding: a router for this sequence and the estimator it asks.
  std::unique_ptr<Estimator> estimator;
  std::unique_ptr<AttentionShards> shards;
  std::unique_ptr<SparseAttentionRouter> router;
  if (attention_.mode != AttentionMode::kFull) {
    const int64_t offloaded =
        std::max<int64_t>(1, n_prompt - attention_.n_sinks - attention_.n_local);
    const int64_t budget =
        attention_.budget > 0 ? attention_.budget : std::max<int64_t>(1, offloaded / 50);
    switch (attention_.mode) {
      case AttentionMode::kMagicPig:
        estimator = std::make_unique<MagicPigEstimator>(attention_.lsh_k, attention_.lsh_l);
        break;
      case AttentionMode::kTopK:
        estimator = std::make_unique<TopKEstimator>(budget);
        break;
      default:
        estimator = std::make_unique<OracleEstimator>(budget, attention_.lsh_seed);
        break;
    }
    if (attention_nodes_.empty()) {
      shards = std::make_unique<LocalAttentionShards>(
          c.n_layer, c.n_head_kv, static_cast<int>(c.n_head / c.n_head_kv), c.head_dim,
          attention_.lsh_k, attention_.lsh_l, attention_.storage, attention_.shard_block,
          estimator.get(), attention_runner_.get());
    } else {
      shards = MakeRemoteShards(n_prompt, request.max_tokens, budget);
    }
    router = std::make_unique<SparseAttentionRouter>(c, attention_, hash_.get(), shards.get(),
                                                     backend_.get(), kv.get());
  }

  auto start = std::chrono::steady_clock::now();
  ForwardOptions prefill;
  prefill.attention_hook = router.get();
  prefill.logits = LogitsMode::kLast;
  prefill.max_chunk = prefill_chunk_;
  prefill.on_layer_done = callbacks.on_prefill_layer;
  MAGICPIG_RETURN_IF_ERROR(transformer_->Forward(request.prompt, *kv, prefill, &logits));
  result.stats.prefill_seconds = SecondsSince(start);

  auto decode_start = std::chrono::steady_clock::now();
  ForwardOptions decode;
  decode.logits = LogitsMode::kLast;
  decode.attention_hook = router.get();
  result.finish = FinishReason::kLength;
  for (int64_t i = 0; i < request.max_tokens; ++i) {
    const int32_t token = sampler.Sample(logits);
    result.tokens.push_back(token);
    if (!request.ignore_eos && tokenizer_->IsEndOfGeneration(token)) {
      result.finish = FinishReason::kStop;
      break;
    }
    // Control tokens render as nothing (as llama.cpp does by default).
    const int32_t one[1] = {token};
    std::string piece = stream.Append(tokenizer_->Decode(one));
    if (!piece.empty() && callbacks.on_text) callbacks.on_text(piece);
    if (stream.stopped()) {
      result.finish = FinishReason::kStop;
      break;
    }
    if (i + 1 == request.max_tokens || kv->size() >= capacity) break;
    const int32_t next[1] = {token};
    MAGICPIG_RETURN_IF_ERROR(transformer_->Forward(next, *kv, decode, &logits));
  }
  std::string rest = stream.Flush();
  if (!rest.empty() && callbacks.on_text) callbacks.on_text(rest);
  result.text = stream.text();
  result.stats.generated_tokens = static_cast<int64_t>(result.tokens.size());
  result.stats.decode_seconds = SecondsSince(decode_start);
  if (router != nullptr) {
    result.stats.attention_keys_touched = router->stats().keys_touched;
    result.stats.attention_keys_offloaded = router->stats().keys_offloaded;
    result.stats.attention_shard_bytes = shards->bytes();
    result.stats.attention_recoveries = router->stats().recoveries;
  }
  return result;
}

absl::StatusOr<std::vector<int32_t>> Engine::EncodeChat(
    absl::Span<const model::ChatMessage> messages) const {
  MAGICPIG_ASSIGN_OR_RETURN(std::vector<model::ChatSegment> segments,
                            chat_template_->RenderSegments(messages, true));
  std::vector<int32_t> ids;
  for (const model::ChatSegment& seg : segments) {
    std::vector<int32_t> part = tokenizer_->Encode(seg.text, /*parse_special=*/seg.trusted);
    ids.insert(ids.end(), part.begin(), part.end());
  }
  return ids;
}

absl::StatusOr<std::vector<float>> Engine::ScoreAll(const std::vector<int32_t>& tokens) {
  absl::MutexLock lock(&mu_);
  const model::ModelConfig& c = weights_->config();
  MAGICPIG_ASSIGN_OR_RETURN(
      std::unique_ptr<KvCache> kv,
      KvCache::Create(c.n_layer, c.n_head_kv, c.head_dim, static_cast<int64_t>(tokens.size())));
  ForwardOptions options;
  options.logits = LogitsMode::kAll;
  options.max_chunk = prefill_chunk_;
  std::vector<float> logits;
  MAGICPIG_RETURN_IF_ERROR(transformer_->Forward(tokens, *kv, options, &logits));
  return logits;
}

}  // namespace magicpig::engine
