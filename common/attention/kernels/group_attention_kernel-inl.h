// Template body of the group attention kernel (group_attention_kernel.h); included once per ISA
// translation unit after that unit brings one of common/simd/vec16_<isa>-inl.h's vector
// namespaces into magicpig::attention::internal::MAGICPIG_GROUP_NS.
//
// Three paths:
// - A contiguous range that every head attends to with exact logits (FullEstimator): tiles of
//   kGroupTile rows, in three passes each:
//   A. scores: each key row is loaded once and dotted with up to 4 heads at a time (the 4 sums
//      reduced together) and scaled into logits; with a multiple of 4 heads, two rows at a time,
//      so each query chunk load feeds both rows (half the loads per FMA: a one-thread step ~6%
//      faster on AVX2), and key rows prefetched a few rows ahead;
//   B. softmax: per head, the tile's maximum, the weights exp(x - m) and the running sum;
//   C. values, 4 heads x one 16-element chunk at a time with the accumulators in registers
//      across the tile's rows, so each value chunk is loaded once for 4 heads.
// - A row list with values, in practice a MagicPIG group's sampled union (head masks, the
//   correction; usually one head per row): tiles of kSampledTile rows, gathered into a buffer
//   first, then scored, weighed and added per head over each head's own rows (RunSampledTiles).
// - Anything else (sums only for vattention's spread; a contiguous range with masks or the
//   correction): one row at a time with a running softmax per head (RunStreamed).
// - Logits only (Scores, for top-k and oracle sampling): pass A of the tiles over the whole
//   range, written to the caller's [g][n] buffer, without the value prefetches.
// Rows are read 16 elements at a time in the ISA's LoadBf16Shuffled lane order (one load and two
// bit operations on AVX2 instead of a widening shuffle); the queries are permuted into that order
// once per call and the accumulators permuted back at the end, so the dot products and value sums
// are the same sums in another order. A row list's key and value rows are prefetched in two
// stages: into L2 some KiB ahead, into L1 kPrefetchRows rows ahead.
#include <cstdint>

#include "common/attention/kernels/group_attention_kernel.h"

namespace magicpig::attention::internal {
namespace MAGICPIG_GROUP_NS {

// Gathered rows are prefetched in two stages. A row's key and value are 8 cache lines at d = 128
// (bf16); the L1 tracks only a couple of dozen misses, so prefetching into L1 further than a few
// rows ahead stalls on full miss buffers (8, 10 or 12 rows were no faster than 4), while memory
// latency needs far more lines in flight than 4 rows hold. So rows kFarPrefetchBytes ahead (of
// key + value) are prefetched into L2 only (PrefetchL2: L2 tracks more misses, and the L1's buffer
// is free once the request is handed on), and the rows kPrefetchRows ahead, by then on their way or
// in L2, into L1. At 64K keys on 8B shapes this made the gather and kernel ~15% faster
// (docs/attention-core-bench.md); 8 to 24 KiB ahead measured the same within the VM's noise.
constexpr int64_t kPrefetchRows = 4;
constexpr int64_t kFarPrefetchBytes = 12 * 1024;

// Rows of `row_bytes` each (key + value, or key alone) that make kFarPrefetchBytes, at least twice
// the near stage's kPrefetchRows. The sampled tiles' gather uses the same distance: 6 and 24 KiB
// were both ~25% slower per row than 12 there (a gather-bound microbenchmark at d = 128).
inline int64_t FarPrefetchRows(int64_t row_bytes) {
  return kFarPrefetchBytes / row_bytes > 2 * kPrefetchRows ? kFarPrefetchBytes / row_bytes
                                                           : 2 * kPrefetchRows;
}

// Key rows ahead in a dense tile's pass A. The key stream is sequential, but the value prefetches
// interleaved with it keep the hardware prefetchers from running far enough ahead: 8 rows (2 KB
// at d = 128, bf16) made a one-thread `full` step ~4% faster on AVX2 (16 and 32 were no better).
constexpr int64_t kKeyPrefetchRows = 8;

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
inline int64_t RowBytes(int64_t d) {
  return (kChunks > 0 ? kChunks * kLanes : d) * (kBf16 ? 2 : 4);
}

// Every line of row r, into L1 (or into L2 only: kL2).
template <int64_t kChunks, bool kBf16, bool kL2 = false>
inline void PrefetchRow(const void* base, int64_t r, int64_t d) {
  const int64_t bytes = RowBytes<kChunks, kBf16>(d);
  const char* p = static_cast<const char*>(base) + r * bytes;
  for (int64_t off = 0; off < bytes; off += 64) {
    if constexpr (kL2) {
      PrefetchL2(p + off);
    } else {
      Prefetch(p + off);
    }
  }
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

// s[0 .. kHeads) = key row r . qp[h * d ...] (kernel order) for kHeads (1..4) heads (s has room
// for 4). One head spreads its chunks over the 4 accumulators: 4 short FMA chains instead of one
// long one, so the next row's or head's product need not wait for this one.
template <int kHeads, int64_t kChunks, bool kBf16>
inline void DotRow(const void* keys, int64_t r, int64_t d, int64_t chunks, const float* qp,
                   float* s) {
  V acc[4] = {Zero(), Zero(), Zero(), Zero()};
  const int64_t nc = kChunks > 0 ? kChunks : chunks;
  if constexpr (kHeads == 1) {
    for (int64_t c = 0; c < nc; ++c) {
      acc[c & 3] = Fma(LoadF32(qp + c * kLanes), LoadChunk<kBf16>(keys, r, d, c), acc[c & 3]);
    }
    s[0] = ReduceAdd(Add(Add(acc[0], acc[1]), Add(acc[2], acc[3])));
    return;
  }
  for (int64_t c = 0; c < nc; ++c) {
    const V k = LoadChunk<kBf16>(keys, r, d, c);
    for (int h = 0; h < kHeads; ++h) acc[h] = Fma(LoadF32(qp + h * d + c * kLanes), k, acc[h]);
  }
  ReduceAdd4(acc[0], acc[1], acc[2], acc[3], s);
}

// s[0 .. 4) = key row r . the 4 heads, s[4 .. 8) = row r + 1 . the same heads: each query chunk
// is loaded once for both rows (one load per two FMAs instead of one per FMA).
template <int64_t kChunks, bool kBf16>
inline void DotTwoRowsFourHeads(const void* keys, int64_t r, int64_t d, int64_t chunks,
                                const float* qp, float* s) {
  DotAcc acc[8];
  for (DotAcc& x : acc) x = DotAccZero();
  const int64_t nc = kChunks > 0 ? kChunks : chunks;
  for (int64_t c = 0; c < nc; ++c) {
    const V k0 = LoadChunk<kBf16>(keys, r, d, c);
    const V k1 = LoadChunk<kBf16>(keys, r + 1, d, c);
    for (int h = 0; h < 4; ++h) {
      const V q = LoadF32(qp + h * d + c * kLanes);
      acc[h] = DotAccFma(q, k0, acc[h]);
      acc[4 + h] = DotAccFma(q, k1, acc[4 + h]);
    }
  }
  DotAccReduce8(acc, s);
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
// sum_j w_h[j] v_(r0 + j), one chunk at a time with the kHeads chunk accumulators in registers.
template <int kHeads, int64_t kChunks, bool kBf16>
inline void DenseValues(const void* values, int64_t r0, int64_t nt, const float* w,
                        int64_t w_stride, int64_t d, int64_t chunks, const float* corr,
                        float* acc) {
  const int64_t nc = kChunks > 0 ? kChunks : chunks;
  for (int64_t c = 0; c < nc; ++c) {
    V s[kHeads];
    for (int h = 0; h < kHeads; ++h) s[h] = Mul(LoadF32(acc + h * d + c * kLanes), Set1(corr[h]));
    for (int64_t j = 0; j < nt; ++j) {
      const V v = LoadChunk<kBf16>(values, r0 + j, d, c);
      for (int h = 0; h < kHeads; ++h) s[h] = Fma(Set1(w[h * w_stride + j]), v, s[h]);
    }
    for (int h = 0; h < kHeads; ++h) Store(acc + h * d + c * kLanes, s[h]);
  }
}

template <int64_t kChunks, bool kBf16>
inline void DenseValuesHeads(int heads, const void* values, int64_t r0, int64_t nt, const float* w,
                             int64_t w_stride, int64_t d, int64_t chunks, const float* corr,
                             float* acc) {
  switch (heads) {
    case 1:
      return DenseValues<1, kChunks, kBf16>(values, r0, nt, w, w_stride, d, chunks, corr, acc);
    case 2:
      return DenseValues<2, kChunks, kBf16>(values, r0, nt, w, w_stride, d, chunks, corr, acc);
    case 3:
      return DenseValues<3, kChunks, kBf16>(values, r0, nt, w, w_stride, d, chunks, corr, acc);
    default:
      return DenseValues<4, kChunks, kBf16>(values, r0, nt, w, w_stride, d, chunks, corr, acc);
  }
}

// Pass A for a contiguous range that every head attends to with exact logits (FullEstimator):
// x[h * x_stride + j] = scale * q_h . k_r. The tile's value rows are prefetched for pass C unless
// a.values is null (scores only). Not inlined: inside the tile loop the register allocator spilled
// the dot-product loop's constants (about 5% of a step on AVX2).
template <int64_t kChunks, bool kBf16>
__attribute__((noinline)) void ScoreDenseTile(const GroupAttentionArgs& a, int64_t t0, int64_t nt,
                                              int64_t chunks, const float* qp, int64_t x_stride,
                                              float* x) {
  const bool values = a.values != nullptr;
  const int64_t d = a.d;
  const int g = a.g;
  const int64_t far_rows = FarPrefetchRows(2 * RowBytes<kChunks, kBf16>(d));
  int64_t j = 0;
  if (g % 4 == 0) {
    // Two rows at a time, four heads per pass.
    for (; j + 2 <= nt; j += 2) {
      const int64_t r = a.row_begin + t0 + j;
      // Pass C reads the tile's value rows one 16-element chunk at a time across rows, a stride
      // the hardware prefetchers follow poorly: fetch each row while its key is being used.
      if (values) {
        PrefetchRow<kChunks, kBf16>(a.values, r, d);
        PrefetchRow<kChunks, kBf16>(a.values, r + 1, d);
      }
      // The rows kKeyPrefetchRows ahead (the next tile's, near the end of this one).
      if (const int64_t ahead = r + kKeyPrefetchRows; ahead + 1 < a.row_begin + a.n_rows) {
        PrefetchRow<kChunks, kBf16>(a.keys, ahead, d);
        PrefetchRow<kChunks, kBf16>(a.keys, ahead + 1, d);
      }
      // And into L2 the key and value rows kFarPrefetchBytes ahead: the near stages alone left
      // `full` at 64K on 8B shapes waiting on memory (24.3 -> 17.8-19.0 ms on one thread).
      if (const int64_t far = r + far_rows; far + 1 < a.row_begin + a.n_rows) {
        PrefetchRow<kChunks, kBf16, true>(a.keys, far, d);
        PrefetchRow<kChunks, kBf16, true>(a.keys, far + 1, d);
        if (values) {
          PrefetchRow<kChunks, kBf16, true>(a.values, far, d);
          PrefetchRow<kChunks, kBf16, true>(a.values, far + 1, d);
        }
      }
      for (int h0 = 0; h0 < g; h0 += 4) {
        float s[8];
        DotTwoRowsFourHeads<kChunks, kBf16>(a.keys, r, d, chunks, qp + h0 * d, s);
        for (int i = 0; i < 4; ++i) {
          x[(h0 + i) * x_stride + j] = a.scale * s[i];
          x[(h0 + i) * x_stride + j + 1] = a.scale * s[4 + i];
        }
      }
    }
  }
  for (; j < nt; ++j) {
    const int64_t r = a.row_begin + t0 + j;
    if (values) PrefetchRow<kChunks, kBf16>(a.values, r, d);
    if (const int64_t far = r + far_rows; far < a.row_begin + a.n_rows) {
      PrefetchRow<kChunks, kBf16, true>(a.keys, far, d);
      if (values) PrefetchRow<kChunks, kBf16, true>(a.values, far, d);
    }
    for (int h0 = 0; h0 < g; h0 += 4) {
      const int hb = static_cast<int>(MinI(4, g - h0));
      float s[4];
      DotRowHeads<kChunks, kBf16>(hb, a.keys, r, d, chunks, qp + h0 * d, s);
      for (int i = 0; i < hb; ++i) x[(h0 + i) * x_stride + j] = a.scale * s[i];
    }
  }
}

// One head's online-softmax update over a tile's logits x[0 .. n): the tile's maximum, the weights
// exp(x - m') written over x, the running maximum m and sum l updated. Returns exp(m - m'), the
// factor by which the head's accumulator must be rescaled.
inline float SoftmaxTileStep(float* x, int64_t n, float* m, float* l) {
  const int64_t nv = n - n % kLanes;  // the whole vectors; the rest one lane at a time
  V mv = Set1(-__builtin_inff());
  for (int64_t j = 0; j < nv; j += kLanes) mv = Max(mv, LoadF32(x + j));
  float tile_max = ReduceMax(mv);
  for (int64_t j = nv; j < n; ++j) tile_max = MaxF(tile_max, x[j]);
  const float new_m = MaxF(*m, tile_max);
  const float corr = FastExp(*m - new_m);
  const V nm = Set1(new_m);
  V vs = Zero();
  for (int64_t j = 0; j < nv; j += kLanes) {
    const V p = ExpV(Sub(LoadF32(x + j), nm));
    Store(x + j, p);
    vs = Add(vs, p);
  }
  float sum = ReduceAdd(vs);
  for (int64_t j = nv; j < n; ++j) {
    const float p = FastExp(x[j] - new_m);
    x[j] = p;
    sum += p;
  }
  *l = *l * corr + sum;
  *m = new_m;
  return corr;
}

// A contiguous range of rows that every head attends to with exact logits (FullEstimator), in
// tiles of kGroupTile rows, three passes each (see the top of this file). acc, m, l: the running
// softmax state per head; scratch: GroupAttentionScratchFloats's tile part.
template <int64_t kChunks, bool kBf16>
void RunTiles(const GroupAttentionArgs& a, const float* qp, float* acc, float* m, float* l,
              float* scratch) {
  const int64_t d = a.d;
  const int64_t chunks = kChunks > 0 ? kChunks : d / kLanes;
  const int g = a.g;
  constexpr int64_t kT = kGroupTile;
  float* corr = scratch;  // [g] this tile's rescale of acc
  float* x = corr + g;    // [g][kT] logits, then weights
  for (int64_t t0 = 0; t0 < a.n_rows; t0 += kT) {
    const int64_t nt = MinI(kT, a.n_rows - t0);
    // A. Logits: each key row once, against every head of the group.
    ScoreDenseTile<kChunks, kBf16>(a, t0, nt, chunks, qp, kT, x);
    // B. Online softmax per head; weights overwrite the logits.
    for (int h = 0; h < g; ++h) corr[h] = SoftmaxTileStep(x + h * kT, nt, &m[h], &l[h]);
    // C. Values: 4 heads x one chunk at a time, accumulators in registers.
    for (int h0 = 0; h0 < g; h0 += 4) {
      DenseValuesHeads<kChunks, kBf16>(static_cast<int>(MinI(4, g - h0)), a.values,
                                       a.row_begin + t0, nt, x + h0 * kT, kT, d, chunks, corr + h0,
                                       acc + h0 * d);
    }
  }
}

// Stage 1 of a sampled tile (RunSampledTiles): copies the key and value rows rows[t0 .. t0 + nt)
// into kbuf / vbuf (row j at j * RowBytes), with loads and stores only, prefetching `far` rows
// ahead into L2 and kPrefetchRows ahead into L1; kn[j] = |k_(rows[t0 + j])| with the correction.
template <int64_t kChunks, bool kBf16>
__attribute__((noinline)) void GatherTile(const GroupAttentionArgs& a, int64_t t0, int64_t nt,
                                          int64_t far, char* kbuf, char* vbuf, float* kn) {
  const int64_t d = a.d;
  const bool correct = a.lnu_table != nullptr;
  const int64_t bytes = RowBytes<kChunks, kBf16>(d);
  const char* keys = static_cast<const char*>(a.keys);
  const char* values = static_cast<const char*>(a.values);
  for (int64_t j = 0; j < nt; ++j) {
    const int64_t i = t0 + j;
    if (i + far < a.n_rows) {
      const int64_t rf = a.rows[i + far];
      PrefetchRow<kChunks, kBf16, true>(a.keys, rf, d);
      PrefetchRow<kChunks, kBf16, true>(a.values, rf, d);
      if (correct) PrefetchL2(a.key_norms + rf);
    }
    if (i + kPrefetchRows < a.n_rows) {
      const int64_t rn = a.rows[i + kPrefetchRows];
      PrefetchRow<kChunks, kBf16>(a.keys, rn, d);
      PrefetchRow<kChunks, kBf16>(a.values, rn, d);
      if (correct) Prefetch(a.key_norms + rn);
    }
    const int64_t r = a.rows[i];
    __builtin_memcpy(kbuf + j * bytes, keys + r * bytes, static_cast<size_t>(bytes));
    __builtin_memcpy(vbuf + j * bytes, values + r * bytes, static_cast<size_t>(bytes));
    if (correct) kn[j] = a.key_norms[r];
  }
}

// Stage 2 of a sampled tile: for each row j of the gathered tile and each head h that sampled it,
// x[h * kSampledTile + j] = q_h . k_j, and j is appended to head h's list (list[h * kSampledTile +
// count[h]++], in row order). Not inlined (see ScoreDenseTile).
template <int64_t kChunks, bool kBf16>
__attribute__((noinline)) void ScoreSampledTile(const GroupAttentionArgs& a, int64_t t0, int64_t nt,
                                                int64_t chunks, const char* kbuf, const float* qp,
                                                uint32_t all, float* x, int32_t* list,
                                                int32_t* count) {
  const int64_t d = a.d;
  const int g = a.g;
  constexpr int64_t kT = kSampledTile;
  for (int h = 0; h < g; ++h) count[h] = 0;
  for (int64_t j = 0; j < nt; ++j) {
    const uint32_t mask = a.masks != nullptr ? a.masks[t0 + j] & all : all;
    for (int h0 = 0; h0 < g; h0 += 4) {
      const int hb = static_cast<int>(MinI(4, g - h0));
      const uint32_t bits = (mask >> h0) & ((1u << hb) - 1u);
      if (bits == 0) continue;
      if (__builtin_popcount(bits) >= 3) {
        float sh[4];
        DotRowHeads<kChunks, kBf16>(hb, kbuf, j, d, chunks, qp + h0 * d, sh);
        for (uint32_t b = bits; b != 0; b &= b - 1) {
          const int h = h0 + __builtin_ctz(b);
          x[h * kT + j] = sh[h - h0];
          list[h * kT + count[h]++] = static_cast<int32_t>(j);
        }
      } else {
        for (uint32_t b = bits; b != 0; b &= b - 1) {
          const int h = h0 + __builtin_ctz(b);
          float one[4];
          DotRow<1, kChunks, kBf16>(kbuf, j, d, chunks, qp + h * d, one);
          x[h * kT + j] = one[0];
          list[h * kT + count[h]++] = static_cast<int32_t>(j);
        }
      }
    }
  }
}

// acc = corr * acc + sum over the listed rows j of w[j] v_j (vbuf: the tile's gathered value
// rows), 4 chunks at a time with their accumulators in registers across the list (4, not all 8
// at d = 128: 8 chunks are AVX2's 16 registers with nothing left for the operands).
template <int64_t kChunks, bool kBf16>
inline void SampledValuesOneHead(const char* vbuf, const int32_t* list, int32_t count,
                                 const float* w, int64_t d, int64_t chunks, float corr,
                                 float* acc) {
  const int64_t nc = kChunks > 0 ? kChunks : chunks;
  const int64_t n4 = nc - nc % 4;  // chunks in fours; the rest one at a time
  for (int64_t c0 = 0; c0 < n4; c0 += 4) {
    V s[4];
    for (int64_t c = 0; c < 4; ++c) s[c] = Mul(LoadF32(acc + (c0 + c) * kLanes), Set1(corr));
    for (int32_t i = 0; i < count; ++i) {
      const int32_t j = list[i];
      const V wv = Set1(w[j]);
      for (int64_t c = 0; c < 4; ++c) s[c] = Fma(wv, LoadChunk<kBf16>(vbuf, j, d, c0 + c), s[c]);
    }
    for (int64_t c = 0; c < 4; ++c) Store(acc + (c0 + c) * kLanes, s[c]);
  }
  for (int64_t c = n4; c < nc; ++c) {
    V s = Mul(LoadF32(acc + c * kLanes), Set1(corr));
    for (int32_t i = 0; i < count; ++i) {
      const int32_t j = list[i];
      s = Fma(Set1(w[j]), LoadChunk<kBf16>(vbuf, j, d, c), s);
    }
    Store(acc + c * kLanes, s);
  }
}

// A row list with values (a group's sampled union: head masks, usually the MagicPIG correction),
// in tiles of kSampledTile rows, in stages:
//   1. GatherTile: the tile's key and value rows copied into a buffer, the key norms read;
//   2. ScoreSampledTile: the dot product of each (row, head that sampled it) pair, each head's
//      list of its rows;
//   3. per head: its rows' logits (the correction by a lookup; the rows are independent of one
//      another), then 16 lanes at a time the tile's maximum (rows the head did not sample hold
//      -inf), the weights exp(x - m) and the running sum (a head that sampled no row of the tile
//      keeps its state), and its rows' values added to its accumulator, held in registers.
// Why not one running softmax per (row, head) over the rows in place (RunStreamed): there each
// pair is a long dependent chain (dot, reduction, division, lookup, exponential, the comparison
// with the running maximum, the rescale, the accumulation through memory) between prefetches that
// stall when the miss buffers are full, so the misses and the arithmetic mostly add up. Measured
// with `magicpig_attn_core_bench` at 64K keys on 8B shapes (d = 128, 4 heads, ~1.25 sampling each
// row): the MagicPIG step 5.6-6.0 -> 4.9-5.0 ms on one thread, 3.1-3.2 -> 2.6-2.8 on two. Scoring
// every head for every row (no lists, no branches) was slower: it does ~3x the FMAs.
template <int64_t kChunks, bool kBf16>
void RunSampledTiles(const GroupAttentionArgs& a, const float* qp, float* acc, float* m, float* l,
                     float* scratch) {
  const int64_t d = a.d;
  const int64_t chunks = kChunks > 0 ? kChunks : d / kLanes;
  const int g = a.g;
  const bool correct = a.lnu_table != nullptr;
  const uint32_t all = g >= 32 ? 0xffffffffu : ((1u << g) - 1u);
  constexpr int64_t kT = kSampledTile;
  const float neg_inf = -__builtin_inff();
  // The scratch's tile part (GroupAttentionScratchFloats): int32 lists and counts live in floats
  // of the same size, only ever accessed through their own pointers.
  float* x = scratch;      // [g][kT] dot products, then logits, then weights
  float* kn = x + g * kT;  // [kT] key norms
  int32_t* list = reinterpret_cast<int32_t*>(kn + kT);  // [g][kT] each head's rows
  int32_t* count = list + g * kT;                       // [g]
  char* kbuf = reinterpret_cast<char*>(count + g);      // [kT] gathered key rows
  const int64_t row_bytes = RowBytes<kChunks, kBf16>(d);
  char* vbuf = kbuf + kT * row_bytes;  // [kT] gathered value rows
  const int64_t far = FarPrefetchRows(2 * row_bytes);
  for (int64_t t0 = 0; t0 < a.n_rows; t0 += kT) {
    const int64_t nt = MinI(kT, a.n_rows - t0);
    GatherTile<kChunks, kBf16>(a, t0, nt, far, kbuf, vbuf, kn);
    for (int64_t i = 0; i < g * kT; i += kLanes) Store(x + i, Set1(neg_inf));
    ScoreSampledTile<kChunks, kBf16>(a, t0, nt, chunks, kbuf, qp, all, x, list, count);
    for (int h = 0; h < g; ++h) {
      const int32_t nh = count[h];
      if (nh == 0) continue;
      float* xh = x + h * kT;
      const int32_t* lh = list + h * kT;
      for (int32_t i = 0; i < nh; ++i) {
        const int32_t j = lh[i];
        float xv = a.scale * xh[j];
        if (correct) {
          const float denom = a.q_norms[h] * kn[j];
          const float cos = denom > 0.0f ? xh[j] / denom : 0.0f;
          xv -= LookupLnU(a.lnu_table, a.lnu_size, cos);
        }
        xh[j] = xv;
      }
      // Over the whole tile: unsampled rows hold -inf and get exp(-inf - m), the clamp's ~1e-38,
      // never read by the value sum and below a float's resolution in the running sum, whose
      // largest term is 1.
      const float corr_h = SoftmaxTileStep(xh, kT, &m[h], &l[h]);
      SampledValuesOneHead<kChunks, kBf16>(vbuf, lh, nh, xh, d, chunks, corr_h, acc + h * d);
    }
  }
}

// Everything but a contiguous exact range, i.e. a group's sampled union (a row list with head
// masks and the MagicPIG correction), streamed one row at a time: each row's key is dotted with
// the heads that sampled it (usually one), each such head's running softmax is updated
// (the accumulator rescaled when its maximum rises) and the value row added to it. No tile state:
// the row loop issues a steady stream of prefetches (two stages, see kFarPrefetchBytes), so the
// gather keeps misses in flight instead of pausing between the passes of a tile. (Batches of 16
// rows scored, then turned into logits and weights 16 lanes at a time, then added, were 10-20%
// slower at d = 64 and d = 128: the per-row division, lookup and exponential are not what bounds
// this loop; the misses are.)
//
// Without values (a.values == nullptr) only the softmax sums are kept: l, and with l2 != nullptr
// also l2[h] = sum exp(2 (x - m)) (the second moment of the weights, for vattention's spread).
template <int64_t kChunks, bool kBf16>
__attribute__((noinline)) void RunStreamed(const GroupAttentionArgs& a, const float* qp, float* acc,
                                           float* m, float* l, float* l2) {
  const bool with_values = a.values != nullptr;
  const int64_t d = a.d;
  const int64_t chunks = kChunks > 0 ? kChunks : d / kLanes;
  const int g = a.g;
  const bool correct = a.lnu_table != nullptr;
  const uint32_t all = g >= 32 ? 0xffffffffu : ((1u << g) - 1u);
  // The far stage's distance in rows (24 at d = 128 with values, 48 at d = 64).
  const int64_t row_bytes = RowBytes<kChunks, kBf16>(d) * (with_values ? 2 : 1);
  const int64_t far = FarPrefetchRows(row_bytes);
  for (int64_t j = 0; j < a.n_rows; ++j) {
    int64_t r;
    if (a.rows != nullptr) {
      if (j + far < a.n_rows) {
        const int64_t rf = a.rows[j + far];
        PrefetchRow<kChunks, kBf16, true>(a.keys, rf, d);
        if (with_values) PrefetchRow<kChunks, kBf16, true>(a.values, rf, d);
        if (correct) PrefetchL2(a.key_norms + rf);
      }
      if (j + kPrefetchRows < a.n_rows) {
        const int64_t rn = a.rows[j + kPrefetchRows];
        PrefetchRow<kChunks, kBf16>(a.keys, rn, d);
        if (with_values) PrefetchRow<kChunks, kBf16>(a.values, rn, d);
        if (correct) Prefetch(a.key_norms + rn);
      }
      r = a.rows[j];
    } else {
      r = a.row_begin + j;
    }
    const uint32_t mask = a.masks != nullptr ? a.masks[j] & all : all;
    float s[kMaxGroup];
    for (int h0 = 0; h0 < g; h0 += 4) {
      const int hb = static_cast<int>(MinI(4, g - h0));
      const uint32_t bits = (mask >> h0) & ((1u << hb) - 1u);
      if (bits == 0) continue;
      if (__builtin_popcount(bits) >= 3) {
        DotRowHeads<kChunks, kBf16>(hb, a.keys, r, d, chunks, qp + h0 * d, s + h0);
      } else {
        for (uint32_t b = bits; b != 0; b &= b - 1) {
          const int i = __builtin_ctz(b);
          float one[4];
          DotRow<1, kChunks, kBf16>(a.keys, r, d, chunks, qp + (h0 + i) * d, one);
          s[h0 + i] = one[0];
        }
      }
    }
    for (uint32_t b = mask; b != 0; b &= b - 1) {
      const int h = __builtin_ctz(b);
      float x = a.scale * s[h];
      if (correct) {
        const float denom = a.q_norms[h] * a.key_norms[r];
        const float cos = denom > 0.0f ? s[h] / denom : 0.0f;
        x -= LookupLnU(a.lnu_table, a.lnu_size, cos);
      }
      float* ah = acc + h * d;
      float w = 1.0f;
      if (x > m[h]) {
        // A new maximum: rescale what was accumulated (nothing the first time).
        const float corr = FastExp(m[h] - x);
        if (l[h] > 0.0f && with_values) {
          const V cv = Set1(corr);
          for (int64_t c = 0; c < chunks; ++c) {
            Store(ah + c * kLanes, Mul(LoadF32(ah + c * kLanes), cv));
          }
        }
        l[h] *= corr;
        if (l2 != nullptr) l2[h] *= corr * corr;
        m[h] = x;
      } else {
        w = FastExp(x - m[h]);
      }
      l[h] += w;
      if (l2 != nullptr) l2[h] += w * w;
      if (!with_values) continue;
      const V wv = Set1(w);
      for (int64_t c = 0; c < chunks; ++c) {
        Store(ah + c * kLanes,
              Fma(wv, LoadChunk<kBf16>(a.values, r, d, c), LoadF32(ah + c * kLanes)));
      }
    }
  }
}

// qp[h][i] = q_h's element at kernel position i.
template <bool kBf16>
inline void PermuteQueries(const GroupAttentionArgs& a, float* qp) {
  for (int h = 0; h < a.g; ++h) {
    for (int64_t i = 0; i < a.d; ++i) qp[h * a.d + i] = a.q[h * a.d + SourceIndex<kBf16>(i)];
  }
}

// Logits of a row list (GroupScores* with rows): row j's key is gathered once for the heads whose
// mask bit is set (every head without masks); the others' x is -inf. Keys are prefetched in the
// two stages of the sampled path (kPrefetchRows into L1, FarPrefetchRows into L2).
template <int64_t kChunks, bool kBf16>
void ScoreListRows(const GroupAttentionArgs& a, const float* qp, int64_t chunks, float* x) {
  const int64_t d = a.d;
  const int g = a.g;
  const uint32_t all = g >= 32 ? 0xffffffffu : ((1u << g) - 1u);
  const int64_t far = FarPrefetchRows(RowBytes<kChunks, kBf16>(d));
  for (int64_t j = 0; j < a.n_rows; ++j) {
    if (j + far < a.n_rows) PrefetchRow<kChunks, kBf16, true>(a.keys, a.rows[j + far], d);
    if (j + kPrefetchRows < a.n_rows) {
      PrefetchRow<kChunks, kBf16>(a.keys, a.rows[j + kPrefetchRows], d);
    }
    const int64_t r = a.rows[j];
    const uint32_t mask = a.masks != nullptr ? a.masks[j] & all : all;
    for (int h0 = 0; h0 < g; h0 += 4) {
      const int hb = static_cast<int>(MinI(4, g - h0));
      const uint32_t bits = (mask >> h0) & ((1u << hb) - 1u);
      float s[4];
      if (bits != 0) DotRowHeads<kChunks, kBf16>(hb, a.keys, r, d, chunks, qp + h0 * d, s);
      for (int i = 0; i < hb; ++i) {
        x[(h0 + i) * a.n_rows + j] = (bits >> i) & 1u ? a.scale * s[i] : -__builtin_inff();
      }
    }
  }
}

// Logits only (GroupScores*): pass A over the contiguous range in tiles, written at stride n_rows
// (or the row list's logits: ScoreListRows).
template <int64_t kChunks, bool kBf16>
void ScoresImpl(const GroupAttentionArgs& a, float* x) {
  float* qp = a.scratch;  // [g][d] queries in kernel order
  PermuteQueries<kBf16>(a, qp);
  const int64_t chunks = kChunks > 0 ? kChunks : a.d / kLanes;
  if (a.rows != nullptr) return ScoreListRows<kChunks, kBf16>(a, qp, chunks, x);
  for (int64_t t0 = 0; t0 < a.n_rows; t0 += kGroupTile) {
    ScoreDenseTile<kChunks, kBf16>(a, t0, MinI(kGroupTile, a.n_rows - t0), chunks, qp, a.n_rows,
                                   x + t0);
  }
}

template <int64_t kChunks, bool kBf16>
void RunImpl(const GroupAttentionArgs& a) {
  const int64_t d = a.d;
  const int g = a.g;
  const float neg_inf = -__builtin_inff();
  float* qp = a.scratch;    // [g][d] queries in kernel order
  float* acc = qp + g * d;  // [g][d] kernel order
  float* m = acc + g * d;   // [g] running max
  float* l = m + g;         // [g] running sum
  PermuteQueries<kBf16>(a, qp);
  for (int h = 0; h < g; ++h) {
    m[h] = neg_inf;
    l[h] = 0.0f;
  }
  for (int64_t i = 0; i < g * d; ++i) acc[i] = 0.0f;
  float l2[kMaxGroup];
  for (int h = 0; h < g; ++h) l2[h] = 0.0f;
  if (a.rows == nullptr && a.masks == nullptr && a.lnu_table == nullptr && a.values != nullptr &&
      a.lse2 == nullptr) {
    RunTiles<kChunks, kBf16>(a, qp, acc, m, l, l + g);
  } else if (a.rows != nullptr && a.values != nullptr && a.lse2 == nullptr) {
    RunSampledTiles<kChunks, kBf16>(a, qp, acc, m, l, l + g);
  } else {
    RunStreamed<kChunks, kBf16>(a, qp, acc, m, l, a.lse2 != nullptr ? l2 : nullptr);
  }
  for (int h = 0; h < g; ++h) {
    const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
    if (a.o != nullptr) {
      for (int64_t i = 0; i < d; ++i) a.o[h * d + SourceIndex<kBf16>(i)] = acc[h * d + i] * inv;
    }
    a.lse[h] = l[h] > 0.0f ? m[h] + __builtin_logf(l[h]) : neg_inf;
    if (a.lse2 != nullptr) a.lse2[h] = l2[h] > 0.0f ? 2 * m[h] + __builtin_logf(l2[h]) : neg_inf;
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

template <bool kBf16>
void ScoresTyped(const GroupAttentionArgs& a, float* x) {
  switch (a.d / kLanes) {
    case 4:
      return ScoresImpl<4, kBf16>(a, x);
    case 8:
      return ScoresImpl<8, kBf16>(a, x);
    default:
      return ScoresImpl<0, kBf16>(a, x);
  }
}

inline void Scores(const GroupAttentionArgs& a, float* x) {
  if (a.bf16) return ScoresTyped<true>(a, x);
  return ScoresTyped<false>(a, x);
}

}  // namespace MAGICPIG_GROUP_NS
}  // namespace magicpig::attention::internal
