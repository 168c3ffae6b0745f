// Launchers of the CUDA backend's kernels (cuda_kernels.cu), callable from host C++.
//
// Each launcher enqueues its kernel on `stream` and returns the launch's error (cudaGetLastError);
// errors of the kernel's execution appear at the next synchronisation. Pointers are device memory
// unless a comment says otherwise; shapes follow backend.h.
#ifndef MAGICPIG_GPU_NODE_BACKEND_CUDA_CUDA_KERNELS_H_
#define MAGICPIG_GPU_NODE_BACKEND_CUDA_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace magicpig::backend::cuda_internal {

// rows x cols values of ggml type `type` (rows of row_bytes bytes) into dst, row-major, as fp16
// (dst_fp32 false) or fp32.
cudaError_t LaunchDequantize(int type, const uint8_t* src, int64_t rows, int64_t cols,
                             int64_t row_bytes, void* dst, bool dst_fp32, cudaStream_t stream);
// out[i][0..cols) = row ids[i] of a dequantised table (fp16 or fp32, row-major).
cudaError_t LaunchEmbed(const void* table, bool table_fp32, int64_t cols, const int32_t* ids,
                        int64_t n, float* out, cudaStream_t stream);
cudaError_t LaunchFloatToHalf(const float* x, uint16_t* y, int64_t n, cudaStream_t stream);
// Decode-sized products with fp16 weights [rows][cols] and fp32 activations and accumulation:
// one launch and no fp16 copy of x. Only where HalfMatVecFits (a batch of at most
// kMaxMatVecTokens, cols a multiple of 8, 16-byte aligned weights and x); cudaErrorInvalidValue
// otherwise.
constexpr int64_t kMaxMatVecTokens = 8;
bool HalfMatVecFits(int64_t n_tokens, int64_t cols, const void* w, const float* x);
// Up to kMaxMatVecProducts products of one x: y[s][t][0..rows[s]) = x[t] · w[s]ᵀ + bias[s] (bias
// null: none), or, with accumulate, y[s][t] += x[t] · w[s]ᵀ (bias ignored). With norm_weight
// (16-byte aligned), x[t] is RMS-normalised first, as LaunchRmsNorm would (no launch of its own).
constexpr int kMaxMatVecProducts = 3;
struct MatVecProducts {
  const uint16_t* w[kMaxMatVecProducts] = {};  // fp16 bits
  const float* bias[kMaxMatVecProducts] = {};
  float* y[kMaxMatVecProducts] = {};
  int64_t rows[kMaxMatVecProducts] = {};
  int count = 0;
  int64_t cols = 0;
  bool accumulate = false;
  const float* norm_weight = nullptr;
  float norm_eps = 0;
};
cudaError_t LaunchHalfMatVec(const MatVecProducts& p, const float* x, int64_t n_tokens,
                             cudaStream_t stream);
// out[t][0..rows) = silu(x[t] · gateᵀ) * (x[t] · upᵀ), rounded as LaunchSwiGlu rounds (x
// normalised first with norm_weight, when not null, as above).
cudaError_t LaunchHalfGateUp(const uint16_t* gate, const uint16_t* up, const float* x,
                             int64_t n_tokens, int64_t rows, int64_t cols, const float* norm_weight,
                             float norm_eps, float* out, cudaStream_t stream);
cudaError_t LaunchRmsNorm(const float* x, const float* weight, int64_t n_tokens, int64_t dim,
                          float eps, float* out, cudaStream_t stream);
cudaError_t LaunchAddBias(float* x, const float* bias, int64_t n_tokens, int64_t dim,
                          cudaStream_t stream);
cudaError_t LaunchAdd(const float* x, float* y, int64_t n, cudaStream_t stream);
// x ([t][n_heads_x][head_dim]) and y ([t][n_heads_y][head_dim]; may be null with n_heads_y 0)
// rotated in one launch.
cudaError_t LaunchRope(float* x, int64_t n_heads_x, float* y, int64_t n_heads_y, int64_t n_tokens,
                       int64_t head_dim, const int32_t* positions, bool adjacent_pairs,
                       int64_t n_rot, double freq_base, cudaStream_t stream);
// LaunchRope of q and k, then LaunchStoreKv of the rotated k and v into k_dst / v_dst (the
// cache's rows of the n_tokens positions), in one launch; the same values bit for bit.
cudaError_t LaunchRopeStoreKv(float* q, int64_t n_head, float* k, const float* v, int64_t n_head_kv,
                              int64_t n_tokens, int64_t head_dim, const int32_t* positions,
                              bool adjacent_pairs, int64_t n_rot, double freq_base, uint16_t* k_dst,
                              uint16_t* v_dst, cudaStream_t stream);
cudaError_t LaunchSwiGlu(const float* gate, const float* up, int64_t n, float* out,
                         cudaStream_t stream);
// dst[i] = fp16(src[i]) for k and v alike (n values each).
cudaError_t LaunchStoreKv(const float* k, const float* v, int64_t n, uint16_t* k_dst,
                          uint16_t* v_dst, cudaStream_t stream);

// SimHash codes of n vectors of dimension d: codes[v][t] = sum over b < k of
// (x[v] . w[:, t * k + b] > 0) << b for t < l, with w row-major [d][k * l] and the projections
// summed in fp32 in index order. One launch, no product buffer: the cuBLAS product this replaced
// cost ~140 us of host time per call (its fp32 pedantic path), more than a whole sparse layer's
// device work (docs/gpu.md). Needs 1 <= k <= 16, n <= SimHashMaxVectorsPerLaunch() and d small
// enough for shared memory (8 vectors of d floats plus 8 KB: d <= 1024).
cudaError_t LaunchSimHashCodes(const float* x, const float* w, int64_t n, int64_t d, int k, int l,
                               uint16_t* codes, cudaStream_t stream);
int64_t SimHashMaxVectorsPerLaunch();

// An offload's keys on the device (CudaBackend::OffloadKeyCodes), from an fp16 cache laid out
// [row][n_kv][hd] whose positions [gap_begin, gap_end) are not stored (KvLayerView):
// centre[g][t] = the mean of positions [begin, begin + n) (float64 sums in position order, as
// backend::CentredKeys), and out[i][t] = k[begin + i][g][t] - centre[g][t] for one kv head g,
// rounded to bf16 (nearest even) and kept as a float: the values SimHash::KeyCodes hashes.
cudaError_t LaunchKeyCentre(const uint16_t* k, int64_t n_kv, int64_t hd, int64_t begin, int64_t n,
                            int64_t gap_begin, int64_t gap_end, float* centre, cudaStream_t stream);
cudaError_t LaunchCentredKeys(const uint16_t* k, int64_t n_kv, int64_t hd, int64_t g, int64_t begin,
                              int64_t n, int64_t gap_begin, int64_t gap_end, const float* centre,
                              float* out, cudaStream_t stream);

// Partial attention over pieces of keys ("split-K"): block (query t, head h, piece s) attends
// query t's head h over the keys of piece s and writes the piece's normalised output and
// log-sum-exp (natural log; -inf and o = 0 for an empty piece). MergePartials combines the
// pieces exactly, as the CPU backend and the router do (FlashInfer's merge of attention states).
struct AttentionPieces {
  const float* q = nullptr;     // [n_queries][n_head][head_dim]
  const uint16_t* k = nullptr;  // cache rows [position][n_head_kv][head_dim], fp16
  const uint16_t* v = nullptr;
  int64_t n_queries = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
  float scale = 1;
  int64_t n_pieces = 0;
  // Causal mode (ranges == nullptr): query t sees keys [0, first_pos + t]; piece s is
  // [s * piece_len, (s + 1) * piece_len) of them. Range mode: piece s is keys
  // [ranges[2s], ranges[2s + 1]) for every query.
  int64_t first_pos = 0, piece_len = 0;
  const int64_t* ranges = nullptr;
  float* part_o = nullptr;    // [n_pieces][n_queries][n_head][head_dim]
  float* part_lse = nullptr;  // [n_pieces][n_queries][n_head]
};
cudaError_t LaunchAttentionPieces(const AttentionPieces& a, cudaStream_t stream);
// The same contract in causal mode only (ranges == nullptr), for decode steps and prefill chunks
// alike: each block's rows are up to kCausalTileRows (query, head) pairs that read one kv head (a
// tile of queries times the heads of one GQA group, or a part of a group larger than that), and
// they share each tile of keys staged in shared memory. Needs head_dim <= kCausalTileMaxHeadDim
// and n_pieces <= 65535.
constexpr int kCausalTileRows = 16;
constexpr int kCausalTileMaxHeadDim = 128;
// How a block's rows are made: `queries` queries times `heads` heads of a group, a group taking
// `head_blocks` blocks.
struct CausalTileShape {
  int queries = 1, heads = 1, head_blocks = 1;
};
CausalTileShape CausalTilesFor(int64_t n_head, int64_t n_head_kv);
// Blocks per piece of a launch over n_queries queries.
int64_t CausalTileBlocks(const CausalTileShape& shape, int64_t n_queries, int64_t n_head_kv);
cudaError_t LaunchCausalTiles(const AttentionPieces& a, cudaStream_t stream);
// out[t][h] = the merge of the n_pieces partials of (t, h); lse (optional) their total lse.
// head_dim <= 256. `wide`: one block of 16 warps per row, the pieces shared among the warps (for
// rows of many pieces: deep decode steps); otherwise one thread per dimension walks the pieces.
cudaError_t LaunchMergePartials(const float* part_o, const float* part_lse, int64_t n_pieces,
                                int64_t n_rows, int64_t head_dim, float* out, float* lse,
                                cudaStream_t stream, bool wide = false);

// The pieces of causal attention on the tensor cores (CudaBackend::TensorCausalAttention): the
// scores and the weighted sum of values are cuBLAS products over the fp16 cache; these kernels
// prepare and finish them. For a chunk of queries t0 .. t0 + chunk of q [t][n_head][head_dim]:
// q16 = those queries as fp16, [h][tt][head_dim] (a GQA group's heads adjacent).
cudaError_t LaunchPackQueries(const float* q, int64_t t0, int64_t chunk, int64_t n_head,
                              int64_t head_dim, uint16_t* q16, cudaStream_t stream);
// Row r of scores ([n_rows][ld], fp32; head r / chunk, query t0 + r % chunk) into p (fp16, same
// layout): the softmax of its first first_visible + r % chunk scores (capped at n_cols), zeros
// after them up to n_cols.
cudaError_t LaunchCausalSoftmax(const float* scores, uint16_t* p, int64_t ld, int64_t n_cols,
                                int64_t n_rows, int64_t chunk, int64_t first_visible,
                                cudaStream_t stream);
// o [h][tt][head_dim] into rows t0 .. t0 + chunk of out [t][n_head][head_dim].
cudaError_t LaunchUnpackOutput(const float* o, int64_t t0, int64_t chunk, int64_t n_head,
                               int64_t head_dim, float* out, cudaStream_t stream);

}  // namespace magicpig::backend::cuda_internal

#endif  // MAGICPIG_GPU_NODE_BACKEND_CUDA_CUDA_KERNELS_H_
