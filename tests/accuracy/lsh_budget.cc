// magicpig_lsh_budget: the fraction of keys MagicPIG samples, |S| / n_off, on real model keys, for
// comparison with the paper's Table 9 (docs/architecture.md §4.6). Not part of CI: at 8K tokens
// the prefill alone takes minutes on two cores.
//
//   magicpig_lsh_budget [--model GGUF] [--text FILE]... [--tokens N] [--queries Q] [--seed S]
//                       [--threads T] [--dump FILE] [--configs K:L,K:L,...]
//
// For every sparse layer (all but {0, n_layer/2}) and kv head: the keys [4, n - 64) are centred
// with their mean and hashed into tables for each (K, L) (one SimHash W per config, shared by all
// layers and heads, seed S); every query head of the group, at each of the last Q positions,
// retrieves S (>= 2 collisions) and we record |S| / n_off. Also printed: E[u] = mean over keys of
// the inclusion probability u(cos) (what |S|/n_off should average to), the fraction sampled
// without centering (at the first config), the paper's Table 9 value and the uniform-bucket
// estimate of §11.1. Defaults: SmolLM2, examples/buried_fact.txt repeated, 8000 tokens, Q = 16,
// configs (10,150), (9,120), (8,75). --dump reads keys/queries from a magicpig_dump_qk file
// instead of running the model.
#include <atomic>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/attention/estimators.h"
#include "common/attention/inclusion_probability.h"
#include "common/attention/kv_shard.h"
#include "common/attention/simhash.h"
#include "eval/qk_dump.h"

namespace {

using magicpig::accuracy::QkDump;
using magicpig::attention::EstimatorScratch;
using magicpig::attention::InclusionProbability;
using magicpig::attention::KvShard;
using magicpig::attention::MagicPigEstimator;
using magicpig::attention::SimHash;

struct Config {
  int k, l;
};

// Paper Table 9 (|S|/n on Llama-3.1-8B), for the configs it lists; -1 if not listed.
double Table9(int k, int l) {
  static const int ls[] = {75, 100, 120, 150, 200, 300};
  static const double t[5][6] = {{14, 21, 27, 35, 48, 66},
                                 {5, 8, 11, 15, 22, 36},
                                 {1.6, 2.7, 4, 5.4, 8.5, 15.4},
                                 {0.5, 0.9, 1.5, 2, 3, 6},
                                 {0.15, 0.3, 0.5, 0.6, 1, 2}};
  if (k < 7 || k > 11) return -1;
  for (int j = 0; j < 6; ++j) {
    if (ls[j] == l) return t[k - 7][j] / 100.0;
  }
  return -1;
}

// §11.1: P(Binomial(L, 2^-K) >= 2), keys spread evenly over the buckets.
double UniformBucket(int k, int l) { return InclusionProbability(0.0, k, l); }

struct Cell {
  double frac = 0, expected = 0, uncentred = 0;
  int64_t count = 0;
};

int Usage() {
  std::cerr << "usage: magicpig_lsh_budget [--model GGUF] [--text FILE]... [--tokens N] "
               "[--queries Q] [--seed S] [--threads T] [--dump FILE] [--configs K:L,...]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  magicpig::accuracy::QkCaptureOptions capture;
  capture.model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  capture.n_tokens = 8000;
  capture.n_queries = 16;
  capture.capture_values = false;
  uint64_t seed = 1;
  int threads = 2;
  std::string dump_path;
  std::vector<Config> configs = {{10, 150}, {9, 120}, {8, 75}};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) return Usage();
    const char* v = argv[++i];
    bool ok = true;
    if (arg == "--model") {
      capture.model_path = v;
    } else if (arg == "--text") {
      capture.text_paths.push_back(v);
    } else if (arg == "--tokens") {
      ok = absl::SimpleAtoi(v, &capture.n_tokens);
    } else if (arg == "--queries") {
      ok = absl::SimpleAtoi(v, &capture.n_queries);
    } else if (arg == "--seed") {
      ok = absl::SimpleAtoi(v, &seed);
    } else if (arg == "--threads") {
      ok = absl::SimpleAtoi(v, &threads) && threads >= 1;
    } else if (arg == "--dump") {
      dump_path = v;
    } else if (arg == "--configs") {
      configs.clear();
      for (absl::string_view c : absl::StrSplit(v, ',', absl::SkipEmpty())) {
        std::vector<absl::string_view> kl = absl::StrSplit(c, ':');
        Config cfg{};
        ok = ok && kl.size() == 2 && absl::SimpleAtoi(kl[0], &cfg.k) &&
             absl::SimpleAtoi(kl[1], &cfg.l);
        configs.push_back(cfg);
      }
    } else {
      ok = false;
    }
    if (!ok) return Usage();
  }
  if (capture.text_paths.empty()) capture.text_paths.push_back("examples/buried_fact.txt");
  capture.num_threads = threads;

  absl::StatusOr<QkDump> dump = dump_path.empty() ? magicpig::accuracy::CaptureQk(capture)
                                                  : magicpig::accuracy::ReadQkDump(dump_path);
  if (!dump.ok()) {
    std::cerr << "magicpig_lsh_budget: " << dump.status() << "\n";
    return 1;
  }
  const int64_t n = dump->n_tokens, d = dump->head_dim, group = dump->n_head / dump->n_head_kv;
  const int64_t n_off = n - 68;
  if (n_off <= 0) {
    std::cerr << "magicpig_lsh_budget: need more than 68 tokens\n";
    return 1;
  }
  std::vector<SimHash> hashes;
  for (const Config& c : configs) {
    absl::StatusOr<SimHash> h = SimHash::Create(d, c.k, c.l, seed);
    if (!h.ok()) {
      std::cerr << "magicpig_lsh_budget: " << h.status() << "\n";
      return 1;
    }
    hashes.push_back(*std::move(h));
  }
  // Work items: (dump slot, kv head) of the sparse layers.
  std::vector<std::pair<size_t, int64_t>> items;
  for (size_t s = 0; s < dump->layers.size(); ++s) {
    const int64_t layer = dump->layers[s];
    if (layer == 0 || layer == dump->n_layer_model / 2) continue;
    for (int64_t kvh = 0; kvh < dump->n_head_kv; ++kvh) items.push_back({s, kvh});
  }
  // cells[item][config]
  std::vector<std::vector<Cell>> cells(items.size(), std::vector<Cell>(configs.size()));
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  auto worker = [&]() {
    EstimatorScratch scratch;
    const std::vector<float> zeros(static_cast<size_t>(n_off * d), 0.0f);
    for (size_t it; (it = next.fetch_add(1)) < items.size();) {
      const auto [slot, kvh] = items[it];
      const std::vector<float> keys = dump->HeadRows(dump->keys[slot], kvh, 4, n - 64);
      std::vector<double> acc(static_cast<size_t>(d), 0.0);
      for (int64_t i = 0; i < n_off; ++i) {
        for (int64_t t = 0; t < d; ++t) acc[t] += keys[i * d + t];
      }
      std::vector<float> center(static_cast<size_t>(d));
      for (int64_t t = 0; t < d; ++t) center[t] = static_cast<float>(acc[t] / n_off);
      for (size_t c = 0; c < configs.size(); ++c) {
        const MagicPigEstimator mp(configs[c].k, configs[c].l);
        absl::StatusOr<KvShard> shard =
            KvShard::Create(hashes[c], keys.data(), center.data(), zeros.data(), n_off);
        absl::StatusOr<KvShard> raw = absl::InvalidArgumentError("not built");
        if (c == 0) raw = KvShard::Create(hashes[c], keys.data(), nullptr, zeros.data(), n_off);
        if (!shard.ok() || (c == 0 && !raw.ok())) {
          failed = true;
          return;
        }
        Cell& cell = cells[it][c];
        std::vector<uint16_t> codes(static_cast<size_t>(configs[c].l));
        for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
          for (int64_t j = 0; j < dump->n_queries; ++j) {
            const float* q = dump->Query(slot, j, h);
            if (!hashes[c].Codes(q, 1, d, codes.data()).ok()) {
              failed = true;
              return;
            }
            absl::StatusOr<magicpig::attention::PartialAttention> r =
                mp.Attend(*shard, q, codes.data(), 1.0f, &scratch);
            if (!r.ok()) {
              failed = true;
              return;
            }
            cell.frac += static_cast<double>(r->n_touched) / static_cast<double>(n_off);
            if (c == 0) {
              absl::StatusOr<magicpig::attention::PartialAttention> u =
                  mp.Attend(*raw, q, codes.data(), 1.0f, &scratch);
              if (!u.ok()) {
                failed = true;
                return;
              }
              cell.uncentred += static_cast<double>(u->n_touched) / static_cast<double>(n_off);
            }
            double qn = 0;
            for (int64_t t = 0; t < d; ++t) qn += static_cast<double>(q[t]) * q[t];
            qn = std::sqrt(qn);
            double eu = 0;
            for (int64_t i = 0; i < n_off; ++i) {
              const double den = qn * shard->KeyNorm(i);
              eu += InclusionProbability(den > 0 ? shard->KeyDot(i, q) / den : 0.0, configs[c].k,
                                         configs[c].l);
            }
            cell.expected += eu / static_cast<double>(n_off);
            ++cell.count;
          }
        }
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker);
  for (std::thread& t : pool) t.join();
  if (failed) {
    std::cerr << "magicpig_lsh_budget: an estimator call failed\n";
    return 1;
  }

  std::printf("SmolLM2 keys: %lld tokens (n_off = %lld), %lld queries per head, seed %llu\n",
              static_cast<long long>(n), static_cast<long long>(n_off),
              static_cast<long long>(dump->n_queries), static_cast<unsigned long long>(seed));
  if (dump->text_tokens > 0) {
    std::printf("one pass over the text: %lld tokens (repeated to reach %lld)\n",
                static_cast<long long>(dump->text_tokens), static_cast<long long>(n));
  }
  std::printf("\n");
  std::printf("| layer |");
  for (const Config& c : configs) std::printf(" (%d, %d) |S|/n |", c.k, c.l);
  std::printf(" (%d, %d) uncentred |\n|---:|", configs[0].k, configs[0].l);
  for (size_t c = 0; c <= configs.size(); ++c) std::printf("---:|");
  std::printf("\n");
  std::vector<Cell> total(configs.size());
  size_t it = 0;
  while (it < items.size()) {
    const size_t slot = items[it].first;
    std::vector<Cell> layer(configs.size());
    for (; it < items.size() && items[it].first == slot; ++it) {
      for (size_t c = 0; c < configs.size(); ++c) {
        for (Cell* dst : {&layer[c], &total[c]}) {
          dst->frac += cells[it][c].frac;
          dst->expected += cells[it][c].expected;
          dst->uncentred += cells[it][c].uncentred;
          dst->count += cells[it][c].count;
        }
      }
    }
    std::printf("| %lld |", static_cast<long long>(dump->layers[slot]));
    for (const Cell& cell : layer) std::printf(" %.2f%% |", 100 * cell.frac / cell.count);
    std::printf(" %.3f%% |\n", 100 * layer[0].uncentred / layer[0].count);
  }
  std::printf("\n| (K, L) | measured mean |S|/n | E[u] | Table 9 | uniform-bucket estimate |\n");
  std::printf("|---|---:|---:|---:|---:|\n");
  for (size_t c = 0; c < configs.size(); ++c) {
    const Cell& cell = total[c];
    const double t9 = Table9(configs[c].k, configs[c].l);
    char t9_text[32] = "-";
    if (t9 >= 0) std::snprintf(t9_text, sizeof(t9_text), "%.3g%%", 100 * t9);
    std::printf("| (%d, %d) | %.2f%% | %.2f%% | %s | %.2f%% |\n", configs[c].k, configs[c].l,
                100 * cell.frac / cell.count, 100 * cell.expected / cell.count, t9_text,
                100 * UniformBucket(configs[c].k, configs[c].l));
  }
  std::printf("\nwithout centering, (%d, %d): %.3f%%\n", configs[0].k, configs[0].l,
              100 * total[0].uncentred / total[0].count);
  return 0;
}
