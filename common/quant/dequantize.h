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

}  // namespace magicpig

#endif  // MAGICPIG_COMMON_QUANT_DEQUANTIZE_H_
