// `magicpig bench`: prefill and decode throughput of the embedded engine at several context
// depths, beside a read-only memory-bandwidth probe measured in the same run.
//
// For each depth d the engine prefills d seeded random tokens (1 at depth 0), then decodes
// --decode-tokens tokens greedily (EOS ignored). Decode throughput is also shown as the bytes a
// step must read (all weights + the K/V cache at that depth) per second, next to the probe.
#ifndef MAGICPIG_TOOLS_BENCH_COMMAND_H_
#define MAGICPIG_TOOLS_BENCH_COMMAND_H_

#include <string>
#include <vector>

namespace magicpig::tools {

int BenchCommand(const std::vector<std::string>& args);

}  // namespace magicpig::tools

#endif  // MAGICPIG_TOOLS_BENCH_COMMAND_H_
