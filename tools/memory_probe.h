// The memory rates `magicpig bench` prices a decode step's reads with, measured in the same run:
// streamed reads (a read-only sum over a 1 GiB buffer) and independent random 64-byte lines of
// that buffer (the rate at which a sampled step's bucket lines and union rows can arrive).
//
// Thread-safety: ProbeMemory allocates its own buffer and task arena; one call at a time per
// process is meaningful (concurrent calls share the memory bus they measure).
#ifndef MAGICPIG_TOOLS_MEMORY_PROBE_H_
#define MAGICPIG_TOOLS_MEMORY_PROBE_H_

namespace magicpig::tools {

struct MemoryRates {
  double stream_gb_per_s = 0;  // read-only sum on `threads` threads, best of 3
  // Wall nanoseconds per line when `threads` threads each read independent random lines, every
  // line's address known 32 lines ahead and prefetched then (the retrieval's pipelining), best of
  // 3: the time per line of all threads together.
  double random_ns_per_line = 0;
};

MemoryRates ProbeMemory(int threads);

}  // namespace magicpig::tools

#endif  // MAGICPIG_TOOLS_MEMORY_PROBE_H_
