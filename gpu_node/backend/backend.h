// The compute backend: the dense operations of a transformer step, behind one interface.
//
// The CPU backend (cpu/) is the reference and the default; the CUDA backend (cuda/) implements the
// same interface and is tested against it. Data convention: activations are row-major float32
// [n_tokens][dim]; weights are QuantMatrix views in their file format; the KV cache is IEEE fp16,
// laid out [position][n_head_kv][head_dim] per layer.
//
// Memory: activations, positions and the KV cache live in the backend's memory, which is host
// memory for the CPU backend and device memory for CUDA (host_memory() says which; the host must
// not dereference the latter). Callers allocate it with Allocate and move data with CopyIn /
// CopyOut. Weights are passed as host pointers (QuantMatrix::data, norm and bias vectors): a
// backend that needs its own copies takes them once in PrepareMatrix / PrepareVector, before the
// first operation that reads them. Token ids (Embed) and key ranges (RangeAttention) are host
// memory.
//
// Errors: operations that return void may fail on a device backend (a launch error); such a
// backend keeps the first failure and Execute returns it.
//
// Thread-safety: a Backend runs one batch at a time (Execute is not reentrant). Operations must be
// called from inside Execute, which runs them on the backend's own threads. Allocate, the copies
// and the Prepare calls may be called outside Execute too, never concurrently with it.
#ifndef MAGICPIG_GPU_NODE_BACKEND_BACKEND_H_
#define MAGICPIG_GPU_NODE_BACKEND_BACKEND_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/attention/simhash.h"
#include "common/quant/matmul.h"

namespace magicpig::backend {

enum class RopePairing {
  kAdjacent,    // (x[2i], x[2i+1]) — llama GGUFs
  kHalfOffset,  // (x[i], x[i + n_rot/2]) — "NEOX": qwen2, gemma
};

struct RopeParams {
  RopePairing pairing = RopePairing::kAdjacent;
  int64_t n_rot = 0;  // rotated dims per head (even, <= head_dim)
  double freq_base = 10000.0;
};

// One layer's KV cache (not owned). Rows are positions; row p holds n_head_kv * head_dim values.
struct KvLayerView {
  uint16_t* k = nullptr;  // fp16 bits
  uint16_t* v = nullptr;
  int64_t capacity = 0;  // rows allocated
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  // Positions [gap_begin, gap_end) are not stored (a sparse layer's offloaded region, dropped from
  // a device cache once it is on the attention shards); position p >= gap_end is row
  // p - (gap_end - gap_begin). No gap by default. Only StoreKv, RangeAttention and the offload's
  // key operations (CentredKeys, OffloadKeyCodes; positions outside the gap) accept a view with a
  // gap.
  int64_t gap_begin = 0;
  int64_t gap_end = 0;
  bool has_gap() const { return gap_end > gap_begin; }
  int64_t Row(int64_t pos) const { return pos >= gap_end ? pos - (gap_end - gap_begin) : pos; }
};

// `ranges` of positions as ranges of rows of `cache`; positions inside the gap are skipped.
std::vector<std::pair<int64_t, int64_t>> RangesAsRows(
    const KvLayerView& cache, absl::Span<const std::pair<int64_t, int64_t>> ranges);

// The keys (and values) an offload hands the attention shards (docs/architecture.md §4.5), from a
// cache in host memory: for positions [begin, end) of every kv head g, keys_out[g][i][t] =
// k[begin + i][g][t] - c[g][t] and, where values_out is not null, values_out[g][i][t] =
// v[begin + i][g][t], in float32. With compute_centre, c (centre, [n_head_kv][head_dim]) is first
// set to each kv head's mean key over the range, summed in float64 in position order; otherwise
// it is read. The router's offload and Backend::OffloadKeyCodes' host version both call this, and a
// device backend's version gives the same centre bit for bit (the same sums in the same order).
// Runs on the caller's oneTBB arena.
void CentredKeys(const KvLayerView& cache, int64_t begin, int64_t end, bool compute_centre,
                 float* centre, float* keys_out, float* values_out);
// CentredKeys' keys hashed with `hash` into codes [n_head_kv * (end - begin)][hash.l()]: what
// Backend::OffloadKeyCodes computes, here on the host from a cache in host memory.
absl::Status CentredKeyCodes(const attention::SimHash& hash, const KvLayerView& cache,
                             int64_t begin, int64_t end, bool compute_centre, float* centre,
                             uint16_t* codes);

// Memory allocated by a backend in its own address space; gives it back when destroyed.
// Move-only. Thread-safety: none (owned by one user).
class BackendBuffer {
 public:
  BackendBuffer() = default;
  BackendBuffer(void* data, int64_t bytes, std::function<void(void*)> release)
      : data_(data), bytes_(bytes), release_(std::move(release)) {}
  ~BackendBuffer() { Reset(); }
  BackendBuffer(BackendBuffer&& other) noexcept { *this = std::move(other); }
  BackendBuffer& operator=(BackendBuffer&& other) noexcept {
    if (this != &other) {
      Reset();
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
      release_ = std::move(other.release_);
    }
    return *this;
  }
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;

  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void Reset() {
    if (data_ != nullptr && release_) release_(data_);
    data_ = nullptr;
    bytes_ = 0;
  }
  void* data_ = nullptr;
  int64_t bytes_ = 0;
  std::function<void(void*)> release_;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  // One line for logs and benchmark headers: the backend and the hardware it runs on.
  virtual std::string Describe() const { return std::string(name()); }

  // --- Memory (see the file comment) ---
  // True when the operations' pointers are host memory (the CPU backend).
  virtual bool host_memory() const { return true; }
  // True when the backend's products are faster with Q4_K, Q6_K, Q4_1 and Q8_0 weights in the
  // 16-row interleaved layout (common/quant/interleave.h); the engine then loads them that way.
  virtual bool wants_interleaved_weights() const { return false; }
  // Device memory allocated through this backend now, and the device's size; zeros for a backend
  // that computes in host memory.
  struct DeviceMemoryStats {
    int64_t in_use = 0;
    int64_t total = 0;
  };
  virtual DeviceMemoryStats DeviceMemory() const { return {}; }
  // `bytes` of the backend's memory, 64-byte aligned, uninitialised. RESOURCE_EXHAUSTED when
  // there is not enough.
  virtual absl::StatusOr<BackendBuffer> Allocate(int64_t bytes);
  // Grows `buffer` (this backend's) to at least `bytes` with Allocate; a buffer already that large
  // is kept as it is (its contents are not carried over when it grows). For scratch kept between
  // calls.
  absl::Status Reserve(BackendBuffer& buffer, int64_t bytes);
  // dst (backend memory) <- host_src; host_dst <- src (backend memory). CopyOut returns once the
  // data is on the host, after every operation issued before it.
  virtual absl::Status CopyIn(void* dst, const void* host_src, int64_t bytes);
  virtual absl::Status CopyOut(void* host_dst, const void* src, int64_t bytes);
  // CopyOut without the wait, for a step's several small copies to the host (one
  // synchronisation instead of one each): host_dst holds the data once FlushCopies, a CopyOut or
  // the end of Execute has returned, and must not be read (or freed) before. Default: CopyOut.
  virtual absl::Status CopyOutLater(void* host_dst, const void* src, int64_t bytes) {
    return CopyOut(host_dst, src, bytes);
  }
  // Waits for the copies CopyOutLater queued (and everything issued before them).
  virtual absl::Status FlushCopies() { return absl::OkStatus(); }
  // dst <- src, both backend memory (ordered with the operations issued before and after).
  virtual absl::Status CopyWithin(void* dst, const void* src, int64_t bytes);
  // Takes the backend's own copy of a weight matrix or vector (no-ops on the CPU backend). The
  // host data must stay unchanged while the backend lives.
  virtual absl::Status PrepareMatrix(const QuantMatrix& w) { return absl::OkStatus(); }
  virtual absl::Status PrepareVector(const float* v, int64_t n) { return absl::OkStatus(); }

  // Runs `batch` (a sequence of the operations below) on the backend's threads.
  virtual absl::Status Execute(absl::FunctionRef<absl::Status()> batch) = 0;
  // Execute for a batch that a device backend may record and replay as one unit (the CUDA
  // backend's graphs), for a step repeated many times with the same operations (a decode step).
  // The batch must (a) not read on the host what a CopyOut brings back before this returns (the
  // data arrives when it returns), (b) make no host-side decision on device results, and (c)
  // tolerate being run twice: a backend that cannot record it (an allocation or a buffer that
  // must grow inside it, say) runs it again with Execute, so its host-side effects must be
  // idempotent. The default is Execute.
  virtual absl::Status ExecuteReplayable(absl::FunctionRef<absl::Status()> batch) {
    return Execute(batch);
  }

  // y[n_tokens][w.rows] = x[n_tokens][w.cols] · Wᵀ
  virtual absl::Status MatMul(const QuantMatrix& w, const float* x, int64_t n_tokens, float* y) = 0;
  // Fused products: each is defined by the operations above, which the defaults call (the CPU
  // backend's case, so its results do not change); a device backend runs them as one launch
  // where it can, since a decode step's small products cost about a launch each.
  //
  // An RMSNorm of the input before the products: the products then read
  // RmsNorm(x, weight, eps), which the defaults write to `out` ([n_tokens][cols] floats) and a
  // device backend may compute inside the products instead. No weight: the products read x.
  struct InputNorm {
    const float* weight = nullptr;  // a prepared vector
    float eps = 0;
    float* out = nullptr;
  };
  // products[i].y[n_tokens][w.rows] = in · wᵀ (+ bias, a prepared vector, when not null) for
  // products sharing the input in = x or its norm (the q, k and v projections; the LM head).
  struct Product {
    const QuantMatrix* w = nullptr;
    const float* bias = nullptr;
    float* y = nullptr;
  };
  virtual absl::Status MatMuls(absl::Span<const Product> products, const float* x, int64_t n_tokens,
                               const InputNorm& norm);
  // y[n_tokens][w.rows] += x · wᵀ (a product and its residual add). The default writes the
  // product to `scratch` (n_tokens * w.rows floats) and adds it.
  virtual absl::Status MatMulAdd(const QuantMatrix& w, const float* x, int64_t n_tokens, float* y,
                                 float* scratch);
  // out[n_tokens][w_gate.rows] = silu(in · w_gateᵀ) * (in · w_upᵀ) (SwiGlu of the two products),
  // in as for MatMuls. The default writes the products to `gate` and `up` first; out may be gate.
  virtual absl::Status GateUpSwiGlu(const QuantMatrix& w_gate, const QuantMatrix& w_up,
                                    const float* x, int64_t n_tokens, const InputNorm& norm,
                                    float* gate, float* up, float* out);
  // For the fused defaults: x, or its RMSNorm written to norm.out.
  const float* Normalised(const float* x, int64_t n_tokens, int64_t cols, const InputNorm& norm);

  // out[i][0..table.cols) = row ids[i] of the table, dequantised.
  virtual absl::Status Embed(const QuantMatrix& table, absl::Span<const int32_t> ids,
                             float* out) = 0;
  // out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight
  virtual void RmsNorm(const float* x, const float* weight, int64_t n_tokens, int64_t dim,
                       float eps, float* out) = 0;
  // x[t][0..dim) += bias
  virtual void AddBias(float* x, const float* bias, int64_t n_tokens, int64_t dim) = 0;
  // y[i] += x[i]
  virtual void Add(const float* x, float* y, int64_t n) = 0;
  // Rotates each head of x[t] ([n_heads][head_dim]) by position positions[t].
  virtual void Rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
                    const int32_t* positions, const RopeParams& params) = 0;
  // Rope of q ([t][n_head][head_dim]) and of k ([t][n_head_kv][head_dim]) at the same positions:
  // one operation where the backend can fuse them (a kernel launch fewer per layer on a GPU).
  virtual void RopeQk(float* q, int64_t n_head, float* k, int64_t n_head_kv, int64_t n_tokens,
                      int64_t head_dim, const int32_t* positions, const RopeParams& params) {
    Rope(q, n_tokens, n_head, head_dim, positions, params);
    Rope(k, n_tokens, n_head_kv, head_dim, positions, params);
  }
  // RopeQk, then StoreKv(k, v, n_tokens, first_pos, cache) of the rotated k: one operation where
  // the backend can fuse them (one launch instead of two per layer of a one-sequence step).
  virtual void RopeQkStoreKv(float* q, int64_t n_head, float* k, const float* v, int64_t n_head_kv,
                             int64_t n_tokens, int64_t head_dim, const int32_t* positions,
                             const RopeParams& params, int64_t first_pos,
                             const KvLayerView& cache) {
    RopeQk(q, n_head, k, n_head_kv, n_tokens, head_dim, positions, params);
    StoreKv(k, v, n_tokens, first_pos, cache);
  }
  // out[i] = silu(gate[i]) * up[i]
  virtual void SwiGlu(const float* gate, const float* up, int64_t n, float* out) = 0;
  // Writes k, v ([n_tokens][n_head_kv * head_dim]) into cache rows first_pos.. (must fit).
  virtual void StoreKv(const float* k, const float* v, int64_t n_tokens, int64_t first_pos,
                       const KvLayerView& cache) = 0;
  // Exact causal attention for n_tokens queries at positions first_pos.. over cache rows
  // [0, first_pos + t] for query t. q and out are [n_tokens][n_head * head_dim]; query head h
  // reads kv head h / (n_head / n_head_kv). scale multiplies q·k. No n² buffer is formed.
  virtual void CausalAttention(const float* q, int64_t n_tokens, int64_t first_pos, int64_t n_head,
                               float scale, const KvLayerView& cache, float* out) = 0;

  // SimHash codes of n vectors x ([n][hash.dim()], backend memory) into host codes [n][hash.l()],
  // as attention::SimHash defines them; a device's bits may differ from SimHash::Codes' only where
  // a projection is within rounding of zero. The codes arrive as CopyOutLater's data does (read
  // them after FlushCopies). The CPU backend calls hash.Codes.
  virtual absl::Status SimHashCodes(const attention::SimHash& hash, const float* x, int64_t n,
                                    uint16_t* codes) {
    return hash.Codes(x, n, hash.dim(), codes);
  }

  // The SimHash codes of an offload's keys, computed where the cache lives (a prefill's sparse
  // layer on a device backend, so that the host need not hash them): CentredKeys' keys of
  // positions [begin, end) of `cache` (compute_centre: the centre is computed into `centre`
  // first, else read from it; host memory, [n_head_kv][head_dim]) hashed with `hash` into host
  // codes [n_head_kv * (end - begin)][hash.l()], what hash.KeyCodes gives for CentredKeys'
  // keys_out. A device's bits may differ only where a projection is within rounding of zero; its
  // centre is the same. The outputs arrive as CopyOutLater's data does (read them after
  // FlushCopies). Default: on the host, for a cache in host memory.
  virtual absl::Status OffloadKeyCodes(const attention::SimHash& hash, const KvLayerView& cache,
                                       int64_t begin, int64_t end, bool compute_centre,
                                       float* centre, uint16_t* codes);

  // Exact attention of ONE query token (q: [n_head][head_dim]) over the cache rows in `ranges`
  // (disjoint [begin, end) position ranges): the static-window part of a sparse decode step.
  // Writes the normalised o ([n_head][head_dim]) and lse ([n_head], natural log) of that part, for
  // an exact merge with sampled parts; a head with no key (all ranges empty) gets o = 0 and
  // lse = -inf.
  virtual void RangeAttention(const float* q, int64_t n_head, float scale, const KvLayerView& cache,
                              absl::Span<const std::pair<int64_t, int64_t>> ranges, float* out,
                              float* lse) = 0;
};

}  // namespace magicpig::backend

#endif  // MAGICPIG_GPU_NODE_BACKEND_BACKEND_H_
