// The MagicPIG inclusion probability (docs/architecture.md §4.3, paper Eq. 10): the probability
// that a key at cosine `cos` to the query collides with it in at least 2 of L SimHash tables of K
// bits,
//
//   p = 1 - acos(clamp(cos, -1, 1)) / pi,   P = p^K,
//   u = P(Binomial(L, P) >= 2) = 1 - (1 - P)^(L-1) * (L*P + 1 - P).
//
// Evaluation (float64): the factored form as u = -expm1((L-1)*log1p(-P) + log1p((L-1)*P)), which
// avoids the cancellation of 1 - (...) for moderate P; when L*P < 0.01, where even that loses
// relative accuracy (u ~ C(L,2) P^2), the binomial tail sum_{j>=2} C(L,j) P^j (1-P)^(L-j) is summed
// directly (terms shrink by a factor < 0.011 each, 12 terms). Edge cases: cos <= -1 gives P = 0 and
// u = 0; cos >= 1 gives P = 1 and u = 1 (for L >= 2); L = 1 gives u = 0 (no key can collide twice).
// A NaN cos (e.g. 0/0 for a zero key) is treated as cos = 0, so the result is never NaN.
//
// Preconditions: k >= 1, l >= 1 (callers validate K and L at configuration time, see SimHash).
// Thread-safety: pure functions.
#ifndef MAGICPIG_COMMON_ATTENTION_INCLUSION_PROBABILITY_H_
#define MAGICPIG_COMMON_ATTENTION_INCLUSION_PROBABILITY_H_

#include <cmath>
#include <cstdint>
#include <vector>

namespace magicpig::attention {

// u(cos; K, L) in [0, 1].
double InclusionProbability(double cos, int k, int l);

// ln(u + 1e-4): what MagicPIG subtracts from a sampled key's logit (docs/architecture.md §4.4,
// paper Eq. 10's importance weight 1/u, kept finite for u -> 0 by the 1e-4).
inline double LogInclusionWeight(double u) { return std::log(u + 1e-4); }

// u[i] = InclusionProbability(cos[i], k, l) for i < n.
void InclusionProbabilities(const float* cos, int64_t n, int k, int l, float* u);

// ln(u(c; K, L) + 1e-4) at `size` >= 2 uniform points c_i = -1 + 2 i / (size - 1) (float64, then
// rounded): what the fast kernels interpolate linearly instead of evaluating acos and powers per
// sampled key. kLogInclusionTableSize points keep the interpolation error below 1e-3 in ln u
// (checked by inclusion_probability_test against the exact function).
inline constexpr int kLogInclusionTableSize = 16385;
std::vector<float> LogInclusionTable(int k, int l, int size = kLogInclusionTableSize);

}  // namespace magicpig::attention

#endif  // MAGICPIG_COMMON_ATTENTION_INCLUSION_PROBABILITY_H_
