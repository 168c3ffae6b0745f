#include "attn_node/service/shard_store.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/attention/code_packing.h"
#include "common/attention/estimator_registry.h"
#include "common/attention/lsh_tables.h"
#include "common/status_macros.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"
#include "tbb/task_arena.h"

namespace magicpig {

using ::magicpig::attention::EmptyPartial;
using ::magicpig::attention::Estimator;
using ::magicpig::attention::EstimatorKind;
using ::magicpig::attention::EstimatorScratch;
using ::magicpig::attention::KvShard;
using ::magicpig::attention::KvStorage;
using ::magicpig::attention::LshTables;
using ::magicpig::attention::PartialAttention;
using ::magicpig::attention::UnpackCodes;

namespace service_internal {

// One admitted sequence. spec, reserved, estimator, layer_index and created are immutable after
// creation; the shards are guarded by mu (shared for Attend / Stage, exclusive for Commit);
// attend_calls is a counter of its own.
struct StoredSequence {
  struct Layer {
    int64_t tokens = 0;
    std::vector<std::unique_ptr<KvShard>> heads;  // [n_kv_heads] once the layer has keys
  };

  SequenceSpec spec;
  int64_t reserved = 0;
  std::unique_ptr<const Estimator> estimator;
  absl::flat_hash_map<int32_t, int> layer_index;  // layer id -> index into layers
  std::chrono::steady_clock::time_point created = std::chrono::steady_clock::now();
  std::atomic<int64_t> attend_calls{0};  // Attend queries answered (relaxed: a statistic)
  // The lease: when a call last named the sequence (steady clock, ns since its epoch).
  std::atomic<int64_t> last_used_ns{std::chrono::steady_clock::now().time_since_epoch().count()};

  mutable absl::Mutex mu;
  bool released ABSL_GUARDED_BY(mu) = false;
  std::vector<Layer> layers ABSL_GUARDED_BY(mu);
  int64_t actual ABSL_GUARDED_BY(mu) = 0;       // sum of the shards' bytes()
  int64_t table_bytes ABSL_GUARDED_BY(mu) = 0;  // sum of the shards' table_bytes()
};

struct StagedChunk {
  std::shared_ptr<StoredSequence> seq;
  int layer = 0;  // index into seq->layers
  int64_t first_pos = 0;
  int64_t n_tokens = 0;
  std::vector<float> keys;      // [n_kv_heads][n_tokens][d]
  std::vector<float> values;    // [n_kv_heads][n_tokens][d]
  std::vector<uint16_t> codes;  // [n_kv_heads][n_tokens][L]
};

}  // namespace service_internal

using service_internal::StagedChunk;
using service_internal::StoredSequence;

AppendStaging::AppendStaging() = default;

AppendStaging::AppendStaging(AppendStaging&& other) noexcept
    : chunks_(std::move(other.chunks_)),
      next_pos_(std::move(other.next_pos_)),
      store_(std::exchange(other.store_, nullptr)),
      charged_(std::move(other.charged_)) {
  other.charged_.clear();
}

AppendStaging& AppendStaging::operator=(AppendStaging&& other) noexcept {
  if (this != &other) {
    GiveBack();
    chunks_ = std::move(other.chunks_);
    next_pos_ = std::move(other.next_pos_);
    store_ = std::exchange(other.store_, nullptr);
    charged_ = std::move(other.charged_);
    other.charged_.clear();
  }
  return *this;
}

AppendStaging::~AppendStaging() { GiveBack(); }

void AppendStaging::GiveBack() {
  if (store_ != nullptr) {
    for (const auto& [seq, bytes] : charged_) store_->Unstage(*seq, bytes);
  }
  charged_.clear();
}

int64_t AppendStaging::bytes() const {
  int64_t total = 0;
  for (const auto& [seq, bytes] : charged_) total += bytes;
  return total;
}

int64_t AppendStaging::chunks() const { return static_cast<int64_t>(chunks_.size()); }

namespace {

// Abseil here has its own string_view (Debian builds it without the std alias).
absl::string_view Av(std::string_view s) { return absl::string_view(s.data(), s.size()); }

absl::Status Invalid(std::string_view field, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(Av(field), ": ", Av(what)));
}

// Per key and per (layer, kv head) bytes of a stored key beyond the fixed part (see
// EstimateSequenceBytes); pending codes (L * 2 bytes) are added for appends.
int64_t BytesPerKey(const SequenceSpec& s) {
  return attention::ShardBytesPerKey(s.head_dim, s.storage, s.lsh_l,
                                     attention::SpecOf(s.estimator).index, s.max_tokens);
}

int64_t FixedBytesPerShard(const SequenceSpec& s) {
  return attention::ShardFixedBytes(s.head_dim, s.lsh_k, s.lsh_l,
                                    attention::SpecOf(s.estimator).index, s.max_tokens);
}

// Copies n little-endian float32 values out of `bytes` (any alignment) and checks they are finite
// and within kMaxAbsElement.
absl::Status DecodeFloats(std::string_view bytes, int64_t n, std::string_view field,
                          std::vector<float>* out) {
  if (static_cast<int64_t>(bytes.size()) != n * 4) {
    return Invalid(
        field, absl::StrCat("expected ", n * 4, " bytes (", n, " float32), got ", bytes.size()));
  }
  out->resize(static_cast<size_t>(n));
  if (n > 0) std::memcpy(out->data(), bytes.data(), static_cast<size_t>(n) * 4);
  for (int64_t i = 0; i < n; ++i) {
    const float v = (*out)[static_cast<size_t>(i)];
    if (!std::isfinite(v)) return Invalid(field, absl::StrCat("element ", i, " is not finite"));
    if (std::fabs(v) > kMaxAbsElement) {
      return Invalid(field, absl::StrCat("element ", i, " = ", v, " is outside [-", kMaxAbsElement,
                                         ", ", kMaxAbsElement, "]"));
    }
  }
  return absl::OkStatus();
}

absl::Status DecodeCodes(std::string_view bytes, int64_t count, int k, std::string_view field,
                         std::vector<uint16_t>* out) {
  out->resize(static_cast<size_t>(count));
  absl::Status s = UnpackCodes(bytes, count, k, out->data());
  if (!s.ok()) return Invalid(field, std::string(s.message()));
  return absl::OkStatus();
}

// Locks the distinct sequences of `seqs` in id order (shared or exclusive); unlocks on
// destruction.
class SequenceLocks {
 public:
  SequenceLocks(std::vector<StoredSequence*> seqs, bool exclusive) ABSL_NO_THREAD_SAFETY_ANALYSIS
      : seqs_(std::move(seqs)),
        exclusive_(exclusive) {
    std::sort(seqs_.begin(), seqs_.end(), [](const StoredSequence* a, const StoredSequence* b) {
      return a->spec.id != b->spec.id ? a->spec.id < b->spec.id : a < b;
    });
    seqs_.erase(std::unique(seqs_.begin(), seqs_.end()), seqs_.end());
    for (StoredSequence* s : seqs_) {
      if (exclusive_) {
        s->mu.Lock();
      } else {
        s->mu.ReaderLock();
      }
    }
  }
  ~SequenceLocks() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    for (auto it = seqs_.rbegin(); it != seqs_.rend(); ++it) {
      if (exclusive_) {
        (*it)->mu.Unlock();
      } else {
        (*it)->mu.ReaderUnlock();
      }
    }
  }
  SequenceLocks(const SequenceLocks&) = delete;
  SequenceLocks& operator=(const SequenceLocks&) = delete;

  const std::vector<StoredSequence*>& sequences() const { return seqs_; }

 private:
  std::vector<StoredSequence*> seqs_;
  bool exclusive_;
};

// seq.layers for code that holds seq.mu through SequenceLocks (invisible to the analysis).
std::vector<StoredSequence::Layer>& LayersOf(StoredSequence& seq) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  return seq.layers;
}

// tbb::parallel_for over [0, n) in grains of 1, isolated (this_task_arena::isolate): a thread
// waiting inside it must not pick up another store task enqueued in the same arena (an Attend or
// Commit) that would block on the sequence locks the caller holds.
template <typename Body>
void IsolatedParallelFor(size_t n, const Body& body) {
  tbb::this_task_arena::isolate(
      [&] { tbb::parallel_for(tbb::blocked_range<size_t>(0, n, 1), body); });
}

int64_t ShardBytes(StoredSequence& seq) {
  int64_t total = 0;
  for (const auto& layer : LayersOf(seq)) {
    for (const auto& shard : layer.heads) total += shard ? shard->bytes() : 0;
  }
  return total;
}

int64_t ShardTableBytes(StoredSequence& seq) {
  int64_t total = 0;
  for (const auto& layer : LayersOf(seq)) {
    for (const auto& shard : layer.heads) total += shard ? shard->table_bytes() : 0;
  }
  return total;
}

}  // namespace

absl::Status ValidateSequenceSpec(const SequenceSpec& s) {
  if (s.id.empty() || s.id.size() > kMaxSequenceIdBytes) {
    return Invalid("sequence_id", absl::StrCat("length must be 1 .. ", kMaxSequenceIdBytes,
                                               ", got ", s.id.size()));
  }
  if (s.layers.empty() || s.layers.size() > kMaxLayersPerSequence) {
    return Invalid("shape.layers", absl::StrCat("must hold 1 .. ", kMaxLayersPerSequence,
                                                " layers, got ", s.layers.size()));
  }
  std::vector<int32_t> sorted = s.layers;
  std::sort(sorted.begin(), sorted.end());
  if (sorted.front() < 0 || sorted.back() > kMaxLayerId) {
    return Invalid("shape.layers", absl::StrCat("layer ids must be in [0, ", kMaxLayerId, "]"));
  }
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return Invalid("shape.layers", "layer ids must be distinct");
  }
  auto range = [](std::string_view field, int64_t v, int64_t lo, int64_t hi) {
    return v < lo || v > hi
               ? Invalid(field, absl::StrCat("must be in [", lo, ", ", hi, "], got ", v))
               : absl::OkStatus();
  };
  absl::Status st;
  if (!(st = range("shape.n_kv_heads", s.n_kv_heads, 1, kMaxKvHeads)).ok()) return st;
  if (!(st = range("shape.group", s.group, 1, kMaxGroup)).ok()) return st;
  if (!(st = range("shape.head_dim", s.head_dim, 16, kMaxHeadDim)).ok()) return st;
  if (s.head_dim % 16 != 0) {
    return Invalid("shape.head_dim", absl::StrCat("must be a multiple of 16, got ", s.head_dim));
  }
  if (!(st = attention::kLshK.Check(s.lsh_k, "shape.lsh_k")).ok()) return st;
  if (!(st = attention::kLshL.Check(s.lsh_l, "shape.lsh_l")).ok()) return st;
  if (s.storage != KvStorage::kF32 && s.storage != KvStorage::kBf16) {
    return Invalid("shape.dtype", "unknown dtype");
  }
  // A budgeted estimator is built with the budget the compute node resolved (>= 1).
  const bool budgeted = attention::SpecOf(s.estimator).default_budget != nullptr;
  if (!(st = attention::kBudget.Check(s.budget, "shape.budget")).ok()) return st;
  if (budgeted && s.budget < 1) {
    return Invalid(
        "shape.budget",
        absl::StrCat("must be >= 1 for ", Av(attention::EstimatorName(s.estimator)), ", got 0"));
  }
  if (attention::SpecOf(s.estimator).verified &&
      !(st = attention::ValidateVAttentionParams(s.vattention, "shape.")).ok()) {
    return st;
  }
  if (attention::SpecOf(s.estimator).index == attention::KvIndex::kCodes &&
      (!(st = attention::kSpotFraction.Check(s.spotlight_fraction, "shape.spotlight_fraction"))
            .ok() ||
       !(st = attention::kSpotRerank.Check(s.spotlight_rerank, "shape.spotlight_rerank")).ok())) {
    return st;
  }
  if (!(st = range("token_begin", s.token_begin, 0, std::numeric_limits<int64_t>::max() / 2))
           .ok()) {
    return st;
  }
  return range("max_tokens", s.max_tokens, 1, std::numeric_limits<int32_t>::max());
}

int64_t EstimateSequenceBytes(const SequenceSpec& s) {
  const unsigned __int128 per_shard =
      static_cast<unsigned __int128>(std::max<int64_t>(s.max_tokens, 0)) * BytesPerKey(s) +
      FixedBytesPerShard(s);
  const unsigned __int128 total =
      per_shard * s.layers.size() * static_cast<unsigned __int128>(std::max(s.n_kv_heads, 0));
  const auto cap = static_cast<unsigned __int128>(std::numeric_limits<int64_t>::max());
  return static_cast<int64_t>(std::min(total, cap));
}

ShardStore::ShardStore(int64_t memory_budget_bytes)
    : budget_(std::max<int64_t>(memory_budget_bytes, 0)) {}

ShardStore::~ShardStore() = default;

absl::StatusOr<int64_t> ShardStore::CreateSequence(const SequenceSpec& spec) {
  if (absl::Status s = ValidateSequenceSpec(spec); !s.ok()) return s;
  const int64_t estimate = EstimateSequenceBytes(spec);
  auto seq = std::make_shared<StoredSequence>();
  // Admission checks; the caller holds mu_.
  auto admissible = [&]() -> absl::Status {
    if (draining_) return absl::UnavailableError("node is draining: not admitting sequences");
    if (sequences_.contains(Key(spec))) {
      return absl::AlreadyExistsError(absl::StrCat("sequence_id '", spec.id, "' already exists"));
    }
    if (estimate > budget_ - used_) {
      return absl::ResourceExhaustedError(absl::StrCat("sequence '", spec.id, "' needs ", estimate,
                                                       " bytes; node budget ", budget_, " bytes, ",
                                                       used_, " in use"));
    }
    return absl::OkStatus();
  };
  {
    // Cheap checks first, so a refused request builds nothing.
    absl::MutexLock lock(&mu_);
    MAGICPIG_RETURN_IF_ERROR(admissible());
  }
  seq->spec = spec;
  seq->reserved = estimate;
  // The compute node resolved the budget (>= 1 where the estimator takes one), so no offloaded
  // count is needed here.
  MAGICPIG_ASSIGN_OR_RETURN(
      seq->estimator,
      attention::MakeEstimator(
          spec.estimator,
          {.lsh_k = spec.lsh_k,
           .lsh_l = spec.lsh_l,
           .lsh_seed = spec.seed,
           .budget = spec.budget,
           .vattention = attention::SpecOf(spec.estimator).verified ? spec.vattention
                                                                    : attention::VAttentionParams{},
           .spotlight_fraction =
               attention::SpecOf(spec.estimator).index == attention::KvIndex::kCodes
                   ? spec.spotlight_fraction
                   : attention::kSpotFraction.default_value,
           .spotlight_rerank = attention::SpecOf(spec.estimator).index == attention::KvIndex::kCodes
                                   ? spec.spotlight_rerank
                                   : attention::kSpotRerank.default_value},
          /*offloaded_keys=*/0));
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    seq->layer_index.emplace(spec.layers[i], static_cast<int>(i));
  }
  {
    absl::MutexLock lock(&seq->mu);
    seq->layers.resize(spec.layers.size());
  }
  absl::MutexLock lock(&mu_);
  // Re-check: another call may have admitted meanwhile.
  MAGICPIG_RETURN_IF_ERROR(admissible());
  used_ += estimate;
  sequences_.emplace(Key(spec), Entry{std::move(seq), estimate});
  return estimate;
}

namespace {

// The summary of `seq` charged `charge` bytes; takes seq.mu shared.
SequenceSummary Summarize(const StoredSequence& seq, int64_t charge) {
  SequenceSummary s;
  s.id = seq.spec.id;
  s.owner = seq.spec.owner;
  s.layers = static_cast<int>(seq.spec.layers.size());
  s.attend_calls = seq.attend_calls.load(std::memory_order_relaxed);
  s.bytes = charge;
  s.lifetime_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - seq.created)
                      .count();
  absl::ReaderMutexLock lock(&seq.mu);
  for (const auto& layer : seq.layers) s.tokens = std::max(s.tokens, layer.tokens);
  return s;
}

}  // namespace

std::string ShardStore::Key(std::string_view owner, std::string_view id) {
  // The owner first, then a NUL (which no gRPC metadata value or certificate subject holds).
  std::string key(owner);
  key.push_back('\0');
  key.append(id);
  return key;
}

absl::StatusOr<SequenceSummary> ShardStore::ReleaseSequence(std::string_view id,
                                                            std::string_view owner) {
  std::shared_ptr<Sequence> seq;
  int64_t freed = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = sequences_.find(Key(owner, id));
    if (it == sequences_.end()) {
      return absl::NotFoundError(absl::StrCat("sequence_id '", Av(id), "' is not on this node"));
    }
    seq = std::move(it->second.seq);
    freed = it->second.charged;
    used_ -= freed;
    sequences_.erase(it);
  }
  {
    absl::MutexLock lock(&seq->mu);
    seq->released = true;
  }
  return Summarize(*seq, freed);
}

std::shared_ptr<ShardStore::Sequence> ShardStore::Find(std::string_view owner,
                                                       std::string_view id) const {
  const std::string key = Key(owner, id);
  absl::MutexLock lock(&mu_);
  auto it = sequences_.find(key);
  if (it == sequences_.end()) return nullptr;
  // Every call that names the sequence renews its lease (ReleaseIdle).
  it->second.seq->last_used_ns.store(std::chrono::steady_clock::now().time_since_epoch().count(),
                                     std::memory_order_relaxed);
  return it->second.seq;
}

std::vector<SequenceSummary> ShardStore::ReleaseIdle(std::chrono::nanoseconds ttl,
                                                     std::chrono::steady_clock::time_point now) {
  const int64_t cutoff = (now - ttl).time_since_epoch().count();
  return ReleaseWhere([cutoff](const Sequence& seq) {
    return seq.last_used_ns.load(std::memory_order_relaxed) < cutoff;
  });
}

std::vector<SequenceSummary> ShardStore::ReleaseStale(std::string_view owner,
                                                      std::string_view instance,
                                                      std::string_view keep_incarnation) {
  return ReleaseWhere([&](const Sequence& seq) {
    return seq.spec.owner == owner && seq.spec.instance == instance &&
           seq.spec.incarnation != keep_incarnation;
  });
}

std::vector<SequenceSummary> ShardStore::ReleaseWhere(
    const std::function<bool(const Sequence&)>& doomed) {
  std::vector<std::pair<std::shared_ptr<Sequence>, int64_t>> released;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = sequences_.begin(); it != sequences_.end();) {
      if (!doomed(*it->second.seq)) {
        ++it;
        continue;
      }
      used_ -= it->second.charged;
      released.emplace_back(std::move(it->second.seq), it->second.charged);
      it = sequences_.erase(it);
    }
  }
  std::vector<SequenceSummary> out;
  for (auto& [seq, charge] : released) {
    {
      absl::MutexLock lock(&seq->mu);
      seq->released = true;
    }
    out.push_back(Summarize(*seq, charge));
  }
  return out;
}

absl::Status ShardStore::Recharge(const Sequence& seq, int64_t actual, bool check_budget) {
  absl::MutexLock lock(&mu_);
  auto it = sequences_.find(Key(seq.spec));
  if (it == sequences_.end() || it->second.seq.get() != &seq) return absl::OkStatus();
  const int64_t charge = std::max(seq.reserved, actual + it->second.staged);
  const int64_t delta = charge - it->second.charged;
  if (check_budget && delta > 0 && delta > budget_ - used_) {
    return absl::ResourceExhaustedError(absl::StrCat("sequence '", seq.spec.id, "' would grow to ",
                                                     charge, " bytes; node budget ", budget_,
                                                     " bytes, ", used_, " in use"));
  }
  used_ += delta;
  it->second.charged = charge;
  it->second.actual = actual;
  return absl::OkStatus();
}

absl::Status ShardStore::Stage(const ChunkView& c, AppendStaging* staging) const {
  std::shared_ptr<Sequence> seq = Find(c.owner, c.sequence_id);
  if (seq == nullptr) {
    if (c.sequence_id.empty() || c.sequence_id.size() > kMaxSequenceIdBytes) {
      return Invalid("KvChunk.sequence_id",
                     absl::StrCat("length must be 1 .. ", kMaxSequenceIdBytes, ", got ",
                                  c.sequence_id.size()));
    }
    return absl::NotFoundError(
        absl::StrCat("KvChunk.sequence_id '", Av(c.sequence_id), "' is not on this node"));
  }
  const SequenceSpec& s = seq->spec;
  auto layer_it = seq->layer_index.find(c.layer);
  if (layer_it == seq->layer_index.end()) {
    return Invalid("KvChunk.layer", absl::StrCat("layer ", c.layer, " is not in sequence '", s.id,
                                                 "' (layers ", absl::StrJoin(s.layers, ","), ")"));
  }
  const int layer = layer_it->second;
  if (c.n_tokens < 1 || c.n_tokens > kMaxChunkTokens) {
    return Invalid("KvChunk.n_tokens",
                   absl::StrCat("must be in [1, ", kMaxChunkTokens, "], got ", c.n_tokens));
  }
  int64_t expected_pos;
  if (auto it = staging->next_pos_.find({seq.get(), layer}); it != staging->next_pos_.end()) {
    expected_pos = it->second;
  } else {
    absl::ReaderMutexLock lock(&seq->mu);
    expected_pos = s.token_begin + seq->layers[static_cast<size_t>(layer)].tokens;
  }
  if (c.first_pos != expected_pos) {
    return Invalid("KvChunk.first_pos",
                   absl::StrCat("expected ", expected_pos, " (contiguous with layer ", c.layer,
                                " of sequence '", s.id, "'), got ", c.first_pos));
  }
  const int64_t held_after = expected_pos + c.n_tokens - s.token_begin;
  if (held_after > s.max_tokens) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KvChunk.n_tokens: layer ", c.layer, " of sequence '", s.id, "' would hold ",
                     held_after, " tokens, more than its max_tokens ", s.max_tokens));
  }
  const int64_t rows = int64_t{s.n_kv_heads} * c.n_tokens;
  // What the decoded chunk will hold (float32 keys and values, 16-bit codes), counted against the
  // budget before anything is decoded.
  const int64_t chunk_bytes = rows * s.head_dim * 2 * static_cast<int64_t>(sizeof(float)) +
                              rows * s.lsh_l * static_cast<int64_t>(sizeof(uint16_t));
  {
    absl::MutexLock lock(&mu_);
    auto it = sequences_.find(Key(s));
    if (it == sequences_.end() || it->second.seq != seq) {
      return absl::NotFoundError(
          absl::StrCat("KvChunk.sequence_id '", Av(c.sequence_id), "' is not on this node"));
    }
    Entry& e = it->second;
    const int64_t charge = std::max(seq->reserved, e.actual + e.staged + chunk_bytes);
    const int64_t delta = charge - e.charged;
    if (delta > 0 && delta > budget_ - used_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("AppendKV staging: a chunk of ", chunk_bytes, " bytes for sequence '", s.id,
                       "' would pass the node budget of ", budget_, " bytes (", used_, " charged, ",
                       staged_, " of it staged)"));
    }
    used_ += delta;
    e.charged = charge;
    e.staged += chunk_bytes;
    staged_ += chunk_bytes;
  }
  bool kept = false;
  struct Unreserve {
    const ShardStore* store;
    const Sequence* seq;
    int64_t bytes;
    const bool* kept;
    ~Unreserve() {
      if (!*kept) store->Unstage(*seq, bytes);
    }
  } unreserve{this, seq.get(), chunk_bytes, &kept};
  StagedChunk chunk;
  chunk.seq = seq;
  chunk.layer = layer;
  chunk.first_pos = c.first_pos;
  chunk.n_tokens = c.n_tokens;
  if (absl::Status st = DecodeFloats(c.keys, rows * s.head_dim, "KvChunk.keys", &chunk.keys);
      !st.ok()) {
    return st;
  }
  if (absl::Status st = DecodeFloats(c.values, rows * s.head_dim, "KvChunk.values", &chunk.values);
      !st.ok()) {
    return st;
  }
  if (absl::Status st =
          DecodeCodes(c.codes, rows * s.lsh_l, s.lsh_k, "KvChunk.codes", &chunk.codes);
      !st.ok()) {
    return st;
  }
  if (staging->store_ != nullptr && staging->store_ != this) {
    return absl::InternalError("an AppendStaging was used with two stores");
  }
  staging->store_ = this;
  staging->charged_.emplace_back(seq, chunk_bytes);
  kept = true;
  staging->next_pos_[{seq.get(), layer}] = c.first_pos + c.n_tokens;
  staging->chunks_.push_back(std::move(chunk));
  return absl::OkStatus();
}

absl::StatusOr<AppendResult> ShardStore::Commit(AppendStaging* staging) {
  std::vector<StagedChunk> chunks = std::move(staging->chunks_);
  *staging = AppendStaging();
  if (chunks.empty()) return AppendResult{};

  // The (sequence, layer) groups in first-appearance order; chunks keep their stream order.
  struct Group {
    StoredSequence* seq = nullptr;
    int layer = 0;
    std::vector<const StagedChunk*> chunks;
    int64_t tokens = 0;
    bool fresh = false;                           // the layer has no keys: build its shards
    std::vector<std::unique_ptr<KvShard>> built;  // [n_kv_heads] for a layer without keys
    std::vector<absl::Status> status;             // [n_kv_heads]
  };
  std::vector<Group> groups;
  absl::flat_hash_map<std::pair<const StoredSequence*, int>, size_t> group_of;
  std::vector<StoredSequence*> seqs;
  for (const StagedChunk& c : chunks) {
    auto [it, inserted] = group_of.try_emplace({c.seq.get(), c.layer}, groups.size());
    if (inserted) {
      Group g;
      g.seq = c.seq.get();
      g.layer = c.layer;
      groups.push_back(std::move(g));
      seqs.push_back(c.seq.get());
    }
    Group& g = groups[it->second];
    g.chunks.push_back(&c);
    g.tokens += c.n_tokens;
  }

  SequenceLocks locks(seqs, /*exclusive=*/true);
  // 1. Re-check under the locks: nothing has been changed yet.
  for (StoredSequence* seq : locks.sequences()) {
    if (seq->released) {
      return absl::NotFoundError(
          absl::StrCat("KvChunk.sequence_id '", seq->spec.id, "' was released"));
    }
  }
  for (Group& g : groups) {
    const SequenceSpec& s = g.seq->spec;
    const auto& layer = g.seq->layers[static_cast<size_t>(g.layer)];
    g.fresh = layer.heads.empty();
    int64_t pos = s.token_begin + layer.tokens;
    for (const StagedChunk* c : g.chunks) {
      if (c->first_pos != pos) {
        return Invalid("KvChunk.first_pos",
                       absl::StrCat("expected ", pos, " (contiguous with layer ",
                                    s.layers[static_cast<size_t>(g.layer)], " of sequence '", s.id,
                                    "', appended to by another stream), got ", c->first_pos));
      }
      pos += c->n_tokens;
    }
    if (layer.tokens + g.tokens > s.max_tokens) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "KvChunk.n_tokens: sequence '", s.id, "' would hold ", layer.tokens + g.tokens,
          " tokens, more than its max_tokens ", s.max_tokens));
    }
  }
  // 2. Charge the projected growth against the node budget (undone on failure).
  std::vector<std::pair<StoredSequence*, int64_t>> charged;  // (sequence, actual before)
  auto undo_charges = absl::MakeCleanup([&] {
    for (auto& [seq, before] : charged) (void)Recharge(*seq, before, /*check_budget=*/false);
  });
  for (StoredSequence* seq : locks.sequences()) {
    const SequenceSpec& s = seq->spec;
    int64_t projected = seq->actual;
    for (const Group& g : groups) {
      if (g.seq != seq) continue;
      projected += g.tokens * s.n_kv_heads * (BytesPerKey(s) + int64_t{s.lsh_l} * 2);
      if (g.fresh) {
        projected += FixedBytesPerShard(s) * s.n_kv_heads;
      }
    }
    if (absl::Status st = Recharge(*seq, projected, /*check_budget=*/true); !st.ok()) return st;
    charged.emplace_back(seq, seq->actual);
  }

  // 3. Build the shards of layers without keys, and validate appends, in parallel per
  // (group, kv head). Appends to existing shards run in phase 4 (they mutate).
  struct HeadWork {
    size_t group;
    int head;
  };
  std::vector<HeadWork> work;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    Group& g = groups[gi];
    const int heads = g.seq->spec.n_kv_heads;
    g.built.resize(static_cast<size_t>(heads));
    g.status.assign(static_cast<size_t>(heads), absl::OkStatus());
    for (int h = 0; h < heads; ++h) work.push_back({gi, h});
  }
  // Gathers one head's rows of a group into contiguous [tokens][d] / [tokens][L] arrays.
  auto gather = [](const Group& g, int h, std::vector<float>* keys, std::vector<float>* values,
                   std::vector<uint16_t>* codes) {
    const int64_t d = g.seq->spec.head_dim;
    const int64_t l = g.seq->spec.lsh_l;
    keys->clear();
    values->clear();
    codes->clear();
    keys->reserve(static_cast<size_t>(g.tokens * d));
    values->reserve(static_cast<size_t>(g.tokens * d));
    codes->reserve(static_cast<size_t>(g.tokens * l));
    for (const StagedChunk* c : g.chunks) {
      const int64_t n = c->n_tokens;
      keys->insert(keys->end(), c->keys.begin() + h * n * d, c->keys.begin() + (h + 1) * n * d);
      values->insert(values->end(), c->values.begin() + h * n * d,
                     c->values.begin() + (h + 1) * n * d);
      codes->insert(codes->end(), c->codes.begin() + h * n * l, c->codes.begin() + (h + 1) * n * l);
    }
  };
  auto run_heads = [&](bool build_phase) {
    IsolatedParallelFor(work.size(), [&](const tbb::blocked_range<size_t>& r) {
      std::vector<float> keys, values;
      std::vector<uint16_t> codes;
      for (size_t i = r.begin(); i < r.end(); ++i) {
        Group& g = groups[work[i].group];
        const int h = work[i].head;
        if (g.fresh != build_phase) continue;
        const SequenceSpec& s = g.seq->spec;
        gather(g, h, &keys, &values, &codes);
        if (g.fresh) {
          auto shard = KvShard::CreateFromCodes(s.head_dim, s.lsh_k, s.lsh_l, keys.data(),
                                                codes.data(), values.data(), g.tokens, s.storage,
                                                attention::SpecOf(s.estimator).index);
          if (shard.ok()) {
            // Room for every token the sequence may hold here, so later appends do not grow
            // (and transiently double) the row storage beyond the admitted reservation.
            shard->Reserve(s.max_tokens);
            g.built[static_cast<size_t>(h)] = std::make_unique<KvShard>(std::move(*shard));
          } else {
            g.status[static_cast<size_t>(h)] = shard.status();
          }
        } else {
          g.status[static_cast<size_t>(h)] =
              LayersOf(*g.seq)[static_cast<size_t>(g.layer)]
                  .heads[static_cast<size_t>(h)]
                  ->AppendWithCodes(keys.data(), codes.data(), values.data(), g.tokens);
        }
      }
    });
  };
  run_heads(/*build_phase=*/true);
  for (const Group& g : groups) {
    for (const absl::Status& st : g.status) {
      if (!st.ok()) {
        return absl::InternalError(
            absl::StrCat("building shards of sequence '", g.seq->spec.id, "': ", st.message()));
      }
    }
  }
  // 4. Apply: nothing below fails for checked input (codes < 2^K, sizes within max_tokens).
  std::move(undo_charges).Cancel();
  for (Group& g : groups) {
    if (g.fresh) g.seq->layers[static_cast<size_t>(g.layer)].heads = std::move(g.built);
  }
  run_heads(/*build_phase=*/false);
  absl::Status append_status;
  for (Group& g : groups) {
    g.seq->layers[static_cast<size_t>(g.layer)].tokens += g.tokens;
    for (const absl::Status& st : g.status) {
      if (!st.ok() && append_status.ok()) append_status = st;
    }
  }
  for (StoredSequence* seq : locks.sequences()) {
    seq->actual = ShardBytes(*seq);
    seq->table_bytes = ShardTableBytes(*seq);
    (void)Recharge(*seq, seq->actual, /*check_budget=*/false);
  }
  if (!append_status.ok()) {
    return absl::InternalError(absl::StrCat("appending: ", append_status.message()));
  }
  const Group& last = groups[group_of.at({chunks.back().seq.get(), chunks.back().layer})];
  AppendResult result;
  result.tokens = last.seq->layers[static_cast<size_t>(last.layer)].tokens;
  result.bytes = last.seq->actual;
  return result;
}

absl::Status ShardStore::Attend(int32_t layer, float scale, std::span<const QueryView> queries,
                                std::vector<SequencePartialResult>* out, std::string_view owner) {
  if (out == nullptr) return absl::InvalidArgumentError("Attend: null output");
  if (queries.empty() || queries.size() > kMaxQueriesPerAttend) {
    return Invalid("AttendRequest.queries", absl::StrCat("must hold 1 .. ", kMaxQueriesPerAttend,
                                                         " queries, got ", queries.size()));
  }
  if (!std::isfinite(scale) || !(scale > 0.0f) || scale > kMaxAttentionScale) {
    return Invalid("AttendRequest.scale",
                   absl::StrCat("must be in (0, ", kMaxAttentionScale, "], got ", scale));
  }
  struct Parsed {
    std::shared_ptr<Sequence> seq;
    int layer = 0;
    std::vector<float> q;                 // [heads][d]
    std::vector<uint16_t> codes;          // [heads][L] or empty
    std::vector<PartialAttention> parts;  // [heads]
  };
  std::vector<Parsed> parsed(queries.size());
  std::vector<StoredSequence*> seqs;
  for (size_t i = 0; i < queries.size(); ++i) {
    const QueryView& qv = queries[i];
    Parsed& p = parsed[i];
    const std::string field = absl::StrCat("AttendRequest.queries[", i, "]");
    p.seq = Find(owner, qv.sequence_id);
    if (p.seq == nullptr) {
      return absl::NotFoundError(
          absl::StrCat(field, ".sequence_id '", Av(qv.sequence_id), "' is not on this node"));
    }
    const SequenceSpec& s = p.seq->spec;
    auto it = p.seq->layer_index.find(layer);
    if (it == p.seq->layer_index.end()) {
      return Invalid("AttendRequest.layer",
                     absl::StrCat("layer ", layer, " is not in sequence '", s.id, "' (layers ",
                                  absl::StrJoin(s.layers, ","), ")"));
    }
    p.layer = it->second;
    const int64_t heads = int64_t{s.n_kv_heads} * s.group;
    if (absl::Status st = DecodeFloats(qv.q, heads * s.head_dim, field + ".q", &p.q); !st.ok()) {
      return st;
    }
    if (attention::SpecOf(s.estimator).retrieves || !qv.codes.empty()) {
      if (absl::Status st =
              DecodeCodes(qv.codes, heads * s.lsh_l, s.lsh_k, field + ".codes", &p.codes);
          !st.ok()) {
        return st;
      }
    }
    p.parts.resize(static_cast<size_t>(heads));
    seqs.push_back(p.seq.get());
  }

  SequenceLocks locks(seqs, /*exclusive=*/false);
  struct Item {
    Parsed* p;
    const KvShard* shard;
    int kv_head;
  };
  std::vector<Item> items;
  for (Parsed& p : parsed) {
    const SequenceSpec& s = p.seq->spec;
    for (auto& part : p.parts) part = EmptyPartial(s.head_dim);
    const auto& heads = LayersOf(*p.seq)[static_cast<size_t>(p.layer)].heads;
    for (int g = 0; g < static_cast<int>(heads.size()); ++g) {
      const KvShard* shard = heads[static_cast<size_t>(g)].get();
      if (shard != nullptr && shard->size() > 0) items.push_back({&p, shard, g});
    }
  }
  std::mutex error_mu;
  absl::Status first_error;
  std::atomic<bool> failed{false};
  IsolatedParallelFor(items.size(), [&](const tbb::blocked_range<size_t>& r) {
    EstimatorScratch& scratch = scratch_.local();
    for (size_t i = r.begin(); i < r.end(); ++i) {
      if (failed.load(std::memory_order_relaxed)) return;
      const Item& it = items[i];
      const SequenceSpec& s = it.p->seq->spec;
      const int64_t h0 = int64_t{it.kv_head} * s.group;
      absl::Status st = it.p->seq->estimator->AttendGroup(
          *it.shard, it.p->q.data() + h0 * s.head_dim,
          it.p->codes.empty() ? nullptr : it.p->codes.data() + h0 * s.lsh_l, s.group, scale,
          &scratch, it.p->parts.data() + h0);
      if (!st.ok()) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (first_error.ok()) first_error = st;
        failed = true;
        return;
      }
    }
  });
  if (!first_error.ok()) {
    return absl::InternalError(absl::StrCat("attention failed: ", first_error.message()));
  }
  out->clear();
  out->resize(parsed.size());
  for (size_t i = 0; i < parsed.size(); ++i) {
    const Parsed& p = parsed[i];
    const int64_t d = p.seq->spec.head_dim;
    SequencePartialResult& r = (*out)[i];
    r.o.assign(p.parts.size() * static_cast<size_t>(d), 0.0f);
    r.lse.resize(p.parts.size());
    r.n_touched.resize(p.parts.size());
    for (size_t h = 0; h < p.parts.size(); ++h) {
      const PartialAttention& part = p.parts[h];
      if (static_cast<int64_t>(part.o.size()) == d) {
        std::copy(part.o.begin(), part.o.end(), r.o.begin() + static_cast<int64_t>(h) * d);
      }
      r.lse[h] = part.lse;
      r.n_touched[h] = part.n_touched;
    }
    r.n_keys = LayersOf(*p.seq)[static_cast<size_t>(p.layer)].tokens;
    p.seq->attend_calls.fetch_add(1, std::memory_order_relaxed);
  }
  return absl::OkStatus();
}

void ShardStore::StartDraining() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
}

bool ShardStore::draining() const {
  absl::MutexLock lock(&mu_);
  return draining_;
}

void ShardStore::Unstage(const Sequence& seq, int64_t bytes) const {
  absl::MutexLock lock(&mu_);
  staged_ -= bytes;
  auto it = sequences_.find(Key(seq.spec));
  if (it == sequences_.end() || it->second.seq.get() != &seq) return;  // released: charge gone
  Entry& e = it->second;
  e.staged -= bytes;
  const int64_t charge = std::max(seq.reserved, e.actual + e.staged);
  used_ += charge - e.charged;
  e.charged = charge;
}

StoreStats ShardStore::Stats() const {
  std::vector<std::shared_ptr<Sequence>> seqs;
  StoreStats stats;
  {
    absl::MutexLock lock(&mu_);
    stats.memory_budget_bytes = budget_;
    stats.memory_used_bytes = used_;
    stats.staging_bytes = staged_;
    stats.sequences = static_cast<int32_t>(sequences_.size());
    stats.draining = draining_;
    for (const auto& [id, entry] : sequences_) seqs.push_back(entry.seq);
  }
  for (const auto& seq : seqs) {
    absl::ReaderMutexLock lock(&seq->mu);
    stats.memory_actual_bytes += seq->actual;
    stats.table_bytes += seq->table_bytes;
    int64_t tokens = 0;
    for (const auto& layer : seq->layers) tokens = std::max(tokens, layer.tokens);
    stats.kv_tokens += tokens;
  }
  stats.kv_bytes = stats.memory_actual_bytes - stats.table_bytes;
  return stats;
}

std::vector<SequenceSummary> ShardStore::HeldSequences() const {
  std::vector<std::pair<std::shared_ptr<Sequence>, int64_t>> held;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, entry] : sequences_) held.emplace_back(entry.seq, entry.charged);
  }
  std::vector<SequenceSummary> out;
  out.reserve(held.size());
  for (const auto& [seq, charged] : held) out.push_back(Summarize(*seq, charged));
  return out;
}

}  // namespace magicpig
