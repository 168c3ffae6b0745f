// Engine: a loaded model ready to generate text — weights, tokenizer, chat template and a
// compute backend — and the generation loop (prefill, decode, sampling, stop conditions).
//
//   MAGICPIG_ASSIGN_OR_RETURN(auto engine, Engine::Load({.model_path = "models/x.gguf"}));
//   GenerateRequest req{.prompt = engine->tokenizer().Encode(text, true), .max_tokens = 64};
//   MAGICPIG_ASSIGN_OR_RETURN(GenerateResult r, engine->Generate(req, {}));
//
// Generate runs one request to the end. A scheduler batching many requests uses the parts it is
// made of: Start (validation, memory, prefill) and Step (one sampled token for each sequence of a
// batch, then one batched forward pass of those still running).
//
// Thread-safety: Start, Step, Generate and ScoreAll may be called from any thread; they are
// serialised by the engine (the backend runs one batch at a time). A Sequence is used by one
// thread at a time (the scheduler's).
#ifndef MAGICPIG_GPU_NODE_ENGINE_ENGINE_H_
#define MAGICPIG_GPU_NODE_ENGINE_ENGINE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/attention/attention_runner.h"
#include "common/background_deleter.h"
#include "common/fabric/transport_security.h"
#include "gpu_node/backend/backend.h"
#include "gpu_node/backend/backend_factory.h"
#include "gpu_node/engine/attention_router.h"
#include "gpu_node/engine/sampler.h"
#include "gpu_node/engine/text_stream.h"
#include "gpu_node/engine/transformer.h"
#include "gpu_node/model/chat_template.h"
#include "gpu_node/model/model_weights.h"
#include "gpu_node/model/tokenizer.h"
#include "gpu_node/remote/attention_node_pool.h"
#include "gpu_node/remote/micro_batch_tuner.h"
#include "gpu_node/remote/remote_attention_shards.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace magicpig::engine {

// How a batched decode step with attention nodes is split (see EngineOptions::ping_pong).
enum class PingPong {
  kOff,   // one batch
  kOn,    // two micro-batches whenever the batch has 2 or more sequences
  kAuto,  // whichever of the two the recent steps of this batch size ran faster
          // (remote::MicroBatchTuner)
};

enum class MapWeights { kAuto, kOn, kOff };

struct EngineOptions {
  std::string model_path;
  int num_threads = 0;          // 0: all cores
  int64_t context_length = 0;   // 0: the model's
  int64_t prefill_chunk = 256;  // tokens per layer step during prefill
  // Reference precision: float32 activations in weight products (slower; for verification).
  bool float_activations = false;
  // The compute backend (backend_factory.h) and, for CUDA, the device index.
  backend::BackendKind backend = backend::BackendKind::kAuto;
  int gpu = 0;
  // CUDA: record each decode step without attention hooks as a CUDA graph and replay it; off
  // (the default: measured no faster, docs/gpu.md) launches every operation on its own.
  bool cuda_graphs = false;
  // CUDA: the exact attention kernel (CudaBackendOptions::attention_kernel).
  backend::CudaAttentionKernel cuda_attention_kernel = backend::CudaAttentionKernel::kAuto;
  // CUDA: merge attention partials with a block per row (CudaBackendOptions::wide_merge).
  bool cuda_wide_merge = false;
  // How the model file reaches memory: mapped (on), read into huge-page memory (off), or auto:
  // read for a backend that computes in host memory (faster decode, GgufLoad::kRead), mapped for
  // a GPU backend (which copies the weights to the device anyway).
  MapWeights map_weights = MapWeights::kAuto;
  // Cap on the bytes the live sequences' KV caches may take in GPU memory (0: none; no effect on
  // a backend that computes in host memory). A request whose cache does not fit waits in the
  // scheduler's queue until running sequences free enough (CheckKvBudget).
  int64_t gpu_kv_budget = 0;
  // Cap on the host memory the live sequences may take in this process: a host-memory backend's
  // KV caches, a device cache's host mirror and embedded attention shards, each request charged
  // at its capacity (as an attention node admits: attention::EstimateShardBytes) from Start until
  // its memory is freed. A request that does not fit waits in the scheduler's queue; one that never
  // can fails with RESOURCE_EXHAUSTED. 0: none.
  int64_t host_kv_budget = 0;
  // Decode-time attention: MagicPIG by default; kFull keeps every step exact.
  SparseAttentionOptions attention;
  // Attention nodes ("host:port") holding the offloaded keys; empty: in this process (embedded).
  std::vector<std::string> attention_nodes;
  // With attention nodes, a batched decode step of 2 or more sequences may run as two
  // micro-batches whose remote attention overlaps the other's dense work (ping-pong).
  PingPong ping_pong = PingPong::kAuto;
  // With attention nodes: the queries that the sequences of a micro-batch send to one node at one
  // layer travel as one message (AttendCoalescer). false: one message per sequence and block.
  bool coalesce_attend = true;
  // With attention nodes: a node that does not answer one step's Attend within this counts as
  // failed (hung or stopped), and its sequences are placed again on the others.
  std::chrono::milliseconds attend_timeout{10000};
  // With attention nodes: how a sequence's blocks are laid over them (remote_attention_shards.h).
  remote::Placement placement = remote::Placement::kPack;
  // With attention nodes: mutual TLS or (only when chosen: insecure) plaintext; Create refuses
  // neither (common/fabric/transport_security.h).
  fabric::TransportSecurity node_security;
  // With attention nodes on plaintext: the bearer token that names this process's sequences on
  // them (empty: a random one per engine, so a restart cannot reclaim what it left).
  std::string owner_token;
  // With attention nodes: this compute node's name, stable across restarts (empty: the host
  // name); at start it drops the sequences a previous run under this name left on the nodes.
  std::string instance_name;
  // Where the per-attention-node RPC metrics go (magicpig_attn_rpc_*; remote_attention_shards.h);
  // borrowed, must outlive the engine. Null: none.
  prometheus::Registry* metrics_registry = nullptr;
};

struct GenerateRequest {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 256;
  SamplingParams sampling;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  // Log-probabilities (of the model's distribution, before temperature): -1 none; 0 the chosen
  // token's; N > 0 also the N most likely tokens at each step.
  int top_logprobs = -1;
  // Also the teacher-forced log-probabilities of prompt tokens 1.. (for `echo`), with
  // max(top_logprobs, 0) alternatives.
  bool prompt_logprobs = false;
  // Decode attention for this request instead of the engine's (evaluation); nullopt: the engine's.
  std::optional<SparseAttentionOptions> attention;
};

enum class FinishReason { kStop, kLength, kAbort };
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
  KeysPerHeadHistogram attention_keys_per_head;  // per (sparse layer, query head, step)
  int64_t attention_shard_bytes = 0;  // memory of the sequence's shards (KV + tables) at the end
  int64_t attention_recoveries = 0;   // shard rebuilds after attention-node failures
  // Memory of offloaded rows given back from the compute node's KV cache (attention nodes only).
  int64_t kv_bytes_released = 0;
  // The sparse layers' decode attention by phase (with SparseAttentionOptions::time_phases).
  AttentionPhaseSeconds attention_phases;
  double sampled_fraction() const;
  double prefill_tokens_per_second() const;
  double decode_tokens_per_second() const;
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;                           // natural log
  std::vector<std::pair<int32_t, float>> top;  // the most likely tokens, most likely first
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids (excluding the prompt; including a final EOS)
  std::string text;             // detokenised, cut before any stop string
  FinishReason finish = FinishReason::kLength;
  GenerateStats stats;
  std::vector<TokenLogprob> logprobs;         // per generated token, when requested
  std::vector<TokenLogprob> prompt_logprobs;  // prompt tokens 1.., when requested
};

// One generated token as it is produced. At the end, text that was held back (a possible stop
// string that did not complete) comes as a last TokenOutput with token -1.
struct TokenOutput {
  int32_t token = 0;
  std::string_view text;                  // newly releasable text (may be empty: held back)
  const TokenLogprob* logprob = nullptr;  // when requested
};

struct GenerateCallbacks {
  std::function<void(std::string_view)> on_text;  // streamed text pieces
  std::function<void(const TokenOutput&)> on_token;
  std::function<void(int64_t layer, int64_t n_layer)> on_prefill_layer;
};

class Engine;

// One request being generated: its cache, sampler, text stream and (sparse decoding) attention
// router. Created by Engine::Start, advanced by Engine::Step; destroying it frees its memory and
// releases its attention shards.
class SequenceRecovery;

// Bytes of the engine's host budget (EngineOptions::host_kv_budget) a sequence holds, given back
// when this is destroyed or replaced (when the sequence finishes). Move-only; thread-safe (the
// pool is atomic).
class HostReservation {
 public:
  HostReservation() = default;
  HostReservation(std::atomic<int64_t>* pool, int64_t bytes) : pool_(pool), bytes_(bytes) {
    if (pool_ != nullptr) *pool_ += bytes_;
  }
  HostReservation(HostReservation&& other) noexcept
      : pool_(std::exchange(other.pool_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  HostReservation& operator=(HostReservation&& other) noexcept {
    if (this != &other) {
      if (pool_ != nullptr) *pool_ -= bytes_;
      pool_ = std::exchange(other.pool_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  ~HostReservation() {
    if (pool_ != nullptr) *pool_ -= bytes_;
  }
  int64_t bytes() const { return bytes_; }

 private:
  std::atomic<int64_t>* pool_ = nullptr;
  int64_t bytes_ = 0;
};

class Sequence {
 public:
  ~Sequence();
  bool finished() const { return finished_; }
  // Valid once finished().
  const GenerateResult& result() const { return result_; }
  GenerateResult TakeResult() { return std::move(result_); }
  int64_t generated() const { return static_cast<int64_t>(result_.tokens.size()); }
  int64_t prompt_tokens() const { return static_cast<int64_t>(request_.prompt.size()); }
  // Ends the sequence now with finish reason kAbort (e.g. the client went away).
  void Abort();
  // OK, unless the sequence failed on its own (its attention shards could not be rebuilt on any
  // node) while the rest of its batch went on: then it is finished and this is its outcome.
  const absl::Status& error() const { return error_; }

 private:
  friend class Engine;
  friend class SequenceRecovery;
  Sequence() = default;
  void Finish(FinishReason reason);
  // Finishes the sequence with `error` (as Abort, plus error()).
  void Fail(absl::Status error);

  GenerateRequest request_;
  GenerateCallbacks callbacks_;
  std::unique_ptr<KvCache> kv_;
  std::unique_ptr<Sampler> sampler_;
  std::unique_ptr<TextStream> stream_;
  std::unique_ptr<attention::SimHash> hash_;  // when the request overrides (K, L, seed)
  std::unique_ptr<const attention::Estimator> estimator_;
  std::unique_ptr<attention::AttentionShards> shards_;
  std::unique_ptr<SparseAttentionRouter> router_;
  // Where Finish hands the router, shards and cache to be freed (embedded attention on a
  // host-memory backend); null: freed inline.
  BackgroundDeleter* deleter_ = nullptr;
  std::vector<float> logits_;  // of the next token
  int64_t capacity_ = 0;
  // Its share of --host-kv-budget, held from Start until it finishes.
  HostReservation host_reservation_;
  bool finished_ = false;
  absl::Status error_;
  int64_t decode_start_ns_ = 0;  // steady clock, at the first Step
  GenerateResult result_;
};

class Engine {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> Load(const EngineOptions& options);
  // For tests: an engine over an already-open file and a given backend.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(std::shared_ptr<const model::GgufFile> f,
                                                        std::unique_ptr<backend::Backend> backend,
                                                        const EngineOptions& options);
  ~Engine();

  const model::ModelConfig& config() const { return weights_->config(); }
  const model::Tokenizer& tokenizer() const { return *tokenizer_; }
  const model::ChatTemplate& chat_template() const { return *chat_template_; }
  const model::ModelWeights& weights() const { return *weights_; }
  backend::Backend& backend() { return *backend_; }
  // The trained spotlight hashes (--spotlight-file), or null when none was given.
  const attention::SpotlightHashes* spotlight() const { return spotlight_.get(); }
  // KV cache bytes of the live sequences by where they live (kv_cache.h).
  const KvAccounting& kv_accounting() const { return kv_accounting_; }
  // Sets the memory gauges (magicpig_gpu_memory_bytes, magicpig_kv_cache_bytes; docs/metrics.md)
  // in EngineOptions::metrics_registry from the backend and the live caches; called before each
  // scrape. Thread-safe.
  void RefreshMemoryMetrics();
  int64_t context_length() const { return context_length_; }
  const SparseAttentionOptions& attention_options() const { return attention_; }
  // The attention nodes this engine places shards on (empty: embedded).
  const std::vector<std::unique_ptr<remote::AttentionNodeClient>>& attention_nodes() const;

  // Prompt ids for a chat: template text may hold special tokens, message content may not.
  absl::StatusOr<std::vector<int32_t>> EncodeChat(
      absl::Span<const model::ChatMessage> messages) const;

  absl::StatusOr<GenerateResult> Generate(const GenerateRequest& request,
                                          const GenerateCallbacks& callbacks);

  // Whether the request's KV cache fits --gpu-kv-budget, and its host memory (HostBytesFor)
  // --host-kv-budget, now: OK (also without budgets); UNAVAILABLE when it does not fit beside the
  // live sequences but would alone; RESOURCE_EXHAUSTED when it never can. Thread-safe.
  absl::Status CheckKvBudget(const GenerateRequest& request) const;
  // The host memory the request is charged against --host-kv-budget: at its capacity, a
  // host-memory backend's KV cache, a device cache's host mirror (two layers' rows, the offloaded
  // ones given back after each layer, plus every layer's static window) and, with embedded
  // sparse attention, its shards (attention::EstimateShardBytes per sparse layer and kv head).
  int64_t HostBytesFor(const GenerateRequest& request) const;
  // What the live sequences hold of --host-kv-budget now (their HostBytesFor, until freed).
  int64_t host_reserved_bytes() const { return host_reserved_.load(); }

  // Validates the request, allocates its cache and shards and runs the prefill. INVALID_ARGUMENT
  // / OUT_OF_RANGE for a bad request, RESOURCE_EXHAUSTED when memory or attention capacity is
  // short. The returned sequence has its first token's logits ready (finished already when
  // max_tokens is 0).
  absl::StatusOr<std::unique_ptr<Sequence>> Start(const GenerateRequest& request,
                                                  GenerateCallbacks callbacks);
  // One token for every unfinished sequence in `batch` (callbacks run here), then one batched
  // forward pass of the sequences that go on. An error fails the whole step (the sequences are
  // left unfinished; the caller decides). timings (optional) accumulate the step's breakdown.
  absl::Status Step(absl::Span<Sequence* const> batch, StepTimings* timings = nullptr,
                    double* sampling_seconds = nullptr);

  // With time_phases: thread-seconds of the in-process estimators' retrieval and kernel, and the
  // lines and bytes they read, since the last call (zero with attention nodes, whose estimators
  // run there). For benchmarks; call between steps.
  attention::AttentionRunner::PhaseStats TakeEstimatorPhaseStats();

  // Returns once the memory of every sequence finished so far has been given back (finished
  // sequences free their cache and shards on a thread of their own; benchmarks wait here so that
  // one run's freeing is not timed in the next).
  void DrainReleases();

  // Teacher-forced logits for every position of `tokens` ([n][n_vocab]); for evaluation and tests.
  absl::StatusOr<std::vector<float>> ScoreAll(const std::vector<int32_t>& tokens);

 private:
  Engine() = default;
  // avoid: indices of attention nodes that failed for this sequence (left out of its placement).
  absl::Status SetUpSparseAttention(const SparseAttentionOptions& attention, Sequence& seq,
                                    const std::vector<int>& avoid = {});
  // After an attention node failed for seq: drops its shards (releasing what the nodes that still
  // answer hold) and its cache, and sets up fresh ones that leave out every node that failed for
  // it. The caller fills them again.
  absl::Status PlaceAgain(const SparseAttentionOptions& attention, Sequence& seq);
  // The attention options of seq's request.
  const SparseAttentionOptions& AttentionOf(const Sequence& seq) const;
  // Samples seq's next token, records it and its logprobs, runs the callbacks and finishes the
  // sequence when a stop condition holds. Returns true when the sequence goes on.
  bool SampleNext(Sequence& seq);
  // CheckKvBudget with the request's HostBytesFor already computed (Start charges it next).
  absl::Status CheckKvBudget(const GenerateRequest& request, int64_t host_need) const;

  std::unique_ptr<backend::Backend> backend_;
  // With a device backend: the CPU backend that attends sparse layers' static windows on the
  // host mirror of each sequence's cache (KvCache::EnsureHostMirror). Null otherwise.
  std::unique_ptr<backend::Backend> window_backend_;
  KvAccounting kv_accounting_;
  int64_t gpu_kv_budget_ = 0;              // 0 or a host-memory backend: no cap
  int64_t host_kv_budget_ = 0;             // 0: no cap
  std::atomic<int64_t> host_reserved_{0};  // the live sequences' HostReservations
  // The memory gauges (null without a metrics registry).
  prometheus::Gauge* gpu_memory_in_use_ = nullptr;
  prometheus::Gauge* gpu_memory_total_ = nullptr;
  prometheus::Gauge* kv_gpu_bytes_ = nullptr;
  prometheus::Gauge* kv_host_bytes_ = nullptr;
  std::shared_ptr<const model::GgufFile> file_;
  std::unique_ptr<model::ModelWeights> weights_;
  std::unique_ptr<model::Tokenizer> tokenizer_;
  std::unique_ptr<model::ChatTemplate> chat_template_;
  std::unique_ptr<Transformer> transformer_;
  SparseAttentionOptions attention_;
  std::unique_ptr<attention::SimHash> hash_;               // when attention_.mode != kFull
  std::unique_ptr<attention::SpotlightHashes> spotlight_;  // with --spotlight-file
  std::unique_ptr<attention::AttentionRunner> attention_runner_;
  // The attention nodes; null: attention in this process (embedded).
  std::unique_ptr<remote::AttentionNodePool> node_pool_;
  // Rebuilds sequences whose attention node failed (sequence_recovery.h).
  std::unique_ptr<SequenceRecovery> recovery_;
  int64_t context_length_ = 0;
  int64_t prefill_chunk_ = 256;
  int num_threads_ = 0;
  PingPong ping_pong_ = PingPong::kAuto;
  remote::MicroBatchTuner micro_batch_tuner_;  // with PingPong::kAuto
  absl::Mutex mu_;
  // Frees finished sequences' caches and embedded shards off the decode step (declared last:
  // destroyed, and so drained, before the accounting and the runner those objects point to).
  BackgroundDeleter deleter_;
};

}  // namespace magicpig::engine

#endif  // MAGICPIG_GPU_NODE_ENGINE_ENGINE_H_
