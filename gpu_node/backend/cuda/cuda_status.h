// CUDA runtime and cuBLAS results as absl::Status: every call the CUDA backend makes goes through
// one of these, so a failure names the call and the error instead of being dropped.
#ifndef MAGICPIG_GPU_NODE_BACKEND_CUDA_CUDA_STATUS_H_
#define MAGICPIG_GPU_NODE_BACKEND_CUDA_CUDA_STATUS_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace magicpig::backend {

// OK for cudaSuccess; otherwise RESOURCE_EXHAUSTED for cudaErrorMemoryAllocation, UNAVAILABLE
// for "no device" errors and INTERNAL for the rest, each naming `what` and the CUDA error.
absl::Status CudaStatus(cudaError_t error, const char* what);
absl::Status CublasStatus(cublasStatus_t status, const char* what);

}  // namespace magicpig::backend

#define MAGICPIG_CUDA_RETURN_IF_ERROR(expr)                                                \
  do {                                                                                     \
    ::absl::Status _magicpig_cuda_status = ::magicpig::backend::CudaStatus((expr), #expr); \
    if (!_magicpig_cuda_status.ok()) return _magicpig_cuda_status;                         \
  } while (false)

#define MAGICPIG_CUBLAS_RETURN_IF_ERROR(expr)                                                  \
  do {                                                                                         \
    ::absl::Status _magicpig_cublas_status = ::magicpig::backend::CublasStatus((expr), #expr); \
    if (!_magicpig_cublas_status.ok()) return _magicpig_cublas_status;                         \
  } while (false)

#endif  // MAGICPIG_GPU_NODE_BACKEND_CUDA_CUDA_STATUS_H_
