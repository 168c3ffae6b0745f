// The lookup table of the AVX2 compactions (collision_scan_avx2.cc, sketch_avx2.cc): AVX2 has no
// vpcompressd, so the lanes an 8-bit mask selects are moved to the front of a register by a
// vpermd whose index vector is looked up from the mask.
//
// Thread-safety: constant data.
#ifndef MAGICPIG_COMMON_ATTENTION_KERNELS_COMPACT_TABLE_H_
#define MAGICPIG_COMMON_ATTENTION_KERNELS_COMPACT_TABLE_H_

#include <cstdint>

namespace magicpig::attention::internal {

// entry[m] holds, as bytes, the positions of the set bits of m in increasing order (the rest 0):
// widened to eight 32-bit lanes (vpmovzxbd), the vpermd indices that move the selected lanes to
// the front.
struct CompactTable {
  uint64_t entry[256];
  constexpr CompactTable() : entry() {
    for (int m = 0; m < 256; ++m) {
      uint64_t e = 0;
      int at = 0;
      for (int lane = 0; lane < 8; ++lane) {
        if ((m >> lane) & 1) e |= static_cast<uint64_t>(lane) << (8 * at++);
      }
      entry[m] = e;
    }
  }
};
inline constexpr CompactTable kCompact;

}  // namespace magicpig::attention::internal

#endif  // MAGICPIG_COMMON_ATTENTION_KERNELS_COMPACT_TABLE_H_
