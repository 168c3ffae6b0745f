// Tests for LshTables: the CSR structure against the codes, Retrieve against a brute-force count of
// equal codes (>= 2 tables) on random and adversarial inputs, counter hygiene across calls, memory
// accounting, validation, concurrent retrieval with per-thread scratch, and RetrieveGroup (the
// union for a GQA group) against the brute-force set of every head.
#include "common/attention/lsh_tables.h"

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace magicpig::attention {
namespace {

std::vector<int32_t> BruteForce(const std::vector<uint16_t>& codes, int64_t n, int l,
                                const std::vector<uint16_t>& query) {
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i) {
    int equal = 0;
    for (int t = 0; t < l; ++t) equal += codes[i * l + t] == query[t];
    if (equal >= 2) out.push_back(static_cast<int32_t>(i));
  }
  return out;
}

std::vector<int32_t> Sorted(std::vector<int32_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

bool AllZero(const LshScratch& s) {
  return std::all_of(s.counter.begin(), s.counter.end(), [](uint8_t c) { return c == 0; });
}

void ExpectRetrievalExact(const LshTables& t, const std::vector<uint16_t>& codes,
                          const std::vector<uint16_t>& query, LshScratch* scratch) {
  std::vector<int32_t> got;
  ASSERT_TRUE(t.Retrieve(query.data(), scratch, &got).ok());
  const std::vector<int32_t> sorted = Sorted(got);
  EXPECT_TRUE(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end()) << "duplicates";
  EXPECT_EQ(sorted, BruteForce(codes, t.size(), t.l(), query))
      << "n=" << t.size() << " K=" << t.k() << " L=" << t.l();
  EXPECT_TRUE(AllZero(*scratch)) << "counters left dirty";
}

void ExpectCsrMatchesCodes(const LshTables& t, const std::vector<uint16_t>& codes) {
  const int64_t n = t.size();
  for (int table = 0; table < t.l(); ++table) {
    const std::vector<int32_t> off = t.TableOffsets(table);
    ASSERT_EQ(off.size(), static_cast<size_t>(t.num_buckets() + 1));
    ASSERT_EQ(off[0], 0);
    ASSERT_EQ(off[t.num_buckets()], n);
    std::vector<int> seen(n, 0);
    for (int64_t b = 0; b < t.num_buckets(); ++b) {
      ASSERT_LE(off[b], off[b + 1]);
      for (int32_t p = off[b]; p < off[b + 1]; ++p) {
        const int32_t j = t.index(table, p);
        ASSERT_GE(j, 0);
        ASSERT_LT(j, n);
        ++seen[j];
        EXPECT_EQ(codes[j * t.l() + table], b);
        if (p > off[b]) {
          EXPECT_LT(t.index(table, p - 1), j);  // increasing within a bucket
        }
      }
    }
    for (int64_t j = 0; j < n; ++j) EXPECT_EQ(seen[j], 1) << "key " << j << " table " << table;
  }
}

std::vector<uint16_t> RandomCodes(int64_t count, int k, std::mt19937& rng) {
  std::uniform_int_distribution<int> dist(0, (1 << k) - 1);
  std::vector<uint16_t> c(count);
  for (auto& v : c) v = static_cast<uint16_t>(dist(rng));
  return c;
}

TEST(LshTablesTest, RandomInputsMatchBruteForce) {
  std::mt19937 rng(11);
  LshScratch scratch;  // one scratch reused across all sizes (larger and smaller n)
  struct Case {
    int64_t n;
    int k;
    int l;
  };
  for (const Case& c : {Case{1000, 2, 10}, Case{500, 4, 20}, Case{2000, 3, 8}, Case{300, 1, 5},
                        Case{100, 16, 30}, Case{4000, 6, 150}, Case{50, 2, 2}}) {
    const std::vector<uint16_t> codes = RandomCodes(c.n * c.l, c.k, rng);
    auto t = LshTables::Build(codes.data(), c.n, c.k, c.l);
    ASSERT_TRUE(t.ok()) << t.status();
    ExpectCsrMatchesCodes(*t, codes);
    for (int q = 0; q < 20; ++q) {
      std::vector<uint16_t> query = RandomCodes(c.l, c.k, rng);
      if (q % 2 == 1) {
        // Copy a few tables from a real key so that K = 16 queries hit something.
        const int64_t key = std::uniform_int_distribution<int64_t>(0, c.n - 1)(rng);
        for (int t2 = 0; t2 < c.l; t2 += 1 + q % 3) query[t2] = codes[key * c.l + t2];
      }
      ExpectRetrievalExact(*t, codes, query, &scratch);
    }
  }
}

TEST(LshTablesTest, AllKeysInOneBucket) {
  for (int k : {1, 5, 16}) {
    const int64_t n = 777;
    const int l = 6;
    std::vector<uint16_t> codes(n * l, static_cast<uint16_t>((1 << k) - 1));
    auto t = LshTables::Build(codes.data(), n, k, l);
    ASSERT_TRUE(t.ok());
    ExpectCsrMatchesCodes(*t, codes);
    LshScratch scratch;
    std::vector<uint16_t> query(l, static_cast<uint16_t>((1 << k) - 1));
    std::vector<int32_t> got;
    ASSERT_TRUE(t->Retrieve(query.data(), &scratch, &got).ok());
    EXPECT_EQ(static_cast<int64_t>(got.size()), n);
    ExpectRetrievalExact(*t, codes, query, &scratch);
    // Exactly one matching table: nothing.
    std::vector<uint16_t> one(l, 0);
    one[3] = static_cast<uint16_t>((1 << k) - 1);
    ExpectRetrievalExact(*t, codes, one, &scratch);
    ASSERT_TRUE(t->Retrieve(one.data(), &scratch, &got).ok());
    EXPECT_TRUE(got.empty());
    // Exactly two matching tables: everything.
    one[5] = static_cast<uint16_t>((1 << k) - 1);
    ASSERT_TRUE(t->Retrieve(one.data(), &scratch, &got).ok());
    EXPECT_EQ(static_cast<int64_t>(got.size()), n);
    EXPECT_TRUE(AllZero(scratch));
  }
}

TEST(LshTablesTest, TinyN) {
  std::mt19937 rng(3);
  for (int64_t n : {0, 1, 2}) {
    for (int k : {1, 16}) {
      for (int l : {1, 2, 3}) {
        for (int rep = 0; rep < 30; ++rep) {
          const std::vector<uint16_t> codes = RandomCodes(n * l, k, rng);
          auto t = LshTables::Build(n == 0 ? nullptr : codes.data(), n, k, l);
          ASSERT_TRUE(t.ok()) << t.status();
          ExpectCsrMatchesCodes(*t, codes);
          LshScratch scratch;
          std::vector<uint16_t> query = RandomCodes(l, k, rng);
          if (n > 0 && rep % 2 == 0) {
            std::copy(codes.begin(), codes.begin() + l, query.begin());  // key 0's codes
          }
          ExpectRetrievalExact(*t, codes, query, &scratch);
        }
      }
    }
  }
}

TEST(LshTablesTest, SingleTableNeverCollidesTwice) {
  const int64_t n = 100;
  std::vector<uint16_t> codes(n, 0);  // L = 1, every key in bucket 0
  auto t = LshTables::Build(codes.data(), n, 3, 1);
  ASSERT_TRUE(t.ok());
  LshScratch scratch;
  std::vector<int32_t> got = {42};
  const uint16_t q = 0;
  ASSERT_TRUE(t->Retrieve(&q, &scratch, &got).ok());
  EXPECT_TRUE(got.empty());
}

TEST(LshTablesTest, CountersCleanBetweenRetrievals) {
  std::mt19937 rng(8);
  const int64_t n = 3000;
  const int k = 3, l = 12;  // few buckets: many keys collide once and twice
  const std::vector<uint16_t> codes = RandomCodes(n * l, k, rng);
  auto t = LshTables::Build(codes.data(), n, k, l);
  ASSERT_TRUE(t.ok());
  LshScratch scratch;
  for (int i = 0; i < 50; ++i) {
    const std::vector<uint16_t> query = RandomCodes(l, k, rng);
    ExpectRetrievalExact(*t, codes, query, &scratch);
  }
  // An invalid query leaves the scratch clean too, and the next valid one is still exact.
  std::vector<uint16_t> bad(l, 1);
  bad[l - 1] = 1 << k;
  std::vector<int32_t> got;
  EXPECT_EQ(t->Retrieve(bad.data(), &scratch, &got).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(got.empty());
  EXPECT_TRUE(AllZero(scratch));
  ExpectRetrievalExact(*t, codes, RandomCodes(l, k, rng), &scratch);
}

TEST(LshTablesTest, BytesAccountsOffsetsAndIndices) {
  std::mt19937 rng(1);
  const std::vector<uint16_t> codes = RandomCodes(1000 * 20, 10, rng);
  auto t = LshTables::Build(codes.data(), 1000, 10, 20);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->index_bytes(), 2);   // n <= 65536: 16-bit indices
  EXPECT_EQ(t->offset_bytes(), 2);  // n < 65536: 16-bit offsets
  EXPECT_EQ(t->bytes(), 20 * (1024 + 1) * 2 + 20 * 1000 * 2);
  auto empty = LshTables::Build(nullptr, 0, 10, 20);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->bytes(), 20 * (1024 + 1) * 2);
}

// Offsets are 16-bit below 65536 keys and indices up to 65536, both 32-bit beyond, with the same
// tables either way: the CSR structure is exact on every side of the two boundaries (65535, 65536,
// 65537 keys), retrieval (per head and per group) matches brute force, and Append across both
// boundaries (narrow -> wide) equals a Build over all the codes.
TEST(LshTablesTest, IndexWidthBoundary) {
  std::mt19937 rng(12);
  const int k = 4, l = 3;
  const int64_t total = LshTables::kMaxNarrowKeys + 1;
  const std::vector<uint16_t> codes = RandomCodes(total * l, k, rng);
  LshScratch scratch;
  for (int64_t n : {LshTables::kMaxNarrowKeys - 1, LshTables::kMaxNarrowKeys, total}) {
    auto t = LshTables::Build(codes.data(), n, k, l);
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(t->index_bytes(), n <= LshTables::kMaxNarrowKeys ? 2 : 4) << n;
    EXPECT_EQ(t->offset_bytes(), n < LshTables::kMaxNarrowKeys ? 2 : 4) << n;
    EXPECT_EQ(t->bytes(), l * ((1 << k) + 1) * t->offset_bytes() + l * n * t->index_bytes()) << n;
    ExpectCsrMatchesCodes(*t, std::vector<uint16_t>(codes.begin(), codes.begin() + n * l));
    for (int q = 0; q < 3; ++q) {
      ExpectRetrievalExact(*t, std::vector<uint16_t>(codes.begin(), codes.begin() + n * l),
                           RandomCodes(l, k, rng), &scratch);
    }
  }
  auto grown = LshTables::Build(codes.data(), total - 100, k, l);
  ASSERT_TRUE(grown.ok());
  ASSERT_EQ(grown->index_bytes(), 2);
  ASSERT_EQ(grown->offset_bytes(), 2);
  ASSERT_TRUE(grown->Append(codes.data() + (total - 100) * l, 100).ok());
  EXPECT_EQ(grown->index_bytes(), 4);
  EXPECT_EQ(grown->offset_bytes(), 4);
  auto once = LshTables::Build(codes.data(), total, k, l);
  ASSERT_TRUE(once.ok());
  for (int t = 0; t < l; ++t) {
    ASSERT_EQ(once->TableOffsets(t), grown->TableOffsets(t));
    ASSERT_EQ(once->TableIndices(t), grown->TableIndices(t));
  }
}

TEST(LshTablesTest, ValidatesArguments) {
  std::vector<uint16_t> codes = {0, 1, 2, 3};
  EXPECT_EQ(LshTables::Build(codes.data(), 2, 0, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LshTables::Build(codes.data(), 2, 17, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LshTables::Build(codes.data(), 2, 2, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LshTables::Build(codes.data(), 2, 2, 513).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LshTables::Build(codes.data(), -1, 2, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(LshTables::Build(codes.data(), 2, 2, 2).ok());
  auto bad = LshTables::Build(codes.data(), 2, 1, 2);  // code 2 >= 2^1
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LshTablesTest, ConcurrentRetrievalWithPerThreadScratch) {
  std::mt19937 rng(99);
  const int64_t n = 5000;
  const int k = 4, l = 16;
  const std::vector<uint16_t> codes = RandomCodes(n * l, k, rng);
  auto t = LshTables::Build(codes.data(), n, k, l);
  ASSERT_TRUE(t.ok());
  std::vector<std::vector<uint16_t>> queries;
  for (int i = 0; i < 64; ++i) queries.push_back(RandomCodes(l, k, rng));
  std::vector<std::vector<int32_t>> results(queries.size());
  std::vector<std::thread> threads;
  for (int th = 0; th < 4; ++th) {
    threads.emplace_back([&, th] {
      LshScratch scratch;
      for (size_t i = th; i < queries.size(); i += 4) {
        if (!t->Retrieve(queries[i].data(), &scratch, &results[i]).ok()) results[i] = {-1};
      }
    });
  }
  for (auto& th : threads) th.join();
  for (size_t i = 0; i < queries.size(); ++i) {
    EXPECT_EQ(Sorted(results[i]), BruteForce(codes, n, l, queries[i])) << "query " << i;
  }
}

// RetrieveGroup: per head, the keys whose mask has that head's bit are exactly the brute-force set
// (>= 2 equal codes), the rows are strictly increasing, every mask is non-zero with no bit >= g,
// and the packed counters are all 0 afterwards.
void ExpectGroupExact(const LshTables& t, const std::vector<uint16_t>& codes,
                      const std::vector<uint16_t>& queries, int g, LshScratch* scratch,
                      const std::string& what) {
  std::vector<int32_t> rows;
  std::vector<uint32_t> masks;
  ASSERT_TRUE(t.RetrieveGroup(queries.data(), g, scratch, &rows, &masks).ok()) << what;
  ASSERT_EQ(rows.size(), masks.size()) << what;
  for (size_t i = 1; i < rows.size(); ++i) ASSERT_LT(rows[i - 1], rows[i]) << what;
  const uint32_t allowed = g >= 32 ? 0xffffffffu : (1u << g) - 1u;
  for (uint32_t m : masks) {
    ASSERT_NE(m, 0u) << what;
    ASSERT_EQ(m & ~allowed, 0u) << what;
  }
  for (int h = 0; h < g; ++h) {
    std::vector<int32_t> head;
    for (size_t i = 0; i < rows.size(); ++i) {
      if ((masks[i] >> h) & 1u) head.push_back(rows[i]);
    }
    const std::vector<uint16_t> q(queries.begin() + h * t.l(), queries.begin() + (h + 1) * t.l());
    ASSERT_EQ(head, BruteForce(codes, t.size(), t.l(), q)) << what << " head " << h;
  }
  for (uint32_t c : scratch->group_counter) ASSERT_EQ(c, 0u) << what << ": counters left dirty";
}

TEST(LshTablesGroupTest, RandomGroupsMatchBruteForcePerHead) {
  std::mt19937 rng(21);
  LshScratch scratch;  // shared across sizes, group sizes and the L > 255 fallback
  struct Case {
    int64_t n;
    int k;
    int l;
  };
  for (const Case& c : {Case{1000, 2, 10}, Case{17, 3, 8}, Case{3000, 6, 150}, Case{16, 1, 4},
                        Case{400, 4, 255}, Case{300, 3, 300}, Case{2, 2, 3}, Case{5000, 8, 40}}) {
    const std::vector<uint16_t> codes = RandomCodes(c.n * c.l, c.k, rng);
    auto t = LshTables::Build(codes.data(), c.n, c.k, c.l);
    ASSERT_TRUE(t.ok()) << t.status();
    for (int g : {1, 2, 3, 4, 5, 8, 9, 32}) {
      std::vector<uint16_t> queries = RandomCodes(static_cast<int64_t>(g) * c.l, c.k, rng);
      // Some heads copy most tables from a key, some share a key with another head, so the union
      // has keys sampled by one head and by several.
      for (int h = 0; h < g; h += 2) {
        const int64_t key = std::uniform_int_distribution<int64_t>(0, c.n - 1)(rng);
        for (int t2 = 0; t2 < c.l; t2 += 1 + h % 3) queries[h * c.l + t2] = codes[key * c.l + t2];
        if (h + 1 < g) {
          for (int t2 = 0; t2 < c.l; t2 += 2) queries[(h + 1) * c.l + t2] = codes[key * c.l + t2];
        }
      }
      ExpectGroupExact(*t, codes, queries, g, &scratch,
                       "n=" + std::to_string(c.n) + " K=" + std::to_string(c.k) +
                           " L=" + std::to_string(c.l) + " g=" + std::to_string(g));
    }
  }
}

// The per-table union of line spans against a set of every line: random spans, many overlapping,
// touching (adjacent) and nested, in random order.
TEST(LshTablesGroupTest, UnionOfLineSpansCountsDistinctLinesAndRuns) {
  std::mt19937 rng(9);
  for (int trial = 0; trial < 2000; ++trial) {
    const int count = 1 + static_cast<int>(rng() % 8);
    std::vector<internal::LineSpan> spans;
    std::set<uintptr_t> lines;
    for (int i = 0; i < count; ++i) {
      const uintptr_t first = 1000 + rng() % 40;
      const uintptr_t last = first + rng() % (rng() % 3 == 0 ? 12 : 2);
      spans.push_back({first, last});
      for (uintptr_t x = first; x <= last; ++x) lines.insert(x);
    }
    int64_t runs = 0;
    uintptr_t prev = 0;
    for (uintptr_t x : lines) {
      if (runs == 0 || x != prev + 1) ++runs;
      prev = x;
    }
    const LshTables::LookupReads got = internal::UnionOfLineSpans(&spans);
    ASSERT_EQ(got.lines, static_cast<int64_t>(lines.size())) << trial;
    ASSERT_EQ(got.runs, runs) << trial;
  }
  std::vector<internal::LineSpan> none;
  EXPECT_EQ(internal::UnionOfLineSpans(&none).lines, 0);
  EXPECT_EQ(internal::UnionOfLineSpans(&none).runs, 0);
}

// CountLookupReads against bounds from the offsets: per table, a head's lookup reads one or two
// lines of offsets and the ceil(bytes / 64) or one more lines its entries span, in at least one run
// each (the offsets and the entries are different arrays); heads in the same bucket count once,
// heads in different buckets at most the sum.
TEST(LshTablesGroupTest, LookupReadsWithinTheBucketsBounds) {
  std::mt19937 rng(5);
  for (int64_t n : {int64_t{3000}, int64_t{70000}}) {  // 16-bit and 32-bit indices and offsets
    const int k = 6, l = 20;
    const std::vector<uint16_t> codes = RandomCodes(n * l, k, rng);
    auto t = LshTables::Build(codes.data(), n, k, l);
    ASSERT_TRUE(t.ok()) << t.status();
    const std::vector<uint16_t> a = RandomCodes(l, k, rng);
    std::vector<uint16_t> b = RandomCodes(l, k, rng);
    for (int table = 0; table < l; ++table) {
      if (b[table] == a[table]) b[table] = static_cast<uint16_t>((a[table] + 1) % (1 << k));
    }
    int64_t lower = 0, upper = 0, min_runs = 0;
    for (int table = 0; table < l; ++table) {
      const std::vector<int32_t> off = t->TableOffsets(table);
      const int64_t bytes = int64_t{off[a[table] + 1] - off[a[table]]} * t->index_bytes();
      lower += 1 + (bytes + 63) / 64;
      upper += 2 + (bytes > 0 ? (bytes + 63) / 64 + 1 : 0);
      min_runs += bytes > 0 ? 2 : 1;
    }
    const LshTables::LookupReads one = t->CountLookupReads(a.data(), 1);
    EXPECT_GE(one.lines, lower) << n;
    EXPECT_LE(one.lines, upper) << n;
    EXPECT_GE(one.runs, min_runs) << n;
    EXPECT_LE(one.runs, one.lines) << n;
    // A bucket of ~n / 64 entries (47 or 1,094) spans 2-35 lines but one run.
    EXPECT_LT(one.runs, one.lines) << n;
    std::vector<uint16_t> twice = a;
    twice.insert(twice.end(), a.begin(), a.end());
    EXPECT_EQ(t->CountLookupReads(twice.data(), 2).lines, one.lines) << n;
    EXPECT_EQ(t->CountLookupReads(twice.data(), 2).runs, one.runs) << n;
    std::vector<uint16_t> both = a;
    both.insert(both.end(), b.begin(), b.end());
    const int64_t two = t->CountLookupReads(both.data(), 2).lines;
    const int64_t b_alone = t->CountLookupReads(b.data(), 1).lines;
    EXPECT_GT(two, std::max(one.lines, b_alone)) << n;
    EXPECT_LE(two, one.lines + b_alone) << n;
  }
  // All 777 keys in one bucket: per table 1,554 bytes of entries (25 or 26 lines, one run) and 1
  // or 2 lines of offsets (one run).
  const int64_t n = 777;
  std::vector<uint16_t> same(n * 3, 5);
  auto t = LshTables::Build(same.data(), n, 4, 3);
  ASSERT_TRUE(t.ok());
  const std::vector<uint16_t> q(3, 5);
  const LshTables::LookupReads reads = t->CountLookupReads(q.data(), 1);
  EXPECT_GE(reads.lines, 3 * 26);
  EXPECT_LE(reads.lines, 3 * 28);
  EXPECT_EQ(reads.runs, 3 * 2);
  // L = 1 never retrieves, so it reads nothing.
  auto single = LshTables::Build(same.data(), n, 4, 1);
  ASSERT_TRUE(single.ok());
  EXPECT_EQ(single->CountLookupReads(q.data(), 1).lines, 0);
  EXPECT_EQ(single->CountLookupReads(q.data(), 1).runs, 0);
}

// The group path on each side of the offset and index width boundaries (65535 / 65536 / 65537
// keys), with heads that copy a key's codes so that every group retrieves something.
TEST(LshTablesGroupTest, WidthBoundaries) {
  std::mt19937 rng(21);
  LshScratch scratch;
  const int k = 6, l = 20, g = 6;
  const int64_t total = LshTables::kMaxNarrowKeys + 1;
  const std::vector<uint16_t> codes = RandomCodes(total * l, k, rng);
  for (int64_t n : {LshTables::kMaxNarrowKeys - 1, LshTables::kMaxNarrowKeys, total}) {
    const std::vector<uint16_t> prefix(codes.begin(), codes.begin() + n * l);
    auto t = LshTables::Build(prefix.data(), n, k, l);
    ASSERT_TRUE(t.ok());
    std::vector<uint16_t> queries = RandomCodes(int64_t{g} * l, k, rng);
    for (int h = 0; h < g; h += 2) {
      const int64_t key = n - 1 - h;  // keys near the end: the largest offsets and indices
      for (int t2 = 0; t2 < l; ++t2) queries[h * l + t2] = codes[key * l + t2];
    }
    ExpectGroupExact(*t, prefix, queries, g, &scratch, "n=" + std::to_string(n));
  }
}

TEST(LshTablesGroupTest, AdversarialGroups) {
  LshScratch scratch;
  // Every key in one bucket of every table, every head in that bucket: every key, every bit; with
  // L = 255 each head's byte reaches 255 without overflowing into the next head's.
  for (int l : {2, 255, 256}) {
    const int64_t n = 333;
    const int k = 5, g = 6;
    std::vector<uint16_t> codes(n * l, 7);
    auto t = LshTables::Build(codes.data(), n, k, l);
    ASSERT_TRUE(t.ok());
    std::vector<uint16_t> queries(static_cast<size_t>(g * l), 7);
    queries[static_cast<size_t>(2 * l)] = 8;  // head 2 misses one table: still >= 2 when l > 2
    ExpectGroupExact(*t, codes, queries, g, &scratch, "one bucket, L=" + std::to_string(l));
  }
  // n = 0, 1, 2 and L = 1 (nothing can collide twice).
  std::mt19937 rng(5);
  for (int64_t n : {0, 1, 2}) {
    for (int l : {1, 2, 3}) {
      const std::vector<uint16_t> codes = RandomCodes(n * l, 1, rng);
      auto t = LshTables::Build(n == 0 ? nullptr : codes.data(), n, 1, l);
      ASSERT_TRUE(t.ok());
      for (int g : {1, 4, 7}) {
        ExpectGroupExact(*t, codes, RandomCodes(static_cast<int64_t>(g) * l, 1, rng), g, &scratch,
                         "tiny n=" + std::to_string(n) + " L=" + std::to_string(l));
      }
    }
  }
}

TEST(LshTablesGroupTest, ValidatesArgumentsWithoutTouchingTheScratch) {
  std::mt19937 rng(8);
  const std::vector<uint16_t> codes = RandomCodes(50 * 4, 3, rng);
  auto t = LshTables::Build(codes.data(), 50, 3, 4);
  ASSERT_TRUE(t.ok());
  LshScratch scratch;
  std::vector<int32_t> rows = {1, 2};
  std::vector<uint32_t> masks = {1, 1};
  std::vector<uint16_t> queries(33 * 4, 1);
  EXPECT_EQ(t->RetrieveGroup(queries.data(), 0, &scratch, &rows, &masks).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t->RetrieveGroup(queries.data(), 33, &scratch, &rows, &masks).code(),
            absl::StatusCode::kInvalidArgument);
  queries[4 * 2 + 3] = 8;  // head 2, table 3: not < 2^3
  const absl::Status bad = t->RetrieveGroup(queries.data(), 3, &scratch, &rows, &masks);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("head 2, table 3"), std::string::npos) << bad.message();
  EXPECT_TRUE(rows.empty());
  EXPECT_TRUE(masks.empty());
  EXPECT_TRUE(scratch.group_counter.empty());
}

}  // namespace
}  // namespace magicpig::attention
