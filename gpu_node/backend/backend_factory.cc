#include "gpu_node/backend/backend_factory.h"

#include "absl/strings/str_cat.h"
#include "common/cpu_features.h"
#include "gpu_node/backend/cpu/cpu_backend.h"
#if MAGICPIG_HAVE_CUDA
#include "gpu_node/backend/cuda/cuda_backend.h"
#endif

namespace magicpig::backend {

std::vector<std::pair<std::string, BackendKind>> BackendKindChoices() {
  return {{"auto", BackendKind::kAuto}, {"cpu", BackendKind::kCpu}, {"cuda", BackendKind::kCuda}};
}

bool CudaBackendBuilt() { return MAGICPIG_HAVE_CUDA != 0; }

int VisibleCudaDevices() {
#if MAGICPIG_HAVE_CUDA
  return CudaDeviceCount();
#else
  return 0;
#endif
}

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const BackendOptions& options) {
  BackendKind kind = options.kind;
  if (kind == BackendKind::kAuto) {
    kind = VisibleCudaDevices() > 0 ? BackendKind::kCuda : BackendKind::kCpu;
  }
  if (kind == BackendKind::kCpu) {
    return std::make_unique<CpuBackend>(options.num_threads, ActiveSimdLevel(),
                                        options.float_activations);
  }
  if (!CudaBackendBuilt()) {
    return absl::FailedPreconditionError(
        "--backend cuda: this build has no CUDA backend (configure with nvcc on the PATH or "
        "-DMAGICPIG_WITH_CUDA=ON)");
  }
  const int devices = VisibleCudaDevices();
  if (devices == 0) {
    return absl::FailedPreconditionError("--backend cuda: no CUDA device is visible");
  }
  if (options.gpu < 0 || options.gpu >= devices) {
    return absl::UnavailableError(
        absl::StrCat("--gpu ", options.gpu, ": only ", devices, " CUDA device(s) are visible"));
  }
#if MAGICPIG_HAVE_CUDA
  CudaBackendOptions cuda;
  cuda.device = options.gpu;
  cuda.float_weights = options.float_activations;
  cuda.graphs = options.cuda_graphs;
  cuda.attention_kernel = options.cuda_attention_kernel;
  cuda.wide_merge = options.cuda_wide_merge;
  absl::StatusOr<std::unique_ptr<CudaBackend>> b = CudaBackend::Create(cuda);
  if (!b.ok()) return b.status();
  return std::unique_ptr<Backend>(*std::move(b));
#else
  return absl::InternalError("unreachable");
#endif
}

}  // namespace magicpig::backend
