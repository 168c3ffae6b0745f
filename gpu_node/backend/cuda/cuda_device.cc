#include "gpu_node/backend/cuda/cuda_device.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gpu_node/backend/cuda/cuda_status.h"

namespace magicpig::backend {

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return count;
}

absl::StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Open(int index) {
  const int count = CudaDeviceCount();
  if (index < 0 || index >= count) {
    return absl::UnavailableError(
        count == 0 ? std::string("no CUDA device is visible")
                   : absl::StrCat("CUDA device ", index, " does not exist (", count, " visible)"));
  }
  std::unique_ptr<CudaDevice> d(new CudaDevice());
  d->index_ = index;
  MAGICPIG_RETURN_IF_ERROR(d->MakeCurrent());
  cudaDeviceProp prop;
  MAGICPIG_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, index));
  d->name_ = prop.name;
  d->total_memory_ = static_cast<int64_t>(prop.totalGlobalMem);
  MAGICPIG_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&d->stream_, cudaStreamNonBlocking));
  MAGICPIG_CUBLAS_RETURN_IF_ERROR(cublasCreate(&d->cublas_));
  MAGICPIG_CUBLAS_RETURN_IF_ERROR(cublasSetStream(d->cublas_, d->stream_));
  // A workspace of our own (after cublasSetStream, which resets it): cuBLAS then allocates
  // nothing inside a recorded batch (CudaBackend::ExecuteReplayable).
  MAGICPIG_CUDA_RETURN_IF_ERROR(cudaMalloc(&d->cublas_workspace_, kCublasWorkspaceBytes));
  MAGICPIG_CUBLAS_RETURN_IF_ERROR(
      cublasSetWorkspace(d->cublas_, d->cublas_workspace_, kCublasWorkspaceBytes));
  return d;
}

CudaDevice::~CudaDevice() {
  // Errors here cannot be reported; the process may be shutting down with the device lost.
  if (cudaSetDevice(index_) != cudaSuccess) return;
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  if (cublas_workspace_ != nullptr) cudaFree(cublas_workspace_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::Status CudaDevice::MakeCurrent() const {
  return CudaStatus(cudaSetDevice(index_), "cudaSetDevice");
}

absl::StatusOr<BackendBuffer> CudaDevice::Allocate(int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("allocation of ", bytes, " bytes"));
  if (bytes == 0) return BackendBuffer();
  MAGICPIG_RETURN_IF_ERROR(MakeCurrent());
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, static_cast<size_t>(bytes));
  if (e != cudaSuccess) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes on GPU ",
                                                     index_, ": ", cudaGetErrorString(e)));
  }
  in_use_->fetch_add(bytes, std::memory_order_relaxed);
  return BackendBuffer(p, bytes, [index = index_, bytes, counter = in_use_](void* q) {
    cudaSetDevice(index);
    cudaFree(q);  // synchronises with the device: no kernel still reads q
    counter->fetch_sub(bytes, std::memory_order_relaxed);
  });
}

absl::Status CudaDevice::Synchronize() const {
  return CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

}  // namespace magicpig::backend
