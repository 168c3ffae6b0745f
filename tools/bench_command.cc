#include "tools/bench_command.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/attention/estimator_registry.h"
#include "common/attention/spotlight_hash.h"
#include "gpu_node/engine/engine.h"
#include "gpu_node/engine/engine_flags.h"
#include "tbb/task_arena.h"
#include "tools/memory_probe.h"

namespace magicpig::tools {
namespace {

// One (depth, mode) run: prefill, then decode step by step with the step's timings.
struct Run {
  double prefill_tps = 0;
  double decode_tps = 0;
  int64_t steps = 0;  // decode steps that ran a forward pass
  engine::GenerateStats stats;
  engine::StepTimings timings;
  double sampling = 0;
  double step_wall = 0;
  attention::AttentionRunner::PhaseStats estimator;
  int64_t shard_bytes = 0;  // the batch's shards (KV rows + tables), summed over its sequences
};

// What the system could give this process now (MemAvailable), in bytes; -1 where unknown.
int64_t AvailableHostBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key, unit;
  int64_t kib = 0;
  while (meminfo >> key >> kib) {
    std::getline(meminfo, unit);
    if (key == "MemAvailable:") return kib * 1024;
  }
  return -1;
}

// The request RunBatch starts for one prompt.
engine::GenerateRequest BenchRequest(const std::vector<int32_t>& prompt, int64_t decode_tokens,
                                     const engine::SparseAttentionOptions& attention) {
  engine::GenerateRequest req;
  req.prompt = prompt;
  req.max_tokens = decode_tokens + 1;
  req.ignore_eos = true;
  req.attention = attention;
  return req;
}

// `prompts.size()` sequences prefilled one after the other, then decoded together.
absl::StatusOr<Run> RunBatch(engine::Engine& e, const std::vector<std::vector<int32_t>>& prompts,
                             int64_t decode_tokens,
                             const engine::SparseAttentionOptions& attention) {
  (void)e.TakeEstimatorPhaseStats();
  std::vector<std::unique_ptr<engine::Sequence>> seqs;
  Run run;
  int64_t prompt_tokens = 0;
  double prefill_seconds = 0;
  for (const std::vector<int32_t>& prompt : prompts) {
    const engine::GenerateRequest req = BenchRequest(prompt, decode_tokens, attention);
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<std::unique_ptr<engine::Sequence>> seq = e.Start(req, {});
    if (!seq.ok()) return seq.status();
    prefill_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    prompt_tokens += static_cast<int64_t>(prompt.size());
    seqs.push_back(*std::move(seq));
  }
  int64_t decoded = 0;
  for (;;) {
    std::vector<engine::Sequence*> batch;
    for (auto& s : seqs) {
      if (!s->finished()) batch.push_back(s.get());
    }
    if (batch.empty()) break;
    const auto start = std::chrono::steady_clock::now();
    if (absl::Status s = e.Step(batch, &run.timings, &run.sampling); !s.ok()) return s;
    run.step_wall +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    int64_t going_on = 0;
    for (engine::Sequence* s : batch) going_on += s->finished() ? 0 : 1;
    // A step samples one token per sequence from the last logits and runs a forward pass for the
    // sequences that go on: those passes are the decode work timed here.
    decoded += going_on;
    if (going_on > 0) ++run.steps;
  }
  // The finished sequences' memory is freed on the engine's deleter thread: wait for it here, so
  // that it is timed neither in this run's steps nor in the next run.
  e.DrainReleases();
  run.estimator = e.TakeEstimatorPhaseStats();
  for (auto& s : seqs) {
    engine::GenerateStats st = s->TakeResult().stats;
    run.stats.attention_keys_touched += st.attention_keys_touched;
    run.stats.attention_keys_offloaded += st.attention_keys_offloaded;
    run.stats.attention_phases.hash += st.attention_phases.hash;
    run.stats.attention_phases.window += st.attention_phases.window;
    run.stats.attention_phases.shards += st.attention_phases.shards;
    run.stats.attention_phases.merge += st.attention_phases.merge;
    run.shard_bytes += st.attention_shard_bytes;
  }
  run.prefill_tps = prefill_seconds > 0 ? prompt_tokens / prefill_seconds : 0;
  run.decode_tps = run.step_wall > 0 ? decoded / run.step_wall : 0;
  return run;
}

std::string ModeName(const engine::SparseAttentionOptions& a) {
  std::string name(attention::EstimatorName(a.mode));
  if (attention::SpecOf(a.mode).retrieves) absl::StrAppend(&name, "(", a.lsh_k, ",", a.lsh_l, ")");
  return name;
}

}  // namespace

StepBytes DecodeStepBytes(const model::ModelConfig& c, int64_t weight_bytes,
                          const engine::SparseAttentionOptions& attention, int64_t pos,
                          int64_t generated, double keys_touched_per_step, int64_t spotlight_bits) {
  StepBytes b;
  b.weights = static_cast<double>(weight_bytes);
  const double kv_row = 2.0 * 2.0 * static_cast<double>(c.kv_dim());  // fp16 K and V
  const attention::EstimatorSpec& spec = attention::SpecOf(attention.mode);
  const int64_t window =
      attention.n_sinks + std::min(attention.n_local + generated, attention.window_budget);
  // At the step decoding position pos the cache holds pos + 1 positions.
  if (!spec.sparse || pos <= window || !engine::RegionOffloads(attention, pos + 1)) {
    b.exact_kv = static_cast<double>(c.n_layer) * static_cast<double>(pos) * kv_row;
    return b;
  }
  const std::vector<bool> dense = engine::DenseLayers(c.n_layer, attention);
  const int64_t n_dense = std::count(dense.begin(), dense.end(), true);
  const int64_t n_sparse = c.n_layer - n_dense;
  const int64_t offloaded = pos - window;
  b.exact_kv = (static_cast<double>(n_dense) * static_cast<double>(pos) +
                static_cast<double>(n_sparse) * static_cast<double>(window)) *
               kv_row;
  const double element = attention.storage == attention::KvStorage::kF32 ? 4.0 : 2.0;
  const double hd = static_cast<double>(c.head_dim);
  if (spec.retrieves) {
    b.sampled = keys_touched_per_step * 2.0 * hd * element;  // K and V of each touched row
    const double index_bytes = offloaded < 65536 ? 2.0 : 4.0;
    b.buckets =
        static_cast<double>(n_sparse * c.n_head) * attention.lsh_l *
        (static_cast<double>(offloaded) / static_cast<double>(int64_t{1} << attention.lsh_k)) *
        index_bytes;
  } else if (spec.codes != attention::CodeSource::kSimHash) {
    // spotlight and sketch scan every offloaded key's code per kv head, score rerank x the kept
    // keys exactly (their key rows) and read the kept keys' values; the vattention variants do
    // not rescore (their touched keys are the exact set and the sample, key and value each).
    const double code_bytes = spec.codes == attention::CodeSource::kKeySketch
                                  ? static_cast<double>(attention.sketch_dims)
                                  : static_cast<double>(spotlight_bits) / 8.0;
    b.buckets =
        static_cast<double>(n_sparse * c.n_head_kv) * static_cast<double>(offloaded) * code_bytes;
    const int64_t rerank = spec.verified ? 1 : std::max<int64_t>(1, attention.spotlight_rerank);
    b.sampled = keys_touched_per_step * hd * element * (1.0 + static_cast<double>(rerank));
  } else {
    // Top-k and oracle sampling score every offloaded key, then read the chosen rows' values.
    b.sampled = static_cast<double>(n_sparse * c.n_head_kv) * static_cast<double>(offloaded) * hd *
                    element +
                keys_touched_per_step * hd * element;
  }
  return b;
}

std::unique_ptr<flags::FlagTable> BenchFlagTable(BenchFlags* f) {
  auto table = std::make_unique<flags::FlagTable>(
      "magicpig bench",
      "Prefill and decode throughput at several context depths in the chosen decode attention, "
      "against exact attention measured in the same run, with the bytes a decode step must read "
      "and the bound they set at the bandwidth of a memory probe measured in the same run.");
  engine::DeclareModelFlags(*table, &f->engine);
  table->Section("benchmark");
  table->NumberList("depths", &f->depths, "context depths to measure at", int64_t{0},
                    int64_t{1} << 40);
  table->Number("decode-tokens", &f->decode_tokens, "tokens decoded per depth", int64_t{2},
                int64_t{1} << 20);
  table->NumberList("batch", &f->batches,
                    "sequences decoded together (each row: that many prompts of the depth); "
                    "a batch that does not fit (in --gpu-kv-budget, device memory, or "
                    "--host-kv-budget, by default 90% of the host memory left when the run "
                    "starts) is reported and larger ones skipped",
                    int64_t{1}, int64_t{4096});
  table->Number("repeat", &f->repeat, "rounds per depth (the best is shown)", int64_t{1},
                int64_t{1000});
  table->Choice("baseline", &f->baseline,
                "also measure exact attention (full) at every depth, alternating with the mode",
                {{"full", true}, {"none", false}});
  table->Switch(
      "breakdown", &f->breakdown,
      "time the decode step's phases (dense, hashing, window, shards, merge, sampling) and "
      "price a sampled step's counted random reads (the DRAM floor)");
  table->Text("csv", &f->csv, "FILE", "also write the rows to FILE");
  engine::DeclareAttentionFlags(*table, &f->engine.attention);
  engine::DeclareAttentionNodeFlags(*table, &f->engine);
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
  engine::EngineOptions options = f.engine;
  options.attention.time_phases = f.breakdown;
  int64_t max_depth = 1;
  for (int64_t d : f.depths) max_depth = std::max(max_depth, d);
  const bool batched = f.batches.size() > 1 || f.batches[0] != 1;
  if (options.context_length == 0) options.context_length = max_depth + f.decode_tokens + 1;
  // Embedded shards live in this process: unless told otherwise, the engine admits sequences into
  // 90% of the memory the system has left (--host-kv-budget), so that a batch too large for it is
  // reported as not fitting instead of the kernel killing the run.
  if (options.host_kv_budget == 0 && options.attention_nodes.empty()) {
    const int64_t available = AvailableHostBytes();
    if (available > 0) options.host_kv_budget = available / 10 * 9;
  }
  auto loaded = engine::Engine::Load(options);
  if (!loaded.ok()) {
    std::cerr << "magicpig bench: " << loaded.status().message() << "\n";
    return 1;
  }
  engine::Engine& e = **loaded;
  const model::ModelConfig& c = e.config();
  const int n_threads =
      options.num_threads > 0 ? options.num_threads : tbb::this_task_arena::max_concurrency();
  // The shards' key rows: bf16 or fp32 (the value rows the same).
  const int64_t row_bytes =
      c.head_dim * (options.attention.storage == attention::KvStorage::kF32 ? 4 : 2);
  const MemoryRates memory = ProbeMemory(n_threads, row_bytes);
  const double probe = memory.stream_gb_per_s;
  std::cout << absl::StrFormat(
      "model: %s | %d layers | weights read per token: %.1f MB | threads: %d | memory probe "
      "(1 GiB): read-only sum %.1f GB/s, random lines %.1f ns each, gathered %d-byte K+V rows "
      "%.1f ns each | attention %s | backend %s\n",
      c.name, c.n_layer, e.weights().weight_bytes() / 1e6, n_threads, probe,
      memory.random_ns_per_line, 2 * row_bytes, memory.gather_ns_per_row,
      options.attention_nodes.empty()
          ? std::string("embedded")
          : absl::StrCat("on ", options.attention_nodes.size(), " node(s)"),
      e.backend().Describe());
  // Rows: the baseline first when there is one, then the mode.
  std::vector<engine::SparseAttentionOptions> modes;
  engine::SparseAttentionOptions exact = options.attention;
  exact.mode = attention::EstimatorKind::kFull;
  if (f.baseline && options.attention.mode != attention::EstimatorKind::kFull) {
    modes.push_back(exact);
  }
  modes.push_back(options.attention);
  std::cout << absl::StrFormat("%7s %5s %-16s %10s %10s %9s %9s %8s %8s %8s %9s %8s %8s %9s\n",
                               "depth", "batch", "attention", "prefill/s", "decode/s", "vs full",
                               "MB/step", "KV MB", "rows MB", "keys %", "bound/s", "of bound",
                               "GB/s", "shards MB");
  // Each row leaves as soon as it is measured, so a run cut short by a time limit (the device
  // check's) keeps what it finished.
  std::cout.flush();
  std::ofstream csv;
  if (!f.csv.empty()) {
    csv.open(f.csv);
    csv << "depth,batch,attention,threads,prefill_tok_s,decode_tok_s,vs_full,step_mb,exact_kv_mb,"
           "sampled_mb,bucket_mb,keys_sampled,bound_tok_s,probe_gb_s,shard_mb\n";
  }
  std::mt19937 rng(42);
  std::uniform_int_distribution<int32_t> token(100, static_cast<int32_t>(c.n_vocab) - 1);
  {
    // One untimed short run per mode first, so that one-time costs (scratch and workspace
    // allocations, a device library's first calls, first touches of the weights) land in no row:
    // without it the first mode's first prefill carried them (docs/gpu.md: a 2x prefill gap at 1K
    // on the GPU that was the order). Its own generator: the measured prompts stay the same.
    std::mt19937 warm_rng(7);
    const int64_t warm_tokens = std::clamp<int64_t>(options.context_length - 3, 1, 256);
    std::vector<std::vector<int32_t>> warm(1, std::vector<int32_t>(warm_tokens));
    for (int32_t& t : warm[0]) t = token(warm_rng);
    for (const engine::SparseAttentionOptions& mode : modes) {
      absl::StatusOr<Run> r = RunBatch(e, warm, 2, mode);
      if (!r.ok()) {
        std::cerr << "magicpig bench: warm-up: " << r.status().message() << "\n";
        return 1;
      }
    }
  }
  for (int64_t depth : f.depths) {
    std::vector<bool> too_big(modes.size(), false);  // a smaller batch of the mode did not fit
    for (int64_t batch : f.batches) {
      std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(batch));
      for (std::vector<int32_t>& prompt : prompts) {
        prompt.resize(static_cast<size_t>(std::max<int64_t>(1, depth)));
        for (int32_t& t : prompt) t = token(rng);
      }
      std::vector<Run> best(modes.size());
      std::vector<StepBytes> step_bytes(modes.size());  // per mode, from its row (the floor's too)
      std::vector<bool> fits(modes.size(), true);
      std::vector<std::string> why(modes.size(),
                                   options.gpu_kv_budget > 0 ? "--gpu-kv-budget" : "memory");
      for (int64_t round = 0; round < f.repeat; ++round) {
        for (size_t m = 0; m < modes.size(); ++m) {
          if (too_big[m] || !fits[m]) continue;
          // The engine would admit the batch's first sequences and refuse the rest: what the
          // whole batch is charged, known before any prefill, says so at once.
          const int64_t host_need =
              batch * e.HostBytesFor(BenchRequest(prompts[0], f.decode_tokens, modes[m]));
          if (batched && options.host_kv_budget > 0 && host_need > options.host_kv_budget) {
            fits[m] = false;
            why[m] = absl::StrFormat("--host-kv-budget: %.1f GB for the batch, %.1f GB allowed",
                                     host_need / 1e9, options.host_kv_budget / 1e9);
            continue;
          }
          absl::StatusOr<Run> r = RunBatch(e, prompts, f.decode_tokens, modes[m]);
          if (absl::IsResourceExhausted(r.status()) && batched) {
            fits[m] = false;
            continue;
          }
          if (!r.ok()) {
            std::cerr << "magicpig bench: " << r.status().message() << "\n";
            return 1;
          }
          if (r->decode_tps > best[m].decode_tps) best[m] = *std::move(r);
        }
      }
      const bool has_full = modes[0].mode == attention::EstimatorKind::kFull && fits[0];
      const double full_tps = has_full ? best[0].decode_tps : 0;
      for (size_t m = 0; m < modes.size(); ++m) {
        if (too_big[m]) continue;
        if (!fits[m]) {
          std::cout << absl::StrFormat("%7d %5d %-16s  does not fit (%s)\n", depth, batch,
                                       ModeName(modes[m]), why[m]);
          too_big[m] = true;
          continue;
        }
        const Run& r = best[m];
        const double steps = static_cast<double>(std::max<int64_t>(1, r.steps));
        const double touched =
            static_cast<double>(r.stats.attention_keys_touched) / (steps * batch);
        // Mid-decode: position depth + decode_tokens / 2 with half the tokens generated; the
        // weights are read once per step, the rest once per sequence.
        step_bytes[m] =
            DecodeStepBytes(c, e.weights().weight_bytes(), modes[m],
                            std::max<int64_t>(1, depth) + f.decode_tokens / 2, f.decode_tokens / 2,
                            touched, e.spotlight() != nullptr ? e.spotlight()->bits() : 0);
        const StepBytes& one = step_bytes[m];
        const double n = static_cast<double>(batch);
        const double total = one.weights + n * (one.total() - one.weights);
        const double bound = probe * 1e9 / total * n;  // tokens/s: n tokens per step
        // The probe measures host memory: on a device backend the weights and the exact KV are
        // read from device memory, so a bound from it means nothing there ("-").
        const bool host_bound = e.backend().host_memory();
        std::cout << absl::StrFormat(
            "%7d %5d %-16s %10s %10.1f %9s %9.1f %8.1f %8.1f %8s %9s %8s %8.1f %9.1f\n", depth,
            batch, ModeName(modes[m]), depth > 0 ? absl::StrFormat("%.1f", r.prefill_tps) : "-",
            r.decode_tps, full_tps > 0 ? absl::StrFormat("%.2fx", r.decode_tps / full_tps) : "-",
            total / 1e6, n * one.exact_kv / 1e6, n * (one.sampled + one.buckets) / 1e6,
            r.stats.attention_keys_offloaded > 0
                ? absl::StrFormat("%.2f", 100.0 * r.stats.sampled_fraction())
                : "-",
            host_bound ? absl::StrFormat("%.1f", bound) : "-",
            host_bound ? absl::StrFormat("%.0f%%", 100.0 * r.decode_tps / bound) : "-",
            r.decode_tps / n * total / 1e9, r.shard_bytes / 1e6);
        if (csv.is_open()) {
          csv << depth << "," << batch << "," << ModeName(modes[m]) << "," << n_threads << ","
              << (depth > 0 ? r.prefill_tps : 0) << "," << r.decode_tps << ","
              << (full_tps > 0 ? r.decode_tps / full_tps : 0) << "," << total / 1e6 << ","
              << n * one.exact_kv / 1e6 << "," << n * one.sampled / 1e6 << ","
              << n * one.buckets / 1e6 << "," << r.stats.sampled_fraction() << "," << bound << ","
              << probe << "," << r.shard_bytes / 1e6 << "\n";
        }
      }
      if (f.breakdown) {
        for (size_t m = 0; m < modes.size(); ++m) {
          if (!fits[m] || too_big[m]) continue;
          const Run& r = best[m];
          const double n = std::max<int64_t>(1, r.steps);
          const engine::AttentionPhaseSeconds& p = r.stats.attention_phases;
          const double ms = 1e3 / n;
          std::cout << absl::StrFormat(
              "        ms/step %-16s step %.2f = dense %.2f (LM head and logits copy %.2f) + "
              "attention %.2f (sparse layers: hash %.2f, window %.2f, shards %.2f [retrieve %.2f, "
              "kernel %.2f thread-ms], merge %.2f) + sampling %.2f + other %.2f\n",
              ModeName(modes[m]), r.step_wall * ms, r.timings.dense * ms, r.timings.logits * ms,
              r.timings.attention * ms, p.hash * ms, p.window * ms, p.shards * ms,
              r.estimator.retrieve * ms, r.estimator.kernel * ms, p.merge * ms, r.sampling * ms,
              (r.step_wall - r.timings.dense - r.timings.attention - r.sampling) * ms);
          if (r.timings.device_wait > 0) {
            // Device backends: what of the attention was the host waiting on the device's copies
            // (and the device work queued before them), queueing the sparse layers' device work,
            // and in the hook's start and finish (which hold the shards and the merge above).
            const engine::StepTimings& t = r.timings;
            std::cout << absl::StrFormat(
                "        ms/step %-16s of attention: device waits %.2f, launches [mirror %.2f, "
                "hash "
                "%.2f, window %.2f], hook start %.2f, hook finish %.2f, rest %.2f\n",
                ModeName(modes[m]), t.device_wait * ms, t.device_mirror * ms, t.device_hash * ms,
                t.device_window * ms, t.hook_start * ms, t.hook_finish * ms,
                (t.attention - t.device_wait - t.device_mirror - t.device_hash - t.device_window -
                 t.hook_start - t.hook_finish) *
                    ms);
          }
          const attention::AttentionRunner::PhaseStats& est = r.estimator;
          if (est.bucket_runs + est.union_rows > 0) {
            // The DRAM floor: every read of the step from memory at the probes' rates and nothing
            // else costing time. Streamed: the weights, the exact KV (dense layers, windows), the
            // pending segments' codes and the bucket lines that follow another (a long bucket's
            // entries); random: the first line of each run of bucket lines (random lines' rate)
            // and the union's rows (the gather's rate). The bound column prices everything at the
            // streaming rate, which random reads cannot reach.
            const double steps = static_cast<double>(std::max<int64_t>(1, r.steps));
            const double batch_n = static_cast<double>(batch);
            const StepBytes& one = step_bytes[m];
            const double runs = est.bucket_runs / steps;
            const double rows = est.union_rows / steps;
            // On a device backend the weights and the exact KV are the device's reads: the floor
            // is then the host's share (the sampled attention's) alone.
            const bool on_host = e.backend().host_memory();
            const double streamed =
                (on_host ? one.weights + batch_n * one.exact_kv : 0.0) +
                (est.pending_bytes + 64.0 * (est.bucket_lines - est.bucket_runs)) / steps;
            const double floor_s =
                streamed / (probe * 1e9) +
                (runs * memory.random_ns_per_line + rows * memory.gather_ns_per_row) * 1e-9;
            const double floor_tps = batch_n / floor_s;
            std::cout << absl::StrFormat(
                "        %s %-16s streamed %.1f MB, random bucket lines %.1fK (of %.1fK), "
                "union rows %.1fK = floor %.2f ms (%.1f tok/s); reached %.0f%%\n",
                on_host ? "reads/step" : "host reads/step", ModeName(modes[m]), streamed / 1e6,
                runs / 1e3, est.bucket_lines / steps / 1e3, rows / 1e3, floor_s * 1e3, floor_tps,
                100.0 * r.decode_tps / floor_tps);
          }
        }
      }
      std::cout.flush();
    }
  }
  return 0;
}

}  // namespace magicpig::tools
