// CudaBackend: the compute Backend on one NVIDIA GPU (CUDA kernels plus cuBLAS), tested against
// the CPU backend (cuda_backend_test, on a GPU machine through scripts/device-check).
//
// Weights: PrepareMatrix uploads a matrix once and dequantises it on the GPU (one kernel per GGUF
// type, block_decode.h) into a resident copy, fp16 by default or fp32 with float_weights; MatMul
// multiplies it with cuBLAS (fp16 inputs with fp32 accumulation, or fp32 throughout without
// reduced-precision modes, the reference setting that matches the CPU's float-activation path),
// or, for decode-sized batches of fp16 weights, with one matrix-vector kernel (fp32 activations).
// Decode steps can be recorded as CUDA graphs and replayed (ExecuteReplayable).
// PrepareVector keeps fp32 copies of norm weights and biases. Operations find the copies by the
// host pointers they are passed. Activations and the KV cache are device memory (Allocate).
//
// Errors: every CUDA and cuBLAS call is checked. Operations that return void keep their first
// failure and skip the rest; Execute returns it (backend.h).
//
// Thread-safety: one Execute at a time (the engine serialises batches); Prepare calls before the
// first Execute.
#ifndef MAGICPIG_GPU_NODE_BACKEND_CUDA_CUDA_BACKEND_H_
#define MAGICPIG_GPU_NODE_BACKEND_CUDA_CUDA_BACKEND_H_

#include <cstdint>
#include <memory>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu_node/backend/backend.h"
#include "gpu_node/backend/cuda/attention_kernel.h"
#include "gpu_node/backend/cuda/cuda_device.h"
#include "gpu_node/backend/cuda/cuda_kernels.h"

namespace magicpig::backend {

struct CudaBackendOptions {
  int device = 0;
  // fp32 resident weights and fp32 products (reference precision, twice the memory); fp16
  // otherwise.
  bool float_weights = false;
  // ExecuteReplayable records the batch as a CUDA graph and replays it; off: plain Execute.
  // Off by default: recording every step costs the host about what launching it does, and the
  // update and the graph launch come on top (docs/gpu.md has the measurement).
  bool graphs = false;
  // The exact (causal) attention kernel (attention_kernel.h): by default the tiled one for
  // prefill chunks and split-K for decode.
  CudaAttentionKernel attention_kernel = CudaAttentionKernel::kAuto;
  // Merge the attention kernels' partials with one block of 16 warps per (query, head) row
  // instead of one thread per dimension walking the pieces (LaunchMergePartials' `wide`): for
  // deep decode steps, whose rows have hundreds of pieces; rows of fewer than
  // kWideMergeMinPieces pieces (prefill chunks: a few each) keep the serial merge, which leaves no
  // warps idle there. Off until a GPU run has checked and measured it (docs/gpu.md).
  bool wide_merge = false;
  // CudaAttentionKernel::kTensor: the most device memory its fp32 scores and fp16 probabilities
  // of one chunk of queries may take (all heads); longer chunks are cut to fit.
  int64_t tensor_scratch_bytes = int64_t{512} << 20;
};

// What ExecuteReplayable did, since the backend was made.
struct CudaGraphStats {
  int64_t replayed = 0;      // batches run as a graph
  int64_t instantiated = 0;  // of which the graph was instantiated anew
  int64_t updated = 0;       // of which an instantiated graph was updated in place (cheaper)
  int64_t fell_back = 0;     // batches that could not be recorded and ran with Execute
};

class CudaBackend final : public Backend {
 public:
  // UNAVAILABLE when the device does not exist (CudaDeviceCount() says how many do).
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const CudaBackendOptions& options);
  ~CudaBackend() override;

  std::string_view name() const override { return "cuda"; }
  std::string Describe() const override;
  CudaDevice& device() { return *device_; }
  // Bytes of the resident weight copies.
  int64_t weight_bytes() const { return weight_bytes_; }

  bool host_memory() const override { return false; }
  DeviceMemoryStats DeviceMemory() const override {
    return {device_->bytes_in_use(), device_->total_memory()};
  }
  absl::StatusOr<BackendBuffer> Allocate(int64_t bytes) override;
  absl::Status CopyIn(void* dst, const void* host_src, int64_t bytes) override;
  absl::Status CopyOut(void* host_dst, const void* src, int64_t bytes) override;
  // Queued copies go through the pinned staging buffer that recording uses too.
  absl::Status CopyOutLater(void* host_dst, const void* src, int64_t bytes) override;
  absl::Status FlushCopies() override;
  absl::Status CopyWithin(void* dst, const void* src, int64_t bytes) override;
  absl::Status PrepareMatrix(const QuantMatrix& w) override;
  absl::Status PrepareVector(const float* v, int64_t n) override;

  absl::Status Execute(absl::FunctionRef<absl::Status()> batch) override;
  // Records the batch on the stream (stream capture) into a graph, updates the instantiated graph
  // of the same size in place (cudaGraphExecUpdate: same operations, new arguments) or
  // instantiates it, and launches it: one launch for the step instead of one per operation.
  // While recording, CopyIn stages the host data in pinned memory (read at replay) and CopyOut
  // lands in pinned memory copied to its destination after the replay; Allocate refuses, so a
  // batch that must grow a buffer falls back to Execute once (the next one is recorded).
  absl::Status ExecuteReplayable(absl::FunctionRef<absl::Status()> batch) override;
  const CudaGraphStats& graph_stats() const { return graph_stats_; }
  absl::Status MatMul(const QuantMatrix& w, const float* x, int64_t n_tokens, float* y) override;
  absl::Status MatMuls(absl::Span<const Product> products, const float* x, int64_t n_tokens,
                       const InputNorm& norm) override;
  absl::Status MatMulAdd(const QuantMatrix& w, const float* x, int64_t n_tokens, float* y,
                         float* scratch) override;
  absl::Status GateUpSwiGlu(const QuantMatrix& w_gate, const QuantMatrix& w_up, const float* x,
                            int64_t n_tokens, const InputNorm& norm, float* gate, float* up,
                            float* out) override;
  absl::Status Embed(const QuantMatrix& table, absl::Span<const int32_t> ids, float* out) override;
  void RmsNorm(const float* x, const float* weight, int64_t n_tokens, int64_t dim, float eps,
               float* out) override;
  void AddBias(float* x, const float* bias, int64_t n_tokens, int64_t dim) override;
  void Add(const float* x, float* y, int64_t n) override;
  void Rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const int32_t* positions,
            const RopeParams& params) override;
  void RopeQk(float* q, int64_t n_head, float* k, int64_t n_head_kv, int64_t n_tokens,
              int64_t head_dim, const int32_t* positions, const RopeParams& params) override;
  void RopeQkStoreKv(float* q, int64_t n_head, float* k, const float* v, int64_t n_head_kv,
                     int64_t n_tokens, int64_t head_dim, const int32_t* positions,
                     const RopeParams& params, int64_t first_pos,
                     const KvLayerView& cache) override;
  void SwiGlu(const float* gate, const float* up, int64_t n, float* out) override;
  void StoreKv(const float* k, const float* v, int64_t n_tokens, int64_t first_pos,
               const KvLayerView& cache) override;
  void CausalAttention(const float* q, int64_t n_tokens, int64_t first_pos, int64_t n_head,
                       float scale, const KvLayerView& cache, float* out) override;
  absl::Status SimHashCodes(const attention::SimHash& hash, const float* x, int64_t n,
                            uint16_t* codes) override;
  absl::Status OffloadKeyCodes(const attention::SimHash& hash, const KvLayerView& cache,
                               int64_t begin, int64_t end, bool compute_centre, float* centre,
                               uint16_t* codes) override;
  void RangeAttention(const float* q, int64_t n_head, float scale, const KvLayerView& cache,
                      absl::Span<const std::pair<int64_t, int64_t>> ranges, float* out,
                      float* lse) override;

 private:
  struct ResidentMatrix {
    BackendBuffer data;  // [rows][cols], fp16 or fp32
    int64_t rows = 0, cols = 0;
    GgmlType type = GgmlType::kF32;  // of the host copy, to catch a reused host address
  };
  CudaBackend(std::unique_ptr<CudaDevice> device, const CudaBackendOptions& options);

  absl::StatusOr<const ResidentMatrix*> FindMatrix(const QuantMatrix& w) const;
  // The device copy of a prepared vector; null (and a kept failure) when it was not prepared.
  const float* FindVector(const float* host);
  // The device copy of hash's projection W (uploaded at first use).
  absl::StatusOr<const float*> Projection(const attention::SimHash& hash);
  // Keeps the first failure of a void operation.
  void Fail(absl::Status status);
  // The products as one matrix-vector launch (accumulate: added to y) where they fit it (fp16
  // weights, a decode-sized batch, at most kMaxMatVecProducts of equal width); false, having
  // launched nothing, where they do not.
  absl::StatusOr<bool> FusedMatVecs(absl::Span<const Product> products, const float* x,
                                    int64_t n_tokens, const InputNorm& norm, bool accumulate);
  // The device copy of a norm's weights when the fused kernels can read them (null for no norm);
  // FAILED_PRECONDITION when they cannot (the unfused default then runs).
  absl::StatusOr<const float*> NormWeights(const InputNorm& norm, int64_t cols);
  // ExecuteReplayable's halves: the batch recorded into a graph (an error when it cannot be), and
  // the instantiated graph of the same node count updated to it, or a new one instantiated.
  absl::StatusOr<cudaGraph_t> Record(absl::FunctionRef<absl::Status()> batch);
  absl::StatusOr<cudaGraphExec_t> Instantiated(cudaGraph_t graph);
  // `bytes` of pinned staging memory for a queued copy (CopyOutLater, or any copy inside a
  // recorded batch); null when the staging buffer is too small (it grows, to what was wanted,
  // when the queued copies are next delivered).
  char* Stage(int64_t bytes);
  // Copies the queued copies' staged data to their host destinations (after a synchronisation)
  // and frees the staging buffer for the next ones, growing it first if it was too small.
  void DeliverDeferred();
  void GrowStaging();
  // Causal attention of a chunk of queries as cuBLAS products (CudaAttentionKernel::kTensor).
  absl::Status TensorCausalAttention(const float* q, int64_t n_tokens, int64_t first_pos,
                                     int64_t n_head, float scale, const KvLayerView& cache,
                                     float* out);
  // Runs `a` (its part_o / part_lse are set here) and merges the pieces into out (and lse when
  // not null): split-K attention; `tiled` (causal mode only) through LaunchCausalTiles.
  absl::Status RunPieces(cuda_internal::AttentionPieces a, float* out, float* lse,
                         bool tiled = false);

  std::unique_ptr<CudaDevice> device_;
  CudaBackendOptions options_;
  absl::flat_hash_map<const void*, ResidentMatrix> matrices_;
  absl::flat_hash_map<const float*, BackendBuffer> vectors_;
  // SimHash projections on the device, by (seed, d, K, L): the same key gives the same W.
  absl::flat_hash_map<std::tuple<uint64_t, int64_t, int, int>, BackendBuffer> projections_;
  int64_t weight_bytes_ = 0;
  absl::Status error_;
  // Scratch, grown as needed: fp16 activations for the products, token ids, attention partials
  // and key ranges.
  BackendBuffer half_x_, ids_, part_o_, part_lse_, ranges_, hash_codes_;
  BackendBuffer tensor_q_, tensor_scores_, tensor_probs_, tensor_o_;  // TensorCausalAttention
  BackendBuffer offload_centre_, offload_keys_;                       // OffloadKeyCodes
  // Recording (ExecuteReplayable) and queued copies: whether a batch is being recorded now, the
  // pinned staging buffer and how much of it is taken, the copies to the host still to be made
  // (after the replay, or at FlushCopies), and the instantiated graphs by node count (a few batch
  // sizes alternate in serving).
  struct DeferredCopy {
    void* host_dst;
    const char* staged;
    int64_t bytes;
  };
  bool recording_ = false;
  BackendBuffer staging_;
  int64_t staging_used_ = 0;
  std::vector<DeferredCopy> deferred_;
  absl::flat_hash_map<size_t, cudaGraphExec_t> graphs_;
  CudaGraphStats graph_stats_;
};

}  // namespace magicpig::backend

#endif  // MAGICPIG_GPU_NODE_BACKEND_CUDA_CUDA_BACKEND_H_
