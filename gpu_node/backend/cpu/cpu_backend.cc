#include "gpu_node/backend/cpu/cpu_backend.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/vec_kernels.h"
#include "gpu_node/backend/cpu/attention_kernel.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"
#include "tbb/task_arena.h"

namespace magicpig::backend {
namespace {

using cpu_internal::AttentionTile;

// Query tokens per attention work item: enough to reuse each converted key tile, small enough to
// leave parallelism at decode-sized batches.
constexpr int64_t kQueryTile = 16;

void (*AttentionKernelFor(SimdLevel level))(const AttentionTile&) {
  switch (level) {
    case SimdLevel::kAvx512:
      return cpu_internal::AttentionTileAvx512;
    case SimdLevel::kAvx2:
      return cpu_internal::AttentionTileAvx2;
    case SimdLevel::kScalar:
      break;
  }
  return cpu_internal::AttentionTileScalar;
}

}  // namespace

CpuBackend::CpuBackend(int num_threads, SimdLevel level, bool float_activations)
    : num_threads_(num_threads > 0 ? num_threads : tbb::this_task_arena::max_concurrency()),
      level_(level),
      float_activations_(float_activations),
      arena_(std::make_unique<tbb::task_arena>(num_threads_)) {}

CpuBackend::~CpuBackend() = default;

absl::Status CpuBackend::Execute(absl::FunctionRef<absl::Status()> batch) {
  absl::Status status;
  arena_->execute([&] { status = batch(); });
  return status;
}

absl::Status CpuBackend::MatMul(const QuantMatrix& w, const float* x, int64_t n_tokens, float* y) {
  if (float_activations_) {
    return MatMulFloatActivations(w, x, w.cols, n_tokens, y, w.rows, level_);
  }
  return magicpig::MatMul(w, x, w.cols, n_tokens, y, w.rows, level_);
}

absl::Status CpuBackend::Embed(const QuantMatrix& table, absl::Span<const int32_t> ids,
                               float* out) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= table.rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", ids[i], " is outside the vocabulary [0, ", table.rows, ")"));
    }
    absl::Status s = GetRow(table, ids[i], out + static_cast<int64_t>(i) * table.cols);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

void CpuBackend::RmsNorm(const float* x, const float* weight, int64_t n_tokens, int64_t dim,
                         float eps, float* out) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* xt = x + t * dim;
    float* ot = out + t * dim;
    double sum_sq = 0.0;
    for (int64_t i = 0; i < dim; ++i) sum_sq += static_cast<double>(xt[i]) * xt[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(sum_sq / dim + eps));
    for (int64_t i = 0; i < dim; ++i) ot[i] = xt[i] * inv * weight[i];
  }
}

void CpuBackend::AddBias(float* x, const float* bias, int64_t n_tokens, int64_t dim) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t i = 0; i < dim; ++i) x[t * dim + i] += bias[i];
  }
}

void CpuBackend::Add(const float* x, float* y, int64_t n) { AxpyF32(1.0f, x, y, n, level_); }

void CpuBackend::Rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
                      const int32_t* positions, const RopeParams& params) {
  const int64_t half = params.n_rot / 2;
  std::vector<float> cos_t(half), sin_t(half);
  for (int64_t t = 0; t < n_tokens; ++t) {
    // Angles in double: theta_i = pos * base^(-2i / n_rot).
    for (int64_t i = 0; i < half; ++i) {
      const double theta =
          positions[t] * std::pow(params.freq_base, -2.0 * static_cast<double>(i) / params.n_rot);
      cos_t[i] = static_cast<float>(std::cos(theta));
      sin_t[i] = static_cast<float>(std::sin(theta));
    }
    for (int64_t h = 0; h < n_heads; ++h) {
      float* xh = x + (t * n_heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const int64_t a = params.pairing == RopePairing::kAdjacent ? 2 * i : i;
        const int64_t b = params.pairing == RopePairing::kAdjacent ? 2 * i + 1 : i + half;
        const float xa = xh[a], xb = xh[b];
        xh[a] = xa * cos_t[i] - xb * sin_t[i];
        xh[b] = xa * sin_t[i] + xb * cos_t[i];
      }
    }
  }
}

void CpuBackend::SwiGlu(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void CpuBackend::StoreKv(const float* k, const float* v, int64_t n_tokens, int64_t first_pos,
                         const KvLayerView& cache) {
  const int64_t row = cache.n_head_kv * cache.head_dim;
  ConvertF32ToF16(k, cache.k + first_pos * row, n_tokens * row, level_);
  ConvertF32ToF16(v, cache.v + first_pos * row, n_tokens * row, level_);
}

void CpuBackend::CausalAttention(const float* q, int64_t n_tokens, int64_t first_pos,
                                 int64_t n_head, float scale, const KvLayerView& cache,
                                 float* out) {
  auto* kernel = AttentionKernelFor(level_);
  const int64_t n_tiles = (n_tokens + kQueryTile - 1) / kQueryTile;
  const int64_t group = n_head / cache.n_head_kv;
  const int64_t items = n_tiles * cache.n_head_kv;
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, items, 1), [&](const auto& range) {
    std::vector<float> scratch(
        cpu_internal::AttentionScratchFloats(kQueryTile * group, cache.head_dim));
    for (int64_t item = range.begin(); item < range.end(); ++item) {
      // Later tiles see more keys: hand them out first for better load balance.
      const int64_t tile = n_tiles - 1 - item / cache.n_head_kv;
      AttentionTile a;
      a.q = q;
      a.out = out;
      a.k = cache.k;
      a.v = cache.v;
      a.n_head = n_head;
      a.n_head_kv = cache.n_head_kv;
      a.head_dim = cache.head_dim;
      a.kv_head = item % cache.n_head_kv;
      a.t0 = tile * kQueryTile;
      a.t1 = std::min(n_tokens, a.t0 + kQueryTile);
      a.first_pos = first_pos;
      a.scale = scale;
      a.scratch = scratch.data();
      kernel(a);
    }
  });
}

}  // namespace magicpig::backend
