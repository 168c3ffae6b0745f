// Test-only reference quantisers: float32 rows -> ggml blocks, written independently of the
// production dequantiser so round-trip tests check the two against each other.
//
// They are simple, not optimal (no search for the best scales): each uses the range of its
// (sub-)block and rounds to nearest. The bounds below are what the unit tests assert.
#ifndef MAGICPIG_TESTS_TESTING_QUANTIZE_REFERENCE_H_
#define MAGICPIG_TESTS_TESTING_QUANTIZE_REFERENCE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/quant/ggml_type.h"

namespace magicpig::testing {

// Quantises n values (a multiple of the block size) of `type` (F32, F16, BF16, Q4_0, Q4_1, Q5_0,
// Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) into GgmlRowBytes(type, n) bytes.
absl::StatusOr<std::vector<uint8_t>> QuantizeReference(GgmlType type, const float* x, int64_t n);

// Largest |dequantised - x| the reference quantiser guarantees for element i of x, derived from
// the rounding step of the (sub-)block that holds it (see the derivations in the .cc file).
std::vector<double> QuantizationErrorBound(GgmlType type, const float* x, int64_t n);

}  // namespace magicpig::testing

#endif  // MAGICPIG_TESTS_TESTING_QUANTIZE_REFERENCE_H_
