// Process-wide runtime settings for the shipped binaries (magicpig, magicpig_gpu_node,
// magicpig_attn_node), applied first thing in main. Tests do not call it, so they keep the
// checks it turns off.
#ifndef MAGICPIG_COMMON_PROCESS_RUNTIME_H_
#define MAGICPIG_COMMON_PROCESS_RUNTIME_H_

namespace magicpig {

// Turns off absl::Mutex deadlock detection. Debian's Abseil is built without NDEBUG, which
// leaves it on: every Lock updates a lock-order graph (GraphCycles), ~5% of an attention
// node's CPU per Attend message on loopback (docs/benchmarks.md).
void ConfigureProcessRuntime();

}  // namespace magicpig

#endif  // MAGICPIG_COMMON_PROCESS_RUNTIME_H_
