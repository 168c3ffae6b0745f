// Helpers shared by the AVX-512 kernels of the 16-row interleaved layout
// (matmul_kquant_rows16_avx512.cc, matmul_block32_rows16_avx512.cc): lane r of a register is row
// r of a group. Included inside each unit's anonymous namespace after <immintrin.h>, <cstring> and
// <type_traits>; only units compiled with the AVX-512 flags include it. Brings the per-ISA token
// helpers (matmul_isa_common-inl.h) with kMaxTokens = 4 tokens per unpacked group.
// No include guard: included once per translation unit.

constexpr int kMaxTokens = 4;

#include "common/quant/matmul_isa_common-inl.h"  // NOLINT(build/include): per-ISA copy

// acc + the exact int32 dot of 4 unsigned weights with 4 signed activations per lane. Without
// VNNI, vpmaddubsw's pair sums saturate at 2^15: the weights must keep 2 x w x 127 below it (Q4_K
// and Q4_1: 2 x 15 x 127; Q6_K: 2 x 63 x 127).
template <bool kVnni>
inline __attribute__((always_inline)) __m512i Dot4(__m512i acc, __m512i w, __m512i x) {
  if constexpr (kVnni) {
    return _mm512_dpbusd_epi32(acc, w, x);
  } else {
    return _mm512_add_epi32(acc,
                            _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), _mm512_set1_epi16(1)));
  }
}

// The 4 bytes at p in every 32-bit lane.
inline __attribute__((always_inline)) __m512i Broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return _mm512_set1_epi32(v);
}

// Calls fn(base, r, t, nt) for every group of 16 rows in [r0, r1) (base: its bytes, which are its
// rows' byte range in either layout) and every chunk of tokens [t, t + nt) (nt a compile-time
// std::integral_constant, ForTokenChunks), token blocks outermost so their activations stay in
// cache while the groups pass over them.
template <typename GroupFn>
void ForGroupsAndTokens(const MatMulArgs& a, int64_t r0, int64_t r1, GroupFn fn) {
  ForTokenBlocks(a.n_tokens, [&](int64_t tb, int64_t te) {
    for (int64_t r = r0; r < r1; r += kInterleaveRows) {
      const uint8_t* base = a.w + r * a.row_bytes;
      ForTokenChunks(tb, te, [&](int64_t t, auto nt) { fn(base, r, t, nt); });
    }
  });
}
