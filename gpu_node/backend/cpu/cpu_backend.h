// CpuBackend: the reference compute backend, on oneTBB threads with run-time SIMD dispatch.
//
// Owns a tbb::task_arena of `num_threads`; Execute runs a batch inside it, so every parallel
// operation of the batch uses exactly those threads. The SIMD level is fixed at construction
// (ActiveSimdLevel() by default) and used for every kernel call. With float_activations, weight
// products use MatMulFloatActivations (reference precision, slower) instead of 8-bit activations.
//
// Thread-safety: one Execute at a time (the engine serialises batches).
#ifndef MAGICPIG_GPU_NODE_BACKEND_CPU_CPU_BACKEND_H_
#define MAGICPIG_GPU_NODE_BACKEND_CPU_CPU_BACKEND_H_

#include <memory>

#include "common/cpu_features.h"
#include "gpu_node/backend/backend.h"
#include "tbb/task_arena.h"

namespace magicpig::backend {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int num_threads, SimdLevel level = ActiveSimdLevel(),
                      bool float_activations = false);
  ~CpuBackend() override;

  std::string_view name() const override { return "cpu"; }
  std::string Describe() const override;
  int num_threads() const { return num_threads_; }
  SimdLevel simd_level() const { return level_; }
  // The interleaved-layout kernels (Q4_K, Q6_K, Q4_1, Q8_0) exist at AVX-512 only.
  bool wants_interleaved_weights() const override { return level_ == SimdLevel::kAvx512; }

  absl::Status Execute(absl::FunctionRef<absl::Status()> batch) override;
  absl::Status MatMul(const QuantMatrix& w, const float* x, int64_t n_tokens, float* y) override;
  absl::Status Embed(const QuantMatrix& table, absl::Span<const int32_t> ids, float* out) override;
  void RmsNorm(const float* x, const float* weight, int64_t n_tokens, int64_t dim, float eps,
               float* out) override;
  void AddBias(float* x, const float* bias, int64_t n_tokens, int64_t dim) override;
  void Add(const float* x, float* y, int64_t n) override;
  void Rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const int32_t* positions,
            const RopeParams& params) override;
  void SwiGlu(const float* gate, const float* up, int64_t n, float* out) override;
  void StoreKv(const float* k, const float* v, int64_t n_tokens, int64_t first_pos,
               const KvLayerView& cache) override;
  void CausalAttention(const float* q, int64_t n_tokens, int64_t first_pos, int64_t n_head,
                       float scale, const KvLayerView& cache, float* out) override;
  void RangeAttention(const float* q, int64_t n_head, float scale, const KvLayerView& cache,
                      absl::Span<const std::pair<int64_t, int64_t>> ranges, float* out,
                      float* lse) override;

 private:
  int num_threads_;
  SimdLevel level_;
  bool float_activations_;
  std::unique_ptr<tbb::task_arena> arena_;
};

}  // namespace magicpig::backend

#endif  // MAGICPIG_GPU_NODE_BACKEND_CPU_CPU_BACKEND_H_
