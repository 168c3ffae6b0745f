#include <cmath>
#include <random>
#include <vector>

#include "common/quant/dequantize.h"
#include "common/quant/matmul.h"
#include "gtest/gtest.h"
#include "tests/testing/quantize_reference.h"

namespace magicpig {
namespace {

// Float activations: the only error left is float32 summation, so the bound is tight
// (1e-5 of sum |w||x|), unlike MatMul's 8-bit activation rounding.
TEST(MatMulFloatActivationsTest, MatchesFloat64ProductForEveryType) {
  const int64_t rows = 37, cols = 512, n_tokens = 5;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<float> wf(rows * cols), x(n_tokens * cols);
  for (float& v : wf) v = nd(rng);
  for (float& v : x) v = nd(rng);
  for (GgmlType type :
       {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ4_0, GgmlType::kQ4_1,
        GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0, GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    std::vector<uint8_t> bytes;
    for (int64_t r = 0; r < rows; ++r) {
      auto q = testing::QuantizeReference(type, wf.data() + r * cols, cols);
      ASSERT_TRUE(q.ok()) << q.status();
      bytes.insert(bytes.end(), q->begin(), q->end());
    }
    QuantMatrix m{type, bytes.data(), rows, cols};
    for (SimdLevel level : SupportedSimdLevels()) {
      std::vector<float> y(n_tokens * rows, -1.0f);
      ASSERT_TRUE(MatMulFloatActivations(m, x.data(), cols, n_tokens, y.data(), rows, level).ok());
      std::vector<float> row(cols);
      for (int64_t r = 0; r < rows; ++r) {
        ASSERT_TRUE(
            DequantizeRow(type, bytes.data() + r * GgmlRowBytes(type, cols), row.data(), cols)
                .ok());
        for (int64_t t = 0; t < n_tokens; ++t) {
          double expected = 0, scale = 0;
          for (int64_t k = 0; k < cols; ++k) {
            expected += static_cast<double>(row[k]) * x[t * cols + k];
            scale += std::fabs(static_cast<double>(row[k]) * x[t * cols + k]);
          }
          EXPECT_NEAR(y[t * rows + r], expected, 1e-5 * scale)
              << GgmlTypeName(type) << " level " << SimdLevelName(level) << " r " << r;
        }
      }
    }
  }
}

TEST(MatMulFloatActivationsTest, RejectsBadShapes) {
  std::vector<uint8_t> bytes(20 * 4);
  QuantMatrix m{GgmlType::kQ4_1, bytes.data(), 4, 33};
  std::vector<float> x(33), y(4);
  EXPECT_EQ(MatMulFloatActivations(m, x.data(), 33, 1, y.data(), 4).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace magicpig
