// Seeded synthetic keys, values and queries of one attention head with the geometry the MagicPIG
// paper describes (§4 of the reference spec, paper Fig. 5), for the accuracy tests of issue #3.
//
// The numbers are calibrated on SmolLM2-135M's post-RoPE keys (d = 64) at 2K tokens, measured with
// magicpig_dump_qk; the range seen over its 90 (layer, kv head) pairs is given in brackets.
//
// Geometry (positions 0 .. n-1; the offloaded region is [4, n - 64) as in the system):
//   - Key cone. Every key but the sink is k_i = c + x_i, with |c| = `mean_key_norm` (14; [4, 22])
//     and x_i orthogonal to c, its rms norm set by the cone angle atan(rms|x| / |c|) =
//     `cone_angle_deg` (40 deg; [31, 62]). So raw keys sit in a cone around c.
//   - Anisotropy. x_i is drawn from N(0, Σ) restricted to c⊥, with Σ's eigenvalues decaying as
//     1 / (1 + j / `spectrum_knee`) (knee 8) in a random orthonormal basis: real keys put most of
//     their variance in few directions, which makes cosines between keys larger than in isotropic
//     noise.
//   - Tokens. Each position carries a token type drawn from a Zipf(`zipf_s` = 1.0) law over `vocab`
//     (512) types, and x_i = r (sqrt(a) t_type + sqrt(1 - a) e_i) with a = `token_share` (0.6):
//     repeated tokens give clusters of near-duplicate keys, as in real text. t and e are N(0, Σ).
//   - Sink. Position 0 holds the attention-sink key: norm `sink_norm_ratio` |c| (0.35; [0.2, 1.6]),
//     direction at cosine `sink_cos` (-0.85, the paper's -0.9 .. -0.8; SmolLM2's later layers
//     -0.1 .. -0.8) with c, i.e. opposite the cone. Positions 1..3 are ordinary keys.
//   - Queries. q = |q| (-0.3 ĉ + w_s ŝ + w_h ĥ), |q| = `query_norm` (14; [10, 19]): the queries
//     sit in their own cone at cosine -0.3 to the keys' mean ([-0.46, 0.18]), far from the keys, so
//     without centering SimHash would separate almost nothing. ŝ is the sink's direction
//     orthogonal to c (kept out of Σ), which gives the sink its large logit. ĥ (unit, in c⊥) is the
//     query's content direction, per query:
//       kDiffuse: a fresh random direction from N(0, Σ): attention spreads over many keys with a
//                 lognormal-like tail (the long-tailed heads);
//       kCluster: ĥ = unit(sqrt(0.7) t̂ + sqrt(0.3) r̂), t̂ the token direction of one frequent
//                 type (the 9th most frequent: 1.6% of the positions), r̂ random: a cluster of
//                 near-duplicate keys holds most of the offloaded mass;
//       kNeedle:  the same with a token type that occurs only at `needle_count` (4) offloaded
//                 positions: a retrieval head.
//     w_h = `content_weight` (0.8) and w_s = sqrt(1 - 0.09 - w_h^2).
//   - Values. v_i = μ + σ (sqrt(b) u_type + sqrt(1 - b) z_i) with unit-variance isotropic u and z,
//     b = 0.5, |μ| = 0.4 rms|v - μ| (SmolLM2: 0.2 .. 1.0); the sink's value is small (0.2 rms;
//     SmolLM2: mostly 0.1 .. 0.5), as attention-sink values are in real models.
// Resulting attention (scale 1/sqrt(d), n = 16384, the accuracy test's cases; means over queries):
//   case                      logit std  top-1% mass  top-20% mass  offloaded mass  |S|/n (10,150)
//   kDiffuse, content 0.6        1.9        0.32          0.85          0.21            1.8%
//   kDiffuse (defaults)          2.4        0.53          0.94          0.65            2.2%
//   kCluster                     2.8        0.96          1.00          1.00            3.2%
//   kNeedle                      2.5        0.88          0.99          0.91            2.3%
// "logit std" is over the offloaded keys; "top-x% mass" is the share of the offloaded attention
// mass on the top x% of offloaded keys; "offloaded mass" is the offloaded region's share of all
// the mass (most of the rest is on the sink). SmolLM2's sparse heads at 2K: logit std median 2.7
// (p10 2.0, p90 3.9), top-1% mass median 0.48 (p10 0.26, p90 0.78), offloaded mass median 0.38,
// |S|/n median 2.9%. The flat diffuse case matches the paper's description of long-tailed heads
// (top 20% of keys hold 70-80% of the mass, its Fig. 2a; here 85%); the default diffuse case
// matches SmolLM2's median head; kCluster and kNeedle are peaked heads.
//
// Determinism: std::mt19937_64 with our own Box-Muller normals and inverse-CDF Zipf draws, so the
// same seed gives the same data with any standard library.
//
// Thread-safety: pure function.
#ifndef MAGICPIG_TESTS_ACCURACY_SYNTHETIC_ATTENTION_H_
#define MAGICPIG_TESTS_ACCURACY_SYNTHETIC_ATTENTION_H_

#include <cstdint>
#include <string_view>
#include <vector>

namespace magicpig::accuracy {

enum class HeadKind { kDiffuse, kCluster, kNeedle };

std::string_view HeadKindName(HeadKind kind);

struct SyntheticSpec {
  HeadKind kind = HeadKind::kDiffuse;
  uint64_t seed = 1;
  int64_t d = 64;
  int64_t n = 4096;
  int64_t n_queries = 32;
  double mean_key_norm = 14.0;
  double cone_angle_deg = 40.0;
  double spectrum_knee = 8.0;
  int vocab = 512;
  double zipf_s = 1.0;
  double token_share = 0.6;
  double sink_norm_ratio = 0.35;
  double sink_cos = -0.85;
  double query_norm = 14.0;
  double content_weight = 0.8;
  double target_share = 0.7;  // kCluster / kNeedle: share of ĥ along the target token
  int cluster_rank = 8;       // kCluster: 0-based Zipf index of the targeted type
  int needle_count = 4;       // kNeedle
  double value_token_share = 0.5;
  double value_mean_ratio = 0.4;
  double sink_value_ratio = 0.2;
};

struct SyntheticHead {
  int64_t n = 0, d = 0, n_queries = 0;
  std::vector<float> keys;     // [n][d], raw (uncentred)
  std::vector<float> values;   // [n][d]
  std::vector<float> queries;  // [n_queries][d], raw; each attends to all n keys
  std::vector<int32_t> token;  // [n] token type of each position (-1 for the sink)
};

SyntheticHead GenerateSyntheticHead(const SyntheticSpec& spec);

}  // namespace magicpig::accuracy

#endif  // MAGICPIG_TESTS_ACCURACY_SYNTHETIC_ATTENTION_H_
