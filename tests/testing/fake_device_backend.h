// FakeDeviceBackend: a Backend that behaves like a device backend but computes with the CPU
// backend, so that the transformer's and the engine's device paths run (and are checked) on
// machines without a GPU.
//
// Like the CUDA backend, host_memory() is false, weights must go through PrepareMatrix /
// PrepareVector, and operations must be given memory this backend allocated. Unlike it, every
// operation checks that: an activation, position or cache pointer (with the bytes the operation
// touches) outside a live allocation, or a weight that was not prepared, fails the batch with
// FAILED_PRECONDITION naming the operation. The arithmetic is the CPU backend's, so results are
// bit-identical to a CpuBackend's with the same settings.
//
// Thread-safety: as CpuBackend; the allocation registry is shared with the buffers' release
// functions under a mutex.
#ifndef MAGICPIG_TESTS_TESTING_FAKE_DEVICE_BACKEND_H_
#define MAGICPIG_TESTS_TESTING_FAKE_DEVICE_BACKEND_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "gpu_node/backend/cpu/cpu_backend.h"

namespace magicpig::testing {

class FakeDeviceBackend final : public backend::Backend {
 public:
  explicit FakeDeviceBackend(int num_threads = 1, bool float_activations = false);

  std::string_view name() const override { return "fake-device"; }
  bool host_memory() const override { return false; }
  // The CPU backend's layout (the arithmetic is its): a caller that opens the model for this
  // backend should read it interleaved when this is true, or the products round differently from
  // a CpuBackend's (Engine::Load maps the file for device backends and cannot).
  bool wants_interleaved_weights() const override { return cpu_.wants_interleaved_weights(); }
  DeviceMemoryStats DeviceMemory() const override { return {bytes_in_use(), 0}; }
  absl::StatusOr<backend::BackendBuffer> Allocate(int64_t bytes) override;
  absl::Status CopyIn(void* dst, const void* host_src, int64_t bytes) override;
  absl::Status CopyOut(void* host_dst, const void* src, int64_t bytes) override;
  // Queued copies land at FlushCopies, a CopyOut or the end of Execute; until then their
  // destinations hold NaN bytes (so a reader that does not wait for them reads garbage).
  absl::Status CopyOutLater(void* host_dst, const void* src, int64_t bytes) override;
  absl::Status FlushCopies() override;
  absl::Status CopyWithin(void* dst, const void* src, int64_t bytes) override;
  absl::Status PrepareMatrix(const QuantMatrix& w) override;
  absl::Status PrepareVector(const float* v, int64_t n) override;

  absl::Status Execute(absl::FunctionRef<absl::Status()> batch) override;
  absl::Status MatMul(const QuantMatrix& w, const float* x, int64_t n_tokens, float* y) override;
  absl::Status Embed(const QuantMatrix& table, absl::Span<const int32_t> ids, float* out) override;
  void RmsNorm(const float* x, const float* weight, int64_t n_tokens, int64_t dim, float eps,
               float* out) override;
  void AddBias(float* x, const float* bias, int64_t n_tokens, int64_t dim) override;
  void Add(const float* x, float* y, int64_t n) override;
  void Rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const int32_t* positions,
            const backend::RopeParams& params) override;
  void SwiGlu(const float* gate, const float* up, int64_t n, float* out) override;
  void StoreKv(const float* k, const float* v, int64_t n_tokens, int64_t first_pos,
               const backend::KvLayerView& cache) override;
  void CausalAttention(const float* q, int64_t n_tokens, int64_t first_pos, int64_t n_head,
                       float scale, const backend::KvLayerView& cache, float* out) override;
  absl::Status SimHashCodes(const attention::SimHash& hash, const float* x, int64_t n,
                            uint16_t* codes) override;
  absl::Status OffloadKeyCodes(const attention::SimHash& hash, const backend::KvLayerView& cache,
                               int64_t begin, int64_t end, bool compute_centre, float* centre,
                               uint16_t* codes) override;
  void RangeAttention(const float* q, int64_t n_head, float scale,
                      const backend::KvLayerView& cache,
                      absl::Span<const std::pair<int64_t, int64_t>> ranges, float* out,
                      float* lse) override;

  // Bytes allocated and not yet released.
  int64_t bytes_in_use() const;
  // Calls of SimHashCodes and RangeAttention so far (the sparse path's device work).
  int64_t simhash_calls() const { return simhash_calls_; }
  int64_t range_attention_calls() const { return range_attention_calls_; }
  // Calls of OffloadKeyCodes (a prefill's offloaded keys hashed on the "device").
  int64_t offload_key_codes_calls() const { return offload_key_codes_calls_; }
  // The waits a real device backend would pay for: every CopyOut, and every FlushCopies that
  // found copies queued.
  int64_t waits() const { return waits_; }

 private:
  struct Registry {
    mutable std::mutex mu;
    std::map<uintptr_t, uintptr_t> live;  // begin -> end
    int64_t bytes = 0;
  };
  struct QueuedCopy {
    void* host_dst;
    std::string data;
  };
  // OK when src is device memory and host_dst is not (op names the caller in the error).
  absl::Status CheckCopyToHost(const char* op, const void* host_dst, const void* src,
                               int64_t bytes) const;
  // Queues `bytes` of `data` (copied now) for host_dst and poisons host_dst.
  void Queue(void* host_dst, const void* data, int64_t bytes);
  // Writes the queued copies to their destinations.
  void Deliver();
  // Whether [p, p + bytes) lies inside one live allocation.
  bool IsDevice(const void* p, int64_t bytes) const;
  // Keeps the first failure; returns whether `ok`.
  bool Check(bool ok, const char* op, const char* what);

  backend::CpuBackend cpu_;
  std::vector<QueuedCopy> queued_;
  std::shared_ptr<Registry> registry_ = std::make_shared<Registry>();
  std::set<const void*> matrices_;
  std::set<const float*> vectors_;
  absl::Status error_;
  int64_t simhash_calls_ = 0;
  int64_t range_attention_calls_ = 0;
  int64_t offload_key_codes_calls_ = 0;
  int64_t waits_ = 0;
};

}  // namespace magicpig::testing

#endif  // MAGICPIG_TESTS_TESTING_FAKE_DEVICE_BACKEND_H_
