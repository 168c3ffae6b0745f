// CudaDevice: the one owner of a GPU's resources for the CUDA backend: the device index, one
// stream every operation is issued on, the cuBLAS handle bound to it and its workspace, and the
// accounting of the device memory allocated through it (for /metrics and --gpu-kv-budget).
//
// Thread-safety: Allocate, the buffers' release and the counters may be called from any thread
// (the counters are atomic; each call makes the device current on its thread). The stream and
// handle are used by one thread at a time (the backend's Execute).
#ifndef MAGICPIG_GPU_NODE_BACKEND_CUDA_CUDA_DEVICE_H_
#define MAGICPIG_GPU_NODE_BACKEND_CUDA_CUDA_DEVICE_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "gpu_node/backend/backend.h"

namespace magicpig::backend {

// Devices the CUDA runtime sees (0 where there is no driver or no device).
int CudaDeviceCount();

class CudaDevice {
 public:
  // UNAVAILABLE when device `index` does not exist.
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Open(int index);
  ~CudaDevice();
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  int index() const { return index_; }
  const std::string& name() const { return name_; }
  int64_t total_memory() const { return total_memory_; }
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return cublas_; }

  // Makes this device current on the calling thread.
  absl::Status MakeCurrent() const;
  // Device memory, released (cudaFree) when the buffer is destroyed.
  absl::StatusOr<BackendBuffer> Allocate(int64_t bytes);
  // Waits for everything issued on the stream; reports errors of kernels that ran.
  absl::Status Synchronize() const;

  // Bytes allocated through Allocate and not yet released.
  int64_t bytes_in_use() const { return in_use_->load(std::memory_order_relaxed); }

 private:
  CudaDevice() = default;
  int index_ = 0;
  std::string name_;
  int64_t total_memory_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  // cuBLAS's workspace (32 MiB, what NVIDIA suggests for Hopper).
  static constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
  void* cublas_workspace_ = nullptr;
  // Shared with the buffers' release functions: a buffer may outlive the CudaDevice object (it
  // frees through the runtime, not through this object), so the counter lives as long as any.
  std::shared_ptr<std::atomic<int64_t>> in_use_ = std::make_shared<std::atomic<int64_t>>(0);
};

}  // namespace magicpig::backend

#endif  // MAGICPIG_GPU_NODE_BACKEND_CUDA_CUDA_DEVICE_H_
