// Template body of the attention tile kernel; included once per ISA translation unit, after that
// unit brings one of common/simd/vec16_<isa>-inl.h's vector namespaces into
// magicpig::backend::cpu_internal::MAGICPIG_ATTN_NS (V, kLanes == 16, loads, Fma, ExpV,
// FastExp...).
//
// Online softmax (flash-attention style) over key tiles of kKeyTile rows: no n² buffer. Each key
// and value row is converted from fp16 once per tile and used by every query row of the item (all
// heads of the GQA group x all tokens of the query tile). head_dim must be a multiple of 16 and <=
// 256.
//
// Two layouts of the query rows (RunTile picks by row count):
// - narrow (decode: one token's GQA group, a few rows): rows stay [row][d]; each score is a dot
//   product of a query row with a converted key row, reduced across lanes; the value pass keeps
//   blocks of up to 4 rows x 4 vectors of accumulators in registers over a key tile;
// - wide (prefill: 16 or more rows): rows are transposed to [d][row], so a score block is
//   broadcast(key element) x 16 rows per FMA with no reduction across lanes, the online softmax
//   works on 16 rows per vector, and the value pass keeps [d][row] accumulators in registers.
#include <cstdint>
#include <cstring>

#include "gpu_node/backend/cpu/attention_kernel.h"

namespace magicpig::backend::cpu_internal {
namespace MAGICPIG_ATTN_NS {

constexpr int64_t kKeyTile = 32;
constexpr int64_t kMaxChunks = 16;  // head_dim <= 256

inline int64_t Min(int64_t a, int64_t b) { return a < b ? a : b; }

// The narrow kernel's value pass for kRows rows x kChunks vectors of their accumulators (acc: row
// stride hd): acc[r] += p[r][j] * v_j over the nk keys of a tile, in key order, with the
// accumulators in registers. A zero probability (a key hidden from that row) is skipped, as a
// value row need not be finite for keys a row does not see.
template <int kRows, int kChunks>
void NarrowValueBlockImpl(float* acc, int64_t hd, const float* p, const uint16_t* v,
                          int64_t kv_stride, int64_t nk) {
  V a[kRows][kChunks];
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kChunks; ++c) a[r][c] = LoadF32(acc + r * hd + c * kLanes);
  }
  V row[kChunks];
  for (int64_t j = 0; j < nk; ++j) {
    for (int c = 0; c < kChunks; ++c) row[c] = LoadF16(v + j * kv_stride + c * kLanes);
    for (int r = 0; r < kRows; ++r) {
      const float pj = p[r * kKeyTile + j];
      if (pj == 0.0f) continue;
      const V pv = Set1(pj);
      for (int c = 0; c < kChunks; ++c) a[r][c] = Fma(pv, row[c], a[r][c]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kChunks; ++c) Store(acc + r * hd + c * kLanes, a[r][c]);
  }
}

// A decode step reads one kv head's fp16 rows out of [pos][kv head][d]: a short row every
// n_head_kv * d elements, which the hardware prefetchers did not run far enough ahead of (the
// loads' misses were most of the kernel's time). The key and value rows kPrefetchBytes ahead (of
// both) are prefetched into L2 (the L1 tracks too few misses for this distance): SmolLM2 at 8K,
// exact decode attention 12.9-16.3 -> 7.1-8.4 ms per step on 2 threads (AVX-512; 16 to 32 KB
// ahead measured the same within the VM's noise, 4 and 8 KB were slower).
constexpr int64_t kPrefetchBytes = 16 * 1024;

inline int64_t PrefetchKeysAhead(int64_t hd) {
  const int64_t keys = kPrefetchBytes / (2 * hd * static_cast<int64_t>(sizeof(uint16_t)));
  return keys > 8 ? keys : 8;
}

// Both cache lines' worth of one key row and one value row (hd fp16 each) into L2.
inline void PrefetchRowsL2(const uint16_t* k, const uint16_t* v, int64_t hd) {
  const char* kb = reinterpret_cast<const char*>(k);
  const char* vb = reinterpret_cast<const char*>(v);
  for (int64_t b = 0; b < hd * static_cast<int64_t>(sizeof(uint16_t)); b += 64) {
    PrefetchL2(kb + b);
    PrefetchL2(vb + b);
  }
}

constexpr int64_t kValueRows = 4;
constexpr int64_t kValueChunks = 4;

template <int kRows>
void NarrowValueBlockRows(int cols, float* acc, int64_t hd, const float* p, const uint16_t* v,
                          int64_t kv_stride, int64_t nk) {
  switch (cols) {
    case 1:
      return NarrowValueBlockImpl<kRows, 1>(acc, hd, p, v, kv_stride, nk);
    case 2:
      return NarrowValueBlockImpl<kRows, 2>(acc, hd, p, v, kv_stride, nk);
    case 3:
      return NarrowValueBlockImpl<kRows, 3>(acc, hd, p, v, kv_stride, nk);
    default:
      return NarrowValueBlockImpl<kRows, 4>(acc, hd, p, v, kv_stride, nk);
  }
}

// rows in [1, kValueRows], cols in [1, kValueChunks].
inline void NarrowValueBlock(int rows, int cols, float* acc, int64_t hd, const float* p,
                             const uint16_t* v, int64_t kv_stride, int64_t nk) {
  switch (rows) {
    case 1:
      return NarrowValueBlockRows<1>(cols, acc, hd, p, v, kv_stride, nk);
    case 2:
      return NarrowValueBlockRows<2>(cols, acc, hd, p, v, kv_stride, nk);
    case 3:
      return NarrowValueBlockRows<3>(cols, acc, hd, p, v, kv_stride, nk);
    default:
      return NarrowValueBlockRows<4>(cols, acc, hd, p, v, kv_stride, nk);
  }
}

// kChunks = head_dim / 16 when known at compile time (the loops over a row then unroll and the
// converted key/value row stays in registers), or 0 for any multiple of 16 read at run time.
template <int kChunks>
void RunNarrowTileImpl(const AttentionTile& a) {
  const int64_t hd = a.head_dim;
  const int64_t chunks = kChunks > 0 ? kChunks : hd / kLanes;
  const int64_t group = a.n_head / a.n_head_kv;
  const int64_t n_rows = (a.t1 - a.t0) * group;
  const int64_t q_stride = a.n_head * hd;
  const int64_t kv_stride = a.n_head_kv * hd;
  const float neg_inf = -__builtin_inff();

  // Carve the caller's scratch (see AttentionScratchFloats): q, acc, m, l, scores [rows][tile].
  float* q = a.scratch;
  float* acc = q + n_rows * hd;
  float* m = acc + n_rows * hd;
  float* l = m + n_rows;
  float* s = l + n_rows;
  for (int64_t i = 0; i < n_rows * hd; ++i) acc[i] = 0.0f;
  for (int64_t r = 0; r < n_rows; ++r) {
    m[r] = neg_inf;
    l[r] = 0.0f;
  }
  for (int64_t t = a.t0; t < a.t1; ++t) {
    for (int64_t gi = 0; gi < group; ++gi) {
      const int64_t h = a.kv_head * group + gi;
      const float* src = a.q + t * q_stride + h * hd;
      float* dst = q + ((t - a.t0) * group + gi) * hd;
      for (int64_t d = 0; d < hd; ++d) dst[d] = src[d] * a.scale;
    }
  }
  const int64_t first_row_pos = a.first_pos + a.t0;
  const int64_t last_pos = a.first_pos + a.t1 - 1;
  const int64_t ahead = PrefetchKeysAhead(hd);
  // Keys [key_begin, key_end) of the sequence; key_end <= 0 means "through last_pos".
  const int64_t key_end = a.key_end > 0 ? Min(a.key_end, last_pos + 1) : last_pos + 1;
  V row[kMaxChunks];
  for (int64_t k0 = a.key_begin; k0 < key_end; k0 += kKeyTile) {
    const int64_t nk = Min(kKeyTile, key_end - k0);
    // Rows whose position is < k0 see nothing of this tile; rows are ordered by position.
    const int64_t first_row = k0 > first_row_pos ? (k0 - first_row_pos) * group : 0;
    // Scores: one converted key row against every query row. The key and value rows `ahead`
    // keys on are prefetched into L2 meanwhile (PrefetchRowsL2).
    const int64_t prefetch_end = Min(key_end - k0 - ahead, nk);
    for (int64_t j = 0; j < nk; ++j) {
      const uint16_t* kj = a.k + (k0 + j) * kv_stride + a.kv_head * hd;
      if (j < prefetch_end) {
        PrefetchRowsL2(kj + ahead * kv_stride, a.v + (k0 + j + ahead) * kv_stride + a.kv_head * hd,
                       hd);
      }
      for (int64_t c = 0; c < chunks; ++c) row[c] = LoadF16(kj + c * kLanes);
      for (int64_t r = first_row; r < n_rows; ++r) {
        const float* qr = q + r * hd;
        V sum = Zero();
        for (int64_t c = 0; c < chunks; ++c) sum = Fma(LoadF32(qr + c * kLanes), row[c], sum);
        s[r * kKeyTile + j] = ReduceAdd(sum);
      }
    }
    // Online softmax update per row; p overwrites the scores.
    for (int64_t r = first_row; r < n_rows; ++r) {
      const int64_t pos = first_row_pos + r / group;
      const int64_t visible = Min(nk, pos - k0 + 1);
      float* sr = s + r * kKeyTile;
      float new_m, correction, sum = 0.0f;
      if (visible == kKeyTile) {
        // Full tile: two 16-lane vectors.
        const V s0 = LoadF32(sr), s1 = LoadF32(sr + kLanes);
        new_m = MaxF(m[r], ReduceMax(Max(s0, s1)));
        correction = FastExp(m[r] - new_m);
        const V mv = Set1(new_m);
        const V p0 = ExpV(Sub(s0, mv)), p1 = ExpV(Sub(s1, mv));
        Store(sr, p0);
        Store(sr + kLanes, p1);
        sum = ReduceAdd(Fma(p0, Set1(1.0f), p1));
      } else {
        float tile_max = neg_inf;
        for (int64_t j = 0; j < visible; ++j) tile_max = MaxF(tile_max, sr[j]);
        new_m = MaxF(m[r], tile_max);
        correction = FastExp(m[r] - new_m);
        for (int64_t j = 0; j < visible; ++j) {
          sr[j] = FastExp(sr[j] - new_m);
          sum += sr[j];
        }
        for (int64_t j = visible; j < nk; ++j) sr[j] = 0.0f;
      }
      l[r] = l[r] * correction + sum;
      m[r] = new_m;
      if (correction != 1.0f) {
        float* ar = acc + r * hd;
        const V cv = Set1(correction);
        for (int64_t c = 0; c < chunks; ++c) {
          Store(ar + c * kLanes, Fma(LoadF32(ar + c * kLanes), cv, Zero()));
        }
      }
    }
    // Values: blocks of up to 4 rows x 4 vectors of accumulators, held in registers over the
    // tile's keys (loaded and stored once per tile, not once per (row, key)).
    const uint16_t* v0 = a.v + k0 * kv_stride + a.kv_head * hd;
    for (int64_t r0 = first_row; r0 < n_rows; r0 += kValueRows) {
      const int rows = static_cast<int>(Min(kValueRows, n_rows - r0));
      for (int64_t c0 = 0; c0 < chunks; c0 += kValueChunks) {
        const int cols = static_cast<int>(Min(kValueChunks, chunks - c0));
        NarrowValueBlock(rows, cols, acc + r0 * hd + c0 * kLanes, hd, s + r0 * kKeyTile,
                         v0 + c0 * kLanes, kv_stride, nk);
      }
    }
  }
  for (int64_t t = a.t0; t < a.t1; ++t) {
    for (int64_t gi = 0; gi < group; ++gi) {
      const int64_t r = (t - a.t0) * group + gi;
      const int64_t h = a.kv_head * group + gi;
      // A row that saw no key of its range (possible only for a key segment) has l = 0:
      // its partial is o = 0 with lse = -inf, which the merge weighs by 0.
      const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
      const float* ar = acc + r * hd;
      float* dst = a.out + t * q_stride + h * hd;
      for (int64_t d = 0; d < hd; ++d) dst[d] = ar[d] * inv;
      if (a.lse != nullptr) {
        a.lse[t * a.n_head + h] = l[r] > 0.0f ? m[r] + __builtin_logf(l[r]) : neg_inf;
      }
    }
  }
}

// ---- Wide tiles ----------------------------------------------------------------------------

// Register blocks: one row vector (16 rows) against 4 keys (scores) or 4 value dimensions
// (values): 4 accumulators (8 ymm on AVX2), and each loaded row vector feeds 4 FMAs, so the
// loops are bound by FMAs rather than by loads.
constexpr int64_t kBlock = 4;
// Initial running max: finite, so a row that has seen no key yet never computes inf - inf.
constexpr float kNoMax = -3.0e38f;

// Scores of one row vector (16 rows, [d][row] at qt with row stride nr) against keys j..j+3 of
// the converted tile kt ([key][d]), written to s[j + i][row].
inline void ScoreBlock(const float* qt, int64_t nr, const float* kt, int64_t hd, int64_t j,
                       float* s) {
  V acc[kBlock];
  for (int b = 0; b < kBlock; ++b) acc[b] = Zero();
  const float* k = kt + j * hd;
  for (int64_t d = 0; d < hd; ++d) {
    const V qv = LoadF32(qt + d * nr);
    for (int b = 0; b < kBlock; ++b) acc[b] = Fma(qv, Set1(k[b * hd + d]), acc[b]);
  }
  for (int b = 0; b < kBlock; ++b) Store(s + (j + b) * nr, acc[b]);
}

// acc[d + i][row] = acc[d + i][row] * corr[row] + sum_j p[j][row] * vt[j][d + i] for one row
// vector and 4 dimensions (p is the score buffer after the softmax; keys j >= nk have p = 0 and
// are skipped).
inline void ValueBlock(float* acc, int64_t nr, V corr, const float* p, const float* vt, int64_t hd,
                       int64_t nk, int64_t d) {
  V a[kBlock];
  for (int b = 0; b < kBlock; ++b) a[b] = Mul(LoadF32(acc + (d + b) * nr), corr);
  for (int64_t j = 0; j < nk; ++j) {
    const V pv = LoadF32(p + j * nr);
    const float* vj = vt + j * hd + d;
    for (int b = 0; b < kBlock; ++b) a[b] = Fma(pv, Set1(vj[b]), a[b]);
  }
  for (int b = 0; b < kBlock; ++b) Store(acc + (d + b) * nr, a[b]);
}

void RunWideTile(const AttentionTile& a) {
  const int64_t hd = a.head_dim;
  const int64_t group = a.n_head / a.n_head_kv;
  const int64_t n_rows = (a.t1 - a.t0) * group;
  const int64_t n_vecs = (n_rows + kLanes - 1) / kLanes;
  const int64_t nr = n_vecs * kLanes;  // rows padded to whole vectors (padding rows: q = 0)
  const int64_t q_stride = a.n_head * hd;
  const int64_t kv_stride = a.n_head_kv * hd;
  const float neg_inf = -__builtin_inff();

  // Carve the caller's scratch (see AttentionScratchFloats): qt and acc [d][row], m, l, corr
  // [row], scores/probabilities [key][row], the converted key and value tiles [key][d].
  float* qt = a.scratch;
  float* acc = qt + hd * nr;
  float* m = acc + hd * nr;
  float* l = m + nr;
  float* corr = l + nr;
  float* s = corr + nr;
  float* kt = s + kKeyTile * nr;
  float* vt = kt + kKeyTile * hd;
  for (int64_t i = 0; i < hd * nr; ++i) qt[i] = acc[i] = 0.0f;
  for (int64_t r = 0; r < nr; ++r) {
    m[r] = kNoMax;
    l[r] = 0.0f;
  }
  for (int64_t r = 0; r < n_rows; ++r) {
    const int64_t t = a.t0 + r / group;
    const int64_t h = a.kv_head * group + r % group;
    const float* src = a.q + t * q_stride + h * hd;
    for (int64_t d = 0; d < hd; ++d) qt[d * nr + r] = src[d] * a.scale;
  }
  const int64_t first_row_pos = a.first_pos + a.t0;
  const int64_t last_pos = a.first_pos + a.t1 - 1;
  const int64_t key_end = a.key_end > 0 ? Min(a.key_end, last_pos + 1) : last_pos + 1;
  // Position of row r (padding rows see every key; their results are dropped).
  auto row_pos = [&](int64_t r) { return r < n_rows ? first_row_pos + r / group : last_pos; };
  // Is key k0 + j hidden from row r in a tile of nk keys?
  auto masked = [&](int64_t k0, int64_t nk, int64_t j, int64_t r) {
    return j >= nk || k0 + j > row_pos(r);
  };
  for (int64_t k0 = a.key_begin; k0 < key_end; k0 += kKeyTile) {
    const int64_t nk = Min(kKeyTile, key_end - k0);
    // Rows whose position is < k0 see nothing of this tile; rows are ordered by position, so
    // whole vectors before the first row that sees a key are skipped.
    const int64_t first_row = k0 > first_row_pos ? (k0 - first_row_pos) * group : 0;
    const int64_t v0 = first_row / kLanes;
    const int64_t r0 = v0 * kLanes;
    for (int64_t j = 0; j < kKeyTile; ++j) {
      float* kj = kt + j * hd;
      float* vj = vt + j * hd;
      if (j < nk) {
        const uint16_t* ksrc = a.k + (k0 + j) * kv_stride + a.kv_head * hd;
        const uint16_t* vsrc = a.v + (k0 + j) * kv_stride + a.kv_head * hd;
        for (int64_t d = 0; d < hd; d += kLanes) {
          Store(kj + d, LoadF16(ksrc + d));
          Store(vj + d, LoadF16(vsrc + d));
        }
      } else {
        for (int64_t d = 0; d < hd; ++d) kj[d] = vj[d] = 0.0f;
      }
    }
    for (int64_t v = v0; v < n_vecs; ++v) {
      for (int64_t j = 0; j < kKeyTile; j += kBlock) {
        ScoreBlock(qt + v * kLanes, nr, kt, hd, j, s + v * kLanes);
      }
    }
    // A tile some row does not fully see (the causal diagonal, a short last tile): hidden scores
    // become -inf before the max, and their probabilities exactly 0 after the exponential.
    const bool partial = nk < kKeyTile || k0 + kKeyTile - 1 > row_pos(r0);
    if (partial) {
      for (int64_t j = 0; j < kKeyTile; ++j) {
        for (int64_t r = r0; r < nr; ++r) {
          if (masked(k0, nk, j, r)) s[j * nr + r] = neg_inf;
        }
      }
    }
    for (int64_t v = v0; v < n_vecs; ++v) {
      const int64_t off = v * kLanes;
      V tile_max = LoadF32(s + off);
      for (int64_t j = 1; j < kKeyTile; ++j) tile_max = Max(tile_max, LoadF32(s + j * nr + off));
      const V old_m = LoadF32(m + off);
      const V new_m = Max(old_m, tile_max);
      Store(corr + off, ExpV(Sub(old_m, new_m)));
      Store(m + off, new_m);
      for (int64_t j = 0; j < kKeyTile; ++j) {
        Store(s + j * nr + off, ExpV(Sub(LoadF32(s + j * nr + off), new_m)));
      }
    }
    if (partial) {
      for (int64_t j = 0; j < kKeyTile; ++j) {
        for (int64_t r = r0; r < nr; ++r) {
          if (masked(k0, nk, j, r)) s[j * nr + r] = 0.0f;
        }
      }
    }
    for (int64_t v = v0; v < n_vecs; ++v) {
      const int64_t off = v * kLanes;
      V sum = Zero();
      for (int64_t j = 0; j < nk; ++j) sum = Add(sum, LoadF32(s + j * nr + off));
      Store(l + off, Fma(LoadF32(l + off), LoadF32(corr + off), sum));
    }
    for (int64_t v = v0; v < n_vecs; ++v) {
      const int64_t off = v * kLanes;
      const V c = LoadF32(corr + off);
      for (int64_t d = 0; d < hd; d += kBlock) {
        ValueBlock(acc + off, nr, c, s + off, vt, hd, nk, d);
      }
    }
  }
  for (int64_t r = 0; r < n_rows; ++r) {
    const int64_t t = a.t0 + r / group;
    const int64_t h = a.kv_head * group + r % group;
    // A row that saw no key of its range (possible only for a key segment) has l = 0: its
    // partial is o = 0 with lse = -inf, which the merge weighs by 0.
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    float* dst = a.out + t * q_stride + h * hd;
    for (int64_t d = 0; d < hd; ++d) dst[d] = acc[d * nr + r] * inv;
    if (a.lse != nullptr) {
      a.lse[t * a.n_head + h] = l[r] > 0.0f ? m[r] + __builtin_logf(l[r]) : neg_inf;
    }
  }
}

void RunTile(const AttentionTile& a) {
  if ((a.t1 - a.t0) * (a.n_head / a.n_head_kv) >= kLanes) return RunWideTile(a);
  switch (a.head_dim / kLanes) {
    case 2:
      return RunNarrowTileImpl<2>(a);
    case 4:
      return RunNarrowTileImpl<4>(a);
    case 8:
      return RunNarrowTileImpl<8>(a);
    default:
      return RunNarrowTileImpl<0>(a);
  }
}

}  // namespace MAGICPIG_ATTN_NS
}  // namespace magicpig::backend::cpu_internal
