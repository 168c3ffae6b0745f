#include "common/cpu_features.h"

#include <cpuid.h>

#include <cstdlib>
#include <cstring>

namespace magicpig {
namespace {

struct CpuFlags {
  bool avx2 = false;
  bool avx512 = false;
  bool avx512_vnni = false;
  bool avx512_vpopcntdq = false;
  bool avx512_bf16 = false;
};

uint64_t ReadXcr0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

CpuFlags QueryCpu() {
  CpuFlags flags;
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return flags;
  const bool osxsave = ecx & (1u << 27);
  const bool fma = ecx & (1u << 12);
  const bool f16c = ecx & (1u << 29);
  if (!osxsave) return flags;
  const uint64_t xcr0 = ReadXcr0();
  const bool os_ymm = (xcr0 & 0x6) == 0x6;
  const bool os_zmm = (xcr0 & 0xe6) == 0xe6;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return flags;
  const bool avx2 = ebx & (1u << 5);
  const bool avx512f = ebx & (1u << 16);
  const bool avx512dq = ebx & (1u << 17);
  const bool avx512bw = ebx & (1u << 30);
  const bool avx512vl = ebx & (1u << 31);
  flags.avx2 = os_ymm && avx2 && fma && f16c;
  flags.avx512 = flags.avx2 && os_zmm && avx512f && avx512dq && avx512bw && avx512vl;
  flags.avx512_vnni = flags.avx512 && (ecx & (1u << 11));
  flags.avx512_vpopcntdq = flags.avx512 && (ecx & (1u << 14));
  // AVX512_BF16 is reported in leaf 7, sub-leaf 1, EAX bit 5.
  if (flags.avx512 && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) {
    flags.avx512_bf16 = eax & (1u << 5);
  }
  return flags;
}

const CpuFlags& Flags() {
  static const CpuFlags flags = QueryCpu();
  return flags;
}

SimdLevel ComputeActiveLevel() {
  SimdLevel level = DetectedSimdLevel();
  const char* env = std::getenv("MAGICPIG_SIMD");
  if (env == nullptr) return level;
  SimdLevel cap = level;
  if (std::strcmp(env, "scalar") == 0) cap = SimdLevel::kScalar;
  if (std::strcmp(env, "avx2") == 0) cap = SimdLevel::kAvx2;
  if (std::strcmp(env, "avx512") == 0) cap = SimdLevel::kAvx512;
  return static_cast<int>(cap) < static_cast<int>(level) ? cap : level;
}

}  // namespace

std::string_view SimdLevelName(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar:
      return "scalar";
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kAvx512:
      return "avx512";
  }
  return "unknown";
}

SimdLevel DetectedSimdLevel() {
  const CpuFlags& flags = Flags();
  if (flags.avx512) return SimdLevel::kAvx512;
  if (flags.avx2) return SimdLevel::kAvx2;
  return SimdLevel::kScalar;
}

SimdLevel ClampToDetected(SimdLevel level) {
  const SimdLevel detected = DetectedSimdLevel();
  return static_cast<int>(level) > static_cast<int>(detected) ? detected : level;
}

SimdLevel ActiveSimdLevel() {
  static const SimdLevel level = ComputeActiveLevel();
  return level;
}

std::vector<SimdLevel> SupportedSimdLevels() {
  std::vector<SimdLevel> levels;
  for (int l = 0; l <= static_cast<int>(DetectedSimdLevel()); ++l) {
    levels.push_back(static_cast<SimdLevel>(l));
  }
  return levels;
}

bool CpuHasAvx512Vnni() { return Flags().avx512_vnni; }

bool CpuHasAvx512Vpopcntdq() { return Flags().avx512_vpopcntdq; }

bool CpuHasAvx512Bf16() { return Flags().avx512_bf16; }

}  // namespace magicpig
