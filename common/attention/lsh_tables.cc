#include "common/attention/lsh_tables.h"

#include <algorithm>
#include <limits>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/attention/estimator_params.h"
#include "common/attention/kernels/code_transpose.h"
#include "common/attention/kernels/collision_scan.h"
#include "common/attention/simhash.h"
#include "common/cpu_features.h"
#include "common/status_macros.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"
#include "tbb/parallel_reduce.h"

namespace magicpig::attention {
namespace {

// SortTable splits the keys into this many contiguous streams. Measured at 64K keys, K = 10 (AMD
// EPYC, docs/benchmarks.md): 2 beats 1 by ~5-10%, and 4 loses again, because every stream keeps
// its own write front in each bucket and the scatter's stores then miss L1 more often.
constexpr int kSortStreams = 2;

// Stable counting sort of one table: codes c[0 .. n) (each < buckets) -> off[0 .. buckets]
// (bucket b holds entries off[b] .. off[b + 1]) and idx[0 .. n) (key indices, increasing within a
// bucket). cursors: kSortStreams * buckets ints of scratch.
//
// The keys are cut into kSortStreams contiguous streams, counted and scattered in one interleaved
// loop: independent chains of counter updates instead of one, so a run of keys in the same bucket
// (the keys of a cone share codes) does not wait on a store-to-load round trip per key. Stream
// s's keys follow stream s-1's inside every bucket, which keeps the sort stable.
template <class Index>
void SortTable(const uint16_t* c, int64_t n, int64_t buckets, int32_t* off, Index* idx,
               int32_t* cursors) {
  int32_t* h[kSortStreams];
  int64_t first[kSortStreams + 1];
  for (int s = 0; s < kSortStreams; ++s) h[s] = cursors + s * buckets;
  for (int s = 0; s <= kSortStreams; ++s) first[s] = s * n / kSortStreams;
  const int64_t common = n / kSortStreams;  // every stream has at least this many keys
  std::fill(cursors, cursors + kSortStreams * buckets, 0);
  for (int64_t i = 0; i < common; ++i) {
    for (int s = 0; s < kSortStreams; ++s) ++h[s][c[first[s] + i]];
  }
  for (int s = 0; s < kSortStreams; ++s) {
    for (int64_t i = first[s] + common; i < first[s + 1]; ++i) ++h[s][c[i]];
  }
  // Bucket starts, and each stream's first slot inside each bucket.
  int32_t sum = 0;
  for (int64_t b = 0; b < buckets; ++b) {
    off[b] = sum;
    for (int s = 0; s < kSortStreams; ++s) {
      const int32_t count = h[s][b];
      h[s][b] = sum;
      sum += count;
    }
  }
  off[buckets] = sum;
  for (int64_t i = 0; i < common; ++i) {
    for (int s = 0; s < kSortStreams; ++s) {
      const int64_t key = first[s] + i;
      idx[h[s][c[key]]++] = static_cast<Index>(key);
    }
  }
  for (int s = 0; s < kSortStreams; ++s) {
    for (int64_t key = first[s] + common; key < first[s + 1]; ++key) {
      idx[h[s][c[key]]++] = static_cast<Index>(key);
    }
  }
}

}  // namespace

absl::StatusOr<LshTables> LshTables::Build(const uint16_t* codes, int64_t n, int k, int l) {
  if (absl::Status s = kLshK.Check(k, "LshTables: K"); !s.ok()) return s;
  // Any table count up to the parameter's maximum: one table is a valid structure (the accuracy
  // evaluator hashes with L = 1 where no estimator samples). The sampling rule's lower bound of 2
  // is the estimator parameter's (kLshL), checked where an estimator is configured.
  if (l < 1 || l > kLshL.max) {
    return absl::InvalidArgumentError(
        absl::StrCat("LshTables: L must be in [1, ", kLshL.max, "], got ", l));
  }
  if (n < 0 || n > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("LshTables: n must be in [0, 2^31 - 1], got ", n));
  }
  const int64_t buckets = int64_t{1} << k;
  // Transpose the codes to [L][n] first: the per-table passes then read contiguous codes instead
  // of one cache line per key. The transpose also ORs every code, so validity costs no separate
  // pass.
  std::vector<uint16_t, LargeBufferAllocator<uint16_t>> by_table(static_cast<size_t>(l * n));
  const auto transpose = ActiveSimdLevel() >= SimdLevel::kAvx2 ? internal::TransposeCodesAvx2
                                                               : internal::TransposeCodesScalar;
  constexpr int64_t kTransposeGrain = 4096;  // keys per task
  const uint32_t seen = tbb::parallel_reduce(
      tbb::blocked_range<int64_t>(0, (n + kTransposeGrain - 1) / kTransposeGrain), 0u,
      [&](const tbb::blocked_range<int64_t>& range, uint32_t acc) {
        internal::CodeTransposeArgs args;
        args.codes = codes;
        args.n = n;
        args.l = l;
        args.begin = range.begin() * kTransposeGrain;
        args.end = std::min(n, range.end() * kTransposeGrain);
        args.by_table = by_table.data();
        return acc | transpose(args);
      },
      [](uint32_t a, uint32_t b) { return a | b; });
  if ((seen >> k) != 0) {
    for (int64_t i = 0; i < n * l; ++i) {
      if (codes[i] >= buckets) {
        return absl::InvalidArgumentError(absl::StrCat("LshTables: codes[", i / l, "][", i % l,
                                                       "] = ", codes[i],
                                                       " is not < 2^K = ", buckets));
      }
    }
  }
  LshTables t(n, k, l);
  std::vector<int32_t> offsets(static_cast<size_t>(l * (buckets + 1)));
  if (t.narrow()) {
    t.indices16_.resize(static_cast<size_t>(l * n));
  } else {
    t.indices32_.resize(static_cast<size_t>(l * n));
  }
  // Tables are independent: one counting sort each, in parallel.
  auto sort_tables = [&](auto* indices) {
    tbb::parallel_for(tbb::blocked_range<int>(0, l), [&](const tbb::blocked_range<int>& range) {
      std::vector<int32_t> cursors(static_cast<size_t>(kSortStreams * buckets));
      for (int table = range.begin(); table < range.end(); ++table) {
        SortTable(by_table.data() + table * n, n, buckets, offsets.data() + table * (buckets + 1),
                  indices + table * n, cursors.data());
      }
    });
  };
  if (t.narrow()) {
    sort_tables(t.indices16_.data());
  } else {
    sort_tables(t.indices32_.data());
  }
  t.SetOffsets(std::move(offsets));
  return t;
}

void LshTables::SetOffsets(std::vector<int32_t> offsets) {
  if (narrow_offsets()) {
    offsets16_.assign(offsets.begin(), offsets.end());
    offsets32_ = {};
  } else {
    offsets32_ = std::move(offsets);
    offsets16_ = {};
  }
}

std::vector<int32_t> LshTables::TableOffsets(int table) const {
  const int64_t stride = num_buckets() + 1;
  return WithOffsets([&](const auto* offsets) {
    return std::vector<int32_t>(offsets + table * stride, offsets + (table + 1) * stride);
  });
}

std::vector<int32_t> LshTables::TableIndices(int table) const {
  return WithIndices([&](const auto* indices) {
    return std::vector<int32_t>(indices + table * n_, indices + (table + 1) * n_);
  });
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
  std::vector<uint16_t, LargeBufferAllocator<uint16_t>> indices16;
  std::vector<int32_t, LargeBufferAllocator<int32_t>> indices32;
  const bool narrow2 = n2 <= kMaxNarrowKeys;
  if (narrow2) {
    indices16.resize(static_cast<size_t>(l_ * n2));
  } else {
    indices32.resize(static_cast<size_t>(l_ * n2));
  }
  auto merge_tables = [&](const auto* old_indices, auto* new_indices) {
    tbb::parallel_for(tbb::blocked_range<int>(0, l_), [&](const tbb::blocked_range<int>& range) {
      std::vector<int32_t> cursor(static_cast<size_t>(buckets));
      for (int table = range.begin(); table < range.end(); ++table) {
        const std::vector<int32_t> old_offsets = TableOffsets(table);
        const int32_t* old_off = old_offsets.data();
        const auto* old_idx = old_indices + table * n_;
        int32_t* off = offsets.data() + table * (buckets + 1);
        auto* idx = new_indices + table * n2;
        using Index = std::remove_reference_t<decltype(*idx)>;
        // New bucket sizes = old sizes + new keys per bucket.
        for (int64_t i = 0; i < m; ++i) ++off[codes[i * l_ + table] + 1];
        for (int64_t b = 0; b < buckets; ++b) {
          off[b + 1] += off[b] + (old_off[b + 1] - old_off[b]);
        }
        // Old entries first (indices < n), then the new keys in increasing order: buckets stay
        // sorted, exactly as a fresh Build over all n + m codes would lay them out.
        for (int64_t b = 0; b < buckets; ++b) {
          const int32_t size = old_off[b + 1] - old_off[b];
          std::copy(old_idx + old_off[b], old_idx + old_off[b + 1], idx + off[b]);
          cursor[static_cast<size_t>(b)] = off[b] + size;
        }
        for (int64_t i = 0; i < m; ++i) {
          idx[cursor[codes[i * l_ + table]]++] = static_cast<Index>(n_ + i);
        }
      }
    });
  };
  WithIndices([&](const auto* old_indices) {
    if (narrow2) {
      merge_tables(old_indices, indices16.data());
    } else {
      merge_tables(old_indices, indices32.data());
    }
  });
  indices16_ = std::move(indices16);
  indices32_ = std::move(indices32);
  n_ = n2;
  SetOffsets(std::move(offsets));
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
  const int64_t stride = num_buckets() + 1;
  WithOffsets([&](const auto* offsets) {
    WithIndices([&](const auto* indices) {
      for (int table = 0; table < l_; ++table) {
        const auto* off = offsets + table * stride;
        const auto* idx = indices + table * n_;
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
    });
  });
  for (int32_t j : touched) counter[j] = 0;
  touched.clear();
  return absl::OkStatus();
}

namespace {

// out = a u b for two key lists sorted by key, masks ORed where a key is in both.
void MergeSorted(const std::vector<int32_t>& a_rows, const std::vector<uint32_t>& a_masks,
                 const int32_t* b_rows, const uint32_t* b_masks, int64_t nb,
                 std::vector<int32_t>* rows, std::vector<uint32_t>* masks) {
  rows->clear();
  masks->clear();
  size_t i = 0;
  int64_t j = 0;
  while (i < a_rows.size() || j < nb) {
    if (j == nb || (i < a_rows.size() && a_rows[i] < b_rows[j])) {
      rows->push_back(a_rows[i]);
      masks->push_back(a_masks[i++]);
    } else if (i == a_rows.size() || b_rows[j] < a_rows[i]) {
      rows->push_back(b_rows[j]);
      masks->push_back(b_masks[j++]);
    } else {
      rows->push_back(a_rows[i]);
      masks->push_back(a_masks[i++] | b_masks[j++]);
    }
  }
}

}  // namespace

absl::Status LshTables::RetrieveGroup(const uint16_t* query_codes, int g, LshScratch* scratch,
                                      std::vector<int32_t>* rows, std::vector<uint32_t>* masks,
                                      SimdLevel level) const {
  rows->clear();
  masks->clear();
  if (g < 1 || g > 32) {
    return absl::InvalidArgumentError(
        absl::StrCat("LshTables::RetrieveGroup: g must be in [1, 32], got ", g));
  }
  const int64_t buckets = num_buckets();
  for (int64_t i = 0; i < static_cast<int64_t>(g) * l_; ++i) {
    if (query_codes[i] >= buckets) {
      return absl::InvalidArgumentError(
          absl::StrCat("LshTables::RetrieveGroup: query code ", query_codes[i], " of head ", i / l_,
                       ", table ", i % l_, " is not < 2^K = ", buckets));
    }
  }
  if (l_ < 2 || n_ == 0) return absl::OkStatus();
  if (static_cast<int64_t>(scratch->group_counter.size()) < n_) {
    scratch->group_counter.resize(static_cast<size_t>(n_), 0);
  }
  if (l_ > 255) {
    // Per-head retrieval into a per-key mask (group_counter as a bit set), then the sorted union.
    uint32_t* bits = scratch->group_counter.data();
    std::vector<int32_t> one;
    for (int h = 0; h < g; ++h) {
      MAGICPIG_RETURN_IF_ERROR(Retrieve(query_codes + h * l_, scratch, &one));
      for (int32_t j : one) {
        if (bits[j] == 0) rows->push_back(j);
        bits[j] |= 1u << h;
      }
    }
    std::sort(rows->begin(), rows->end());
    masks->resize(rows->size());
    for (size_t i = 0; i < rows->size(); ++i) {
      (*masks)[i] = bits[(*rows)[i]];
      bits[(*rows)[i]] = 0;
    }
    return absl::OkStatus();
  }
  if (static_cast<int64_t>(scratch->scan_rows.size()) < n_) {
    scratch->scan_rows.resize(static_cast<size_t>(n_));
    scratch->scan_masks.resize(static_cast<size_t>(n_));
  }
  scratch->bucket_begin.resize(static_cast<size_t>(4 * l_));
  scratch->bucket_end.resize(static_cast<size_t>(4 * l_));
  uint32_t* counter = scratch->group_counter.data();
  const int64_t stride = num_buckets() + 1;
  int32_t* begin = scratch->bucket_begin.data();
  int32_t* end = scratch->bucket_end.data();
  for (int h0 = 0; h0 < g; h0 += 4) {
    const int heads = std::min(4, g - h0);
    WithIndices([&](const auto* indices) {
      WithOffsets([&](const auto* offsets) {
        constexpr int kPerLine = 64 / sizeof(*indices);
        // The offsets and bucket entries of a long shard are cache misses, the entries' address
        // known only once the offsets arrive. The heads x L lookups of the pass run as a software
        // pipeline: lookup i's offsets are prefetched 2D lookups ahead, its offsets read and its
        // entries prefetched D ahead, its entries counted at i. That keeps a steady ~2D misses in
        // flight (a burst of L prefetches followed by a drain waits on the burst's slowest miss).
        constexpr int kAhead = 32;  // D
        const int lookups = heads * l_;
        const uint16_t* qc = query_codes + h0 * l_;  // lookup i = (head i / L, table i % L)
        // Table cursors of the three stages (no division per lookup).
        int t_prefetch = 0, t_read = 0, t_count = 0;
        auto next = [&](int& t) { t = t + 1 == l_ ? 0 : t + 1; };
        auto prefetch_offsets = [&](int i) {
          __builtin_prefetch(offsets + t_prefetch * stride + qc[i]);
          next(t_prefetch);
        };
        auto read_offsets = [&](int i) {
          const auto* off = offsets + t_read * stride + qc[i];
          begin[i] = off[0];
          end[i] = off[1];
          const auto* idx = indices + t_read * n_;
          for (int32_t p = begin[i]; p < end[i]; p += kPerLine) __builtin_prefetch(idx + p);
          next(t_read);
        };
        for (int i = 0; i < std::min(2 * kAhead, lookups); ++i) prefetch_offsets(i);
        for (int i = 0; i < std::min(kAhead, lookups); ++i) read_offsets(i);
        uint32_t inc = 1;
        for (int i = 0; i < lookups; ++i) {
          if (i + 2 * kAhead < lookups) prefetch_offsets(i + 2 * kAhead);
          if (i + kAhead < lookups) read_offsets(i + kAhead);
          const auto* idx = indices + t_count * n_;
          // Bounds in locals: end[] is int32 and counter uint32, which may alias, so a loop over
          // end[i] would reload it after every increment.
          const int32_t p_end = end[i];
          for (int32_t p = begin[i]; p < p_end; ++p) counter[idx[p]] += inc;
          next(t_count);
          if (t_count == 0) inc <<= 8;  // the next head's byte
        }
      });
    });
    const int64_t found = internal::ScanCollisionCounters(
        level, counter, n_, h0, scratch->scan_rows.data(), scratch->scan_masks.data());
    if (h0 == 0) {
      rows->assign(scratch->scan_rows.begin(), scratch->scan_rows.begin() + found);
      masks->assign(scratch->scan_masks.begin(), scratch->scan_masks.begin() + found);
    } else {
      scratch->merged_rows.swap(*rows);
      scratch->merged_masks.swap(*masks);
      MergeSorted(scratch->merged_rows, scratch->merged_masks, scratch->scan_rows.data(),
                  scratch->scan_masks.data(), found, rows, masks);
    }
  }
  return absl::OkStatus();
}

LshTables::LookupReads LshTables::CountLookupReads(const uint16_t* query_codes, int g) const {
  LookupReads reads;
  if (l_ < 2 || n_ == 0 || g < 1) return reads;
  const int64_t buckets = num_buckets();
  const int64_t stride = buckets + 1;
  // Per table, each head reads two spans of lines (its bucket's offsets and its entries); the
  // distinct lines and their runs are those of the union of at most 2 g spans. (A sorted list of
  // every line, as before, made an 8K SmolLM2 decode step with `--breakdown` ~25% slower on one
  // thread, 38.2 against 47.9 tok/s; with the spans the two are within the run-to-run noise.)
  std::vector<internal::LineSpan> spans;
  spans.reserve(static_cast<size_t>(2 * g));
  auto add = [&spans](const void* p, size_t bytes) {
    spans.push_back(
        {reinterpret_cast<uintptr_t>(p) / 64, (reinterpret_cast<uintptr_t>(p) + bytes - 1) / 64});
  };
  WithIndices([&](const auto* indices) {
    WithOffsets([&](const auto* offsets) {
      for (int t = 0; t < l_; ++t) {
        spans.clear();
        for (int h = 0; h < g; ++h) {
          const uint16_t code = query_codes[h * l_ + t];
          if (code >= buckets) continue;
          const auto* off = offsets + t * stride + code;
          add(off, 2 * sizeof(*off));
          if (off[1] > off[0]) {
            add(indices + t * n_ + off[0], static_cast<size_t>(off[1] - off[0]) * sizeof(*indices));
          }
        }
        const LookupReads table_reads = internal::UnionOfLineSpans(&spans);
        reads.lines += table_reads.lines;
        reads.runs += table_reads.runs;
      }
    });
  });
  return reads;
}

namespace internal {

LshTables::LookupReads UnionOfLineSpans(std::vector<LineSpan>* spans) {
  std::sort(spans->begin(), spans->end(),
            [](const LineSpan& a, const LineSpan& b) { return a.first < b.first; });
  LshTables::LookupReads reads;
  bool open = false;
  uintptr_t run_last = 0;
  for (const LineSpan& s : *spans) {
    if (open && s.first <= run_last + 1) {  // overlaps or touches the current run: extends it
      if (s.last > run_last) {
        reads.lines += static_cast<int64_t>(s.last - run_last);
        run_last = s.last;
      }
      continue;
    }
    ++reads.runs;
    reads.lines += static_cast<int64_t>(s.last - s.first + 1);
    run_last = s.last;
    open = true;
  }
  return reads;
}

}  // namespace internal
}  // namespace magicpig::attention
