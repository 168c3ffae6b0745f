// ShardStore: the attention node's sequences and their KV shards, with memory admission
// (docs/architecture.md §8, §9.2). The gRPC service (attention_service.h) is a thin shell over it;
// it speaks no proto, so an in-process caller can drive it directly.
//
// A sequence (SequenceSpec) holds one contiguous token range [token_begin, token_begin +
// max_tokens) of a sequence of some compute node, for a set of sparse layers; per layer and kv
// head it holds one KvShard (centred keys, values, norms, LSH tables), created by the first
// committed append of that layer and grown by AppendWithCodes afterwards.
//
// Appends are two-phase: Stage checks one chunk against the sequence (NOT_FOUND, INVALID_ARGUMENT
// naming the field, RESOURCE_EXHAUSTED past max_tokens) and keeps its decoded rows in an
// AppendStaging; Commit applies every staged chunk at once, or none of them: it re-checks them
// under the sequences' locks (another stream may have appended meanwhile), checks the node budget,
// builds the new shards' tables and only then changes anything.
//
// Memory: CreateSequence reserves EstimateSequenceBytes(spec) (the sequence at max_tokens) and
// refuses with RESOURCE_EXHAUSTED when reserved + estimate > budget. A sequence is charged
// max(reserved, actual) where actual = sum of its shards' KvShard::bytes(); memory_used_bytes is
// the sum of the charges. ReleaseSequence returns the charge (with what the log reports of the
// sequence: SequenceSummary).
//
// Owners: every sequence belongs to the identity that created it (SequenceSpec::owner: the
// service passes the caller's client-certificate subject, or its token on a plaintext node). Each
// owner has its own id space: a call naming another owner's sequence finds nothing and gets the
// same NOT_FOUND as for an id no one holds, so ids cannot be probed across owners. In-process
// callers that pass no owner all act as the owner "".
//
// Thread-safety: every method may be called concurrently from any thread. Commit and Attend run
// isolated oneTBB parallel loops (this_task_arena::isolate) in the CALLER's task arena (the service
// calls them from tasks enqueued in its own arena); they block until done, so call them from a
// worker, not an RPC reaction. Attend holds the sequences' locks shared, Commit exclusive (taken in
// id order, so a request touching several sequences cannot deadlock with another).
#ifndef MAGICPIG_ATTN_NODE_SERVICE_SHARD_STORE_H_
#define MAGICPIG_ATTN_NODE_SERVICE_SHARD_STORE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/attention/estimator_registry.h"
#include "common/attention/estimators.h"
#include "common/attention/kv_shard.h"
#include "tbb/enumerable_thread_specific.h"

namespace magicpig {

// Limits of the wire contract (attention.proto) checked by ValidateSequenceSpec and Stage.
inline constexpr int kMaxSequenceIdBytes = 128;
// Keys, values and queries must lie in [-kMaxAbsElement, kMaxAbsElement]. The compute node's cache
// is fp16 (|x| <= 65504; centring at most doubles that), and with elements this small no dot
// product over kMaxHeadDim elements overflows float, so every lse and output stays finite.
inline constexpr float kMaxAbsElement = 1e6f;
// Attention scales must lie in (0, kMaxAttentionScale]: models use 1/sqrt(head_dim) or a
// multiplier of that order; with elements and scale in bounds every logit stays finite
// (256 * 1e6 * 1e6 * 1e3 < FLT_MAX).
inline constexpr float kMaxAttentionScale = 1e3f;
inline constexpr int kMaxLayersPerSequence = 1024;
inline constexpr int kMaxLayerId = 65535;
inline constexpr int kMaxKvHeads = 256;
inline constexpr int kMaxGroup = 64;
inline constexpr int kMaxHeadDim = 256;
inline constexpr int kMaxChunkTokens = 4096;
inline constexpr int kMaxQueriesPerAttend = 4096;

// One sequence shard as admitted by CreateSequence (the proto's CreateSequenceRequest).
struct SequenceSpec {
  std::string id;  // 1 .. 128 bytes
  // Who created it (see the class comment); "" for in-process callers. Not part of the wire spec:
  // the service fills it from the call's credentials.
  std::string owner;
  // The compute node process that created it, as the caller names itself (metadata, free text):
  // its instance name (stable across its restarts) and this run's incarnation (fresh per start),
  // so that a restarted compute node can drop what its previous run left (ReleaseStale).
  std::string instance;
  std::string incarnation;
  std::vector<int32_t> layers;  // distinct, in [0, 65535], 1 .. 1024 of them
  int n_kv_heads = 0;           // 1 .. 256
  int group = 0;                // query heads per kv head, 1 .. 64
  int head_dim = 0;             // multiple of 16, 16 .. 256
  int lsh_k = 0;                // 1 .. 16
  int lsh_l = 0;                // 2 .. 512
  attention::KvStorage storage = attention::KvStorage::kBf16;
  attention::EstimatorKind estimator = attention::EstimatorKind::kMagicPig;
  int64_t budget = 0;  // keys per head for topk / oracle (>= 1 there, >= 0 otherwise)
  uint64_t seed = 0;   // oracle sampling's and vAttention's draw seed
  // vattention, vattention-lsh: checked (ValidateVAttentionParams) only for those.
  attention::VAttentionParams vattention;
  // spotlight, vattention-spotlight, sketch (codes kept whole): checked only for them.
  double spotlight_fraction = attention::kSpotFraction.default_value;
  int64_t spotlight_rerank = attention::kSpotRerank.default_value;
  int64_t token_begin = 0;  // >= 0
  int64_t max_tokens = 0;   // 1 .. INT32_MAX, token_begin + max_tokens <= INT64_MAX / 2
};

// OK, or INVALID_ARGUMENT naming the proto field ("sequence_id", "shape.head_dim", ...).
absl::Status ValidateSequenceSpec(const SequenceSpec& spec);

// Bytes reserved for `spec` at max_tokens, per (layer, kv head): keys + values (2 or 4 bytes per
// element by storage), 4-byte norms, L table indices per key and L * (2^K + 1) bucket offsets (2
// bytes each while max_tokens fits LshTables' 16-bit widths, else 4) and the d * 4-byte centre.
// Saturates at INT64_MAX.
int64_t EstimateSequenceBytes(const SequenceSpec& spec);

// One KvChunk as received (views into the message; see attention.proto for the layouts).
struct ChunkView {
  std::string_view owner;  // the caller (see ShardStore); "" for in-process callers
  std::string_view sequence_id;
  int32_t layer = 0;
  int64_t first_pos = 0;
  int32_t n_tokens = 0;
  std::string_view keys;    // float32 [n_kv_heads][n_tokens][head_dim]
  std::string_view values;  // float32 [n_kv_heads][n_tokens][head_dim]
  std::string_view codes;   // packed [n_kv_heads * n_tokens][L]
};

class ShardStore;
namespace service_internal {
struct StoredSequence;
struct StagedChunk;
}  // namespace service_internal

// The chunks of one AppendKV stream, decoded and checked, waiting for Commit. Owned by the
// caller; not thread-safe (one stream stages into it at a time).
//
// Its bytes count against the store's budget from Stage until Commit or destruction: a sequence is
// charged max(reserved, actual + staged), so staging first uses the sequence's own reservation and
// beyond it needs free budget; open upload streams cannot grow a node past its budget.
class AppendStaging {
 public:
  AppendStaging();
  AppendStaging(AppendStaging&&) noexcept;
  AppendStaging& operator=(AppendStaging&&) noexcept;
  ~AppendStaging();  // gives its bytes back to the store's staging count

  int64_t chunks() const;
  // Bytes of decoded rows held (keys, values and codes).
  int64_t bytes() const;

 private:
  friend class ShardStore;
  std::vector<service_internal::StagedChunk> chunks_;
  // Next expected first_pos per (sequence, layer index) staged so far.
  absl::flat_hash_map<std::pair<const service_internal::StoredSequence*, int>, int64_t> next_pos_;
  const ShardStore* store_ = nullptr;  // whose staging count holds bytes()
  // The bytes charged to each sequence for this staging (given back by the destructor).
  std::vector<std::pair<std::shared_ptr<service_internal::StoredSequence>, int64_t>> charged_;
  void GiveBack();
};

struct AppendResult {
  int64_t tokens = 0;  // tokens held per (layer, kv head) for the last chunk's layer
  int64_t bytes =
      0;  // bytes held by the last chunk's sequence (its shards' attention::KvShard::bytes())
};

// One query of an Attend request (views into the message).
struct QueryView {
  std::string_view sequence_id;
  std::string_view q;      // float32 [n_kv_heads * group][head_dim]
  std::string_view codes;  // packed [n_kv_heads * group][L]; required for magicpig only
};

// One sequence's partial result (the proto's SequencePartial).
struct SequencePartialResult {
  std::vector<float> o;  // [heads][head_dim], heads = n_kv_heads * group
  std::vector<float> lse;
  std::vector<int64_t> n_touched;
  int64_t n_keys = 0;
};

// One sequence as ReleaseSequence forgets it (or HeldSequences finds it), for the node's log.
struct SequenceSummary {
  std::string id;
  std::string owner;
  int layers = 0;            // layers in its shape
  int64_t tokens = 0;        // tokens held by its fullest layer
  int64_t attend_calls = 0;  // Attend queries answered for it
  int64_t bytes = 0;         // its charge, max(reserved, actual): what ReleaseSequence frees
  int64_t lifetime_ms = 0;   // since CreateSequence admitted it
};

struct StoreStats {
  int64_t memory_budget_bytes = 0;
  int64_t memory_used_bytes = 0;    // sum over sequences of max(reserved, actual)
  int64_t memory_actual_bytes = 0;  // sum of the shards' attention::KvShard::bytes()
  // memory_actual_bytes split: LSH tables and pending codes (KvShard::table_bytes()), and the rest
  // (keys, values, norms, centers): kv_bytes + table_bytes == memory_actual_bytes.
  int64_t kv_bytes = 0;
  int64_t table_bytes = 0;
  // Tokens held, summed over sequences; a sequence's count is that of its fullest layer.
  int64_t kv_tokens = 0;
  int32_t sequences = 0;
  bool draining = false;
  // Decoded rows of AppendKV streams not yet committed; counted against the budget with
  // memory_used_bytes.
  int64_t staging_bytes = 0;
};

class ShardStore {
 public:
  // memory_budget_bytes >= 0: the most that admitted sequences may be charged together.
  explicit ShardStore(int64_t memory_budget_bytes);
  ~ShardStore();
  ShardStore(const ShardStore&) = delete;
  ShardStore& operator=(const ShardStore&) = delete;

  // Admits a sequence: INVALID_ARGUMENT (ValidateSequenceSpec), ALREADY_EXISTS for a known id,
  // UNAVAILABLE while draining, RESOURCE_EXHAUSTED when used + EstimateSequenceBytes > budget.
  // Returns the bytes reserved.
  absl::StatusOr<int64_t> CreateSequence(const SequenceSpec& spec);

  // Forgets `owner`'s sequence `id` and returns its summary (bytes: the charge returned);
  // NOT_FOUND for an id that owner does not hold. Calls still using it finish on their own
  // reference.
  absl::StatusOr<SequenceSummary> ReleaseSequence(std::string_view id, std::string_view owner = {});

  // Releases every sequence of `owner` created by `instance` under an incarnation other than
  // `keep_incarnation` (what a restarted compute node's previous run left behind), as
  // ReleaseSequence would, and returns their summaries.
  std::vector<SequenceSummary> ReleaseStale(std::string_view owner, std::string_view instance,
                                            std::string_view keep_incarnation);

  // Decodes and checks one chunk (NOT_FOUND for an unknown sequence; INVALID_ARGUMENT naming the
  // field for a layer the sequence does not hold, n_tokens outside 1 .. 4096, first_pos not
  // contiguous with what the layer holds plus what `staging` already has for it, wrong byte
  // lengths of keys / values / codes, bad packed codes, non-finite keys or values;
  // RESOURCE_EXHAUSTED past the sequence's max_tokens, or when the decoded chunk would take the
  // admitted bytes plus everything staged past the node budget) and adds it to *staging. On
  // error *staging is unchanged.
  absl::Status Stage(const ChunkView& chunk, AppendStaging* staging) const;

  // Applies every chunk of *staging, or none: re-checks contiguity and max_tokens under the
  // sequences' locks (INVALID_ARGUMENT / RESOURCE_EXHAUSTED), NOT_FOUND if a sequence was released
  // since staging, RESOURCE_EXHAUSTED if the charges would pass the node budget. A layer with no
  // keys yet gets its shards built from all its staged rows (KvShard::CreateFromCodes); a layer
  // with keys gets them appended (KvShard::AppendWithCodes). Empties *staging. An empty staging
  // returns {0, 0}.
  // (Locks are taken dynamically, in id order, hence no static analysis.)
  absl::StatusOr<AppendResult> Commit(AppendStaging* staging) ABSL_NO_THREAD_SAFETY_ANALYSIS;

  // Attends every query against `layer` of its sequence: for each kv head, the group's query
  // heads through the sequence's estimator (Estimator::AttendGroup). out[i] answers queries[i]; a
  // layer with no keys gives lse = -inf, o = 0, n_touched = 0. INVALID_ARGUMENT naming the field
  // for no queries or more than 4096, a non-finite or non-positive scale, a layer not in a
  // sequence's shape, wrong byte lengths of q / codes, non-finite q, missing codes for magicpig;
  // NOT_FOUND for a sequence `owner` does not hold (checked in query order, before any attention
  // runs). Each answered query adds one to its sequence's attend_calls (a relaxed atomic
  // increment).
  absl::Status Attend(int32_t layer, float scale, std::span<const QueryView> queries,
                      std::vector<SequencePartialResult>* out,
                      std::string_view owner = {}) ABSL_NO_THREAD_SAFETY_ANALYSIS;

  // Leases: every call that names a sequence (AppendKV chunks, Attend) renews it. Releases the
  // sequences not named since `now - ttl`, as ReleaseSequence would, and returns their summaries
  // (calls still using one finish on their own reference).
  std::vector<SequenceSummary> ReleaseIdle(
      std::chrono::nanoseconds ttl,
      std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now());

  // Stops admitting: CreateSequence returns UNAVAILABLE from now on. Other calls are unaffected.
  void StartDraining();
  bool draining() const;

  StoreStats Stats() const;
  // The summaries of the sequences held now, in id order (e.g. those a shutdown drops).
  std::vector<SequenceSummary> HeldSequences() const;
  int64_t memory_budget_bytes() const { return budget_; }

 private:
  using Sequence = service_internal::StoredSequence;
  // charged = max(reserved, actual + staged), summed into used_.
  struct Entry {
    std::shared_ptr<Sequence> seq;
    int64_t charged = 0;
    int64_t actual = 0;  // the shards' bytes as last recharged
    int64_t staged = 0;  // decoded AppendKV chunks not yet committed
  };

  // The map key of (owner, id): owners have separate id spaces.
  static std::string Key(std::string_view owner, std::string_view id);
  static std::string Key(const SequenceSpec& spec) { return Key(spec.owner, spec.id); }
  std::shared_ptr<Sequence> Find(std::string_view owner, std::string_view id) const;
  // Releases the sequences `doomed` picks (called under mu_: cheap, no locks) and returns their
  // summaries.
  std::vector<SequenceSummary> ReleaseWhere(const std::function<bool(const Sequence&)>& doomed);
  // Gives `bytes` of `seq`'s staging back (AppendStaging's destruction or reuse).
  friend class AppendStaging;
  void Unstage(const Sequence& seq, int64_t bytes) const;
  // Sets the store's charge for `seq` to max(reserved, actual + staged) if it is still admitted,
  // first checking (when check_budget) that the node budget allows the increase:
  // RESOURCE_EXHAUSTED.
  absl::Status Recharge(const Sequence& seq, int64_t actual, bool check_budget);

  const int64_t budget_;
  mutable absl::Mutex mu_;
  // Keyed by Key(owner, id).
  mutable std::map<std::string, Entry, std::less<>> sequences_ ABSL_GUARDED_BY(mu_);
  mutable int64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  // Bytes held by live AppendStaging objects, over all sequences (mutable: Stage is const).
  mutable int64_t staged_ ABSL_GUARDED_BY(mu_) = 0;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;

  // Per worker thread estimator scratch for Attend.
  tbb::enumerable_thread_specific<attention::EstimatorScratch> scratch_;
};

}  // namespace magicpig

#endif  // MAGICPIG_ATTN_NODE_SERVICE_SHARD_STORE_H_
