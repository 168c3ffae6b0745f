// Exact causal attention on the CPU backend at SmolLM2 shapes (shape 0: 9 query heads, 3 kv heads,
// d = 64) and Qwen2.5-1.5B shapes (shape 1: 12 query heads, 2 kv heads, d = 128): one decode step
// (1 query token) and a prefill chunk (256 query tokens, the wide-tile path) at several depths,
// per SIMD level. Reports KV bytes read per second beside a read-only memory-bandwidth probe.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "common/half.h"
#include "gpu_node/backend/cpu/cpu_backend.h"

namespace magicpig::backend {
namespace {

struct Shape {
  int64_t heads, kv_heads, dim;
};
constexpr Shape kShapes[] = {{9, 3, 64}, {12, 2, 128}};

struct Fixture {
  std::vector<uint16_t> k, v;
  std::vector<float> q, out;
  KvLayerView view;
  Fixture(int64_t depth, int64_t n_q, Shape shape) {
    const int64_t kHeads = shape.heads, kKvHeads = shape.kv_heads, kDim = shape.dim;
    std::mt19937 rng(1);
    std::normal_distribution<float> nd;
    k.resize(depth * kKvHeads * kDim);
    v.resize(k.size());
    for (auto& x : k) x = FloatToFp16(nd(rng));
    for (auto& x : v) x = FloatToFp16(nd(rng));
    q.resize(n_q * kHeads * kDim);
    for (auto& x : q) x = nd(rng);
    out.resize(q.size());
    view = KvLayerView{k.data(), v.data(), depth, kKvHeads, kDim};
  }
};

void BM_Attention(benchmark::State& state) {
  const int64_t depth = state.range(0), n_q = state.range(1);
  const auto level = static_cast<SimdLevel>(state.range(2));
  const int threads = static_cast<int>(state.range(3));
  const Shape shape = kShapes[state.range(4)];
  if (static_cast<int>(level) > static_cast<int>(DetectedSimdLevel())) {
    state.SkipWithError("SIMD level not supported here");
    return;
  }
  Fixture f(depth, n_q, shape);
  CpuBackend backend(threads, level);
  for (auto _ : state) {
    (void)backend.Execute([&] {
      backend.CausalAttention(f.q.data(), n_q, depth - n_q, shape.heads, 0.125f, f.view,
                              f.out.data());
      return absl::OkStatus();
    });
    benchmark::DoNotOptimize(f.out.data());
  }
  // Bytes of K and V a decode step must read (each kv row once).
  state.counters["kv_GB/s"] =
      benchmark::Counter(static_cast<double>(depth) * shape.kv_heads * shape.dim * 2 * 2,
                         benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(SimdLevelName(level)));
}

void BM_MemoryBandwidthProbe(benchmark::State& state) {
  std::vector<float> buf((1 << 28) / sizeof(float), 1.0f);  // 256 MiB
  for (auto _ : state) {
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i < buf.size(); i += 4) {
      s0 += buf[i];
      s1 += buf[i + 1];
      s2 += buf[i + 2];
      s3 += buf[i + 3];
    }
    benchmark::DoNotOptimize(s0 + s1 + s2 + s3);
  }
  state.counters["read_GB/s"] = benchmark::Counter(static_cast<double>(buf.size() * 4),
                                                   benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_MemoryBandwidthProbe)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Attention)
    ->ArgNames({"depth", "n_q", "simd", "threads", "shape"})
    ->ArgsProduct({{1024, 4096, 8192}, {1}, {0, 1, 2}, {1, 2}, {0, 1}})
    ->ArgsProduct({{1024, 4096, 8192}, {256}, {1, 2}, {1, 2}, {0, 1}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace
}  // namespace magicpig::backend

BENCHMARK_MAIN();
