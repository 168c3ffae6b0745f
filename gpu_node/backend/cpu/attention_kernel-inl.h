// Template body of the attention tile kernel; included once per ISA translation unit, after that
// unit brings one of common/simd/vec16_<isa>-inl.h's vector namespaces into
// magicpig::backend::cpu_internal::MAGICPIG_ATTN_NS (V, kLanes == 16, loads, Fma, ExpV,
// FastExp...).
//
// Online softmax (flash-attention style) over key tiles of kKeyTile rows: no n² buffer. Each key
// and value row is converted from fp16 once per tile and used by every query row of the item (all
// heads of the GQA group x all tokens of the query tile). head_dim must be a multiple of 16 and <=
// 256.
#include <cstdint>
#include <cstring>

#include "gpu_node/backend/cpu/attention_kernel.h"

namespace magicpig::backend::cpu_internal {
namespace MAGICPIG_ATTN_NS {

constexpr int64_t kKeyTile = 32;
constexpr int64_t kMaxChunks = 16;  // head_dim <= 256

inline int64_t Min(int64_t a, int64_t b) { return a < b ? a : b; }

// kChunks = head_dim / 16 when known at compile time (the loops over a row then unroll and the
// converted key/value row stays in registers), or 0 for any multiple of 16 read at run time.
template <int kChunks>
void RunTileImpl(const AttentionTile& a) {
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
  // Keys [key_begin, key_end) of the sequence; key_end <= 0 means "through last_pos".
  const int64_t key_end = a.key_end > 0 ? Min(a.key_end, last_pos + 1) : last_pos + 1;
  V row[kMaxChunks];
  for (int64_t k0 = a.key_begin; k0 < key_end; k0 += kKeyTile) {
    const int64_t nk = Min(kKeyTile, key_end - k0);
    // Rows whose position is < k0 see nothing of this tile; rows are ordered by position.
    const int64_t first_row = k0 > first_row_pos ? (k0 - first_row_pos) * group : 0;
    // Scores: one converted key row against every query row.
    for (int64_t j = 0; j < nk; ++j) {
      const uint16_t* kj = a.k + (k0 + j) * kv_stride + a.kv_head * hd;
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
    // Values: one converted value row into every query row's accumulator.
    for (int64_t j = 0; j < nk; ++j) {
      const uint16_t* vj = a.v + (k0 + j) * kv_stride + a.kv_head * hd;
      for (int64_t c = 0; c < chunks; ++c) row[c] = LoadF16(vj + c * kLanes);
      for (int64_t r = first_row; r < n_rows; ++r) {
        const float p = s[r * kKeyTile + j];
        if (p == 0.0f) continue;
        const V pv = Set1(p);
        float* ar = acc + r * hd;
        for (int64_t c = 0; c < chunks; ++c) {
          Store(ar + c * kLanes, Fma(pv, row[c], LoadF32(ar + c * kLanes)));
        }
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

void RunTile(const AttentionTile& a) {
  switch (a.head_dim / kLanes) {
    case 2:
      return RunTileImpl<2>(a);
    case 4:
      return RunTileImpl<4>(a);
    case 8:
      return RunTileImpl<8>(a);
    default:
      return RunTileImpl<0>(a);
  }
}

}  // namespace MAGICPIG_ATTN_NS
}  // namespace magicpig::backend::cpu_internal
