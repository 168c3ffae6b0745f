// `magicpig bench`: prefill and decode throughput of the embedded engine (or the compute node over
// attention nodes) at several context depths, in the chosen decode-attention mode and against
// exact attention measured in the same run, beside a read-only memory-bandwidth probe.
//
// For each depth d and round the engine prefills d seeded random tokens (1 at depth 0), then
// decodes --decode-tokens tokens greedily (EOS ignored), once with exact attention (the baseline)
// and once in the mode of --attention, alternating. Each row shows the bytes one decode step must
// read in that mode (StepBytes: weights, exact KV, sampled rows, LSH buckets), the tokens/s those
// bytes allow at the probe's bandwidth, and the fraction of it reached. --breakdown adds the
// decode step's time by phase (dense work, the sparse layers' hashing, window, shards and merge,
// sampling), from timers that are off otherwise, and for sampled modes the DRAM floor: the bucket
// lines and union rows the embedded estimators read (counted, not modelled) at the rates of a
// random-line probe and a row-gather probe, plus the streamed bytes at the streaming probe's, a
// step time that only a step doing nothing but its reads, all from memory, would reach. With
// --batch, each row runs that many sequences (each with its own random prompt of the depth)
// decoding together; decode/s is then the batch's tokens per second, and a batch whose caches do
// not fit (--gpu-kv-budget, or memory) is shown as such and larger batches of that mode are
// skipped.
#ifndef MAGICPIG_TOOLS_BENCH_COMMAND_H_
#define MAGICPIG_TOOLS_BENCH_COMMAND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/flags/flag_table.h"
#include "gpu_node/engine/engine.h"

namespace magicpig::tools {

struct BenchFlags {
  engine::EngineOptions engine;
  std::vector<int64_t> depths = {0, 1024, 4096, 8192};
  std::vector<int64_t> batches = {1};
  int64_t decode_tokens = 32;
  int64_t repeat = 1;
  bool baseline = true;  // also exact attention, alternating
  bool breakdown = false;
  std::string csv;
};

std::unique_ptr<flags::FlagTable> BenchFlagTable(BenchFlags* flags);

// The bytes one decode step reads at context position `pos` in a mode, by kind.
struct StepBytes {
  double weights = 0;
  double exact_kv = 0;  // fp16 K and V the compute node attends exactly (dense layers, windows)
  double sampled = 0;   // the shards' rows the estimator reads (per query head: an upper bound)
  double buckets = 0;   // the index the retrieval scans: LSH bucket entries, or every key's code
  double total() const { return weights + exact_kv + sampled + buckets; }
};

// At context position `pos` with `generated` tokens generated so far. keys_touched_per_step: the
// estimator's keys over the sparse (layer, query head) pairs of one step
// (GenerateStats::attention_keys_touched / steps). spotlight_bits: the length of the loaded
// spotlight hashes' codes (spotlight only).
StepBytes DecodeStepBytes(const model::ModelConfig& c, int64_t weight_bytes,
                          const engine::SparseAttentionOptions& attention, int64_t pos,
                          int64_t generated, double keys_touched_per_step,
                          int64_t spotlight_bits = 0);

int BenchCommand(const std::vector<std::string>& args);

}  // namespace magicpig::tools

#endif  // MAGICPIG_TOOLS_BENCH_COMMAND_H_
