#include "common/attention/key_sketch.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace magicpig::attention {
namespace {

// Keys the second-moment matrix is estimated from: an even stride through the keys when there are
// more (a d x d estimate from 4,096 keys is ample for d <= 256; all of them cost n d^2).
constexpr int64_t kFitKeys = 4096;
// Subspace iterations: each multiplies by the second-moment matrix and re-orthonormalises.
constexpr int kIterations = 24;

int8_t Quantise(double x) {
  if (!(x == x)) return 0;  // NaN (a non-finite query): no direction preferred
  const double r = std::nearbyint(x);
  return static_cast<int8_t>(std::clamp(r, -127.0, 127.0));
}

void Pack(const int8_t* c, int dims, uint16_t* code) {
  for (int w = 0; w < dims / 2; ++w) {
    code[w] =
        static_cast<uint16_t>(static_cast<uint8_t>(c[2 * w]) |
                              (static_cast<uint16_t>(static_cast<uint8_t>(c[2 * w + 1])) << 8));
  }
}

// Orthonormalises the r columns of q ([d][r], column-major by index c * d + i) by modified
// Gram-Schmidt, twice (the second pass restores orthogonality lost to rounding); a column that
// (nearly) vanishes is replaced by the first coordinate axis far from the others' span.
void Orthonormalise(int64_t d, int r, std::vector<double>* q) {
  for (int pass = 0; pass < 2; ++pass) {
    for (int c = 0; c < r; ++c) {
      double* v = q->data() + c * d;
      double before = 0;
      for (int64_t i = 0; i < d; ++i) before += v[i] * v[i];
      for (int p = 0; p < c; ++p) {
        const double* u = q->data() + p * d;
        double dot = 0;
        for (int64_t i = 0; i < d; ++i) dot += u[i] * v[i];
        for (int64_t i = 0; i < d; ++i) v[i] -= dot * u[i];
      }
      double norm = 0;
      for (int64_t i = 0; i < d; ++i) norm += v[i] * v[i];
      norm = std::sqrt(norm);
      if (!(norm > 1e-9 * std::sqrt(before))) {
        // Degenerate (the column lay in the earlier ones' span, as when the keys' rank is below
        // r): what is left is rounding noise, which normalising would not make orthogonal. Any
        // unit vector orthogonal to the earlier columns will do.
        for (int64_t axis = 0; axis < d; ++axis) {
          std::fill(v, v + d, 0.0);
          v[axis] = 1;
          for (int p = 0; p < c; ++p) {
            const double* u = q->data() + p * d;
            for (int64_t i = 0; i < d; ++i) v[i] -= u[axis] * u[i];
          }
          norm = 0;
          for (int64_t i = 0; i < d; ++i) norm += v[i] * v[i];
          norm = std::sqrt(norm);
          if (norm > 0.5) break;
        }
      }
      for (int64_t i = 0; i < d; ++i) v[i] /= norm;
    }
  }
}

// out_c = M q_c for the r columns of q ([d][r] column-major as in Orthonormalise), M symmetric
// d x d: a sum of M's rows weighted by q_c's coordinates, so the inner loop vectorises.
void MultiplyColumns(const std::vector<double>& m, int64_t d, int r, const std::vector<double>& q,
                     std::vector<double>* out) {
  std::fill(out->begin(), out->end(), 0.0);
  for (int c = 0; c < r; ++c) {
    const double* v = q.data() + c * d;
    double* o = out->data() + c * d;
    for (int64_t b = 0; b < d; ++b) {
      const double* row = m.data() + b * d;
      const double vb = v[b];
      for (int64_t a = 0; a < d; ++a) o[a] += row[a] * vb;
    }
  }
}

// Eigen-decomposition of the symmetric r x r matrix a (row-major; destroyed) by cyclic Jacobi
// rotations: *values (r) and *vectors (r x r, column c the eigenvector of values[c]).
void Jacobi(int r, std::vector<double> a, std::vector<double>* values,
            std::vector<double>* vectors) {
  std::vector<double>& v = *vectors;
  v.assign(static_cast<size_t>(r * r), 0.0);
  for (int i = 0; i < r; ++i) v[i * r + i] = 1;
  for (int sweep = 0; sweep < 64; ++sweep) {
    double off = 0, total = 0;
    for (int i = 0; i < r; ++i) {
      for (int j = 0; j < r; ++j) {
        total += a[i * r + j] * a[i * r + j];
        if (i != j) off += a[i * r + j] * a[i * r + j];
      }
    }
    if (off <= 1e-30 * total || off == 0) break;
    for (int p = 0; p < r; ++p) {
      for (int q = p + 1; q < r; ++q) {
        const double apq = a[p * r + q];
        if (apq == 0) continue;
        const double theta = (a[q * r + q] - a[p * r + p]) / (2 * apq);
        const double t =
            (theta >= 0 ? 1.0 : -1.0) / (std::fabs(theta) + std::sqrt(theta * theta + 1));
        const double c = 1 / std::sqrt(t * t + 1), s = t * c;
        for (int k = 0; k < r; ++k) {  // columns p, q
          const double akp = a[k * r + p], akq = a[k * r + q];
          a[k * r + p] = c * akp - s * akq;
          a[k * r + q] = s * akp + c * akq;
        }
        for (int k = 0; k < r; ++k) {  // rows p, q
          const double apk = a[p * r + k], aqk = a[q * r + k];
          a[p * r + k] = c * apk - s * aqk;
          a[q * r + k] = s * apk + c * aqk;
        }
        for (int k = 0; k < r; ++k) {
          const double vkp = v[k * r + p], vkq = v[k * r + q];
          v[k * r + p] = c * vkp - s * vkq;
          v[k * r + q] = s * vkp + c * vkq;
        }
      }
    }
  }
  values->resize(static_cast<size_t>(r));
  for (int i = 0; i < r; ++i) (*values)[static_cast<size_t>(i)] = a[i * r + i];
}

}  // namespace

absl::StatusOr<KeySketch> KeySketch::Fit(const float* keys, int64_t n, int64_t d, int dims) {
  if (d < 1 || d > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("KeySketch: d must be in [1, 1024], got ", d));
  }
  if (dims < 2 || dims % 2 != 0 || dims > std::min<int64_t>(d, kMaxDims)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KeySketch: dims must be even, in [2, ", std::min<int64_t>(d, kMaxDims), "], got ", dims));
  }
  if (n < 0 || (n > 0 && keys == nullptr)) {
    return absl::InvalidArgumentError("KeySketch: keys must be non-null with n >= 0");
  }
  for (int64_t i = 0; i < n * d; ++i) {
    if (!std::isfinite(keys[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("KeySketch: key ", i / d, " has a non-finite coordinate"));
    }
  }
  const int r = dims;
  if (n == 0) {
    // Nothing to fit: the first `dims` coordinate axes, unit scales.
    std::vector<float> axes(static_cast<size_t>(r * d), 0.0f);
    for (int j = 0; j < r; ++j) axes[static_cast<size_t>(j * d + j)] = 1.0f;
    return KeySketch(d, dims, std::move(axes), std::vector<float>(static_cast<size_t>(r), 1.0f));
  }
  // Second moments of the (strided) keys, accumulated in float per key then summed in float64
  // every 64 keys (the float inner loop vectorises; the float64 sum keeps the total exact enough).
  std::vector<double> m(static_cast<size_t>(d * d), 0.0);
  {
    const int64_t stride = std::max<int64_t>(1, (n + kFitKeys - 1) / kFitKeys);
    std::vector<float> block(static_cast<size_t>(d * d), 0.0f);
    int64_t in_block = 0;
    for (int64_t i = 0; i < n; i += stride) {
      const float* k = keys + i * d;
      for (int64_t a = 0; a < d; ++a) {
        const float ka = k[a];
        float* row = block.data() + a * d;
        for (int64_t b = 0; b < d; ++b) row[b] += ka * k[b];
      }
      if (++in_block == 64 || i + stride >= n) {
        for (size_t t = 0; t < block.size(); ++t) m[t] += block[t];
        std::fill(block.begin(), block.end(), 0.0f);
        in_block = 0;
      }
    }
  }
  // Subspace iteration from a fixed start (a deterministic +-1 pattern plus the coordinate axes,
  // so that no start column is orthogonal to every leading direction by construction).
  std::vector<double> q(static_cast<size_t>(d * r));
  uint64_t state = 0x9E3779B97F4A7C15ull;
  for (int c = 0; c < r; ++c) {
    for (int64_t i = 0; i < d; ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      q[static_cast<size_t>(c * d + i)] = ((state >> 63) ? 1.0 : -1.0) + (i == c ? 1.0 : 0.0);
    }
  }
  Orthonormalise(d, r, &q);
  std::vector<double> z(q.size());
  for (int it = 0; it < kIterations; ++it) {
    MultiplyColumns(m, d, r, q, &z);
    q.swap(z);
    Orthonormalise(d, r, &q);
  }
  // Rayleigh-Ritz: the directions within the subspace, by decreasing variance.
  std::vector<double> mq(q.size());
  MultiplyColumns(m, d, r, q, &mq);
  std::vector<double> t(static_cast<size_t>(r * r));
  for (int i = 0; i < r; ++i) {
    for (int j = 0; j < r; ++j) {
      double s = 0;
      for (int64_t a = 0; a < d; ++a) s += q[i * d + a] * mq[j * d + a];
      t[i * r + j] = s;
    }
  }
  for (int i = 0; i < r; ++i)
    for (int j = i + 1; j < r; ++j)
      t[i * r + j] = t[j * r + i] = 0.5 * (t[i * r + j] + t[j * r + i]);
  std::vector<double> values, vectors;
  Jacobi(r, std::move(t), &values, &vectors);
  std::vector<int> order(static_cast<size_t>(r));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return values[a] > values[b]; });
  std::vector<float> basis(static_cast<size_t>(r * d));
  for (int out = 0; out < r; ++out) {
    const int c = order[static_cast<size_t>(out)];
    for (int64_t a = 0; a < d; ++a) {
      double s = 0;
      for (int j = 0; j < r; ++j) s += q[j * d + a] * vectors[j * r + c];
      basis[static_cast<size_t>(out * d + a)] = static_cast<float>(s);
    }
  }
  // Scales: the largest coordinate of every given key along each direction maps to 127.
  KeySketch sketch(d, dims, std::move(basis), std::vector<float>(static_cast<size_t>(r), 1.0f));
  std::vector<float> largest(static_cast<size_t>(r), 0.0f), y(static_cast<size_t>(r));
  for (int64_t i = 0; i < n; ++i) {
    sketch.Project(keys + i * d, y.data());
    for (int j = 0; j < r; ++j) {
      largest[static_cast<size_t>(j)] =
          std::max(largest[static_cast<size_t>(j)], std::fabs(y[static_cast<size_t>(j)]));
    }
  }
  for (int j = 0; j < r; ++j) {
    const float l = largest[static_cast<size_t>(j)];
    sketch.scales_[static_cast<size_t>(j)] = l > 0 ? static_cast<float>(double{l} / 127) : 1.0f;
  }
  return sketch;
}

void KeySketch::Project(const float* k, float* y) const {
  // Accumulated across the dims coordinates at once (each still summed in order of a), so the
  // loop vectorises without reassociating any sum.
  std::fill(y, y + dims_, 0.0f);
  for (int64_t a = 0; a < d_; ++a) {
    const float ka = k[a];
    const float* row = basis_t_.data() + a * dims_;
    for (int j = 0; j < dims_; ++j) y[j] += row[j] * ka;
  }
}

void KeySketch::KeyCodes(const float* keys, int64_t n, uint16_t* codes) const {
  int8_t c[kMaxDims];
  float y[kMaxDims];
  for (int64_t i = 0; i < n; ++i) {
    Project(keys + i * d_, y);
    for (int j = 0; j < dims_; ++j) {
      c[j] = Quantise(static_cast<double>(y[j]) / scales_[static_cast<size_t>(j)]);
    }
    Pack(c, dims_, codes + i * words());
  }
}

void KeySketch::QueryCode(const float* q, uint16_t* code) const {
  double z[kMaxDims];
  double largest = 0;
  for (int j = 0; j < dims_; ++j) {
    const float* u = basis_.data() + j * d_;
    double s = 0;
    for (int64_t a = 0; a < d_; ++a) s += static_cast<double>(u[a]) * q[a];
    z[j] = s * scales_[static_cast<size_t>(j)];
    largest = std::max(largest, std::fabs(z[j]));
  }
  int8_t c[kMaxDims];
  for (int j = 0; j < dims_; ++j) c[j] = largest > 0 ? Quantise(127 * z[j] / largest) : 0;
  Pack(c, dims_, code);
}

}  // namespace magicpig::attention
