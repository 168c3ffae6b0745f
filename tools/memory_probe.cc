#include "tools/memory_probe.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <vector>

#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"
#include "tbb/parallel_reduce.h"
#include "tbb/partitioner.h"
#include "tbb/task_arena.h"

namespace magicpig::tools {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Best of 3 wall nanoseconds per item when `threads` threads each run part(b, e) over their
// contiguous share [b, e) of `items` items; part returns a sum of what it read, added to *keep so
// that the reads stay alive.
template <class Part>
double BestNsPerItem(tbb::task_arena& arena, int threads, size_t items, const Part& part,
                     float* keep) {
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    float sum = 0;
    arena.execute([&] {
      sum = tbb::parallel_reduce(
          tbb::blocked_range<int>(0, threads, 1), 0.0f,
          [&](const tbb::blocked_range<int>& r, float acc) {
            for (int t = r.begin(); t < r.end(); ++t) {
              acc += part(items * t / threads, items * (t + 1) / threads);
            }
            return acc;
          },
          std::plus<float>(), tbb::static_partitioner());
    });
    const double ns = SecondsSince(start) * 1e9 / static_cast<double>(items);
    best = rep == 0 ? ns : std::min(best, ns);
    *keep += sum;
  }
  return best;
}

}  // namespace

MemoryRates ProbeMemory(int threads, int64_t row_bytes) {
  const size_t n = (size_t{1} << 30) / sizeof(float);
  std::unique_ptr<float[]> buf(new float[n]);
  tbb::task_arena arena(threads);
  arena.execute([&] {
    // First touch on the arena's threads, so pages are spread as the reads will be.
    tbb::parallel_for(tbb::blocked_range<size_t>(0, n), [&](const tbb::blocked_range<size_t>& r) {
      for (size_t j = r.begin(); j < r.end(); ++j) buf[j] = 1.0f;
    });
  });
  MemoryRates rates;
  float keep = 0;  // keeps the sums (and the reads) alive
  for (int rep = 0; rep < 3; ++rep) {
    const auto start = std::chrono::steady_clock::now();
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
    rates.stream_gb_per_s =
        std::max(rates.stream_gb_per_s, n * sizeof(float) / SecondsSince(start) / 1e9);
    keep += sum;
  }
  // 2^21 random lines of the 1 GiB buffer (almost every one a miss in any cache), split into one
  // run per thread.
  constexpr size_t kLineFloats = 64 / sizeof(float);
  constexpr size_t kAhead = 32;
  std::vector<uint32_t> lines(size_t{1} << 21);
  std::mt19937_64 rng(78);
  std::uniform_int_distribution<uint32_t> pick(0, static_cast<uint32_t>(n / kLineFloats - 1));
  for (uint32_t& x : lines) x = pick(rng);
  const float* base = buf.get();
  rates.random_ns_per_line = BestNsPerItem(
      arena, threads, lines.size(),
      [&](size_t b, size_t e) {
        float acc = 0;
        for (size_t i = b; i < e; ++i) {
          if (i + kAhead < e) __builtin_prefetch(base + lines[i + kAhead] * kLineFloats);
          acc += base[lines[i] * kLineFloats];
        }
        return acc;
      },
      &keep);
  // The gather: the buffer as a key array and a value array of row_bytes rows.
  const size_t row_floats = static_cast<size_t>(std::clamp<int64_t>(row_bytes, 64, 4096)) / 4;
  const size_t rows = n / 2 / row_floats;
  std::vector<uint32_t> picked;
  std::bernoulli_distribution take(0.05);
  for (size_t r = 0; r < rows; ++r) {
    if (take(rng)) picked.push_back(static_cast<uint32_t>(r));
  }
  const float* keys = base;
  const float* values = base + rows * row_floats;
  const size_t far = std::max<size_t>(8, 12 * 1024 / (2 * row_floats * sizeof(float)));
  rates.gather_ns_per_row = BestNsPerItem(
      arena, threads, picked.size(),
      [&](size_t b, size_t e) {
        float acc = 0;
        for (size_t i = b; i < e; ++i) {
          for (size_t w = 0; w < row_floats; w += kLineFloats) {
            if (i + far < e) {
              __builtin_prefetch(keys + picked[i + far] * row_floats + w, 0, 2);
              __builtin_prefetch(values + picked[i + far] * row_floats + w, 0, 2);
            }
            if (i + 4 < e) {
              __builtin_prefetch(keys + picked[i + 4] * row_floats + w);
              __builtin_prefetch(values + picked[i + 4] * row_floats + w);
            }
            acc += keys[picked[i] * row_floats + w] + values[picked[i] * row_floats + w];
          }
        }
        return acc;
      },
      &keep);
  if (keep < 0) std::cerr << "";
  return rates;
}

}  // namespace magicpig::tools
