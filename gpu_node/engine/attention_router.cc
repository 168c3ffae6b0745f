#include "gpu_node/engine/attention_router.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "tbb/parallel_invoke.h"

namespace magicpig::engine {
namespace {

// Adds the seconds since `*start` to `*sum` and restarts the clock; nothing when timing is off.
class PhaseClock {
 public:
  explicit PhaseClock(bool on) : on_(on) {
    if (on_) start_ = std::chrono::steady_clock::now();
  }
  void Lap(double* sum) {
    if (!on_) return;
    const auto now = std::chrono::steady_clock::now();
    *sum += std::chrono::duration<double>(now - start_).count();
    start_ = now;
  }

 private:
  const bool on_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

using ::magicpig::attention::AttentionShards;
using ::magicpig::attention::PartialAttention;
using ::magicpig::attention::SimHash;

void KeysPerHeadHistogram::Add(int64_t keys) {
  int b = 0;
  while (b < kBuckets - 1 && keys > (int64_t{1} << b)) ++b;
  ++counts[static_cast<size_t>(b)];
  sum += static_cast<double>(keys);
}

std::vector<bool> DenseLayers(int64_t n_layer, const SparseAttentionOptions& options) {
  std::vector<bool> dense(static_cast<size_t>(n_layer), false);
  std::vector<int64_t> list = options.dense_layers;
  if (list.empty()) list = {0, n_layer / 2};
  for (int64_t l : list) {
    if (l >= 0 && l < n_layer) dense[static_cast<size_t>(l)] = true;
  }
  return dense;
}

bool RegionOffloads(const SparseAttentionOptions& options, int64_t n_tokens) {
  return n_tokens - options.n_local - options.n_sinks >=
         std::max<int64_t>(1, options.min_offload_keys);
}

absl::StatusOr<ShardCodes> ShardCodesFor(const SparseAttentionOptions& options,
                                         const attention::SpotlightHashes* spot) {
  if (attention::SpecOf(options.mode).index == attention::KvIndex::kLshTables) {
    return ShardCodes{options.lsh_k, options.lsh_l, attention::KvIndex::kLshTables};
  }
  if (attention::SpecOf(options.mode).codes == attention::CodeSource::kKeySketch) {
    MAGICPIG_RETURN_IF_ERROR(attention::CheckSketchDims(options.sketch_dims, "--sketch-dims"));
    return ShardCodes{16, static_cast<int>(options.sketch_dims / 2), attention::KvIndex::kCodes};
  }
  if (spot == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("attention mode ", std::string(attention::EstimatorName(options.mode)),
                     " needs trained hashes: start with --spotlight-file FILE "
                     "(eval/spotlight/train.py makes one; docs/spotlight.md)"));
  }
  return ShardCodes{16, spot->words(), attention::KvIndex::kCodes, spot};
}

SparseAttentionRouter::SparseAttentionRouter(const model::ModelConfig& config,
                                             const SparseAttentionOptions& options,
                                             const SimHash* hash,
                                             const attention::SpotlightHashes* spot,
                                             AttentionShards* shards, backend::Backend* backend,
                                             KvCache* kv, bool release_offloaded)
    : config_(config),
      options_(options),
      hash_(hash),
      spot_(spot),
      sketch_(attention::SpecOf(options.mode).codes == attention::CodeSource::kKeySketch),
      shards_(shards),
      backend_(backend),
      kv_(kv),
      release_offloaded_(release_offloaded && kv != nullptr),
      dense_(DenseLayers(config.n_layer, options)),
      layers_(static_cast<size_t>(config.n_layer)) {}

bool SparseAttentionRouter::IsDense(int64_t layer) const {
  return dense_[static_cast<size_t>(layer)];
}

absl::Status SparseAttentionRouter::Offload(int64_t layer, const backend::KvLayerView& cache,
                                            int64_t begin, int64_t end,
                                            const DeviceCodes* device_codes) {
  Layer& st = layers_[static_cast<size_t>(layer)];
  const int64_t hd = config_.head_dim, n_kv = cache.n_head_kv, n = end - begin;
  keys_.resize(static_cast<size_t>(n_kv * n * hd));
  values_.resize(keys_.size());
  // c: the mean offloaded key of each kv head of this layer, computed at its first offload (by
  // the device when it hashed the keys: the same sums, so the same bits).
  const bool first = st.center.empty();
  if (first && device_codes != nullptr) st.center = device_codes->centre;
  if (st.center.empty()) st.center.assign(static_cast<size_t>(n_kv * hd), 0.0f);
  backend::CentredKeys(cache, begin, end, first && device_codes == nullptr, st.center.data(),
                       keys_.data(), values_.data());
  const uint16_t* codes = key_codes_.data();
  if (device_codes != nullptr) {
    codes = device_codes->codes.data();
  } else if (sketch_) {
    const int dims = static_cast<int>(options_.sketch_dims);
    if (st.sketches.empty()) {
      for (int64_t g = 0; g < n_kv; ++g) {
        MAGICPIG_ASSIGN_OR_RETURN(
            attention::KeySketch sketch,
            attention::KeySketch::Fit(keys_.data() + g * n * hd, n, hd, dims));
        st.sketches.push_back(std::move(sketch));
      }
    }
    const int64_t words = dims / 2;
    key_codes_.resize(static_cast<size_t>(n_kv * n * words));
    for (int64_t g = 0; g < n_kv; ++g) {
      st.sketches[static_cast<size_t>(g)].KeyCodes(keys_.data() + g * n * hd, n,
                                                   key_codes_.data() + g * n * words);
    }
  } else if (spot_ != nullptr) {
    // Learned codes: each kv head's keys through its own MLP.
    const int64_t words = spot_->words();
    key_codes_.resize(static_cast<size_t>(n_kv * n * words));
    for (int64_t g = 0; g < n_kv; ++g) {
      MAGICPIG_RETURN_IF_ERROR(spot_->KeyCodes(layer, g, keys_.data() + g * n * hd, n,
                                               key_codes_.data() + g * n * words));
    }
  } else {
    key_codes_.resize(static_cast<size_t>(n_kv * n * hash_->l()));
    MAGICPIG_RETURN_IF_ERROR(hash_->KeyCodes(keys_.data(), n_kv * n, hd, key_codes_.data()));
  }
  if (device_codes == nullptr) codes = key_codes_.data();  // the branches above may have grown it
  MAGICPIG_RETURN_IF_ERROR(shards_->Append(layer, begin, n, keys_.data(), values_.data(), codes));
  st.offloaded = true;
  st.window_begin = end;
  return absl::OkStatus();
}

absl::Status SparseAttentionRouter::Note(absl::Status status) {
  if (!status.ok() && shards_->IsRecoverable(status)) needs_rebuild_ = true;
  return status;
}

template <typename Op>
absl::Status SparseAttentionRouter::WithRecovery(Op op) {
  absl::Status status = op();
  while (!status.ok() && RecoversInPlace() && shards_->IsRecoverable(status) &&
         stats_.recoveries < kMaxRecoveries) {
    MAGICPIG_RETURN_IF_ERROR(Note(Recover()));
    status = op();
  }
  return Note(status);
}

absl::Status SparseAttentionRouter::Recover() {
  absl::Status status;
  do {  // another node may fail while the region is sent again
    ++stats_.recoveries;
    shards_->Reset();
    status = absl::OkStatus();
    for (int64_t l = 0; l < config_.n_layer && status.ok(); ++l) {
      const Layer& st = layers_[static_cast<size_t>(l)];
      if (st.offloaded) status = Offload(l, kv_->layer(l), options_.n_sinks, st.window_begin);
    }
  } while (!status.ok() && shards_->IsRecoverable(status) && stats_.recoveries < kMaxRecoveries);
  return status;
}

std::optional<int64_t> SparseAttentionRouter::OffloadBegin(const Layer& st,
                                                           int64_t n_tokens) const {
  if (!st.offloaded) {
    // Offload [n_sinks, n - n_local) once it holds min_offload_keys (at prefill for any long
    // prompt, else at the decode step that makes it that long).
    if (!RegionOffloads(options_, n_tokens)) return std::nullopt;
    return options_.n_sinks;
  }
  // Window overflow: its oldest tokens (all but the last n_local) join the append segment.
  if (n_tokens - st.window_begin > options_.window_budget) return st.window_begin;
  return std::nullopt;
}

absl::Status SparseAttentionRouter::OnLayerStored(int64_t layer, const backend::KvLayerView& cache,
                                                  int64_t n_tokens) {
  MAGICPIG_RETURN_IF_ERROR(WaitStored());
  if (IsDense(layer)) return absl::OkStatus();
  Layer& st = layers_[static_cast<size_t>(layer)];
  const std::optional<int64_t> first = OffloadBegin(st, n_tokens);
  if (!first.has_value()) return absl::OkStatus();
  const int64_t begin = *first;
  const int64_t end = n_tokens - options_.n_local;
  st.offload_end = end;
  // The device's codes, if PlanOffloadCodes asked for this very offload.
  const bool planned = planned_layer_ == layer && planned_begin_ == begin && planned_end_ == end;
  planned_layer_ = -1;
  const DeviceCodes* device_codes = planned ? &device_codes_ : nullptr;
  auto offload = [this, layer, cache, begin, end, device_codes] {
    return WithRecovery([&] { return Offload(layer, cache, begin, end, device_codes); });
  };
  offload_layer_ = layer;
  offload_begin_ = begin;
  if (!options_.overlap_offload) {
    offload_status_ = offload();
    EndOffload();
    return std::exchange(offload_status_, absl::OkStatus());
  }
  offload_started_ = true;
  offload_task_->run([this, offload] { offload_status_ = offload(); });
  return absl::OkStatus();
}

void SparseAttentionRouter::EndOffload() {
  Layer& st = layers_[static_cast<size_t>(offload_layer_)];
  if (!offload_status_.ok()) {
    // Nothing was committed: the region is where the last completed offload left it.
    st.offload_end = st.offloaded ? st.window_begin : 0;
    return;
  }
  // The shards have the rows (or will, before the next step attends: appends may be in flight;
  // they were copied out of the cache). Here, not in the offload's task: the cache is this
  // thread's.
  if (release_offloaded_) kv_->Release(offload_layer_, offload_begin_, st.window_begin);
}

void SparseAttentionRouter::JoinOffload() {
  if (!offload_started_) return;
  offload_task_->wait();
  offload_started_ = false;
  EndOffload();
}

absl::Status SparseAttentionRouter::WaitStored() {
  JoinOffload();
  return std::exchange(offload_status_, absl::OkStatus());
}

SparseAttentionRouter::~SparseAttentionRouter() { JoinOffload(); }

absl::StatusOr<bool> SparseAttentionRouter::Attend(int64_t layer, const float* q, int64_t pos,
                                                   const backend::KvLayerView& cache, float scale,
                                                   float* out) {
  MAGICPIG_ASSIGN_OR_RETURN(bool sparse, StartAttend(layer, q, pos, cache, scale, out));
  if (sparse) MAGICPIG_RETURN_IF_ERROR(FinishAttend());
  return sparse;
}

absl::StatusOr<bool> SparseAttentionRouter::StartAttend(int64_t layer, const float* q, int64_t pos,
                                                        const backend::KvLayerView& cache,
                                                        float scale, float* out) {
  return Start(layer, q, pos, cache, scale, out, nullptr);
}

absl::StatusOr<bool> SparseAttentionRouter::StartAttendWith(int64_t layer, const float* q,
                                                            int64_t pos,
                                                            const backend::KvLayerView& cache,
                                                            float scale, float* out,
                                                            const DeviceResults& results) {
  return Start(layer, q, pos, cache, scale, out, &results);
}

bool SparseAttentionRouter::AttendsAt(int64_t layer, int64_t pos) {
  if (IsDense(layer)) return false;
  JoinOffload();  // the layer's state is the offload's; its status is reported by the next call
  return layers_[static_cast<size_t>(layer)].offloaded;
}

bool SparseAttentionRouter::ReadsRowsAt(int64_t layer, int64_t n_tokens) {
  if (IsDense(layer)) return false;
  JoinOffload();
  return OffloadBegin(layers_[static_cast<size_t>(layer)], n_tokens).has_value();
}

bool SparseAttentionRouter::PlanDeviceWork(int64_t layer, int64_t pos, DeviceWork* work) {
  if (IsDense(layer)) return false;
  JoinOffload();  // its status is reported by the StartAttendWith that follows
  const Layer& st = layers_[static_cast<size_t>(layer)];
  if (!st.offloaded) return false;
  // The device computes SimHash codes; learned codes are computed here from the host query.
  work->hash = spot_ != nullptr || sketch_ ? nullptr : hash_;
  work->window_ranges = WindowRanges(st, pos);
  return true;
}

absl::StatusOr<bool> SparseAttentionRouter::PlanOffloadCodes(int64_t layer, int64_t n_tokens,
                                                             OffloadCodesPlan* plan) {
  planned_layer_ = -1;
  if (!options_.device_key_codes || IsDense(layer) || spot_ != nullptr || sketch_) return false;
  MAGICPIG_RETURN_IF_ERROR(WaitStored());  // device_codes_ is the finished offload's
  const Layer& st = layers_[static_cast<size_t>(layer)];
  // The first offload only: a window overflow's few hundred rows are cheaper to hash here than
  // to plan, and a device cache no longer holds the rows before them.
  if (st.offloaded || !OffloadBegin(st, n_tokens).has_value()) return false;
  const int64_t begin = options_.n_sinks, end = n_tokens - options_.n_local;
  const int64_t n_kv = config_.n_head_kv;
  device_codes_.centre.assign(static_cast<size_t>(n_kv * config_.head_dim), 0.0f);
  device_codes_.codes.resize(static_cast<size_t>(n_kv * (end - begin) * hash_->l()));
  *plan = {.hash = hash_,
           .begin = begin,
           .end = end,
           .compute_centre = st.center.empty(),
           .centre = device_codes_.centre.data(),
           .codes = device_codes_.codes.data()};
  // A centre already there (an earlier attempt at this offload failed after computing it) is
  // kept: the device centres with it.
  if (!plan->compute_centre) device_codes_.centre = st.center;
  plan->centre = device_codes_.centre.data();
  planned_layer_ = layer;
  planned_begin_ = begin;
  planned_end_ = end;
  return true;
}

std::pair<int64_t, int64_t> SparseAttentionRouter::OffloadedPositions(int64_t layer) const {
  if (IsDense(layer)) return {0, 0};
  const Layer& st = layers_[static_cast<size_t>(layer)];
  if (st.offload_end == 0) return {0, 0};
  return {options_.n_sinks, st.offload_end};
}

std::vector<std::pair<int64_t, int64_t>> SparseAttentionRouter::WindowRanges(const Layer& st,
                                                                             int64_t pos) const {
  return {{0, std::min(options_.n_sinks, pos + 1)}, {st.window_begin, pos + 1}};
}

absl::StatusOr<bool> SparseAttentionRouter::Start(int64_t layer, const float* q, int64_t pos,
                                                  const backend::KvLayerView& cache, float scale,
                                                  float* out, const DeviceResults* results) {
  MAGICPIG_RETURN_IF_ERROR(WaitStored());
  if (IsDense(layer)) return false;
  Layer& st = layers_[static_cast<size_t>(layer)];
  if (!st.offloaded) return false;
  const int64_t n_head = config_.n_head, hd = config_.head_dim;
  pending_ = PendingStep{layer, q, pos, cache, scale, out, absl::OkStatus(), false};
  // Only the sampled part starts here: it goes to the shards (for remote ones, the nodes work
  // while this thread goes on). The static window, which does not depend on it, waits for
  // FlushStarted (or FinishAttend), after the micro-batch's queries have been sent, so that the
  // nodes' round trip also overlaps that work.
  PhaseClock clock(options_.time_phases);
  const int64_t code_l = sketch_            ? options_.sketch_dims / 2
                         : spot_ != nullptr ? spot_->words()
                                            : hash_->l();
  const size_t n_codes = static_cast<size_t>(n_head * code_l);
  if (results != nullptr && results->codes != nullptr) {
    codes_.assign(results->codes, results->codes + n_codes);
  } else if (sketch_) {
    codes_.resize(n_codes);
    const int64_t group = n_head / config_.n_head_kv;
    for (int64_t h = 0; h < n_head; ++h) {
      st.sketches[static_cast<size_t>(h / group)].QueryCode(q + h * hd, codes_.data() + h * code_l);
    }
  } else if (spot_ != nullptr) {
    codes_.resize(n_codes);
    for (int64_t h = 0; h < n_head; ++h) {
      MAGICPIG_RETURN_IF_ERROR(
          spot_->QueryCodes(layer, h, q + h * hd, 1, codes_.data() + h * code_l));
    }
  } else {
    // Here, before the window and the shards, so that SimHash::Codes' split of a few queries'
    // projection by columns has every thread: beside the window (as FinishAttend once hashed for
    // shards in this process) it ran mostly on one thread while the other, done with the window,
    // waited (Qwen2.5-1.5B at 8K: hash 1.75-1.95 -> 1.36-1.40 ms per step, attention 7.25-7.55
    // -> 6.81-6.88; SmolLM2's narrower hash within noise).
    codes_.resize(n_codes);
    MAGICPIG_RETURN_IF_ERROR(hash_->Codes(q, n_head, hd, codes_.data()));
  }
  clock.Lap(&stats_.phases.hash);
  if (results != nullptr && results->window_o != nullptr) {
    static_o_.assign(results->window_o, results->window_o + n_head * hd);
    static_lse_.assign(results->window_lse, results->window_lse + n_head);
    pending_.window_done = true;
  }
  parts_.assign(static_cast<size_t>(n_head), PartialAttention{});
  // A failure here is kept for FinishAttend, which recovers like any other.
  pending_.start = shards_->StartAttend(layer, q, codes_.data(), scale);
  clock.Lap(&stats_.phases.shards);
  return true;
}

void SparseAttentionRouter::AttendStaticWindow() {
  PendingStep& p = pending_;
  if (p.window_done) return;
  p.window_done = true;
  const Layer& st = layers_[static_cast<size_t>(p.layer)];
  const int64_t n_head = config_.n_head, hd = config_.head_dim;
  const std::vector<std::pair<int64_t, int64_t>> ranges = WindowRanges(st, p.pos);
  static_o_.resize(static_cast<size_t>(n_head * hd));
  static_lse_.resize(static_cast<size_t>(n_head));
  PhaseClock clock(options_.time_phases);
  backend_->RangeAttention(p.q, n_head, p.scale, p.cache, ranges, static_o_.data(),
                           static_lse_.data());
  clock.Lap(&stats_.phases.window);
}

void SparseAttentionRouter::FlushStarted() {
  PhaseClock clock(options_.time_phases);
  if (pending_.start.ok()) pending_.start = shards_->FlushStarted();
  clock.Lap(&stats_.phases.shards);
  // After the send: the nodes attend while this thread does the window. Shards in this process
  // attend in FinishAttend, which runs the window beside them.
  if (!shards_->attends_in_finish()) AttendStaticWindow();
}

absl::Status SparseAttentionRouter::FinishAttend() {
  const PendingStep p = pending_;
  absl::Status status = p.start;
  if (!p.window_done && p.start.ok() && shards_->attends_in_finish()) {
    // Side by side (each lambda laps its own phase; the two phases overlap in wall time). A
    // layer's shards are a few work items (SmolLM2: 3 kv heads on 2 threads), and the window's
    // tasks fill the thread that would wait for the last one.
    tbb::parallel_invoke([this] { AttendStaticWindow(); },
                         [&] {
                           PhaseClock clock(options_.time_phases);
                           status = shards_->FinishAttend(parts_.data());
                           clock.Lap(&stats_.phases.shards);
                         });
  } else {
    AttendStaticWindow();
    PhaseClock clock(options_.time_phases);
    if (status.ok()) status = shards_->FinishAttend(parts_.data());
    clock.Lap(&stats_.phases.shards);
  }
  PhaseClock clock(options_.time_phases);
  if (!status.ok()) {
    // Recover (re-offload) and ask again, synchronously, as a plain Attend would.
    if (!RecoversInPlace() || !shards_->IsRecoverable(status) ||
        stats_.recoveries >= kMaxRecoveries) {
      return Note(status);
    }
    MAGICPIG_RETURN_IF_ERROR(Note(Recover()));
    MAGICPIG_RETURN_IF_ERROR(WithRecovery([&] {
      parts_.assign(static_cast<size_t>(config_.n_head), PartialAttention{});
      return shards_->Attend(p.layer, p.q, codes_.data(), p.scale, parts_.data());
    }));
    clock.Lap(&stats_.phases.shards);
  }
  const int64_t n_head = config_.n_head, n_kv = config_.n_head_kv, hd = config_.head_dim;
  const int64_t group = n_head / n_kv;
  const Layer& st = layers_[static_cast<size_t>(p.layer)];
  const int64_t offloaded = shards_->size(p.layer);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t h = 0; h < n_head; ++h) {
    PartialAttention& part = parts_[static_cast<size_t>(h)];
    stats_.keys_touched += part.n_touched;
    stats_.keys_per_head.Add(part.n_touched);
    stats_.keys_offloaded += offloaded;
    // Undo the centring: q.k = q.(k - c) + q.c for every offloaded key.
    const float* c = st.center.data() + (h / group) * hd;
    double qc = 0.0;
    for (int64_t t = 0; t < hd; ++t) qc += static_cast<double>(p.q[h * hd + t]) * c[t];
    const float lse_static = static_lse_[static_cast<size_t>(h)];
    const float lse_part =
        part.empty() ? neg_inf : static_cast<float>(part.lse + static_cast<double>(p.scale) * qc);
    const float m = std::max(lse_static, lse_part);
    const float ws = lse_static == neg_inf ? 0.0f : std::exp(lse_static - m);
    const float wp = lse_part == neg_inf ? 0.0f : std::exp(lse_part - m);
    const float inv = 1.0f / (ws + wp);
    float* dst = p.out + h * hd;
    const float* so = static_o_.data() + h * hd;
    for (int64_t t = 0; t < hd; ++t) {
      dst[t] = (ws * so[t] + (wp > 0.0f ? wp * part.o[static_cast<size_t>(t)] : 0.0f)) * inv;
    }
  }
  clock.Lap(&stats_.phases.merge);
  return absl::OkStatus();
}

}  // namespace magicpig::engine
