// Run-time SIMD level detection and override.
//
// Kernels are compiled once per level in their own translation units (with that level's -m flags)
// and chosen at run time, so one binary runs on any x86-64 node. The level is chosen once per
// batch by the caller, never per element.
//
// MAGICPIG_SIMD=scalar|avx2|avx512 caps the level (for tests and comparisons); a level above what
// the CPU supports is clamped down to the detected one.
#ifndef MAGICPIG_COMMON_CPU_FEATURES_H_
#define MAGICPIG_COMMON_CPU_FEATURES_H_

#include <string_view>
#include <vector>

namespace magicpig {

enum class SimdLevel {
  kScalar = 0,  // portable C++ at the x86-64 baseline
  kAvx2 = 1,    // AVX2 + FMA + F16C
  kAvx512 = 2,  // AVX-512 F/BW/VL/DQ (+ VNNI where present, detected separately)
};

std::string_view SimdLevelName(SimdLevel level);

// The best level this CPU supports (ignores the environment override).
SimdLevel DetectedSimdLevel();

// DetectedSimdLevel() capped by MAGICPIG_SIMD; read once, then cached. Thread-safe.
SimdLevel ActiveSimdLevel();

// `level`, or DetectedSimdLevel() where `level` is above it: what a dispatcher runs when asked for
// a level this CPU lacks (a kernel of that level would fault).
SimdLevel ClampToDetected(SimdLevel level);

// Every level up to DetectedSimdLevel(), lowest first: what tests must cover on this machine.
std::vector<SimdLevel> SupportedSimdLevels();

// True when the CPU has AVX512-VNNI (vpdpbusd); kernels at kAvx512 may use it.
bool CpuHasAvx512Vnni();

// True when the CPU has AVX512_VPOPCNTDQ (vpopcntd/vpopcntq on 512-bit vectors) on top of the
// kAvx512 set; kernels at kAvx512 may use it, and fall back to their AVX2 path without it.
bool CpuHasAvx512Vpopcntdq();

// True when the CPU has AVX512_BF16 (vdpbf16ps: pairs of bf16 products summed into fp32) on top of
// the kAvx512 set; kernels at kAvx512 may use it.
bool CpuHasAvx512Bf16();

}  // namespace magicpig

#endif  // MAGICPIG_COMMON_CPU_FEATURES_H_
