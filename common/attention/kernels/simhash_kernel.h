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

// The same projection of bf16 vectors against a bf16 W, for CPUs with AVX512_BF16 (vdpbf16ps adds
// two exact bf16 x bf16 products to each fp32 lane per instruction: twice the fp32 FMA kernel's
// rate). Every product is exact in fp32, so the signs agree with the fp32 kernel on the same
// values except within accumulation rounding of 0 (the instruction also treats bf16 subnormals as
// zero). Layouts, with d2 = d rounded up to even (a zero element pads an odd d):
struct ProjectBf16Args {
  const uint16_t* x = nullptr;  // [n][d2] bf16 bits
  int64_t n = 0;
  int64_t d2 = 0;
  const uint16_t* w = nullptr;  // [d2 / 2][cols][2] bf16 bits: W[2p][j], W[2p + 1][j] adjacent
  int64_t cols = 0;             // a multiple of kProjectColBlock
  int64_t col_begin = 0;        // as in ProjectArgs
  int64_t col_end = 0;
  uint16_t* bits = nullptr;  // as in ProjectArgs
  int64_t bits_stride = 0;
};

// Only where CpuHasAvx512Bf16().
void ProjectBf16Avx512(const ProjectBf16Args& args);

}  // namespace magicpig::attention::internal

#endif  // MAGICPIG_COMMON_ATTENTION_KERNELS_SIMHASH_KERNEL_H_
