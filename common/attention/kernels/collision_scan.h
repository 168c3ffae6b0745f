// The scan at the end of group retrieval (LshTables::RetrieveGroup): packed collision counters,
// one uint32 per key holding one byte per query head of a block of up to 4, become the list of
// keys that some head of the block sampled (a byte >= 2) with their head masks, and are zeroed for
// the next call. It visits every key of the shard, so per 8K decode step on SmolLM2 it reads
// ~690K counters (~2.4% of the step's CPU samples in the SSE2 loop alone).
//
// Compiled per ISA: SSE2 (the x86-64 baseline: 16 keys per step, then a branch-free emit of each
// of them), AVX2 (8 keys per step, compacted by a permutation looked up from the 8-bit mask of the
// keys that were sampled) and AVX-512 BW (16 keys per step compacted by vpcompressd into a
// register, then stored whole). Every level gives the same result (integer work only).
//
// Thread-safety: pure functions of their arguments.
#ifndef MAGICPIG_COMMON_ATTENTION_KERNELS_COLLISION_SCAN_H_
#define MAGICPIG_COMMON_ATTENTION_KERNELS_COLLISION_SCAN_H_

#include <cstdint>

#include "common/cpu_features.h"

namespace magicpig::attention::internal {

// For every key i in [0, n) in increasing order whose counter has some byte b >= 2, writes
// rows[c] = i and masks[c] = (bit b set for each such byte) << shift, c counting from 0; returns
// c. Sets counters[0 .. n) to 0. rows and masks need room for n entries (the vector levels write
// whole vectors there, never past entry n - 1). shift is in [0, 28]. A level above the CPU's is
// clamped to it.
int64_t ScanCollisionCounters(SimdLevel level, uint32_t* counters, int64_t n, int shift,
                              int32_t* rows, uint32_t* masks);

// The per-ISA kernels (same contract).
int64_t ScanCollisionCountersSse2(uint32_t* counters, int64_t n, int shift, int32_t* rows,
                                  uint32_t* masks);
int64_t ScanCollisionCountersAvx2(uint32_t* counters, int64_t n, int shift, int32_t* rows,
                                  uint32_t* masks);
int64_t ScanCollisionCountersAvx512(uint32_t* counters, int64_t n, int shift, int32_t* rows,
                                    uint32_t* masks);

// The scalar tail all levels share: keys [i, n).
int64_t ScanCollisionTail(uint32_t* counters, int64_t i, int64_t n, int shift, int32_t* rows,
                          uint32_t* masks, int64_t c);

}  // namespace magicpig::attention::internal

#endif  // MAGICPIG_COMMON_ATTENTION_KERNELS_COLLISION_SCAN_H_
