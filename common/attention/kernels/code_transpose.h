// The first pass of an LSH table build (LshTables::Build): SimHash codes arrive key-major,
// [n][L] (one row of L table codes per key), and each table's counting sort wants its n codes
// contiguous. Transposing once to [L][n] lets the per-table passes stream instead of touching one
// cache line per key per table. The pass also ORs every code it moves, so the caller validates
// all codes (< 2^K) without a second read.
//
// Compiled per ISA: scalar (32-key blocks, element by element) and AVX2 (16 x 16 blocks of 16-bit
// codes transposed in registers: 16 loads and 16 stores of 32 bytes per 256 codes). The AVX-512
// level runs the AVX2 kernel: the pass is bound by memory, not by the width of the shuffles.
//
// Kernel units must not instantiate std templates; the caller provides all memory.
#ifndef MAGICPIG_COMMON_ATTENTION_KERNELS_CODE_TRANSPOSE_H_
#define MAGICPIG_COMMON_ATTENTION_KERNELS_CODE_TRANSPOSE_H_

#include <cstdint>

namespace magicpig::attention::internal {

struct CodeTransposeArgs {
  const uint16_t* codes = nullptr;  // [n][l], key-major
  int64_t n = 0;                    // keys in the whole array (the row count of by_table's rows)
  int64_t l = 0;                    // tables, >= 1
  int64_t begin = 0;                // the keys [begin, end) to move
  int64_t end = 0;
  uint16_t* by_table = nullptr;  // [l][n] out: by_table[t * n + i] = codes[i * l + t]
};

// Moves keys [begin, end) and returns the OR of every code moved.
uint32_t TransposeCodesScalar(const CodeTransposeArgs& args);
uint32_t TransposeCodesAvx2(const CodeTransposeArgs& args);

}  // namespace magicpig::attention::internal

#endif  // MAGICPIG_COMMON_ATTENTION_KERNELS_CODE_TRANSPOSE_H_
