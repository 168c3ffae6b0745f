// The brute-force half of MagicPIG retrieval: the append segment's keys (KvShard's pending codes,
// not yet merged into the LSH tables) compared code by code with each query head of a GQA group.
//
// A pending key is sampled by head h iff its code equals the head's in at least 2 of the L tables
// (the tables' rule, LshTables::Retrieve). Per decode step the segment holds up to
// KvShard::kMaxMergeRows keys, so the scan is n x g x L code comparisons; at SmolLM2's shapes and
// a half-full segment (256 keys, L = 150, 3 heads) that is 115K comparisons per group, which the
// baseline-ISA loop this replaces spent ~2 thread-ms per 8K decode step on (perf, 600 tokens).
//
// Compiled per ISA (pending_scan_{scalar,avx2,avx512}.cc): scalar (a branch-free count per 32
// tables with an early exit), AVX2 (16 codes per vpcmpeqw, counted by popcount of vpmovmskb) and
// AVX-512 BW (32 codes per vpcmpeqw into a mask register, the last chunk under a load mask). Every
// level gives the same result (integer comparisons).
//
// Thread-safety: pure functions.
#ifndef MAGICPIG_COMMON_ATTENTION_KERNELS_PENDING_SCAN_H_
#define MAGICPIG_COMMON_ATTENTION_KERNELS_PENDING_SCAN_H_

#include <cstdint>

#include "common/cpu_features.h"

namespace magicpig::attention {

// For each key i < n (key_codes [n][l]) in increasing order, mask = the bits h < g with
// key_codes[i][t] == q_codes[h][t] (q_codes [g][l]) for at least 2 tables t; a key with a nonzero
// mask is written as rows[c] = first_row + i, masks[c] = mask, c counting from 0. Returns c.
// Requires 1 <= g <= 32 and l >= 1 (callers check; otherwise nothing is written and 0 returned);
// rows and masks need room for n entries. A level above the CPU's is clamped to it.
int64_t PendingCollisions(SimdLevel level, const uint16_t* key_codes, int64_t n, int l,
                          const uint16_t* q_codes, int g, int32_t first_row, int32_t* rows,
                          uint32_t* masks);

namespace internal {

// The per-ISA kernels behind PendingCollisions (same contract, arguments already checked).
int64_t PendingCollisionsScalar(const uint16_t* key_codes, int64_t n, int l,
                                const uint16_t* q_codes, int g, int32_t first_row, int32_t* rows,
                                uint32_t* masks);
int64_t PendingCollisionsAvx2(const uint16_t* key_codes, int64_t n, int l, const uint16_t* q_codes,
                              int g, int32_t first_row, int32_t* rows, uint32_t* masks);
int64_t PendingCollisionsAvx512(const uint16_t* key_codes, int64_t n, int l,
                                const uint16_t* q_codes, int g, int32_t first_row, int32_t* rows,
                                uint32_t* masks);

}  // namespace internal
}  // namespace magicpig::attention

#endif  // MAGICPIG_COMMON_ATTENTION_KERNELS_PENDING_SCAN_H_
