// Chooses and makes the compute backend: the one place that knows which backends this build has
// (the CUDA one only where it was built with MAGICPIG_WITH_CUDA) and which the machine can run.
#ifndef MAGICPIG_GPU_NODE_BACKEND_BACKEND_FACTORY_H_
#define MAGICPIG_GPU_NODE_BACKEND_BACKEND_FACTORY_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu_node/backend/backend.h"
#include "gpu_node/backend/cuda/attention_kernel.h"

namespace magicpig::backend {

enum class BackendKind {
  kAuto,  // cuda when this build has it and a device is visible, else cpu
  kCpu,
  kCuda,
};

// Names for --backend.
std::vector<std::pair<std::string, BackendKind>> BackendKindChoices();

struct BackendOptions {
  BackendKind kind = BackendKind::kAuto;
  int num_threads = 0;             // CPU backend: 0 = all cores
  bool float_activations = false;  // reference precision (CPU: float activations; CUDA: fp32)
  int gpu = 0;                     // CUDA device index
  bool cuda_graphs = false;        // CUDA: replay decode steps as graphs (ExecuteReplayable)
  // CUDA: the exact attention kernel (auto: tiled for prefill, split-K for decode).
  CudaAttentionKernel cuda_attention_kernel = CudaAttentionKernel::kAuto;
  bool cuda_wide_merge = false;  // CUDA: CudaBackendOptions::wide_merge
};

// Whether this binary contains the CUDA backend.
bool CudaBackendBuilt();
// CUDA devices visible to this process (0 when the backend is not built).
int VisibleCudaDevices();

// FAILED_PRECONDITION naming the reason when cuda is asked for and the build has no CUDA
// backend or no device is visible; UNAVAILABLE for a device index that does not exist.
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const BackendOptions& options);

}  // namespace magicpig::backend

#endif  // MAGICPIG_GPU_NODE_BACKEND_BACKEND_FACTORY_H_
