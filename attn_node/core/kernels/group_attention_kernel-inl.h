// Template body of the group attention kernel (group_attention_kernel.h); included once per ISA
// translation unit after that unit brings one of common/simd/vec16_<isa>-inl.h's vector
// namespaces into magicpig::attn_internal::MAGICPIG_GROUP_NS.
#include <cstdint>

#include "attn_node/core/kernels/group_attention_kernel.h"

namespace magicpig::attn_internal {
namespace MAGICPIG_GROUP_NS {

constexpr int64_t kMaxChunks = 16;  // d <= 256
// Rows ahead to prefetch when gathering (a sampled row is a random access).
constexpr int64_t kPrefetchAhead = 6;

inline int64_t MinI(int64_t a, int64_t b) { return a < b ? a : b; }

template <bool kBf16>
inline V LoadRowChunk(const void* base, int64_t r, int64_t d, int64_t c) {
  if constexpr (kBf16) {
    return LoadBf16(static_cast<const uint16_t*>(base) + r * d + c * kLanes);
  } else {
    return LoadF32(static_cast<const float*>(base) + r * d + c * kLanes);
  }
}

template <bool kBf16>
inline void PrefetchRow(const void* base, int64_t r, int64_t d) {
  const char* p = static_cast<const char*>(base) + r * d * (kBf16 ? 2 : 4);
  const int64_t bytes = d * (kBf16 ? 2 : 4);
  for (int64_t off = 0; off < bytes; off += 64) Prefetch(p + off);
}

// The stored row of list entry `at`; a gathered list also prefetches the row kPrefetchAhead
// entries later from `base` (keys or values).
template <bool kBf16>
inline int64_t RowAt(const GroupAttentionArgs& a, int64_t at, const void* base) {
  if (a.rows == nullptr) return a.row_begin + at;
  if (at + kPrefetchAhead < a.n_rows) PrefetchRow<kBf16>(base, a.rows[at + kPrefetchAhead], a.d);
  return a.rows[at];
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

template <int kChunks, bool kBf16>
void RunImpl(const GroupAttentionArgs& a) {
  const int64_t d = a.d;
  const int64_t chunks = kChunks > 0 ? kChunks : d / kLanes;
  const int g = a.g;
  const float neg_inf = -__builtin_inff();
  float* acc = a.scratch;  // [g][d]
  float* m = acc + g * d;  // [g] running max
  float* l = m + g;        // [g] running sum
  float* x = l + g;        // [g][kGroupTile] logits, then weights
  for (int64_t i = 0; i < g * d; ++i) acc[i] = 0.0f;
  for (int h = 0; h < g; ++h) {
    m[h] = neg_inf;
    l[h] = 0.0f;
  }
  const uint32_t all = g >= 32 ? 0xffffffffu : ((1u << g) - 1u);
  const bool correct = a.lnu_table != nullptr;
  V row[kMaxChunks];
  for (int64_t t0 = 0; t0 < a.n_rows; t0 += kGroupTile) {
    const int64_t nt = MinI(kGroupTile, a.n_rows - t0);
    // Logits: each key row once, against every head that attends to it.
    for (int64_t j = 0; j < nt; ++j) {
      const int64_t r = RowAt<kBf16>(a, t0 + j, a.keys);
      const uint32_t mask = a.masks != nullptr ? a.masks[t0 + j] : all;
      for (int64_t c = 0; c < chunks; ++c) row[c] = LoadRowChunk<kBf16>(a.keys, r, d, c);
      for (int h = 0; h < g; ++h) {
        if (((mask >> h) & 1u) == 0) {
          x[h * kGroupTile + j] = neg_inf;
          continue;
        }
        const float* qh = a.q + h * d;
        V sum = Zero();
        for (int64_t c = 0; c < chunks; ++c) sum = Fma(LoadF32(qh + c * kLanes), row[c], sum);
        const float s = ReduceAdd(sum);
        float logit = a.scale * s;
        if (correct) {
          const float denom = a.q_norms[h] * a.key_norms[r];
          const float cos = denom > 0.0f ? s / denom : 0.0f;
          logit -= LookupLnU(a.lnu_table, a.lnu_size, cos);
        }
        x[h * kGroupTile + j] = logit;
      }
    }
    // Online softmax update per head; weights overwrite the logits (0 for rows a head skips).
    for (int h = 0; h < g; ++h) {
      float* xh = x + h * kGroupTile;
      float tile_max = neg_inf;
      for (int64_t j = 0; j < nt; ++j) tile_max = MaxF(tile_max, xh[j]);
      if (tile_max == neg_inf) {
        for (int64_t j = 0; j < nt; ++j) xh[j] = 0.0f;
        continue;
      }
      const float new_m = MaxF(m[h], tile_max);
      const float correction = FastExp(m[h] - new_m);
      float sum = 0.0f;
      if (a.masks == nullptr && nt == kGroupTile) {
        const V mv = Set1(new_m);
        V vs = Zero();
        for (int64_t j = 0; j < kGroupTile; j += kLanes) {
          const V p = ExpV(Sub(LoadF32(xh + j), mv));
          Store(xh + j, p);
          vs = Add(vs, p);
        }
        sum = ReduceAdd(vs);
      } else {
        for (int64_t j = 0; j < nt; ++j) {
          const float p = xh[j] == neg_inf ? 0.0f : FastExp(xh[j] - new_m);
          xh[j] = p;
          sum += p;
        }
      }
      l[h] = l[h] * correction + sum;
      m[h] = new_m;
      if (correction != 1.0f) {
        float* ah = acc + h * d;
        const V cv = Set1(correction);
        for (int64_t c = 0; c < chunks; ++c)
          Store(ah + c * kLanes, Mul(LoadF32(ah + c * kLanes), cv));
      }
    }
    // Values: each value row once, into every head that gave it weight.
    for (int64_t j = 0; j < nt; ++j) {
      const int64_t r = RowAt<kBf16>(a, t0 + j, a.values);
      for (int64_t c = 0; c < chunks; ++c) row[c] = LoadRowChunk<kBf16>(a.values, r, d, c);
      for (int h = 0; h < g; ++h) {
        const float p = x[h * kGroupTile + j];
        if (p == 0.0f) continue;
        const V pv = Set1(p);
        float* ah = acc + h * d;
        for (int64_t c = 0; c < chunks; ++c) {
          Store(ah + c * kLanes, Fma(pv, row[c], LoadF32(ah + c * kLanes)));
        }
      }
    }
  }
  for (int h = 0; h < g; ++h) {
    const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
    for (int64_t i = 0; i < d; ++i) a.o[h * d + i] = acc[h * d + i] * inv;
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
