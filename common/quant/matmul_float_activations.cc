// MatMulFloatActivations: dequantise-then-dot reference-precision product (see matmul.h).
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/quant/dequantize.h"
#include "common/quant/matmul.h"
#include "common/vec_kernels.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"

namespace magicpig {

absl::Status MatMulFloatActivations(const QuantMatrix& w, const float* x, int64_t ldx,
                                    int64_t n_tokens, float* y, int64_t ldy, SimdLevel level) {
  if (w.rows < 0 || w.cols <= 0 || w.cols % GgmlBlockSize(w.type) != 0 || n_tokens < 0 ||
      ldx < w.cols || ldy < w.rows) {
    return absl::InvalidArgumentError(absl::StrCat("inconsistent shapes for a ", w.rows, "x",
                                                   w.cols, " ", GgmlTypeName(w.type), " matrix"));
  }
  if (!GetGgmlTypeInfo(w.type).supported) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported weight type ", GgmlTypeName(w.type)));
  }
  if (w.rows > 0 && w.data == nullptr) return absl::InvalidArgumentError("null weight data");
  if (w.layout == WeightLayout::kRows16 && !CanInterleave(w.type, w.rows, w.cols)) {
    return absl::InvalidArgumentError("matrix cannot be in the 16-row interleaved layout");
  }
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, w.rows, 16), [&](const auto& range) {
    std::vector<float> row(w.cols);
    for (int64_t r = range.begin(); r < range.end(); ++r) {
      // Cannot fail: type, shape and layout were checked above.
      (void)GetRow(w, r, row.data());
      for (int64_t t = 0; t < n_tokens; ++t) {
        y[t * ldy + r] = DotF32(row.data(), x + t * ldx, w.cols, level);
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace magicpig
