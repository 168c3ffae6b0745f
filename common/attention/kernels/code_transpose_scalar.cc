// Portable build of the code transpose (x86-64 baseline; the reference for the AVX2 kernel).
#include "common/attention/kernels/code_transpose.h"

namespace magicpig::attention::internal {

uint32_t TransposeCodesScalar(const CodeTransposeArgs& a) {
  // Blocks of 32 keys: their rows stay in L1 while each table receives one 64-byte run.
  constexpr int64_t kBlock = 32;
  uint32_t seen = 0;
  for (int64_t i0 = a.begin; i0 < a.end; i0 += kBlock) {
    const int64_t i1 = i0 + kBlock < a.end ? i0 + kBlock : a.end;
    for (int64_t t = 0; t < a.l; ++t) {
      uint16_t* dst = a.by_table + t * a.n;
      for (int64_t i = i0; i < i1; ++i) {
        const uint16_t c = a.codes[i * a.l + t];
        dst[i] = c;
        seen |= c;
      }
    }
  }
  return seen;
}

}  // namespace magicpig::attention::internal
