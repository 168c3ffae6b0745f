#include "gpu_node/engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/attention/kv_shard.h"
#include "common/attention/local_attention_shards.h"
#include "common/status_macros.h"
#include "gpu_node/backend/cpu/cpu_backend.h"
#include "gpu_node/engine/sequence_recovery.h"
#include "gpu_node/engine/text_stream.h"

namespace magicpig::engine {

using ::magicpig::attention::AttentionRunner;
using ::magicpig::attention::KvStorage;
using ::magicpig::attention::LocalAttentionShards;
using ::magicpig::attention::SimHash;

std::string_view FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      break;
  }
  return "abort";
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
  backend::BackendOptions b;
  b.kind = options.backend;
  b.num_threads = options.num_threads;
  b.float_activations = options.float_activations;
  b.gpu = options.gpu;
  b.cuda_graphs = options.cuda_graphs;
  b.cuda_attention_kernel = options.cuda_attention_kernel;
  b.cuda_wide_merge = options.cuda_wide_merge;
  MAGICPIG_ASSIGN_OR_RETURN(std::unique_ptr<backend::Backend> backend, backend::MakeBackend(b));
  const bool map = options.map_weights == MapWeights::kOn ||
                   (options.map_weights == MapWeights::kAuto && !backend->host_memory());
  MAGICPIG_ASSIGN_OR_RETURN(
      std::unique_ptr<model::GgufFile> file,
      model::GgufFile::Open(options.model_path, map ? model::GgufLoad::kMap
                                                : backend->wants_interleaved_weights()
                                                    ? model::GgufLoad::kReadInterleaved
                                                    : model::GgufLoad::kRead));
  return Create(std::shared_ptr<const model::GgufFile>(std::move(file)), std::move(backend),
                options);
}

namespace {

// The shape of every shard of a sequence with these attention options.
magicpig::v1::ShardShape ShardShapeOf(const model::ModelConfig& c,
                                      const SparseAttentionOptions& attention, int64_t budget,
                                      const ShardCodes& codes) {
  magicpig::v1::ShardShape shape;
  const std::vector<bool> dense = DenseLayers(c.n_layer, attention);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    if (!dense[static_cast<size_t>(l)]) shape.add_layers(static_cast<int32_t>(l));
  }
  shape.set_n_kv_heads(static_cast<int32_t>(c.n_head_kv));
  shape.set_group(static_cast<int32_t>(c.n_head / c.n_head_kv));
  shape.set_head_dim(static_cast<int32_t>(c.head_dim));
  shape.set_lsh_k(codes.k);
  shape.set_lsh_l(codes.l);
  shape.set_dtype(attention.storage == KvStorage::kF32 ? magicpig::v1::KV_DTYPE_F32
                                                       : magicpig::v1::KV_DTYPE_BF16);
  shape.set_estimator(
      static_cast<magicpig::v1::Estimator>(attention::SpecOf(attention.mode).proto_value));
  shape.set_budget(budget);
  shape.set_seed(attention.lsh_seed);
  shape.set_va_epsilon(attention.vattention.epsilon);
  shape.set_va_delta(attention.vattention.delta);
  shape.set_va_heavy(attention.vattention.heavy);
  shape.set_va_base_rate(attention.vattention.base_rate);
  shape.set_spotlight_fraction(attention.spotlight_fraction);
  shape.set_spotlight_rerank(attention.spotlight_rerank);
  return shape;
}

// The trained hashes of --spotlight-file, checked against the model: its shape and name, a code
// of at least 32 bits (the shards' L >= 2), and a hash for every sparse layer.
absl::StatusOr<std::unique_ptr<attention::SpotlightHashes>> LoadSpotlight(
    const model::ModelConfig& c, const SparseAttentionOptions& attention) {
  const attention::SpotlightShape shape{.n_layer_model = c.n_layer,
                                        .n_head = c.n_head,
                                        .n_head_kv = c.n_head_kv,
                                        .head_dim = c.head_dim,
                                        .model_name = c.name};
  MAGICPIG_ASSIGN_OR_RETURN(attention::SpotlightHashes spot,
                            attention::SpotlightHashes::Load(attention.spotlight_file, &shape));
  if (spot.bits() < 32) {
    return absl::InvalidArgumentError(absl::StrCat(attention.spotlight_file, ": codes of ",
                                                   spot.bits(), " bits; serving needs >= 32"));
  }
  const std::vector<bool> dense = DenseLayers(c.n_layer, attention);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    if (!dense[static_cast<size_t>(l)] && !spot.HasLayer(l)) {
      return absl::InvalidArgumentError(
          absl::StrCat(attention.spotlight_file, ": no hash for sparse layer ", l,
                       " (train every sparse layer, or keep it dense)"));
    }
  }
  return std::make_unique<attention::SpotlightHashes>(std::move(spot));
}

}  // namespace

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
  if (!e->backend_->host_memory()) {
    e->window_backend_ = std::make_unique<backend::CpuBackend>(options.num_threads);
    e->gpu_kv_budget_ = options.gpu_kv_budget;
  }
  e->host_kv_budget_ = options.host_kv_budget;
  if (options.metrics_registry != nullptr) {
    auto& gpu = prometheus::BuildGauge()
                    .Name("magicpig_gpu_memory_bytes")
                    .Help(
                        "GPU memory allocated by the compute backend (in_use) and the GPU's size "
                        "(total); 0 on the CPU backend")
                    .Register(*options.metrics_registry);
    e->gpu_memory_in_use_ = &gpu.Add({{"kind", "in_use"}});
    e->gpu_memory_total_ = &gpu.Add({{"kind", "total"}});
    auto& kv = prometheus::BuildGauge()
                   .Name("magicpig_kv_cache_bytes")
                   .Help(
                       "KV cache bytes of the live sequences on the compute node, by memory: gpu "
                       "(the cache on a GPU backend) or host (the CPU backend's cache, or the "
                       "host mirror a GPU backend keeps for sparse attention)")
                   .Register(*options.metrics_registry);
    e->kv_gpu_bytes_ = &kv.Add({{"memory", "gpu"}});
    e->kv_host_bytes_ = &kv.Add({{"memory", "host"}});
    e->RefreshMemoryMetrics();
  }
  e->transformer_ = std::make_unique<Transformer>(e->weights_.get(), e->backend_.get());
  MAGICPIG_RETURN_IF_ERROR(e->transformer_->PrepareWeights());
  e->context_length_ =
      options.context_length > 0 ? options.context_length : e->weights_->config().context_length;
  e->prefill_chunk_ = options.prefill_chunk;
  Engine* self = e.get();
  e->recovery_ = std::make_unique<SequenceRecovery>(
      e->transformer_.get(), options.prefill_chunk,
      [self](const SparseAttentionOptions& attention, Sequence& seq) {
        return self->PlaceAgain(attention, seq);
      });
  e->num_threads_ = options.num_threads;
  e->ping_pong_ = options.ping_pong;
  e->attention_ = options.attention;
  if (!options.attention.spotlight_file.empty()) {
    MAGICPIG_ASSIGN_OR_RETURN(e->spotlight_,
                              LoadSpotlight(e->weights_->config(), options.attention));
  }
  // A mode that needs learned codes fails here, not at the first request, without the hashes.
  MAGICPIG_RETURN_IF_ERROR(ShardCodesFor(e->attention_, e->spotlight_.get()).status());
  if (attention::SpecOf(e->attention_.mode).sparse) {
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
    if (!options.attention_nodes.empty()) {
      absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
          fabric::ChannelCredentials(options.node_security);
      if (!credentials.ok()) return credentials.status();
      remote::NodeConnection connection;
      connection.credentials = *credentials;
      connection.arguments = fabric::ChannelArgumentsFor(options.node_security);
      // On TLS the certificate names the owner; the token only matters on plaintext.
      std::string token = options.owner_token;
      if (token.empty() && !options.node_security.tls()) {
        token = fabric::CallIdentity::RandomHex128();
      }
      connection.identity =
          std::make_shared<const fabric::CallIdentity>(std::move(token), options.instance_name);
      e->node_pool_ = std::make_unique<remote::AttentionNodePool>(
          options.attention_nodes,
          remote::AttentionNodePoolOptions{.coalesce_attend = options.coalesce_attend,
                                           .attend_timeout = options.attend_timeout,
                                           .placement = options.placement,
                                           .metrics_registry = options.metrics_registry,
                                           .connection = std::move(connection)});
    }
  }
  return e;
}

const std::vector<std::unique_ptr<remote::AttentionNodeClient>>& Engine::attention_nodes() const {
  static const std::vector<std::unique_ptr<remote::AttentionNodeClient>> kNone;
  return node_pool_ != nullptr ? node_pool_->nodes() : kNone;
}

Sequence::~Sequence() = default;

Engine::~Engine() = default;

void Sequence::Abort() {
  if (!finished_) Finish(FinishReason::kAbort);
}

void Sequence::Fail(absl::Status error) {
  Abort();
  error_ = std::move(error);
}

void Sequence::Finish(FinishReason reason) {
  finished_ = true;
  result_.finish = reason;
  if (reason != FinishReason::kAbort) {
    std::string rest = stream_->Flush();
    if (!rest.empty() && callbacks_.on_text) callbacks_.on_text(rest);
    if (!rest.empty() && callbacks_.on_token) {
      callbacks_.on_token(TokenOutput{.token = -1, .text = rest, .logprob = nullptr});
    }
  }
  result_.text = stream_->text();
  result_.stats.generated_tokens = static_cast<int64_t>(result_.tokens.size());
  if (decode_start_ns_ != 0) {
    result_.stats.decode_seconds =
        (std::chrono::steady_clock::now().time_since_epoch().count() - decode_start_ns_) * 1e-9;
  }
  if (router_ != nullptr) {
    result_.stats.attention_keys_touched = router_->stats().keys_touched;
    result_.stats.attention_keys_offloaded = router_->stats().keys_offloaded;
    result_.stats.attention_keys_per_head = router_->stats().keys_per_head;
    result_.stats.attention_shard_bytes = shards_->bytes();
    result_.stats.attention_recoveries = router_->stats().recoveries;
    result_.stats.attention_phases = router_->stats().phases;
    if (kv_ != nullptr) result_.stats.kv_bytes_released = kv_->released_bytes();
  }
  // The memory goes as soon as the sequence ends, not when the caller drops it: on the deleter's
  // thread when there is one, else at the end of this scope. Members go in reverse order: the
  // router first (it points into the shards and the cache), then the shards, then the cache.
  struct Held {
    std::unique_ptr<KvCache> kv;
    std::unique_ptr<attention::AttentionShards> shards;
    std::unique_ptr<SparseAttentionRouter> router;
  };
  Held held{std::move(kv_), std::move(shards_), std::move(router_)};
  // The host budget's share goes now, with the sequence, not when the deleter has freed the
  // memory (milliseconds later): a scheduler with nothing running admits the next request at once
  // (Scheduler::Admit), which must then fit.
  host_reservation_ = HostReservation();
  if (deleter_ != nullptr) deleter_->Add(std::move(held));
}

absl::Status Engine::SetUpSparseAttention(const SparseAttentionOptions& attention, Sequence& seq,
                                          const std::vector<int>& avoid) {
  // On a device backend the router works on the host mirror of the cache (kv_cache.h).
  MAGICPIG_RETURN_IF_ERROR(seq.kv_->EnsureHostMirror());
  const model::ModelConfig& c = weights_->config();
  const int64_t n_prompt = seq.prompt_tokens();
  const SimHash* hash = hash_.get();
  if (hash == nullptr || hash->k() != attention.lsh_k || hash->l() != attention.lsh_l ||
      hash->seed() != attention.lsh_seed) {
    MAGICPIG_ASSIGN_OR_RETURN(SimHash h, SimHash::Create(c.head_dim, attention.lsh_k,
                                                         attention.lsh_l, attention.lsh_seed));
    seq.hash_ = std::make_unique<SimHash>(std::move(h));
    hash = seq.hash_.get();
  }
  const int64_t offloaded = n_prompt - attention.n_sinks - attention.n_local;
  const attention::EstimatorParams params = attention.estimator_params();
  const int64_t budget = attention::EstimatorBudget(attention.mode, params, offloaded);
  MAGICPIG_ASSIGN_OR_RETURN(seq.estimator_,
                            attention::MakeEstimator(attention.mode, params, offloaded));
  MAGICPIG_ASSIGN_OR_RETURN(const ShardCodes codes, ShardCodesFor(attention, spotlight_.get()));
  if (node_pool_ == nullptr) {
    seq.shards_ = std::make_unique<LocalAttentionShards>(
        c.n_layer, c.n_head_kv, static_cast<int>(c.n_head / c.n_head_kv), c.head_dim, codes.k,
        codes.l, codes.index, attention.storage, attention.shard_block, seq.estimator_.get(),
        attention_runner_.get());
  } else {
    // Tokens that may later leave the static window: everything generated.
    seq.shards_ = node_pool_->MakeShards(ShardShapeOf(c, attention, budget, codes),
                                         seq.request_.max_tokens + attention.window_budget,
                                         attention.shard_block, avoid);
  }
  // With attention nodes the offloaded rows leave the compute node's cache (attention_router.h).
  seq.router_ = std::make_unique<SparseAttentionRouter>(
      c, attention, hash, codes.spot, seq.shards_.get(),
      window_backend_ != nullptr ? window_backend_.get() : backend_.get(), &seq.kv_->host(),
      // On a device backend the host mirror also gives offloaded rows back when the shards are
      // in process: nothing there fails in a way that re-offloading from the mirror repairs.
      /*release_offloaded=*/node_pool_ != nullptr || !backend_->host_memory());
  return absl::OkStatus();
}

absl::Status Engine::PlaceAgain(const SparseAttentionOptions& attention, Sequence& seq) {
  const model::ModelConfig& c = weights_->config();
  // The failed nodes of this placement include those of the ones before (AvoidNodes).
  const std::vector<int> avoid = remote::AttentionNodePool::FailedNodes(seq.shards_.get());
  seq.router_.reset();
  seq.shards_.reset();  // releases what the nodes that still answer hold
  MAGICPIG_ASSIGN_OR_RETURN(
      seq.kv_, KvCache::Create(c.n_layer, c.n_head_kv, c.head_dim, seq.capacity_, backend_.get(),
                               &kv_accounting_));
  return SetUpSparseAttention(attention, seq, avoid);
}

const SparseAttentionOptions& Engine::AttentionOf(const Sequence& seq) const {
  return seq.request_.attention.has_value() ? *seq.request_.attention : attention_;
}

namespace {

// log_softmax(logits)[token] and the `top` most likely entries, from one pass over the vocabulary
// so that a chosen token that is also the arg-max gets the very same float.
void FillLogprob(absl::Span<const float> logits, int32_t token, int top, TokenLogprob* out) {
  float max = -std::numeric_limits<float>::infinity();
  for (float v : logits) max = std::max(max, v);
  double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<double>(v - max));
  const float log_z = max + static_cast<float>(std::log(sum));
  out->token = token;
  out->logprob = logits[static_cast<size_t>(token)] - log_z;
  out->top.clear();
  if (top <= 0) return;
  std::vector<int32_t> ids(logits.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  const size_t k = std::min<size_t>(static_cast<size_t>(top), ids.size());
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  for (size_t i = 0; i < k; ++i) out->top.emplace_back(ids[i], logits[ids[i]] - log_z);
}

int64_t NowNs() { return std::chrono::steady_clock::now().time_since_epoch().count(); }

}  // namespace

absl::StatusOr<std::unique_ptr<Sequence>> Engine::Start(const GenerateRequest& request,
                                                        GenerateCallbacks callbacks) {
  MAGICPIG_RETURN_IF_ERROR(ValidateSamplingParams(request.sampling));
  const model::ModelConfig& c = weights_->config();
  const int64_t n_prompt = static_cast<int64_t>(request.prompt.size());
  if (n_prompt == 0) return absl::InvalidArgumentError("the prompt is empty");
  if (request.max_tokens < 0) return absl::InvalidArgumentError("max_tokens must be >= 0");
  if (n_prompt >= context_length_) {
    return absl::OutOfRangeError(absl::StrCat("the prompt has ", n_prompt,
                                              " tokens; the context length is ", context_length_));
  }
  for (int32_t id : request.prompt) {
    if (id < 0 || id >= c.n_vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " is outside the vocabulary [0, ", c.n_vocab, ")"));
    }
  }
  if (request.top_logprobs > 20) {
    return absl::InvalidArgumentError("top_logprobs must be at most 20");
  }
  const SparseAttentionOptions& attention =
      request.attention.has_value() ? *request.attention : attention_;
  if (attention::SpecOf(attention.mode).sparse && c.head_dim % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sparse attention needs a head dim that is a multiple of 16; this model has ", c.head_dim));
  }
  absl::MutexLock lock(&mu_);
  const int64_t host_need = HostBytesFor(request);
  if (absl::Status fits = CheckKvBudget(request, host_need); !fits.ok()) {
    // Callers that do not wait (the scheduler does) get the budget as a capacity error.
    return absl::ResourceExhaustedError(fits.message());
  }
  std::unique_ptr<Sequence> seq(new Sequence());
  seq->host_reservation_ = HostReservation(&host_reserved_, host_need);
  seq->request_ = request;
  seq->callbacks_ = std::move(callbacks);
  seq->capacity_ = std::min(context_length_, n_prompt + request.max_tokens);
  MAGICPIG_ASSIGN_OR_RETURN(
      seq->kv_, KvCache::Create(c.n_layer, c.n_head_kv, c.head_dim, seq->capacity_, backend_.get(),
                                &kv_accounting_));
  // Embedded shards and a host cache hold only memory: they are freed off the decode step. Device
  // memory stays with its owner's thread, and remote shards talk to their nodes as they go.
  if (node_pool_ == nullptr && backend_->host_memory()) seq->deleter_ = &deleter_;
  seq->sampler_ = std::make_unique<Sampler>(request.sampling);
  seq->stream_ = std::make_unique<TextStream>(request.stop);
  seq->result_.stats.prompt_tokens = n_prompt;
  if (attention::SpecOf(attention.mode).sparse) {
    if (attention_runner_ == nullptr) {
      // Made at the first sparse request; with time_phases the estimators time their phases
      // (TakeEstimatorPhaseStats).
      attention_runner_ = std::make_unique<AttentionRunner>(num_threads_);
      attention_runner_->set_time_phases(attention_.time_phases);
    }
    MAGICPIG_RETURN_IF_ERROR(SetUpSparseAttention(attention, *seq));
  }

  const auto start = std::chrono::steady_clock::now();
  ForwardOptions prefill;
  prefill.attention_hook = seq->router_.get();
  prefill.logits = LogitsMode::kLast;
  prefill.max_chunk = prefill_chunk_;
  prefill.on_layer_done = seq->callbacks_.on_prefill_layer;
  if (request.prompt_logprobs) {
    prefill.logits = LogitsMode::kAll;
    const int top = std::max(request.top_logprobs, 0);
    std::vector<TokenLogprob>& out = seq->result_.prompt_logprobs;
    out.resize(static_cast<size_t>(n_prompt - 1));
    // `top` and `out` by value and pointer: this block ends before the prefill runs.
    prefill.on_logits = [&c, &request, n_prompt, top, out = &out](int64_t first, int64_t rows,
                                                                  const float* logits) {
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t pos = first + r;  // predicts prompt[pos + 1]
        if (pos + 1 >= n_prompt) break;
        FillLogprob(absl::MakeConstSpan(logits + r * c.n_vocab, c.n_vocab), request.prompt[pos + 1],
                    top, &(*out)[pos]);
      }
    };
  }
  absl::Status status = transformer_->Forward(request.prompt, *seq->kv_, prefill, &seq->logits_);
  // An attention node failed during the prefill: fresh shards on the others, prefill again.
  if (SequenceRecovery::Recoverable(*seq, status)) {
    status = recovery_->RetryPrefill(attention, *seq, prefill, std::move(status));
  }
  MAGICPIG_RETURN_IF_ERROR(status);
  seq->result_.stats.prefill_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (request.max_tokens == 0) seq->Finish(FinishReason::kLength);
  return seq;
}

bool Engine::SampleNext(Sequence& seq) {
  const GenerateRequest& request = seq.request_;
  if (seq.decode_start_ns_ == 0) seq.decode_start_ns_ = NowNs();
  const int32_t token = seq.sampler_->Sample(seq.logits_);
  seq.result_.tokens.push_back(token);
  const TokenLogprob* logprob = nullptr;
  if (request.top_logprobs >= 0) {
    seq.result_.logprobs.emplace_back();
    FillLogprob(seq.logits_, token, request.top_logprobs, &seq.result_.logprobs.back());
    logprob = &seq.result_.logprobs.back();
  }
  if (!request.ignore_eos && tokenizer_->IsEndOfGeneration(token)) {
    if (seq.callbacks_.on_token) seq.callbacks_.on_token({token, {}, logprob});
    seq.Finish(FinishReason::kStop);
    return false;
  }
  // Control tokens render as nothing (as llama.cpp does by default).
  const int32_t one[1] = {token};
  std::string piece = seq.stream_->Append(tokenizer_->Decode(one));
  if (!piece.empty() && seq.callbacks_.on_text) seq.callbacks_.on_text(piece);
  if (seq.callbacks_.on_token) seq.callbacks_.on_token({token, piece, logprob});
  if (seq.stream_->stopped()) {
    seq.Finish(FinishReason::kStop);
    return false;
  }
  if (seq.generated() >= request.max_tokens || seq.kv_->size() >= seq.capacity_) {
    seq.Finish(FinishReason::kLength);
    return false;
  }
  return true;
}

absl::Status Engine::Step(absl::Span<Sequence* const> batch, StepTimings* timings,
                          double* sampling_seconds) {
  absl::MutexLock lock(&mu_);
  const auto sample_start = std::chrono::steady_clock::now();
  std::vector<DecodeItem> items;
  std::vector<Sequence*> going_on;
  for (Sequence* seq : batch) {
    if (seq == nullptr || seq->finished()) continue;
    if (!SampleNext(*seq)) continue;
    items.push_back(DecodeItem{seq->result_.tokens.back(), seq->kv_.get(), seq->router_.get()});
    going_on.push_back(seq);
  }
  if (sampling_seconds != nullptr) {
    *sampling_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - sample_start).count();
  }
  if (items.empty()) return absl::OkStatus();
  std::vector<float> logits;
  const int64_t batch_size = static_cast<int64_t>(items.size());
  const bool can_split = node_pool_ != nullptr && batch_size >= 2;
  const bool tuned = can_split && ping_pong_ == PingPong::kAuto;
  int micro_batches = 1;
  if (can_split) {
    micro_batches = ping_pong_ == PingPong::kOn    ? 2
                    : ping_pong_ == PingPong::kOff ? 1
                                                   : micro_batch_tuner_.Choose(batch_size);
  }
  if (micro_batches > 1) {
    // Sequences held by the same nodes side by side, so that a micro-batch (a half of the batch)
    // talks to as few nodes as it can: with one-block sequences spread over two nodes, each
    // micro-batch then sends one Attend message per layer instead of two. Every sequence's
    // arithmetic is its own, so the order changes no token.
    std::vector<size_t> order(items.size());
    std::vector<uint64_t> key(items.size());
    for (size_t i = 0; i < items.size(); ++i) {
      order[i] = i;
      key[i] = remote::AttentionNodePool::NodeSet(going_on[i]->shards_.get());
    }
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return key[a] < key[b]; });
    std::vector<DecodeItem> sorted_items;
    std::vector<Sequence*> sorted_seqs;
    for (size_t i : order) {
      sorted_items.push_back(items[i]);
      sorted_seqs.push_back(going_on[i]);
    }
    items.swap(sorted_items);
    going_on.swap(sorted_seqs);
  }
  const auto forward_start = std::chrono::steady_clock::now();
  absl::Status status = transformer_->ForwardBatch(items, &logits, timings, micro_batches);
  if (timings != nullptr) timings->micro_batches = micro_batches;
  if (status.ok() && tuned) {
    // Only steps that ran once: a step repeated after a rebuild measures the recovery.
    micro_batch_tuner_.Report(
        batch_size, micro_batches,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - forward_start).count());
  }
  while (!status.ok()) {
    // Sequences whose attention node failed are rebuilt and the step runs again: for the others
    // a second run of the same step writes the same cache rows and offloads nothing twice. A
    // sequence that cannot be rebuilt (no node answers or has room) fails alone; the rest of the
    // batch goes on without it.
    bool rebuilt = false;
    std::vector<DecodeItem> kept_items;
    std::vector<Sequence*> kept;
    for (size_t i = 0; i < going_on.size(); ++i) {
      Sequence& seq = *going_on[i];
      if (SequenceRecovery::Recoverable(seq, status)) {
        absl::Status rebuild = recovery_->Rebuild(AttentionOf(seq), seq);
        if (!rebuild.ok()) {
          seq.Fail(std::move(rebuild));
          continue;
        }
        items[i].kv = seq.kv_.get();
        items[i].attention_hook = seq.router_.get();
        rebuilt = true;
      }
      kept_items.push_back(items[i]);
      kept.push_back(&seq);
    }
    const bool dropped = kept.size() < going_on.size();
    items.swap(kept_items);
    going_on.swap(kept);
    if (items.empty()) return absl::OkStatus();
    if (!rebuilt && !dropped) return status;
    status = transformer_->ForwardBatch(items, &logits, timings,
                                        std::min<int>(micro_batches, items.size()));
  }
  const int64_t n_vocab = weights_->config().n_vocab;
  for (size_t i = 0; i < going_on.size(); ++i) {
    going_on[i]->logits_.assign(logits.begin() + i * n_vocab, logits.begin() + (i + 1) * n_vocab);
  }
  return absl::OkStatus();
}

absl::StatusOr<GenerateResult> Engine::Generate(const GenerateRequest& request,
                                                const GenerateCallbacks& callbacks) {
  MAGICPIG_ASSIGN_OR_RETURN(std::unique_ptr<Sequence> seq, Start(request, callbacks));
  Sequence* one[1] = {seq.get()};
  while (!seq->finished()) MAGICPIG_RETURN_IF_ERROR(Step(one));
  if (!seq->error().ok()) return seq->error();
  return seq->TakeResult();
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

void Engine::DrainReleases() { deleter_.Drain(); }

attention::AttentionRunner::PhaseStats Engine::TakeEstimatorPhaseStats() {
  absl::MutexLock lock(&mu_);
  return attention_runner_ != nullptr ? attention_runner_->TakePhaseStats()
                                      : attention::AttentionRunner::PhaseStats{};
}

namespace {

// One budget's admission (the GPU's or the host's): RESOURCE_EXHAUSTED when `need` alone exceeds
// `budget`, UNAVAILABLE when it does not fit beside `used`, OK otherwise (also without a budget).
absl::Status CheckBudget(absl::string_view flag, absl::string_view what, int64_t capacity,
                         int64_t need, int64_t used, int64_t budget) {
  if (budget <= 0) return absl::OkStatus();
  if (need > budget) {
    return absl::ResourceExhaustedError(absl::StrCat("the request's ", what, " (", capacity,
                                                     " tokens, ", need, " bytes) exceeds ", flag,
                                                     " (", budget, " bytes)"));
  }
  if (used + need > budget) {
    return absl::UnavailableError(
        absl::StrCat(flag, ": ", need, " bytes needed, ", budget - used, " free"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Engine::CheckKvBudget(const GenerateRequest& request) const {
  return CheckKvBudget(request, host_kv_budget_ > 0 ? HostBytesFor(request) : 0);
}

absl::Status Engine::CheckKvBudget(const GenerateRequest& request, int64_t host_need) const {
  const model::ModelConfig& c = weights_->config();
  const int64_t n_prompt = static_cast<int64_t>(request.prompt.size());
  const int64_t capacity = std::min(context_length_, n_prompt + request.max_tokens);
  MAGICPIG_RETURN_IF_ERROR(
      CheckBudget("--gpu-kv-budget", "KV cache", capacity,
                  KvCache::BytesFor(c.n_layer, c.n_head_kv, c.head_dim, capacity),
                  kv_accounting_.device_bytes.load(), gpu_kv_budget_));
  return CheckBudget("--host-kv-budget", "host memory for its KV cache and attention shards",
                     capacity, host_need, host_reserved_.load(), host_kv_budget_);
}

int64_t Engine::HostBytesFor(const GenerateRequest& request) const {
  const model::ModelConfig& c = weights_->config();
  const int64_t n_prompt = static_cast<int64_t>(request.prompt.size());
  const int64_t capacity = std::min(context_length_, n_prompt + request.max_tokens);
  const SparseAttentionOptions& attention =
      request.attention.has_value() ? *request.attention : attention_;
  const bool sparse = attention::SpecOf(attention.mode).sparse;
  int64_t bytes = 0;
  if (backend_->host_memory()) {
    bytes += KvCache::BytesFor(c.n_layer, c.n_head_kv, c.head_dim, capacity);
  } else if (sparse) {
    // The mirror holds a layer's rows until its offload gives them back (one offload runs beside
    // the next layer), and every layer's static window.
    const int64_t row = 2 * c.n_head_kv * c.head_dim * static_cast<int64_t>(sizeof(uint16_t));
    const int64_t window = std::min(capacity, attention.n_sinks + attention.window_budget);
    bytes += row * (2 * capacity + c.n_layer * window);
  }
  if (sparse && node_pool_ == nullptr) {
    const std::vector<bool> dense = DenseLayers(c.n_layer, attention);
    const int64_t n_sparse = std::count(dense.begin(), dense.end(), false);
    absl::StatusOr<ShardCodes> codes = ShardCodesFor(attention, spotlight_.get());
    const ShardCodes shape = codes.ok() ? *codes : ShardCodes{attention.lsh_k, attention.lsh_l};
    bytes += n_sparse * c.n_head_kv *
             attention::EstimateShardBytes(c.head_dim, attention.storage, shape.k, shape.l,
                                           shape.index, capacity);
  }
  return bytes;
}

void Engine::RefreshMemoryMetrics() {
  if (gpu_memory_in_use_ == nullptr) return;
  // DeviceMemory reads atomics: no lock needed against a running step.
  const backend::Backend::DeviceMemoryStats gpu = backend_->DeviceMemory();
  gpu_memory_in_use_->Set(static_cast<double>(gpu.in_use));
  gpu_memory_total_->Set(static_cast<double>(gpu.total));
  kv_gpu_bytes_->Set(static_cast<double>(kv_accounting_.device_bytes.load()));
  kv_host_bytes_->Set(static_cast<double>(kv_accounting_.host_bytes.load()));
}

absl::StatusOr<std::vector<float>> Engine::ScoreAll(const std::vector<int32_t>& tokens) {
  absl::MutexLock lock(&mu_);
  const model::ModelConfig& c = weights_->config();
  MAGICPIG_ASSIGN_OR_RETURN(
      std::unique_ptr<KvCache> kv,
      KvCache::Create(c.n_layer, c.n_head_kv, c.head_dim, static_cast<int64_t>(tokens.size()),
                      backend_.get(), &kv_accounting_));
  ForwardOptions options;
  options.logits = LogitsMode::kAll;
  options.max_chunk = prefill_chunk_;
  std::vector<float> logits;
  MAGICPIG_RETURN_IF_ERROR(transformer_->Forward(tokens, *kv, options, &logits));
  return logits;
}

}  // namespace magicpig::engine
