#include "gpu_node/backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <limits>
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

// Element-wise operations over a prefill chunk run on the arena's threads in pieces of at least
// this many values (a decode step's few thousand stay on the calling thread): serial, they were
// ~3.7% of a 4K prefill's samples on 2 threads, and their share grows with the thread count.
// Each value is computed exactly as before, so results do not change.
constexpr int64_t kParallelValues = int64_t{1} << 14;

// f(begin, end) over n items of `item_values` values each, in pieces of at least kParallelValues
// values, in parallel where n allows more than one piece.
template <typename F>
void ForPieces(int64_t n, int64_t item_values, const F& f) {
  const int64_t grain = std::max<int64_t>(1, kParallelValues / std::max<int64_t>(item_values, 1));
  if (n <= grain) {
    f(int64_t{0}, n);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, grain),
                    [&](const tbb::blocked_range<int64_t>& r) { f(r.begin(), r.end()); });
}

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

// Rope of tokens [begin, end) of x (CpuBackend::Rope), angles in double.
void RopeTokens(float* x, int64_t begin, int64_t end, int64_t n_heads, int64_t head_dim,
                const int32_t* positions, const RopeParams& params) {
  const int64_t half = params.n_rot / 2;
  std::vector<float> cos_t(half), sin_t(half);
  for (int64_t t = begin; t < end; ++t) {
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

}  // namespace

CpuBackend::CpuBackend(int num_threads, SimdLevel level, bool float_activations)
    : num_threads_(num_threads > 0 ? num_threads : tbb::this_task_arena::max_concurrency()),
      level_(level),
      float_activations_(float_activations),
      arena_(std::make_unique<tbb::task_arena>(num_threads_)) {}

CpuBackend::~CpuBackend() = default;

std::string CpuBackend::Describe() const {
  // The AVX-512 extensions that change which kernels run (int8 products, the bf16 key hash), so
  // that a benchmark's header says what its host could use.
  std::string extensions;
  if (level_ == SimdLevel::kAvx512) {
    if (CpuHasAvx512Vnni()) extensions += "+vnni";
    if (CpuHasAvx512Bf16()) extensions += "+bf16";
  }
  return absl::StrCat("cpu (", std::string(SimdLevelName(level_)), extensions, ", ", num_threads_,
                      " threads", float_activations_ ? ", float activations" : "", ")");
}

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
  ForPieces(n_tokens, dim, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* xt = x + t * dim;
      float* ot = out + t * dim;
      double sum_sq = 0.0;
      for (int64_t i = 0; i < dim; ++i) sum_sq += static_cast<double>(xt[i]) * xt[i];
      const float inv = static_cast<float>(1.0 / std::sqrt(sum_sq / dim + eps));
      for (int64_t i = 0; i < dim; ++i) ot[i] = xt[i] * inv * weight[i];
    }
  });
}

void CpuBackend::AddBias(float* x, const float* bias, int64_t n_tokens, int64_t dim) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t i = 0; i < dim; ++i) x[t * dim + i] += bias[i];
  }
}

void CpuBackend::Add(const float* x, float* y, int64_t n) { AxpyF32(1.0f, x, y, n, level_); }

void CpuBackend::Rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
                      const int32_t* positions, const RopeParams& params) {
  ForPieces(n_tokens, n_heads * head_dim, [&](int64_t begin, int64_t end) {
    RopeTokens(x, begin, end, n_heads, head_dim, positions, params);
  });
}

void CpuBackend::SwiGlu(const float* gate, const float* up, int64_t n, float* out) {
  ForPieces(n, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float g = gate[i];
      out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
  });
}

void CpuBackend::StoreKv(const float* k, const float* v, int64_t n_tokens, int64_t first_pos,
                         const KvLayerView& cache) {
  const int64_t row = cache.n_head_kv * cache.head_dim;
  const int64_t at = cache.Row(first_pos);
  ConvertF32ToF16(k, cache.k + at * row, n_tokens * row, level_);
  ConvertF32ToF16(v, cache.v + at * row, n_tokens * row, level_);
}

void CpuBackend::CausalAttention(const float* q, int64_t n_tokens, int64_t first_pos,
                                 int64_t n_head, float scale, const KvLayerView& cache,
                                 float* out) {
  auto* kernel = AttentionKernelFor(level_);
  const int64_t n_tiles = (n_tokens + kQueryTile - 1) / kQueryTile;
  const int64_t group = n_head / cache.n_head_kv;
  const int64_t n_keys = first_pos + n_tokens;
  // Decode-sized calls have only n_head_kv work items; split their keys into segments (aligned to
  // the kernel's 32-key tiles) so every thread streams part of the cache, then merge the
  // segments' partials exactly by log-sum-exp ("flash decoding").
  int64_t segments = 1;
  if (n_tiles == 1 && n_keys >= 512) {
    const int64_t want = (2 * num_threads_ + cache.n_head_kv - 1) / cache.n_head_kv;
    segments = std::clamp<int64_t>(want, 1, n_keys / 256);
  }
  const int64_t seg_len = ((n_keys + segments - 1) / segments + 31) / 32 * 32;
  segments = (n_keys + seg_len - 1) / seg_len;
  const int64_t row = n_head * cache.head_dim;
  std::vector<float> partial_out, partial_lse;
  if (segments > 1) {
    partial_out.resize(segments * n_tokens * row);
    partial_lse.resize(segments * n_tokens * n_head);
  }
  const int64_t items = n_tiles * cache.n_head_kv * segments;
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, items, 1), [&](const auto& range) {
    std::vector<float> scratch(
        cpu_internal::AttentionScratchFloats(kQueryTile * group, cache.head_dim));
    for (int64_t item = range.begin(); item < range.end(); ++item) {
      const int64_t seg = item % segments;
      const int64_t rest = item / segments;
      // Later tiles see more keys: hand them out first for better load balance.
      const int64_t tile = n_tiles - 1 - rest / cache.n_head_kv;
      AttentionTile a;
      a.q = q;
      a.out = segments > 1 ? partial_out.data() + seg * n_tokens * row : out;
      a.k = cache.k;
      a.v = cache.v;
      a.n_head = n_head;
      a.n_head_kv = cache.n_head_kv;
      a.head_dim = cache.head_dim;
      a.kv_head = rest % cache.n_head_kv;
      a.t0 = tile * kQueryTile;
      a.t1 = std::min(n_tokens, a.t0 + kQueryTile);
      a.first_pos = first_pos;
      a.scale = scale;
      if (segments > 1) {
        a.key_begin = seg * seg_len;
        a.key_end = std::min(n_keys, a.key_begin + seg_len);
        a.lse = partial_lse.data() + seg * n_tokens * n_head;
      }
      a.scratch = scratch.data();
      kernel(a);
    }
  });
  if (segments == 1) return;
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t h = 0; h < n_head; ++h) {
      float max_lse = -std::numeric_limits<float>::infinity();
      for (int64_t s = 0; s < segments; ++s) {
        max_lse = std::max(max_lse, partial_lse[(s * n_tokens + t) * n_head + h]);
      }
      float* dst = out + t * row + h * cache.head_dim;
      std::fill(dst, dst + cache.head_dim, 0.0f);
      float total = 0;
      for (int64_t s = 0; s < segments; ++s) {
        const float lse = partial_lse[(s * n_tokens + t) * n_head + h];
        if (lse == -std::numeric_limits<float>::infinity()) continue;
        const float w = std::exp(lse - max_lse);
        total += w;
        AxpyF32(w, partial_out.data() + s * n_tokens * row + t * row + h * cache.head_dim, dst,
                cache.head_dim, level_);
      }
      const float inv = 1.0f / total;
      for (int64_t d = 0; d < cache.head_dim; ++d) dst[d] *= inv;
    }
  }
}

void CpuBackend::RangeAttention(const float* q, int64_t n_head, float scale,
                                const KvLayerView& cache,
                                absl::Span<const std::pair<int64_t, int64_t>> position_ranges,
                                float* out, float* lse) {
  const std::vector<std::pair<int64_t, int64_t>> ranges = RangesAsRows(cache, position_ranges);
  auto* kernel = AttentionKernelFor(level_);
  const int64_t group = n_head / cache.n_head_kv;
  const int64_t hd = cache.head_dim;
  const int64_t row = n_head * hd;
  const int64_t n_ranges = static_cast<int64_t>(ranges.size());
  // One partial per (range, head), merged below; the kernel's causal limit is the last key of all
  // ranges (every key in a range is visible to the query).
  int64_t last = 0;
  for (const auto& [b, e] : ranges) last = std::max(last, e);
  std::vector<float> part_out(std::max<int64_t>(1, n_ranges) * row, 0.0f);
  std::vector<float> part_lse(std::max<int64_t>(1, n_ranges) * n_head,
                              -std::numeric_limits<float>::infinity());
  const int64_t items = n_ranges * cache.n_head_kv;
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, items, 1), [&](const auto& range) {
    std::vector<float> scratch(cpu_internal::AttentionScratchFloats(group, hd));
    for (int64_t item = range.begin(); item < range.end(); ++item) {
      const int64_t r = item / cache.n_head_kv;
      const auto [begin, end] = ranges[static_cast<size_t>(r)];
      if (end <= begin) continue;
      AttentionTile a;
      a.q = q;
      a.out = part_out.data() + r * row;
      a.k = cache.k;
      a.v = cache.v;
      a.n_head = n_head;
      a.n_head_kv = cache.n_head_kv;
      a.head_dim = hd;
      a.kv_head = item % cache.n_head_kv;
      a.t0 = 0;
      a.t1 = 1;
      a.first_pos = last - 1;
      a.scale = scale;
      a.key_begin = begin;
      a.key_end = end;
      a.lse = part_lse.data() + r * n_head;
      a.scratch = scratch.data();
      kernel(a);
    }
  });
  for (int64_t h = 0; h < n_head; ++h) {
    float max_lse = -std::numeric_limits<float>::infinity();
    for (int64_t r = 0; r < n_ranges; ++r) max_lse = std::max(max_lse, part_lse[r * n_head + h]);
    float* dst = out + h * hd;
    std::fill(dst, dst + hd, 0.0f);
    lse[h] = max_lse;
    if (max_lse == -std::numeric_limits<float>::infinity()) continue;
    float total = 0.0f;
    for (int64_t r = 0; r < n_ranges; ++r) {
      const float l = part_lse[r * n_head + h];
      if (l == -std::numeric_limits<float>::infinity()) continue;
      const float w = std::exp(l - max_lse);
      total += w;
      AxpyF32(w, part_out.data() + r * row + h * hd, dst, hd, level_);
    }
    const float inv = 1.0f / total;
    for (int64_t t = 0; t < hd; ++t) dst[t] *= inv;
    lse[h] = max_lse + std::log(total);
  }
}

}  // namespace magicpig::backend
