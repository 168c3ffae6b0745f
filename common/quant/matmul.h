// Matrix products of quantised weight matrices with float32 activations (CPU, SIMD dispatched).
//
// Weights stay in their GGUF block format (no fp32 copy). A weight matrix has `rows` rows of `cols`
// values; row r starts at data + r * GgmlRowBytes(type, cols) (GGUF stores a linear layer [in, out]
// with dims[0] = in = cols contiguous, so each stored row is one output neuron).
//
//   y[t * ldy + r] = sum_k W[r][k] * x[t * ldx + k]    for t < n_tokens, r < rows
//
// Decode calls it with n_tokens = 1 (a matrix-vector product, memory bound); prefill with many
// tokens, where rows of W are reused across a block of tokens. Integer-quantised types quantise the
// activations to 8 bits per 32-value block internally (as llama.cpp does), so results differ from
// the float64 product by that rounding; float types (F32, F16, BF16) are computed in float32.
//
// Batch invariance: every token's y is bit-identical whatever n_tokens it is computed with (at
// every SIMD level), so a sequence's decoded tokens do not depend on which other sequences share
// its batch, nor on how a prefill is cut into chunks.
//
// Parallelism: splits rows over oneTBB tasks; run it inside a tbb::task_arena to bound threads.
// Thread-safety: reentrant; scratch buffers are per call.
#ifndef MAGICPIG_COMMON_QUANT_MATMUL_H_
#define MAGICPIG_COMMON_QUANT_MATMUL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/cpu_features.h"
#include "common/quant/ggml_type.h"
#include "common/quant/interleave.h"

namespace magicpig {

struct QuantMatrix {
  GgmlType type = GgmlType::kF32;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;  // multiple of the type's block size
  // kRows16 (interleave.h) is read by the AVX-512 kernels only: MatMul at a lower level is
  // INVALID_ARGUMENT. GetRow and MatMulFloatActivations read both layouts.
  WeightLayout layout = WeightLayout::kRowMajor;
};

// OK when w can be multiplied and read: a supported type, a shape of whole blocks, data for its
// rows, and a layout its type and shape allow; else INVALID_ARGUMENT naming the problem. MatMul,
// MatMulFloatActivations and GetRow check with it.
absl::Status CheckMatrix(const QuantMatrix& w);

// INVALID_ARGUMENT for unsupported types or inconsistent shapes.
absl::Status MatMul(const QuantMatrix& w, const float* x, int64_t ldx, int64_t n_tokens, float* y,
                    int64_t ldy, SimdLevel level = ActiveSimdLevel());

// The same product with float32 activations for every type: each weight row is dequantised once
// per call and dotted with every token in float32. Several times slower than MatMul for integer
// types; it exists so the engine's arithmetic can be checked against a float64 reference without
// the 8-bit activation rounding (whose noise makes long greedy runs diverge on near-ties).
absl::Status MatMulFloatActivations(const QuantMatrix& w, const float* x, int64_t ldx,
                                    int64_t n_tokens, float* y, int64_t ldy,
                                    SimdLevel level = ActiveSimdLevel());

// Copies row `row` of w, dequantised, into dst[0..cols) (embedding lookup).
absl::Status GetRow(const QuantMatrix& w, int64_t row, float* dst);

}  // namespace magicpig

#endif  // MAGICPIG_COMMON_QUANT_MATMUL_H_
