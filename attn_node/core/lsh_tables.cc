#include "attn_node/core/lsh_tables.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "attn_node/core/simhash.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"

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
  // Transpose the codes to [L][n] first (in blocks of keys, so both sides stay in cache): the
  // per-table passes then read contiguous codes instead of one cache line per key.
  std::vector<uint16_t> by_table(static_cast<size_t>(l * n));
  constexpr int64_t kBlock = 256;
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const int64_t i1 = std::min(n, i0 + kBlock);
    for (int table = 0; table < l; ++table) {
      uint16_t* dst = by_table.data() + table * n;
      for (int64_t i = i0; i < i1; ++i) dst[i] = codes[i * l + table];
    }
  }
  // Tables are independent: one counting sort each, in parallel.
  tbb::parallel_for(tbb::blocked_range<int>(0, l), [&](const tbb::blocked_range<int>& range) {
    std::vector<int32_t> cursor(static_cast<size_t>(buckets));
    for (int table = range.begin(); table < range.end(); ++table) {
      const uint16_t* c = by_table.data() + table * n;
      int32_t* off = t.offsets_.data() + table * (buckets + 1);
      // Histogram into off[b + 1], prefix sum, then a stable scatter.
      for (int64_t i = 0; i < n; ++i) ++off[c[i] + 1];
      for (int64_t b = 0; b < buckets; ++b) off[b + 1] += off[b];
      std::copy(off, off + buckets, cursor.begin());
      int32_t* idx = t.indices_.data() + table * n;
      for (int64_t i = 0; i < n; ++i) idx[cursor[c[i]]++] = static_cast<int32_t>(i);
    }
  });
  return t;
}

absl::Status LshTables::Append(const uint16_t* codes, int64_t m) {
  if (m < 0 || n_ + m > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LshTables::Append: m must be >= 0 with n + m <= 2^31 - 1, got n = ", n_, ", m = ", m));
  }
  const int64_t buckets = num_buckets();
  for (int64_t i = 0; i < m * l_; ++i) {
    if (codes[i] >= buckets) {
      return absl::InvalidArgumentError(absl::StrCat("LshTables::Append: codes[", i / l_, "][",
                                                     i % l_, "] = ", codes[i],
                                                     " is not < 2^K = ", buckets));
    }
  }
  if (m == 0) return absl::OkStatus();
  const int64_t n2 = n_ + m;
  std::vector<int32_t> offsets(static_cast<size_t>(l_ * (buckets + 1)), 0);
  std::vector<int32_t> indices(static_cast<size_t>(l_ * n2));
  tbb::parallel_for(tbb::blocked_range<int>(0, l_), [&](const tbb::blocked_range<int>& range) {
    std::vector<int32_t> cursor(static_cast<size_t>(buckets));
    for (int table = range.begin(); table < range.end(); ++table) {
      const int32_t* old_off = offsets_.data() + table * (buckets + 1);
      const int32_t* old_idx = indices_.data() + table * n_;
      int32_t* off = offsets.data() + table * (buckets + 1);
      int32_t* idx = indices.data() + table * n2;
      // New bucket sizes = old sizes + new keys per bucket.
      for (int64_t i = 0; i < m; ++i) ++off[codes[i * l_ + table] + 1];
      for (int64_t b = 0; b < buckets; ++b) off[b + 1] += off[b] + (old_off[b + 1] - old_off[b]);
      // Old entries first (indices < n), then the new keys in increasing order: buckets stay
      // sorted, exactly as a fresh Build over all n + m codes would lay them out.
      for (int64_t b = 0; b < buckets; ++b) {
        const int32_t size = old_off[b + 1] - old_off[b];
        std::copy(old_idx + old_off[b], old_idx + old_off[b + 1], idx + off[b]);
        cursor[static_cast<size_t>(b)] = off[b] + size;
      }
      for (int64_t i = 0; i < m; ++i) {
        idx[cursor[codes[i * l_ + table]]++] = static_cast<int32_t>(n_ + i);
      }
    }
  });
  offsets_ = std::move(offsets);
  indices_ = std::move(indices);
  n_ = n2;
  return absl::OkStatus();
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
