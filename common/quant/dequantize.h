// Scalar reference dequantisation of ggml blocks to float32.
//
// This is the readable, obviously-correct path (one function per type, following the block layouts
// of ggml-common.h). Fast kernels (matmul.h) are tested against it.
#ifndef MAGICPIG_COMMON_QUANT_DEQUANTIZE_H_
#define MAGICPIG_COMMON_QUANT_DEQUANTIZE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/quant/ggml_type.h"

namespace magicpig {

// Dequantises n values (n a multiple of the type's block size) from `src` into `dst`.
// INVALID_ARGUMENT for unsupported types or n not a multiple of the block size.
absl::Status DequantizeRow(GgmlType type, const void* src, float* dst, int64_t n);

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K super-block, from its 12 packed
// scale bytes (ggml's layout: bytes 0-3 scales 0-3, 4-7 mins 0-3, 8-11 the low nibbles of scales
// and mins 4-7, whose top two bits sit in bits 6-7 of bytes 0-7).
void KScaleMin(const uint8_t* scales, int j, int* sc, int* mn);

}  // namespace magicpig

#endif  // MAGICPIG_COMMON_QUANT_DEQUANTIZE_H_
