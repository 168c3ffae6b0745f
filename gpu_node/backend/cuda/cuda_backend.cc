#include "gpu_node/backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/quant/ggml_type.h"
#include "common/status_macros.h"
#include "gpu_node/backend/cuda/block_decode.h"
#include "gpu_node/backend/cuda/cuda_status.h"

namespace magicpig::backend {
namespace {

using cuda_internal::AttentionPieces;

// Split-K: enough (query, head, piece) blocks to fill a large GPU, with pieces of at least this
// many keys so that each block has work worth its launch. 64 rather than 256: a decode step over a
// few thousand keys then spreads over hundreds of blocks instead of a few dozen (docs/gpu.md).
constexpr int64_t kMinPieceKeys = 64;
constexpr int64_t kTargetBlocks = 4096;
// CudaBackendOptions::wide_merge: rows with fewer pieces than this keep the serial merge (16 warps
// over a handful of pieces would leave most of them idle).
constexpr int64_t kWideMergeMinPieces = 32;

// The queries and the cache of a split-K launch; the caller sets how keys split into pieces.
AttentionPieces PiecesOver(const float* q, int64_t n_queries, int64_t n_head, float scale,
                           const KvLayerView& cache) {
  AttentionPieces a;
  a.q = q;
  a.k = cache.k;
  a.v = cache.v;
  a.n_queries = n_queries;
  a.n_head = n_head;
  a.n_head_kv = cache.n_head_kv;
  a.head_dim = cache.head_dim;
  a.scale = scale;
  return a;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(
    const CudaBackendOptions& options) {
  MAGICPIG_ASSIGN_OR_RETURN(std::unique_ptr<CudaDevice> device, CudaDevice::Open(options.device));
  return std::unique_ptr<CudaBackend>(new CudaBackend(std::move(device), options));
}

CudaBackend::CudaBackend(std::unique_ptr<CudaDevice> device, const CudaBackendOptions& options)
    : device_(std::move(device)), options_(options) {}

CudaBackend::~CudaBackend() {
  if (device_->MakeCurrent().ok()) {
    for (auto& [nodes, exec] : graphs_) cudaGraphExecDestroy(exec);
  }
  graphs_.clear();
  staging_ = BackendBuffer();
  // Buffers free themselves (cudaFree waits for the device); the device goes last.
  matrices_.clear();
  vectors_.clear();
  half_x_ = BackendBuffer();
  ids_ = BackendBuffer();
  part_o_ = BackendBuffer();
  part_lse_ = BackendBuffer();
  ranges_ = BackendBuffer();
  hash_codes_ = BackendBuffer();
  projections_.clear();
}

std::string CudaBackend::Describe() const {
  return absl::StrCat("cuda (GPU ", device_->index(), ": ", device_->name(), ", ",
                      device_->total_memory() >> 20, " MiB; ",
                      options_.float_weights ? "fp32" : "fp16", " weights, ",
                      weight_bytes_ / 1000000, " MB resident)");
}

absl::StatusOr<BackendBuffer> CudaBackend::Allocate(int64_t bytes) {
  if (recording_) {
    // cudaMalloc inside a capture, and the cudaFree of the buffer it replaces, are not
    // recordable; ExecuteReplayable runs this batch with Execute instead.
    return absl::FailedPreconditionError("device allocation inside a recorded batch");
  }
  return device_->Allocate(bytes);
}

char* CudaBackend::Stage(int64_t bytes) {
  const int64_t at = staging_used_;
  staging_used_ += (bytes + 63) / 64 * 64;
  return staging_used_ <= staging_.bytes() ? staging_.as<char>() + at : nullptr;
}

absl::Status CudaBackend::CopyIn(void* dst, const void* host_src, int64_t bytes) {
  if (bytes <= 0) return absl::OkStatus();
  MAGICPIG_RETURN_IF_ERROR(device_->MakeCurrent());
  if (recording_) {
    // A copy from pageable memory cannot be recorded, and the source may change before the
    // replay: stage the data now; the graph copies it from the staging buffer.
    char* staged = Stage(bytes);
    if (staged == nullptr) return absl::FailedPreconditionError("staging buffer too small");
    std::memcpy(staged, host_src, static_cast<size_t>(bytes));
    return CudaStatus(cudaMemcpyAsync(dst, staged, static_cast<size_t>(bytes),
                                      cudaMemcpyHostToDevice, device_->stream()),
                      "cudaMemcpyAsync (to the device, recorded)");
  }
  return CudaStatus(cudaMemcpyAsync(dst, host_src, static_cast<size_t>(bytes),
                                    cudaMemcpyHostToDevice, device_->stream()),
                    "cudaMemcpyAsync (to the device)");
}

absl::Status CudaBackend::CopyOut(void* host_dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return absl::OkStatus();
  MAGICPIG_RETURN_IF_ERROR(device_->MakeCurrent());
  if (recording_) {
    // Into the staging buffer at replay; to host_dst once the replay is done (backend.h).
    char* staged = Stage(bytes);
    if (staged == nullptr) return absl::FailedPreconditionError("staging buffer too small");
    deferred_.push_back({host_dst, staged, bytes});
    return CudaStatus(cudaMemcpyAsync(staged, src, static_cast<size_t>(bytes),
                                      cudaMemcpyDeviceToHost, device_->stream()),
                      "cudaMemcpyAsync (to the host, recorded)");
  }
  MAGICPIG_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_dst, src, static_cast<size_t>(bytes),
                                                cudaMemcpyDeviceToHost, device_->stream()));
  MAGICPIG_RETURN_IF_ERROR(device_->Synchronize());
  DeliverDeferred();  // the wait covered the queued copies too (backend.h)
  return absl::OkStatus();
}

absl::Status CudaBackend::CopyOutLater(void* host_dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return absl::OkStatus();
  if (recording_) return CopyOut(host_dst, src, bytes);  // deferred to after the replay anyway
  MAGICPIG_RETURN_IF_ERROR(device_->MakeCurrent());
  // Into pinned staging (an asynchronous copy; one into pageable memory would wait), moved to
  // host_dst by FlushCopies. Staging too small: this copy waits, the buffer grows at the flush.
  char* staged = Stage(bytes);
  if (staged == nullptr) return CopyOut(host_dst, src, bytes);
  deferred_.push_back({host_dst, staged, bytes});
  return CudaStatus(cudaMemcpyAsync(staged, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost,
                                    device_->stream()),
                    "cudaMemcpyAsync (to the host, queued)");
}

absl::Status CudaBackend::FlushCopies() {
  // Nothing queued, nothing to wait for: the hook-free decode path calls this after every layer
  // and must keep the stream running. While recording, ExecuteReplayable delivers after the replay.
  if (recording_ || deferred_.empty()) return absl::OkStatus();
  MAGICPIG_RETURN_IF_ERROR(device_->MakeCurrent());
  MAGICPIG_RETURN_IF_ERROR(device_->Synchronize());
  DeliverDeferred();
  return absl::OkStatus();
}

void CudaBackend::DeliverDeferred() {
  for (const DeferredCopy& c : deferred_) {
    std::memcpy(c.host_dst, c.staged, static_cast<size_t>(c.bytes));
  }
  deferred_.clear();
  if (staging_used_ > staging_.bytes()) GrowStaging();
  staging_used_ = 0;
}

void CudaBackend::GrowStaging() {
  // Pinned, so that the copies through it run asynchronously; on failure the copies that do not
  // fit keep waiting one by one (CopyOutLater) or run eagerly (ExecuteReplayable).
  const int64_t bytes = std::max<int64_t>(int64_t{1} << 20, 2 * staging_used_);
  staging_ = BackendBuffer();
  void* p = nullptr;
  if (cudaHostAlloc(&p, static_cast<size_t>(bytes), cudaHostAllocDefault) == cudaSuccess) {
    staging_ = BackendBuffer(p, bytes, [](void* q) { cudaFreeHost(q); });
  } else {
    cudaGetLastError();
  }
}

absl::Status CudaBackend::CopyWithin(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return absl::OkStatus();
  MAGICPIG_RETURN_IF_ERROR(device_->MakeCurrent());
  return CudaStatus(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice,
                                    device_->stream()),
                    "cudaMemcpyAsync (within the device)");
}

absl::Status CudaBackend::PrepareMatrix(const QuantMatrix& w) {
  // Known by host address (backend.h: the host data outlives the backend); FindMatrix checks that
  // the shape and type still agree.
  if (matrices_.contains(w.data)) return absl::OkStatus();
  const int type = static_cast<int>(w.type);
  if (cuda_internal::BlockValues(type) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the CUDA backend cannot dequantise ", GgmlTypeName(w.type), " weights"));
  }
  MAGICPIG_RETURN_IF_ERROR(device_->MakeCurrent());
  const int64_t row_bytes = GgmlRowBytes(w.type, w.cols);
  MAGICPIG_ASSIGN_OR_RETURN(BackendBuffer raw, device_->Allocate(w.rows * row_bytes));
  MAGICPIG_RETURN_IF_ERROR(CopyIn(raw.data(), w.data, w.rows * row_bytes));
  const int64_t element = options_.float_weights ? 4 : 2;
  ResidentMatrix m;
  m.rows = w.rows;
  m.cols = w.cols;
  m.type = w.type;
  MAGICPIG_ASSIGN_OR_RETURN(m.data, device_->Allocate(w.rows * w.cols * element));
  MAGICPIG_CUDA_RETURN_IF_ERROR(
      cuda_internal::LaunchDequantize(type, raw.as<uint8_t>(), w.rows, w.cols, row_bytes,
                                      m.data.data(), options_.float_weights, device_->stream()));
  MAGICPIG_RETURN_IF_ERROR(device_->Synchronize());  // before `raw` is freed
  weight_bytes_ += m.data.bytes();
  matrices_.emplace(w.data, std::move(m));
  return absl::OkStatus();
}

absl::Status CudaBackend::PrepareVector(const float* v, int64_t n) {
  if (vectors_.contains(v)) return absl::OkStatus();
  MAGICPIG_ASSIGN_OR_RETURN(BackendBuffer b, device_->Allocate(n * 4));
  MAGICPIG_RETURN_IF_ERROR(CopyIn(b.data(), v, n * 4));
  MAGICPIG_RETURN_IF_ERROR(device_->Synchronize());
  weight_bytes_ += b.bytes();
  vectors_.emplace(v, std::move(b));
  return absl::OkStatus();
}

absl::StatusOr<const CudaBackend::ResidentMatrix*> CudaBackend::FindMatrix(
    const QuantMatrix& w) const {
  auto it = matrices_.find(w.data);
  if (it == matrices_.end()) {
    return absl::FailedPreconditionError(
        "a weight matrix reached the CUDA backend without PrepareMatrix");
  }
  const ResidentMatrix& m = it->second;
  if (m.rows != w.rows || m.cols != w.cols || m.type != w.type) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight matrix of ", w.rows, "x", w.cols, " ", GgmlTypeName(w.type),
                     " does not match its prepared copy of ", m.rows, "x", m.cols, " ",
                     GgmlTypeName(m.type), " (was its host memory freed and reused?)"));
  }
  return &it->second;
}

const float* CudaBackend::FindVector(const float* host) {
  auto it = vectors_.find(host);
  if (it != vectors_.end()) return it->second.as<float>();
  Fail(
      absl::FailedPreconditionError("a weight vector reached the CUDA backend without "
                                    "PrepareVector"));
  return nullptr;
}

void CudaBackend::Fail(absl::Status status) {
  if (error_.ok() && !status.ok()) error_ = std::move(status);
}

absl::Status CudaBackend::Execute(absl::FunctionRef<absl::Status()> batch) {
  MAGICPIG_RETURN_IF_ERROR(device_->MakeCurrent());
  error_ = absl::OkStatus();
  absl::Status status = batch();
  if (status.ok()) status = error_;
  // Errors of kernels that ran asynchronously surface here at the latest; queued copies land.
  const absl::Status sync = device_->Synchronize();
  if (sync.ok()) {
    DeliverDeferred();
  } else {
    deferred_.clear();  // the step failed; its queued copies are not delivered
    staging_used_ = 0;
  }
  error_ = absl::OkStatus();
  return status.ok() ? sync : status;
}

absl::Status CudaBackend::ExecuteReplayable(absl::FunctionRef<absl::Status()> batch) {
  if (!options_.graphs) return Execute(batch);
  MAGICPIG_RETURN_IF_ERROR(device_->MakeCurrent());
  absl::StatusOr<cudaGraph_t> graph = Record(batch);
  absl::StatusOr<cudaGraphExec_t> exec =
      graph.ok() ? Instantiated(*graph) : absl::StatusOr<cudaGraphExec_t>(graph.status());
  if (graph.ok()) cudaGraphDestroy(*graph);
  if (!exec.ok()) {
    // Nothing of the batch has run: it runs now, one launch per operation.
    deferred_.clear();
    if (staging_used_ > staging_.bytes()) GrowStaging();
    staging_used_ = 0;
    ++graph_stats_.fell_back;
    return Execute(batch);
  }
  MAGICPIG_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(*exec, device_->stream()));
  MAGICPIG_RETURN_IF_ERROR(device_->Synchronize());
  ++graph_stats_.replayed;
  DeliverDeferred();
  return absl::OkStatus();
}

absl::StatusOr<cudaGraph_t> CudaBackend::Record(absl::FunctionRef<absl::Status()> batch) {
  MAGICPIG_RETURN_IF_ERROR(FlushCopies());  // the staging buffer is the recording's from here
  error_ = absl::OkStatus();
  // Thread-local mode: other threads (attention shards, the HTTP server) may use CUDA meanwhile.
  MAGICPIG_CUDA_RETURN_IF_ERROR(
      cudaStreamBeginCapture(device_->stream(), cudaStreamCaptureModeThreadLocal));
  recording_ = true;
  absl::Status status = batch();
  if (status.ok()) status = error_;
  recording_ = false;
  error_ = absl::OkStatus();
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(device_->stream(), &graph);
  if (!status.ok() || end != cudaSuccess || graph == nullptr) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();  // a capture invalidated by an unrecordable call leaves its error
    return status.ok() ? CudaStatus(end, "cudaStreamEndCapture") : status;
  }
  return graph;
}

absl::StatusOr<cudaGraphExec_t> CudaBackend::Instantiated(cudaGraph_t graph) {
  size_t nodes = 0;
  MAGICPIG_CUDA_RETURN_IF_ERROR(cudaGraphGetNodes(graph, nullptr, &nodes));
  if (auto it = graphs_.find(nodes); it != graphs_.end()) {
    cudaGraphExecUpdateResultInfo info;
    if (cudaGraphExecUpdate(it->second, graph, &info) == cudaSuccess) {
      ++graph_stats_.updated;
      return it->second;
    }
    cudaGetLastError();  // a different sequence of operations: instantiate anew
    cudaGraphExecDestroy(it->second);
    graphs_.erase(it);
  }
  constexpr size_t kMaxGraphs = 16;
  if (graphs_.size() >= kMaxGraphs) {
    for (auto& [n, e] : graphs_) cudaGraphExecDestroy(e);
    graphs_.clear();
  }
  cudaGraphExec_t exec = nullptr;
  MAGICPIG_CUDA_RETURN_IF_ERROR(cudaGraphInstantiate(&exec, graph, 0));
  graphs_.emplace(nodes, exec);
  ++graph_stats_.instantiated;
  return exec;
}

absl::Status CudaBackend::MatMul(const QuantMatrix& w, const float* x, int64_t n_tokens, float* y) {
  MAGICPIG_RETURN_IF_ERROR(error_);
  MAGICPIG_ASSIGN_OR_RETURN(const ResidentMatrix* m, FindMatrix(w));
  if (n_tokens == 0) return absl::OkStatus();
  const float one = 1.0f, zero = 0.0f;
  // Row-major W [rows][cols] is column-major cols x rows; y (row-major [n][rows]) is then
  // column-major rows x n = Wᵀ(col-major) · x(col-major cols x n).
  const int m_rows = static_cast<int>(m->rows), n = static_cast<int>(n_tokens),
            k = static_cast<int>(m->cols);
  if (options_.float_weights) {
    MAGICPIG_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(device_->cublas(), CUBLAS_OP_T, CUBLAS_OP_N,
                                                 m_rows, n, k, &one, m->data.data(), CUDA_R_32F, k,
                                                 x, CUDA_R_32F, k, &zero, y, CUDA_R_32F, m_rows,
                                                 CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT));
    return absl::OkStatus();
  }
  // Decode-sized batches: one kernel reading the fp16 weights once, instead of an fp16 copy of x
  // and a cuBLAS call (two launches, and cuBLAS's host-side overhead, per product).
  const Product product{&w, nullptr, y};
  MAGICPIG_ASSIGN_OR_RETURN(const bool fused,
                            FusedMatVecs({&product, 1}, x, n_tokens, InputNorm(), false));
  if (fused) return absl::OkStatus();
  MAGICPIG_RETURN_IF_ERROR(Reserve(half_x_, n_tokens * m->cols * 2));
  MAGICPIG_CUDA_RETURN_IF_ERROR(cuda_internal::LaunchFloatToHalf(
      x, half_x_.as<uint16_t>(), n_tokens * m->cols, device_->stream()));
  MAGICPIG_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(device_->cublas(), CUBLAS_OP_T, CUBLAS_OP_N, m_rows,
                                               n, k, &one, m->data.data(), CUDA_R_16F, k,
                                               half_x_.data(), CUDA_R_16F, k, &zero, y, CUDA_R_32F,
                                               m_rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

absl::StatusOr<const float*> CudaBackend::NormWeights(const InputNorm& norm, int64_t cols) {
  if (norm.weight == nullptr) return nullptr;
  const float* w = FindVector(norm.weight);
  MAGICPIG_RETURN_IF_ERROR(error_);
  if (cols % 8 != 0 || reinterpret_cast<uintptr_t>(w) % 16 != 0) {
    return absl::FailedPreconditionError("norm weights unfit for the fused products");
  }
  return w;
}

absl::StatusOr<bool> CudaBackend::FusedMatVecs(absl::Span<const Product> products, const float* x,
                                               int64_t n_tokens, const InputNorm& norm,
                                               bool accumulate) {
  if (options_.float_weights || products.empty() ||
      products.size() > static_cast<size_t>(cuda_internal::kMaxMatVecProducts)) {
    return false;
  }
  cuda_internal::MatVecProducts p;
  p.accumulate = accumulate;
  if (norm.weight != nullptr) {
    const absl::StatusOr<const float*> w = NormWeights(norm, products[0].w->cols);
    if (!w.ok()) {
      MAGICPIG_RETURN_IF_ERROR(error_);
      return false;
    }
    p.norm_weight = *w;
    p.norm_eps = norm.eps;
  }
  for (const Product& product : products) {
    MAGICPIG_ASSIGN_OR_RETURN(const ResidentMatrix* m, FindMatrix(*product.w));
    if (p.count > 0 && m->cols != p.cols) return false;
    if (!cuda_internal::HalfMatVecFits(n_tokens, m->cols, m->data.data(), x)) return false;
    p.cols = m->cols;
    p.w[p.count] = m->data.as<uint16_t>();
    p.y[p.count] = product.y;
    p.rows[p.count] = m->rows;
    if (product.bias != nullptr) {
      p.bias[p.count] = FindVector(product.bias);
      MAGICPIG_RETURN_IF_ERROR(error_);
    }
    ++p.count;
  }
  MAGICPIG_RETURN_IF_ERROR(
      CudaStatus(cuda_internal::LaunchHalfMatVec(p, x, n_tokens, device_->stream()),
                 "fused matrix-vector products"));
  return true;
}

absl::Status CudaBackend::MatMuls(absl::Span<const Product> products, const float* x,
                                  int64_t n_tokens, const InputNorm& norm) {
  MAGICPIG_RETURN_IF_ERROR(error_);
  MAGICPIG_ASSIGN_OR_RETURN(const bool fused, FusedMatVecs(products, x, n_tokens, norm, false));
  return fused ? absl::OkStatus() : Backend::MatMuls(products, x, n_tokens, norm);
}

absl::Status CudaBackend::MatMulAdd(const QuantMatrix& w, const float* x, int64_t n_tokens,
                                    float* y, float* scratch) {
  MAGICPIG_RETURN_IF_ERROR(error_);
  const Product product{&w, nullptr, y};
  MAGICPIG_ASSIGN_OR_RETURN(const bool fused,
                            FusedMatVecs({&product, 1}, x, n_tokens, InputNorm(), true));
  return fused ? absl::OkStatus() : Backend::MatMulAdd(w, x, n_tokens, y, scratch);
}

absl::Status CudaBackend::GateUpSwiGlu(const QuantMatrix& w_gate, const QuantMatrix& w_up,
                                       const float* x, int64_t n_tokens, const InputNorm& norm,
                                       float* gate, float* up, float* out) {
  MAGICPIG_RETURN_IF_ERROR(error_);
  MAGICPIG_ASSIGN_OR_RETURN(const ResidentMatrix* g, FindMatrix(w_gate));
  MAGICPIG_ASSIGN_OR_RETURN(const ResidentMatrix* u, FindMatrix(w_up));
  const absl::StatusOr<const float*> norm_weight = NormWeights(norm, g->cols);
  MAGICPIG_RETURN_IF_ERROR(error_);
  if (options_.float_weights || g->rows != u->rows || g->cols != u->cols || !norm_weight.ok() ||
      !cuda_internal::HalfMatVecFits(n_tokens, g->cols, g->data.data(), x) ||
      !cuda_internal::HalfMatVecFits(n_tokens, u->cols, u->data.data(), x)) {
    return Backend::GateUpSwiGlu(w_gate, w_up, x, n_tokens, norm, gate, up, out);
  }
  return CudaStatus(cuda_internal::LaunchHalfGateUp(g->data.as<uint16_t>(), u->data.as<uint16_t>(),
                                                    x, n_tokens, g->rows, g->cols, *norm_weight,
                                                    norm.eps, out, device_->stream()),
                    "fused gate and up products");
}

absl::Status CudaBackend::Embed(const QuantMatrix& table, absl::Span<const int32_t> ids,
                                float* out) {
  MAGICPIG_RETURN_IF_ERROR(error_);
  for (int32_t id : ids) {
    if (id < 0 || id >= table.rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " is outside the vocabulary [0, ", table.rows, ")"));
    }
  }
  MAGICPIG_ASSIGN_OR_RETURN(const ResidentMatrix* m, FindMatrix(table));
  const int64_t n = static_cast<int64_t>(ids.size());
  MAGICPIG_RETURN_IF_ERROR(Reserve(ids_, n * 4));
  MAGICPIG_RETURN_IF_ERROR(CopyIn(ids_.data(), ids.data(), n * 4));
  return CudaStatus(cuda_internal::LaunchEmbed(m->data.data(), options_.float_weights, m->cols,
                                               ids_.as<int32_t>(), n, out, device_->stream()),
                    "embedding lookup");
}

void CudaBackend::RmsNorm(const float* x, const float* weight, int64_t n_tokens, int64_t dim,
                          float eps, float* out) {
  if (!error_.ok()) return;
  const float* w = FindVector(weight);
  if (w == nullptr) return;
  Fail(CudaStatus(cuda_internal::LaunchRmsNorm(x, w, n_tokens, dim, eps, out, device_->stream()),
                  "RMSNorm"));
}

void CudaBackend::AddBias(float* x, const float* bias, int64_t n_tokens, int64_t dim) {
  if (!error_.ok()) return;
  const float* b = FindVector(bias);
  if (b == nullptr) return;
  Fail(CudaStatus(cuda_internal::LaunchAddBias(x, b, n_tokens, dim, device_->stream()), "bias"));
}

void CudaBackend::Add(const float* x, float* y, int64_t n) {
  if (!error_.ok()) return;
  Fail(CudaStatus(cuda_internal::LaunchAdd(x, y, n, device_->stream()), "residual add"));
}

void CudaBackend::Rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
                       const int32_t* positions, const RopeParams& params) {
  RopeQk(x, n_heads, nullptr, 0, n_tokens, head_dim, positions, params);
}

void CudaBackend::RopeQk(float* q, int64_t n_head, float* k, int64_t n_head_kv, int64_t n_tokens,
                         int64_t head_dim, const int32_t* positions, const RopeParams& params) {
  if (!error_.ok()) return;
  Fail(CudaStatus(cuda_internal::LaunchRope(q, n_head, k, n_head_kv, n_tokens, head_dim, positions,
                                            params.pairing == RopePairing::kAdjacent, params.n_rot,
                                            params.freq_base, device_->stream()),
                  "RoPE"));
}

void CudaBackend::RopeQkStoreKv(float* q, int64_t n_head, float* k, const float* v,
                                int64_t n_head_kv, int64_t n_tokens, int64_t head_dim,
                                const int32_t* positions, const RopeParams& params,
                                int64_t first_pos, const KvLayerView& cache) {
  if (!error_.ok()) return;
  const int64_t row = cache.n_head_kv * cache.head_dim;
  if (n_head_kv != cache.n_head_kv || head_dim != cache.head_dim ||
      (cache.has_gap() && first_pos < cache.gap_end && first_pos + n_tokens > cache.gap_begin)) {
    // Rows that are not contiguous in the cache (or another shape): the two operations.
    return Backend::RopeQkStoreKv(q, n_head, k, v, n_head_kv, n_tokens, head_dim, positions, params,
                                  first_pos, cache);
  }
  const int64_t at = cache.Row(first_pos);
  Fail(CudaStatus(cuda_internal::LaunchRopeStoreKv(
                      q, n_head, k, v, n_head_kv, n_tokens, head_dim, positions,
                      params.pairing == RopePairing::kAdjacent, params.n_rot, params.freq_base,
                      cache.k + at * row, cache.v + at * row, device_->stream()),
                  "RoPE and KV store"));
}

void CudaBackend::SwiGlu(const float* gate, const float* up, int64_t n, float* out) {
  if (!error_.ok()) return;
  Fail(CudaStatus(cuda_internal::LaunchSwiGlu(gate, up, n, out, device_->stream()), "SwiGLU"));
}

void CudaBackend::StoreKv(const float* k, const float* v, int64_t n_tokens, int64_t first_pos,
                          const KvLayerView& cache) {
  if (!error_.ok()) return;
  const int64_t row = cache.n_head_kv * cache.head_dim;
  const int64_t at = cache.Row(first_pos);
  Fail(CudaStatus(cuda_internal::LaunchStoreKv(k, v, n_tokens * row, cache.k + at * row,
                                               cache.v + at * row, device_->stream()),
                  "KV store"));
}

absl::Status CudaBackend::RunPieces(AttentionPieces a, float* out, float* lse, bool tiled) {
  const int64_t rows = a.n_queries * a.n_head;
  // One piece is its own merge (o already normalised; the merge would give o and lse back
  // unchanged, bit for bit): the kernel writes the output directly, a launch fewer (a decode step
  // at depth 0 has one piece per layer).
  const bool merge = a.n_pieces > 1;
  if (merge) {
    MAGICPIG_RETURN_IF_ERROR(Reserve(part_o_, a.n_pieces * rows * a.head_dim * 4));
    a.part_o = part_o_.as<float>();
  } else {
    a.part_o = out;
  }
  if (merge || lse == nullptr) {
    MAGICPIG_RETURN_IF_ERROR(Reserve(part_lse_, a.n_pieces * rows * 4));
    a.part_lse = part_lse_.as<float>();
  } else {
    a.part_lse = lse;
  }
  MAGICPIG_CUDA_RETURN_IF_ERROR(tiled ? cuda_internal::LaunchCausalTiles(a, device_->stream())
                                      : cuda_internal::LaunchAttentionPieces(a, device_->stream()));
  if (!merge) return absl::OkStatus();
  return CudaStatus(
      cuda_internal::LaunchMergePartials(a.part_o, a.part_lse, a.n_pieces, rows, a.head_dim, out,
                                         lse, device_->stream(),
                                         options_.wide_merge && a.n_pieces >= kWideMergeMinPieces),
      "attention merge");
}

void CudaBackend::CausalAttention(const float* q, int64_t n_tokens, int64_t first_pos,
                                  int64_t n_head, float scale, const KvLayerView& cache,
                                  float* out) {
  if (!error_.ok() || n_tokens == 0) return;
  if (cache.has_gap()) {
    return Fail(absl::FailedPreconditionError(
        "exact attention over a layer whose offloaded rows left the device"));
  }
  const CudaAttentionKernel kernel = options_.attention_kernel;
  if (kernel == CudaAttentionKernel::kTensor && n_tokens >= kTensorMinQueries) {
    return Fail(TensorCausalAttention(q, n_tokens, first_pos, n_head, scale, cache, out));
  }
  AttentionPieces a = PiecesOver(q, n_tokens, n_head, scale, cache);
  a.first_pos = first_pos;
  const int64_t n_keys = first_pos + n_tokens;
  const bool tiled = cache.head_dim <= cuda_internal::kCausalTileMaxHeadDim &&
                     (kernel == CudaAttentionKernel::kTiled ||
                      (kernel == CudaAttentionKernel::kAuto && n_tokens > 1));
  const int64_t blocks_per_piece =
      tiled ? cuda_internal::CausalTileBlocks(
                  cuda_internal::CausalTilesFor(n_head, cache.n_head_kv), n_tokens, cache.n_head_kv)
            : n_tokens * n_head;
  const int64_t max_pieces = std::max<int64_t>(1, (n_keys + kMinPieceKeys - 1) / kMinPieceKeys);
  const int64_t want =
      std::max<int64_t>(1, (kTargetBlocks + blocks_per_piece - 1) / blocks_per_piece);
  const int64_t pieces = std::min(max_pieces, want);
  a.piece_len = (n_keys + pieces - 1) / pieces;
  a.n_pieces = (n_keys + a.piece_len - 1) / a.piece_len;
  Fail(RunPieces(a, out, nullptr, tiled));
}

// Per chunk of queries: the queries packed as fp16 with a GQA group's heads adjacent, the scores
// of each kv head's group as one batched cuBLAS product with that head's keys (rows kvs apart in
// the cache, so batch g starts g * head_dim into it), the causal softmax into fp16 probabilities,
// their product with the values, and the result unpacked into out. The chunk is cut so that the
// scores and probabilities of all heads fit tensor_scratch_bytes.
absl::Status CudaBackend::TensorCausalAttention(const float* q, int64_t n_tokens, int64_t first_pos,
                                                int64_t n_head, float scale,
                                                const KvLayerView& cache, float* out) {
  const int64_t hd = cache.head_dim, n_kv = cache.n_head_kv, kvs = n_kv * hd;
  if (n_kv < 1 || n_head % n_kv != 0) {
    return absl::InvalidArgumentError("tensor attention: heads not a multiple of the kv heads");
  }
  const int64_t group = n_head / n_kv;
  const auto round8 = [](int64_t n) { return (n + 7) / 8 * 8; };
  const int64_t ld_max = round8(first_pos + n_tokens);
  const int64_t fit = options_.tensor_scratch_bytes / (n_head * ld_max * 6);
  const int64_t chunk_max = std::clamp<int64_t>(fit, 1, n_tokens);
  MAGICPIG_RETURN_IF_ERROR(Reserve(tensor_q_, n_head * chunk_max * hd * 2));
  MAGICPIG_RETURN_IF_ERROR(Reserve(tensor_scores_, n_head * chunk_max * ld_max * 4));
  MAGICPIG_RETURN_IF_ERROR(Reserve(tensor_probs_, n_head * chunk_max * ld_max * 2));
  MAGICPIG_RETURN_IF_ERROR(Reserve(tensor_o_, n_head * chunk_max * hd * 4));
  uint16_t* q16 = tensor_q_.as<uint16_t>();
  float* scores = tensor_scores_.as<float>();
  uint16_t* probs = tensor_probs_.as<uint16_t>();
  float* o = tensor_o_.as<float>();
  const cudaStream_t stream = device_->stream();
  const float one = 1.0f, zero = 0.0f;
  for (int64_t t0 = 0; t0 < n_tokens; t0 += chunk_max) {
    const int64_t chunk = std::min(chunk_max, n_tokens - t0);
    const int64_t n_keys = first_pos + t0 + chunk, ld = round8(n_keys), rows = group * chunk;
    MAGICPIG_CUDA_RETURN_IF_ERROR(
        cuda_internal::LaunchPackQueries(q, t0, chunk, n_head, hd, q16, stream));
    // Column-major: scores of group g (n_keys x rows, ld) = K_g (hd x n_keys, kvs)ᵀ · Q_g.
    MAGICPIG_CUBLAS_RETURN_IF_ERROR(cublasGemmStridedBatchedEx(
        device_->cublas(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n_keys),
        static_cast<int>(rows), static_cast<int>(hd), &scale, cache.k, CUDA_R_16F,
        static_cast<int>(kvs), hd, q16, CUDA_R_16F, static_cast<int>(hd), rows * hd, &zero, scores,
        CUDA_R_32F, static_cast<int>(ld), rows * ld, static_cast<int>(n_kv), CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT));
    MAGICPIG_CUDA_RETURN_IF_ERROR(cuda_internal::LaunchCausalSoftmax(
        scores, probs, ld, n_keys, n_head * chunk, chunk, first_pos + t0 + 1, stream));
    // o of group g (hd x rows) = V_g (hd x n_keys, kvs) · P_g (n_keys x rows, ld).
    MAGICPIG_CUBLAS_RETURN_IF_ERROR(cublasGemmStridedBatchedEx(
        device_->cublas(), CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(hd), static_cast<int>(rows),
        static_cast<int>(n_keys), &one, cache.v, CUDA_R_16F, static_cast<int>(kvs), hd, probs,
        CUDA_R_16F, static_cast<int>(ld), rows * ld, &zero, o, CUDA_R_32F, static_cast<int>(hd),
        rows * hd, static_cast<int>(n_kv), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    MAGICPIG_CUDA_RETURN_IF_ERROR(
        cuda_internal::LaunchUnpackOutput(o, t0, chunk, n_head, hd, out, stream));
  }
  return absl::OkStatus();
}

absl::StatusOr<const float*> CudaBackend::Projection(const attention::SimHash& hash) {
  const int64_t d = hash.dim(), cols = static_cast<int64_t>(hash.k()) * hash.l();
  const auto key = std::make_tuple(hash.seed(), d, hash.k(), hash.l());
  auto it = projections_.find(key);
  if (it == projections_.end()) {
    MAGICPIG_ASSIGN_OR_RETURN(BackendBuffer w, device_->Allocate(d * cols * 4));
    MAGICPIG_RETURN_IF_ERROR(CopyIn(w.data(), hash.projection().data(), d * cols * 4));
    it = projections_.emplace(key, std::move(w)).first;
  }
  return it->second.as<float>();
}

absl::Status CudaBackend::SimHashCodes(const attention::SimHash& hash, const float* x, int64_t n,
                                       uint16_t* codes) {
  MAGICPIG_RETURN_IF_ERROR(error_);
  if (n == 0) return absl::OkStatus();
  const int64_t d = hash.dim();
  MAGICPIG_ASSIGN_OR_RETURN(const float* w, Projection(hash));
  MAGICPIG_RETURN_IF_ERROR(Reserve(hash_codes_, n * hash.l() * 2));
  const int64_t per_launch = cuda_internal::SimHashMaxVectorsPerLaunch();
  for (int64_t v = 0; v < n; v += per_launch) {
    MAGICPIG_CUDA_RETURN_IF_ERROR(cuda_internal::LaunchSimHashCodes(
        x + v * d, w, std::min(per_launch, n - v), d, hash.k(), hash.l(),
        hash_codes_.as<uint16_t>() + v * hash.l(), device_->stream()));
  }
  return CopyOutLater(codes, hash_codes_.data(), n * hash.l() * 2);
}

absl::Status CudaBackend::OffloadKeyCodes(const attention::SimHash& hash, const KvLayerView& cache,
                                          int64_t begin, int64_t end, bool compute_centre,
                                          float* centre, uint16_t* codes) {
  MAGICPIG_RETURN_IF_ERROR(error_);
  const int64_t n = end - begin, n_kv = cache.n_head_kv, hd = cache.head_dim, l = hash.l();
  if (begin < 0 || n < 0 || hd != hash.dim() || cache.Row(end - 1) >= cache.capacity ||
      (cache.has_gap() && begin < cache.gap_end && end > cache.gap_begin)) {
    return absl::InvalidArgumentError(absl::StrCat("OffloadKeyCodes: positions [", begin, ", ", end,
                                                   ") are not rows of the cache"));
  }
  if (n == 0) return absl::OkStatus();
  MAGICPIG_RETURN_IF_ERROR(device_->MakeCurrent());
  MAGICPIG_ASSIGN_OR_RETURN(const float* w, Projection(hash));
  MAGICPIG_RETURN_IF_ERROR(Reserve(offload_centre_, n_kv * hd * 4));
  float* c = offload_centre_.as<float>();
  if (compute_centre) {
    MAGICPIG_CUDA_RETURN_IF_ERROR(cuda_internal::LaunchKeyCentre(
        cache.k, n_kv, hd, begin, n, cache.gap_begin, cache.gap_end, c, device_->stream()));
    MAGICPIG_RETURN_IF_ERROR(CopyOutLater(centre, c, n_kv * hd * 4));
  } else {
    MAGICPIG_RETURN_IF_ERROR(CopyIn(c, centre, n_kv * hd * 4));
  }
  // Per kv head, in chunks of positions: the centred keys into scratch, then their codes. Each
  // chunk's codes are queued to the host before the next chunk's kernels overwrite them (one
  // stream), so the scratch stays a few MB whatever the context.
  const int64_t chunk = std::min<int64_t>(
      {n, cuda_internal::SimHashMaxVectorsPerLaunch(), std::max<int64_t>(1, (8 << 20) / (hd * 4))});
  MAGICPIG_RETURN_IF_ERROR(Reserve(offload_keys_, chunk * hd * 4));
  MAGICPIG_RETURN_IF_ERROR(Reserve(hash_codes_, chunk * l * 2));
  for (int64_t g = 0; g < n_kv; ++g) {
    for (int64_t i0 = 0; i0 < n; i0 += chunk) {
      const int64_t m = std::min(chunk, n - i0);
      MAGICPIG_CUDA_RETURN_IF_ERROR(cuda_internal::LaunchCentredKeys(
          cache.k, n_kv, hd, g, begin + i0, m, cache.gap_begin, cache.gap_end, c,
          offload_keys_.as<float>(), device_->stream()));
      MAGICPIG_CUDA_RETURN_IF_ERROR(
          cuda_internal::LaunchSimHashCodes(offload_keys_.as<float>(), w, m, hd, hash.k(), l,
                                            hash_codes_.as<uint16_t>(), device_->stream()));
      MAGICPIG_RETURN_IF_ERROR(
          CopyOutLater(codes + (g * n + i0) * l, hash_codes_.data(), m * l * 2));
    }
  }
  return absl::OkStatus();
}

void CudaBackend::RangeAttention(const float* q, int64_t n_head, float scale,
                                 const KvLayerView& cache,
                                 absl::Span<const std::pair<int64_t, int64_t>> ranges, float* out,
                                 float* lse) {
  if (!error_.ok()) return;
  // Each range in pieces of at most kMinPieceKeys keys; an all-empty list keeps one empty piece
  // so that every head gets o = 0 and lse = -inf.
  std::vector<int64_t> pieces;
  for (auto [begin, end] : RangesAsRows(cache, ranges)) {
    for (int64_t b = begin; b < end; b += kMinPieceKeys) {
      pieces.push_back(b);
      pieces.push_back(std::min(end, b + kMinPieceKeys));
    }
  }
  if (pieces.empty()) pieces = {0, 0};
  const int64_t bytes = static_cast<int64_t>(pieces.size() * sizeof(int64_t));
  absl::Status s = Reserve(ranges_, bytes);
  if (s.ok()) s = CopyIn(ranges_.data(), pieces.data(), bytes);
  if (!s.ok()) return Fail(s);
  AttentionPieces a = PiecesOver(q, 1, n_head, scale, cache);
  a.n_pieces = static_cast<int64_t>(pieces.size() / 2);
  a.ranges = ranges_.as<int64_t>();
  Fail(RunPieces(a, out, lse));
}

}  // namespace magicpig::backend
