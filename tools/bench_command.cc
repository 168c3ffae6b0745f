#include "tools/bench_command.h"

#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "gpu_node/engine/engine.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"
#include "tbb/parallel_reduce.h"
#include "tbb/task_arena.h"

namespace magicpig::tools {
namespace {

// GB/s of a read-only sum over a 1 GiB buffer on `threads` threads (best of 3).
double MemoryBandwidthProbe(int threads) {
  const size_t n = (size_t{1} << 30) / sizeof(float);
  std::unique_ptr<float[]> buf(new float[n]);
  tbb::task_arena arena(threads);
  arena.execute([&] {
    // First touch on the arena's threads, so pages are spread as the reads will be.
    tbb::parallel_for(tbb::blocked_range<size_t>(0, n), [&](const tbb::blocked_range<size_t>& r) {
      for (size_t j = r.begin(); j < r.end(); ++j) buf[j] = 1.0f;
    });
  });
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    auto start = std::chrono::steady_clock::now();
    float sum = 0;
    arena.execute([&] {
      sum = tbb::parallel_reduce(
          tbb::blocked_range<size_t>(0, n, size_t{1} << 16), 0.0f,
          [&](const tbb::blocked_range<size_t>& r, float acc) {
            float s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
            for (size_t i = r.begin(); i + 8 <= r.end(); i += 8) {
              s0 += buf[i];
              s1 += buf[i + 1];
              s2 += buf[i + 2];
              s3 += buf[i + 3];
              s4 += buf[i + 4];
              s5 += buf[i + 5];
              s6 += buf[i + 6];
              s7 += buf[i + 7];
            }
            return acc + s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7;
          },
          [](float a, float b) { return a + b; });
    });
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (sum < 0) std::cerr << "";  // keeps the sum (and the reads) alive
    best = std::max(best, n * sizeof(float) / s / 1e9);
  }
  return best;
}

}  // namespace

std::unique_ptr<flags::FlagTable> BenchFlagTable(BenchFlags* f) {
  auto table = std::make_unique<flags::FlagTable>(
      "magicpig bench",
      "Prefill and decode throughput of the embedded engine (exact attention) at several context "
      "depths, beside a read-only memory-bandwidth probe measured in the same run.");
  table->Text("model", &f->model, "FILE.gguf", "the model");
  table->Require("model");
  table->Number("threads", &f->threads, "CPU threads; 0 = all cores", 0, 4096);
  table->NumberList("depths", &f->depths, "context depths to measure at", int64_t{0},
                    int64_t{1} << 40);
  table->Number("decode-tokens", &f->decode_tokens, "tokens decoded per depth", int64_t{2},
                int64_t{1} << 20);
  table->Number("repeat", &f->repeat, "runs per depth (the best is shown)", int64_t{1},
                int64_t{1000});
  table->Text("csv", &f->csv, "FILE", "also write the rows to FILE");
  return table;
}

int BenchCommand(const std::vector<std::string>& args) {
  BenchFlags f;
  std::unique_ptr<flags::FlagTable> table = BenchFlagTable(&f);
  if (absl::Status s = table->Parse(args); !s.ok()) {
    std::cerr << "magicpig bench: " << s.message() << "\n(magicpig bench --help lists the flags)\n";
    return 2;
  }
  if (table->help_requested()) {
    std::cout << table->Help();
    return 0;
  }
  const std::vector<int64_t>& depths = f.depths;
  const int64_t* decode_tokens = &f.decode_tokens;
  const int64_t* repeat = &f.repeat;
  engine::EngineOptions options;
  options.model_path = f.model;
  // Exact attention: the throughput baseline (the attention core has its own benchmark).
  options.attention.mode = attention::EstimatorKind::kFull;
  options.num_threads = f.threads;
  int64_t max_depth = 1;
  for (int64_t d : depths) max_depth = std::max(max_depth, d);
  options.context_length = max_depth + *decode_tokens + 1;
  auto loaded = engine::Engine::Load(options);
  if (!loaded.ok()) {
    std::cerr << "magicpig bench: " << loaded.status().message() << "\n";
    return 1;
  }
  engine::Engine& e = **loaded;
  const model::ModelConfig& c = e.config();
  const int n_threads =
      options.num_threads > 0 ? options.num_threads : tbb::this_task_arena::max_concurrency();
  const double probe = MemoryBandwidthProbe(n_threads);
  const double weight_mb = e.weights().weight_bytes() / 1e6;
  std::cout << absl::StrFormat(
      "model: %s | %d layers | weights read per token: %.1f MB | threads: %d | memory probe "
      "(read-only sum, 1 GiB): %.1f GB/s\n",
      c.name, c.n_layer, weight_mb, n_threads, probe);
  std::cout << absl::StrFormat("%8s %14s %14s %16s %12s\n", "depth", "prefill tok/s",
                               "decode tok/s", "decode GB/s read", "of probe");
  std::ofstream csv;
  if (!f.csv.empty()) {
    csv.open(f.csv);
    csv << "depth,threads,prefill_tok_s,decode_tok_s,decode_gb_s,probe_gb_s\n";
  }
  std::mt19937 rng(42);
  std::uniform_int_distribution<int32_t> token(100, static_cast<int32_t>(c.n_vocab) - 1);
  for (int64_t depth : depths) {
    double best_prefill = 0, best_decode = 0;
    for (int64_t rep = 0; rep < *repeat; ++rep) {
      engine::GenerateRequest req;
      req.prompt.resize(std::max<int64_t>(1, depth));
      for (int32_t& t : req.prompt) t = token(rng);
      req.max_tokens = *decode_tokens + 1;
      req.ignore_eos = true;
      auto r = e.Generate(req, {});
      if (!r.ok()) {
        std::cerr << "magicpig bench: " << r.status().message() << "\n";
        return 1;
      }
      best_prefill = std::max(best_prefill, r->stats.prefill_tokens_per_second());
      best_decode = std::max(best_decode, r->stats.decode_tokens_per_second());
    }
    // Bytes one decode step reads: every weight once, plus K and V (fp16) of every position.
    const double kv_bytes = 2.0 * c.n_layer * (depth + *decode_tokens / 2.0) * c.kv_dim() * 2;
    const double gbs = (e.weights().weight_bytes() + kv_bytes) * best_decode / 1e9;
    std::cout << absl::StrFormat("%8d %14s %14.1f %16.1f %11.0f%%\n", depth,
                                 depth > 0 ? absl::StrFormat("%.1f", best_prefill) : "-",
                                 best_decode, gbs, 100 * gbs / probe);
    if (csv.is_open()) {
      csv << depth << "," << n_threads << "," << (depth > 0 ? best_prefill : 0) << ","
          << best_decode << "," << gbs << "," << probe << "\n";
    }
  }
  return 0;
}

}  // namespace magicpig::tools
