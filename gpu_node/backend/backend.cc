#include "gpu_node/backend/backend.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

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

absl::Status Backend::CopyIn(void* dst, const void* host_src, int64_t bytes) {
  if (bytes > 0) std::memcpy(dst, host_src, static_cast<size_t>(bytes));
  return absl::OkStatus();
}

absl::Status Backend::CopyOut(void* host_dst, const void* src, int64_t bytes) {
  if (bytes > 0) std::memcpy(host_dst, src, static_cast<size_t>(bytes));
  return absl::OkStatus();
}

}  // namespace magicpig::backend
