// Private interface between the MatMul dispatcher (matmul.cc, baseline ISA) and the per-ISA kernel
// translation units (matmul_scalar.cc, matmul_avx2.cc, matmul_avx512.cc).
//
// Only plain pointers and integers cross this boundary: intrinsic types must never appear in a
// header that baseline code includes, or the baseline objects could pick up wider instructions.
#ifndef MAGICPIG_COMMON_QUANT_MATMUL_KERNELS_H_
#define MAGICPIG_COMMON_QUANT_MATMUL_KERNELS_H_

#include <cstdint>

#include "common/quant/ggml_type.h"

namespace magicpig::quant_internal {

// Activations quantised to 8 bits per block of kActBlock values (the Q8_1 idea of llama.cpp, in
// our own layout): value ~= d * q, with q in [-127, 127].
inline constexpr int64_t kActBlock = 32;
// Block scales are stored replicated this many times so a SIMD kernel loads a ready scale vector.
inline constexpr int64_t kScaleRepeat = 8;

// Byte geometry of the integer weight blocks (ggml-common.h): block size, offset of the
// packed quants, offset of Q5's high-bit word. Plain constants, shared by every ISA unit.
template <GgmlType T>
struct Block;
template <>
struct Block<GgmlType::kQ4_0> {
  static constexpr int kBytes = 18, kQs = 2;
};
template <>
struct Block<GgmlType::kQ4_1> {
  static constexpr int kBytes = 20, kQs = 4;
};
template <>
struct Block<GgmlType::kQ5_0> {
  static constexpr int kBytes = 22, kQs = 6, kQh = 2;
};
template <>
struct Block<GgmlType::kQ5_1> {
  static constexpr int kBytes = 24, kQs = 8, kQh = 4;
};
template <>
struct Block<GgmlType::kQ8_0> {
  static constexpr int kBytes = 34, kQs = 2;
};
// The 256-value K-quant super-blocks (their inner layout is decoded in matmul_kquant_*.cc).
template <>
struct Block<GgmlType::kQ4_K> {
  static constexpr int kBytes = 144;
};
template <>
struct Block<GgmlType::kQ5_K> {
  static constexpr int kBytes = 176;
};
template <>
struct Block<GgmlType::kQ6_K> {
  static constexpr int kBytes = 210;
};

// The AVX-512 kernels read the quantised activations in their own layout, built by
// QuantizeActivationRowAvx512 (values identical to QuantizeActivationRow, only rearranged), so
// that one 512-bit register holds 16 values of each of 4 consecutive blocks and a vpdpbusd lane
// never mixes blocks. Per token, blocks are grouped by 4 (the last group zero-padded):
//   q: per group 128 bytes: values 0..15 of blocks 4g..4g+3, then values 16..31 of the same.
//   d: per group 16 floats: the scale of block 4g+j in floats 4j..4j+3.
//   s: one float per block, zero-padded to a multiple of 16 blocks.
inline constexpr int64_t Avx512Groups(int64_t cols) { return (cols / kActBlock + 3) / 4; }
inline constexpr int64_t Avx512QStride(int64_t cols) { return Avx512Groups(cols) * 128; }
inline constexpr int64_t Avx512DStride(int64_t cols) { return Avx512Groups(cols) * 16; }
inline constexpr int64_t Avx512SStride(int64_t cols) { return (cols / kActBlock + 15) / 16 * 16; }

// K-quant weights (Q4_K, Q5_K, Q6_K: 256-value super-blocks with integer sub-block scales) are
// multiplied against activations quantised per super-block, the Q8_K idea of llama.cpp in our own
// layout: value ~= d * q with q in [-127, 127], one float d per super-block, and the int16 sum of
// q over each 16 values (for the weights' minima and offsets). One activation scale per super-block
// lets every sub-block's scale be applied in integers (vpmaddwd), leaving one float multiply per
// super-block.
inline constexpr int64_t kSuperBlock = 256;
inline constexpr int64_t kBsumsPerSuperBlock = kSuperBlock / 16;

// Order of the 8 32-value sub-blocks of a super-block in the quantised activations (and of their
// bsums). kNatural keeps them in value order; kPairedNibbles is the order in which the AVX-512
// Q4_K/Q5_K kernels unpack 64 bytes of packed nibbles into two registers without shuffles
// (low nibbles hold sub-blocks 0 and 2, high nibbles 1 and 3, and so on): slot p holds sub-block
// kPairedNibbleOrder[p].
enum class KActOrder { kNatural, kPairedNibbles };
inline constexpr int kPairedNibbleOrder[8] = {0, 2, 1, 3, 4, 6, 5, 7};

// The order the K-quant kernels of type `type` read: those of AVX-512 (avx512) or the others.
KActOrder KActOrderFor(GgmlType type, bool avx512);

// Quantises one token (cols a multiple of kSuperBlock): q[cols] in `order`, d[cols / 256],
// bsums[cols / 16] (sums of q over each 16 consecutive stored values).
void QuantizeActivationRowK(const float* x, int64_t cols, KActOrder order, int8_t* q, float* d,
                            int16_t* bsums);

// True for Q4_K, Q5_K and Q6_K, whose kernels use the super-block activations.
bool IsKQuant(GgmlType type);

struct MatMulArgs {
  GgmlType type = GgmlType::kF32;
  const uint8_t* w = nullptr;  // row r at w + r * row_bytes
  int64_t row_bytes = 0;
  int64_t cols = 0;
  int64_t n_tokens = 0;
  // Float activations, token t at x + t * ldx (used by float and K-quant types).
  const float* x = nullptr;
  int64_t ldx = 0;
  // Quantised activations (used by 32-block integer types); nb = cols / kActBlock.
  // Scalar/AVX2 layout below; the AVX-512 kernels use the Avx512* layout above, token t at
  // xq + t * Avx512QStride(cols) etc.
  const int8_t* xq = nullptr;  // token t at xq + t * cols
  const float* xd = nullptr;   // scale of token t block b at xd + ((t * nb) + b) * kScaleRepeat
  const float* xs = nullptr;   // d * sum(q) of token t block b at xs + t * nb + b
  // Super-block activations (K-quant types), nsb = cols / kSuperBlock: token t at kq + t * cols,
  // kd + t * nsb and kbs + t * nsb * kBsumsPerSuperBlock.
  const int8_t* kq = nullptr;
  const float* kd = nullptr;
  const int16_t* kbs = nullptr;
  float* y = nullptr;  // y[t * ldy + r]
  int64_t ldy = 0;
};

// Quantises one token's activations (cols a multiple of kActBlock): per block, d = max|x| / 127,
// q = round(x / d); writes q[cols], d replicated kScaleRepeat times per block, and s = d * sum(q).
void QuantizeActivationRow(const float* x, int64_t cols, int8_t* q, float* d_rep, float* s);

// The same quantisation (bit-identical q, d and s) written in the AVX-512 layout; q, d and s
// receive Avx512QStride/DStride/SStride(cols) elements. Defined in matmul_avx512.cc.
void QuantizeActivationRowAvx512(const float* x, int64_t cols, int8_t* q, float* d, float* s);

// True for the types whose kernels use the quantised activations (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0).
bool UsesQuantizedActivations(GgmlType type);

// Each computes y for rows [row_begin, row_end) and all tokens. The type must be supported and
// the arguments validated by the caller.
void MatMulRowsScalar(const MatMulArgs& args, int64_t row_begin, int64_t row_end);
void MatMulRowsAvx2(const MatMulArgs& args, int64_t row_begin, int64_t row_end);
// use_vnni: the CPU has AVX512-VNNI (vpdpbusd); otherwise vpmaddubsw/vpmaddwd are used.
void MatMulRowsAvx512(const MatMulArgs& args, int64_t row_begin, int64_t row_end, bool use_vnni);
// The K-quant kernels those two call (matmul_kquant_avx2.cc, matmul_kquant_avx512.cc).
void KQuantRowsAvx2(const MatMulArgs& args, int64_t row_begin, int64_t row_end);
void KQuantRowsAvx512(const MatMulArgs& args, int64_t row_begin, int64_t row_end, bool use_vnni);
// Q4_K or Q6_K in the 16-row interleaved layout (interleave.h; row_begin, row_end multiples of
// 16), activations in KActOrder::kNatural (matmul_kquant_rows16_avx512.cc).
void KQuantRows16Avx512(const MatMulArgs& args, int64_t row_begin, int64_t row_end, bool use_vnni);
// Q4_1 or Q8_0 in the 16-row interleaved layout (row_begin, row_end multiples of 16), activations
// in the AVX-512 layout above (matmul_block32_rows16_avx512.cc).
void Block32Rows16Avx512(const MatMulArgs& args, int64_t row_begin, int64_t row_end, bool use_vnni);

}  // namespace magicpig::quant_internal

#endif  // MAGICPIG_COMMON_QUANT_MATMUL_KERNELS_H_
