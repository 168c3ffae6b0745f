// Private per-ISA entry points behind vec_kernels.h; plain pointers only (no intrinsic types), so
// baseline code can include it. Each set is defined in vec_kernels_<isa>.cc.
#ifndef MAGICPIG_COMMON_VEC_KERNELS_INTERNAL_H_
#define MAGICPIG_COMMON_VEC_KERNELS_INTERNAL_H_

#include <cstdint>

namespace magicpig::vec_internal {

float DotF32Avx2(const float* a, const float* b, int64_t n);
float DotF32F16Avx2(const float* a, const uint16_t* b, int64_t n);
void AxpyF32Avx2(float alpha, const float* x, float* y, int64_t n);
void AxpyF16Avx2(float alpha, const uint16_t* x, float* y, int64_t n);
void ConvertF32ToF16Avx2(const float* src, uint16_t* dst, int64_t n);
void ConvertF16ToF32Avx2(const uint16_t* src, float* dst, int64_t n);

float DotF32Avx512(const float* a, const float* b, int64_t n);
float DotF32F16Avx512(const float* a, const uint16_t* b, int64_t n);
void AxpyF32Avx512(float alpha, const float* x, float* y, int64_t n);
void AxpyF16Avx512(float alpha, const uint16_t* x, float* y, int64_t n);
void ConvertF32ToF16Avx512(const float* src, uint16_t* dst, int64_t n);
void ConvertF16ToF32Avx512(const uint16_t* src, float* dst, int64_t n);

}  // namespace magicpig::vec_internal

#endif  // MAGICPIG_COMMON_VEC_KERNELS_INTERNAL_H_
