// Tests for the code transpose of the LSH table build: every kernel this CPU runs against an
// element-by-element reference, over table counts below, at and around the 16-table register block
// (the overlapped last group), key ranges that start and end off the 16-key block and the 512-key
// cache block, and the OR of the codes that the build's validation relies on.
#include "common/attention/kernels/code_transpose.h"

#include <random>
#include <string>
#include <vector>

#include "common/cpu_features.h"
#include "gtest/gtest.h"

namespace magicpig::attention::internal {
namespace {

using TransposeFn = uint32_t (*)(const CodeTransposeArgs&);

std::vector<std::pair<std::string, TransposeFn>> Kernels() {
  std::vector<std::pair<std::string, TransposeFn>> k = {{"scalar", TransposeCodesScalar}};
  if (DetectedSimdLevel() >= SimdLevel::kAvx2) k.emplace_back("avx2", TransposeCodesAvx2);
  return k;
}

TEST(CodeTransposeTest, MatchesReferenceOverShapesAndRanges) {
  std::mt19937 rng(5);
  struct Case {
    int64_t n, l, begin, end;
  };
  const std::vector<Case> cases = {
      {0, 16, 0, 0},       {1, 1, 0, 1},         {17, 15, 0, 17},     {33, 16, 0, 33},
      {40, 17, 3, 37},     {1000, 150, 0, 1000}, {1000, 150, 5, 999}, {1537, 31, 512, 1537},
      {2048, 32, 0, 2048}, {777, 120, 100, 613}, {300, 75, 0, 300},   {64, 512, 0, 64},
  };
  for (const auto& [name, fn] : Kernels()) {
    for (const Case& c : cases) {
      SCOPED_TRACE(name + " n=" + std::to_string(c.n) + " l=" + std::to_string(c.l) + " [" +
                   std::to_string(c.begin) + ", " + std::to_string(c.end) + ")");
      std::vector<uint16_t> codes(static_cast<size_t>(c.n * c.l));
      for (auto& v : codes) v = static_cast<uint16_t>(rng() & 0x3ff);
      uint32_t want_or = 0;
      for (int64_t i = c.begin; i < c.end; ++i) {
        for (int64_t t = 0; t < c.l; ++t) want_or |= codes[i * c.l + t];
      }
      // A code outside [begin, end) with a bit the range lacks must not reach the OR.
      if (c.begin > 0) codes[0] = 0x8000;
      const uint16_t kUntouched = 0xfffe;
      std::vector<uint16_t> out(static_cast<size_t>(c.n * c.l), kUntouched);
      CodeTransposeArgs args;
      args.codes = codes.data();
      args.n = c.n;
      args.l = c.l;
      args.begin = c.begin;
      args.end = c.end;
      args.by_table = out.data();
      EXPECT_EQ(fn(args), want_or);
      for (int64_t t = 0; t < c.l; ++t) {
        for (int64_t i = 0; i < c.n; ++i) {
          const uint16_t want = i >= c.begin && i < c.end ? codes[i * c.l + t] : kUntouched;
          ASSERT_EQ(out[t * c.n + i], want) << "table " << t << " key " << i;
        }
      }
    }
  }
}

TEST(CodeTransposeTest, OrSeesAnInvalidCodeAnywhere) {
  // The build rejects codes >= 2^K from this OR alone, so one high bit in any position counts.
  const int64_t n = 600, l = 150;
  for (const auto& [name, fn] : Kernels()) {
    for (int64_t pos : {int64_t{0}, l - 1, 16 * l + 7, 599 * l + 149, 511 * l + 134}) {
      std::vector<uint16_t> codes(static_cast<size_t>(n * l), 3);
      codes[pos] = 0x400;
      std::vector<uint16_t> out(codes.size());
      CodeTransposeArgs args{codes.data(), n, l, 0, n, out.data()};
      EXPECT_EQ(fn(args), 0x403u) << name << " position " << pos;
    }
  }
}

}  // namespace
}  // namespace magicpig::attention::internal
