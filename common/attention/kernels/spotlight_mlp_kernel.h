// The forward of one Spotlight hash MLP (spotlight_hash.h) over a block of rows, compiled once per
// ISA (spotlight_mlp_{scalar,avx2,avx512}.cc from spotlight_mlp_kernel-inl.h):
//
//   x' = in_scale * x;  a = W1 x' + b1;  h = x' + silu(a);  z = W2 h + b2;  bit j = z_j > 0
//
// as two fp32 register-blocked matrix products (FMA, accumulation over i = 0 ... d-1 in order)
// with silu(a) = a / (1 + exp(-a)) on the hidden layer in between (exp: the vec16 polynomial,
// relative error < 2e-7). The sign bits of each 16 outputs are one code word. Levels agree except
// where an output is within fp32 rounding of 0.
//
// Kernel units must not instantiate std templates; the caller provides all memory.
#ifndef MAGICPIG_COMMON_ATTENTION_KERNELS_SPOTLIGHT_MLP_KERNEL_H_
#define MAGICPIG_COMMON_ATTENTION_KERNELS_SPOTLIGHT_MLP_KERNEL_H_

#include <cstdint>

namespace magicpig::attention::internal {

// The hidden width and the output count are padded to a multiple of this (zero weights and biases).
inline constexpr int64_t kSpotlightColBlock = 32;

// Rounds up to a multiple of kSpotlightColBlock.
inline constexpr int64_t SpotlightPadded(int64_t cols) {
  return (cols + kSpotlightColBlock - 1) / kSpotlightColBlock * kSpotlightColBlock;
}

struct SpotlightMlpArgs {
  const float* x = nullptr;  // [n][d]
  int64_t n = 0;
  int64_t d = 0;
  int64_t bits = 0;  // a multiple of 16
  float in_scale = 1.0f;
  // W1 transposed: w1t[i * SpotlightPadded(d) + j] = W1[j][i] (j < d; 0 beyond), b1 likewise
  // padded; W2 transposed: w2t[i * SpotlightPadded(bits) + j] = W2[j][i], b2 padded.
  const float* w1t = nullptr;  // [d][SpotlightPadded(d)]
  const float* b1 = nullptr;   // [SpotlightPadded(d)]
  const float* w2t = nullptr;  // [d][SpotlightPadded(bits)]
  const float* b2 = nullptr;   // [SpotlightPadded(bits)]
  // Scratch, [n][SpotlightPadded(d)] each: x' and h.
  float* scaled = nullptr;
  float* hidden = nullptr;
  // Outputs, either may be null: z [n][bits] and the codes [n][bits / 16] (bit j in word j / 16 at
  // position j % 16, 1 iff z_j > 0; strict, NaN gives 0).
  float* z = nullptr;
  uint16_t* codes = nullptr;
};

void SpotlightMlpScalar(const SpotlightMlpArgs& args);
void SpotlightMlpAvx2(const SpotlightMlpArgs& args);
void SpotlightMlpAvx512(const SpotlightMlpArgs& args);

}  // namespace magicpig::attention::internal

#endif  // MAGICPIG_COMMON_ATTENTION_KERNELS_SPOTLIGHT_MLP_KERNEL_H_
