// Small float32 vector kernels with run-time SIMD dispatch, for attention over the KV cache.
//
// Keys and values are stored either as float32 or as IEEE fp16 (uint16_t bits). Each function
// takes the SimdLevel chosen once by the caller for the whole batch (see cpu_features.h).
#ifndef MAGICPIG_COMMON_VEC_KERNELS_H_
#define MAGICPIG_COMMON_VEC_KERNELS_H_

#include <cstdint>

#include "common/cpu_features.h"

namespace magicpig {

// sum_i a[i] * b[i]
float DotF32(const float* a, const float* b, int64_t n, SimdLevel level);
// sum_i a[i] * fp16(b[i])
float DotF32F16(const float* a, const uint16_t* b, int64_t n, SimdLevel level);
// y[i] += alpha * x[i]
void AxpyF32(float alpha, const float* x, float* y, int64_t n, SimdLevel level);
// y[i] += alpha * fp16(x[i])
void AxpyF16(float alpha, const uint16_t* x, float* y, int64_t n, SimdLevel level);
// dst[i] = fp16(src[i]) (round to nearest even)
void ConvertF32ToF16(const float* src, uint16_t* dst, int64_t n, SimdLevel level);
// dst[i] = float(src[i]) (exact; what Fp16ToFloat gives, except that a signalling NaN may come
// back quiet)
void ConvertF16ToF32(const uint16_t* src, float* dst, int64_t n, SimdLevel level);

}  // namespace magicpig

#endif  // MAGICPIG_COMMON_VEC_KERNELS_H_
