// Float64 references of the compute backends' attention over an fp16 KV cache, shared by the CPU
// and CUDA backend tests (independent of both: plain loops in double).
#ifndef MAGICPIG_TESTS_TESTING_ATTENTION_REFERENCE_H_
#define MAGICPIG_TESTS_TESTING_ATTENTION_REFERENCE_H_

#include <cstdint>
#include <utility>
#include <vector>

namespace magicpig::testing {

// The cache's shape; k and v are fp16 bits, rows [position][n_kv][head_dim].
struct Fp16Cache {
  const std::vector<uint16_t>* k = nullptr;
  const std::vector<uint16_t>* v = nullptr;
  int64_t n_kv = 0;
  int64_t head_dim = 0;
};

struct ReferenceAttention {
  std::vector<double> o;    // [n_head][head_dim]; 0 for a head with no key
  std::vector<double> lse;  // [n_head], natural log; -inf for a head with no key
};

// One query q ([n_head][head_dim]) over the positions in `ranges`; query head h reads kv head
// h / (n_head / n_kv); scores are scale * q.k.
ReferenceAttention RangeAttentionReference(const float* q, int64_t n_head, double scale,
                                           const Fp16Cache& cache,
                                           const std::vector<std::pair<int64_t, int64_t>>& ranges);

// Causal attention of n_tokens queries ([n_tokens][n_head][head_dim]) at positions first_pos..:
// query t sees positions [0, first_pos + t]. Returns the outputs, [n_tokens][n_head][head_dim].
std::vector<double> CausalAttentionReference(const float* q, int64_t n_tokens, int64_t first_pos,
                                             int64_t n_head, double scale, const Fp16Cache& cache);

}  // namespace magicpig::testing

#endif  // MAGICPIG_TESTS_TESTING_ATTENTION_REFERENCE_H_
