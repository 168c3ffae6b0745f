// MagicPIG attention core benchmarks (issue #3): one decode step of one sparse layer at
// Llama-3.1-8B shapes (32 query heads, 8 kv heads, d = 128, GQA groups of 4), `magicpig(K, L)`
// against `full` on the same data in the same process, next to a read-only memory-bandwidth probe.
//
// Cases, in run order:
//   Probe/threads:T            read-only sum over a 1 GiB buffer (std::thread), GB/s.
//   RandomLines/threads:T      independent reads of random cache lines of the 1 GiB buffer, 32
//                              prefetched ahead (RandomLineSeconds): ns_per_line, the rate at
//                              which retrieval's bucket lines and a sampled union's rows can
//                              arrive.
//   GatherRows/layout/threads:T
//                              the gather floor's probe alone (GatherSecondsPerRow): ns_per_row
//                              for a union's 512-byte rows with the key and value rows in two
//                              arrays (split, KvShard's layout) or adjacent (interleaved).
//   QueryHash/K/L              SimHash::Codes of the 32 query heads of one step.
//   MagicPig/n/K/L/threads     AttentionRunner(T) running MagicPigEstimator::AttendGroup over the 8
//                              (shard, kv head) GroupWork items of one step (retrieval + gather +
//                              group kernel): the reported time. In the same loop (timed apart):
//                              every iteration first hashes the step's 32 queries (hash_us, in a
//                              T-thread arena); every kFullEvery-th iteration also runs
//                              FullEstimator on the same shards and queries (full_ms) and the 8
//                              group retrievals (KvShard::RetrieveGroup) alone on this thread
//                              (retr_cpu_ms). speedup = full /
//                              magicpig, step_speedup = full / (hash + magicpig); for T = 1 also
//                              cpu_ms, full_cpu_ms and speedup_cpu from thread CPU time (see
//                              Stamp). GBps = bytes / magicpig time; probe_GBps is measured right
//                              after the loop (ProbeGbps) and of_probe = GBps / probe_GBps.
//                              gather_floor_ms = the step's union rows x the seconds per row of
//                              a gather that only reads rows (GatherSecondsPerRow, same threads)
//                              and speedup_bound = full_ms / gather_floor_ms: the most a sampled
//                              step can gain over full here, with retrieval and arithmetic free.
//   VAttention[Lsh]/n/K/L/eps/delta/base/threads
//                              vattention / vattention-lsh(K, L) AttendGroup over the same 8 items
//                              at two (epsilon, delta, base rate) settings, `full` every
//                              kFullEvery-th iteration in the same loop: speedup = full / it,
//                              keys_frac = keys touched per query head / n, GBps and of_probe from
//                              the bytes it read (BM_VAttention).
//   Spotlight/n/bits/fraction[/rerank]/threads, Sketch/n/dims/fraction/threads
//                              spotlight over the same keys in codes-only shards (random-hyperplane
//                              codes of `bits`), `fraction` retrieved per head (rescored from
//                              `rerank` times as many nearest keys), `full` in the same loop:
//                              speedup = full / it (BM_Spotlight); Sketch: the same over low-rank
//                              key sketches of `dims` int8 coordinates (--attention sketch).
//   VAttentionSketch/n/dims/candidates/threads
//                              vattention-sketch over the Sketch case's shards: the `candidates`
//                              fraction best by sketch exact, the rest sampled for (0.3, 0.1) at
//                              base rate 0.02; keys_frac = keys touched per query head / n.
//   TableBuild/K/L/threads     LshTables::Build of 64K keys x 8 kv heads vs ten cold reads of the
//                              same keys (bf16, read with the probe's sum on the shards' buffers),
//                              after one untimed build (first_build_ms: the process's first large
//                              allocations wait for the kernel's huge pages).
//   KeyHash/K/L/threads        SimHash::KeyCodes of those 64K x 8 centred keys (the other half of
//                              a shard's build: the bf16 kernel where the CPU has AVX512_BF16),
//                              Mkeys/s and GFLOP/s (2 d K L per key); KeyHashFp32 the same keys
//                              through the fp32 kernel (what CPUs without AVX512_BF16 run).
//   Full/n/threads             FullEstimator over all n keys of the 8 kv heads, GB/s and the
//                              fraction of the probe.
//   TopK/n, Oracle/n           the baselines (budget n / 50 per head, one thread) through
//                              AttendGroup (the kernel's logits), with the same estimator's
//                              per-head float64 Attend (reference_ms; the path they had before)
//                              and FullEstimator (full_ms) in the same loop: speedup =
//                              reference / AttendGroup, of_full = AttendGroup / full.
//
// Every timed attention step and table build starts from a cold cache: a 256 MiB buffer is read
// first (not timed), because the L3 (105 MiB here) would otherwise hold a 16K or 32K layer, and the
// decode of a real model reads 31 other layers between two steps of one layer. Times are manual
// (wall clock around the timed call), so the flush never counts.
//
// Bytes read per step: full = n x 8 x 128 x (2 + 2) (bf16 keys and values). magicpig = per kv head,
// the union of the group's sample sets x (256 B key + 256 B value + 4 B key norm) + 4 B per bucket
// entry scanned by the 32 heads' retrievals (the CSR offsets and the per-thread collision
// counters are not counted). frac = mean over heads of |S_h| / n (the paper's Cost2); union_frac =
// mean over kv heads of |union of the group's S_h| / n (the rows actually gathered).
//
// Test data (MakeKeys / MakeQueries). Per kv head, a fixed geometry drawn from its own seed:
//   a_k       unit key-cone axis;
//   a_q       unit query-cone axis at cos(a_q, a_k) = -0.5 (queries and keys in separate cones);
//   U         kRank = 32 directions (rows N(0, 1/d): nearly orthonormal), the low-rank subspace
//             where keys vary; scale lambda_j = kKeySpread * 0.95^j.
// Token i's key: k_i = kKeyAxis a_k + sum_j lambda_j z_ij U_j + kNoise eps_i (z, eps ~ N(0, 1)),
// a narrow cone around a_k (mean cos(k_i, a_k) = 0.84); token 0 is the attention sink,
// k_0 = -kSinkScale kKeyAxis a_k + kNoise eps_0, opposite the cone (after centring it has the
// largest norm and the largest score for every query). Values are N(0, 1). Keys are centred with
// their mean (KvShard::Create's center), as the attention node does. Keys are generated token by
// token from the head's seed, so a shorter context is a prefix of a longer one.
// Query of head h (group member m of kv head g) at decode step s:
//   q = kQueryAxis a_q + sum_j lambda_j (rho w_sj + sqrt(1 - rho^2) e_hsj) U_j + kNoise eps
// with w_s shared by the group at that step and e per head (rho^2 = 0.5: the queries of one group
// are at mean cosine 0.78: correlated but different). The query's part in U spreads
// cos(q, k_i - c) with std 0.117 (isotropic keys in d = 128 would give 0.088; the sink sits at
// cos 0.38), which gives sampled fractions near the paper's Table 9 (2% at (10, 150), 4% at
// (9, 120), 5% at (8, 75)); docs/attention-core-bench.md has the measured fractions.
//
// Data sets (shards of every kv head for one (n, K, L)) are built once and cached; building the
// next one frees the previous one, so the peak stays near one data set (128K: 512 MiB of bf16 K/V +
// ~600 MiB of tables at L = 150) plus the 256 MiB flush and 1 GiB probe buffers.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/attention/attention_runner.h"
#include "common/attention/estimators.h"
#include "common/attention/key_sketch.h"
#include "common/attention/kv_shard.h"
#include "common/attention/lsh_tables.h"
#include "common/attention/partial_attention.h"
#include "common/attention/simhash.h"
#include "common/attention/spotlight_estimator.h"
#include "common/attention/vattention.h"
#include "common/cpu_features.h"
#include "common/half.h"
#include "tbb/parallel_for.h"
#include "tbb/task_arena.h"

namespace magicpig {

using ::magicpig::attention::AttentionRunner;
using ::magicpig::attention::CodeScore;
using ::magicpig::attention::Estimator;
using ::magicpig::attention::FullEstimator;
using ::magicpig::attention::GroupWork;
using ::magicpig::attention::KeySketch;
using ::magicpig::attention::KvIndex;
using ::magicpig::attention::KvShard;
using ::magicpig::attention::KvStorage;
using ::magicpig::attention::LshScratch;
using ::magicpig::attention::LshTables;
using ::magicpig::attention::MagicPigEstimator;
using ::magicpig::attention::OracleEstimator;
using ::magicpig::attention::PartialAttention;
using ::magicpig::attention::SimHash;
using ::magicpig::attention::SpotlightCandidates;
using ::magicpig::attention::SpotlightEstimator;
using ::magicpig::attention::SpotlightRetrieved;
using ::magicpig::attention::TopKEstimator;
using ::magicpig::attention::VAttentionEstimator;
using ::magicpig::attention::VAttentionLshEstimator;
using ::magicpig::attention::VAttentionParams;
namespace {

constexpr int kQHeads = 32;
constexpr int kKvHeads = 8;
constexpr int kGroup = kQHeads / kKvHeads;
constexpr int64_t kDim = 128;
constexpr int kSteps = 8;      // query sets (decode steps) per data set, used round-robin
constexpr int kFullEvery = 4;  // magicpig cases run `full` on every kFullEvery-th iteration
constexpr uint64_t kHashSeed = 0x6d61676963706967ull;
constexpr int64_t kTableBuildN = 65536;

// Generator knobs (see the file comment).
constexpr int kRank = 32;
constexpr float kKeyAxis = 6.0f;
constexpr float kKeySpread = 1.0f;
constexpr float kNoise = 0.2f;
constexpr float kSinkScale = 3.0f;
constexpr float kQueryAxis = 6.0f;
constexpr float kQueryRho2 = 0.5f;

const float kScale = 1.0f / std::sqrt(static_cast<float>(kDim));

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Wall clock and the calling thread's CPU time. Other jobs on this shared 2-core machine take
// turns on the cores; thread CPU time leaves their turns out (stalls on memory still count), so for
// one thread (AttentionRunner(1) and a one-slot arena run the work on the calling thread) it is
// the steadier figure: the *_cpu counters. Two-thread cases report wall time only.
struct Stamp {
  Clock::time_point wall;
  double cpu;
};

Stamp Now() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return {Clock::now(), static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9};
}

struct Lap {
  double wall = 0, cpu = 0;
  int64_t runs = 0;
  // Adds b - a; returns the wall seconds of this lap.
  double Add(const Stamp& a, const Stamp& b) {
    const double w = Seconds(a.wall, b.wall);
    wall += w;
    cpu += b.cpu - a.cpu;
    ++runs;
    return w;
  }
  double MeanWall() const { return runs > 0 ? wall / runs : 0; }
  double MeanCpu() const { return runs > 0 ? cpu / runs : 0; }
};

// ---------------------------------------------------------------------------------------------
// Memory reads: the probe, the cache flush and the key-read reference share one sum.

using AliasU64 = uint64_t __attribute__((may_alias));

uint64_t SumWords(const void* p, size_t bytes) {
  const AliasU64* w = static_cast<const AliasU64*>(p);
  const size_t n = bytes / 8;
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += w[i];
    s1 += w[i + 1];
    s2 += w[i + 2];
    s3 += w[i + 3];
  }
  for (; i < n; ++i) s0 += w[i];
  return s0 + s1 + s2 + s3;
}

struct Span {
  const void* p;
  size_t bytes;
};

// Read-only sum over the buffers, each split evenly over `threads` std::threads (the calling
// thread takes the first part).
uint64_t ParallelSum(const std::vector<Span>& bufs, int threads) {
  std::vector<uint64_t> sums(static_cast<size_t>(threads), 0);
  auto part = [&](int t) {
    uint64_t s = 0;
    for (const Span& b : bufs) {
      const size_t words = b.bytes / 8;
      const size_t w0 = words * t / threads, w1 = words * (t + 1) / threads;
      s += SumWords(static_cast<const char*>(b.p) + w0 * 8, (w1 - w0) * 8);
    }
    sums[static_cast<size_t>(t)] = s;
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(part, t);
  part(0);
  for (auto& th : pool) th.join();
  uint64_t s = 0;
  for (uint64_t x : sums) s += x;
  return s;
}

std::vector<uint64_t> FilledBuffer(size_t bytes) {
  std::vector<uint64_t> buf(bytes / 8);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = i;
  return buf;
}

// Evicts the caches (L3 is 105 MiB on the development machine) by reading 256 MiB.
void FlushCaches() {
  static const std::vector<uint64_t> flush = FilledBuffer(size_t{256} << 20);
  {
    const uint64_t sum = ParallelSum({{flush.data(), flush.size() * 8}}, 2);
    benchmark::DoNotOptimize(sum);
  }
}

const std::vector<uint64_t>& ProbeBuffer() {
  static const std::vector<uint64_t> buf = FilledBuffer(size_t{1} << 30);  // 1 GiB
  return buf;
}

// Best of two reads of the 1 GiB probe buffer with `threads` threads, GB/s: the probe_GBps
// counter of the attention cases, measured right after each case's loop (the bandwidth left to
// this machine varies with its neighbours, so a figure from the start of the run is not enough).
double ProbeGbps(int threads) {
  const std::vector<uint64_t>& buf = ProbeBuffer();
  double best = 1e30;
  for (int r = 0; r < 2; ++r) {
    const auto t0 = Clock::now();
    {
      const uint64_t sum = ParallelSum({{buf.data(), buf.size() * 8}}, threads);
      benchmark::DoNotOptimize(sum);
    }
    best = std::min(best, Seconds(t0, Clock::now()));
  }
  return static_cast<double>(buf.size() * 8) / best * 1e-9;
}

// Best of two runs of part(t, &sum) on `threads` threads at once (t = 0 on this one), each after
// a cache flush: the wall seconds of a probe whose threads each read their own share.
template <class Part>
double BestOfTwoColdSeconds(int threads, const Part& part) {
  double best = 1e30;
  for (int r = 0; r < 2; ++r) {
    FlushCaches();
    std::vector<uint64_t> sums(static_cast<size_t>(threads));
    const auto t0 = Clock::now();
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(part, t, &sums[static_cast<size_t>(t)]);
    part(0, &sums[0]);
    for (auto& th : pool) th.join();
    best = std::min(best, Seconds(t0, Clock::now()));
    benchmark::DoNotOptimize(sums.data());
  }
  return best;
}

// The physical floor of a sampled step: seconds per gathered row when rows are only read, no
// arithmetic. The 1 GiB probe buffer is two arrays of 256-byte rows (the bf16 key and value rows
// at d = 128); each row of the key array is taken with probability kGatherFraction (about the
// union fraction of magicpig(10, 150)), in increasing order like a group's union, and one word of
// each of its 8 cache lines (4 key, 4 value) is summed, with the kernel's two prefetch stages
// (into L2 kGatherFarRows rows ahead, into L1 4 rows ahead; group_attention_kernel-inl.h). Best of
// two runs with `threads` threads, each on its own contiguous part of the rows.
constexpr double kGatherFraction = 0.079;
constexpr size_t kGatherFarRows = 24;  // the kernel's kFarPrefetchBytes over a 512-byte row
double GatherSecondsPerRow(int threads, bool interleaved = false) {
  const std::vector<uint64_t>& buf = ProbeBuffer();
  constexpr size_t kRowWords = 256 / 8;
  const size_t rows_per_array = buf.size() / 2 / kRowWords;
  static const std::vector<uint32_t> picked = [&] {
    std::vector<uint32_t> out;
    std::mt19937_64 rng(77);
    std::bernoulli_distribution take(kGatherFraction);
    for (size_t r = 0; r < rows_per_array; ++r) {
      if (take(rng)) out.push_back(static_cast<uint32_t>(r));
    }
    return out;
  }();
  const AliasU64* base = reinterpret_cast<const AliasU64*>(buf.data());
  // Split: all key rows, then all value rows (KvShard's layout). Interleaved: row r's key and
  // value rows adjacent, 512 contiguous bytes.
  const size_t row_stride = interleaved ? 2 * kRowWords : kRowWords;
  const AliasU64* keys = base;
  const AliasU64* values = interleaved ? base + kRowWords : base + rows_per_array * kRowWords;
  auto part = [&](int t, uint64_t* out) {
    const size_t b = picked.size() * t / threads, e = picked.size() * (t + 1) / threads;
    uint64_t s = 0;
    for (size_t i = b; i < e; ++i) {
      if (i + kGatherFarRows < e) {
        for (size_t w = 0; w < kRowWords; w += 8) {
          __builtin_prefetch(keys + picked[i + kGatherFarRows] * row_stride + w, 0, 2);
          __builtin_prefetch(values + picked[i + kGatherFarRows] * row_stride + w, 0, 2);
        }
      }
      if (i + 4 < e) {
        for (size_t w = 0; w < kRowWords; w += 8) {
          __builtin_prefetch(keys + picked[i + 4] * row_stride + w);
          __builtin_prefetch(values + picked[i + 4] * row_stride + w);
        }
      }
      for (size_t w = 0; w < kRowWords; w += 8) {
        s += keys[picked[i] * row_stride + w] + values[picked[i] * row_stride + w];
      }
    }
    *out = s;
  };
  return BestOfTwoColdSeconds(threads, part) / static_cast<double>(picked.size());
}

void BM_GatherRows(benchmark::State& state, int threads, bool interleaved) {
  double seconds = 0;
  int64_t iter = 0;
  for (auto _ : state) {
    seconds += GatherSecondsPerRow(threads, interleaved);
    ++iter;
  }
  if (iter > 0) state.counters["ns_per_row"] = seconds / static_cast<double>(iter) * 1e9;
}

// The physical floor of the retrieval: seconds per cache line when independent random lines are
// read with the retrieval's pipelining (each line's address known kLineAhead lines ahead and
// prefetched then, one word of it summed). 2^21 random lines of the 1 GiB probe buffer, split
// over `threads` threads; best of two runs. A bucket lookup reads one line of offsets and then
// the line(s) of its entries, whose address the offsets give: the pipeline overlaps those two
// dependent misses with the other lookups' misses, so per line it can at best match this probe.
double RandomLineSeconds(int threads) {
  const std::vector<uint64_t>& buf = ProbeBuffer();
  constexpr size_t kLineWords = 64 / 8;
  constexpr int kLineAhead = 32;
  static const std::vector<uint32_t> lines = [&] {
    std::vector<uint32_t> out(size_t{1} << 21);
    std::mt19937_64 rng(78);
    std::uniform_int_distribution<uint32_t> pick(
        0, static_cast<uint32_t>(buf.size() / kLineWords - 1));
    for (uint32_t& x : out) x = pick(rng);
    return out;
  }();
  const AliasU64* words = reinterpret_cast<const AliasU64*>(buf.data());
  auto part = [&](int t, uint64_t* out) {
    const size_t b = lines.size() * t / threads, e = lines.size() * (t + 1) / threads;
    uint64_t s = 0;
    for (size_t i = b; i < e; ++i) {
      if (i + kLineAhead < e) __builtin_prefetch(words + lines[i + kLineAhead] * kLineWords);
      s += words[lines[i] * kLineWords];
    }
    *out = s;
  };
  return BestOfTwoColdSeconds(threads, part) / static_cast<double>(lines.size());
}

void BM_RandomLines(benchmark::State& state, int threads) {
  double seconds = 0;
  int64_t iter = 0;
  for (auto _ : state) {
    seconds += RandomLineSeconds(threads);
    ++iter;
  }
  if (iter > 0) state.counters["ns_per_line"] = seconds / static_cast<double>(iter) * 1e9;
}

void BM_Probe(benchmark::State& state, int threads) {
  const std::vector<uint64_t>& buf = ProbeBuffer();
  double seconds = 0;
  int64_t iter = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    const uint64_t sum = ParallelSum({{buf.data(), buf.size() * 8}}, threads);
    seconds += Seconds(t0, Clock::now());
    ++iter;
    benchmark::DoNotOptimize(sum);
  }
  if (iter > 0)
    state.counters["GBps"] = static_cast<double>(buf.size() * 8) * iter / seconds * 1e-9;
}

// ---------------------------------------------------------------------------------------------
// Test data.

struct HeadGeometry {
  std::vector<float> key_axis;    // [d] unit
  std::vector<float> query_axis;  // [d] unit, cos with key_axis = -0.5
  std::vector<float> basis;       // [kRank][d]
  std::vector<float> lambda;      // [kRank]
};

void Normalize(std::vector<float>* v) {
  double sq = 0;
  for (float x : *v) sq += static_cast<double>(x) * x;
  const float inv = static_cast<float>(1.0 / std::sqrt(sq));
  for (float& x : *v) x *= inv;
}

HeadGeometry MakeGeometry(int kv_head) {
  std::mt19937_64 rng(1000 + kv_head);
  std::normal_distribution<float> nd;
  HeadGeometry g;
  g.key_axis.resize(kDim);
  for (float& x : g.key_axis) x = nd(rng);
  Normalize(&g.key_axis);
  // A unit vector orthogonal to a_k, then a_q = -0.5 a_k + sqrt(0.75) b.
  std::vector<float> b(kDim);
  for (float& x : b) x = nd(rng);
  double dot = 0;
  for (int64_t t = 0; t < kDim; ++t) dot += b[t] * g.key_axis[t];
  for (int64_t t = 0; t < kDim; ++t) b[t] -= static_cast<float>(dot) * g.key_axis[t];
  Normalize(&b);
  g.query_axis.resize(kDim);
  for (int64_t t = 0; t < kDim; ++t) {
    g.query_axis[t] = -0.5f * g.key_axis[t] + std::sqrt(0.75f) * b[t];
  }
  g.basis.resize(kRank * kDim);
  const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(kDim));
  for (float& x : g.basis) x = nd(rng) * inv_sqrt_d;
  g.lambda.resize(kRank);
  for (int j = 0; j < kRank; ++j) g.lambda[j] = kKeySpread * std::pow(0.95f, static_cast<float>(j));
  return g;
}

// keys, values: [n][d]; center: [d] mean key.
void MakeKeys(const HeadGeometry& g, int kv_head, int64_t n, std::vector<float>* keys,
              std::vector<float>* values, std::vector<float>* center) {
  std::mt19937_64 rng(2000 + kv_head);
  std::normal_distribution<float> nd;
  keys->assign(static_cast<size_t>(n * kDim), 0.0f);
  values->resize(static_cast<size_t>(n * kDim));
  std::vector<double> sum(kDim, 0.0);
  float z[kRank];
  for (int64_t i = 0; i < n; ++i) {
    float* k = keys->data() + i * kDim;
    if (i == 0) {
      for (int64_t t = 0; t < kDim; ++t) {
        k[t] = -kSinkScale * kKeyAxis * g.key_axis[t] + kNoise * nd(rng);
      }
    } else {
      for (int j = 0; j < kRank; ++j) z[j] = g.lambda[j] * nd(rng);
      for (int64_t t = 0; t < kDim; ++t) k[t] = kKeyAxis * g.key_axis[t] + kNoise * nd(rng);
      for (int j = 0; j < kRank; ++j) {
        const float* u = g.basis.data() + j * kDim;
        for (int64_t t = 0; t < kDim; ++t) k[t] += z[j] * u[t];
      }
    }
    for (int64_t t = 0; t < kDim; ++t) sum[t] += k[t];
    float* v = values->data() + i * kDim;
    for (int64_t t = 0; t < kDim; ++t) v[t] = nd(rng);
  }
  center->resize(kDim);
  for (int64_t t = 0; t < kDim; ++t)
    (*center)[t] = static_cast<float>(sum[t] / std::max<int64_t>(n, 1));
}

// [kSteps][kQHeads][d] raw queries.
std::vector<float> MakeQueries(const std::vector<HeadGeometry>& geo) {
  std::vector<float> q(static_cast<size_t>(kSteps * kQHeads * kDim));
  const float rho = std::sqrt(kQueryRho2), rest = std::sqrt(1.0f - kQueryRho2);
  for (int s = 0; s < kSteps; ++s) {
    for (int g = 0; g < kKvHeads; ++g) {
      std::mt19937_64 rng(3000 + s * 64 + g);
      std::normal_distribution<float> nd;
      float shared[kRank];
      for (int j = 0; j < kRank; ++j) shared[j] = nd(rng);
      for (int m = 0; m < kGroup; ++m) {
        float* qh = q.data() + (static_cast<int64_t>(s) * kQHeads + g * kGroup + m) * kDim;
        for (int64_t t = 0; t < kDim; ++t) {
          qh[t] = kQueryAxis * geo[g].query_axis[t] + kNoise * nd(rng);
        }
        for (int j = 0; j < kRank; ++j) {
          const float w = geo[g].lambda[j] * (rho * shared[j] + rest * nd(rng));
          const float* u = geo[g].basis.data() + j * kDim;
          for (int64_t t = 0; t < kDim; ++t) qh[t] += w * u[t];
        }
      }
    }
  }
  return q;
}

struct StepStats {
  double frac = 0;        // mean |S_h| / n over the 32 heads
  double union_frac = 0;  // mean |union| / n over the 8 kv heads
  double bytes = 0;       // bytes read by the step (see the file comment)
  double entries = 0;     // bucket entries scanned by the 32 retrievals
  double lines = 0;       // distinct cache lines those retrievals read: one line of offsets and
                          // the lines that a bucket's entries span, per (head, table) lookup
};

struct DataSet {
  int64_t n = 0;
  int k = 0, l = 0;
  std::unique_ptr<SimHash> hash;
  std::vector<KvShard> shards;   // [kv head]
  std::vector<float> q;          // [kSteps][kQHeads][d]
  std::vector<uint16_t> codes;   // [kSteps][kQHeads][L]
  std::vector<StepStats> stats;  // [kSteps]
  double build_s = 0;
};

StepStats ComputeStats(const DataSet& ds, int step) {
  StepStats st;
  LshScratch scratch;
  std::vector<int32_t> sample;
  std::vector<uint8_t> in_union(static_cast<size_t>(ds.n), 0);
  for (int g = 0; g < kKvHeads; ++g) {
    const KvShard& shard = ds.shards[g];
    int64_t union_size = 0;
    for (int m = 0; m < kGroup; ++m) {
      const uint16_t* c =
          ds.codes.data() + (static_cast<int64_t>(step) * kQHeads + g * kGroup + m) * ds.l;
      (void)shard.Retrieve(c, &scratch, &sample);
      st.frac += static_cast<double>(sample.size()) / ds.n / kQHeads;
      for (int32_t i : sample) {
        if (!in_union[i]) ++union_size;
        in_union[i] = 1;
      }
      for (int t = 0; t < ds.l; ++t) {
        const std::vector<int32_t> off = shard.tables().TableOffsets(t);
        st.entries += off[c[t] + 1] - off[c[t]];
        // The offsets' line, then the entries' lines (index bytes each, from the table's start).
        const int64_t ib = shard.tables().index_bytes();
        const int64_t first = off[c[t]] * ib / 64, last = (off[c[t] + 1] * ib - 1) / 64;
        st.lines += 1 + (off[c[t] + 1] > off[c[t]] ? last - first + 1 : 0);
      }
    }
    std::fill(in_union.begin(), in_union.end(), 0);
    st.union_frac += static_cast<double>(union_size) / ds.n / kKvHeads;
    st.bytes += static_cast<double>(union_size) * (kDim * 2 * 2 + 4);
  }
  st.bytes += st.entries * 4;
  return st;
}

std::unique_ptr<DataSet> g_data;  // the one cached data set

// Shards for (n, K, L) (cached; building another frees this one first). nullptr on error.
const DataSet* GetDataSet(int64_t n, int k, int l) {
  if (g_data && g_data->n == n && g_data->k == k && g_data->l == l) return g_data.get();
  g_data.reset();
  const auto t0 = Clock::now();
  auto ds = std::make_unique<DataSet>();
  ds->n = n;
  ds->k = k;
  ds->l = l;
  absl::StatusOr<SimHash> hash = SimHash::Create(kDim, k, l, kHashSeed);
  if (!hash.ok()) return nullptr;
  ds->hash = std::make_unique<SimHash>(*std::move(hash));
  std::vector<HeadGeometry> geo;
  for (int g = 0; g < kKvHeads; ++g) geo.push_back(MakeGeometry(g));
  std::vector<std::unique_ptr<KvShard>> shards(kKvHeads);
  std::vector<absl::Status> status(kKvHeads);
  tbb::parallel_for(0, kKvHeads, [&](int g) {
    std::vector<float> keys, values, center;
    MakeKeys(geo[g], g, n, &keys, &values, &center);
    absl::StatusOr<KvShard> shard =
        KvShard::Create(*ds->hash, keys.data(), center.data(), values.data(), n, KvStorage::kBf16);
    if (!shard.ok()) {
      status[g] = shard.status();
      return;
    }
    shards[g] = std::make_unique<KvShard>(*std::move(shard));
  });
  for (int g = 0; g < kKvHeads; ++g) {
    if (!status[g].ok()) {
      std::fprintf(stderr, "KvShard::Create: %s\n", std::string(status[g].message()).c_str());
      return nullptr;
    }
    ds->shards.push_back(std::move(*shards[g]));
  }
  ds->q = MakeQueries(geo);
  ds->codes.resize(static_cast<size_t>(kSteps * kQHeads * l));
  if (!ds->hash->Codes(ds->q.data(), kSteps * kQHeads, kDim, ds->codes.data()).ok()) return nullptr;
  for (int s = 0; s < kSteps; ++s) ds->stats.push_back(ComputeStats(*ds, s));
  ds->build_s = Seconds(t0, Clock::now());
  std::fprintf(stderr, "[data set n=%lld K=%d L=%d: %.1f s to generate and build 8 shards]\n",
               static_cast<long long>(n), k, l, ds->build_s);
  g_data = std::move(ds);
  return g_data.get();
}

// Any cached data set with n keys, else builds (n, 10, 150).
const DataSet* GetAnyDataSet(int64_t n) {
  if (g_data && g_data->n == n) return g_data.get();
  return GetDataSet(n, 10, 150);
}

// Work items of one step: kv head g's shard with its 4 query heads.
std::vector<GroupWork> MakeWork(const DataSet& ds, const float* q, const uint16_t* codes,
                                PartialAttention* out) {
  std::vector<GroupWork> work(kKvHeads);
  for (int g = 0; g < kKvHeads; ++g) {
    work[g].shard = &ds.shards[g];
    work[g].q = q + g * kGroup * kDim;
    work[g].codes = codes != nullptr ? codes + g * kGroup * ds.l : nullptr;
    work[g].g = kGroup;
    work[g].out = out + g * kGroup;
  }
  return work;
}

double FullBytes(int64_t n) { return static_cast<double>(n) * kKvHeads * kDim * 2 * 2; }

// ---------------------------------------------------------------------------------------------
// Cases.

void BM_QueryHash(benchmark::State& state, int k, int l) {
  absl::StatusOr<SimHash> hash = SimHash::Create(kDim, k, l, kHashSeed);
  std::vector<HeadGeometry> geo;
  for (int g = 0; g < kKvHeads; ++g) geo.push_back(MakeGeometry(g));
  const std::vector<float> q = MakeQueries(geo);
  std::vector<uint16_t> codes(static_cast<size_t>(kQHeads * l));
  int64_t i = 0;
  // One thread (SimHash::Codes splits a block's columns over the caller's arena).
  tbb::task_arena one(1);
  for (auto _ : state) {
    const float* qs = q.data() + (i++ % kSteps) * kQHeads * kDim;
    absl::Status status;
    one.execute([&] { status = hash->Codes(qs, kQHeads, kDim, codes.data()); });
    if (!status.ok()) {
      state.SkipWithError("SimHash::Codes failed");
      return;
    }
    benchmark::DoNotOptimize(codes.data());
  }
}

// SimHash::Codes at one SIMD level for the queries of one decode step of the demo model
// (SmolLM2-135M: 9 query heads of d = 64), the per-sequence, per-layer call of the engine's
// router: 28 such calls per token. GFMAs = n x d x K x L / time.
void BM_QueryHashSmall(benchmark::State& state, int heads, int64_t dim, int k, int l,
                       SimdLevel level) {
  absl::StatusOr<SimHash> hash = SimHash::Create(dim, k, l, kHashSeed);
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(kSteps * heads * dim));
  for (float& v : q) v = normal(rng);
  std::vector<uint16_t> codes(static_cast<size_t>(heads * l));
  int64_t i = 0;
  tbb::task_arena one(1);  // one thread, as in QueryHash
  for (auto _ : state) {
    const float* qs = q.data() + (i++ % kSteps) * heads * dim;
    absl::Status status;
    one.execute([&] { status = hash->CodesAtLevel(qs, heads, dim, codes.data(), level); });
    if (!status.ok()) {
      state.SkipWithError("SimHash::CodesAtLevel failed");
      return;
    }
    benchmark::DoNotOptimize(codes.data());
  }
  state.counters["GFMAs"] = benchmark::Counter(static_cast<double>(heads) * dim * k * l * 1e-9,
                                               benchmark::Counter::kIsIterationInvariantRate);
}

// `full` on the same shards and queries as the measured estimator, cold caches, timed into *lap;
// false (and the benchmark skipped) if it fails.
bool TimeFullStep(benchmark::State& state, AttentionRunner& runner, const FullEstimator& full,
                  const DataSet& ds, const float* q, PartialAttention* out, Lap* lap) {
  const std::vector<GroupWork> work = MakeWork(ds, q, nullptr, out);
  FlushCaches();
  const Stamp t0 = Now();
  const absl::Status st = runner.Run(full, work, kScale);
  lap->Add(t0, Now());
  if (!st.ok()) state.SkipWithError("full step failed");
  return st.ok();
}

void BM_MagicPig(benchmark::State& state, int64_t n, int k, int l, int threads) {
  const DataSet* ds = GetDataSet(n, k, l);
  if (ds == nullptr) {
    state.SkipWithError("data set build failed");
    return;
  }
  AttentionRunner runner(threads);
  tbb::task_arena hash_arena(threads);
  const MagicPigEstimator magicpig(k, l);
  const FullEstimator full;
  std::vector<PartialAttention> out(kQHeads), full_out(kQHeads);
  std::vector<uint16_t> codes(static_cast<size_t>(kQHeads * l));
  // Warm-up (allocates the per-thread scratch and the outputs).
  for (int s = 0; s < kSteps; ++s) {
    const float* q = ds->q.data() + s * kQHeads * kDim;
    const uint16_t* c = ds->codes.data() + s * kQHeads * l;
    if (!runner.Run(magicpig, MakeWork(*ds, q, c, out.data()), kScale).ok()) {
      state.SkipWithError("magicpig step failed");
      return;
    }
  }
  (void)runner.Run(full, MakeWork(*ds, ds->q.data(), nullptr, full_out.data()), kScale);
  LshScratch lsh;
  std::vector<int32_t> sample;
  std::vector<uint32_t> sample_masks;
  int64_t iter = 0;
  Lap mp, hash, fl, retrieve;
  double bytes = 0, frac = 0, union_frac = 0;
  for (auto _ : state) {
    const int s = static_cast<int>(iter % kSteps);
    const float* q = ds->q.data() + s * kQHeads * kDim;
    if (iter % kFullEvery == 0) {
      if (!TimeFullStep(state, runner, full, *ds, q, full_out.data(), &fl)) return;
      // Retrieval alone (the 8 RetrieveGroup calls inside AttendGroup), on this thread.
      const uint16_t* c = ds->codes.data() + s * kQHeads * l;
      FlushCaches();
      const Stamp t1 = Now();
      for (int kv = 0; kv < kKvHeads; ++kv) {
        (void)ds->shards[kv].RetrieveGroup(c + kv * kGroup * l, kGroup, &lsh, &sample,
                                           &sample_masks);
      }
      retrieve.Add(t1, Now());
    }
    const std::vector<GroupWork> work = MakeWork(*ds, q, codes.data(), out.data());
    FlushCaches();
    const Stamp t0 = Now();
    absl::Status st;
    hash_arena.execute([&] { st = ds->hash->Codes(q, kQHeads, kDim, codes.data()); });
    const Stamp t1 = Now();
    if (st.ok()) st = runner.Run(magicpig, work, kScale);
    const Stamp t2 = Now();
    if (!st.ok()) {
      state.SkipWithError("magicpig step failed");
      return;
    }
    hash.Add(t0, t1);
    state.SetIterationTime(mp.Add(t1, t2));
    bytes += ds->stats[s].bytes;
    frac += ds->stats[s].frac;
    union_frac += ds->stats[s].union_frac;
    ++iter;
  }
  if (iter == 0) return;
  state.counters["frac"] = frac / iter;
  state.counters["union_frac"] = union_frac / iter;
  state.counters["bytes"] = bytes / iter;
  const double probe = ProbeGbps(threads);
  state.counters["GBps"] = bytes / mp.wall * 1e-9;
  state.counters["probe_GBps"] = probe;
  state.counters["of_probe"] = bytes / mp.wall * 1e-9 / probe;
  state.counters["full_ms"] = fl.MeanWall() * 1e3;
  state.counters["speedup"] = fl.MeanWall() / mp.MeanWall();
  state.counters["hash_us"] = hash.MeanWall() * 1e6;
  state.counters["step_speedup"] = fl.MeanWall() / (mp.MeanWall() + hash.MeanWall());
  state.counters["retr_cpu_ms"] = retrieve.MeanCpu() * 1e3;
  // The retrieval's lines at the random-line probe's rate (one thread, as the timed retrieval),
  // and the speedup over full that the gather floor plus this floor allow.
  double lines = 0;
  for (const StepStats& st : ds->stats) lines += st.lines;
  lines /= static_cast<double>(ds->stats.size());
  const double retr_floor_s = lines * RandomLineSeconds(1);
  state.counters["retr_lines"] = lines;
  state.counters["retr_floor_ms"] = retr_floor_s * 1e3;
  // What the union rows alone would cost at the gather probe's rate, and the speedup over full
  // that this floor allows.
  const double gather_s =
      union_frac / iter * static_cast<double>(ds->n) * kKvHeads * GatherSecondsPerRow(threads);
  state.counters["gather_floor_ms"] = gather_s * 1e3;
  state.counters["speedup_bound"] = fl.MeanWall() / gather_s;
  // Gather and retrieval floors together (both probes' seconds are wall time with `threads`).
  state.counters["speedup_bound2"] =
      fl.MeanWall() / (gather_s + lines * RandomLineSeconds(threads));
  if (threads == 1) {
    state.counters["cpu_ms"] = mp.MeanCpu() * 1e3;
    state.counters["full_cpu_ms"] = fl.MeanCpu() * 1e3;
    state.counters["speedup_cpu"] = fl.MeanCpu() / mp.MeanCpu();
  }
}

// The same n keys per kv head cut into blocks of `block` keys, one shard (and table set) per
// block, as the engine and the attention nodes store a sequence (--shard-block, default 16,384):
// magicpig(10, 150) over all (kv head, block) work items, against the unblocked case above. The
// sample sets are the same (a key's collisions do not depend on its block); a block multiplies
// the bucket lookups (L per head and block) and shrinks each lookup's entries.
void BM_MagicPigBlocks(benchmark::State& state, int64_t n, int64_t block, int threads) {
  constexpr int k = 10, l = 150;
  const DataSet* ds = GetDataSet(n, k, l);
  if (ds == nullptr) {
    state.SkipWithError("data set build failed");
    return;
  }
  const int64_t blocks = (n + block - 1) / block;
  // The block shards of the last (n, block), [kv head][block], kept for the next repetition.
  static struct {
    int64_t n = 0, block = 0;
    std::vector<KvShard> shards;
  } cached;
  std::vector<KvShard>* shards = &cached.shards;
  if (cached.n != n || cached.block != block) {
    shards->clear();
    cached.n = 0;
    std::vector<HeadGeometry> geo;
    for (int g = 0; g < kKvHeads; ++g) geo.push_back(MakeGeometry(g));
    for (int g = 0; g < kKvHeads; ++g) {
      std::vector<float> keys, values, center;
      MakeKeys(geo[g], g, n, &keys, &values, &center);  // the unblocked shards' keys and centre
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t first = b * block, m = std::min(block, n - first);
        absl::StatusOr<KvShard> shard =
            KvShard::Create(*ds->hash, keys.data() + first * kDim, center.data(),
                            values.data() + first * kDim, m, KvStorage::kBf16);
        if (!shard.ok()) {
          state.SkipWithError("block shard build failed");
          return;
        }
        shards->push_back(*std::move(shard));
      }
    }
    cached.n = n;
    cached.block = block;
  }
  AttentionRunner runner(threads);
  const MagicPigEstimator magicpig(k, l);
  const FullEstimator full;
  std::vector<PartialAttention> out(static_cast<size_t>(kQHeads * blocks)), full_out(kQHeads);
  auto work_for = [&](int s) {
    const float* q = ds->q.data() + s * kQHeads * kDim;
    const uint16_t* c = ds->codes.data() + s * kQHeads * l;
    std::vector<GroupWork> work;
    for (int g = 0; g < kKvHeads; ++g) {
      for (int64_t b = 0; b < blocks; ++b) {
        GroupWork w;
        w.shard = &(*shards)[static_cast<size_t>(g * blocks + b)];
        w.q = q + g * kGroup * kDim;
        w.codes = c + g * kGroup * l;
        w.g = kGroup;
        w.out = out.data() + (b * kQHeads + g * kGroup);
        work.push_back(w);
      }
    }
    return work;
  };
  for (int s = 0; s < kSteps; ++s) (void)runner.Run(magicpig, work_for(s), kScale);  // warm-up
  LshScratch lsh;
  std::vector<int32_t> sample;
  std::vector<uint32_t> sample_masks;
  Lap mp, fl, retrieve;
  int64_t iter = 0;
  for (auto _ : state) {
    const int s = static_cast<int>(iter % kSteps);
    if (iter % kFullEvery == 0) {
      if (!TimeFullStep(state, runner, full, *ds, ds->q.data() + s * kQHeads * kDim,
                        full_out.data(), &fl)) {
        return;
      }
      const uint16_t* c = ds->codes.data() + s * kQHeads * l;
      FlushCaches();
      const Stamp t1 = Now();
      for (int g = 0; g < kKvHeads; ++g) {
        for (int64_t b = 0; b < blocks; ++b) {
          (void)(*shards)[static_cast<size_t>(g * blocks + b)].RetrieveGroup(
              c + g * kGroup * l, kGroup, &lsh, &sample, &sample_masks);
        }
      }
      retrieve.Add(t1, Now());
    }
    const std::vector<GroupWork> work = work_for(s);
    FlushCaches();
    const Stamp t0 = Now();
    if (!runner.Run(magicpig, work, kScale).ok()) {
      state.SkipWithError("magicpig step failed");
      return;
    }
    state.SetIterationTime(mp.Add(t0, Now()));
    ++iter;
  }
  if (iter == 0) return;
  state.counters["blocks"] = static_cast<double>(blocks);
  state.counters["full_ms"] = fl.MeanWall() * 1e3;
  state.counters["speedup"] = fl.MeanWall() / mp.MeanWall();
  state.counters["retr_cpu_ms"] = retrieve.MeanCpu() * 1e3;
}

void BM_Full(benchmark::State& state, int64_t n, int threads) {
  const DataSet* ds = GetAnyDataSet(n);
  if (ds == nullptr) {
    state.SkipWithError("data set build failed");
    return;
  }
  AttentionRunner runner(threads);
  const FullEstimator full;
  std::vector<PartialAttention> out(kQHeads);
  (void)runner.Run(full, MakeWork(*ds, ds->q.data(), nullptr, out.data()), kScale);
  int64_t iter = 0;
  Lap lap;
  for (auto _ : state) {
    const float* q = ds->q.data() + (iter++ % kSteps) * kQHeads * kDim;
    const std::vector<GroupWork> work = MakeWork(*ds, q, nullptr, out.data());
    FlushCaches();
    const Stamp t0 = Now();
    const absl::Status st = runner.Run(full, work, kScale);
    state.SetIterationTime(lap.Add(t0, Now()));
    if (!st.ok()) {
      state.SkipWithError("full step failed");
      return;
    }
  }
  if (iter == 0) return;
  const double gbps = FullBytes(n) / lap.MeanWall() * 1e-9, probe = ProbeGbps(threads);
  state.counters["bytes"] = FullBytes(n);
  state.counters["GBps"] = gbps;
  state.counters["probe_GBps"] = probe;
  state.counters["of_probe"] = gbps / probe;
  if (threads == 1) {
    state.counters["cpu_ms"] = lap.MeanCpu() * 1e3;
    state.counters["GBps_cpu"] = FullBytes(n) / lap.MeanCpu() * 1e-9;
    state.counters["of_probe_cpu"] = FullBytes(n) / lap.MeanCpu() * 1e-9 / probe;
  }
}

// vattention / vattention-lsh(K, L) with `params` (the defaults, and a looser bound) over the 8
// (shard, kv head) items of one step, FullEstimator on the same shards and queries in the same
// loop: speedup = full / estimator; keys_frac = keys touched / keys held (per query head);
// GBps = the bytes the estimator read (vattention: every key row, and the values of the keys it
// touched; vattention-lsh: key and value rows of the keys it touched) / its time.
void BM_VAttention(benchmark::State& state, int64_t n, int k, int l, bool lsh, int threads,
                   VAttentionParams params) {
  const DataSet* ds = GetDataSet(n, k, l);
  if (ds == nullptr) {
    state.SkipWithError("data set build failed");
    return;
  }
  AttentionRunner runner(threads);
  const VAttentionEstimator va(params, 1234);
  const VAttentionLshEstimator val(k, l, params, 1234);
  const Estimator& est = lsh ? static_cast<const Estimator&>(val) : va;
  const FullEstimator full;
  std::vector<PartialAttention> out(kQHeads), full_out(kQHeads);
  (void)runner.Run(full, MakeWork(*ds, ds->q.data(), nullptr, full_out.data()), kScale);
  int64_t iter = 0;
  Lap lap, fl;
  double touched = 0;
  for (auto _ : state) {
    const int s = static_cast<int>(iter % kSteps);
    const float* q = ds->q.data() + s * kQHeads * kDim;
    const uint16_t* c = ds->codes.data() + s * kQHeads * l;
    if (iter % kFullEvery == 0 &&
        !TimeFullStep(state, runner, full, *ds, q, full_out.data(), &fl)) {
      return;
    }
    const std::vector<GroupWork> work = MakeWork(*ds, q, c, out.data());
    FlushCaches();
    const Stamp t0 = Now();
    const absl::Status st = runner.Run(est, work, kScale);
    state.SetIterationTime(lap.Add(t0, Now()));
    if (!st.ok()) {
      state.SkipWithError("vattention step failed");
      return;
    }
    for (const PartialAttention& p : out) touched += static_cast<double>(p.n_touched);
    ++iter;
  }
  if (iter == 0) return;
  const double keys_frac = touched / iter / (static_cast<double>(n) * kQHeads);
  // Rows of one kv head read: every key (vattention) plus the touched values, or the touched
  // keys and values (lsh); a touched row counts once per group (the kernel reads it once).
  const double row = kDim * 2.0;
  const double bytes = lsh ? keys_frac * n * kKvHeads * kGroup * 2 * row
                           : (static_cast<double>(n) + keys_frac * n * kGroup) * kKvHeads * row;
  const double probe = ProbeGbps(threads);
  state.counters["keys_frac"] = keys_frac;
  state.counters["full_ms"] = fl.MeanWall() * 1e3;
  state.counters["speedup"] = fl.MeanWall() / lap.MeanWall();
  state.counters["GBps"] = bytes / lap.MeanWall() * 1e-9;
  state.counters["probe_GBps"] = probe;
  state.counters["of_probe"] = bytes / lap.MeanWall() * 1e-9 / probe;
}

// spotlight over the 8 kv heads' keys of the (n, 10, 150) data set, held in codes-only shards with
// `bits`-bit codes from random hyperplanes (SimHash with K = 16, L = bits / 16: the retrieval and
// attention cost the same as with trained codes of that length; training changes which keys are
// near, not how many), `fraction` of the keys retrieved per head; FullEstimator on the same
// queries in the same loop: speedup = full / spotlight. GBps counts every key's code (bits / 8
// bytes) plus the union of the group's retrieved rows (key and value) and, with rerank > 1, of
// the rescored candidates' keys.
//
// With CodeScore::kSketch the same over low-rank key sketches of bits / 8 int8 coordinates
// (key_sketch.h, fitted per kv head on its keys; `sketch`'s cost does not depend on the fit
// either): the scan is an integer dot product per key instead of a popcount.
void BM_Spotlight(benchmark::State& state, int64_t n, int bits, double fraction, int64_t rerank,
                  int threads, CodeScore score, bool verified) {
  const DataSet* ds = GetDataSet(n, 10, 150);
  if (ds == nullptr) {
    state.SkipWithError("data set build failed");
    return;
  }
  const int words = bits / 16;
  absl::StatusOr<SimHash> hash = SimHash::Create(kDim, 16, words, kHashSeed + 1);
  if (!hash.ok()) {
    state.SkipWithError("hash failed");
    return;
  }
  std::vector<KvShard> shards;
  std::vector<KeySketch> sketches;
  for (const KvShard& src : ds->shards) {
    std::vector<float> keys(static_cast<size_t>(n * kDim)), values(keys.size());
    for (int64_t i = 0; i < n; ++i) {
      src.CopyKey(i, keys.data() + i * kDim);
      src.CopyValue(i, values.data() + i * kDim);
    }
    std::vector<uint16_t> codes(static_cast<size_t>(n * words));
    absl::Status coded = absl::OkStatus();
    if (score == CodeScore::kSketch) {
      absl::StatusOr<KeySketch> sketch = KeySketch::Fit(keys.data(), n, kDim, bits / 8);
      if (sketch.ok()) {
        sketch->KeyCodes(keys.data(), n, codes.data());
        sketches.push_back(*std::move(sketch));
      } else {
        coded = sketch.status();
      }
    } else {
      coded = hash->KeyCodes(keys.data(), n, kDim, codes.data());
    }
    absl::StatusOr<KvShard> shard =
        coded.ok() ? KvShard::CreateFromCodes(kDim, 16, words, keys.data(), codes.data(),
                                              values.data(), n, KvStorage::kBf16, KvIndex::kCodes)
                   : absl::InternalError("codes");
    if (!shard.ok()) {
      state.SkipWithError("shard build failed");
      return;
    }
    shards.push_back(*std::move(shard));
  }
  std::vector<uint16_t> q_codes(static_cast<size_t>(kSteps * kQHeads * words));
  if (score == CodeScore::kSketch) {
    for (int64_t row = 0; row < kSteps * kQHeads; ++row) {
      sketches[static_cast<size_t>((row % kQHeads) / kGroup)].QueryCode(
          ds->q.data() + row * kDim, q_codes.data() + row * words);
    }
  } else if (!hash->Codes(ds->q.data(), kSteps * kQHeads, kDim, q_codes.data()).ok()) {
    state.SkipWithError("query codes failed");
    return;
  }
  AttentionRunner runner(threads);
  const SpotlightEstimator spot(fraction, rerank, ActiveSimdLevel(), score);
  // vattention-sketch at the evaluation's bound (docs/vattention-accuracy.md).
  const VAttentionLshEstimator va = VAttentionLshEstimator::WithLearnedCodes(
      fraction, VAttentionParams{.epsilon = 0.3, .delta = 0.1, .base_rate = 0.02}, 1234,
      ActiveSimdLevel(), score);
  const Estimator& est = verified ? static_cast<const Estimator&>(va) : spot;
  double touched = 0;
  const FullEstimator full;
  std::vector<PartialAttention> out(kQHeads), full_out(kQHeads);
  int64_t iter = 0;
  Lap lap, fl;
  for (auto _ : state) {
    const int s = static_cast<int>(iter % kSteps);
    const float* q = ds->q.data() + s * kQHeads * kDim;
    if (iter % kFullEvery == 0 &&
        !TimeFullStep(state, runner, full, *ds, q, full_out.data(), &fl)) {
      return;
    }
    std::vector<GroupWork> work(kKvHeads);
    for (int g = 0; g < kKvHeads; ++g) {
      work[g] = {&shards[g], q + g * kGroup * kDim,
                 q_codes.data() + (s * kQHeads + g * kGroup) * words, kGroup,
                 out.data() + g * kGroup};
    }
    FlushCaches();
    const Stamp t0 = Now();
    const absl::Status st = runner.Run(est, work, kScale);
    state.SetIterationTime(lap.Add(t0, Now()));
    if (!st.ok()) {
      state.SkipWithError("spotlight step failed");
      return;
    }
    for (const PartialAttention& o : out) touched += static_cast<double>(o.n_touched);
    ++iter;
  }
  if (iter == 0) return;
  // At most the group's sets side by side; the row count is what the kernel reads at most.
  const double union_rows = static_cast<double>(SpotlightRetrieved(fraction, n)) * kGroup;
  const double scored_rows =
      rerank > 1 ? static_cast<double>(SpotlightCandidates(fraction, rerank, n)) * kGroup : 0.0;
  const double bytes = (static_cast<double>(n) * bits / 8 +
                        std::min<double>(union_rows, static_cast<double>(n)) * kDim * 2 * 2 +
                        std::min<double>(scored_rows, static_cast<double>(n)) * kDim * 2) *
                       kKvHeads;
  const double probe = ProbeGbps(threads);
  state.counters["keys_frac"] = touched / (static_cast<double>(iter) * kQHeads * n);
  state.counters["full_ms"] = fl.MeanWall() * 1e3;
  state.counters["speedup"] = fl.MeanWall() / lap.MeanWall();
  if (!verified) state.counters["GBps_max"] = bytes / lap.MeanWall() * 1e-9;
  state.counters["probe_GBps"] = probe;
}

// The baselines' former path, for a same-run comparison: every call goes to the wrapped
// estimator's scalar float64 Attend, one head at a time (Estimator::AttendGroup's default).
class PerHeadReference final : public Estimator {
 public:
  explicit PerHeadReference(const Estimator& inner)
      : Estimator(SimdLevel::kScalar), inner_(inner) {}
  absl::StatusOr<PartialAttention> Attend(const KvShard& shard, const float* q,
                                          const uint16_t* q_codes, float scale,
                                          Scratch* scratch) const override {
    return inner_.Attend(shard, q, q_codes, scale, scratch);
  }

 private:
  const Estimator& inner_;
};

// One step of top-k or oracle sampling (budget: 2% of n per head, the paper's Table 9 density at
// (10, 150)) through AttendGroup (SIMD logits) against the same estimator's per-head float64
// Attend and FullEstimator, all three in the same loop, one thread.
void BM_Baseline(benchmark::State& state, bool topk, int64_t n) {
  const DataSet* ds = GetAnyDataSet(n);
  if (ds == nullptr) {
    state.SkipWithError("data set build failed");
    return;
  }
  AttentionRunner runner(1);
  const int64_t budget = n / 50;
  const TopKEstimator topk_est(budget);
  const OracleEstimator oracle_est(budget, 1234);
  const Estimator& est = topk ? static_cast<const Estimator&>(topk_est) : oracle_est;
  const PerHeadReference reference(est);
  const FullEstimator full;
  std::vector<PartialAttention> out(kQHeads);
  int64_t iter = 0;
  Lap group, ref, fl;
  for (auto _ : state) {
    const float* q = ds->q.data() + (iter++ % kSteps) * kQHeads * kDim;
    const std::vector<GroupWork> work = MakeWork(*ds, q, nullptr, out.data());
    bool ok = true;
    FlushCaches();
    Stamp t0 = Now();
    ok &= runner.Run(est, work, kScale).ok();
    state.SetIterationTime(group.Add(t0, Now()));
    FlushCaches();
    t0 = Now();
    ok &= runner.Run(reference, work, kScale).ok();
    ref.Add(t0, Now());
    FlushCaches();
    t0 = Now();
    ok &= runner.Run(full, work, kScale).ok();
    fl.Add(t0, Now());
    if (!ok) {
      state.SkipWithError("step failed");
      return;
    }
  }
  if (iter == 0) return;
  state.counters["budget"] = static_cast<double>(budget);
  state.counters["reference_ms"] = ref.MeanWall() * 1e3;
  state.counters["full_ms"] = fl.MeanWall() * 1e3;
  state.counters["speedup"] = ref.MeanWall() / group.MeanWall();
  state.counters["of_full"] = group.MeanWall() / fl.MeanWall();
}

// codes [n][L] of a shard's keys, read back from its tables (each key sits in one bucket per
// table), so the build benchmark needs no second hashing pass.
std::vector<uint16_t> CodesFromTables(const LshTables& t) {
  const int64_t n = t.size();
  const int l = t.l();
  std::vector<uint16_t> codes(static_cast<size_t>(n * l));
  for (int table = 0; table < l; ++table) {
    const std::vector<int32_t> off = t.TableOffsets(table);
    const std::vector<int32_t> idx = t.TableIndices(table);
    for (int64_t b = 0; b < t.num_buckets(); ++b) {
      for (int32_t p = off[b]; p < off[b + 1]; ++p) {
        codes[static_cast<size_t>(idx[p]) * l + table] = static_cast<uint16_t>(b);
      }
    }
  }
  return codes;
}

// Five cold reads of the 8 shards' bf16 key buffers with `threads` threads.
Lap ColdKeyRead(const DataSet& ds, int threads) {
  std::vector<Span> bufs;
  for (const KvShard& s : ds.shards) {
    bufs.push_back({s.key_rows(), static_cast<size_t>(s.size() * kDim * 2)});
  }
  Lap lap;
  for (int r = 0; r < 5; ++r) {
    FlushCaches();
    const Stamp t0 = Now();
    const uint64_t sum = ParallelSum(bufs, threads);
    lap.Add(t0, Now());
    benchmark::DoNotOptimize(sum);
  }
  return lap;
}

void BM_TableBuild(benchmark::State& state, int k, int l, int threads) {
  const DataSet* ds = GetDataSet(kTableBuildN, k, l);
  if (ds == nullptr) {
    state.SkipWithError("data set build failed");
    return;
  }
  std::vector<std::vector<uint16_t>> codes;
  for (const KvShard& s : ds->shards) codes.push_back(CodesFromTables(s.tables()));
  const Lap read = ColdKeyRead(*ds, threads);
  tbb::task_arena arena(threads);
  // One untimed build first (reported as first_build_ms): the first large allocations of a
  // process wait for the kernel to assemble huge pages; later builds reuse them.
  double first_build_ms = 0;
  {
    FlushCaches();
    const Stamp t0 = Now();
    arena.execute([&] {
      for (int g = 0; g < kKvHeads; ++g)
        (void)LshTables::Build(codes[g].data(), kTableBuildN, k, l);
    });
    first_build_ms = Lap().Add(t0, Now()) * 1e3;
  }
  Lap build;
  for (auto _ : state) {
    std::vector<LshTables> built;
    built.reserve(kKvHeads);
    FlushCaches();
    const Stamp t0 = Now();
    bool ok = true;
    arena.execute([&] {
      for (int g = 0; g < kKvHeads && ok; ++g) {
        absl::StatusOr<LshTables> t = LshTables::Build(codes[g].data(), kTableBuildN, k, l);
        ok = t.ok();
        if (ok) built.push_back(*std::move(t));
      }
    });
    const double s = build.Add(t0, Now());
    if (!ok) {
      state.SkipWithError("LshTables::Build failed");
      return;
    }
    state.SetIterationTime(s);
  }
  if (build.runs == 0) return;
  const double key_bytes = static_cast<double>(kTableBuildN) * kKvHeads * kDim * 2;
  state.counters["key_read_ms"] = read.MeanWall() * 1e3;
  state.counters["key_read_GBps"] = key_bytes / read.MeanWall() * 1e-9;
  state.counters["build_over_10_reads"] = build.MeanWall() / (10 * read.MeanWall());
  state.counters["first_build_ms"] = first_build_ms;
  if (threads == 1) {
    state.counters["cpu_ms"] = build.MeanCpu() * 1e3;
    state.counters["key_read_cpu_ms"] = read.MeanCpu() * 1e3;
    state.counters["ratio_cpu"] = build.MeanCpu() / (10 * read.MeanCpu());
  }
  state.counters["table_MiB"] =
      static_cast<double>(ds->shards[0].tables().bytes()) * kKvHeads / (1 << 20);
}

void BM_KeyHash(benchmark::State& state, int k, int l, int threads, bool fp32) {
  const DataSet* ds = GetDataSet(kTableBuildN, k, l);
  if (ds == nullptr) {
    state.SkipWithError("data set build failed");
    return;
  }
  // The stored (bf16) centred keys back to float: the same work as hashing the fp32 ones.
  std::vector<std::vector<float>> keys(kKvHeads);
  for (int g = 0; g < kKvHeads; ++g) {
    const uint16_t* src = static_cast<const uint16_t*>(ds->shards[g].key_rows());
    keys[g].resize(static_cast<size_t>(kTableBuildN * kDim));
    for (size_t i = 0; i < keys[g].size(); ++i) keys[g][i] = Bf16ToFloat(src[i]);
  }
  std::vector<uint16_t> codes(static_cast<size_t>(kTableBuildN * l));
  tbb::task_arena arena(threads);
  double seconds = 0;
  int64_t iter = 0;
  for (auto _ : state) {
    absl::Status st;
    const auto t0 = Clock::now();
    arena.execute([&] {
      for (int g = 0; g < kKvHeads && st.ok(); ++g) {
        st = ds->hash->KeyCodesAtLevel(keys[g].data(), kTableBuildN, kDim, codes.data(),
                                       ActiveSimdLevel(), /*bf16_kernel=*/!fp32);
      }
    });
    seconds += Seconds(t0, Clock::now());
    ++iter;
    if (!st.ok()) {
      state.SkipWithError("SimHash::Codes failed");
      return;
    }
    benchmark::DoNotOptimize(codes.data());
  }
  if (iter > 0) {
    const double keys_per_s = static_cast<double>(kTableBuildN) * kKvHeads * iter / seconds;
    state.counters["Mkeys_per_s"] = keys_per_s * 1e-6;
    state.counters["GFLOP_per_s"] = keys_per_s * 2.0 * kDim * k * l * 1e-9;
  }
}

struct KL {
  int k, l;
};
constexpr KL kConfigs[] = {{10, 150}, {9, 120}, {8, 75}};
constexpr int64_t kContexts[] = {16384, 32768, 65536, 131072};

void RegisterAll() {
  using benchmark::RegisterBenchmark;
  for (int t : {1, 2}) {
    RegisterBenchmark(("Probe/threads:" + std::to_string(t)).c_str(), BM_Probe, t)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  for (int t : {1, 2}) {
    RegisterBenchmark(("RandomLines/threads:" + std::to_string(t)).c_str(), BM_RandomLines, t)
        ->Unit(benchmark::kMillisecond)
        ->Iterations(3)
        ->UseRealTime();
  }
  for (bool interleaved : {false, true}) {
    for (int t : {1, 2}) {
      RegisterBenchmark(("GatherRows/layout:" + std::string(interleaved ? "interleaved" : "split") +
                         "/threads:" + std::to_string(t))
                            .c_str(),
                        BM_GatherRows, t, interleaved)
          ->Unit(benchmark::kMillisecond)
          ->Iterations(3)
          ->UseRealTime();
    }
  }
  for (const KL& c : kConfigs) {
    RegisterBenchmark(("QueryHash/K:" + std::to_string(c.k) + "/L:" + std::to_string(c.l)).c_str(),
                      BM_QueryHash, c.k, c.l)
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime();
  }
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (level > DetectedSimdLevel()) continue;
    RegisterBenchmark(
        (std::string("QueryHashSmall/heads:9/d:64/K:10/L:150/") + std::string(SimdLevelName(level)))
            .c_str(),
        BM_QueryHashSmall, 9, 64, 10, 150, level)
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime();
  }
  for (int64_t n : kContexts) {
    for (const KL& c : kConfigs) {
      const std::string kl = "/K:" + std::to_string(c.k) + "/L:" + std::to_string(c.l);
      for (int t : {1, 2}) {
        RegisterBenchmark(
            ("MagicPig/n:" + std::to_string(n) + kl + "/threads:" + std::to_string(t)).c_str(),
            BM_MagicPig, n, c.k, c.l, t)
            ->Unit(benchmark::kMicrosecond)
            ->UseManualTime();
      }
      if (n == kTableBuildN && c.k == kConfigs[0].k) {
        for (const bool lsh : {false, true}) {
          for (const auto& [tag, params] :
               {std::pair{"eps:0.05/delta:0.05/base:0.05", VAttentionParams{}},
                std::pair{"eps:0.2/delta:0.1/base:0.01",
                          VAttentionParams{.epsilon = 0.2, .delta = 0.1, .base_rate = 0.01}},
                // The evaluation's bound on Qwen, VAttentionSketch's (docs/vattention.md).
                std::pair{"eps:0.3/delta:0.1/base:0.02",
                          VAttentionParams{.epsilon = 0.3, .delta = 0.1, .base_rate = 0.02}}}) {
            for (int t : {1, 2}) {
              RegisterBenchmark(
                  ((lsh ? "VAttentionLsh" : "VAttention") + std::string("/n:") + std::to_string(n) +
                   kl + "/" + tag + "/threads:" + std::to_string(t))
                      .c_str(),
                  BM_VAttention, n, c.k, c.l, lsh, t, params)
                  ->Unit(benchmark::kMicrosecond)
                  ->UseManualTime();
            }
          }
        }
      }
      if (n == kTableBuildN && c.k == kConfigs[0].k) {
        for (int bits : {64, 128}) {
          for (double fraction : {0.02, 0.035}) {
            for (int t : {1, 2}) {
              RegisterBenchmark(
                  ("Spotlight/n:" + std::to_string(n) + "/bits:" + std::to_string(bits) +
                   "/fraction:" + std::to_string(fraction).substr(0, 5) +
                   "/threads:" + std::to_string(t))
                      .c_str(),
                  BM_Spotlight, n, bits, fraction, 1, t, CodeScore::kHamming, false)
                  ->Unit(benchmark::kMicrosecond)
                  ->UseManualTime();
            }
          }
        }
        // The low-rank key sketch at 16 and 32 bytes per key (docs/spotlight.md).
        for (int dims : {16, 32}) {
          for (int t : {1, 2}) {
            RegisterBenchmark(("Sketch/n:" + std::to_string(n) + "/dims:" + std::to_string(dims) +
                               "/fraction:0.02/threads:" + std::to_string(t))
                                  .c_str(),
                              BM_Spotlight, n, 8 * dims, 0.02, 1, t, CodeScore::kSketch, false)
                ->Unit(benchmark::kMicrosecond)
                ->UseManualTime();
          }
        }
        // The sketch as vattention's heavy-hitter finder, 3% exact (docs/sketch.md).
        for (int t : {1, 2}) {
          RegisterBenchmark(("VAttentionSketch/n:" + std::to_string(n) +
                             "/dims:32/candidates:0.03/threads:" + std::to_string(t))
                                .c_str(),
                            BM_Spotlight, n, 8 * 32, 0.03, 1, t, CodeScore::kSketch, true)
              ->Unit(benchmark::kMicrosecond)
              ->UseManualTime();
        }
        // Rescored from 2, 4 and 8 times the retrieved keys (docs/spotlight.md).
        for (int64_t rerank : {2, 4, 8}) {
          for (int t : {1, 2}) {
            RegisterBenchmark(("Spotlight/n:" + std::to_string(n) +
                               "/bits:64/fraction:0.02/rerank:" + std::to_string(rerank) +
                               "/threads:" + std::to_string(t))
                                  .c_str(),
                              BM_Spotlight, n, 64, 0.02, rerank, t, CodeScore::kHamming, false)
                ->Unit(benchmark::kMicrosecond)
                ->UseManualTime();
          }
        }
      }
      if (n == kTableBuildN) {
        for (int t : {1, 2}) {
          RegisterBenchmark(("TableBuild" + kl + "/threads:" + std::to_string(t)).c_str(),
                            BM_TableBuild, c.k, c.l, t)
              ->Unit(benchmark::kMillisecond)
              ->UseManualTime();
        }
        for (const bool fp32 : {false, true}) {
          for (int t : {1, 2}) {
            RegisterBenchmark(
                ((fp32 ? "KeyHashFp32" : "KeyHash") + kl + "/threads:" + std::to_string(t)).c_str(),
                BM_KeyHash, c.k, c.l, t, fp32)
                ->Unit(benchmark::kMillisecond)
                ->UseRealTime();
          }
        }
      }
    }
    for (int t : {1, 2}) {
      std::vector<int64_t> blocks = {4096, 16384};  // and one block, where that is another size
      if (n > 16384) blocks.push_back(n);
      for (int64_t block : blocks) {
        if (block > n) continue;
        RegisterBenchmark(("MagicPigBlocks/n:" + std::to_string(n) +
                           "/block:" + std::to_string(block) + "/threads:" + std::to_string(t))
                              .c_str(),
                          BM_MagicPigBlocks, n, block, t)
            ->UseManualTime()
            ->Unit(benchmark::kMillisecond);
      }
      RegisterBenchmark(("Full/n:" + std::to_string(n) + "/threads:" + std::to_string(t)).c_str(),
                        BM_Full, n, t)
          ->Unit(benchmark::kMicrosecond)
          ->UseManualTime();
    }
  }
  for (const bool topk : {true, false}) {
    for (const int64_t n : {int64_t{4096}, int64_t{16384}}) {
      RegisterBenchmark(
          ((topk ? "TopK/n:" : "Oracle/n:") + std::to_string(n) + "/threads:1").c_str(),
          BM_Baseline, topk, n)
          ->Unit(benchmark::kMicrosecond)
          ->UseManualTime();
    }
  }
}

}  // namespace
}  // namespace magicpig

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  magicpig::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
