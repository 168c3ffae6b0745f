// Sampler: picks the next token from logits (greedy, temperature, top-k, top-p), seeded.
//
// Order of operations (as llama.cpp and vLLM): temperature scaling, top-k, softmax, top-p
// (smallest prefix of the sorted distribution whose mass reaches top_p), then a draw from the
// renormalised distribution. temperature == 0 means greedy (argmax, lowest id on ties). The draw
// walks the candidates in descending logit order when top-k or top-p truncates, in id order
// otherwise (no sort of the vocabulary per token).
//
// Thread-safety: a Sampler belongs to one sequence (it owns the RNG state).
#ifndef MAGICPIG_GPU_NODE_ENGINE_SAMPLER_H_
#define MAGICPIG_GPU_NODE_ENGINE_SAMPLER_H_

#include <cstdint>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace magicpig::engine {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int32_t top_k = 0;         // 0: off
  float top_p = 1.0f;        // 1: off
  uint64_t seed = 0;
};

// INVALID_ARGUMENT naming the field: temperature < 0 or not finite, top_k < 0, top_p not in (0, 1].
absl::Status ValidateSamplingParams(const SamplingParams& params);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  int32_t Sample(absl::Span<const float> logits);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<int32_t> ids_;     // candidate ids (reused)
  std::vector<double> weights_;  // [vocab] exp((logit - max) / T) of the candidates, by id
};

int32_t Argmax(absl::Span<const float> logits);

}  // namespace magicpig::engine

#endif  // MAGICPIG_GPU_NODE_ENGINE_SAMPLER_H_
