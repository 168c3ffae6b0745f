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
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

int32_t Sampler::Sample(absl::Span<const float> logits) {
  if (params_.temperature <= 0.0f || params_.top_k == 1) return Argmax(logits);
  const int64_t n = static_cast<int64_t>(logits.size());
  std::vector<int32_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0);
  // Candidates sorted by logit (descending, lowest id first on ties), truncated to top_k.
  const int64_t k = params_.top_k > 0 ? std::min<int64_t>(params_.top_k, n) : n;
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), by_logit);
  ids.resize(k);
  std::vector<double> probs(k);
  const double max_logit = logits[ids[0]];
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) {
    probs[i] = std::exp((logits[ids[i]] - max_logit) / params_.temperature);
    sum += probs[i];
  }
  int64_t keep = k;
  if (params_.top_p < 1.0f) {
    double mass = 0;
    for (int64_t i = 0; i < k; ++i) {
      mass += probs[i] / sum;
      if (mass >= params_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept_sum = 0;
  for (int64_t i = 0; i < keep; ++i) kept_sum += probs[i];
  std::uniform_real_distribution<double> uniform(0.0, kept_sum);
  double r = uniform(rng_);
  for (int64_t i = 0; i < keep; ++i) {
    r -= probs[i];
    if (r < 0) return ids[i];
  }
  return ids[keep - 1];
}

}  // namespace magicpig::engine
