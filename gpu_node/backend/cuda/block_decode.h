// Decoding of ggml weight blocks, shared by the CUDA kernels and the host.
//
// One function per GGUF type the engine reads, written so that nvcc compiles it for the device
// and g++ for the host: the host test (block_decode_test) checks it bit for bit against the
// reference dequantisation (common/quant/dequantize.cc), and the device runs the same code.
// Products and sums use round-to-nearest operations that the compiler may not fuse into FMAs
// (Mul/Add below), so the device's values equal the host reference's exactly.
//
// Bytes are read one at a time: GGUF blocks are not aligned for wider loads (a Q5_0 block's
// 32-bit mask sits at byte 2 of a 22-byte block), and a misaligned wide load faults on a GPU.
#ifndef MAGICPIG_GPU_NODE_BACKEND_CUDA_BLOCK_DECODE_H_
#define MAGICPIG_GPU_NODE_BACKEND_CUDA_BLOCK_DECODE_H_

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MAGICPIG_HD __host__ __device__ __forceinline__
#else
#define MAGICPIG_HD inline
#endif

namespace magicpig::backend::cuda_internal {

// ggml type codes (common/quant/ggml_type.h) of the types decoded here.
enum BlockType : int {
  kBlockF32 = 0,
  kBlockF16 = 1,
  kBlockQ4_0 = 2,
  kBlockQ4_1 = 3,
  kBlockQ5_0 = 6,
  kBlockQ5_1 = 7,
  kBlockQ8_0 = 8,
  kBlockQ4_K = 12,
  kBlockQ5_K = 13,
  kBlockQ6_K = 14,
  kBlockBF16 = 30,
};

// Values per block and bytes per block; 0 for a type not decoded here.
MAGICPIG_HD int BlockValues(int type) {
  switch (type) {
    case kBlockF32:
    case kBlockF16:
    case kBlockBF16:
      return 1;
    case kBlockQ4_0:
    case kBlockQ4_1:
    case kBlockQ5_0:
    case kBlockQ5_1:
    case kBlockQ8_0:
      return 32;
    case kBlockQ4_K:
    case kBlockQ5_K:
    case kBlockQ6_K:
      return 256;
    default:
      return 0;
  }
}

MAGICPIG_HD int BlockBytes(int type) {
  switch (type) {
    case kBlockF32:
      return 4;
    case kBlockF16:
    case kBlockBF16:
      return 2;
    case kBlockQ4_0:
      return 18;
    case kBlockQ4_1:
      return 20;
    case kBlockQ5_0:
      return 22;
    case kBlockQ5_1:
      return 24;
    case kBlockQ8_0:
      return 34;
    case kBlockQ4_K:
      return 144;
    case kBlockQ5_K:
      return 176;
    case kBlockQ6_K:
      return 210;
    default:
      return 0;
  }
}

MAGICPIG_HD float BitsToFloat(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
#endif
}

MAGICPIG_HD float Mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

MAGICPIG_HD float Add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// IEEE binary16 bits to float, exactly (subnormals, infinities and NaN included).
MAGICPIG_HD float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    if (mantissa == 0) return BitsToFloat(sign);
    exponent = 127 - 15 + 1;  // normalise the subnormal
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    return BitsToFloat(sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13));
  }
  if (exponent == 31) return BitsToFloat(sign | 0x7f800000u | (mantissa << 13));
  return BitsToFloat(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
}

MAGICPIG_HD uint16_t ReadU16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

MAGICPIG_HD uint32_t ReadU32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

MAGICPIG_HD float ReadHalf(const uint8_t* p) { return HalfBitsToFloat(ReadU16(p)); }

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K super-block.
MAGICPIG_HD void KScaleMin(const uint8_t* scales, int j, int* sc, int* mn) {
  if (j < 4) {
    *sc = scales[j] & 63;
    *mn = scales[j + 4] & 63;
  } else {
    *sc = (scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4);
    *mn = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
  }
}

// Decodes one block of `type` at b, calling store(i, value) for i in [0, BlockValues(type)).
// Returns false for a type not decoded here.
template <typename Store>
MAGICPIG_HD bool DecodeBlock(int type, const uint8_t* b, Store&& store) {
  switch (type) {
    case kBlockF32:
      store(0, BitsToFloat(ReadU32(b)));
      return true;
    case kBlockF16:
      store(0, HalfBitsToFloat(ReadU16(b)));
      return true;
    case kBlockBF16:
      store(0, BitsToFloat(static_cast<uint32_t>(ReadU16(b)) << 16));
      return true;
    case kBlockQ4_0: {
      const float d = ReadHalf(b);
      for (int j = 0; j < 16; ++j) {
        store(j, Mul(d, static_cast<float>((b[2 + j] & 0xF) - 8)));
        store(j + 16, Mul(d, static_cast<float>((b[2 + j] >> 4) - 8)));
      }
      return true;
    }
    case kBlockQ4_1: {
      const float d = ReadHalf(b), m = ReadHalf(b + 2);
      for (int j = 0; j < 16; ++j) {
        store(j, Add(Mul(d, static_cast<float>(b[4 + j] & 0xF)), m));
        store(j + 16, Add(Mul(d, static_cast<float>(b[4 + j] >> 4)), m));
      }
      return true;
    }
    case kBlockQ5_0: {
      const float d = ReadHalf(b);
      const uint32_t h = ReadU32(b + 2);
      for (int j = 0; j < 16; ++j) {
        const int lo = (b[6 + j] & 0xF) | (((h >> j) & 1) << 4);
        const int hi = (b[6 + j] >> 4) | (((h >> (j + 16)) & 1) << 4);
        store(j, Mul(d, static_cast<float>(lo - 16)));
        store(j + 16, Mul(d, static_cast<float>(hi - 16)));
      }
      return true;
    }
    case kBlockQ5_1: {
      const float d = ReadHalf(b), m = ReadHalf(b + 2);
      const uint32_t h = ReadU32(b + 4);
      for (int j = 0; j < 16; ++j) {
        const int lo = (b[8 + j] & 0xF) | (((h >> j) & 1) << 4);
        const int hi = (b[8 + j] >> 4) | (((h >> (j + 16)) & 1) << 4);
        store(j, Add(Mul(d, static_cast<float>(lo)), m));
        store(j + 16, Add(Mul(d, static_cast<float>(hi)), m));
      }
      return true;
    }
    case kBlockQ8_0: {
      const float d = ReadHalf(b);
      for (int j = 0; j < 32; ++j) {
        store(j, Mul(d, static_cast<float>(static_cast<int8_t>(b[2 + j]))));
      }
      return true;
    }
    case kBlockQ4_K:
    case kBlockQ5_K: {
      // Q5_K: Q4_K's layout plus qh[32]: bit 2c (2c + 1) of qh[l] is the fifth bit of value l of
      // sub-block 2c (2c + 1).
      const bool q5 = type == kBlockQ5_K;
      const float d = ReadHalf(b), dmin = ReadHalf(b + 2);
      const uint8_t* scales = b + 4;
      const uint8_t* qh = b + 16;
      const uint8_t* qs = b + (q5 ? 48 : 16);
      for (int c = 0; c < 4; ++c) {
        int sc0, mn0, sc1, mn1;
        KScaleMin(scales, 2 * c, &sc0, &mn0);
        KScaleMin(scales, 2 * c + 1, &sc1, &mn1);
        const float d0 = Mul(d, static_cast<float>(sc0)), m0 = Mul(dmin, static_cast<float>(mn0));
        const float d1 = Mul(d, static_cast<float>(sc1)), m1 = Mul(dmin, static_cast<float>(mn1));
        const uint8_t* q = qs + 32 * c;
        for (int l = 0; l < 32; ++l) {
          int lo = q[l] & 0xF, hi = q[l] >> 4;
          if (q5) {
            lo |= ((qh[l] >> (2 * c)) & 1) << 4;
            hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
          }
          store(64 * c + l, Add(Mul(d0, static_cast<float>(lo)), -m0));
          store(64 * c + 32 + l, Add(Mul(d1, static_cast<float>(hi)), -m1));
        }
      }
      return true;
    }
    case kBlockQ6_K: {
      const float d = ReadHalf(b + 208);
      for (int half = 0; half < 2; ++half) {
        const uint8_t* ql = b + 64 * half;
        const uint8_t* qh = b + 128 + 32 * half;
        const uint8_t* sc = b + 192 + 8 * half;
        const int base = 128 * half;
        for (int l = 0; l < 32; ++l) {
          const int i = l / 16;
          const int q0 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
          const int q1 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
          const int q2 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
          const int q3 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
          const auto scale = [&](int k) {
            return Mul(d, static_cast<float>(static_cast<int8_t>(sc[k])));
          };
          store(base + l, Mul(scale(i), static_cast<float>(q0)));
          store(base + l + 32, Mul(scale(i + 2), static_cast<float>(q1)));
          store(base + l + 64, Mul(scale(i + 4), static_cast<float>(q2)));
          store(base + l + 96, Mul(scale(i + 6), static_cast<float>(q3)));
        }
      }
      return true;
    }
    default:
      return false;
  }
}

}  // namespace magicpig::backend::cuda_internal

#endif  // MAGICPIG_GPU_NODE_BACKEND_CUDA_BLOCK_DECODE_H_
