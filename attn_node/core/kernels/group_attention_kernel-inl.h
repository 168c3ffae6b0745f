// Template body of the group attention kernel (group_attention_kernel.h); included once per ISA
// translation unit after that unit brings one of common/simd/vec16_<isa>-inl.h's vector
// namespaces into magicpig::attn_internal::MAGICPIG_GROUP_NS.
//
// Work per tile of kGroupTile rows, in three passes:
//   A. scores: each key row is loaded once and dotted with up to 4 heads at a time (the 4 sums
//      reduced together), then turned into logits (MagicPIG correction, -inf for masked heads);
//   B. softmax: per head, the tile's maximum, the weights exp(x - m) and the running sum;
//   C. values, with accumulators held in registers across the tile's rows instead of loaded and
//      stored for every row: without masks (every head weighs every row) 4 heads at a time over
//      one 16-element chunk, so each value chunk is loaded once for 4 heads; with masks per head
//      over only the rows it sampled, 64 elements at a time.
// Rows are read 16 elements at a time in the ISA's LoadBf16Shuffled lane order (one load and two
// bit operations on AVX2 instead of a widening shuffle); the queries are permuted into that order
// once per call and the accumulators permuted back at the end, so the dot products and value sums
// are the same sums in another order. A gathered row list prefetches the key and value rows
// kPrefetchRows entries ahead in pass A, so pass C finds the values in cache.
#include <cstdint>

#include "attn_node/core/kernels/group_attention_kernel.h"

namespace magicpig::attn_internal {
namespace MAGICPIG_GROUP_NS {

// Gathered rows ahead. A row's key and value are 8 cache lines at d = 128 (bf16) and a core keeps
// only a few dozen misses in flight: a longer distance only stalls on full miss queues.
constexpr int64_t kPrefetchRows = 4;

inline int64_t MinI(int64_t a, int64_t b) { return a < b ? a : b; }

// Element c * 16 + lane of a row, in kernel order.
template <bool kBf16>
inline V LoadChunk(const void* base, int64_t r, int64_t d, int64_t c) {
  if constexpr (kBf16) {
    return LoadBf16Shuffled(static_cast<const uint16_t*>(base) + r * d + c * kLanes);
  } else {
    return LoadF32(static_cast<const float*>(base) + r * d + c * kLanes);
  }
}

// The row element that kernel position i holds.
template <bool kBf16>
inline int64_t SourceIndex(int64_t i) {
  if constexpr (kBf16) {
    return i - i % kLanes + Bf16ShuffledSource(static_cast<int>(i % kLanes));
  } else {
    return i;
  }
}

template <int64_t kChunks, bool kBf16>
inline void PrefetchRow(const void* base, int64_t r, int64_t d) {
  const int64_t bytes = (kChunks > 0 ? kChunks * kLanes : d) * (kBf16 ? 2 : 4);
  const char* p = static_cast<const char*>(base) + r * bytes;
  for (int64_t off = 0; off < bytes; off += 64) Prefetch(p + off);
}

// ln(u(c) + 1e-4) by linear interpolation in the caller's table (uniform grid on [-1, 1]).
inline float LookupLnU(const float* table, int size, float c) {
  if (!(c == c)) c = 0.0f;  // NaN (only from non-finite inputs) reads as cos 0
  c = c > 1.0f ? 1.0f : (c < -1.0f ? -1.0f : c);
  const float pos = (c + 1.0f) * 0.5f * static_cast<float>(size - 1);
  int i = static_cast<int>(pos);
  if (i > size - 2) i = size - 2;
  const float f = pos - static_cast<float>(i);
  return table[i] + f * (table[i + 1] - table[i]);
}

// s[0 .. kHeads) = key row r . qp[h * d ...] (kernel order) for kHeads (1..4) heads.
template <int kHeads, int64_t kChunks, bool kBf16>
inline void DotRow(const void* keys, int64_t r, int64_t d, int64_t chunks, const float* qp,
                   float* s) {
  V acc[4] = {Zero(), Zero(), Zero(), Zero()};
  const int64_t nc = kChunks > 0 ? kChunks : chunks;
  for (int64_t c = 0; c < nc; ++c) {
    const V k = LoadChunk<kBf16>(keys, r, d, c);
    for (int h = 0; h < kHeads; ++h) acc[h] = Fma(LoadF32(qp + h * d + c * kLanes), k, acc[h]);
  }
  ReduceAdd4(acc[0], acc[1], acc[2], acc[3], s);
}

template <int64_t kChunks, bool kBf16>
inline void DotRowHeads(int heads, const void* keys, int64_t r, int64_t d, int64_t chunks,
                        const float* qp, float* s) {
  switch (heads) {
    case 1:
      return DotRow<1, kChunks, kBf16>(keys, r, d, chunks, qp, s);
    case 2:
      return DotRow<2, kChunks, kBf16>(keys, r, d, chunks, qp, s);
    case 3:
      return DotRow<3, kChunks, kBf16>(keys, r, d, chunks, qp, s);
    default:
      return DotRow<4, kChunks, kBf16>(keys, r, d, chunks, qp, s);
  }
}

// Dense tiles (every head weighs every row): for kHeads heads h0.., acc_h = corr_h * acc_h +
// sum_j w_h[j] v_j, one chunk at a time with the kHeads chunk accumulators in registers.
template <int kHeads, int64_t kChunks, bool kBf16>
inline void DenseValues(const void* values, const int64_t* row_of, int64_t nt, const float* w,
                        int64_t w_stride, int64_t d, int64_t chunks, const float* corr,
                        float* acc) {
  const int64_t nc = kChunks > 0 ? kChunks : chunks;
  for (int64_t c = 0; c < nc; ++c) {
    V s[kHeads];
    for (int h = 0; h < kHeads; ++h) s[h] = Mul(LoadF32(acc + h * d + c * kLanes), Set1(corr[h]));
    for (int64_t j = 0; j < nt; ++j) {
      const V v = LoadChunk<kBf16>(values, row_of[j], d, c);
      for (int h = 0; h < kHeads; ++h) s[h] = Fma(Set1(w[h * w_stride + j]), v, s[h]);
    }
    for (int h = 0; h < kHeads; ++h) Store(acc + h * d + c * kLanes, s[h]);
  }
}

template <int64_t kChunks, bool kBf16>
inline void DenseValuesHeads(int heads, const void* values, const int64_t* row_of, int64_t nt,
                             const float* w, int64_t w_stride, int64_t d, int64_t chunks,
                             const float* corr, float* acc) {
  switch (heads) {
    case 1:
      return DenseValues<1, kChunks, kBf16>(values, row_of, nt, w, w_stride, d, chunks, corr, acc);
    case 2:
      return DenseValues<2, kChunks, kBf16>(values, row_of, nt, w, w_stride, d, chunks, corr, acc);
    case 3:
      return DenseValues<3, kChunks, kBf16>(values, row_of, nt, w, w_stride, d, chunks, corr, acc);
    default:
      return DenseValues<4, kChunks, kBf16>(values, row_of, nt, w, w_stride, d, chunks, corr, acc);
  }
}

// Masked tiles: one head over the tile positions in list[0 .. count), chunks [c0, c0 + kVecs),
// with the kVecs chunk accumulators in registers.
template <int kVecs, bool kBf16>
inline void SparseValues(const void* values, const int64_t* row_of, const int32_t* list,
                         int64_t count, const float* w, int64_t d, int64_t c0, float corr,
                         float* acc) {
  V s[kVecs];
  for (int i = 0; i < kVecs; ++i) s[i] = Mul(LoadF32(acc + (c0 + i) * kLanes), Set1(corr));
  for (int64_t k = 0; k < count; ++k) {
    const int32_t j = list[k];
    const V p = Set1(w[j]);
    const int64_t r = row_of[j];
    for (int i = 0; i < kVecs; ++i) s[i] = Fma(p, LoadChunk<kBf16>(values, r, d, c0 + i), s[i]);
  }
  for (int i = 0; i < kVecs; ++i) Store(acc + (c0 + i) * kLanes, s[i]);
}

// Pass A for a contiguous range that every head attends to with exact logits (FullEstimator):
// x[h][j] = scale * q_h . k_r. Not inlined (nor ScoreTile): inside RunImpl the register allocator
// spilled the dot-product loop's constants (about 5% of a step on AVX2).
template <int64_t kChunks, bool kBf16>
__attribute__((noinline)) void ScoreDenseTile(const GroupAttentionArgs& a, int64_t t0, int64_t nt,
                                              int64_t chunks, const float* qp, float* x,
                                              int64_t* row_of) {
  const int64_t d = a.d;
  const int g = a.g;
  for (int64_t j = 0; j < nt; ++j) {
    const int64_t r = a.row_begin + t0 + j;
    // Pass C reads the tile's value rows one 16-element chunk at a time across rows, a stride
    // the hardware prefetchers follow poorly: fetch each row while its key is being used.
    PrefetchRow<kChunks, kBf16>(a.values, r, d);
    row_of[j] = r;
    for (int h0 = 0; h0 < g; h0 += 4) {
      const int hb = static_cast<int>(MinI(4, g - h0));
      float s[4];
      DotRowHeads<kChunks, kBf16>(hb, a.keys, r, d, chunks, qp + h0 * d, s);
      for (int i = 0; i < hb; ++i) x[(h0 + i) * kGroupTile + j] = a.scale * s[i];
    }
  }
}

// Pass A in general: gathered rows (prefetched ahead), head masks, the MagicPIG correction.
// Masked heads get -inf; count[h] / list[h][...] receive the tile positions head h attends to
// when there are masks (count[h] = nt otherwise).
template <int64_t kChunks, bool kBf16>
__attribute__((noinline)) void ScoreTile(const GroupAttentionArgs& a, int64_t t0, int64_t nt,
                                         int64_t chunks, const float* qp, float* x, int64_t* row_of,
                                         int32_t* list, int32_t* count) {
  constexpr int64_t kT = kGroupTile;
  const float neg_inf = -__builtin_inff();
  const int64_t d = a.d;
  const int g = a.g;
  const bool masked = a.masks != nullptr;
  const bool correct = a.lnu_table != nullptr;
  for (int h = 0; h < g; ++h) count[h] = masked ? 0 : static_cast<int32_t>(nt);
  for (int64_t j = 0; j < nt; ++j) {
    int64_t r;
    if (a.rows != nullptr) {
      const int64_t ahead = t0 + j + kPrefetchRows;
      if (ahead < a.n_rows) {
        PrefetchRow<kChunks, kBf16>(a.keys, a.rows[ahead], d);
        PrefetchRow<kChunks, kBf16>(a.values, a.rows[ahead], d);
        if (correct) Prefetch(a.key_norms + a.rows[ahead]);
      }
      r = a.rows[t0 + j];
    } else {
      r = a.row_begin + t0 + j;
      PrefetchRow<kChunks, kBf16>(a.values, r, d);  // see ScoreDenseTile
    }
    row_of[j] = r;
    const uint32_t mask = masked ? a.masks[t0 + j] : 0xffffffffu;
    for (int h0 = 0; h0 < g; h0 += 4) {
      const int hb = static_cast<int>(MinI(4, g - h0));
      const uint32_t bits = (mask >> h0) & ((1u << hb) - 1u);
      if (bits == 0) {
        for (int i = 0; i < hb; ++i) x[(h0 + i) * kT + j] = neg_inf;
        continue;
      }
      float s[4];
      if (__builtin_popcount(bits) >= 3) {
        DotRowHeads<kChunks, kBf16>(hb, a.keys, r, d, chunks, qp + h0 * d, s);
      } else {
        // A sampled row is usually attended by one head of the group: dot only those heads (the
        // row is in L1 after the first).
        for (uint32_t b = bits; b != 0; b &= b - 1) {
          const int i = __builtin_ctz(b);
          float one[4];
          DotRow<1, kChunks, kBf16>(a.keys, r, d, chunks, qp + (h0 + i) * d, one);
          s[i] = one[0];
        }
      }
      for (int i = 0; i < hb; ++i) {
        const int h = h0 + i;
        if (((bits >> i) & 1u) == 0) {
          x[h * kT + j] = neg_inf;
          continue;
        }
        float logit = a.scale * s[i];
        if (correct) {
          const float denom = a.q_norms[h] * a.key_norms[r];
          const float cos = denom > 0.0f ? s[i] / denom : 0.0f;
          logit -= LookupLnU(a.lnu_table, a.lnu_size, cos);
        }
        x[h * kT + j] = logit;
        if (masked) list[h * kT + count[h]++] = static_cast<int32_t>(j);
      }
    }
  }
}

template <int64_t kChunks, bool kBf16>
void RunImpl(const GroupAttentionArgs& a) {
  const int64_t d = a.d;
  const int64_t chunks = kChunks > 0 ? kChunks : d / kLanes;
  const int g = a.g;
  const float neg_inf = -__builtin_inff();
  constexpr int64_t kT = kGroupTile;
  float* qp = a.scratch;         // [g][d] queries in kernel order
  float* acc = qp + g * d;       // [g][d] kernel order
  float* m = acc + g * d;        // [g] running max
  float* l = m + g;              // [g] running sum
  float* corr = l + g;           // [g] this tile's rescale of acc
  float* x = corr + g;           // [g][kT] logits, then weights
  int32_t list[kMaxGroup * kT];  // [g][kT] tile positions each head attends to (masked tiles)
  int32_t count[kMaxGroup];      // [g] rows each head attends to in the tile
  int64_t row_of[kT];            // stored row of each tile position
  for (int h = 0; h < g; ++h) {
    for (int64_t i = 0; i < d; ++i) qp[h * d + i] = a.q[h * d + SourceIndex<kBf16>(i)];
    m[h] = neg_inf;
    l[h] = 0.0f;
  }
  for (int64_t i = 0; i < g * d; ++i) acc[i] = 0.0f;
  const bool correct = a.lnu_table != nullptr;
  const bool gathered = a.rows != nullptr;
  const bool masked = a.masks != nullptr;
  const V lowest = Set1(-3.0e38f);  // below every finite logit: marks -inf (no weight)
  for (int64_t t0 = 0; t0 < a.n_rows; t0 += kT) {
    const int64_t nt = MinI(kT, a.n_rows - t0);
    // A. Logits: each key row once, against every head of the group that attends to it.
    if (!masked && !correct && !gathered) {
      ScoreDenseTile<kChunks, kBf16>(a, t0, nt, chunks, qp, x, row_of);
      for (int h = 0; h < g; ++h) count[h] = static_cast<int32_t>(nt);
    } else {
      ScoreTile<kChunks, kBf16>(a, t0, nt, chunks, qp, x, row_of, list, count);
    }
    // B. Online softmax per head; weights overwrite the logits (0 where a head does not attend).
    for (int h = 0; h < g; ++h) {
      corr[h] = 1.0f;
      float* xh = x + h * kT;
      if (count[h] == 0) {
        for (int64_t j = 0; j < nt; ++j) xh[j] = 0.0f;
        continue;
      }
      float tile_max = neg_inf;
      int64_t j = 0;
      V mv = Set1(neg_inf);
      for (; j + kLanes <= nt; j += kLanes) mv = Max(mv, LoadF32(xh + j));
      tile_max = ReduceMax(mv);
      for (; j < nt; ++j) tile_max = MaxF(tile_max, xh[j]);
      const float new_m = MaxF(m[h], tile_max);
      corr[h] = FastExp(m[h] - new_m);
      const V nm = Set1(new_m);
      V vs = Zero();
      j = 0;
      for (; j + kLanes <= nt; j += kLanes) {
        const V xv = LoadF32(xh + j);
        const V p = ZeroWhereLess(ExpV(Sub(xv, nm)), xv, lowest);
        Store(xh + j, p);
        vs = Add(vs, p);
      }
      float sum = ReduceAdd(vs);
      for (; j < nt; ++j) {
        const float p = xh[j] == neg_inf ? 0.0f : FastExp(xh[j] - new_m);
        xh[j] = p;
        sum += p;
      }
      l[h] = l[h] * corr[h] + sum;
      m[h] = new_m;
    }
    // C. Values.
    if (!masked) {
      for (int h0 = 0; h0 < g; h0 += 4) {
        DenseValuesHeads<kChunks, kBf16>(static_cast<int>(MinI(4, g - h0)), a.values, row_of, nt,
                                         x + h0 * kT, kT, d, chunks, corr + h0, acc + h0 * d);
      }
    } else {
      for (int h = 0; h < g; ++h) {
        if (count[h] == 0) continue;
        const int32_t* hl = list + h * kT;
        const float* w = x + h * kT;
        float* ah = acc + h * d;
        const int nc = static_cast<int>(chunks);  // <= 16
        int c = 0;
        for (; c + 4 <= nc; c += 4) {
          SparseValues<4, kBf16>(a.values, row_of, hl, count[h], w, d, c, corr[h], ah);
        }
        for (; c < nc; ++c) {
          SparseValues<1, kBf16>(a.values, row_of, hl, count[h], w, d, c, corr[h], ah);
        }
      }
    }
  }
  for (int h = 0; h < g; ++h) {
    const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
    for (int64_t i = 0; i < d; ++i) a.o[h * d + SourceIndex<kBf16>(i)] = acc[h * d + i] * inv;
    a.lse[h] = l[h] > 0.0f ? m[h] + __builtin_logf(l[h]) : neg_inf;
  }
}

template <bool kBf16>
void RunTyped(const GroupAttentionArgs& a) {
  switch (a.d / kLanes) {
    case 4:
      return RunImpl<4, kBf16>(a);
    case 8:
      return RunImpl<8, kBf16>(a);
    default:
      return RunImpl<0, kBf16>(a);
  }
}

inline void Run(const GroupAttentionArgs& a) {
  if (a.bf16) return RunTyped<true>(a);
  return RunTyped<false>(a);
}

}  // namespace MAGICPIG_GROUP_NS
}  // namespace magicpig::attn_internal
