// magicpig_cuda_attention_bench: exact attention on the GPU, kernel by kernel, against the card's
// own copy bandwidth (issue #34; run by scripts/device-check on a lent GPU).
//
//   magicpig_cuda_attention_bench [REPS]
//
// For the SmolLM2-135M, Qwen2.5-1.5B and Llama-3.1-8B attention shapes over an fp16 cache of
// random rows: one decode query per call at several depths through split-K and the tiled kernel,
// each with the serial and the wide merge of the partials (KV bytes read per second, and that
// over a device-to-device copy's bytes per second measured first), then a 512-query prefill chunk
// through split-K, the tiled kernel and the tensor-core products (TFLOP/s of the causal products).
// Every row also prints its largest difference from split-K with the serial merge on the same
// inputs, so a wrong kernel shows in the table rather than as a fast number. A call's time is the
// wall time of REPS calls in one Execute (which ends in a synchronisation), divided by REPS: the
// median of five such runs after a warm-up.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/half.h"
#include "gpu_node/backend/cuda/cuda_backend.h"
#include "gpu_node/backend/cuda/cuda_device.h"

namespace magicpig::backend {
namespace {

struct Shape {
  const char* name;
  int64_t n_head, n_kv, head_dim;
};

constexpr Shape kShapes[] = {
    {"SmolLM2-135M", 9, 3, 64}, {"Qwen2.5-1.5B", 12, 2, 128}, {"Llama-3.1-8B", 32, 8, 128}};
constexpr int64_t kDecodeDepths[] = {4096, 32768, 131072};
constexpr int64_t kPrefillDepths[] = {8192, 32768};
constexpr int64_t kPrefillChunk = 512;

struct Config {
  const char* name;
  CudaAttentionKernel kernel;
  bool wide_merge;
};

constexpr Config kDecodeConfigs[] = {{"split-K, serial merge", CudaAttentionKernel::kSplitK, false},
                                     {"split-K, wide merge", CudaAttentionKernel::kSplitK, true},
                                     {"tiled, serial merge", CudaAttentionKernel::kTiled, false},
                                     {"tiled, wide merge", CudaAttentionKernel::kTiled, true}};
constexpr Config kPrefillConfigs[] = {
    {"split-K, serial merge", CudaAttentionKernel::kSplitK, false},
    {"tiled, serial merge", CudaAttentionKernel::kTiled, false},
    {"tensor", CudaAttentionKernel::kTensor, false}};

[[noreturn]] void Die(const absl::Status& s, const char* what) {
  std::fprintf(stderr, "magicpig_cuda_attention_bench: %s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) Die(s, what);
}

template <typename T>
T Value(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) Die(v.status(), what);
  return *std::move(v);
}

std::unique_ptr<CudaBackend> Make(const Config& c) {
  CudaBackendOptions options;
  options.attention_kernel = c.kernel;
  options.wide_merge = c.wide_merge;
  return Value(CudaBackend::Create(options), "CudaBackend::Create");
}

// Median seconds per call of `calls` (one Execute of `reps` of them), five timed runs after one.
template <typename F>
double SecondsPerCall(CudaBackend& b, int reps, F calls) {
  std::vector<double> runs;
  for (int run = 0; run < 6; ++run) {
    const auto start = std::chrono::steady_clock::now();
    Check(b.Execute([&] {
      for (int r = 0; r < reps; ++r) calls();
      return absl::OkStatus();
    }),
          "Execute");
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (run > 0) runs.push_back(s / reps);
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

// Bytes per second of a device-to-device copy of 1 GiB (bytes read plus bytes written).
double CopyBandwidth(int reps) {
  auto b = Make(kDecodeConfigs[0]);
  const int64_t bytes = int64_t{1} << 30;
  BackendBuffer src = Value(b->Allocate(bytes), "Allocate");
  BackendBuffer dst = Value(b->Allocate(bytes), "Allocate");
  const double s = SecondsPerCall(*b, std::max(1, reps / 10), [&] {
    Check(b->CopyWithin(dst.data(), src.data(), bytes), "CopyWithin");
  });
  return 2.0 * static_cast<double>(bytes) / s;
}

// The inputs of one shape and depth, on the host; each backend gets its own device copy.
struct Inputs {
  std::vector<uint16_t> k, v;  // [rows][n_kv][head_dim] fp16
  std::vector<float> q;        // [n_queries][n_head][head_dim]
};

// Uniform in [-1, 1) from xorshift32: the 128K-key Llama-3.1-8B cache is 268M values, which a
// normal distribution over mt19937 takes seconds to draw.
class FastRandom {
 public:
  explicit FastRandom(uint32_t seed) : state_(seed | 1u) {}
  float Next() {
    state_ ^= state_ << 13;
    state_ ^= state_ >> 17;
    state_ ^= state_ << 5;
    return static_cast<float>(state_ >> 8) * (2.0f / 16777216.0f) - 1.0f;
  }

 private:
  uint32_t state_;
};

Inputs RandomInputs(const Shape& s, int64_t rows, int64_t n_queries, uint32_t seed) {
  FastRandom rng(seed);
  Inputs in;
  in.k.resize(static_cast<size_t>(rows * s.n_kv * s.head_dim));
  in.v.resize(in.k.size());
  for (uint16_t& x : in.k) x = FloatToFp16(2.0f * rng.Next());
  for (uint16_t& x : in.v) x = FloatToFp16(rng.Next());
  in.q.resize(static_cast<size_t>(n_queries * s.n_head * s.head_dim));
  for (float& x : in.q) x = 2.0f * rng.Next();
  return in;
}

// One configuration over `in`: seconds per call and the output.
struct Result {
  double seconds = 0;
  std::vector<float> out;
};

Result Time(const Config& c, const Shape& s, const Inputs& in, int64_t first_pos, int64_t n_queries,
            int reps) {
  auto b = Make(c);
  const int64_t rows = first_pos + n_queries;
  const int64_t kv_bytes = rows * s.n_kv * s.head_dim * 2;
  BackendBuffer k = Value(b->Allocate(kv_bytes), "Allocate");
  BackendBuffer v = Value(b->Allocate(kv_bytes), "Allocate");
  const int64_t q_floats = n_queries * s.n_head * s.head_dim;
  BackendBuffer q = Value(b->Allocate(q_floats * 4), "Allocate");
  BackendBuffer out = Value(b->Allocate(q_floats * 4), "Allocate");
  Check(b->CopyIn(k.data(), in.k.data(), kv_bytes), "CopyIn");
  Check(b->CopyIn(v.data(), in.v.data(), kv_bytes), "CopyIn");
  Check(b->CopyIn(q.data(), in.q.data(), q_floats * 4), "CopyIn");
  const KvLayerView view{k.as<uint16_t>(), v.as<uint16_t>(), rows, s.n_kv, s.head_dim};
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  Result r;
  r.seconds = SecondsPerCall(*b, reps, [&] {
    b->CausalAttention(q.as<float>(), n_queries, first_pos, s.n_head, scale, view, out.as<float>());
  });
  r.out.resize(static_cast<size_t>(q_floats));
  Check(b->CopyOut(r.out.data(), out.data(), q_floats * 4), "CopyOut");
  return r;
}

double MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(double{a[i]} - double{b[i]}));
  return d;
}

int Main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 20;
  const double copy = CopyBandwidth(reps);
  std::printf("device-to-device copy: %.0f GB/s (1 GiB, read + written)\n\n", copy / 1e9);
  std::printf("decode: one query, KV bytes read per call\n");
  std::printf("%-13s %7s  %-22s %10s %9s %8s %10s\n", "shape", "depth", "kernel", "us/call", "GB/s",
              "of copy", "max diff");
  for (const Shape& s : kShapes) {
    for (const int64_t depth : kDecodeDepths) {
      const Inputs in = RandomInputs(s, depth + 1, 1, 7);
      const double kv_bytes = 2.0 * static_cast<double>((depth + 1) * s.n_kv * s.head_dim * 2);
      std::vector<float> reference;
      for (const Config& c : kDecodeConfigs) {
        const Result r = Time(c, s, in, depth, 1, reps);
        if (reference.empty()) reference = r.out;
        const double gbs = kv_bytes / r.seconds;
        std::printf("%-13s %7lld  %-22s %10.1f %9.0f %7.0f%% %10.2e\n", s.name,
                    static_cast<long long>(depth), c.name, r.seconds * 1e6, gbs / 1e9,
                    100.0 * gbs / copy, MaxDiff(r.out, reference));
      }
    }
  }
  std::printf("\nprefill: a chunk of %lld queries after DEPTH keys (causal products' FLOP)\n",
              static_cast<long long>(kPrefillChunk));
  std::printf("%-13s %7s  %-22s %10s %9s %10s\n", "shape", "depth", "kernel", "ms/chunk", "TFLOP/s",
              "max diff");
  for (const Shape& s : kShapes) {
    for (const int64_t depth : kPrefillDepths) {
      const Inputs in = RandomInputs(s, depth + kPrefillChunk, kPrefillChunk, 11);
      // q·k and p·v: 2 x 2 x head_dim FLOP per (query, head, visible key).
      double keys = 0;
      for (int64_t t = 0; t < kPrefillChunk; ++t) keys += static_cast<double>(depth + t + 1);
      const double flop = 4.0 * static_cast<double>(s.n_head * s.head_dim) * keys;
      std::vector<float> reference;
      for (const Config& c : kPrefillConfigs) {
        const Result r = Time(c, s, in, depth, kPrefillChunk, std::max(1, reps / 4));
        if (reference.empty()) reference = r.out;
        std::printf("%-13s %7lld  %-22s %10.3f %9.2f %10.2e\n", s.name,
                    static_cast<long long>(depth), c.name, r.seconds * 1e3, flop / r.seconds / 1e12,
                    MaxDiff(r.out, reference));
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace magicpig::backend

int main(int argc, char** argv) { return magicpig::backend::Main(argc, argv); }
