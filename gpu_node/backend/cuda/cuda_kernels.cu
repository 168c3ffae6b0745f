// The CUDA backend's kernels. Simple, checked versions first: each is compared with the CPU
// backend by cuda_backend_test on a GPU machine (scripts/device-check); speed work comes after
// measurements there.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <utility>

#include "gpu_node/backend/cuda/block_decode.h"
#include "gpu_node/backend/cuda/cuda_kernels.h"

namespace magicpig::backend::cuda_internal {
namespace {

constexpr int kThreads = 256;

unsigned Blocks(int64_t n, int threads = kThreads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

// Warp-wide max and sum: every lane of a full warp returns the result.
__device__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

template <typename T>
__device__ T WarpSum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One thread per block of the weight matrix.
__global__ void DequantizeKernel(int type, const uint8_t* src, int64_t rows, int64_t blocks_per_row,
                                 int64_t row_bytes, int64_t cols, void* dst, bool dst_fp32) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * blocks_per_row) return;
  const int64_t row = i / blocks_per_row, block = i % blocks_per_row;
  const int values = BlockValues(type);
  const uint8_t* b = src + row * row_bytes + block * BlockBytes(type);
  const int64_t base = row * cols + block * values;
  if (dst_fp32) {
    float* out = static_cast<float*>(dst) + base;
    DecodeBlock(type, b, [out](int j, float x) { out[j] = x; });
  } else {
    __half* out = static_cast<__half*>(dst) + base;
    DecodeBlock(type, b, [out](int j, float x) { out[j] = __float2half_rn(x); });
  }
}

__global__ void EmbedKernel(const void* table, bool table_fp32, int64_t cols, const int32_t* ids,
                            int64_t n, float* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * cols) return;
  const int64_t t = i / cols, c = i % cols;
  const int64_t src = static_cast<int64_t>(ids[t]) * cols + c;
  out[i] = table_fp32 ? static_cast<const float*>(table)[src]
                      : __half2float(static_cast<const __half*>(table)[src]);
}

__global__ void FloatToHalfKernel(const float* x, __half* y, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = __float2half_rn(x[i]);
}

// Decode-sized products (NT <= 8 tokens) with fp16 weights: one warp per weight row, each lane
// loading 8 weights (16 bytes) per chunk, kMatVecUnroll chunks in flight before any is used so
// that a warp keeps several loads outstanding; fp32 activations and accumulation. Each weight is
// read once for all NT tokens; the activations are re-read by every warp, from L1/L2.
constexpr int kMatVecUnroll = 4;

// The RMSNorm factors of x's NT rows, computed by every warp that needs them (each lane sums
// its strided share in double, as RmsNormKernel does; the warp adds them up): no launch of its own.
template <int NT>
__device__ void NormFactors(const float* x, int64_t cols, float eps, int lane, float (&inv)[NT]) {
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    double sum = 0;
    for (int64_t i = lane; i < cols; i += 32) {
      const float v = __ldg(x + t * cols + i);
      sum += static_cast<double>(v) * v;
    }
    sum = WarpSum(sum);
    inv[t] = static_cast<float>(1.0 / sqrt(sum / static_cast<double>(cols) + eps));
  }
}

// acc[t] += this lane's share of w_row · x[t] (the warp's lanes together cover the row); with
// norm_weight, x[t] is first normalised as RmsNormKernel rounds it: (x * inv[t]) * norm_weight.
template <int NT>
__device__ void AccumulateRow(const __half* w_row, const float* x, int64_t cols,
                              const float* norm_weight, const float (&inv)[NT], int lane,
                              float (&acc)[NT]) {
  const uint4* wr = reinterpret_cast<const uint4*>(w_row);
  const int64_t chunks = cols / 8;
  for (int64_t base = lane; base < chunks; base += 32 * kMatVecUnroll) {
    uint4 packed[kMatVecUnroll];
#pragma unroll
    for (int u = 0; u < kMatVecUnroll; ++u) {
      const int64_t c = base + u * 32;
      packed[u] = c < chunks ? __ldg(wr + c) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kMatVecUnroll; ++u) {
      const int64_t c = base + u * 32;
      if (c >= chunks) break;
      const __half2* h = reinterpret_cast<const __half2*>(&packed[u]);
      const float2 w0 = __half22float2(h[0]), w1 = __half22float2(h[1]);
      const float2 w2 = __half22float2(h[2]), w3 = __half22float2(h[3]);
      float4 na = make_float4(1, 1, 1, 1), nb = na;
      if (norm_weight != nullptr) {
        na = __ldg(reinterpret_cast<const float4*>(norm_weight) + 2 * c);
        nb = __ldg(reinterpret_cast<const float4*>(norm_weight) + 2 * c + 1);
      }
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const float4* xt = reinterpret_cast<const float4*>(x + t * cols) + 2 * c;
        float4 a = __ldg(xt), b = __ldg(xt + 1);
        if (norm_weight != nullptr) {
          const float f = inv[t];
          a = make_float4(__fmul_rn(__fmul_rn(a.x, f), na.x), __fmul_rn(__fmul_rn(a.y, f), na.y),
                          __fmul_rn(__fmul_rn(a.z, f), na.z), __fmul_rn(__fmul_rn(a.w, f), na.w));
          b = make_float4(__fmul_rn(__fmul_rn(b.x, f), nb.x), __fmul_rn(__fmul_rn(b.y, f), nb.y),
                          __fmul_rn(__fmul_rn(b.z, f), nb.z), __fmul_rn(__fmul_rn(b.w, f), nb.w));
        }
        acc[t] += w0.x * a.x + w0.y * a.y + w1.x * a.z + w1.y * a.w + w2.x * b.x + w2.y * b.y +
                  w3.x * b.z + w3.y * b.w;
      }
    }
  }
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = WarpSum(acc[t]);
}

// Rows of up to kMaxMatVecProducts matrices sharing x, numbered one after the other: warp r
// finds its matrix and writes y = w·x (+ bias), or adds it to y.
template <int NT>
__global__ void HalfMatVecKernel(MatVecProducts p, const float* x) {
  const int lane = threadIdx.x % 32;
  int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  int s = 0;
  while (s < p.count && row >= p.rows[s]) row -= p.rows[s++];
  if (s == p.count) return;
  float inv[NT], acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) inv[t] = 1.0f, acc[t] = 0.0f;
  if (p.norm_weight != nullptr) NormFactors<NT>(x, p.cols, p.norm_eps, lane, inv);
  AccumulateRow<NT>(reinterpret_cast<const __half*>(p.w[s]) + row * p.cols, x, p.cols,
                    p.norm_weight, inv, lane, acc);
  if (lane != 0) return;
  const float bias = p.bias[s] != nullptr ? p.bias[s][row] : 0.0f;
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    float* y = p.y[s] + t * p.rows[s] + row;
    *y = p.accumulate ? *y + acc[t] : acc[t] + bias;
  }
}

// out[t][r] = silu(gate_r · x[t]) * (up_r · x[t]), as SwiGluKernel rounds it (x normalised first
// with norm_weight, as in HalfMatVecKernel).
template <int NT>
__global__ void HalfGateUpKernel(const __half* gate, const __half* up, const float* x, int64_t rows,
                                 int64_t cols, const float* norm_weight, float norm_eps,
                                 float* out) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  float inv[NT], g[NT], u[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) inv[t] = 1.0f, g[t] = u[t] = 0.0f;
  if (norm_weight != nullptr) NormFactors<NT>(x, cols, norm_eps, lane, inv);
  AccumulateRow<NT>(gate + row * cols, x, cols, norm_weight, inv, lane, g);
  AccumulateRow<NT>(up + row * cols, x, cols, norm_weight, inv, lane, u);
  if (lane != 0) return;
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    out[t * rows + row] = __fmul_rn(__fdiv_rn(g[t], __fadd_rn(1.0f, expf(-g[t]))), u[t]);
  }
}

// Block-wide sum of one value per thread (blockDim.x a multiple of 32, at most 1024).
template <typename T>
__device__ T BlockSum(T v) {
  __shared__ T warp_sums[32];
  v = WarpSum(v);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  __syncthreads();  // warp_sums may still be read by a previous call
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  T total = 0;
  for (int w = 0; w < warps; ++w) total += warp_sums[w];
  return total;
}

__device__ float BlockMax(float v) {
  __shared__ float warp_max[32];
  v = WarpMax(v);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  __syncthreads();
  if (lane == 0) warp_max[warp] = v;
  __syncthreads();
  float m = -INFINITY;
  for (int w = 0; w < warps; ++w) m = fmaxf(m, warp_max[w]);
  return m;
}

// One block per token; the sum of squares in double, as the CPU backend computes it.
__global__ void RmsNormKernel(const float* x, const float* weight, int64_t dim, float eps,
                              float* out) {
  const float* xt = x + blockIdx.x * dim;
  float* ot = out + blockIdx.x * dim;
  double sum = 0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) sum += static_cast<double>(xt[i]) * xt[i];
  sum = BlockSum(sum);
  const float inv = static_cast<float>(1.0 / sqrt(sum / static_cast<double>(dim) + eps));
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    ot[i] = __fmul_rn(__fmul_rn(xt[i], inv), weight[i]);
  }
}

__global__ void AddBiasKernel(float* x, const float* bias, int64_t n_tokens, int64_t dim) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n_tokens * dim) x[i] += bias[i % dim];
}

__global__ void AddKernel(const float* x, float* y, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] += x[i];
}

// Rotates pair `pair` of the head at xh by position pos (angles in double as on the CPU: theta =
// pos * base^(-2 pair / n_rot)) and returns the pair's indices in the head and its new values.
struct RotatedPair {
  int64_t a, b;
  float xa, xb;
};
__device__ RotatedPair RotatePair(float* xh, int64_t pair, int32_t pos, bool adjacent,
                                  int64_t n_rot, double freq_base) {
  const double theta = pos * pow(freq_base, -2.0 * static_cast<double>(pair) / n_rot);
  const float c = static_cast<float>(cos(theta)), s = static_cast<float>(sin(theta));
  const int64_t a = adjacent ? 2 * pair : pair;
  const int64_t b = adjacent ? 2 * pair + 1 : pair + n_rot / 2;
  const float xa = xh[a], xb = xh[b];
  const RotatedPair r{a, b, __fsub_rn(__fmul_rn(xa, c), __fmul_rn(xb, s)),
                      __fadd_rn(__fmul_rn(xa, s), __fmul_rn(xb, c))};
  xh[a] = r.xa;
  xh[b] = r.xb;
  return r;
}

// One thread per rotated pair of the heads of x and then of y (q and k at the same positions).
__global__ void RopeKernel(float* x, int64_t n_heads_x, float* y, int64_t n_heads_y,
                           int64_t n_tokens, int64_t head_dim, const int32_t* positions,
                           bool adjacent, int64_t n_rot, double freq_base) {
  const int64_t half = n_rot / 2, n_heads = n_heads_x + n_heads_y;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n_tokens * n_heads * half) return;
  const int64_t pair = i % half, head = (i / half) % n_heads, t = i / (half * n_heads);
  float* xh = head < n_heads_x ? x + (t * n_heads_x + head) * head_dim
                               : y + (t * n_heads_y + head - n_heads_x) * head_dim;
  RotatePair(xh, pair, positions[t], adjacent, n_rot, freq_base);
}

// RopeKernel's rotation of q and k, and the KV store of the rotated k and of v, in one launch:
// thread i rotates pair i (as RopeKernel; a k pair also goes to the cache as fp16), stores value
// element i and, where n_rot < head_dim, k element i when it lies outside the rotated dims.
__global__ void RopeStoreKvKernel(float* q, int64_t n_head, float* k, const float* v,
                                  int64_t n_head_kv, int64_t n_tokens, int64_t head_dim,
                                  const int32_t* positions, bool adjacent, int64_t n_rot,
                                  double freq_base, __half* kd, __half* vd) {
  const int64_t half = n_rot / 2, n_heads = n_head + n_head_kv;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n_tokens * n_heads * half) {
    const int64_t pair = i % half, head = (i / half) % n_heads, t = i / (half * n_heads);
    const bool is_k = head >= n_head;
    const int64_t offset =
        is_k ? (t * n_head_kv + head - n_head) * head_dim : (t * n_head + head) * head_dim;
    const RotatedPair r =
        RotatePair((is_k ? k : q) + offset, pair, positions[t], adjacent, n_rot, freq_base);
    if (is_k) {
      kd[offset + r.a] = __float2half_rn(r.xa);
      kd[offset + r.b] = __float2half_rn(r.xb);
    }
  }
  const int64_t kv = n_tokens * n_head_kv * head_dim;
  if (i < kv) {
    vd[i] = __float2half_rn(v[i]);
    if (i % head_dim >= n_rot) kd[i] = __float2half_rn(k[i]);  // not rotated: stored as it is
  }
}

__global__ void SwiGluKernel(const float* gate, const float* up, int64_t n, float* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float g = gate[i];
  out[i] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), up[i]);
}

__global__ void StoreKvKernel(const float* k, const float* v, int64_t n, __half* kd, __half* vd) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  kd[i] = __float2half_rn(k[i]);
  vd[i] = __float2half_rn(v[i]);
}

// Block (table group, vectors [V * y, V * y + V)): each vector's projections onto the k * T
// columns of T tables (T = kHashThreads / k), one column per thread (consecutive threads read
// consecutive columns of W's rows: coalesced; each W value loaded once for the block's V
// vectors), then one thread per (vector, table) packs its k signs. Each projection is summed by
// fmaf in index order whatever V is, so the bits do not depend on it.
constexpr int kHashThreads = 256;
constexpr int kHashVectorsMany = 8;  // vectors per block for many vectors (an offload's keys)

template <int V>
__global__ void SimHashCodesKernel(const float* x, const float* w, int64_t n, int64_t d, int k,
                                   int l, uint16_t* codes) {
  extern __shared__ float hash_shared[];  // V rows of x (d floats each), then V x T*k projections
  float* xs = hash_shared;
  float* proj = hash_shared + V * d;
  const int64_t v0 = static_cast<int64_t>(blockIdx.y) * V;
  const int nv = static_cast<int>(min(static_cast<int64_t>(V), n - v0));
  const int tables = kHashThreads / k;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * tables;
  const int64_t cols = static_cast<int64_t>(k) * l;
  for (int64_t i = threadIdx.x; i < V * d; i += blockDim.x)
    xs[i] = i < nv * d ? x[v0 * d + i] : 0.0f;
  __syncthreads();
  const int64_t c = t0 * k + threadIdx.x;
  if (threadIdx.x < tables * k && c < cols) {
    float s[V];
#pragma unroll
    for (int v = 0; v < V; ++v) s[v] = 0.0f;
    for (int64_t j = 0; j < d; ++j) {
      const float wj = w[j * cols + c];
#pragma unroll
      for (int v = 0; v < V; ++v) s[v] = fmaf(xs[v * d + j], wj, s[v]);
    }
#pragma unroll
    for (int v = 0; v < V; ++v) proj[v * kHashThreads + threadIdx.x] = s[v];
  }
  __syncthreads();
  for (int r = threadIdx.x; r < nv * tables; r += blockDim.x) {
    const int v = r / tables, tt = r % tables;
    const int64_t t = t0 + tt;
    if (t >= l) continue;
    const float* p = proj + v * kHashThreads + tt * k;
    unsigned code = 0;
    for (int b = 0; b < k; ++b) code |= (p[b] > 0.0f ? 1u : 0u) << b;  // strict: 0 gives bit 0
    codes[(v0 + v) * l + t] = static_cast<uint16_t>(code);
  }
}

// The cache row of position p in a view whose positions [gap_begin, gap_end) are not stored
// (KvLayerView::Row).
__device__ int64_t RowOf(int64_t p, int64_t gap_begin, int64_t gap_end) {
  return p >= gap_end ? p - (gap_end - gap_begin) : p;
}

// Thread (kv head g, dimension t): the mean over positions [begin, begin + n) of the keys'
// dimension t, summed in float64 in position order (as backend::CentredKeys on the host: the same
// additions, so the same bits). Rows map to positions through the view's gap.
__global__ void KeyCentreKernel(const __half* k, int64_t n_kv, int64_t hd, int64_t begin, int64_t n,
                                int64_t gap_begin, int64_t gap_end, float* centre) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n_kv * hd) return;
  // kAhead rows loaded before they are added (in order): a thread per dimension is all the
  // parallelism the fixed order allows, so each keeps several loads in flight.
  constexpr int kAhead = 16;
  double sum = 0.0;
  for (int64_t p0 = begin; p0 < begin + n; p0 += kAhead) {
    float x[kAhead];
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      const int64_t p = p0 + j;
      x[j] = p < begin + n ? __half2float(k[RowOf(p, gap_begin, gap_end) * n_kv * hd + i]) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      if (p0 + j < begin + n) sum += static_cast<double>(x[j]);
    }
  }
  centre[i] = static_cast<float>(sum / static_cast<double>(n));
}

// out[i][t] = key of kv head g at position begin + i, dimension t, minus centre[g][t] (float32).
__global__ void CentredKeysKernel(const __half* k, int64_t n_kv, int64_t hd, int64_t g,
                                  int64_t begin, int64_t n, int64_t gap_begin, int64_t gap_end,
                                  const float* centre, float* out) {
  const int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (e >= n * hd) return;
  const int64_t row = RowOf(begin + e / hd, gap_begin, gap_end), t = e % hd;
  // Rounded to bf16 as SimHash::KeyCodes rounds the host's centred keys (the same fp32 difference,
  // then round to nearest even).
  out[e] = __bfloat162float(__float2bfloat16_rn(
      __fsub_rn(__half2float(k[(row * n_kv + g) * hd + t]), centre[g * hd + t])));
}

constexpr int kAttentionThreads = 128;  // keys per tile: one per thread
constexpr int kMaxHeadDim = 256;

// Block (query t * n_head + head h, piece s). Online softmax over tiles of 128 keys: each thread
// scores one key of the tile, then the threads accumulate the value rows over head dimensions.
__global__ void AttentionPiecesKernel(AttentionPieces a) {
  __shared__ float q[kMaxHeadDim];
  __shared__ float p[kAttentionThreads];
  const int64_t t = blockIdx.x / a.n_head, h = blockIdx.x % a.n_head, s = blockIdx.y;
  const int64_t g = h / (a.n_head / a.n_head_kv);
  const int64_t hd = a.head_dim;
  int64_t begin, end;
  if (a.ranges == nullptr) {
    begin = s * a.piece_len;
    end = min(begin + a.piece_len, a.first_pos + t + 1);
  } else {
    begin = a.ranges[2 * s];
    end = a.ranges[2 * s + 1];
  }
  const int64_t row = (s * a.n_queries + t) * a.n_head + h;
  float* o = a.part_o + row * hd;
  if (begin >= end) {
    for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) o[d] = 0.0f;
    if (threadIdx.x == 0) a.part_lse[row] = -INFINITY;
    return;
  }
  const float* qt = a.q + (t * a.n_head + h) * hd;
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) q[d] = qt[d] * a.scale;
  __syncthreads();
  const int64_t stride = a.n_head_kv * hd;
  const __half* k = reinterpret_cast<const __half*>(a.k) + g * hd;
  const __half* v = reinterpret_cast<const __half*>(a.v) + g * hd;
  float m = -INFINITY, l = 0.0f;
  float acc[kMaxHeadDim / kAttentionThreads] = {};
  for (int64_t tile = begin; tile < end; tile += kAttentionThreads) {
    const int64_t j = tile + threadIdx.x;
    float score = -INFINITY;
    if (j < end) {
      const __half* kj = k + j * stride;
      float dot = 0.0f;
      for (int64_t d = 0; d < hd; ++d) dot += q[d] * __half2float(kj[d]);
      score = dot;
    }
    const float m_new = fmaxf(m, BlockMax(score));
    const float alpha = m == -INFINITY ? 0.0f : expf(m - m_new);
    const float pj = j < end ? expf(score - m_new) : 0.0f;
    p[threadIdx.x] = pj;
    l = l * alpha + BlockSum(pj);  // BlockSum's barrier also publishes p
    const int64_t n = min(static_cast<int64_t>(kAttentionThreads), end - tile);
#pragma unroll
    for (int r = 0; r < kMaxHeadDim / kAttentionThreads; ++r) {  // unrolled: acc stays in registers
      const int64_t d = r * kAttentionThreads + threadIdx.x;
      if (d >= hd) continue;
      float sum = 0.0f;
      for (int64_t jj = 0; jj < n; ++jj) sum += p[jj] * __half2float(v[(tile + jj) * stride + d]);
      acc[r] = acc[r] * alpha + sum;
    }
    m = m_new;
    __syncthreads();  // p is rewritten by the next tile
  }
#pragma unroll
  for (int r = 0; r < kMaxHeadDim / kAttentionThreads; ++r) {
    if (r * kAttentionThreads + threadIdx.x < hd)
      o[r * kAttentionThreads + threadIdx.x] = acc[r] / l;
  }
  if (threadIdx.x == 0) a.part_lse[row] = m + logf(l);
}

// Block (query tile, head block of a GQA group, piece s) of causal attention: its rows are (query
// t, head h) pairs, up to kCausalTileRows of them, that read the same kv head: a tile of
// CausalTileShape(...).queries queries times `heads` heads of one group. Each 32-key tile of K and
// V is staged in shared memory once for all of them (the split-K kernel above reads a key's row
// once per query and per head). Rows go round-robin to the 4 warps (so a decode step's few heads
// spread over them); for one row at a time, lane j scores key j of the tile and the lanes own the
// output's dimensions lane + 32 c: the softmax's max and sum are warp shuffles, and every
// shared-memory read is conflict-free (rows padded by 2 halves: 65 words apart).
constexpr int kTileKeys = 32;
constexpr int kTileWarps = 4;
constexpr int kRowsPerWarp = kCausalTileRows / kTileWarps;
constexpr int kTileDims = kCausalTileMaxHeadDim / 32;

__global__ void CausalTilesKernel(AttentionPieces a, CausalTileShape shape) {
  __shared__ float q_s[kCausalTileRows][kCausalTileMaxHeadDim];
  __shared__ __half k_s[kTileKeys][kCausalTileMaxHeadDim + 2];
  __shared__ __half v_s[kTileKeys][kCausalTileMaxHeadDim + 2];
  const int64_t hd = a.head_dim;
  const int64_t group = a.n_head / a.n_head_kv;
  const int64_t g = blockIdx.y / shape.head_blocks;
  const int64_t h0 = g * group + (blockIdx.y % shape.head_blocks) * shape.heads;
  const int64_t n_heads = min(static_cast<int64_t>(shape.heads), (g + 1) * group - h0);
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * shape.queries;
  const int64_t n_queries = min(static_cast<int64_t>(shape.queries), a.n_queries - t0);
  const int64_t n_rows =
      n_queries * n_heads;  // row r: query t0 + r / n_heads, head h0 + r % n_heads
  const int64_t s = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // The keys of piece s that some row sees (query t sees [0, first_pos + t]).
  const int64_t begin = s * a.piece_len;
  const int64_t end = min(begin + a.piece_len, a.first_pos + t0 + n_queries);
  for (int64_t i = threadIdx.x; i < n_rows * hd; i += blockDim.x) {
    const int64_t r = i / hd, d = i % hd;
    const int64_t t = t0 + r / n_heads, h = h0 + r % n_heads;
    q_s[r][d] = a.q[(t * a.n_head + h) * hd + d] * a.scale;
  }
  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kTileDims];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int c = 0; c < kTileDims; ++c) acc[i][c] = 0.0f;
  }
  const int64_t stride = a.n_head_kv * hd;
  const __half* k = reinterpret_cast<const __half*>(a.k) + g * hd;
  const __half* v = reinterpret_cast<const __half*>(a.v) + g * hd;
  for (int64_t tile = begin; tile < end; tile += kTileKeys) {
    __syncthreads();  // q_s written (first tile); the previous tile's reads done (the others)
    for (int64_t i = threadIdx.x; i < kTileKeys * hd; i += blockDim.x) {
      const int64_t j = i / hd, d = i % hd;
      const bool in = tile + j < end;
      k_s[j][d] = in ? k[(tile + j) * stride + d] : __float2half(0.0f);
      v_s[j][d] = in ? v[(tile + j) * stride + d] : __float2half(0.0f);
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int64_t r = static_cast<int64_t>(i) * kTileWarps + warp;  // uniform in the warp
      if (r >= n_rows) continue;
      const int64_t last = a.first_pos + t0 + r / n_heads;  // the row's last visible key
      const int64_t j = tile + lane;
      float score = -INFINITY;
      if (j < end && j <= last) {
        float dot = 0.0f;
        for (int64_t d = 0; d < hd; ++d) dot = fmaf(q_s[r][d], __half2float(k_s[lane][d]), dot);
        score = dot;
      }
      const float tile_max = WarpMax(score);
      if (tile_max == -INFINITY) continue;  // no key of this tile is visible to the row
      const float m_new = fmaxf(m[i], tile_max);
      const float alpha = m[i] == -INFINITY ? 0.0f : expf(m[i] - m_new);
      const float p = score == -INFINITY ? 0.0f : expf(score - m_new);
      l[i] = l[i] * alpha + WarpSum(p);
#pragma unroll
      for (int c = 0; c < kTileDims; ++c) acc[i][c] *= alpha;
      for (int jj = 0; jj < kTileKeys; ++jj) {
        const float pj = __shfl_sync(0xffffffffu, p, jj);
#pragma unroll
        for (int c = 0; c < kTileDims; ++c) {
          const int64_t d = lane + 32 * c;
          if (d < hd) acc[i][c] = fmaf(pj, __half2float(v_s[jj][d]), acc[i][c]);
        }
      }
      m[i] = m_new;
    }
  }
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int64_t r = static_cast<int64_t>(i) * kTileWarps + warp;
    if (r >= n_rows) continue;
    const int64_t t = t0 + r / n_heads, h = h0 + r % n_heads;
    const int64_t out_row = (s * a.n_queries + t) * a.n_head + h;
    float* o = a.part_o + out_row * hd;
    const bool empty = m[i] == -INFINITY;  // no key of the piece is visible to the row
#pragma unroll
    for (int c = 0; c < kTileDims; ++c) {
      const int64_t d = lane + 32 * c;
      if (d < hd) o[d] = empty ? 0.0f : acc[i][c] / l[i];
    }
    if (lane == 0) a.part_lse[out_row] = empty ? -INFINITY : m[i] + logf(l[i]);
  }
}

// One block per (query, head) row, one thread per head dimension.
__global__ void MergePartialsKernel(const float* part_o, const float* part_lse, int64_t n_pieces,
                                    int64_t n_rows, int64_t hd, float* out, float* lse) {
  const int64_t r = blockIdx.x;
  float max_lse = -INFINITY;
  for (int64_t s = 0; s < n_pieces; ++s) max_lse = fmaxf(max_lse, part_lse[s * n_rows + r]);
  float total = 0.0f;
  for (int64_t s = 0; s < n_pieces; ++s) {
    const float x = part_lse[s * n_rows + r];
    if (x != -INFINITY) total += expf(x - max_lse);
  }
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float sum = 0.0f;
    if (total > 0) {
      for (int64_t s = 0; s < n_pieces; ++s) {
        const float x = part_lse[s * n_rows + r];
        if (x != -INFINITY) sum += expf(x - max_lse) * part_o[(s * n_rows + r) * hd + d];
      }
      sum /= total;
    }
    out[r * hd + d] = sum;
  }
  if (lse != nullptr && threadIdx.x == 0) lse[r] = total > 0 ? max_lse + logf(total) : -INFINITY;
}

// The same merge for rows of many pieces (a decode step at 32K has hundreds): one block of
// kWideMergeWarps warps per (query, head) row. All threads reduce the pieces' lse (the max, then
// the sum of the weights); then warp w adds the pieces w, w + kWideMergeWarps, ... over the
// output's dimensions (lane + 32 c; each piece's row read coalesced) and the warps' sums meet in
// shared memory. MergePartialsKernel walks the pieces one after another in each thread, with a
// handful of blocks per layer in a decode step, so its time grows with the pieces.
constexpr int kWideMergeWarps = 16;
constexpr int kMergeDims = kMaxHeadDim / 32;

__global__ void MergePartialsWideKernel(const float* part_o, const float* part_lse,
                                        int64_t n_pieces, int64_t n_rows, int64_t hd, float* out,
                                        float* lse) {
  __shared__ float sums[kWideMergeWarps][kMaxHeadDim];
  const int64_t r = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float m = -INFINITY;
  for (int64_t s = threadIdx.x; s < n_pieces; s += blockDim.x) {
    m = fmaxf(m, part_lse[s * n_rows + r]);
  }
  const float max_lse = BlockMax(m);  // the same in every thread
  float t = 0.0f;
  if (max_lse != -INFINITY) {
    for (int64_t s = threadIdx.x; s < n_pieces; s += blockDim.x) {
      const float x = part_lse[s * n_rows + r];
      if (x != -INFINITY) t += expf(x - max_lse);
    }
  }
  const float total = BlockSum(t);
  float acc[kMergeDims] = {};
  if (total > 0.0f) {
    for (int64_t s = warp; s < n_pieces; s += kWideMergeWarps) {
      const float x = part_lse[s * n_rows + r];  // one piece per warp: the branch is uniform
      if (x == -INFINITY) continue;
      const float w = expf(x - max_lse);
      const float* o = part_o + (s * n_rows + r) * hd;
#pragma unroll
      for (int c = 0; c < kMergeDims; ++c) {
        const int64_t d = lane + 32 * c;
        if (d < hd) acc[c] = fmaf(w, o[d], acc[c]);
      }
    }
  }
#pragma unroll
  for (int c = 0; c < kMergeDims; ++c) {
    const int64_t d = lane + 32 * c;
    if (d < hd) sums[warp][d] = acc[c];
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < kWideMergeWarps; ++w) sum += sums[w][d];
    out[r * hd + d] = total > 0.0f ? sum / total : 0.0f;
  }
  if (lse != nullptr && threadIdx.x == 0) {
    lse[r] = total > 0.0f ? max_lse + logf(total) : -INFINITY;
  }
}

// Queries t0 .. t0 + chunk of q [t][n_head][hd] as fp16 [h][tt][hd]: a GQA group's heads are
// then one matrix of group * chunk rows for the batched products (TensorCausalAttention).
__global__ void PackQueriesKernel(const float* q, int64_t t0, int64_t chunk, int64_t n_head,
                                  int64_t hd, __half* q16) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n_head * chunk * hd) return;
  const int64_t d = i % hd, tt = (i / hd) % chunk, h = i / (hd * chunk);
  q16[i] = __float2half(q[((t0 + tt) * n_head + h) * hd + d]);
}

// One block per score row (head h = row / chunk, query t0 + row % chunk, which sees keys
// [0, first_visible + row % chunk)): p = softmax of the visible scores as fp16, 0 past them up
// to n_cols (the product with V reads n_cols columns).
__global__ void CausalSoftmaxKernel(const float* s, __half* p, int64_t ld, int64_t n_cols,
                                    int64_t chunk, int64_t first_visible) {
  const int64_t r = blockIdx.x;
  const int64_t n_vis = min(n_cols, first_visible + r % chunk);
  const float* row = s + r * ld;
  __half* out = p + r * ld;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < n_vis; j += blockDim.x) m = fmaxf(m, row[j]);
  m = BlockMax(m);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < n_vis; j += blockDim.x) sum += expf(row[j] - m);
  const float inv = 1.0f / BlockSum(sum);  // n_vis >= 1: the key at the query's own position
  for (int64_t j = threadIdx.x; j < n_cols; j += blockDim.x) {
    out[j] = __float2half(j < n_vis ? expf(row[j] - m) * inv : 0.0f);
  }
}

// o [h][tt][hd] (the batched product's layout) into out [t0 + tt][h][hd].
__global__ void UnpackOutputKernel(const float* o, int64_t t0, int64_t chunk, int64_t n_head,
                                   int64_t hd, float* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n_head * chunk * hd) return;
  const int64_t d = i % hd, tt = (i / hd) % chunk, h = i / (hd * chunk);
  out[((t0 + tt) * n_head + h) * hd + d] = o[i];
}

}  // namespace

cudaError_t LaunchDequantize(int type, const uint8_t* src, int64_t rows, int64_t cols,
                             int64_t row_bytes, void* dst, bool dst_fp32, cudaStream_t stream) {
  const int values = BlockValues(type);
  if (values == 0 || cols % values != 0) return cudaErrorInvalidValue;
  const int64_t blocks_per_row = cols / values;
  if (rows * blocks_per_row == 0) return cudaSuccess;
  DequantizeKernel<<<Blocks(rows * blocks_per_row), kThreads, 0, stream>>>(
      type, src, rows, blocks_per_row, row_bytes, cols, dst, dst_fp32);
  return cudaGetLastError();
}

cudaError_t LaunchEmbed(const void* table, bool table_fp32, int64_t cols, const int32_t* ids,
                        int64_t n, float* out, cudaStream_t stream) {
  if (n * cols == 0) return cudaSuccess;
  EmbedKernel<<<Blocks(n * cols), kThreads, 0, stream>>>(table, table_fp32, cols, ids, n, out);
  return cudaGetLastError();
}

cudaError_t LaunchFloatToHalf(const float* x, uint16_t* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  FloatToHalfKernel<<<Blocks(n), kThreads, 0, stream>>>(x, reinterpret_cast<__half*>(y), n);
  return cudaGetLastError();
}

bool HalfMatVecFits(int64_t n_tokens, int64_t cols, const void* w, const float* x) {
  return n_tokens >= 1 && n_tokens <= kMaxMatVecTokens && cols % 8 == 0 &&
         reinterpret_cast<uintptr_t>(w) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
}

// KERNEL<1> ... KERNEL<kMaxMatVecTokens>, indexed by n_tokens - 1.
template <int... I>
constexpr std::array<void (*)(MatVecProducts, const float*), sizeof...(I)> MatVecKernels(
    std::integer_sequence<int, I...>) {
  return {&HalfMatVecKernel<I + 1>...};
}
template <int... I>
constexpr std::array<void (*)(const __half*, const __half*, const float*, int64_t, int64_t,
                              const float*, float, float*),
                     sizeof...(I)>
GateUpKernels(std::integer_sequence<int, I...>) {
  return {&HalfGateUpKernel<I + 1>...};
}
using TokenCounts = std::make_integer_sequence<int, kMaxMatVecTokens>;

cudaError_t LaunchHalfMatVec(const MatVecProducts& p, const float* x, int64_t n_tokens,
                             cudaStream_t stream) {
  if (p.count < 1 || p.count > kMaxMatVecProducts ||
      reinterpret_cast<uintptr_t>(p.norm_weight) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  int64_t rows = 0;
  for (int s = 0; s < p.count; ++s) {
    if (!HalfMatVecFits(n_tokens, p.cols, p.w[s], x)) return cudaErrorInvalidValue;
    rows += p.rows[s];
  }
  if (rows == 0) return cudaSuccess;
  const unsigned blocks = Blocks(rows, kThreads / 32);
  MatVecKernels(TokenCounts())[n_tokens - 1]<<<blocks, kThreads, 0, stream>>>(p, x);
  return cudaGetLastError();
}

cudaError_t LaunchHalfGateUp(const uint16_t* gate, const uint16_t* up, const float* x,
                             int64_t n_tokens, int64_t rows, int64_t cols, const float* norm_weight,
                             float norm_eps, float* out, cudaStream_t stream) {
  if (!HalfMatVecFits(n_tokens, cols, gate, x) || !HalfMatVecFits(n_tokens, cols, up, x) ||
      reinterpret_cast<uintptr_t>(norm_weight) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  const unsigned blocks = Blocks(rows, kThreads / 32);
  const __half* g = reinterpret_cast<const __half*>(gate);
  const __half* u = reinterpret_cast<const __half*>(up);
  GateUpKernels(TokenCounts())[n_tokens - 1]<<<blocks, kThreads, 0, stream>>>(
      g, u, x, rows, cols, norm_weight, norm_eps, out);
  return cudaGetLastError();
}

cudaError_t LaunchRmsNorm(const float* x, const float* weight, int64_t n_tokens, int64_t dim,
                          float eps, float* out, cudaStream_t stream) {
  if (n_tokens == 0) return cudaSuccess;
  RmsNormKernel<<<static_cast<unsigned>(n_tokens), kThreads, 0, stream>>>(x, weight, dim, eps, out);
  return cudaGetLastError();
}

cudaError_t LaunchAddBias(float* x, const float* bias, int64_t n_tokens, int64_t dim,
                          cudaStream_t stream) {
  if (n_tokens * dim == 0) return cudaSuccess;
  AddBiasKernel<<<Blocks(n_tokens * dim), kThreads, 0, stream>>>(x, bias, n_tokens, dim);
  return cudaGetLastError();
}

cudaError_t LaunchAdd(const float* x, float* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  AddKernel<<<Blocks(n), kThreads, 0, stream>>>(x, y, n);
  return cudaGetLastError();
}

cudaError_t LaunchRope(float* x, int64_t n_heads_x, float* y, int64_t n_heads_y, int64_t n_tokens,
                       int64_t head_dim, const int32_t* positions, bool adjacent_pairs,
                       int64_t n_rot, double freq_base, cudaStream_t stream) {
  const int64_t n = n_tokens * (n_heads_x + n_heads_y) * (n_rot / 2);
  if (n == 0) return cudaSuccess;
  RopeKernel<<<Blocks(n), kThreads, 0, stream>>>(x, n_heads_x, y, n_heads_y, n_tokens, head_dim,
                                                 positions, adjacent_pairs, n_rot, freq_base);
  return cudaGetLastError();
}

cudaError_t LaunchRopeStoreKv(float* q, int64_t n_head, float* k, const float* v, int64_t n_head_kv,
                              int64_t n_tokens, int64_t head_dim, const int32_t* positions,
                              bool adjacent_pairs, int64_t n_rot, double freq_base, uint16_t* k_dst,
                              uint16_t* v_dst, cudaStream_t stream) {
  const int64_t n =
      max(n_tokens * (n_head + n_head_kv) * (n_rot / 2), n_tokens * n_head_kv * head_dim);
  if (n == 0) return cudaSuccess;
  RopeStoreKvKernel<<<Blocks(n), kThreads, 0, stream>>>(
      q, n_head, k, v, n_head_kv, n_tokens, head_dim, positions, adjacent_pairs, n_rot, freq_base,
      reinterpret_cast<__half*>(k_dst), reinterpret_cast<__half*>(v_dst));
  return cudaGetLastError();
}

cudaError_t LaunchSwiGlu(const float* gate, const float* up, int64_t n, float* out,
                         cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  SwiGluKernel<<<Blocks(n), kThreads, 0, stream>>>(gate, up, n, out);
  return cudaGetLastError();
}

cudaError_t LaunchStoreKv(const float* k, const float* v, int64_t n, uint16_t* k_dst,
                          uint16_t* v_dst, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  StoreKvKernel<<<Blocks(n), kThreads, 0, stream>>>(k, v, n, reinterpret_cast<__half*>(k_dst),
                                                    reinterpret_cast<__half*>(v_dst));
  return cudaGetLastError();
}

cudaError_t LaunchSimHashCodes(const float* x, const float* w, int64_t n, int64_t d, int k, int l,
                               uint16_t* codes, cudaStream_t stream) {
  if (k < 1 || k > 16 || d < 1 || l < 1) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const int tables = kHashThreads / k;
  const unsigned table_blocks = static_cast<unsigned>((l + tables - 1) / tables);
  // Few vectors (a decode step's query heads): a block per vector, for as many blocks as there
  // are; many (an offload's keys): kHashVectorsMany per block, each W value read once for them.
  const bool many = n > 64;
  const int v = many ? kHashVectorsMany : 1;
  const int64_t groups = (n + v - 1) / v;
  if (groups > 65535) return cudaErrorInvalidValue;
  const size_t shared = static_cast<size_t>(v * d + v * kHashThreads) * sizeof(float);
  if (shared > 48 * 1024) return cudaErrorInvalidValue;  // the default dynamic shared memory
  const dim3 grid(table_blocks, static_cast<unsigned>(groups));
  if (many) {
    SimHashCodesKernel<kHashVectorsMany>
        <<<grid, kHashThreads, shared, stream>>>(x, w, n, d, k, l, codes);
  } else {
    SimHashCodesKernel<1><<<grid, kHashThreads, shared, stream>>>(x, w, n, d, k, l, codes);
  }
  return cudaGetLastError();
}

int64_t SimHashMaxVectorsPerLaunch() { return int64_t{65535} * kHashVectorsMany; }

cudaError_t LaunchKeyCentre(const uint16_t* k, int64_t n_kv, int64_t hd, int64_t begin, int64_t n,
                            int64_t gap_begin, int64_t gap_end, float* centre,
                            cudaStream_t stream) {
  if (n <= 0 || n_kv * hd == 0) return cudaSuccess;
  const int threads = 128;
  const int64_t blocks = (n_kv * hd + threads - 1) / threads;
  KeyCentreKernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
      reinterpret_cast<const __half*>(k), n_kv, hd, begin, n, gap_begin, gap_end, centre);
  return cudaGetLastError();
}

cudaError_t LaunchCentredKeys(const uint16_t* k, int64_t n_kv, int64_t hd, int64_t g, int64_t begin,
                              int64_t n, int64_t gap_begin, int64_t gap_end, const float* centre,
                              float* out, cudaStream_t stream) {
  if (n <= 0 || hd == 0) return cudaSuccess;
  const int threads = 256;
  const int64_t blocks = (n * hd + threads - 1) / threads;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  CentredKeysKernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
      reinterpret_cast<const __half*>(k), n_kv, hd, g, begin, n, gap_begin, gap_end, centre, out);
  return cudaGetLastError();
}

cudaError_t LaunchAttentionPieces(const AttentionPieces& a, cudaStream_t stream) {
  if (a.head_dim > kMaxHeadDim || a.n_head_kv == 0 || a.n_head % a.n_head_kv != 0) {
    return cudaErrorInvalidValue;
  }
  if (a.n_queries * a.n_head * a.n_pieces == 0) return cudaSuccess;
  if (a.n_pieces > 65535) return cudaErrorInvalidValue;  // the grid's second dimension
  const dim3 grid(static_cast<unsigned>(a.n_queries * a.n_head), static_cast<unsigned>(a.n_pieces));
  AttentionPiecesKernel<<<grid, kAttentionThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

CausalTileShape CausalTilesFor(int64_t n_head, int64_t n_head_kv) {
  CausalTileShape shape;
  const int64_t group = n_head_kv > 0 ? n_head / n_head_kv : 1;
  shape.heads = static_cast<int>(min(group, static_cast<int64_t>(kCausalTileRows)));
  shape.head_blocks = static_cast<int>((group + shape.heads - 1) / shape.heads);
  shape.queries = kCausalTileRows / shape.heads;
  return shape;
}

int64_t CausalTileBlocks(const CausalTileShape& shape, int64_t n_queries, int64_t n_head_kv) {
  return (n_queries + shape.queries - 1) / shape.queries * n_head_kv * shape.head_blocks;
}

cudaError_t LaunchCausalTiles(const AttentionPieces& a, cudaStream_t stream) {
  if (a.ranges != nullptr || a.head_dim > kCausalTileMaxHeadDim || a.head_dim < 1 ||
      a.n_head_kv == 0 || a.n_head % a.n_head_kv != 0 || a.piece_len < 1 || a.n_pieces > 65535) {
    return cudaErrorInvalidValue;
  }
  if (a.n_queries * a.n_head * a.n_pieces == 0) return cudaSuccess;
  const CausalTileShape shape = CausalTilesFor(a.n_head, a.n_head_kv);
  const int64_t y = a.n_head_kv * shape.head_blocks;
  if (y > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((a.n_queries + shape.queries - 1) / shape.queries),
                  static_cast<unsigned>(y), static_cast<unsigned>(a.n_pieces));
  CausalTilesKernel<<<grid, 32 * kTileWarps, 0, stream>>>(a, shape);
  return cudaGetLastError();
}

cudaError_t LaunchMergePartials(const float* part_o, const float* part_lse, int64_t n_pieces,
                                int64_t n_rows, int64_t head_dim, float* out, float* lse,
                                cudaStream_t stream, bool wide) {
  if (n_rows == 0) return cudaSuccess;
  if (wide) {
    if (head_dim > kMaxHeadDim) return cudaErrorInvalidValue;
    MergePartialsWideKernel<<<static_cast<unsigned>(n_rows), kWideMergeWarps * 32, 0, stream>>>(
        part_o, part_lse, n_pieces, n_rows, head_dim, out, lse);
    return cudaGetLastError();
  }
  const int threads = head_dim >= 128 ? 128 : 64;
  MergePartialsKernel<<<static_cast<unsigned>(n_rows), threads, 0, stream>>>(
      part_o, part_lse, n_pieces, n_rows, head_dim, out, lse);
  return cudaGetLastError();
}

cudaError_t LaunchPackQueries(const float* q, int64_t t0, int64_t chunk, int64_t n_head,
                              int64_t head_dim, uint16_t* q16, cudaStream_t stream) {
  const int64_t n = n_head * chunk * head_dim;
  if (n == 0) return cudaSuccess;
  PackQueriesKernel<<<Blocks(n), kThreads, 0, stream>>>(q, t0, chunk, n_head, head_dim,
                                                        reinterpret_cast<__half*>(q16));
  return cudaGetLastError();
}

cudaError_t LaunchCausalSoftmax(const float* scores, uint16_t* p, int64_t ld, int64_t n_cols,
                                int64_t n_rows, int64_t chunk, int64_t first_visible,
                                cudaStream_t stream) {
  if (n_rows == 0) return cudaSuccess;
  if (chunk < 1 || first_visible < 1 || n_cols > ld) return cudaErrorInvalidValue;
  CausalSoftmaxKernel<<<static_cast<unsigned>(n_rows), 256, 0, stream>>>(
      scores, reinterpret_cast<__half*>(p), ld, n_cols, chunk, first_visible);
  return cudaGetLastError();
}

cudaError_t LaunchUnpackOutput(const float* o, int64_t t0, int64_t chunk, int64_t n_head,
                               int64_t head_dim, float* out, cudaStream_t stream) {
  const int64_t n = n_head * chunk * head_dim;
  if (n == 0) return cudaSuccess;
  UnpackOutputKernel<<<Blocks(n), kThreads, 0, stream>>>(o, t0, chunk, n_head, head_dim, out);
  return cudaGetLastError();
}

}  // namespace magicpig::backend::cuda_internal
