// The start shared by the counting selections of the retrieval kernels (SelectNearest in
// hamming_kernel.h, SelectLargest in sketch_kernel.h): the argument clamps and the two cases that
// need no histogram.
//
// Thread-safety: a pure function.
#ifndef MAGICPIG_COMMON_ATTENTION_KERNELS_SELECTION_START_H_
#define MAGICPIG_COMMON_ATTENTION_KERNELS_SELECTION_START_H_

#include <algorithm>
#include <cstdint>
#include <vector>

namespace magicpig::attention::internal {

// Clears *out and clamps *n to >= 0 and *m to [0, *n]. Returns true when the selection is complete:
// *m == 0 (nothing selected) or *m == *n (every index, in increasing order, written to *out).
// Otherwise reserves *m entries and returns false.
inline bool StartSelection(int64_t* n, int64_t* m, std::vector<int32_t>* out) {
  out->clear();
  *n = std::max<int64_t>(*n, 0);
  *m = std::clamp<int64_t>(*m, 0, *n);
  if (*m == 0) return true;
  out->reserve(static_cast<size_t>(*m));
  if (*m < *n) return false;
  for (int64_t i = 0; i < *n; ++i) out->push_back(static_cast<int32_t>(i));
  return true;
}

}  // namespace magicpig::attention::internal

#endif  // MAGICPIG_COMMON_ATTENTION_KERNELS_SELECTION_START_H_
