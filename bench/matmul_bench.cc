// MatMul throughput at SmolLM2-135M shapes (Q4_1, Q8_0) and Qwen2.5-1.5B shapes (Q4_K, Q6_K: the
// types of its Q4_K_M file), per SIMD level and thread count, with a read-only
// memory-bandwidth probe in the same binary so the GB/s of weights read has its physical limit
// printed beside it.
//
//   magicpig_matmul_bench [--benchmark_filter=...]   (threads: 1 and 2, via tbb::task_arena)
//
// "weights" counters are bytes of quantised weights read per second (decimal G = 1e9).
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/cpu_features.h"
#include "common/quant/matmul.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_reduce.h"
#include "tbb/task_arena.h"
#include "tests/testing/quantize_reference.h"

namespace magicpig {
namespace {

struct Shape {
  const char* name;
  int64_t rows;  // output features
  int64_t cols;  // input features
};

constexpr Shape kShapes[] = {
    {"attn_576x576", 576, 576},
    {"ffn_up_576to1536", 1536, 576},
    {"ffn_down_1536to576", 576, 1536},
    {"lm_head_49152x576", 49152, 576},
};

// Qwen2.5-Coder-1.5B: the Q4_K matrices and the Q6_K ones of its Q4_K_M file (the 151,936-row
// head is represented by a 32,768-row slice: far out of cache either way).
struct KShape {
  GgmlType type;
  Shape shape;
};
constexpr KShape kQwenShapes[] = {
    {GgmlType::kQ4_K, {"qwen_attn_q_1536x1536", 1536, 1536}},
    {GgmlType::kQ4_K, {"qwen_ffn_up_1536to8960", 8960, 1536}},
    {GgmlType::kQ6_K, {"qwen_ffn_down_8960to1536", 1536, 8960}},
    {GgmlType::kQ6_K, {"qwen_lm_head_32768x1536", 32768, 1536}},
    // Eight layers' ffn_up stacked (62 MB): a Q4_K decode product that no cache holds.
    {GgmlType::kQ4_K, {"qwen_ffn_up_x8_71680x1536", 71680, 1536}},
};

std::vector<uint8_t> RandomWeights(GgmlType type, int64_t rows, int64_t cols) {
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> row(static_cast<size_t>(cols));
  std::vector<uint8_t> out;
  out.reserve(static_cast<size_t>(rows * GgmlRowBytes(type, cols)));
  for (int64_t r = 0; r < rows; ++r) {
    for (float& v : row) v = normal(rng);
    absl::StatusOr<std::vector<uint8_t>> q = testing::QuantizeReference(type, row.data(), cols);
    out.insert(out.end(), q->begin(), q->end());
  }
  return out;
}

void BM_MatMul(benchmark::State& state, GgmlType type, Shape shape, int64_t n_tokens,
               SimdLevel level, int threads, WeightLayout layout) {
  std::vector<uint8_t> w = RandomWeights(type, shape.rows, shape.cols);
  if (layout == WeightLayout::kRows16) {
    if (absl::Status s = Interleave(type, w.data(), shape.rows, shape.cols); !s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      return;
    }
  }
  std::mt19937 rng(2);
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<size_t>(n_tokens * shape.cols));
  for (float& v : x) v = normal(rng);
  std::vector<float> y(static_cast<size_t>(n_tokens * shape.rows));
  const QuantMatrix m{type, w.data(), shape.rows, shape.cols, layout};
  tbb::task_arena arena(threads);
  for (auto _ : state) {
    arena.execute([&] {
      absl::Status s = MatMul(m, x.data(), shape.cols, n_tokens, y.data(), shape.rows, level);
      if (!s.ok()) state.SkipWithError(std::string(s.message()).c_str());
    });
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["weights"] = benchmark::Counter(static_cast<double>(w.size()),
                                                 benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP"] =
      benchmark::Counter(2.0 * static_cast<double>(shape.rows * shape.cols * n_tokens) * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate);
}

// One decode token through SmolLM2-135M's dense products in the transformer's order: 30 layers of
// Q4_1 q, k, v, o, gate, up, down (each layer its own copy of the bytes, so that, as in the engine,
// nothing is left in a cache from the previous token: 61 MB) and the tied Q8_0 head (28 MB). The
// weights rate against ReadBandwidth is the share of the memory bound that decode's dense work
// reaches with MatMul's fork-join per product; the single-matrix cases above run from cache.
// layout: the Q4_1 layers' (kRows16 is what the CPU backend loads on AVX-512 machines).
void BM_DecodeStream(benchmark::State& state, SimdLevel level, int threads, WeightLayout layout) {
  constexpr int kLayers = 30;
  const Shape layer_shapes[] = {{"q", 576, 576},    {"k", 192, 576},     {"v", 192, 576},
                                {"o", 576, 576},    {"gate", 1536, 576}, {"up", 1536, 576},
                                {"down", 576, 1536}};
  std::vector<std::vector<uint8_t>> one_layer;
  for (const Shape& s : layer_shapes) {
    one_layer.push_back(RandomWeights(GgmlType::kQ4_1, s.rows, s.cols));
    if (layout == WeightLayout::kRows16 &&
        !Interleave(GgmlType::kQ4_1, one_layer.back().data(), s.rows, s.cols).ok()) {
      state.SkipWithError("interleave failed");
      return;
    }
  }
  std::vector<std::vector<uint8_t>> layers;  // [layer * 7 + product]
  for (int l = 0; l < kLayers; ++l) {
    for (const std::vector<uint8_t>& w : one_layer) layers.push_back(w);
  }
  const std::vector<uint8_t> head = RandomWeights(GgmlType::kQ8_0, 49152, 576);
  std::vector<float> x(1536, 0.5f);
  std::vector<float> y(49152);
  int64_t bytes = static_cast<int64_t>(head.size());
  for (const std::vector<uint8_t>& w : layers) bytes += static_cast<int64_t>(w.size());
  tbb::task_arena arena(threads);
  for (auto _ : state) {
    arena.execute([&] {
      for (int l = 0; l < kLayers; ++l) {
        for (int p = 0; p < 7; ++p) {
          const Shape& s = layer_shapes[p];
          const QuantMatrix m{GgmlType::kQ4_1, layers[static_cast<size_t>(l * 7 + p)].data(),
                              s.rows, s.cols, layout};
          (void)MatMul(m, x.data(), s.cols, 1, y.data(), s.rows, level);
        }
      }
      const QuantMatrix m{GgmlType::kQ8_0, head.data(), 49152, 576, WeightLayout::kRowMajor};
      (void)MatMul(m, x.data(), 576, 1, y.data(), 49152, level);
    });
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["weights"] =
      benchmark::Counter(static_cast<double>(bytes), benchmark::Counter::kIsIterationInvariantRate);
}

// Sums a 1 GiB buffer (far larger than any cache): the read bandwidth a matvec can hope for.
void BM_ReadBandwidth(benchmark::State& state, int threads) {
  static const std::vector<uint64_t>* buffer = new std::vector<uint64_t>((1u << 30) / 8, 1);
  tbb::task_arena arena(threads);
  for (auto _ : state) {
    uint64_t sum = arena.execute([&] {
      return tbb::parallel_reduce(
          tbb::blocked_range<size_t>(0, buffer->size(), 1 << 20), uint64_t{0},
          [&](const tbb::blocked_range<size_t>& r, uint64_t acc) {
            for (size_t i = r.begin(); i < r.end(); ++i) acc += (*buffer)[i];
            return acc;
          },
          [](uint64_t a, uint64_t b) { return a + b; });
    });
    benchmark::DoNotOptimize(sum);
  }
  state.counters["read"] = benchmark::Counter(static_cast<double>(buffer->size() * 8),
                                              benchmark::Counter::kIsIterationInvariantRate);
}

void RegisterAll() {
  for (int threads : {1, 2}) {
    benchmark::RegisterBenchmark(("ReadBandwidth_1GiB/threads:" + std::to_string(threads)).c_str(),
                                 BM_ReadBandwidth, threads)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  for (SimdLevel level : SupportedSimdLevels()) {
    for (int threads : {1, 2}) {
      benchmark::RegisterBenchmark(("DecodeStream_smollm2/" + std::string(SimdLevelName(level)) +
                                    "/threads:" + std::to_string(threads))
                                       .c_str(),
                                   BM_DecodeStream, level, threads, WeightLayout::kRowMajor)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
      if (level == SimdLevel::kAvx512) {
        benchmark::RegisterBenchmark(
            ("DecodeStream_smollm2-rows16/avx512/threads:" + std::to_string(threads)).c_str(),
            BM_DecodeStream, level, threads, WeightLayout::kRows16)
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
  for (GgmlType type : {GgmlType::kQ4_1, GgmlType::kQ8_0}) {
    for (const Shape& shape : kShapes) {
      if (shape.rows == 49152 && type != GgmlType::kQ8_0) continue;  // the tied head is Q8_0
      for (int64_t n_tokens : {1, 2, 4, 8, 16, 32, 64, 256}) {
        for (SimdLevel level : SupportedSimdLevels()) {
          for (int threads : {1, 2}) {
            const std::string name = std::string(GgmlTypeName(type)) + "/" + shape.name +
                                     "/tokens:" + std::to_string(n_tokens) + "/" +
                                     std::string(SimdLevelName(level)) +
                                     "/threads:" + std::to_string(threads);
            benchmark::RegisterBenchmark(name.c_str(), BM_MatMul, type, shape, n_tokens, level,
                                         threads, WeightLayout::kRowMajor)
                ->UseRealTime()
                ->Unit(benchmark::kMicrosecond);
            if (level == SimdLevel::kAvx512) {
              const std::string rows16 = name.substr(0, 4) + "-rows16" + name.substr(4);
              benchmark::RegisterBenchmark(rows16.c_str(), BM_MatMul, type, shape, n_tokens, level,
                                           threads, WeightLayout::kRows16)
                  ->UseRealTime()
                  ->Unit(benchmark::kMicrosecond);
            }
          }
        }
      }
    }
  }
  for (const KShape& k : kQwenShapes) {
    for (int64_t n_tokens : {1, 4, 64}) {
      for (SimdLevel level : SupportedSimdLevels()) {
        for (int threads : {1, 2}) {
          const std::string name = std::string(GgmlTypeName(k.type)) + "/" + k.shape.name +
                                   "/tokens:" + std::to_string(n_tokens) + "/" +
                                   std::string(SimdLevelName(level)) +
                                   "/threads:" + std::to_string(threads);
          benchmark::RegisterBenchmark(name.c_str(), BM_MatMul, k.type, k.shape, n_tokens, level,
                                       threads, WeightLayout::kRowMajor)
              ->UseRealTime()
              ->Unit(benchmark::kMicrosecond);
          // The same matrix in the 16-row interleaved layout the CPU backend loads on AVX-512
          // machines (interleave.h).
          if (level == SimdLevel::kAvx512) {
            const std::string rows16 = name.substr(0, 4) + "-rows16" + name.substr(4);
            benchmark::RegisterBenchmark(rows16.c_str(), BM_MatMul, k.type, k.shape, n_tokens,
                                         level, threads, WeightLayout::kRows16)
                ->UseRealTime()
                ->Unit(benchmark::kMicrosecond);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace magicpig

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  magicpig::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
