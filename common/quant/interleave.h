// The 16-row interleaved layout of Q4_K matrices, read by the AVX-512 kernels of
// matmul_q4k_rows16_avx512.cc.
//
// Why: a row-major Q4_K kernel spends most of its vector instructions per row on work that does
// not multiply (scales, minima, float conversion, the horizontal sum). With 16 rows interleaved,
// one 512-bit register holds 4 weights of each of 16 rows, a vpdpbusd against 4 broadcast
// activation bytes does 64 multiply-adds for 16 rows at once, and every per-row step (scales,
// minima, d, the float accumulation) is done once for 16 rows.
//
// The layout is lossless and the same size as the file's (144 bytes per row and super-block), so
// a matrix is converted in place, one group of 16 rows at a time (a group occupies the same
// 16 * row_bytes byte range in both layouts). Group g, super-block sb, at
// data + g * 16 * row_bytes + sb * 2304:
//   [0, 32)      d of rows 0..15 (fp16)
//   [32, 64)     dmin of rows 0..15 (fp16)
//   [64, 192)    byte 16 s + r: low 4 bits of scale s of row r | low 4 bits of min s << 4
//   [192, 256)   byte 16 q + r: bits 4-5 of scale 2q, of min 2q, of scale 2q + 1, of min 2q + 1 of
//                row r, two bits each from bit 0 up
//   [256, 2304)  chunk (p, g) at 256 + 64 (8 p + g), p = 0..3, g = 0..7: byte 4 r + i =
//                value 4g + i of sub-block 2p of row r | the same value of sub-block 2p + 1 << 4
//                (= byte 32 p + 4 g + i of the row's file quants)
// (sub-block s = values 32 s..32 s + 31 of the super-block; scale s and min s are its 6-bit ones).
#ifndef MAGICPIG_COMMON_QUANT_INTERLEAVE_H_
#define MAGICPIG_COMMON_QUANT_INTERLEAVE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/quant/ggml_type.h"

namespace magicpig {

// How a QuantMatrix's bytes are laid out.
enum class WeightLayout {
  kRowMajor,       // the GGUF layout: row r at data + r * GgmlRowBytes(type, cols)
  kQ4KRows16,      // Q4_K only, rows % 16 == 0: the 16-row interleaved layout above
};

inline constexpr int64_t kInterleaveRows = 16;

// True when a matrix of this type and shape can be stored as kQ4KRows16.
bool CanInterleaveQ4K(GgmlType type, int64_t rows, int64_t cols);

// Converts rows x cols Q4_K bytes at data from kRowMajor to kQ4KRows16 in place.
// INVALID_ARGUMENT if !CanInterleaveQ4K(type, rows, cols).
absl::Status InterleaveQ4K(GgmlType type, uint8_t* data, int64_t rows, int64_t cols);

// Writes row `row` of a kQ4KRows16 matrix in the file's layout (GgmlRowBytes(kQ4_K, cols) bytes,
// bit for bit what InterleaveQ4K read).
void DeinterleaveQ4KRow(const uint8_t* data, int64_t cols, int64_t row, uint8_t* out);

}  // namespace magicpig

#endif  // MAGICPIG_COMMON_QUANT_INTERLEAVE_H_
