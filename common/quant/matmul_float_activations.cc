// MatMulFloatActivations: dequantise-then-dot reference-precision product (see matmul.h).
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/quant/matmul.h"
#include "common/vec_kernels.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"

namespace magicpig {

absl::Status MatMulFloatActivations(const QuantMatrix& w, const float* x, int64_t ldx,
                                    int64_t n_tokens, float* y, int64_t ldy, SimdLevel level) {
  if (absl::Status s = CheckMatrix(w); !s.ok()) return s;
  if (n_tokens < 0 || ldx < w.cols || ldy < w.rows) {
    return absl::InvalidArgumentError(absl::StrCat("inconsistent shapes for a ", w.rows, "x",
                                                   w.cols, " ", GgmlTypeName(w.type), " matrix"));
  }
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, w.rows, 16), [&](const auto& range) {
    std::vector<float> row(w.cols);
    for (int64_t r = range.begin(); r < range.end(); ++r) {
      // Cannot fail: the matrix was checked above and r is in range.
      (void)GetRow(w, r, row.data());
      for (int64_t t = 0; t < n_tokens; ++t) {
        y[t * ldy + r] = DotF32(row.data(), x + t * ldx, w.cols, level);
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace magicpig
