// The byte model of `magicpig bench` against sums written out by hand for SmolLM2's shape, and
// the memory probe's two rates.
#include "tools/bench_command.h"

#include <cmath>

#include "gtest/gtest.h"
#include "tools/memory_probe.h"

namespace magicpig::tools {
namespace {

model::ModelConfig SmolLm2Shape() {
  model::ModelConfig c;
  c.n_layer = 30;
  c.n_head = 9;
  c.n_head_kv = 3;
  c.head_dim = 64;
  return c;
}

TEST(DecodeStepBytesTest, ExactAttentionReadsEveryLayersKv) {
  const model::ModelConfig c = SmolLm2Shape();
  engine::SparseAttentionOptions full;
  full.mode = attention::EstimatorKind::kFull;
  const StepBytes b = DecodeStepBytes(c, 1000, full, 4096, 16, 0);
  EXPECT_EQ(b.weights, 1000);
  EXPECT_EQ(b.exact_kv, 30.0 * 4096 * 192 * 2 * 2);  // layers x positions x kv_dim x {K,V} x fp16
  EXPECT_EQ(b.sampled, 0);
  EXPECT_EQ(b.buckets, 0);
  EXPECT_EQ(b.total(), b.weights + b.exact_kv);
}

TEST(DecodeStepBytesTest, MagicPigReadsDenseLayersWindowsSampleAndBuckets) {
  const model::ModelConfig c = SmolLm2Shape();
  engine::SparseAttentionOptions mp;  // magicpig(10, 150), sinks 4, local 64, window budget 320
  const int64_t pos = 8192, generated = 16;
  const double window = 4 + 64 + 16;  // sinks + local prompt tokens + generated
  const double offloaded = pos - window;
  const StepBytes b = DecodeStepBytes(c, 0, mp, pos, generated, /*keys_touched_per_step=*/1000);
  // Dense layers {0, 15} read every position; the 28 sparse layers their static window.
  EXPECT_EQ(b.exact_kv, (2.0 * pos + 28.0 * window) * 192 * 2 * 2);
  EXPECT_EQ(b.sampled, 1000.0 * 2 * 64 * 2);  // bf16 K and V rows
  // 28 layers x 9 query heads x 150 tables x the mean bucket (offloaded / 2^10) x 2-byte indices.
  EXPECT_DOUBLE_EQ(b.buckets, 28.0 * 9 * 150 * (offloaded / 1024) * 2);
  // A prompt inside the window stays exact.
  EXPECT_EQ(DecodeStepBytes(c, 0, mp, 50, 0, 0).exact_kv, 30.0 * 50 * 192 * 2 * 2);
  // So does one whose region (pos + 1 - sinks - local) is below min_offload_keys: at 1K with the
  // default every layer reads every position, nothing is sampled; from the default on it samples.
  const int64_t min_keys = engine::SparseAttentionOptions::kDefaultMinOffloadKeys;
  ASSERT_GT(min_keys, 1024);
  const StepBytes short_prompt = DecodeStepBytes(c, 0, mp, 1024, 0, 1000);
  EXPECT_EQ(short_prompt.exact_kv, 30.0 * 1024 * 192 * 2 * 2);
  EXPECT_EQ(short_prompt.sampled + short_prompt.buckets, 0);
  EXPECT_GT(DecodeStepBytes(c, 0, mp, min_keys + 67, 0, 1000).sampled, 0);
  EXPECT_EQ(DecodeStepBytes(c, 0, mp, min_keys + 66, 0, 1000).sampled, 0);
}

TEST(DecodeStepBytesTest, TopKScoresEveryOffloadedKey) {
  const model::ModelConfig c = SmolLm2Shape();
  engine::SparseAttentionOptions topk;
  topk.mode = attention::EstimatorKind::kTopK;
  const int64_t pos = 4096;
  const double offloaded = pos - (4 + 64);
  const StepBytes b = DecodeStepBytes(c, 0, topk, pos, 0, 500);
  EXPECT_EQ(b.sampled, 28.0 * 3 * offloaded * 64 * 2 + 500.0 * 64 * 2);
  EXPECT_EQ(b.buckets, 0);
}

// spotlight and sketch scan every offloaded key's code (per kv head) instead of bucket entries,
// then read the kept keys' values and rerank x their key rows.
TEST(DecodeStepBytesTest, CodeEstimatorsScanEveryKeysCode) {
  const model::ModelConfig c = SmolLm2Shape();
  const int64_t pos = 4096;
  const double offloaded = pos - (4 + 64);
  engine::SparseAttentionOptions sketch;
  sketch.mode = attention::EstimatorKind::kSketch;
  sketch.sketch_dims = 16;
  sketch.spotlight_rerank = 1;
  const StepBytes b = DecodeStepBytes(c, 0, sketch, pos, 0, 500);
  EXPECT_EQ(b.buckets, 28.0 * 3 * offloaded * 16);  // 16 int8 coordinates per key
  EXPECT_EQ(b.sampled, 500.0 * 64 * 2 * 2);         // bf16 K and V of the kept keys
  engine::SparseAttentionOptions spot;
  spot.mode = attention::EstimatorKind::kSpotlight;
  spot.spotlight_rerank = 4;
  const StepBytes s = DecodeStepBytes(c, 0, spot, pos, 0, 500, /*spotlight_bits=*/64);
  EXPECT_EQ(s.buckets, 28.0 * 3 * offloaded * 8);
  EXPECT_EQ(s.sampled, 500.0 * 64 * 2 * (1 + 4));  // values of 500, keys of 4 x 500
  // vattention-sketch does not rescore: K and V of each touched key, whatever the rerank flag.
  engine::SparseAttentionOptions vsketch = sketch;
  vsketch.mode = attention::EstimatorKind::kVAttentionSketch;
  vsketch.spotlight_rerank = 4;
  const StepBytes v = DecodeStepBytes(c, 0, vsketch, pos, 0, 500);
  EXPECT_EQ(v.buckets, b.buckets);
  EXPECT_EQ(v.sampled, 500.0 * 64 * 2 * 2);
}

// The three rates are measured (finite, positive, within what any host gives: 0.1-10,000 GB/s
// streamed, 0.01-100,000 ns per line or row), on one thread and on two.
TEST(MemoryProbeTest, MeasuresTheThreeRates) {
  for (int threads : {1, 2}) {
    const MemoryRates r = ProbeMemory(threads, 128);
    EXPECT_TRUE(std::isfinite(r.stream_gb_per_s)) << threads;
    EXPECT_GT(r.stream_gb_per_s, 0.1) << threads;
    EXPECT_LT(r.stream_gb_per_s, 1e4) << threads;
    EXPECT_TRUE(std::isfinite(r.random_ns_per_line)) << threads;
    EXPECT_GT(r.random_ns_per_line, 0.01) << threads;
    EXPECT_LT(r.random_ns_per_line, 1e5) << threads;
    EXPECT_TRUE(std::isfinite(r.gather_ns_per_row)) << threads;
    EXPECT_GT(r.gather_ns_per_row, 0.01) << threads;
    EXPECT_LT(r.gather_ns_per_row, 1e5) << threads;
  }
}

}  // namespace
}  // namespace magicpig::tools
