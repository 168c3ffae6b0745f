// `magicpig bench`: prefill and decode throughput of the embedded engine at several context
// depths, beside a read-only memory-bandwidth probe measured in the same run.
//
// For each depth d the engine prefills d seeded random tokens (1 at depth 0), then decodes
// --decode-tokens tokens greedily (EOS ignored). Decode throughput is also shown as the bytes a
// step must read (all weights + the K/V cache at that depth) per second, next to the probe.
#ifndef MAGICPIG_TOOLS_BENCH_COMMAND_H_
#define MAGICPIG_TOOLS_BENCH_COMMAND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/flags/flag_table.h"

namespace magicpig::tools {

struct BenchFlags {
  std::string model;
  int threads = 0;
  std::vector<int64_t> depths = {0, 1024, 4096, 8192};
  int64_t decode_tokens = 32;
  int64_t repeat = 1;
  std::string csv;
};

std::unique_ptr<flags::FlagTable> BenchFlagTable(BenchFlags* flags);

int BenchCommand(const std::vector<std::string>& args);

}  // namespace magicpig::tools

#endif  // MAGICPIG_TOOLS_BENCH_COMMAND_H_
