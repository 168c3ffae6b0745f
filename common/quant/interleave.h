// The 16-row interleaved layout of Q4_K, Q6_K, Q4_1 and Q8_0 matrices, read by the AVX-512 kernels
// of matmul_kquant_rows16_avx512.cc (K-quants) and matmul_block32_rows16_avx512.cc (Q4_1, Q8_0).
//
// Why: a row-major K-quant kernel spends most of its vector instructions per row on work that does
// not multiply (scales, minima, float conversion, the horizontal sum). With 16 rows interleaved,
// one 512-bit register holds 4 weights of each of 16 rows, a vpdpbusd against 4 broadcast
// activation bytes does 64 multiply-adds for 16 rows at once, and every per-row step (scales,
// minima, d, the float accumulation) is done once for 16 rows.
//
// The layout is lossless and the same size as the file's (144 / 210 / 20 / 34 bytes per row and
// block), so a matrix is converted in place, one group of 16 rows at a time (a group occupies the
// same 16 * row_bytes byte range in both layouts). A block is a 256-value super-block for the
// K-quants and a 32-value block for Q4_1 and Q8_0. Group g, block sb starts at
// data + g * 16 * row_bytes + sb * 16 * block_bytes; r is the row within the group.
//
// Q4_K (2,304 bytes per group and super-block; sub-block s = values 32 s..32 s + 31):
//   [0, 32)      d of rows 0..15 (fp16)
//   [32, 64)     dmin of rows 0..15 (fp16)
//   [64, 192)    byte 16 s + r: low 4 bits of scale s of row r | low 4 bits of min s << 4
//   [192, 256)   byte 16 q + r: bits 4-5 of scale 2q, of min 2q, of scale 2q + 1, of min 2q + 1 of
//                row r, two bits each from bit 0 up
//   [256, 2304)  chunk (p, g) at 256 + 64 (8 p + g), p = 0..3, g = 0..7: byte 4 r + i =
//                value 4g + i of sub-block 2p of row r | the same value of sub-block 2p + 1 << 4
//                (= byte 32 p + 4 g + i of the row's file quants)
// Q6_K (3,360 bytes; sub-block j = values 16 j..16 j + 15, quant q = 0..63, value d sc_j (q - 32)):
//   [0, 32)      d of rows 0..15 (fp16)
//   [32, 288)    byte 16 j + r: scale j of row r (int8)
//   [288 + 192 j, + 192)  sub-block j of the 16 rows: three 64-byte chunks L0, L1, H; with
//                v(k) = quant 16 j + 4 k + i of row r, byte 4 r + i (i = 0..3) of L0 holds
//                low4(v(0)) | low4(v(1)) << 4, of L1 low4(v(2)) | low4(v(3)) << 4, of H the top
//                two bits of v(0), v(1), v(2), v(3), two bits each from bit 0 up
// Q4_1 (320 bytes per group and block; file block: d, m (fp16), qs[16] with value l in the low
// nibble of qs[l] and value 16 + l in its high nibble):
//   [0, 32)      d of rows 0..15 (fp16)
//   [32, 64)     m of rows 0..15 (fp16)
//   [64 + 64 k, + 64)  chunk k = 0..3: byte 4 r + i = qs[4 k + i] of row r (values 4 k + i and
//                16 + 4 k + i)
// Q8_0 (544 bytes per group and block; file block: d (fp16), qs[32] int8):
//   [0, 32)      d of rows 0..15 (fp16)
//   [32 + 64 k, + 64)  chunk k = 0..7: byte 4 r + i = qs[4 k + i] of row r plus 128 (XOR 0x80:
//                the unsigned operand vpdpbusd takes; the kernel subtracts 128 x the activations'
//                sum)
#ifndef MAGICPIG_COMMON_QUANT_INTERLEAVE_H_
#define MAGICPIG_COMMON_QUANT_INTERLEAVE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/quant/ggml_type.h"

namespace magicpig {

// How a QuantMatrix's bytes are laid out.
enum class WeightLayout {
  kRowMajor,  // the GGUF layout: row r at data + r * GgmlRowBytes(type, cols)
  kRows16,    // Q4_K, Q6_K, Q4_1 or Q8_0, rows % 16 == 0: the 16-row interleaved layout above
};

inline constexpr int64_t kInterleaveRows = 16;

// True when a matrix of this type and shape can be stored as kRows16.
bool CanInterleave(GgmlType type, int64_t rows, int64_t cols);

// Converts rows x cols bytes at data from kRowMajor to kRows16 in place (in parallel over groups).
// INVALID_ARGUMENT if !CanInterleave(type, rows, cols).
absl::Status Interleave(GgmlType type, uint8_t* data, int64_t rows, int64_t cols);

// Writes row `row` of a kRows16 matrix in the file's layout (GgmlRowBytes(type, cols) bytes, bit
// for bit what Interleave read). type and shape must satisfy CanInterleave.
void DeinterleaveRow(GgmlType type, const uint8_t* data, int64_t cols, int64_t row, uint8_t* out);

}  // namespace magicpig

#endif  // MAGICPIG_COMMON_QUANT_INTERLEAVE_H_
