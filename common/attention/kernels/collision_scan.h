// The scan at the end of group retrieval (LshTables::RetrieveGroup): packed collision counters,
// one uint32 per key holding one byte per query head of a block of up to 4, become the list of
// keys that some head of the block sampled (a byte >= 2) with their head masks, and are zeroed for
// the next call. SSE2 (the x86-64 baseline), so there is nothing to dispatch.
#ifndef MAGICPIG_COMMON_ATTENTION_KERNELS_COLLISION_SCAN_H_
#define MAGICPIG_COMMON_ATTENTION_KERNELS_COLLISION_SCAN_H_

#include <cstdint>

namespace magicpig::attention::internal {

// For every key i in [0, n) in increasing order whose counter has some byte b >= 2, writes
// rows[c] = i and masks[c] = (bit b set for each such byte) << shift, c counting from 0; returns
// c. Sets counters[0 .. n) to 0. rows and masks need room for n entries.
int64_t ScanCollisionCounters(uint32_t* counters, int64_t n, int shift, int32_t* rows,
                              uint32_t* masks);

}  // namespace magicpig::attention::internal

#endif  // MAGICPIG_COMMON_ATTENTION_KERNELS_COLLISION_SCAN_H_
