// Dispatch for vec_kernels.h plus the portable scalar versions (baseline ISA). The caller picks
// the level once per batch; a level above the CPU's is clamped so it can never fault.
#include "common/vec_kernels.h"

#include "common/half.h"
#include "common/vec_kernels_internal.h"

namespace magicpig {

float DotF32(const float* a, const float* b, int64_t n, SimdLevel level) {
  switch (ClampToDetected(level)) {
    case SimdLevel::kAvx512:
      return vec_internal::DotF32Avx512(a, b, n);
    case SimdLevel::kAvx2:
      return vec_internal::DotF32Avx2(a, b, n);
    case SimdLevel::kScalar:
      break;
  }
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

float DotF32F16(const float* a, const uint16_t* b, int64_t n, SimdLevel level) {
  switch (ClampToDetected(level)) {
    case SimdLevel::kAvx512:
      return vec_internal::DotF32F16Avx512(a, b, n);
    case SimdLevel::kAvx2:
      return vec_internal::DotF32F16Avx2(a, b, n);
    case SimdLevel::kScalar:
      break;
  }
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * Fp16ToFloat(b[i]);
  return sum;
}

void AxpyF32(float alpha, const float* x, float* y, int64_t n, SimdLevel level) {
  switch (ClampToDetected(level)) {
    case SimdLevel::kAvx512:
      return vec_internal::AxpyF32Avx512(alpha, x, y, n);
    case SimdLevel::kAvx2:
      return vec_internal::AxpyF32Avx2(alpha, x, y, n);
    case SimdLevel::kScalar:
      break;
  }
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

void AxpyF16(float alpha, const uint16_t* x, float* y, int64_t n, SimdLevel level) {
  switch (ClampToDetected(level)) {
    case SimdLevel::kAvx512:
      return vec_internal::AxpyF16Avx512(alpha, x, y, n);
    case SimdLevel::kAvx2:
      return vec_internal::AxpyF16Avx2(alpha, x, y, n);
    case SimdLevel::kScalar:
      break;
  }
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * Fp16ToFloat(x[i]);
}

void ConvertF32ToF16(const float* src, uint16_t* dst, int64_t n, SimdLevel level) {
  switch (ClampToDetected(level)) {
    case SimdLevel::kAvx512:
      return vec_internal::ConvertF32ToF16Avx512(src, dst, n);
    case SimdLevel::kAvx2:
      return vec_internal::ConvertF32ToF16Avx2(src, dst, n);
    case SimdLevel::kScalar:
      break;
  }
  for (int64_t i = 0; i < n; ++i) dst[i] = FloatToFp16(src[i]);
}

void ConvertF16ToF32(const uint16_t* src, float* dst, int64_t n, SimdLevel level) {
  switch (ClampToDetected(level)) {
    case SimdLevel::kAvx512:
      return vec_internal::ConvertF16ToF32Avx512(src, dst, n);
    case SimdLevel::kAvx2:
      return vec_internal::ConvertF16ToF32Avx2(src, dst, n);
    case SimdLevel::kScalar:
      break;
  }
  for (int64_t i = 0; i < n; ++i) dst[i] = Fp16ToFloat(src[i]);
}

}  // namespace magicpig
