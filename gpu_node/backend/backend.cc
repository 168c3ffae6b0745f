#include "gpu_node/backend/backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/cpu_features.h"
#include "common/status_macros.h"
#include "common/vec_kernels.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"

namespace magicpig::backend {

absl::StatusOr<BackendBuffer> Backend::Allocate(int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("allocation of ", bytes, " bytes"));
  if (bytes == 0) return BackendBuffer();
  // aligned_alloc wants a multiple of the alignment.
  const size_t rounded = (static_cast<size_t>(bytes) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("out of host memory for ", bytes, " bytes"));
  }
  return BackendBuffer(p, bytes, [](void* q) { std::free(q); });
}

absl::Status Backend::Reserve(BackendBuffer& buffer, int64_t bytes) {
  if (buffer.bytes() >= bytes) return absl::OkStatus();
  buffer = BackendBuffer();  // the old one goes first: the device need not hold both
  absl::StatusOr<BackendBuffer> grown = Allocate(bytes);
  if (!grown.ok()) return grown.status();
  buffer = *std::move(grown);
  return absl::OkStatus();
}

absl::Status Backend::CopyIn(void* dst, const void* host_src, int64_t bytes) {
  if (bytes > 0) std::memcpy(dst, host_src, static_cast<size_t>(bytes));
  return absl::OkStatus();
}

absl::Status Backend::CopyOut(void* host_dst, const void* src, int64_t bytes) {
  if (bytes > 0) std::memcpy(host_dst, src, static_cast<size_t>(bytes));
  return absl::OkStatus();
}

absl::Status Backend::CopyWithin(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0) std::memmove(dst, src, static_cast<size_t>(bytes));
  return absl::OkStatus();
}

std::vector<std::pair<int64_t, int64_t>> RangesAsRows(
    const KvLayerView& cache, absl::Span<const std::pair<int64_t, int64_t>> ranges) {
  std::vector<std::pair<int64_t, int64_t>> rows;
  rows.reserve(ranges.size() + 1);
  for (auto [begin, end] : ranges) {
    if (!cache.has_gap() || end <= cache.gap_begin || begin >= cache.gap_end) {
      rows.emplace_back(cache.Row(begin), begin < end ? cache.Row(end - 1) + 1 : cache.Row(begin));
      continue;
    }
    // The range meets the gap: its stored parts before and after.
    if (begin < cache.gap_begin) rows.emplace_back(begin, cache.gap_begin);
    if (end > cache.gap_end) rows.emplace_back(cache.Row(cache.gap_end), cache.Row(end - 1) + 1);
  }
  return rows;
}

void CentredKeys(const KvLayerView& cache, int64_t begin, int64_t end, bool compute_centre,
                 float* centre, float* keys_out, float* values_out) {
  const int64_t hd = cache.head_dim, n_kv = cache.n_head_kv, n = end - begin;
  if (n <= 0) return;
  const SimdLevel level = ActiveSimdLevel();
  // Work items of kBlock positions of one kv head: enough of them to spread a 4K-token layer of
  // a model with few kv heads over the threads, each long enough to cost more than its scheduling.
  constexpr int64_t kBlock = 256;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  auto for_blocks = [&](auto body) {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, n_kv * blocks),
                      [&](const tbb::blocked_range<int64_t>& r) {
                        for (int64_t w = r.begin(); w < r.end(); ++w) {
                          const int64_t g = w / blocks, i0 = (w % blocks) * kBlock;
                          body(g, i0, std::min(n, i0 + kBlock));
                        }
                      });
  };
  for_blocks([&](int64_t g, int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t src = (cache.Row(begin + i) * n_kv + g) * hd;
      const int64_t dst = (g * n + i) * hd;
      ConvertF16ToF32(cache.k + src, keys_out + dst, hd, level);
      if (values_out != nullptr) ConvertF16ToF32(cache.v + src, values_out + dst, hd, level);
    }
  });
  if (compute_centre) {
    // Per kv head: float64 sums in position order, so any split of the dimensions (or a device's
    // thread per dimension) adds the same values in the same order.
    tbb::parallel_for(int64_t{0}, n_kv, [&](int64_t g) {
      std::vector<double> sum(static_cast<size_t>(hd), 0.0);
      for (int64_t i = 0; i < n; ++i) {
        const float* row = keys_out + (g * n + i) * hd;
        for (int64_t t = 0; t < hd; ++t) sum[static_cast<size_t>(t)] += row[t];
      }
      for (int64_t t = 0; t < hd; ++t) {
        centre[g * hd + t] = static_cast<float>(sum[static_cast<size_t>(t)] / n);
      }
    });
  }
  for_blocks([&](int64_t g, int64_t i0, int64_t i1) {
    const float* c = centre + g * hd;
    for (int64_t i = i0; i < i1; ++i) {
      float* row = keys_out + (g * n + i) * hd;
      for (int64_t t = 0; t < hd; ++t) row[t] -= c[t];
    }
  });
}

absl::Status Backend::OffloadKeyCodes(const attention::SimHash& hash, const KvLayerView& cache,
                                      int64_t begin, int64_t end, bool compute_centre,
                                      float* centre, uint16_t* codes) {
  if (!host_memory()) {
    return absl::UnimplementedError(absl::StrCat(
        std::string(name()), " backend: OffloadKeyCodes over device memory is not implemented"));
  }
  return CentredKeyCodes(hash, cache, begin, end, compute_centre, centre, codes);
}

absl::Status CentredKeyCodes(const attention::SimHash& hash, const KvLayerView& cache,
                             int64_t begin, int64_t end, bool compute_centre, float* centre,
                             uint16_t* codes) {
  const int64_t n = end - begin;
  if (n <= 0) return absl::OkStatus();
  std::vector<float> keys(static_cast<size_t>(cache.n_head_kv * n * cache.head_dim));
  CentredKeys(cache, begin, end, compute_centre, centre, keys.data(), nullptr);
  return hash.KeyCodes(keys.data(), cache.n_head_kv * n, cache.head_dim, codes);
}

const float* Backend::Normalised(const float* x, int64_t n_tokens, int64_t cols,
                                 const InputNorm& norm) {
  if (norm.weight == nullptr) return x;
  RmsNorm(x, norm.weight, n_tokens, cols, norm.eps, norm.out);
  return norm.out;
}

absl::Status Backend::MatMuls(absl::Span<const Product> products, const float* x, int64_t n_tokens,
                              const InputNorm& norm) {
  if (products.empty()) return absl::OkStatus();
  x = Normalised(x, n_tokens, products[0].w->cols, norm);
  for (const Product& p : products) {
    MAGICPIG_RETURN_IF_ERROR(MatMul(*p.w, x, n_tokens, p.y));
  }
  for (const Product& p : products) {
    if (p.bias != nullptr) AddBias(p.y, p.bias, n_tokens, p.w->rows);
  }
  return absl::OkStatus();
}

absl::Status Backend::MatMulAdd(const QuantMatrix& w, const float* x, int64_t n_tokens, float* y,
                                float* scratch) {
  MAGICPIG_RETURN_IF_ERROR(MatMul(w, x, n_tokens, scratch));
  Add(scratch, y, n_tokens * w.rows);
  return absl::OkStatus();
}

absl::Status Backend::GateUpSwiGlu(const QuantMatrix& w_gate, const QuantMatrix& w_up,
                                   const float* x, int64_t n_tokens, const InputNorm& norm,
                                   float* gate, float* up, float* out) {
  x = Normalised(x, n_tokens, w_gate.cols, norm);
  MAGICPIG_RETURN_IF_ERROR(MatMul(w_gate, x, n_tokens, gate));
  MAGICPIG_RETURN_IF_ERROR(MatMul(w_up, x, n_tokens, up));
  SwiGlu(gate, up, n_tokens * w_gate.rows, out);
  return absl::OkStatus();
}

}  // namespace magicpig::backend
