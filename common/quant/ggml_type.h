// ggml tensor element types as stored in GGUF files: codes, block sizes and byte sizes.
//
// A row of n values of type t occupies (n / BlockSize(t)) * BlockBytes(t) bytes; n must be a
// multiple of BlockSize(t). Block layouts are in block_layouts.h.
#ifndef MAGICPIG_COMMON_QUANT_GGML_TYPE_H_
#define MAGICPIG_COMMON_QUANT_GGML_TYPE_H_

#include <cstdint>
#include <optional>
#include <string_view>

namespace magicpig {

enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
};

struct GgmlTypeInfo {
  const char* name;     // const char* (not string_view): absl::StrCat takes it directly
  int64_t block_size;   // values per block
  int64_t block_bytes;  // bytes per block
  bool supported;       // magicpig can dequantise and multiply it
};

// Info for a type code read from a file; nullopt for codes ggml does not define (or removed ones).
std::optional<GgmlTypeInfo> LookupGgmlType(uint32_t code);

// Info for a known type (precondition: the enum value is a defined code).
const GgmlTypeInfo& GetGgmlTypeInfo(GgmlType type);

inline int64_t GgmlBlockSize(GgmlType t) { return GetGgmlTypeInfo(t).block_size; }
inline const char* GgmlTypeName(GgmlType t) { return GetGgmlTypeInfo(t).name; }

// Bytes of a row of n values (n a multiple of the block size).
inline int64_t GgmlRowBytes(GgmlType t, int64_t n) {
  const GgmlTypeInfo& info = GetGgmlTypeInfo(t);
  return n / info.block_size * info.block_bytes;
}

}  // namespace magicpig

#endif  // MAGICPIG_COMMON_QUANT_GGML_TYPE_H_
