// The memory rates `magicpig bench` prices a decode step's reads with, measured in the same run on
// a 1 GiB buffer (so from DRAM, not cache): streamed reads (a read-only sum), independent random
// 64-byte lines (the rate at which a sampled step's bucket lines can arrive), and a gather of
// sorted random key and value rows with the attention kernel's two prefetch stages (the rate at
// which a union's rows can arrive).
//
// Thread-safety: ProbeMemory allocates its own buffer and task arena; one call at a time per
// process is meaningful (concurrent calls share the memory bus they measure).
#ifndef MAGICPIG_TOOLS_MEMORY_PROBE_H_
#define MAGICPIG_TOOLS_MEMORY_PROBE_H_

#include <cstdint>

namespace magicpig::tools {

struct MemoryRates {
  double stream_gb_per_s = 0;  // read-only sum on `threads` threads, best of 3
  // Wall nanoseconds per line when `threads` threads each read independent random lines, every
  // line's address known 32 lines ahead and prefetched then (the retrieval's pipelining), best of
  // 3: the time per line of all threads together.
  double random_ns_per_line = 0;
  // Wall nanoseconds per gathered row (a key row and a value row of row_bytes each, one word of
  // each line read), rows taken with probability 5% in increasing order as a union is, prefetched
  // into L2 12 KiB ahead and into L1 4 rows ahead as the kernel does, split over `threads`
  // threads, best of 3.
  double gather_ns_per_row = 0;
};

// row_bytes: one key row's bytes (head_dim x 2 for bf16 rows), 64 to 4096.
MemoryRates ProbeMemory(int threads, int64_t row_bytes);

}  // namespace magicpig::tools

#endif  // MAGICPIG_TOOLS_MEMORY_PROBE_H_
