// The sparse attention router: per sequence, the compute-node side of MagicPIG decoding
// (docs/architecture.md §3, §4.5, §7), over an AttentionShards that is either in this process
// (embedded mode) or on attention nodes.
//
// For every sparse layer (all but the dense layers, default {0, n_layer/2}) the prompt's keys
// [n_sinks, n - n_local) leave the exact path as layer-major prefill finishes the layer: per kv
// head they are centred with their mean c, hashed (the engine's SimHash) and handed to the shards,
// which build their tables. A decode step then attends exactly, on the compute side, to the static
// window (the sinks and [window_begin, pos]: the last n_local prompt tokens and every generated
// token) and asks the estimator for a partial over each shard; the parts merge by log-sum-exp.
// When the window outgrows window_budget tokens its oldest tokens (all but n_local) move into the
// shards' append segment (a project choice, docs/architecture.md §4.5; the reference never
// inserts).
//
// The shard partials use centred keys, so their lse is shifted back by scale * (q . c) before the
// merge; the static part uses the raw fp16 cache. A sparse layer whose offloaded region would hold
// fewer than min_offload_keys keys (short prompts) stays exact until it holds that many: below
// about 1.5K keys the sampled path's fixed costs per layer (the query hash, the window, the
// retrieval's bucket lookups) exceed exact attention over the whole region (docs/benchmarks.md).
//
// Where the offloaded rows live, and recovery from a lost attention node:
// - keep (embedded mode, evaluation): the compute node's fp16 cache still holds every position.
//   When the shards fail in a way they call recoverable, the router resets them, offloads every
//   layer again from that cache with the same centres, and retries the step: the same centred
//   keys and hash give the same sample sets, so generation continues with the same tokens.
// - release (attention nodes): once a layer's rows are on the shards the router gives their
//   memory in the compute node's cache back (KvCache::Release), so the compute node holds only the
//   dense layers and the static window. A recoverable failure is then returned, with
//   needs_rebuild() set, and the engine rebuilds the sequence from its token history
//   (docs/architecture.md §9.3: prefill of the prompt, replay of the generated tokens) on fresh
//   shards.
//
// Overlapped offload (SparseAttentionOptions::overlap_offload): OnLayerStored starts the layer's
// offload (copy, centring, hashing, the shards' table build) as a oneTBB task and returns, so that
// a prefill's next layer computes while this one's tables are built (a thread with nothing else
// to do takes the task, the others steal its parallel parts); the next call into the router, or
// WaitStored, waits for it and reports its status. At most one offload is in flight.
//
// Thread-safety: one router per sequence, used by one decode loop at a time; the shared SimHash is
// thread-safe. The in-flight offload touches only the shards, the offload scratch and the state it
// commits, which every other call reads after waiting for it.
#ifndef MAGICPIG_GPU_NODE_ENGINE_ATTENTION_ROUTER_H_
#define MAGICPIG_GPU_NODE_ENGINE_ATTENTION_ROUTER_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/attention/attention_shards.h"
#include "common/attention/estimator_registry.h"
#include "common/attention/key_sketch.h"
#include "common/attention/kv_shard.h"
#include "common/attention/partial_attention.h"
#include "common/attention/simhash.h"
#include "common/attention/spotlight_hash.h"
#include "gpu_node/backend/backend.h"
#include "gpu_node/engine/kv_cache.h"
#include "gpu_node/engine/transformer.h"
#include "gpu_node/model/model_config.h"
#include "tbb/task_group.h"

namespace magicpig::engine {

struct SparseAttentionOptions {
  // The decode estimator (common/attention/estimator_registry.h) and its parameters.
  attention::EstimatorKind mode = attention::EstimatorKind::kMagicPig;
  int lsh_k = static_cast<int>(attention::kLshK.default_value);
  int lsh_l = static_cast<int>(attention::kLshL.default_value);
  uint64_t lsh_seed = static_cast<uint64_t>(attention::kLshSeed.default_value);
  // Keys per head for budgeted estimators; 0: the estimator's budget rule.
  int64_t budget = attention::kBudget.default_value;
  attention::VAttentionParams vattention;
  // spotlight: the fraction of keys retrieved, and the trained hashes the engine loads at start
  // (the file is read once per engine; a request cannot name another).
  double spotlight_fraction = attention::kSpotFraction.default_value;
  int64_t spotlight_rerank = attention::kSpotRerank.default_value;
  std::string spotlight_file;
  // sketch: int8 principal coordinates per key (the shards' codes are sketch_dims / 2 words).
  int64_t sketch_dims = attention::kSketchDims.default_value;
  int64_t n_sinks = 4;
  int64_t n_local = 64;
  int64_t window_budget = 64 + 256;
  // A sparse layer stays exact until [n_sinks, n - n_local) holds this many keys (>= 1).
  int64_t min_offload_keys = kDefaultMinOffloadKeys;
  // Where decoding with SmolLM2 (d = 64) on 2 threads stops being slower with magicpig(10, 150)
  // than with exact attention (docs/benchmarks.md: 0.90x at 2K, 0.94x at 3K, 1.09x at 4K since the
  // exact decode kernel prefetches; 1536 before).
  static constexpr int64_t kDefaultMinOffloadKeys = 3072;
  std::vector<int64_t> dense_layers;  // empty: {0, n_layer / 2}
  attention::KvStorage storage = attention::KvStorage::kBf16;
  // The prompt region is stored in blocks of this many tokens (the last block also takes the
  // tokens that leave the static window later); each block is attended on its own and the blocks'
  // partials merge in position order, embedded and remote alike, so the arithmetic — hence the
  // tokens — does not depend on how blocks are spread over attention nodes. Each block costs L
  // bucket lookups per query head and step: at 64K keys, 4,096-key blocks made magicpig(10, 150)'s
  // step 1.3x slower than 16,384-key ones (docs/attention-core-bench.md), which were within 5% of
  // one unblocked shard; the sample sets do not depend on the block.
  int64_t shard_block = 16384;
  // Time the phases of every sparse decode step (SparseAttentionStats::phases); off, the router
  // reads no clock.
  bool time_phases = false;
  // Build a layer's shards while the next layer computes (see SparseAttentionRouter); false: in
  // OnLayerStored, before it returns.
  bool overlap_offload = true;
  // On a device backend, the prefill's offloaded keys centred and hashed on the device
  // (PlanOffloadCodes); false: on the host, as with a host-memory backend.
  bool device_key_codes = true;

  attention::EstimatorParams estimator_params() const {
    return {.lsh_k = lsh_k,
            .lsh_l = lsh_l,
            .lsh_seed = lsh_seed,
            .budget = budget,
            .vattention = vattention,
            .spotlight_fraction = spotlight_fraction,
            .spotlight_rerank = spotlight_rerank};
  }
};

// How a sequence's shards hold the keys' codes: SimHash codes (K, L) of `options` in LSH tables, or
// for spotlight the learned codes of `spot` (16-bit words, L = bits / 16) kept whole.
struct ShardCodes {
  int k = 0;
  int l = 0;
  attention::KvIndex index = attention::KvIndex::kLshTables;
  // The hashes that make learned codes (the router's `spot`); null for SimHash codes and sketches.
  const attention::SpotlightHashes* spot = nullptr;
};
// FAILED_PRECONDITION for spotlight without hashes (spot null: no --spotlight-file);
// INVALID_ARGUMENT for sketch with an odd or out-of-range sketch_dims.
absl::StatusOr<ShardCodes> ShardCodesFor(const SparseAttentionOptions& options,
                                         const attention::SpotlightHashes* spot);

// dense[l]: layer l keeps exact attention (options.dense_layers, default {0, n_layer / 2}).
std::vector<bool> DenseLayers(int64_t n_layer, const SparseAttentionOptions& options);

// Whether a sparse layer holding n_tokens positions leaves the exact path: its offloaded region
// [n_sinks, n_tokens - n_local) holds at least min_offload_keys keys (and at least one). The
// router's rule, also the benchmark's byte model's.
bool RegionOffloads(const SparseAttentionOptions& options, int64_t n_tokens);

// Wall time of the phases of the sparse layers' decode attention, summed over layers and steps
// (only with SparseAttentionOptions::time_phases; zero otherwise).
struct AttentionPhaseSeconds {
  double hash = 0;    // the queries' SimHash codes
  double window = 0;  // exact attention over the static window (sinks, local, generated)
  double shards = 0;  // the shards' part: retrieval, gather and sampled attention (or the wait)
  double merge = 0;   // undoing the centring and the LSE merge of the two parts
  double total() const { return hash + window + shards + merge; }
};

// Keys one query head's estimator touched in one sparse decode step (all shards), counted in
// buckets with upper bounds 2^0 .. 2^24 keys and +Inf (the last): the realised per-head budgets of
// the adaptive estimators (vattention sizes its sample per head and step) and the sample sizes of
// the others. Exported as the magicpig_attention_keys_per_head histogram.
struct KeysPerHeadHistogram {
  static constexpr int kBuckets = 26;
  std::array<int64_t, kBuckets> counts{};
  double sum = 0;
  void Add(int64_t keys);
};

struct SparseAttentionStats {
  KeysPerHeadHistogram keys_per_head;
  int64_t keys_touched = 0;    // sum over sparse (layer, head, step) of keys the estimator used
  int64_t keys_offloaded = 0;  // sum over the same of the keys in the shards
  int64_t recoveries = 0;      // times the shards were rebuilt after a node failure
  AttentionPhaseSeconds phases;
};

class SparseAttentionRouter final : public LayerAttentionHook {
 public:
  // hash: d = head_dim, (K, L) of options; shards and backend outlive the router.
  // spot: for spotlight, the trained hashes that code the keys and queries instead of hash
  // (outlives the router); null otherwise.
  // kv: the sequence's cache (every layer), read again to re-offload after a shard failure; may be
  // null (then failures are returned as they are).
  // release_offloaded: give the offloaded rows' memory in kv back (see the file comment); kv must
  // be set, and recoverable failures are returned (needs_rebuild()) rather than repaired here.
  SparseAttentionRouter(const model::ModelConfig& config, const SparseAttentionOptions& options,
                        const attention::SimHash* hash, const attention::SpotlightHashes* spot,
                        attention::AttentionShards* shards, backend::Backend* backend,
                        KvCache* kv = nullptr, bool release_offloaded = false);
  // Waits for an offload in flight.
  ~SparseAttentionRouter() override;

  // Starts the layer's offload when its region reaches min_offload_keys or its window overflows;
  // with overlap_offload it runs on after the return (cache must stay valid and unchanged in
  // [0, n_tokens) until WaitStored or the next call).
  absl::Status OnLayerStored(int64_t layer, const backend::KvLayerView& cache,
                             int64_t n_tokens) override;
  // The status of the offload in flight, once it is done (OK when none was started).
  absl::Status WaitStored() override;
  absl::StatusOr<bool> Attend(int64_t layer, const float* q, int64_t pos,
                              const backend::KvLayerView& cache, float scale, float* out) override;
  // StartAttend hashes the query and hands the sampled part to the shards (StartAttend on them);
  // FlushStarted has them send it, then attends the static window (FinishAttend does, if
  // FlushStarted was not called, or if the shards attend in FinishAttend, i.e. in this process:
  // then the window and the shards run side by side, the window filling the threads that the
  // shards' few work items leave idle); FinishAttend waits for the shards (recovering from a lost
  // node as Attend does) and merges. q, cache and out must stay valid until FinishAttend.
  absl::StatusOr<bool> StartAttend(int64_t layer, const float* q, int64_t pos,
                                   const backend::KvLayerView& cache, float scale,
                                   float* out) override;
  void FlushStarted() override;
  absl::Status FinishAttend() override;
  // On a device backend: the query's codes and the static window are computed on the device
  // (hash_ and the sinks + [window_begin, pos] ranges); StartAttendWith takes them.
  // Dense layers stay exact: the router never reads their rows.
  bool AttendsLayer(int64_t layer) const override { return !IsDense(layer); }
  bool AttendsAt(int64_t layer, int64_t pos) override;
  bool ReadsRowsAt(int64_t layer, int64_t n_tokens) override;
  bool PlanDeviceWork(int64_t layer, int64_t pos, DeviceWork* work) override;
  // The first offload of a sparse layer at prefill, with SimHash codes (not learned codes or
  // sketches): the device computes the centre and the codes, the offload only copies and centres
  // the rows. Waits for the offload in flight (whose status it returns), since the plan's buffers
  // are the offload's.
  absl::StatusOr<bool> PlanOffloadCodes(int64_t layer, int64_t n_tokens,
                                        OffloadCodesPlan* plan) override;
  // [n_sinks, window_begin) of an offloaded sparse layer: on the shards from now on (the window
  // only moves forward, so these positions are never attended exactly again).
  std::pair<int64_t, int64_t> OffloadedPositions(int64_t layer) const override;
  absl::StatusOr<bool> StartAttendWith(int64_t layer, const float* q, int64_t pos,
                                       const backend::KvLayerView& cache, float scale, float* out,
                                       const DeviceResults& results) override;

  bool IsDense(int64_t layer) const;
  // Complete once WaitStored (or any call that waits) has returned: recoveries during an overlapped
  // offload are counted when it ends.
  const SparseAttentionStats& stats() const { return stats_; }
  // The statistics carried over from the router this one replaces (after a rebuild).
  void RestoreStats(const SparseAttentionStats& stats) { stats_ = stats; }
  // A shard failure was returned that a rebuild of the sequence can repair (release mode).
  bool needs_rebuild() const { return needs_rebuild_; }

 private:
  struct Layer {
    // Set by the offload when it completes:
    bool offloaded = false;
    std::vector<float> center;  // [n_kv][d]: mean offloaded key per kv head
    // sketch mode: one per kv head, fitted on the first offloaded region's centred keys and kept
    // for the sequence (the window's overflow and a recovery's re-offload reuse it).
    std::vector<attention::KeySketch> sketches;
    int64_t window_begin = 0;  // first position of the local part of the static window
    // Set when an offload starts: where the region on the shards ends once it completes (0: no
    // offload started). What OffloadedPositions reports while the offload may still run.
    int64_t offload_end = 0;
  };
  // Where the offload of a store that makes the layer n_tokens long begins (it ends at n_tokens -
  // n_local): n_sinks at the first offload (once the region holds min_offload_keys), window_begin
  // at a window overflow; nullopt when the store offloads nothing.
  std::optional<int64_t> OffloadBegin(const Layer& st, int64_t n_tokens) const;
  // Centres positions [begin, end) of every kv head with the layer's c (computed at the layer's
  // first offload), hashes them, hands them to the shards and commits the layer's state.
  // device_codes: the codes (and, at the layer's first offload, the centre) a device computed for
  // exactly this offload (PlanOffloadCodes); null: computed here.
  struct DeviceCodes {
    std::vector<float> centre;
    std::vector<uint16_t> codes;
  };
  absl::Status Offload(int64_t layer, const backend::KvLayerView& cache, int64_t begin, int64_t end,
                       const DeviceCodes* device_codes = nullptr);
  // Waits for the offload in flight, keeping its status for WaitStored.
  void JoinOffload();
  // After offload_layer_'s offload: if it failed, its offload_end back to what is committed;
  // else, in release mode, the offloaded rows' memory back to the system.
  void EndOffload();
  // After a recoverable shard failure: forget the shards and offload every layer's region again
  // from the cache, with the same centres (so the same codes and the same sample sets).
  absl::Status Recover();
  // Runs `op`; on a recoverable failure recovers and runs it once more (per failure, up to one
  // recovery per attention node).
  template <typename Op>
  absl::Status WithRecovery(Op op);
  // Whether failures are repaired here (keep mode with a cache).
  bool RecoversInPlace() const { return kv_ != nullptr && !release_offloaded_; }
  // Returns status, noting a failure that a rebuild would repair.
  absl::Status Note(absl::Status status);

  // Shard rebuilds per sequence before a failure is returned as it is.
  static constexpr int64_t kMaxRecoveries = 8;

  model::ModelConfig config_;
  SparseAttentionOptions options_;
  const attention::SimHash* hash_;
  const attention::SpotlightHashes* spot_;
  // The codes are key sketches (options_.mode's CodeSource::kKeySketch).
  const bool sketch_;
  attention::AttentionShards* shards_;
  backend::Backend* backend_;
  KvCache* kv_;
  bool release_offloaded_;
  bool needs_rebuild_ = false;
  std::vector<bool> dense_;
  std::vector<Layer> layers_;
  SparseAttentionStats stats_;
  // The step between StartAttend and FinishAttend.
  struct PendingStep {
    int64_t layer = 0;
    const float* q = nullptr;
    int64_t pos = 0;
    backend::KvLayerView cache;
    float scale = 0;
    float* out = nullptr;
    absl::Status start;        // what the shards' StartAttend returned
    bool window_done = false;  // static_o_ / static_lse_ hold the static window's part
  };
  PendingStep pending_;
  // Exact attention of the pending query over the static window into static_o_ / static_lse_,
  // once per step.
  void AttendStaticWindow();
  // The static window's ranges at pos: the sinks and [window_begin, pos].
  std::vector<std::pair<int64_t, int64_t>> WindowRanges(const Layer& st, int64_t pos) const;
  // StartAttend, with the codes (null: hash q here) and the window (null: attend it here).
  absl::StatusOr<bool> Start(int64_t layer, const float* q, int64_t pos,
                             const backend::KvLayerView& cache, float scale, float* out,
                             const DeviceResults* results);
  // Decode scratch.
  std::vector<float> static_o_, static_lse_, center_dot_;
  std::vector<uint16_t> codes_;
  std::vector<attention::PartialAttention> parts_;
  // Offload scratch (the offload in flight's alone).
  std::vector<float> keys_, values_;
  std::vector<uint16_t> key_codes_;
  // What PlanOffloadCodes asked the device for: its layer and range (layer -1: nothing planned),
  // and the results, read by the offload that OnLayerStored starts for that range.
  int64_t planned_layer_ = -1, planned_begin_ = 0, planned_end_ = 0;
  DeviceCodes device_codes_;
  // The offload in flight (overlap_offload): its task, whether one was started and not yet
  // joined, its layer and first position, and its status once joined (until WaitStored reports
  // it).
  // (Held by pointer: task_group's destructor may throw, which a hook's destructor may not.)
  std::unique_ptr<tbb::task_group> offload_task_ = std::make_unique<tbb::task_group>();
  bool offload_started_ = false;
  int64_t offload_layer_ = 0, offload_begin_ = 0;
  absl::Status offload_status_;
};

}  // namespace magicpig::engine

#endif  // MAGICPIG_GPU_NODE_ENGINE_ATTENTION_ROUTER_H_
