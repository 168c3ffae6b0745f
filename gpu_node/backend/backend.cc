#include "gpu_node/backend/backend.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

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
