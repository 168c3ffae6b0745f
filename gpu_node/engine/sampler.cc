#include "gpu_node/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace magicpig::engine {

absl::Status ValidateSamplingParams(const SamplingParams& p) {
  if (!std::isfinite(p.temperature) || p.temperature < 0) {
    return absl::InvalidArgumentError("temperature must be a finite number >= 0");
  }
  if (p.top_k < 0) return absl::InvalidArgumentError("top_k must be >= 0");
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return absl::InvalidArgumentError("top_p must be in (0, 1]");
  }
  return absl::OkStatus();
}

int32_t Argmax(absl::Span<const float> logits) {
  if (logits.empty()) return 0;
  // Two passes instead of one that carries the index: the max is a reduction the compiler
  // vectorises (v > m ? v : m is exactly x86's maxps, NaNs skipped as in the comparison below),
  // then the first index holding it. Same result as the scalar scan: the first maximum, NaNs
  // ignored, 0 when logits[0] is NaN and nothing beats it.
  float best = logits[0];
  for (float v : logits) best = v > best ? v : best;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] == best) return static_cast<int32_t>(i);
  }
  return 0;
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

int32_t Sampler::Sample(absl::Span<const float> logits) {
  if (params_.temperature <= 0.0f || params_.top_k == 1) return Argmax(logits);
  const int64_t n = static_cast<int64_t>(logits.size());
  const int64_t k = params_.top_k > 0 ? std::min<int64_t>(params_.top_k, n) : n;
  const float inv_t = 1.0f / params_.temperature;
  const float max_logit = logits[Argmax(logits)];
  auto weight = [&](int32_t id) { return std::exp((logits[id] - max_logit) * inv_t); };
  weights_.resize(static_cast<size_t>(n));
  if (k == n && params_.top_p >= 1.0f) {
    // The whole distribution: no candidate order is needed, draw by cumulative sum in id order
    // (a sort of the vocabulary per token was the serving hot spot).
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += weights_[i] = weight(static_cast<int32_t>(i));
    std::uniform_real_distribution<double> uniform(0.0, sum);
    double r = uniform(rng_);
    int64_t last = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (weights_[i] <= 0) continue;
      last = i;
      r -= weights_[i];
      if (r < 0) return static_cast<int32_t>(i);
    }
    return static_cast<int32_t>(last);
  }
  // Candidates in descending logit order (lowest id first on ties), truncated to top_k; only as
  // much of the order as the top-p prefix needs is sorted.
  ids_.resize(static_cast<size_t>(n));
  std::iota(ids_.begin(), ids_.end(), 0);
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  if (k < n) std::nth_element(ids_.begin(), ids_.begin() + k, ids_.end(), by_logit);
  ids_.resize(static_cast<size_t>(k));
  // Each candidate's weight once, kept by id for the passes below.
  double total = 0;
  for (int32_t id : ids_) total += weights_[id] = weight(id);
  int64_t keep = k;
  int64_t sorted = 0;
  if (params_.top_p < 1.0f) {
    // The smallest prefix whose mass reaches top_p, sorting a growing head of the candidates.
    double mass = 0;
    bool found = false;
    for (int64_t m = std::min<int64_t>(k, 64); !found; m = std::min<int64_t>(k, m * 8)) {
      std::partial_sort(ids_.begin() + sorted, ids_.begin() + m, ids_.end(), by_logit);
      for (; sorted < m; ++sorted) {
        mass += weights_[ids_[sorted]] / total;
        if (mass >= params_.top_p) {
          keep = sorted + 1;
          found = true;
          break;
        }
      }
      if (m == k) break;
    }
  } else {
    std::sort(ids_.begin(), ids_.end(), by_logit);
  }
  double kept_sum = 0;
  for (int64_t i = 0; i < keep; ++i) kept_sum += weights_[ids_[i]];
  std::uniform_real_distribution<double> uniform(0.0, kept_sum);
  double r = uniform(rng_);
  for (int64_t i = 0; i < keep; ++i) {
    r -= weights_[ids_[i]];
    if (r < 0) return ids_[i];
  }
  return ids_[keep - 1];
}

}  // namespace magicpig::engine
