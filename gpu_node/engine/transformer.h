// Transformer: the forward pass of a llama/qwen2 decoder over a Backend.
//
// Forward() runs a chunk of tokens of one sequence at positions kv.size().. through every layer,
// layer-major: all tokens pass layer l (in sub-chunks of at most `max_chunk` tokens, so activation
// memory is bounded) before any token enters layer l+1. Attention is exact and causal over the
// sequence's KV cache. Decoding is the same call with one token.
//
// Activations and scratch live in the backend's memory (backend.h); on a device backend the logits
// are copied to the host once per call. Sparse attention hooks and on_qk read host memory: with a
// device backend, on_qk gets host copies, and a hooked sequence's cache must have a host mirror
// (KvCache::EnsureHostMirror): each stored row is copied there, hooks get the host q and the
// mirror, and their output is copied back to the device. (The sparse path's own device
// implementation, with hashing and the static window on the GPU, is issue #34's next part.)
//
// Thread-safety: one Forward at a time per Transformer (it owns scratch buffers).
#ifndef MAGICPIG_GPU_NODE_ENGINE_TRANSFORMER_H_
#define MAGICPIG_GPU_NODE_ENGINE_TRANSFORMER_H_

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "gpu_node/backend/backend.h"
#include "gpu_node/engine/kv_cache.h"
#include "gpu_node/model/model_weights.h"

namespace magicpig::engine {

enum class LogitsMode {
  kNone,  // no LM head (intermediate prefill chunks)
  kLast,  // logits of the last token only: [n_vocab]
  kAll,   // logits of every token: [n_tokens][n_vocab]
};

// Lets the attention of single-token steps be computed elsewhere (the MagicPIG router) and tells it
// when a layer's KV is in the cache.
class LayerAttentionHook {
 public:
  virtual ~LayerAttentionHook() = default;
  // After every chunk of a Forward call passed `layer`: positions [0, n_tokens) of the layer's
  // cache are filled. The hook may go on using them after the return, until WaitStored, which the
  // transformer calls before Forward returns (and right after OnLayerStored in a decode step).
  virtual absl::Status OnLayerStored(int64_t layer, const backend::KvLayerView& cache,
                                     int64_t n_tokens) = 0;
  // Waits for the work OnLayerStored left running and returns its status.
  virtual absl::Status WaitStored() { return absl::OkStatus(); }
  // A one-token step at position `pos` (its own KV already stored): returns true after writing the
  // attention output out [n_head][head_dim], or false to let the exact path run.
  virtual absl::StatusOr<bool> Attend(int64_t layer, const float* q, int64_t pos,
                                      const backend::KvLayerView& cache, float scale,
                                      float* out) = 0;
  // Attend in two halves for the micro-batch ping-pong: StartAttend may return true before `out`
  // is written (work handed to attention nodes), and then FinishAttend completes it; q, cache
  // and out stay valid in between. By default StartAttend is Attend and FinishAttend does
  // nothing.
  virtual absl::StatusOr<bool> StartAttend(int64_t layer, const float* q, int64_t pos,
                                           const backend::KvLayerView& cache, float scale,
                                           float* out) {
    return Attend(layer, q, pos, cache, scale, out);
  }
  // Called on every hook whose StartAttend returned true, once all of a micro-batch's slots have
  // started: sends work that StartAttend only queued, so the sequences' queries can travel to an
  // attention node as one message, then may do local work that overlaps the nodes' (the router's
  // static window). A failure is kept for FinishAttend to report.
  virtual void FlushStarted() {}
  virtual absl::Status FinishAttend() { return absl::OkStatus(); }

  // Whether the hook may attend `layer` or read its rows (false: the layer is always exact, and a
  // device backend need not copy its queries or rows to the host). Default: every layer.
  virtual bool AttendsLayer(int64_t layer) const { return true; }
  // Finer, for a device backend's one-token steps: whether StartAttend of `layer` at `pos` will
  // attend (return true). False: the layer runs exact on the device and its q is neither copied
  // to the host nor waited for. Default: AttendsLayer(layer).
  virtual bool AttendsAt(int64_t layer, int64_t pos) { return AttendsLayer(layer); }
  // Whether OnLayerStored(layer, ..., n_tokens) of a one-token step will read the layer's rows on
  // the host (an offload). False: the rows' copies to a device cache's host mirror may stay queued
  // until the backend's next wait (at the latest, the end of the step). Default:
  // AttendsLayer(layer).
  virtual bool ReadsRowsAt(int64_t layer, int64_t n_tokens) { return AttendsLayer(layer); }

  // On a device backend the transformer can do part of a one-token step's work where q and the
  // cache live: the hook says what (PlanDeviceWork), the transformer computes it and passes the
  // results, in host memory, to StartAttendWith instead of StartAttend.
  struct DeviceWork {
    const attention::SimHash* hash = nullptr;                // hash q's heads with it
    std::vector<std::pair<int64_t, int64_t>> window_ranges;  // attend q exactly over these rows
  };
  struct DeviceResults {
    const uint16_t* codes = nullptr;    // [n_head][L] codes of q's heads
    const float* window_o = nullptr;    // [n_head][head_dim] static-window output ...
    const float* window_lse = nullptr;  // ... and its lse ([n_head]), as Backend::RangeAttention
  };
  // A prefill's offload on a device backend: where its keys' SimHash codes are computed on the
  // device (Backend::OffloadKeyCodes with these arguments, queued before the layer's FlushCopies
  // and OnLayerStored) instead of on the host by the offload.
  struct OffloadCodesPlan {
    const attention::SimHash* hash = nullptr;
    int64_t begin = 0, end = 0;  // positions
    bool compute_centre = false;
    float* centre = nullptr;    // [n_head_kv][head_dim], host: written (compute_centre) or read
    uint16_t* codes = nullptr;  // [n_head_kv * (end - begin)][L], host
  };
  // Whether OnLayerStored(layer, ..., n_tokens) of a prefill will offload rows whose codes the
  // device should compute first (then `plan` says what). The hook owns the plan's buffers and
  // reads them in that OnLayerStored call. Default: false (the hook computes what it needs).
  virtual absl::StatusOr<bool> PlanOffloadCodes(int64_t layer, int64_t n_tokens,
                                                OffloadCodesPlan* plan) {
    return false;
  }
  // Positions of `layer` the hook holds elsewhere for good (the offloaded region on the shards),
  // which a device cache may drop after the prefill leaves the layer; empty (default) for none.
  virtual std::pair<int64_t, int64_t> OffloadedPositions(int64_t layer) const { return {0, 0}; }
  // Whether layer's step at pos is sparse here and, if so, what the device should compute.
  // Default: false (the hook does everything in StartAttend).
  virtual bool PlanDeviceWork(int64_t layer, int64_t pos, DeviceWork* work) { return false; }
  // StartAttend with the planned results (valid during the call only: copy what is kept).
  virtual absl::StatusOr<bool> StartAttendWith(int64_t layer, const float* q, int64_t pos,
                                               const backend::KvLayerView& cache, float scale,
                                               float* out, const DeviceResults& results) {
    return StartAttend(layer, q, pos, cache, scale, out);
  }
};

struct ForwardOptions {
  LogitsMode logits = LogitsMode::kLast;
  int64_t max_chunk = 256;
  // Called after each layer with (layer index, n_layer); for progress reporting.
  std::function<void(int64_t, int64_t)> on_layer_done;
  // Called in every layer after RoPE with (layer, first_pos, n_tokens, q [n][q_dim], k
  // [n][kv_dim]): the post-RoPE queries and keys of the chunk. For analysis tools (e.g. dumping
  // real keys/queries for the attention accuracy tests); must not keep the pointers.
  std::function<void(int64_t, int64_t, int64_t, const float*, const float*)> on_qk;
  // With LogitsMode::kAll: receives the logits in row blocks (first row, rows, [rows][n_vocab])
  // instead of `logits` holding all of them (which then holds only the last row's).
  std::function<void(int64_t, int64_t, const float*)> on_logits;
  // Optional sparse attention for decode steps (not owned).
  LayerAttentionHook* attention_hook = nullptr;
};

// One sequence's place in a batched decode step: its next token, its cache and (optionally) the
// hook that computes its attention.
struct DecodeItem {
  int32_t token = 0;
  KvCache* kv = nullptr;
  LayerAttentionHook* attention_hook = nullptr;
};

// Seconds spent in a batched step, split for the decode-step breakdown metric.
struct StepTimings {
  double attention = 0;  // KV store + exact or hooked attention, every layer
  // Of `attention`, on a device backend: the host blocked in the sparse layers' copies (the wait
  // for q, the codes and the window's part, which also waits for the device work queued before
  // them, and the copy of the merged output back). 0 on the CPU backend.
  double device_wait = 0;
  // Also of `attention`, host time in the sparse layers on a device backend (0 elsewhere):
  // queueing the device's share of the layer (the row mirror's and q's copies, the codes'
  // launches, the window's launches and copies), the hook's start (StartAttendWith,
  // FlushStarted) and its finish (FinishAttend: the shards' wait and the merge). With
  // device_wait they split the layer's time.
  double device_mirror = 0;
  double device_hash = 0;
  double device_window = 0;
  double hook_start = 0;
  double hook_finish = 0;
  double dense = 0;  // everything else of the forward pass (norms, products, LM head)
  // Of `dense`: the LM head and the logits' copy to the host, which on a device backend waits
  // for every operation queued before it, i.e. how far the device ran behind the host's launches
  // (near the LM head's own time when the host's launching bounds the step).
  double logits = 0;
  int micro_batches = 0;  // how Engine::Step ran the step: 1 batch or 2 micro-batches (0: none)
};

class Transformer {
 public:
  Transformer(const model::ModelWeights* weights, backend::Backend* backend);

  const model::ModelConfig& config() const { return weights_->config(); }

  // Hands every weight to the backend's Prepare calls (device backends copy them once here).
  // Call before the first Forward; a no-op for the CPU backend.
  absl::Status PrepareWeights();

  // Appends `tokens` to the sequence whose cache is `kv` and fills `logits` per options.logits.
  // INVALID_ARGUMENT for out-of-vocabulary ids; OUT_OF_RANGE if the cache would overflow.
  absl::Status Forward(absl::Span<const int32_t> tokens, KvCache& kv, const ForwardOptions& options,
                       std::vector<float>* logits);

  // One decode step of several sequences: item i appends items[i].token to its own cache at
  // position kv->size(). The dense products run once over the batch (the weights are read once);
  // the KV store and attention run per sequence. logits: [items.size()][n_vocab]. A batch of one
  // computes exactly what Forward does with one token.
  // micro_batches = 2 splits the batch in two halves whose attention and dense work alternate
  // (ping-pong), staggered by half a layer, so attention handed to attention nodes
  // (LayerAttentionHook::StartAttend) runs while the other half's post-attention products of this
  // layer and pre-attention products of the next do; each half then reads the weights once.
  absl::Status ForwardBatch(absl::Span<const DecodeItem> items, std::vector<float>* logits,
                            StepTimings* timings = nullptr, int micro_batches = 1);

 private:
  // A run of tokens of one sequence inside a layer step: rows [row, row + n) of the activations.
  struct Slot {
    KvCache* kv;
    int64_t first_pos;
    int64_t row;
    int64_t n;
    LayerAttentionHook* hook;
  };
  // A layer in two halves over rows [row, row + n) of the activations x (all rows): LayerPre runs
  // the norm, q/k/v products and RoPE, stores the slots' KV and starts their attention
  // (pending[i]: slot i's hook must still finish); LayerPost finishes it and runs the output
  // projection and the MLP.
  absl::Status LayerPre(int64_t layer, float* x, int64_t row, int64_t n,
                        absl::Span<const Slot> slots, const ForwardOptions* options,
                        std::vector<char>* pending, StepTimings* timings);
  absl::Status LayerPost(int64_t layer, float* x, int64_t row, int64_t n,
                         absl::Span<const Slot> slots, const std::vector<char>& pending,
                         StepTimings* timings);
  absl::Status ResizeScratch(int64_t rows);
  // positions_host_[0..n) -> positions_ (backend memory).
  absl::Status UploadPositions(int64_t n);
  // Computes a hook's planned device work for the one-token row `row` (q and cache on the device).
  absl::StatusOr<LayerAttentionHook::DeviceResults> DeviceWorkFor(
      const LayerAttentionHook::DeviceWork& work, int64_t row, const float* q,
      const backend::KvLayerView& cache, float scale, StepTimings* timings);
  // Copies rows [first, first + n) of `layer` from a device cache to its host mirror.
  absl::Status MirrorRows(int64_t layer, KvCache& kv, int64_t first, int64_t n);
  // Final norm and LM head over rows [0, n) of x into host logits ([n][n_vocab]).
  absl::Status Logits(const float* x, int64_t n, float* logits);

  const model::ModelWeights* weights_;
  backend::Backend* backend_;
  backend::RopeParams rope_;
  // Scratch in the backend's memory, sized to the largest chunk seen.
  backend::BackendBuffer norm_, q_, k_, v_, attn_, gate_, up_, positions_, x_batch_;
  int64_t scratch_rows_ = 0;
  std::vector<int32_t> positions_host_;
  // Host copies of q and k for on_qk when the backend's memory is not the host's.
  std::vector<float> q_host_, k_host_;
  // Host q and attention output of hooked decode rows on a device backend ([rows][q_dim]; valid
  // from StartAttend to FinishAttend).
  std::vector<float> hook_q_, hook_out_;
  // Device work for hooks (PlanDeviceWork): codes and window partials per row, on the host, and
  // the window partials on the device.
  std::vector<uint16_t> hook_codes_;
  std::vector<float> hook_window_o_, hook_window_lse_;
  backend::BackendBuffer window_o_, window_lse_;
  // The final norm's output and (device backends) the logits before they are copied out.
  backend::BackendBuffer logits_norm_, logits_out_;
};

}  // namespace magicpig::engine

#endif  // MAGICPIG_GPU_NODE_ENGINE_TRANSFORMER_H_
