// SimHash projections of a block of vectors, reduced to their sign bits: the GEMM inside
// SimHash::Codes, compiled once per ISA (simhash_{scalar,avx2,avx512}.cc from
// simhash_kernel-inl.h). fp32 accumulation in a fixed order (i = 0 ... d-1 per output), so every
// level gives the same signs except where a projection is within rounding of 0 (reference spec
// §12.10: harmless, but sample sets are then compared only at one precision).
//
// Kernel units must not instantiate std templates; the caller provides all memory.
#ifndef MAGICPIG_COMMON_ATTENTION_KERNELS_SIMHASH_KERNEL_H_
#define MAGICPIG_COMMON_ATTENTION_KERNELS_SIMHASH_KERNEL_H_

#include <cstdint>

namespace magicpig::attention::internal {

inline constexpr int64_t kProjectColBlock = 32;  // W's columns are padded to a multiple of this

struct ProjectArgs {
  const float* x = nullptr;  // [n][d]
  int64_t n = 0;
  int64_t d = 0;
  const float* w = nullptr;  // [d][cols], cols a multiple of kProjectColBlock
  int64_t cols = 0;
  // Only columns [col_begin, col_end) are projected (multiples of kProjectColBlock; col_end <= 0
  // means cols): a few vectors' columns can be split over threads.
  int64_t col_begin = 0;
  int64_t col_end = 0;
  // Out: vector v's sign bits start at bits + v * bits_stride (bits_stride >= cols / 16): word
  // j / 16, bit j % 16 is 1 iff x_v . W[:, j] > 0 (strict). Only the words of [col_begin, col_end)
  // are written.
  uint16_t* bits = nullptr;
  int64_t bits_stride = 0;
};

void ProjectScalar(const ProjectArgs& args);
void ProjectAvx2(const ProjectArgs& args);
void ProjectAvx512(const ProjectArgs& args);

}  // namespace magicpig::attention::internal

#endif  // MAGICPIG_COMMON_ATTENTION_KERNELS_SIMHASH_KERNEL_H_
