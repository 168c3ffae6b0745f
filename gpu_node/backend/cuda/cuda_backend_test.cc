// The CUDA backend against the CPU backend and float64 references. Every test needs a GPU and
// skips with "no CUDA device" where none is visible (this is what runs on the GPU machine through
// scripts/device-check, and under compute-sanitizer there).
#include "gpu_node/backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/attention/simhash.h"
#include "common/half.h"
#include "common/quant/dequantize.h"
#include "common/status_macros.h"
#include "gpu_node/backend/cpu/cpu_backend.h"
#include "gpu_node/engine/engine.h"
#include "gtest/gtest.h"
#include "tests/testing/attention_reference.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/synthetic_engine.h"
#include "tests/testing/synthetic_model.h"

namespace magicpig::backend {
namespace {

#define MAGICPIG_REQUIRE_GPU()                                    \
  do {                                                            \
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device"; \
  } while (false)

std::vector<float> Random(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

std::unique_ptr<CudaBackend> MakeBackend(
    bool float_weights, CudaAttentionKernel attention_kernel = CudaAttentionKernel::kAuto,
    bool wide_merge = false, int64_t tensor_scratch_bytes = int64_t{512} << 20) {
  CudaBackendOptions options{0, float_weights};
  options.attention_kernel = attention_kernel;
  options.wide_merge = wide_merge;
  options.tensor_scratch_bytes = tensor_scratch_bytes;
  auto b = CudaBackend::Create(options);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? *std::move(b) : nullptr;
}

// Device copies of host vectors, and back.
class DeviceData {
 public:
  explicit DeviceData(CudaBackend* b) : b_(b) {}
  template <typename T>
  T* Put(const std::vector<T>& host) {
    auto buf = b_->Allocate(static_cast<int64_t>(host.size() * sizeof(T)));
    EXPECT_TRUE(buf.ok()) << buf.status();
    EXPECT_TRUE(b_->CopyIn(buf->data(), host.data(), buf->bytes()).ok());
    buffers_.push_back(*std::move(buf));
    return buffers_.back().as<T>();
  }
  // A device array of n elements, filled with NaN bytes so unwritten outputs show.
  template <typename T>
  T* Poisoned(int64_t n) {
    return Put(std::vector<T>(n, Poison<T>()));
  }
  template <typename T>
  std::vector<T> Get(const T* device, int64_t n) {
    std::vector<T> host(n);
    EXPECT_TRUE(b_->CopyOut(host.data(), device, n * static_cast<int64_t>(sizeof(T))).ok());
    return host;
  }

 private:
  template <typename T>
  static T Poison() {
    if constexpr (std::is_same_v<T, float>) return NAN;
    return static_cast<T>(0x7e00);  // fp16 NaN
  }
  CudaBackend* b_;
  std::vector<BackendBuffer> buffers_;
};

double RelativeError(const std::vector<float>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(got[i])) return INFINITY;
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

const GgmlType kTypes[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ4_0,
                           GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0,
                           GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K};

// Dequantisation on the GPU, read back through Embed: fp32 copies equal the reference exactly;
// fp16 copies equal it rounded to fp16.
TEST(CudaBackendTest, DequantisesEveryTypeLikeTheReference) {
  MAGICPIG_REQUIRE_GPU();
  const int64_t rows = 7, cols = 512;
  for (bool float_weights : {true, false}) {
    auto b = MakeBackend(float_weights);
    ASSERT_NE(b, nullptr);
    // The backend knows a matrix by its host address, which must outlive it (backend.h): keep
    // every type's bytes, or a freed buffer's address could come back for the next type.
    std::deque<std::string> keep;
    for (GgmlType type : kTypes) {
      auto bytes = testing::RandomTensorBytes(type, rows * cols, 3);
      ASSERT_TRUE(bytes.ok()) << bytes.status();
      keep.push_back(*std::move(bytes));
      QuantMatrix m{type, keep.back().data(), rows, cols};
      std::vector<float> ref(rows * cols);
      ASSERT_TRUE(DequantizeRow(type, m.data, ref.data(), rows * cols).ok());
      ASSERT_TRUE(b->PrepareMatrix(m).ok());
      DeviceData d(b.get());
      float* out = d.Poisoned<float>(rows * cols);
      std::vector<int32_t> ids = {6, 0, 3, 1, 2, 5, 4};
      ASSERT_TRUE(b->Execute([&] { return b->Embed(m, ids, out); }).ok());
      const std::vector<float> got = d.Get(out, rows * cols);
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t c = 0; c < cols; ++c) {
          const float r = ref[ids[i] * cols + c];
          const float want = float_weights ? r : Fp16ToFloat(FloatToFp16(r));
          ASSERT_EQ(got[i * cols + c], want) << GgmlTypeName(type) << " row " << ids[i];
        }
      }
    }
  }
}

TEST(CudaBackendTest, EmbedRejectsOutOfVocabularyIdsAndUnpreparedTables) {
  MAGICPIG_REQUIRE_GPU();
  auto b = MakeBackend(true);
  ASSERT_NE(b, nullptr);
  std::vector<float> table = Random(4 * 32, 5);
  QuantMatrix m{GgmlType::kF32, table.data(), 4, 32};
  DeviceData d(b.get());
  float* out = d.Poisoned<float>(32);
  const int32_t good[1] = {2}, bad[1] = {4};
  EXPECT_EQ(b->Execute([&] { return b->Embed(m, good, out); }).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(b->PrepareMatrix(m).ok());
  EXPECT_EQ(b->Execute([&] { return b->Embed(m, bad, out); }).code(),
            absl::StatusCode::kInvalidArgument);
}

// Products against float64 over the dequantised weights: fp32 mode near float32 rounding, fp16
// mode near fp16 rounding of weights and activations.
TEST(CudaBackendTest, MatMulMatchesFloat64) {
  MAGICPIG_REQUIRE_GPU();
  const int64_t rows = 96, cols = 512;
  for (bool float_weights : {true, false}) {
    auto b = MakeBackend(float_weights);
    ASSERT_NE(b, nullptr);
    std::deque<std::string> keep;  // host addresses outlive the backend (see above)
    for (GgmlType type : {GgmlType::kF32, GgmlType::kQ4_1, GgmlType::kQ4_K, GgmlType::kQ6_K}) {
      auto bytes = testing::RandomTensorBytes(type, rows * cols, 9);
      ASSERT_TRUE(bytes.ok());
      keep.push_back(*std::move(bytes));
      const QuantMatrix m{type, keep.back().data(), rows, cols};
      // 1-8 tokens take the fp16 matrix-vector kernel, 9 and 64 cuBLAS.
      for (int64_t n : {1, 5, 8, 9, 64}) {
        std::vector<float> w(rows * cols);
        ASSERT_TRUE(DequantizeRow(type, m.data, w.data(), rows * cols).ok());
        const std::vector<float> x = Random(n * cols, 10 + n);
        std::vector<double> ref(n * rows, 0.0);
        for (int64_t t = 0; t < n; ++t)
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < cols; ++c)
              ref[t * rows + r] += static_cast<double>(w[r * cols + c]) * x[t * cols + c];
        ASSERT_TRUE(b->PrepareMatrix(m).ok());
        DeviceData d(b.get());
        const float* xd = d.Put(x);
        float* y = d.Poisoned<float>(n * rows);
        ASSERT_TRUE(b->Execute([&] { return b->MatMul(m, xd, n, y); }).ok());
        const double err = RelativeError(d.Get(y, n * rows), ref);
        EXPECT_LT(err, float_weights ? 1e-6 : 2e-3)
            << GgmlTypeName(type) << " n " << n << " float_weights " << float_weights;
      }
    }
  }
}

// The decode-sized product (1-8 tokens, fp16 weights) reads fp32 activations and accumulates in
// fp32, so against float64 over the fp16-rounded weights it is exact to float32 rounding: a sharper
// check than the fp16 tolerance above. Rows not a multiple of the warps per block and columns not
// a multiple of a warp's unrolled stride exercise the tails; an x that is not 16-byte aligned and
// a width that is not a multiple of 8 take the cuBLAS path and must agree too.
TEST(CudaBackendTest, MatVecIsExactOverFp16Weights) {
  MAGICPIG_REQUIRE_GPU();
  auto b = MakeBackend(false);
  ASSERT_NE(b, nullptr);
  struct Case {
    int64_t rows, cols, x_offset;
    double bound;
  };
  std::deque<std::vector<float>> keep;  // host addresses outlive the backend
  for (const Case& k :
       {Case{1003, 1544, 0, 1e-5}, Case{67, 36, 0, 2e-3}, Case{129, 256, 1, 2e-3}}) {
    keep.push_back(Random(k.rows * k.cols, 21 + k.cols));
    const std::vector<float>& w = keep.back();
    const QuantMatrix m{GgmlType::kF32, w.data(), k.rows, k.cols};
    ASSERT_TRUE(b->PrepareMatrix(m).ok());
    for (int64_t n = 1; n <= 8; ++n) {
      const std::vector<float> x = Random(n * k.cols + k.x_offset, 40 + n);
      std::vector<double> ref(n * k.rows, 0.0);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t r = 0; r < k.rows; ++r)
          for (int64_t c = 0; c < k.cols; ++c)
            ref[t * k.rows + r] +=
                static_cast<double>(Fp16ToFloat(FloatToFp16(w[r * k.cols + c]))) *
                x[k.x_offset + t * k.cols + c];
      DeviceData d(b.get());
      const float* xd = d.Put(x) + k.x_offset;
      float* y = d.Poisoned<float>(n * k.rows);
      ASSERT_TRUE(b->Execute([&] { return b->MatMul(m, xd, n, y); }).ok());
      EXPECT_LT(RelativeError(d.Get(y, n * k.rows), ref), k.bound)
          << k.rows << "x" << k.cols << " x offset " << k.x_offset << " n " << n;
    }
  }
}

// The fused decode operations (q/k/v products with biases in one launch, a product added to the
// residual, gate and up with SwiGLU, each with and without the RMSNorm of its input) against
// float64 over the fp16-rounded weights, for 1-8 tokens (fused kernels) and 9 (the unfused
// defaults, at fp16 tolerance).
TEST(CudaBackendTest, FusedProductsMatchFloat64) {
  MAGICPIG_REQUIRE_GPU();
  auto b = MakeBackend(false);
  ASSERT_NE(b, nullptr);
  const int64_t cols = 264, rows_q = 264, rows_kv = 72, rows_ff = 520;
  const float eps = 1e-5f;
  auto matrix = [&](std::vector<float>& keep, int64_t rows, uint32_t seed) {
    keep = Random(rows * cols, seed, 0.2f);
    const QuantMatrix m{GgmlType::kF32, keep.data(), rows, cols};
    EXPECT_TRUE(b->PrepareMatrix(m).ok());
    for (float& v : keep) v = Fp16ToFloat(FloatToFp16(v));  // what the device holds
    return m;
  };
  // Host copies rounded after PrepareMatrix took the exact values: the backend keeps the host
  // address, so these vectors must outlive it and keep their size.
  std::vector<float> wq, wk, wv, wg, wu;
  const QuantMatrix mq = matrix(wq, rows_q, 1), mk = matrix(wk, rows_kv, 2),
                    mv = matrix(wv, rows_kv, 3), mg = matrix(wg, rows_ff, 4),
                    mu = matrix(wu, rows_ff, 5);
  const std::vector<float> bq = Random(rows_q, 6), bv = Random(rows_kv, 7), nw = Random(cols, 8);
  ASSERT_TRUE(b->PrepareVector(bq.data(), rows_q).ok());
  ASSERT_TRUE(b->PrepareVector(bv.data(), rows_kv).ok());
  ASSERT_TRUE(b->PrepareVector(nw.data(), cols).ok());
  for (bool normed : {false, true}) {
    for (int64_t n : {1, 3, 8, 9}) {
      const double bound = n <= 8 ? 1e-5 : 3e-3;
      const std::vector<float> x = Random(n * cols, 50 + n, 2.0f), y0 = Random(n * rows_q, 70 + n);
      // The products' input: x, or its RMSNorm rounded as RmsNorm rounds it.
      std::vector<float> in = x;
      if (normed) {
        for (int64_t t = 0; t < n; ++t) {
          double sum = 0;
          for (int64_t c = 0; c < cols; ++c)
            sum += static_cast<double>(x[t * cols + c]) * x[t * cols + c];
          const float inv = static_cast<float>(1.0 / std::sqrt(sum / cols + eps));
          for (int64_t c = 0; c < cols; ++c) in[t * cols + c] = x[t * cols + c] * inv * nw[c];
        }
      }
      auto dot = [&](const std::vector<float>& w, int64_t r, const std::vector<float>& v,
                     int64_t t) {
        double acc = 0;
        for (int64_t c = 0; c < cols; ++c)
          acc += static_cast<double>(w[r * cols + c]) * v[t * cols + c];
        return acc;
      };
      DeviceData d(b.get());
      const float* xd = d.Put(x);
      float* q = d.Poisoned<float>(n * rows_q);
      float* k = d.Poisoned<float>(n * rows_kv);
      float* v = d.Poisoned<float>(n * rows_kv);
      float* acc = d.Put(y0);
      float* scratch = d.Poisoned<float>(n * rows_ff);
      float* norm_out = d.Poisoned<float>(n * cols);
      float* gate = d.Poisoned<float>(n * rows_ff);
      float* up = d.Poisoned<float>(n * rows_ff);
      float* out = d.Poisoned<float>(n * rows_ff);
      const Backend::Product qkv[3] = {{&mq, bq.data(), q}, {&mk, nullptr, k}, {&mv, bv.data(), v}};
      const Backend::InputNorm norm =
          normed ? Backend::InputNorm{nw.data(), eps, norm_out} : Backend::InputNorm{};
      ASSERT_TRUE(b->Execute([&]() -> absl::Status {
                     MAGICPIG_RETURN_IF_ERROR(b->MatMuls(qkv, xd, n, norm));
                     MAGICPIG_RETURN_IF_ERROR(b->MatMulAdd(mq, xd, n, acc, scratch));
                     return b->GateUpSwiGlu(mg, mu, xd, n, norm, gate, up, out);
                   }).ok());
      std::vector<double> rq(n * rows_q), rk(n * rows_kv), rv(n * rows_kv), racc(n * rows_q),
          rout(n * rows_ff);
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t r = 0; r < rows_q; ++r) {
          rq[t * rows_q + r] = dot(wq, r, in, t) + bq[r];
          racc[t * rows_q + r] = y0[t * rows_q + r] + dot(wq, r, x, t);
        }
        for (int64_t r = 0; r < rows_kv; ++r) {
          rk[t * rows_kv + r] = dot(wk, r, in, t);
          rv[t * rows_kv + r] = dot(wv, r, in, t) + bv[r];
        }
        for (int64_t r = 0; r < rows_ff; ++r) {
          const double g = dot(wg, r, in, t);
          rout[t * rows_ff + r] = g / (1 + std::exp(-g)) * dot(wu, r, in, t);
        }
      }
      const std::string what = absl::StrCat(normed ? "normed" : "plain", ", n ", n);
      EXPECT_LT(RelativeError(d.Get(q, n * rows_q), rq), bound) << "q, " << what;
      EXPECT_LT(RelativeError(d.Get(k, n * rows_kv), rk), bound) << "k, " << what;
      EXPECT_LT(RelativeError(d.Get(v, n * rows_kv), rv), bound) << "v, " << what;
      EXPECT_LT(RelativeError(d.Get(acc, n * rows_q), racc), bound) << "add, " << what;
      EXPECT_LT(RelativeError(d.Get(out, n * rows_ff), rout), bound) << "gate/up, " << what;
    }
  }
}

// The element-wise operations against the CPU backend (the reference).
TEST(CudaBackendTest, NormRopeSwiGluAndAddsMatchTheCpuBackend) {
  MAGICPIG_REQUIRE_GPU();
  auto b = MakeBackend(true);
  ASSERT_NE(b, nullptr);
  CpuBackend cpu(1);
  const int64_t n = 5, heads = 3, hd = 64, dim = heads * hd;
  const std::vector<float> x = Random(n * dim, 1, 3.0f), w = Random(dim, 2), bias = Random(dim, 3);
  ASSERT_TRUE(b->PrepareVector(w.data(), dim).ok());
  ASSERT_TRUE(b->PrepareVector(bias.data(), dim).ok());
  const std::vector<int32_t> pos = {0, 1, 17, 300, 4095};
  DeviceData d(b.get());

  std::vector<float> want(n * dim);
  cpu.RmsNorm(x.data(), w.data(), n, dim, 1e-5f, want.data());
  float* out = d.Poisoned<float>(n * dim);
  const float* xd = d.Put(x);
  ASSERT_TRUE(b->Execute([&] {
                 b->RmsNorm(xd, w.data(), n, dim, 1e-5f, out);
                 return absl::OkStatus();
               }).ok());
  std::vector<float> got = d.Get(out, n * dim);
  for (int64_t i = 0; i < n * dim; ++i)
    ASSERT_NEAR(got[i], want[i], 1e-6 * (1 + std::fabs(want[i])));

  for (RopePairing pairing : {RopePairing::kAdjacent, RopePairing::kHalfOffset}) {
    for (int64_t n_rot : {hd, hd / 2}) {
      const RopeParams params{pairing, n_rot, 10000.0};
      std::vector<float> y = x;
      cpu.Rope(y.data(), n, heads, hd, pos.data(), params);
      float* yd = d.Put(x);
      const int32_t* pd = d.Put(pos);
      ASSERT_TRUE(b->Execute([&] {
                     b->Rope(yd, n, heads, hd, pd, params);
                     return absl::OkStatus();
                   }).ok());
      got = d.Get(yd, n * dim);
      for (int64_t i = 0; i < n * dim; ++i) {
        ASSERT_NEAR(got[i], y[i], 1e-5 * (1 + std::fabs(y[i]))) << "n_rot " << n_rot << " i " << i;
      }
      // q and k in one launch (RopeQk): k with 2 heads, against the CPU's two Rope calls, and
      // bit for bit against this backend's own Rope of each.
      const int64_t kv_heads = 2;
      const std::vector<float> kx = Random(n * kv_heads * hd, 7, 3.0f);
      std::vector<float> qy = x, ky = kx;
      cpu.RopeQk(qy.data(), heads, ky.data(), kv_heads, n, hd, pos.data(), params);
      float* qd = d.Put(x);
      float* kd = d.Put(kx);
      ASSERT_TRUE(b->Execute([&] {
                     b->RopeQk(qd, heads, kd, kv_heads, n, hd, pd, params);
                     return absl::OkStatus();
                   }).ok());
      const std::vector<float> gq = d.Get(qd, n * dim), gk = d.Get(kd, n * kv_heads * hd);
      for (int64_t i = 0; i < n * dim; ++i) {
        ASSERT_NEAR(gq[i], qy[i], 1e-5 * (1 + std::fabs(qy[i]))) << "q " << i;
        ASSERT_EQ(gq[i], got[i]) << "q " << i;
      }
      float* kd2 = d.Put(kx);
      ASSERT_TRUE(b->Execute([&] {
                     b->Rope(kd2, n, kv_heads, hd, pd, params);
                     return absl::OkStatus();
                   }).ok());
      const std::vector<float> gk2 = d.Get(kd2, n * kv_heads * hd);
      for (int64_t i = 0; i < n * kv_heads * hd; ++i) {
        ASSERT_NEAR(gk[i], ky[i], 1e-5 * (1 + std::fabs(ky[i]))) << "k " << i;
        ASSERT_EQ(gk[i], gk2[i]) << "k " << i;
      }
      // RoPE and the KV store in one launch (RopeQkStoreKv), into rows 3.. of a cache: q and k
      // bit for bit as RopeQk's, the cache rows as StoreKv's of them, the rows around untouched
      // (still the poison, fp16 NaN 0x7e00).
      const int64_t kv_row = kv_heads * hd, first = 3, rows = first + n + 2;
      const std::vector<float> vx = Random(n * kv_row, 8);
      float* qd3 = d.Put(x);
      float* kd3 = d.Put(kx);
      const float* vd3 = d.Put(vx);
      uint16_t* ck = d.Poisoned<uint16_t>(rows * kv_row);
      uint16_t* cv = d.Poisoned<uint16_t>(rows * kv_row);
      const KvLayerView view{ck, cv, rows, kv_heads, hd};
      ASSERT_TRUE(b->Execute([&] {
                     b->RopeQkStoreKv(qd3, heads, kd3, vd3, kv_heads, n, hd, pd, params, first,
                                      view);
                     return absl::OkStatus();
                   }).ok());
      const std::vector<float> gq3 = d.Get(qd3, n * dim), gk3 = d.Get(kd3, n * kv_row);
      const std::vector<uint16_t> hk = d.Get(static_cast<const uint16_t*>(ck), rows * kv_row);
      const std::vector<uint16_t> hv = d.Get(static_cast<const uint16_t*>(cv), rows * kv_row);
      for (int64_t i = 0; i < n * dim; ++i) ASSERT_EQ(gq3[i], gq[i]) << "fused q " << i;
      for (int64_t i = 0; i < rows * kv_row; ++i) {
        const int64_t r = i / kv_row - first;
        if (r < 0 || r >= n) {
          ASSERT_EQ(hk[i], 0x7e00) << "row outside the store " << i / kv_row;
          ASSERT_EQ(hv[i], 0x7e00) << "row outside the store " << i / kv_row;
          continue;
        }
        const int64_t j = r * kv_row + i % kv_row;
        ASSERT_EQ(gk3[j], gk[j]) << "fused k " << j;
        ASSERT_EQ(hk[i], FloatToFp16(gk[j])) << "cached k " << j;
        ASSERT_EQ(hv[i], FloatToFp16(vx[j])) << "cached v " << j;
      }
    }
  }

  const std::vector<float> up = Random(n * dim, 4);
  cpu.SwiGlu(x.data(), up.data(), n * dim, want.data());
  const float* upd = d.Put(up);
  ASSERT_TRUE(b->Execute([&] {
                 b->SwiGlu(xd, upd, n * dim, out);
                 return absl::OkStatus();
               }).ok());
  got = d.Get(out, n * dim);
  for (int64_t i = 0; i < n * dim; ++i)
    ASSERT_NEAR(got[i], want[i], 1e-6 * (1 + std::fabs(want[i])));

  std::vector<float> acc = up;
  cpu.Add(x.data(), acc.data(), n * dim);
  cpu.AddBias(acc.data(), bias.data(), n, dim);
  float* accd = d.Put(up);
  ASSERT_TRUE(b->Execute([&] {
                 b->Add(xd, accd, n * dim);
                 b->AddBias(accd, bias.data(), n, dim);
                 return absl::OkStatus();
               }).ok());
  got = d.Get(accd, n * dim);
  for (int64_t i = 0; i < n * dim; ++i) ASSERT_EQ(got[i], acc[i]);
}

TEST(CudaBackendTest, UnpreparedVectorFailsTheBatch) {
  MAGICPIG_REQUIRE_GPU();
  auto b = MakeBackend(true);
  ASSERT_NE(b, nullptr);
  const std::vector<float> x = Random(64, 1), w = Random(64, 2);
  DeviceData d(b.get());
  const float* xd = d.Put(x);
  float* out = d.Poisoned<float>(64);
  const absl::Status s = b->Execute([&] {
    b->RmsNorm(xd, w.data(), 1, 64, 1e-5f, out);
    return absl::OkStatus();
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
}

// GPU SimHash codes `got` of the n vectors x ([n][hash.dim()]) against the reference `want`: every
// code below 2^K and every differing bit one whose projection (in float64) is within 1e-4 of
// zero. *differing counts those bits.
void ExpectCodesUpToZeroProjections(const attention::SimHash& hash, const float* x, int64_t n,
                                    const std::vector<uint16_t>& got,
                                    const std::vector<uint16_t>& want, int64_t* differing) {
  const int64_t d = hash.dim(), k = hash.k(), l = hash.l(), cols = k * l;
  const std::vector<float>& w = hash.projection();
  for (int64_t v = 0; v < n; ++v) {
    for (int64_t t = 0; t < l; ++t) {
      const uint16_t diff = got[v * l + t] ^ want[v * l + t];
      ASSERT_LT(got[v * l + t], 1u << k) << "vector " << v;
      for (int64_t bit = 0; bit < k; ++bit) {
        if (((diff >> bit) & 1) == 0) continue;
        ++*differing;
        double proj = 0;
        for (int64_t i = 0; i < d; ++i) {
          proj += static_cast<double>(x[v * d + i]) * w[i * cols + t * k + bit];
        }
        ASSERT_LT(std::fabs(proj), 1e-4) << "vector " << v << " table " << t << " bit " << bit;
      }
    }
  }
}

// SimHash codes on the GPU (one fused projection and sign-packing kernel) against the float64
// reference, bit for bit except where a projection is within rounding of zero.
TEST(CudaBackendTest, SimHashCodesMatchTheReference) {
  MAGICPIG_REQUIRE_GPU();
  auto b = MakeBackend(false);
  ASSERT_NE(b, nullptr);
  struct Shape {
    int64_t d;
    int k, l;
    int64_t n;
  };
  // 37 vectors take the kernel's block per vector, 203 and 70,001 its blocks of 8 vectors.
  for (const Shape& shape : {Shape{64, 10, 150, 37}, Shape{128, 8, 75, 37}, Shape{16, 16, 4, 37},
                             Shape{64, 10, 150, 203}, Shape{8, 3, 5, 70001}}) {
    auto hash = attention::SimHash::Create(shape.d, shape.k, shape.l, 1234);
    ASSERT_TRUE(hash.ok()) << hash.status();
    const int64_t n = shape.n;
    const std::vector<float> x = Random(n * shape.d, 21);
    DeviceData d(b.get());
    const float* xd = d.Put(x);
    std::vector<uint16_t> got(n * shape.l, 0xffff), want(n * shape.l);
    ASSERT_TRUE(b->Execute([&] { return b->SimHashCodes(*hash, xd, n, got.data()); }).ok());
    ASSERT_TRUE(hash->CodesReference(x.data(), n, shape.d, want.data()).ok());
    int64_t differing = 0;
    ASSERT_NO_FATAL_FAILURE(
        ExpectCodesUpToZeroProjections(*hash, x.data(), n, got, want, &differing));
  }
}

// An offload's key codes on the GPU (the centre, the centred keys and their codes) against the
// host's (backend::CentredKeys, then SimHash::KeyCodes): the centre bit for bit (the same float64
// sums in the same order), the codes bit for bit except where the centred key's projection is
// within rounding of zero. Cases: the centre computed; the centre given; positions after a gap
// (rows of a cache that dropped an offloaded region); enough positions for several chunks.
TEST(CudaBackendTest, OffloadKeyCodesMatchTheHosts) {
  MAGICPIG_REQUIRE_GPU();
  auto b = MakeBackend(false);
  ASSERT_NE(b, nullptr);
  struct Case {
    int64_t n_kv, hd;
    int k, l;
    int64_t rows, begin, end, gap_begin, gap_end;
    bool compute_centre;
  };
  for (const Case& c : {Case{3, 64, 10, 150, 700, 4, 640, 0, 0, true},
                        Case{2, 128, 8, 75, 300, 4, 260, 0, 0, false},
                        Case{2, 64, 10, 150, 200, 150, 230, 4, 100, true},
                        Case{1, 64, 8, 20, 70010, 3, 70003, 0, 0, true}}) {
    SCOPED_TRACE(absl::StrCat("n_kv ", c.n_kv, " hd ", c.hd, " [", c.begin, ", ", c.end, ")"));
    auto hash = attention::SimHash::Create(c.hd, c.k, c.l, 99);
    ASSERT_TRUE(hash.ok()) << hash.status();
    const int64_t n = c.end - c.begin, row = c.n_kv * c.hd;
    // Keys with a common offset (what centring removes), rounded to fp16 as the cache holds them.
    std::vector<float> keys = Random(c.rows * row, 5);
    for (int64_t i = 0; i < c.rows * row; ++i) keys[i] += 0.3f * static_cast<float>(i % c.hd % 5);
    std::vector<uint16_t> k16(keys.size()), v16(keys.size(), 0);
    for (size_t i = 0; i < keys.size(); ++i) k16[i] = FloatToFp16(keys[i]);
    const KvLayerView host{k16.data(), v16.data(), c.rows, c.n_kv, c.hd, c.gap_begin, c.gap_end};
    std::vector<float> given = Random(row, 6, 0.2f);
    std::vector<float> want_centre = given;
    std::vector<float> centred(n * row);
    CentredKeys(host, c.begin, c.end, c.compute_centre, want_centre.data(), centred.data(),
                nullptr);
    std::vector<uint16_t> want(n * c.n_kv * c.l);
    ASSERT_TRUE(hash->KeyCodes(centred.data(), n * c.n_kv, c.hd, want.data()).ok());
    // What KeyCodes hashed: the centred keys' bf16 values (the zero-projection check needs them).
    for (float& x : centred) x = Bf16ToFloat(FloatToBf16(x));

    DeviceData d(b.get());
    const KvLayerView dev{d.Put(k16), d.Put(v16), c.rows, c.n_kv, c.hd, c.gap_begin, c.gap_end};
    std::vector<float> got_centre = given;
    if (c.compute_centre) std::fill(got_centre.begin(), got_centre.end(), -1.0f);
    std::vector<uint16_t> got(want.size(), 0xffff);
    const absl::Status s = b->Execute([&] {
      return b->OffloadKeyCodes(*hash, dev, c.begin, c.end, c.compute_centre, got_centre.data(),
                                got.data());
    });
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_EQ(0, std::memcmp(got_centre.data(), want_centre.data(), row * sizeof(float)));
    int64_t differing = 0;
    ASSERT_NO_FATAL_FAILURE(
        ExpectCodesUpToZeroProjections(*hash, centred.data(), n * c.n_kv, got, want, &differing));
    EXPECT_LE(differing, n * c.n_kv * c.l * c.k / 10000 + 1);
  }
  // Positions that are not rows of the cache (inside the gap) are refused, nothing is computed.
  auto hash = attention::SimHash::Create(64, 10, 150, 99);
  ASSERT_TRUE(hash.ok());
  DeviceData d(b.get());
  const KvLayerView gapped{
      d.Poisoned<uint16_t>(100 * 64), d.Poisoned<uint16_t>(100 * 64), 100, 1, 64, 10, 50};
  std::vector<float> centre(64);
  std::vector<uint16_t> codes(60 * 150);
  const absl::Status s = b->Execute(
      [&] { return b->OffloadKeyCodes(*hash, gapped, 4, 64, true, centre.data(), codes.data()); });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

struct AttentionCase {
  int64_t n_head, n_head_kv, head_dim, first_pos, n_tokens;
};

class CudaAttentionTest : public ::testing::TestWithParam<AttentionCase> {};

// One way the backend may compute causal attention.
struct AttentionConfig {
  const char* name;
  CudaAttentionKernel kernel;
  bool wide_merge;
  int64_t tensor_scratch_bytes;
};

void CheckCausalAttention(const AttentionCase& c, const AttentionConfig& config);

// Causal attention (prefill chunks and decode) against float64 over the fp16 cache, through the
// split-K kernel and through the tiled one (head_dim <= 128; groups of 1 to 32 heads, the last
// two larger than one block's 16 rows), whatever the number of queries, each with both merges of
// the partials (the wide one where a row has 32 pieces or more: the deep decode case has 188).
// The default (auto) picks tiled or split-K by the number of queries, and the engine tests run it.
TEST_P(CudaAttentionTest, MatchesFloat64) {
  MAGICPIG_REQUIRE_GPU();
  constexpr int64_t kScratch = int64_t{512} << 20;
  const AttentionConfig configs[] = {
      {"split-K, serial merge", CudaAttentionKernel::kSplitK, false, kScratch},
      {"split-K, wide merge", CudaAttentionKernel::kSplitK, true, kScratch},
      {"tiled, serial merge", CudaAttentionKernel::kTiled, false, kScratch},
      {"tiled, wide merge", CudaAttentionKernel::kTiled, true, kScratch},
  };
  for (const AttentionConfig& config : configs) {
    SCOPED_TRACE(config.name);
    CheckCausalAttention(GetParam(), config);
  }
}

// The same cases through the tensor-core products (chunks of 16 queries or more; with 64 KiB of
// scratch a chunk is cut into several, down to one query each), at fp16-operand tolerance. A test
// of its own so that racecheck, which the device check runs on the attention kernels, can leave
// cuBLAS's kernels out.
TEST_P(CudaAttentionTest, TensorProductsMatchFloat64) {
  MAGICPIG_REQUIRE_GPU();
  const AttentionConfig configs[] = {
      {"tensor", CudaAttentionKernel::kTensor, false, int64_t{512} << 20},
      {"tensor, 64 KiB scratch", CudaAttentionKernel::kTensor, false, 64 << 10},
  };
  for (const AttentionConfig& config : configs) {
    SCOPED_TRACE(config.name);
    CheckCausalAttention(GetParam(), config);
  }
}

void CheckCausalAttention(const AttentionCase& c, const AttentionConfig& config) {
  auto b = MakeBackend(true, config.kernel, config.wide_merge, config.tensor_scratch_bytes);
  ASSERT_NE(b, nullptr);
  const int64_t rows = c.first_pos + c.n_tokens, kv_row = c.n_head_kv * c.head_dim;
  const int64_t q_row = c.n_head * c.head_dim;
  const std::vector<float> kf = Random(rows * kv_row, 1, 2.0f), vf = Random(rows * kv_row, 2);
  const std::vector<float> q = Random(c.n_tokens * q_row, 3, 2.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  DeviceData d(b.get());
  uint16_t* k = d.Poisoned<uint16_t>(rows * kv_row);
  uint16_t* v = d.Poisoned<uint16_t>(rows * kv_row);
  const KvLayerView view{k, v, rows, c.n_head_kv, c.head_dim};
  const float* kd = d.Put(kf);
  const float* vd = d.Put(vf);
  const float* qd = d.Put(q);
  float* out = d.Poisoned<float>(c.n_tokens * q_row);
  ASSERT_TRUE(b->Execute([&] {
                 b->StoreKv(kd, vd, rows, 0, view);
                 b->CausalAttention(qd, c.n_tokens, c.first_pos, c.n_head, scale, view, out);
                 return absl::OkStatus();
               }).ok());
  const std::vector<uint16_t> kh = d.Get(static_cast<const uint16_t*>(k), rows * kv_row);
  const std::vector<uint16_t> vh = d.Get(static_cast<const uint16_t*>(v), rows * kv_row);
  for (int64_t i = 0; i < rows * kv_row; ++i) {
    ASSERT_EQ(kh[i], FloatToFp16(kf[i]));
    ASSERT_EQ(vh[i], FloatToFp16(vf[i]));
  }
  const std::vector<float> got = d.Get(static_cast<const float*>(out), c.n_tokens * q_row);
  const std::vector<double> want =
      testing::CausalAttentionReference(q.data(), c.n_tokens, c.first_pos, c.n_head, scale,
                                        testing::Fp16Cache{&kh, &vh, c.n_head_kv, c.head_dim});
  // fp32 arithmetic over the fp16 cache, except on the tensor path: fp16 queries and
  // probabilities, whose rounding alone (emulated in NumPy on these shapes and scales) moves
  // elements by up to 2.5e-3 of 1 + |want| and the whole output by up to 6e-4 of its norm.
  const bool tensor =
      config.kernel == CudaAttentionKernel::kTensor && c.n_tokens >= kTensorMinQueries;
  const double tol = tensor ? 1e-2 : 2e-5;
  double err2 = 0, ref2 = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tol + tol * std::fabs(want[i])) << "index " << i;
    err2 += (got[i] - want[i]) * (got[i] - want[i]);
    ref2 += want[i] * want[i];
  }
  if (tensor) {  // the whole output's relative error, beside the elementwise bound
    EXPECT_LT(std::sqrt(err2 / ref2), 2e-3);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaAttentionTest,
    ::testing::Values(AttentionCase{9, 3, 64, 0, 1}, AttentionCase{9, 3, 64, 0, 70},
                      AttentionCase{9, 3, 64, 200, 1}, AttentionCase{9, 3, 64, 1500, 1},
                      AttentionCase{32, 8, 128, 4000, 1}, AttentionCase{4, 2, 128, 1300, 5},
                      AttentionCase{4, 4, 128, 31, 33}, AttentionCase{8, 1, 16, 5, 17},
                      AttentionCase{2, 2, 256, 64, 3}, AttentionCase{6, 2, 48, 37, 21},
                      AttentionCase{12, 2, 128, 0, 300}, AttentionCase{8, 2, 64, 2000, 40},
                      AttentionCase{3, 3, 96, 5000, 16}, AttentionCase{32, 1, 64, 300, 1},
                      AttentionCase{20, 1, 32, 100, 3}, AttentionCase{9, 3, 64, 12000, 1}));

// RangeAttention (the static window's part of a sparse step) and its lse, against float64, with
// both merges of the partials.
class CudaRangeAttentionTest : public ::testing::TestWithParam<bool> {};

TEST_P(CudaRangeAttentionTest, MatchesFloat64) {
  MAGICPIG_REQUIRE_GPU();
  auto b = MakeBackend(true, CudaAttentionKernel::kAuto, /*wide_merge=*/GetParam());
  ASSERT_NE(b, nullptr);
  const int64_t n_head = 6, n_kv = 2, hd = 64, rows = 700, kv_row = n_kv * hd;
  const std::vector<float> kf = Random(rows * kv_row, 4, 2.0f), vf = Random(rows * kv_row, 5);
  const std::vector<float> q = Random(n_head * hd, 6, 2.0f);
  const float scale = 0.125f;
  DeviceData d(b.get());
  uint16_t* k = d.Poisoned<uint16_t>(rows * kv_row);
  uint16_t* v = d.Poisoned<uint16_t>(rows * kv_row);
  const KvLayerView view{k, v, rows, n_kv, hd};
  const float* kd = d.Put(kf);
  const float* vd = d.Put(vf);
  const float* qd = d.Put(q);
  const std::vector<std::vector<std::pair<int64_t, int64_t>>> cases = {
      {{0, 4}, {613, 700}}, {{0, 4}, {37, 38}, {100, 699}}, {{5, 5}}, {{0, 1}}, {}};
  std::vector<uint16_t> kh(kf.size()), vh(vf.size());
  for (size_t i = 0; i < kf.size(); ++i) {
    kh[i] = FloatToFp16(kf[i]);
    vh[i] = FloatToFp16(vf[i]);
  }
  for (const auto& ranges : cases) {
    float* out = d.Poisoned<float>(n_head * hd);
    float* lse = d.Poisoned<float>(n_head);
    ASSERT_TRUE(b->Execute([&] {
                   b->StoreKv(kd, vd, rows, 0, view);
                   b->RangeAttention(qd, n_head, scale, view, ranges, out, lse);
                   return absl::OkStatus();
                 }).ok());
    const std::vector<float> o = d.Get(static_cast<const float*>(out), n_head * hd);
    const std::vector<float> l = d.Get(static_cast<const float*>(lse), n_head);
    const testing::ReferenceAttention ref = testing::RangeAttentionReference(
        q.data(), n_head, scale, testing::Fp16Cache{&kh, &vh, n_kv, hd}, ranges);
    for (int64_t h = 0; h < n_head; ++h) {
      if (std::isinf(ref.lse[h])) {  // no key: o = 0, lse = -inf
        EXPECT_EQ(l[h], -INFINITY);
        for (int64_t e = 0; e < hd; ++e) EXPECT_EQ(o[h * hd + e], 0.0f);
        continue;
      }
      EXPECT_NEAR(l[h], ref.lse[h], 1e-4 * (1 + std::fabs(ref.lse[h])));
      for (int64_t e = 0; e < hd; ++e) {
        const double want = ref.o[h * hd + e];
        ASSERT_NEAR(o[h * hd + e], want, 2e-5 + 2e-5 * std::fabs(want));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Merges, CudaRangeAttentionTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "WideMerge" : "SerialMerge";
                         });

// A view with a gap (a sparse layer's offloaded positions dropped from the GPU): StoreKv and
// RangeAttention address positions and give what the whole cache gives.
TEST(CudaBackendTest, GappedViewMatchesTheWholeCache) {
  MAGICPIG_REQUIRE_GPU();
  auto b = MakeBackend(true);
  ASSERT_NE(b, nullptr);
  const int64_t n_head = 4, n_kv = 2, hd = 32, rows = 300, kv_row = n_kv * hd;
  const int64_t gap_begin = 4, gap_end = 250, kept = rows - (gap_end - gap_begin);
  const std::vector<float> kf = Random(rows * kv_row, 7, 2.0f), vf = Random(rows * kv_row, 8);
  const std::vector<float> q = Random(n_head * hd, 9, 2.0f);
  DeviceData d(b.get());
  const KvLayerView whole{d.Poisoned<uint16_t>(rows * kv_row), d.Poisoned<uint16_t>(rows * kv_row),
                          rows, n_kv, hd};
  KvLayerView gapped{d.Poisoned<uint16_t>(kept * kv_row), d.Poisoned<uint16_t>(kept * kv_row), kept,
                     n_kv, hd};
  gapped.gap_begin = gap_begin;
  gapped.gap_end = gap_end;
  const float* kd = d.Put(kf);
  const float* vd = d.Put(vf);
  const float* qd = d.Put(q);
  float* o1 = d.Poisoned<float>(n_head * hd);
  float* o2 = d.Poisoned<float>(n_head * hd);
  float* l1 = d.Poisoned<float>(n_head);
  float* l2 = d.Poisoned<float>(n_head);
  const std::vector<std::pair<int64_t, int64_t>> ranges = {{0, 4}, {270, 300}};
  ASSERT_TRUE(b->Execute([&] {
                 b->StoreKv(kd, vd, rows, 0, whole);
                 b->StoreKv(kd, vd, gap_begin, 0, gapped);
                 b->StoreKv(kd + gap_end * kv_row, vd + gap_end * kv_row, rows - gap_end, gap_end,
                            gapped);
                 b->RangeAttention(qd, n_head, 0.2f, whole, ranges, o1, l1);
                 b->RangeAttention(qd, n_head, 0.2f, gapped, ranges, o2, l2);
                 return absl::OkStatus();
               }).ok());
  EXPECT_EQ(d.Get(static_cast<const float*>(o1), n_head * hd),
            d.Get(static_cast<const float*>(o2), n_head * hd));
  EXPECT_EQ(d.Get(static_cast<const float*>(l1), n_head),
            d.Get(static_cast<const float*>(l2), n_head));
}

// A recorded batch (ExecuteReplayable): host data given to CopyIn is taken when the batch is
// recorded, CopyOut's data is on the host when the call returns, a second batch of the same
// operations updates the first one's graph, and a batch that must allocate runs with Execute
// instead, with the same results.
TEST(CudaBackendTest, ReplayableBatchesRecordCopiesAndFallBack) {
  MAGICPIG_REQUIRE_GPU();
  auto made = CudaBackend::Create(CudaBackendOptions{0, false, /*graphs=*/true});
  ASSERT_TRUE(made.ok()) << made.status();
  std::unique_ptr<CudaBackend> b = *std::move(made);
  const int64_t n = 1000;
  auto in = b->Allocate(n * 4), out = b->Allocate(n * 4);
  ASSERT_TRUE(in.ok() && out.ok());
  BackendBuffer grown;
  for (int round = 0; round < 4; ++round) {
    const std::vector<float> x0 = Random(n, 60 + round);
    std::vector<float> x = x0, y(n, NAN), got(n, NAN);
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(i);
    const bool allocate = round == 2;
    const absl::Status s = b->ExecuteReplayable([&]() -> absl::Status {
      if (allocate) MAGICPIG_RETURN_IF_ERROR(b->Reserve(grown, (round + 1) * 4096));
      MAGICPIG_RETURN_IF_ERROR(b->CopyIn(in->data(), x.data(), n * 4));
      MAGICPIG_RETURN_IF_ERROR(b->CopyIn(out->data(), y.data(), n * 4));
      b->Add(in->as<float>(), out->as<float>(), n);
      return b->CopyOut(got.data(), out->data(), n * 4);
    });
    ASSERT_TRUE(s.ok()) << s;
    x.assign(n, 1e9f);  // recorded copies took the data already
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(got[i], static_cast<float>(i) + x0[i]) << round << " " << i;
    }
  }
  const CudaGraphStats& st = b->graph_stats();
  // Round 0 grows the staging buffer (falls back), rounds 1 and 3 replay, round 2 allocates.
  EXPECT_EQ(st.fell_back, 2) << "replayed " << st.replayed;
  EXPECT_EQ(st.replayed, 2);
  EXPECT_EQ(st.instantiated, 1);
  EXPECT_EQ(st.updated, 1);
}

// A decode step replayed as a graph computes what the same step launched op by op does: equal
// greedy continuations and equal logits of the last step, on the fp16 product path; and the
// steps were replayed, not run eagerly.
TEST(CudaBackendTest, GraphReplayedDecodeEqualsEagerDecode) {
  MAGICPIG_REQUIRE_GPU();
  testing::SyntheticModelOptions m = testing::SmallModel(3);
  m.architecture = "qwen2";
  m.weight_type = GgmlType::kQ4_K;
  m.embd_type = GgmlType::kQ4_K;
  m.n_embd = 256;
  m.n_ff = 512;
  std::vector<std::vector<int32_t>> tokens;
  std::vector<CudaGraphStats> stats;
  for (bool graphs : {false, true}) {
    auto backend = CudaBackend::Create(CudaBackendOptions{0, false, graphs});
    ASSERT_TRUE(backend.ok()) << backend.status();
    CudaBackend* raw = backend->get();
    auto e = testing::MakeSyntheticEngine(m, testing::FullAttentionOptions(), *std::move(backend));
    ASSERT_TRUE(e.ok()) << e.status();
    engine::GenerateRequest req;
    req.prompt = (*e)->tokenizer().Encode("the cat, the dog, the bird and the fish", false);
    req.max_tokens = 32;
    req.ignore_eos = true;
    auto r = (*e)->Generate(req, {});
    ASSERT_TRUE(r.ok()) << r.status();
    tokens.push_back(r->tokens);
    stats.push_back(raw->graph_stats());
  }
  EXPECT_EQ(tokens[0], tokens[1]);
  EXPECT_EQ(stats[0].replayed, 0);
  EXPECT_GE(stats[1].replayed, 25) << "fell back " << stats[1].fell_back;
  EXPECT_GE(stats[1].updated, 20);
}

// End to end: an engine on the GPU against the CPU engine's float-activation path on synthetic
// llama and qwen2 models: logits close, and the same greedy continuation.
// The GPU backend (fp32 weights) or the CPU backend's float-activation path, the reference
// (cpu_threads 0: every core).
std::unique_ptr<Backend> GpuOrCpuFloat(bool gpu, int cpu_threads = 2) {
  if (gpu) return MakeBackend(true);
  return std::make_unique<CpuBackend>(cpu_threads, ActiveSimdLevel(), /*float_activations=*/true);
}

std::unique_ptr<engine::Engine> MakeEngine(const testing::SyntheticModelOptions& model, bool gpu,
                                           const engine::EngineOptions& options) {
  auto e = testing::MakeSyntheticEngine(model, options, GpuOrCpuFloat(gpu));
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? *std::move(e) : nullptr;
}

class CudaEngineTest : public ::testing::TestWithParam<std::pair<const char*, GgmlType>> {};

TEST_P(CudaEngineTest, LogitsAndGreedyTokensMatchTheCpuFloatPath) {
  MAGICPIG_REQUIRE_GPU();
  testing::SyntheticModelOptions m = testing::SmallModel(3);
  m.architecture = GetParam().first;
  m.weight_type = GetParam().second;
  m.embd_type = GetParam().second;
  if (GgmlBlockSize(m.weight_type) == 256) {  // K-quant rows are whole 256-value super-blocks
    m.n_embd = 256;
    m.n_ff = 512;
  }
  auto cpu = MakeEngine(m, false, testing::FullAttentionOptions());
  auto gpu = MakeEngine(m, true, testing::FullAttentionOptions());
  ASSERT_NE(cpu, nullptr);
  ASSERT_NE(gpu, nullptr);
  std::vector<int32_t> tokens = cpu->tokenizer().Encode(
      "the cat, the dog, the bird and the fish all went to the market to buy bread", false);
  auto a = cpu->ScoreAll(tokens);
  auto g = gpu->ScoreAll(tokens);
  ASSERT_TRUE(a.ok() && g.ok()) << g.status();
  ASSERT_EQ(a->size(), g->size());
  std::vector<double> ref(a->begin(), a->end());
  EXPECT_LT(RelativeError(*g, ref), 1e-5);
  engine::GenerateRequest req;
  req.prompt = tokens;
  req.max_tokens = 32;
  req.ignore_eos = true;
  auto ra = cpu->Generate(req, {});
  auto rg = gpu->Generate(req, {});
  ASSERT_TRUE(ra.ok() && rg.ok()) << rg.status();
  EXPECT_EQ(ra->tokens, rg->tokens);
}

INSTANTIATE_TEST_SUITE_P(Models, CudaEngineTest,
                         ::testing::Values(std::pair{"llama", GgmlType::kF32},
                                           std::pair{"llama", GgmlType::kQ4_1},
                                           std::pair{"qwen2", GgmlType::kQ8_0},
                                           std::pair{"qwen2", GgmlType::kQ4_K}));

// MagicPIG (the default) with a window small enough that the test prompt below is offloaded.
engine::EngineOptions SmallWindowMagicPig() {
  engine::EngineOptions options;
  options.attention.n_sinks = 4;
  options.attention.n_local = 8;
  options.attention.min_offload_keys = 1;  // short test prompts
  return options;
}

// 32 greedy tokens after a prompt of about a hundred tokens.
engine::GenerateRequest LongPromptRequest(const engine::Engine& e) {
  engine::GenerateRequest req;
  req.prompt = e.tokenizer().Encode(
      "a long prompt about many things: the cat, the dog, the bird and the fish all went to the "
      "market to buy bread and milk and honey for the winter",
      false);
  req.max_tokens = 32;
  req.ignore_eos = true;
  return req;
}

// MagicPIG with the dense layers on the GPU (the router on the cache's host mirror) against the
// CPU float-activation path with MagicPIG. Hash codes of projections within rounding of zero may
// differ, so the continuations may part late; they must agree for most of the 32 tokens.
TEST(CudaBackendTest, MagicPigFollowsTheCpuFloatPath) {
  MAGICPIG_REQUIRE_GPU();
  auto cpu = MakeEngine(testing::SmallModel(3), false, SmallWindowMagicPig());
  auto gpu = MakeEngine(testing::SmallModel(3), true, SmallWindowMagicPig());
  ASSERT_NE(cpu, nullptr);
  ASSERT_NE(gpu, nullptr);
  const engine::GenerateRequest req = LongPromptRequest(*cpu);
  auto a = cpu->Generate(req, {});
  auto g = gpu->Generate(req, {});
  ASSERT_TRUE(a.ok() && g.ok()) << g.status();
  EXPECT_GT(g->stats.attention_keys_offloaded, 0);
  size_t same = 0;
  while (same < a->tokens.size() && same < g->tokens.size() && a->tokens[same] == g->tokens[same]) {
    ++same;
  }
  EXPECT_GE(same, 24u) << "the GPU's MagicPIG tokens part from the CPU's at token " << same;
}

// The dense layers on the GPU with MagicPIG's shards on two attention-node processes (the
// AttentionService over gRPC, blocks spread over both) against the same GPU engine with embedded
// shards: the same greedy tokens and the same keys touched, since the nodes get the GPU's queries
// and codes and merge their blocks' partials exactly (issue #34's two-node check; the CPU and
// fake-device versions are in tests/integration/distributed_decode_test.cc).
TEST(CudaBackendTest, MagicPigOnTwoAttentionNodesMatchesEmbeddedShards) {
  MAGICPIG_REQUIRE_GPU();
  const char* env = std::getenv("MAGICPIG_ATTN_NODE");
  const std::string binary = env != nullptr ? env : MAGICPIG_ATTN_NODE_BINARY;
  if (!std::filesystem::exists(binary)) GTEST_SKIP() << "no attention node binary at " << binary;
  std::vector<std::unique_ptr<testing::Subprocess>> nodes;
  std::vector<std::string> addresses;
  for (int i = 0; i < 2; ++i) {
    auto node = testing::StartAttentionNode(binary, {"--insecure"});
    ASSERT_TRUE(node.ok()) << node.status();
    nodes.push_back(std::move(node->first));
    addresses.push_back(node->second);
  }
  engine::EngineOptions options = SmallWindowMagicPig();
  options.attention.shard_block = 16;  // several blocks per sequence, on both nodes
  options.node_security = fabric::TransportSecurity::Plaintext();
  options.placement = remote::Placement::kSpread;
  auto embedded = MakeEngine(testing::SmallModel(3), true, options);
  options.attention_nodes = addresses;
  auto remote = MakeEngine(testing::SmallModel(3), true, options);
  ASSERT_NE(embedded, nullptr);
  ASSERT_NE(remote, nullptr);
  const engine::GenerateRequest req = LongPromptRequest(*embedded);
  auto a = embedded->Generate(req, {});
  auto b = remote->Generate(req, {});
  ASSERT_TRUE(a.ok() && b.ok()) << b.status();
  EXPECT_GT(a->stats.attention_keys_offloaded, 0);
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_EQ(a->stats.attention_keys_touched, b->stats.attention_keys_touched);
  EXPECT_EQ(a->stats.attention_keys_offloaded, b->stats.attention_keys_offloaded);
}

// SmolLM2 (the real model), when its file is present: the GPU's greedy continuation equals the
// CPU float-activation path's.
TEST(CudaBackendTest, SmolLm2GreedyMatchesTheCpuFloatPath) {
  MAGICPIG_REQUIRE_GPU();
  const char* src = std::getenv("MAGICPIG_SOURCE_DIR");
  const std::filesystem::path path =
      std::filesystem::path(src != nullptr ? src : ".") / "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no model file at " << path;
  auto load = [&](bool gpu) -> std::unique_ptr<engine::Engine> {
    auto file = model::GgufFile::Open(path.string());
    EXPECT_TRUE(file.ok()) << file.status();
    auto e = engine::Engine::Create(std::shared_ptr<const model::GgufFile>(*std::move(file)),
                                    GpuOrCpuFloat(gpu, 0), testing::FullAttentionOptions());
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? *std::move(e) : nullptr;
  };
  auto cpu = load(false);
  auto gpu = load(true);
  ASSERT_NE(cpu, nullptr);
  ASSERT_NE(gpu, nullptr);
  for (const char* prompt : {"The capital of France is", "def fibonacci(n):"}) {
    engine::GenerateRequest req;
    req.prompt = cpu->tokenizer().Encode(prompt, true);
    req.max_tokens = 32;
    req.ignore_eos = true;
    auto a = cpu->Generate(req, {});
    auto g = gpu->Generate(req, {});
    ASSERT_TRUE(a.ok() && g.ok()) << g.status();
    EXPECT_EQ(a->tokens, g->tokens) << prompt;
  }
}

}  // namespace
}  // namespace magicpig::backend
