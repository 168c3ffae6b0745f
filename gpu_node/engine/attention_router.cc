#include "gpu_node/engine/attention_router.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/half.h"
#include "common/status_macros.h"

namespace magicpig::engine {

std::string_view AttentionModeName(AttentionMode mode) {
  switch (mode) {
    case AttentionMode::kFull:
      return "full";
    case AttentionMode::kMagicPig:
      return "magicpig";
    case AttentionMode::kTopK:
      return "topk";
    case AttentionMode::kOracle:
      return "oracle";
  }
  return "?";
}

absl::StatusOr<AttentionMode> ParseAttentionMode(std::string_view name) {
  for (AttentionMode m : {AttentionMode::kFull, AttentionMode::kMagicPig, AttentionMode::kTopK,
                          AttentionMode::kOracle}) {
    if (name == AttentionModeName(m)) return m;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown attention mode '", std::string(name),
                                                 "' (choose full, magicpig, topk or oracle)"));
}

EmbeddedAttentionRouter::EmbeddedAttentionRouter(const model::ModelConfig& config,
                                                 const SparseAttentionOptions& options,
                                                 const SimHash* hash, const Estimator* estimator,
                                                 AttentionRunner* runner, backend::Backend* backend)
    : config_(config),
      options_(options),
      hash_(hash),
      estimator_(estimator),
      runner_(runner),
      backend_(backend),
      dense_(static_cast<size_t>(config.n_layer), false),
      layers_(static_cast<size_t>(config.n_layer)) {
  std::vector<int64_t> dense = options.dense_layers;
  if (dense.empty()) dense = {0, config.n_layer / 2};
  for (int64_t l : dense) {
    if (l >= 0 && l < config.n_layer) dense_[static_cast<size_t>(l)] = true;
  }
}

bool EmbeddedAttentionRouter::IsDense(int64_t layer) const {
  return dense_[static_cast<size_t>(layer)];
}

int64_t EmbeddedAttentionRouter::shard_bytes() const {
  int64_t b = 0;
  for (const Layer& l : layers_)
    for (const KvShard& s : l.shards) b += s.bytes();
  return b;
}

void EmbeddedAttentionRouter::ReadRows(const backend::KvLayerView& cache, int64_t g, int64_t begin,
                                       int64_t end, std::vector<float>* keys,
                                       std::vector<float>* values) const {
  const int64_t hd = config_.head_dim;
  keys->resize(static_cast<size_t>((end - begin) * hd));
  values->resize(keys->size());
  for (int64_t p = begin; p < end; ++p) {
    const int64_t at = (p * cache.n_head_kv + g) * hd;
    for (int64_t t = 0; t < hd; ++t) {
      (*keys)[static_cast<size_t>((p - begin) * hd + t)] = Fp16ToFloat(cache.k[at + t]);
      (*values)[static_cast<size_t>((p - begin) * hd + t)] = Fp16ToFloat(cache.v[at + t]);
    }
  }
}

absl::Status EmbeddedAttentionRouter::OnLayerStored(int64_t layer,
                                                    const backend::KvLayerView& cache,
                                                    int64_t n_tokens) {
  if (IsDense(layer)) return absl::OkStatus();
  Layer& st = layers_[static_cast<size_t>(layer)];
  const int64_t hd = config_.head_dim;
  std::vector<float> keys, values;
  if (st.shards.empty()) {
    // Offload [n_sinks, n - n_local) once it holds anything (at prefill for any real prompt).
    const int64_t begin = options_.n_sinks, end = n_tokens - options_.n_local;
    if (end - begin < 1) return absl::OkStatus();
    std::vector<KvShard> shards;
    for (int64_t g = 0; g < cache.n_head_kv; ++g) {
      ReadRows(cache, g, begin, end, &keys, &values);
      // c: the mean offloaded key of this (layer, kv head), in float64.
      std::vector<double> mean(static_cast<size_t>(hd), 0.0);
      for (int64_t i = 0; i < end - begin; ++i)
        for (int64_t t = 0; t < hd; ++t) mean[t] += keys[i * hd + t];
      std::vector<float> center(static_cast<size_t>(hd));
      for (int64_t t = 0; t < hd; ++t) center[t] = static_cast<float>(mean[t] / (end - begin));
      MAGICPIG_ASSIGN_OR_RETURN(KvShard shard,
                                KvShard::Create(*hash_, keys.data(), center.data(), values.data(),
                                                end - begin, options_.storage));
      shards.push_back(std::move(shard));
    }
    st.shards = std::move(shards);
    st.window_begin = end;
    return absl::OkStatus();
  }
  // Window overflow: its oldest tokens (all but the last n_local) join the append segment.
  if (n_tokens - st.window_begin > options_.window_budget) {
    const int64_t begin = st.window_begin, end = n_tokens - options_.n_local;
    for (int64_t g = 0; g < cache.n_head_kv; ++g) {
      ReadRows(cache, g, begin, end, &keys, &values);
      MAGICPIG_RETURN_IF_ERROR(st.shards[static_cast<size_t>(g)].Append(
          *hash_, keys.data(), values.data(), end - begin));
    }
    st.window_begin = end;
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> EmbeddedAttentionRouter::Attend(int64_t layer, const float* q, int64_t pos,
                                                     const backend::KvLayerView& cache, float scale,
                                                     float* out) {
  if (IsDense(layer)) return false;
  Layer& st = layers_[static_cast<size_t>(layer)];
  if (st.shards.empty()) return false;
  const int64_t n_head = config_.n_head, n_kv = config_.n_head_kv, hd = config_.head_dim;
  const int group = static_cast<int>(n_head / n_kv);
  const int l = hash_->l();
  // Sampled parts first (they do not depend on the static part).
  codes_.resize(static_cast<size_t>(n_head * l));
  MAGICPIG_RETURN_IF_ERROR(hash_->Codes(q, n_head, hd, codes_.data()));
  parts_.assign(static_cast<size_t>(n_head), PartialAttention{});
  work_.clear();
  for (int64_t g = 0; g < n_kv; ++g) {
    work_.push_back({&st.shards[static_cast<size_t>(g)], q + g * group * hd,
                     codes_.data() + g * group * l, group, parts_.data() + g * group});
  }
  MAGICPIG_RETURN_IF_ERROR(runner_->Run(*estimator_, work_, scale));
  // Static window: sinks and [window_begin, pos].
  const std::pair<int64_t, int64_t> ranges[2] = {{0, std::min(options_.n_sinks, pos + 1)},
                                                 {st.window_begin, pos + 1}};
  static_o_.resize(static_cast<size_t>(n_head * hd));
  static_lse_.resize(static_cast<size_t>(n_head));
  backend_->RangeAttention(q, n_head, scale, cache, ranges, static_o_.data(), static_lse_.data());
  for (int64_t h = 0; h < n_head; ++h) {
    const KvShard& shard = st.shards[static_cast<size_t>(h / group)];
    PartialAttention& part = parts_[static_cast<size_t>(h)];
    stats_.keys_touched += part.n_touched;
    stats_.keys_offloaded += shard.size();
    // Undo the centring: q.k = q.(k - c) + q.c for every key of the shard.
    double qc = 0.0;
    for (int64_t t = 0; t < hd; ++t) qc += static_cast<double>(q[h * hd + t]) * shard.center()[t];
    const float lse_static = static_lse_[static_cast<size_t>(h)];
    const float lse_part = part.empty()
                               ? -std::numeric_limits<float>::infinity()
                               : static_cast<float>(part.lse + static_cast<double>(scale) * qc);
    const float m = std::max(lse_static, lse_part);
    const float ws =
        lse_static == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(lse_static - m);
    const float wp =
        lse_part == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(lse_part - m);
    const float inv = 1.0f / (ws + wp);
    float* dst = out + h * hd;
    const float* so = static_o_.data() + h * hd;
    for (int64_t t = 0; t < hd; ++t) {
      dst[t] = (ws * so[t] + (wp > 0.0f ? wp * part.o[static_cast<size_t>(t)] : 0.0f)) * inv;
    }
  }
  return true;
}

}  // namespace magicpig::engine
