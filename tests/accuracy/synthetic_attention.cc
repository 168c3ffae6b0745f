#include "tests/accuracy/synthetic_attention.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <random>

namespace magicpig::accuracy {
namespace {

// Library-independent normal draws (Box-Muller on 53-bit uniforms).
class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  double Uniform() { return static_cast<double>(gen_() >> 11) * 0x1.0p-53; }
  double Normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1 = Uniform();
    while (u1 <= 0.0) u1 = Uniform();
    const double u2 = Uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = r * std::sin(2.0 * std::numbers::pi * u2);
    has_spare_ = true;
    return r * std::cos(2.0 * std::numbers::pi * u2);
  }

 private:
  std::mt19937_64 gen_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

using Vec = std::vector<double>;

double Dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

void Normalize(Vec& a) {
  const double n = std::sqrt(Dot(a, a));
  for (double& x : a) x /= n;
}

// Orthonormal basis of R^d whose first vector is random; Gram-Schmidt on Gaussian vectors.
std::vector<Vec> RandomBasis(int64_t d, Rng& rng) {
  std::vector<Vec> basis;
  while (static_cast<int64_t>(basis.size()) < d) {
    Vec v(static_cast<size_t>(d));
    for (double& x : v) x = rng.Normal();
    for (int pass = 0; pass < 2; ++pass) {  // twice for numerical orthogonality
      for (const Vec& b : basis) {
        const double p = Dot(v, b);
        for (int64_t t = 0; t < d; ++t) v[t] -= p * b[t];
      }
    }
    if (Dot(v, v) < 1e-12) continue;
    Normalize(v);
    basis.push_back(std::move(v));
  }
  return basis;
}

}  // namespace

std::string_view HeadKindName(HeadKind kind) {
  switch (kind) {
    case HeadKind::kDiffuse:
      return "diffuse";
    case HeadKind::kCluster:
      return "cluster";
    case HeadKind::kNeedle:
      return "needle";
  }
  return "?";
}

SyntheticHead GenerateSyntheticHead(const SyntheticSpec& s) {
  Rng rng(s.seed);
  const int64_t d = s.d, n = s.n;
  // basis[0] = ĉ (the cone axis), basis[1] = ŝ (the sink's direction within c⊥), basis[2..] the
  // rest. Σ lives on basis[2..] with eigenvalue 1 / (1 + j / knee) on basis[2 + j], normalised to
  // trace 1 so that a draw has E|x|^2 = 1. Keeping ŝ out of Σ lets the query's sink component set
  // the sink's logit without adding variance to the other keys' logits.
  const std::vector<Vec> basis = RandomBasis(d, rng);
  Vec sd(static_cast<size_t>(d - 2));
  double trace = 0;
  for (int64_t j = 0; j < d - 2; ++j) {
    sd[j] = 1.0 / (1.0 + static_cast<double>(j) / s.spectrum_knee);
    trace += sd[j];
  }
  for (double& x : sd) x = std::sqrt(x / trace);
  auto draw_sigma = [&]() {  // N(0, Σ) on basis[2..]
    Vec v(static_cast<size_t>(d), 0.0);
    for (int64_t j = 0; j < d - 2; ++j) {
      const double z = rng.Normal() * sd[j];
      for (int64_t t = 0; t < d; ++t) v[t] += z * basis[2 + j][t];
    }
    return v;
  };
  auto draw_iso = [&]() {  // isotropic, E|x|^2 = 1
    Vec v(static_cast<size_t>(d));
    for (double& x : v) x = rng.Normal() / std::sqrt(static_cast<double>(d));
    return v;
  };

  // Token types: key directions t (Σ-shaped) and value directions u (isotropic).
  std::vector<Vec> tok_key, tok_val;
  for (int v = 0; v <= s.vocab; ++v) {  // index `vocab` is the needle type, never drawn by Zipf
    tok_key.push_back(draw_sigma());
    tok_val.push_back(draw_iso());
  }
  std::vector<double> cdf(static_cast<size_t>(s.vocab));
  double z = 0;
  for (int v = 0; v < s.vocab; ++v) {
    z += std::pow(v + 1.0, -s.zipf_s);
    cdf[v] = z;
  }

  SyntheticHead h;
  h.n = n;
  h.d = d;
  h.n_queries = s.n_queries;
  h.token.assign(static_cast<size_t>(n), 0);
  h.token[0] = -1;
  for (int64_t i = 1; i < n; ++i) {
    const double u = rng.Uniform() * z;
    h.token[i] = static_cast<int32_t>(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
    h.token[i] = std::min(h.token[i], s.vocab - 1);
  }
  if (s.kind == HeadKind::kNeedle) {
    for (int j = 0; j < s.needle_count; ++j) {  // spread over the offloaded region [4, n - 64)
      const int64_t pos = 4 + (n - 68) * (2 * j + 1) / (2 * s.needle_count);
      h.token[pos] = s.vocab;
    }
  }

  const double c_norm = s.mean_key_norm;
  const double r = c_norm * std::tan(s.cone_angle_deg * std::numbers::pi / 180.0);
  const double a = s.token_share;
  h.keys.assign(static_cast<size_t>(n * d), 0.0f);
  for (int64_t i = 1; i < n; ++i) {
    const Vec e = draw_sigma();
    const Vec& t = tok_key[h.token[i]];
    for (int64_t k = 0; k < d; ++k) {
      h.keys[i * d + k] = static_cast<float>(c_norm * basis[0][k] +
                                             r * (std::sqrt(a) * t[k] + std::sqrt(1 - a) * e[k]));
    }
  }
  const double sink_sin = std::sqrt(1 - s.sink_cos * s.sink_cos);
  for (int64_t k = 0; k < d; ++k) {
    h.keys[k] = static_cast<float>(s.sink_norm_ratio * c_norm *
                                   (s.sink_cos * basis[0][k] + sink_sin * basis[1][k]));
  }

  // Values: rms |v - μ| = sqrt(d) (unit variance per coordinate).
  const double sigma = std::sqrt(static_cast<double>(d));
  const double b = s.value_token_share;
  Vec mu = draw_iso();
  Normalize(mu);
  h.values.assign(static_cast<size_t>(n * d), 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    const Vec zi = draw_iso();
    for (int64_t k = 0; k < d; ++k) {
      double v;
      if (i == 0) {
        v = s.sink_value_ratio * sigma * zi[k];
      } else {
        v = s.value_mean_ratio * sigma * mu[k] +
            sigma * (std::sqrt(b) * tok_val[h.token[i]][k] + std::sqrt(1 - b) * zi[k]);
      }
      h.values[i * d + k] = static_cast<float>(v);
    }
  }

  // Queries.
  const double w_h = s.content_weight;
  const double w_s = std::sqrt(std::max(0.0, 1.0 - 0.09 - w_h * w_h));
  Vec target;
  if (s.kind == HeadKind::kCluster) target = tok_key[std::min(s.cluster_rank, s.vocab - 1)];
  if (s.kind == HeadKind::kNeedle) target = tok_key[s.vocab];
  if (!target.empty()) Normalize(target);
  h.queries.assign(static_cast<size_t>(s.n_queries * d), 0.0f);
  for (int64_t j = 0; j < s.n_queries; ++j) {
    Vec hd = draw_sigma();
    Normalize(hd);
    if (!target.empty()) {
      for (int64_t k = 0; k < d; ++k) {
        hd[k] = std::sqrt(s.target_share) * target[k] + std::sqrt(1 - s.target_share) * hd[k];
      }
      Normalize(hd);
    }
    for (int64_t k = 0; k < d; ++k) {
      h.queries[j * d + k] =
          static_cast<float>(s.query_norm * (-0.3 * basis[0][k] + w_s * basis[1][k] + w_h * hd[k]));
    }
  }
  return h;
}

}  // namespace magicpig::accuracy
