#include "attn_node/core/lsh_tables.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "attn_node/core/simhash.h"

namespace magicpig {

absl::StatusOr<LshTables> LshTables::Build(const uint16_t* codes, int64_t n, int k, int l) {
  if (k < 1 || k > kSimHashMaxK) {
    return absl::InvalidArgumentError(
        absl::StrCat("LshTables: K must be in [1, ", kSimHashMaxK, "], got ", k));
  }
  if (l < 1 || l > kSimHashMaxL) {
    return absl::InvalidArgumentError(
        absl::StrCat("LshTables: L must be in [1, ", kSimHashMaxL, "], got ", l));
  }
  if (n < 0 || n > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("LshTables: n must be in [0, 2^31 - 1], got ", n));
  }
  const int64_t buckets = int64_t{1} << k;
  for (int64_t i = 0; i < n * l; ++i) {
    if (codes[i] >= buckets) {
      return absl::InvalidArgumentError(absl::StrCat(
          "LshTables: codes[", i / l, "][", i % l, "] = ", codes[i], " is not < 2^K = ", buckets));
    }
  }
  LshTables t(n, k, l);
  t.offsets_.assign(static_cast<size_t>(l * (buckets + 1)), 0);
  t.indices_.resize(static_cast<size_t>(l * n));
  std::vector<int32_t> cursor(static_cast<size_t>(buckets));
  for (int table = 0; table < l; ++table) {
    int32_t* off = t.offsets_.data() + table * (buckets + 1);
    // Histogram into off[b + 1], prefix sum, then a stable scatter.
    for (int64_t i = 0; i < n; ++i) ++off[codes[i * l + table] + 1];
    for (int64_t b = 0; b < buckets; ++b) off[b + 1] += off[b];
    std::copy(off, off + buckets, cursor.begin());
    int32_t* idx = t.indices_.data() + table * n;
    for (int64_t i = 0; i < n; ++i) idx[cursor[codes[i * l + table]]++] = static_cast<int32_t>(i);
  }
  return t;
}

absl::Status LshTables::Retrieve(const uint16_t* query_codes, LshScratch* scratch,
                                 std::vector<int32_t>* out) const {
  out->clear();
  const int64_t buckets = num_buckets();
  for (int table = 0; table < l_; ++table) {
    if (query_codes[table] >= buckets) {
      return absl::InvalidArgumentError(absl::StrCat("LshTables::Retrieve: query code ",
                                                     query_codes[table], " of table ", table,
                                                     " is not < 2^K = ", buckets));
    }
  }
  if (l_ < 2 || n_ == 0) return absl::OkStatus();
  if (static_cast<int64_t>(scratch->counter.size()) < n_) {
    scratch->counter.resize(static_cast<size_t>(n_), 0);
  }
  uint8_t* counter = scratch->counter.data();
  std::vector<int32_t>& touched = scratch->touched;
  touched.clear();
  for (int table = 0; table < l_; ++table) {
    const int32_t* off = offsets(table);
    const int32_t* idx = indices(table);
    const int32_t begin = off[query_codes[table]];
    const int32_t end = off[query_codes[table] + 1];
    for (int32_t p = begin; p < end; ++p) {
      const int32_t j = idx[p];
      const uint8_t c = counter[j];
      if (c == 0) {
        counter[j] = 1;
        touched.push_back(j);
      } else if (c == 1) {
        counter[j] = 2;
        out->push_back(j);
      }
    }
  }
  for (int32_t j : touched) counter[j] = 0;
  touched.clear();
  return absl::OkStatus();
}

}  // namespace magicpig
