#include "tests/testing/fake_device_backend.h"

#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace magicpig::testing {

FakeDeviceBackend::FakeDeviceBackend(int num_threads, bool float_activations)
    : cpu_(num_threads, ActiveSimdLevel(), float_activations) {}

absl::StatusOr<backend::BackendBuffer> FakeDeviceBackend::Allocate(int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError("negative allocation");
  if (bytes == 0) return backend::BackendBuffer();
  const size_t rounded = (static_cast<size_t>(bytes) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (p == nullptr) return absl::ResourceExhaustedError("out of memory");
  // Poison: a read of memory nothing wrote shows up as NaN in results.
  std::memset(p, 0xff, rounded);
  {
    std::lock_guard<std::mutex> lock(registry_->mu);
    registry_->live[reinterpret_cast<uintptr_t>(p)] = reinterpret_cast<uintptr_t>(p) + bytes;
    registry_->bytes += bytes;
  }
  return backend::BackendBuffer(p, bytes, [registry = registry_, bytes](void* q) {
    {
      std::lock_guard<std::mutex> lock(registry->mu);
      registry->live.erase(reinterpret_cast<uintptr_t>(q));
      registry->bytes -= bytes;
    }
    std::free(q);
  });
}

int64_t FakeDeviceBackend::bytes_in_use() const {
  std::lock_guard<std::mutex> lock(registry_->mu);
  return registry_->bytes;
}

bool FakeDeviceBackend::IsDevice(const void* p, int64_t bytes) const {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(registry_->mu);
  auto it = registry_->live.upper_bound(a);
  if (it == registry_->live.begin()) return false;
  --it;
  return a >= it->first && a + static_cast<uintptr_t>(bytes) <= it->second;
}

bool FakeDeviceBackend::Check(bool ok, const char* op, const char* what) {
  if (!ok && error_.ok()) {
    error_ = absl::FailedPreconditionError(absl::StrCat(op, ": ", what));
  }
  return ok;
}

absl::Status FakeDeviceBackend::CopyIn(void* dst, const void* host_src, int64_t bytes) {
  if (bytes <= 0) return absl::OkStatus();
  if (!IsDevice(dst, bytes))
    return absl::FailedPreconditionError("CopyIn: dst is not device memory");
  if (IsDevice(host_src, bytes))
    return absl::FailedPreconditionError("CopyIn: src is device memory");
  std::memcpy(dst, host_src, static_cast<size_t>(bytes));
  return absl::OkStatus();
}

absl::Status FakeDeviceBackend::CheckCopyToHost(const char* op, const void* host_dst,
                                                const void* src, int64_t bytes) const {
  if (!IsDevice(src, bytes)) {
    return absl::FailedPreconditionError(
        absl::StrCat(op, ": src is not device memory (", bytes, " bytes)"));
  }
  if (IsDevice(host_dst, bytes)) {
    return absl::FailedPreconditionError(absl::StrCat(op, ": dst is device memory"));
  }
  return absl::OkStatus();
}

absl::Status FakeDeviceBackend::CopyOut(void* host_dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return absl::OkStatus();
  MAGICPIG_RETURN_IF_ERROR(CheckCopyToHost("CopyOut", host_dst, src, bytes));
  ++waits_;
  Deliver();  // a synchronous copy waits for the queued ones too
  std::memcpy(host_dst, src, static_cast<size_t>(bytes));
  return absl::OkStatus();
}

absl::Status FakeDeviceBackend::CopyOutLater(void* host_dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return absl::OkStatus();
  MAGICPIG_RETURN_IF_ERROR(CheckCopyToHost("CopyOutLater", host_dst, src, bytes));
  Queue(host_dst, src, bytes);
  return absl::OkStatus();
}

void FakeDeviceBackend::Queue(void* host_dst, const void* data, int64_t bytes) {
  // The data as it is now (a device copy sees it so), written at the flush; until then the
  // destination reads as NaN bytes, so a reader that does not flush first sees garbage.
  const char* p = static_cast<const char*>(data);
  queued_.push_back({host_dst, std::string(p, p + bytes)});
  std::memset(host_dst, 0xff, static_cast<size_t>(bytes));
}

absl::Status FakeDeviceBackend::FlushCopies() {
  if (!queued_.empty()) ++waits_;
  Deliver();
  return absl::OkStatus();
}

void FakeDeviceBackend::Deliver() {
  for (const QueuedCopy& c : queued_) std::memcpy(c.host_dst, c.data.data(), c.data.size());
  queued_.clear();
}

absl::Status FakeDeviceBackend::CopyWithin(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return absl::OkStatus();
  if (!IsDevice(dst, bytes) || !IsDevice(src, bytes)) {
    return absl::FailedPreconditionError("CopyWithin: not device memory");
  }
  std::memmove(dst, src, static_cast<size_t>(bytes));
  return absl::OkStatus();
}

absl::Status FakeDeviceBackend::PrepareMatrix(const QuantMatrix& w) {
  matrices_.insert(w.data);
  return absl::OkStatus();
}

absl::Status FakeDeviceBackend::PrepareVector(const float* v, int64_t n) {
  vectors_.insert(v);
  return absl::OkStatus();
}

absl::Status FakeDeviceBackend::Execute(absl::FunctionRef<absl::Status()> batch) {
  error_ = absl::OkStatus();
  absl::Status status = cpu_.Execute(batch);
  if (status.ok()) status = error_;
  error_ = absl::OkStatus();
  if (status.ok()) status = FlushCopies();
  queued_.clear();
  return status;
}

absl::Status FakeDeviceBackend::MatMul(const QuantMatrix& w, const float* x, int64_t n_tokens,
                                       float* y) {
  const bool ok = Check(matrices_.contains(w.data), "MatMul", "weights not prepared") &&
                  Check(IsDevice(x, n_tokens * w.cols * 4), "MatMul", "x is not device memory") &&
                  Check(IsDevice(y, n_tokens * w.rows * 4), "MatMul", "y is not device memory");
  if (!ok) return error_;
  return cpu_.MatMul(w, x, n_tokens, y);
}

absl::Status FakeDeviceBackend::Embed(const QuantMatrix& table, absl::Span<const int32_t> ids,
                                      float* out) {
  const int64_t n = static_cast<int64_t>(ids.size());
  const bool ok = Check(matrices_.contains(table.data), "Embed", "table not prepared") &&
                  Check(!IsDevice(ids.data(), n * 4), "Embed", "ids must be host memory") &&
                  Check(IsDevice(out, n * table.cols * 4), "Embed", "out is not device memory");
  if (!ok) return error_;
  return cpu_.Embed(table, ids, out);
}

void FakeDeviceBackend::RmsNorm(const float* x, const float* weight, int64_t n_tokens, int64_t dim,
                                float eps, float* out) {
  if (Check(vectors_.contains(weight), "RmsNorm", "weight not prepared") &&
      Check(IsDevice(x, n_tokens * dim * 4) && IsDevice(out, n_tokens * dim * 4), "RmsNorm",
            "activations are not device memory")) {
    cpu_.RmsNorm(x, weight, n_tokens, dim, eps, out);
  }
}

void FakeDeviceBackend::AddBias(float* x, const float* bias, int64_t n_tokens, int64_t dim) {
  if (Check(vectors_.contains(bias), "AddBias", "bias not prepared") &&
      Check(IsDevice(x, n_tokens * dim * 4), "AddBias", "x is not device memory")) {
    cpu_.AddBias(x, bias, n_tokens, dim);
  }
}

void FakeDeviceBackend::Add(const float* x, float* y, int64_t n) {
  if (Check(IsDevice(x, n * 4) && IsDevice(y, n * 4), "Add", "not device memory")) {
    cpu_.Add(x, y, n);
  }
}

void FakeDeviceBackend::Rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
                             const int32_t* positions, const backend::RopeParams& params) {
  if (Check(IsDevice(x, n_tokens * n_heads * head_dim * 4), "Rope", "x is not device memory") &&
      Check(IsDevice(positions, n_tokens * 4), "Rope", "positions are not device memory")) {
    cpu_.Rope(x, n_tokens, n_heads, head_dim, positions, params);
  }
}

void FakeDeviceBackend::SwiGlu(const float* gate, const float* up, int64_t n, float* out) {
  if (Check(IsDevice(gate, n * 4) && IsDevice(up, n * 4) && IsDevice(out, n * 4), "SwiGlu",
            "not device memory")) {
    cpu_.SwiGlu(gate, up, n, out);
  }
}

void FakeDeviceBackend::StoreKv(const float* k, const float* v, int64_t n_tokens, int64_t first_pos,
                                const backend::KvLayerView& cache) {
  const int64_t row = cache.n_head_kv * cache.head_dim;
  if (Check(IsDevice(k, n_tokens * row * 4) && IsDevice(v, n_tokens * row * 4), "StoreKv",
            "k/v are not device memory") &&
      Check(IsDevice(cache.k + cache.Row(first_pos) * row, n_tokens * row * 2) &&
                IsDevice(cache.v + cache.Row(first_pos) * row, n_tokens * row * 2),
            "StoreKv", "the cache rows are not device memory")) {
    cpu_.StoreKv(k, v, n_tokens, first_pos, cache);
  }
}

void FakeDeviceBackend::CausalAttention(const float* q, int64_t n_tokens, int64_t first_pos,
                                        int64_t n_head, float scale,
                                        const backend::KvLayerView& cache, float* out) {
  const int64_t q_bytes = n_tokens * n_head * cache.head_dim * 4;
  const int64_t kv_bytes = (first_pos + n_tokens) * cache.n_head_kv * cache.head_dim * 2;
  if (Check(!cache.has_gap(), "CausalAttention", "the layer's offloaded rows left the device") &&
      Check(IsDevice(q, q_bytes) && IsDevice(out, q_bytes), "CausalAttention",
            "q/out are not device memory") &&
      Check(IsDevice(cache.k, kv_bytes) && IsDevice(cache.v, kv_bytes), "CausalAttention",
            "the cache is not device memory")) {
    cpu_.CausalAttention(q, n_tokens, first_pos, n_head, scale, cache, out);
  }
}

absl::Status FakeDeviceBackend::SimHashCodes(const attention::SimHash& hash, const float* x,
                                             int64_t n, uint16_t* codes) {
  ++simhash_calls_;
  if (!Check(IsDevice(x, n * hash.dim() * 4), "SimHashCodes", "x is not device memory") ||
      !Check(!IsDevice(codes, n * hash.l() * 2), "SimHashCodes", "codes must be host memory")) {
    return error_;
  }
  std::vector<float> host(static_cast<size_t>(n * hash.dim()));
  std::memcpy(host.data(), x, host.size() * sizeof(float));
  std::vector<uint16_t> computed(static_cast<size_t>(n * hash.l()));
  MAGICPIG_RETURN_IF_ERROR(hash.Codes(host.data(), n, hash.dim(), computed.data()));
  Queue(codes, computed.data(), n * hash.l() * 2);  // they arrive as CopyOutLater's data does
  return absl::OkStatus();
}

absl::Status FakeDeviceBackend::OffloadKeyCodes(const attention::SimHash& hash,
                                                const backend::KvLayerView& cache, int64_t begin,
                                                int64_t end, bool compute_centre, float* centre,
                                                uint16_t* codes) {
  ++offload_key_codes_calls_;
  const int64_t n = end - begin, n_kv = cache.n_head_kv, hd = cache.head_dim;
  const bool ok =
      Check(begin >= 0 && n >= 0 && !cache.has_gap() && end <= cache.capacity, "OffloadKeyCodes",
            "positions outside the cache (or a cache with a gap)") &&
      Check(IsDevice(cache.k, cache.capacity * n_kv * hd * 2), "OffloadKeyCodes",
            "the cache is not device memory") &&
      Check(!IsDevice(centre, n_kv * hd * 4) && !IsDevice(codes, n_kv * n * hash.l() * 2),
            "OffloadKeyCodes", "centre and codes must be host memory");
  if (!ok) return error_;
  if (n == 0) return absl::OkStatus();
  // The CPU arithmetic on the "device" copy; both outputs arrive as CopyOutLater's data does.
  std::vector<float> c(centre, centre + n_kv * hd);
  std::vector<uint16_t> computed(static_cast<size_t>(n_kv * n * hash.l()));
  MAGICPIG_RETURN_IF_ERROR(
      backend::CentredKeyCodes(hash, cache, begin, end, compute_centre, c.data(), computed.data()));
  if (compute_centre) Queue(centre, c.data(), n_kv * hd * 4);
  Queue(codes, computed.data(), n_kv * n * hash.l() * 2);
  return absl::OkStatus();
}

void FakeDeviceBackend::RangeAttention(const float* q, int64_t n_head, float scale,
                                       const backend::KvLayerView& cache,
                                       absl::Span<const std::pair<int64_t, int64_t>> ranges,
                                       float* out, float* lse) {
  ++range_attention_calls_;
  const int64_t q_bytes = n_head * cache.head_dim * 4;
  if (Check(IsDevice(q, q_bytes) && IsDevice(out, q_bytes) && IsDevice(lse, n_head * 4),
            "RangeAttention", "q/out/lse are not device memory") &&
      Check(IsDevice(cache.k, cache.capacity * cache.n_head_kv * cache.head_dim * 2),
            "RangeAttention", "the cache is not device memory")) {
    cpu_.RangeAttention(q, n_head, scale, cache, ranges, out, lse);
  }
}

}  // namespace magicpig::testing
