// LSH hash tables of one (sequence shard, sparse layer, kv head) and collision-count retrieval
// (docs/architecture.md §6.1 and §6.3).
//
// Layout (CSR per table): offsets [L][2^K + 1] and indices [L][n]. Indices are uint16 while
// n <= 65536 (docs/architecture.md §6.1: half the bytes of the largest array; a table set is
// otherwise 2.4x the bf16 keys it indexes at d = 128) and int32 beyond; offsets are uint16 while
// n <= 65535 (they reach n), int32 beyond: at a 4,096-key block and K = 10 the offsets are a third
// of the table set, and a decode step's retrieval reads one line of them per table and head. Bucket
// b of table l holds index(l, offsets[l][b] ... offsets[l][b + 1]); every key index 0 ... n-1
// appears exactly once per table, in increasing order within a bucket (the build is a stable
// counting sort: histogram, prefix sum, scatter; O(n + 2^K) per table, no comparison sort).
//
// Retrieval: key j is returned iff its code equals the query's code in >= 2 of the L tables (the
// MagicPIG rule; with L = 1 nothing is ever returned). Per-key uint8 counters live in a
// caller-owned LshScratch; entries are zeroed only where they were touched (a touched list), so a
// retrieval costs O(#bucket entries read), not O(n), and leaves the scratch clean for the next
// call. The result is in order of each key's second hit (not sorted). RetrieveGroup returns the
// same sets for the heads of a GQA group at once, sorted, with a head mask per key.
//
// Build and Append sort the L tables in parallel (oneTBB, in the caller's arena).
//
// Thread-safety: Build returns a new object; Append mutates and must not overlap any other call;
// Retrieve is const and may run
// concurrently from many threads as long as each thread uses its own LshScratch. A scratch can be
// reused across tables, heads and layers of any size (it grows to the largest n seen).
#ifndef MAGICPIG_COMMON_ATTENTION_LSH_TABLES_H_
#define MAGICPIG_COMMON_ATTENTION_LSH_TABLES_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/cpu_features.h"
#include "common/large_buffer_allocator.h"

namespace magicpig::attention {

// Per-thread retrieval state. All counters are 0 between calls.
struct LshScratch {
  std::vector<uint8_t> counter;  // size >= n of the tables last retrieved from
  std::vector<int32_t> touched;  // keys whose counter left 0 during the current call
  // RetrieveGroup:
  std::vector<uint32_t> group_counter;  // [n] one byte per head of a block of 4
  std::vector<int32_t> scan_rows;       // [n] one block's sampled keys
  std::vector<uint32_t> scan_masks;     // [n] and their head bits
  std::vector<int32_t> merged_rows;     // union of the blocks so far (g > 4)
  std::vector<uint32_t> merged_masks;
  std::vector<int32_t> bucket_begin;  // [L] the query's bucket in each table
  std::vector<int32_t> bucket_end;
};

class LshTables {
 public:
  // codes: [n][L] uint16 (SimHash::Codes layout), each < 2^k. INVALID_ARGUMENT (naming the field)
  // unless 1 <= k <= 16, 1 <= l <= 512, 0 <= n <= INT32_MAX and every code < 2^k. n = 0 is valid
  // (codes may then be null) and yields empty buckets.
  static absl::StatusOr<LshTables> Build(const uint16_t* codes, int64_t n, int k, int l);

  // Adds m keys with indices n ... n+m-1 and codes [m][L] (each < 2^k), leaving the object
  // exactly as Build over all n+m codes would (a merge per table, O(n + m + 2^K), without the old
  // codes). INVALID_ARGUMENT (and no change) for a code >= 2^k, m < 0 or n + m > INT32_MAX. Not
  // thread-safe: no Retrieve may run concurrently.
  absl::Status Append(const uint16_t* codes, int64_t m);

  // Clears *out, then fills it with every key index that collides with query_codes ([L], each
  // < 2^k) in >= 2 tables, each once, in order of its second hit. INVALID_ARGUMENT for a query code
  // >= 2^k (then *out is empty and the scratch is untouched). scratch->counter is grown to n if
  // smaller; all its entries are 0 again on return.
  absl::Status Retrieve(const uint16_t* query_codes, LshScratch* scratch,
                        std::vector<int32_t>* out) const;

  // The fast path for the g query heads of one GQA group (1 <= g <= 32; query_codes [g][L], each
  // < 2^k): *rows = every key that Retrieve returns for at least one head, in increasing order,
  // and (*masks)[j] has bit h set iff head h's Retrieve returns (*rows)[j]. Collisions are counted
  // one byte per head in a uint32 per key, 4 heads per pass (no branch per bucket entry; the
  // buckets' offsets and first entries are prefetched for all L tables first), then a vector scan
  // over the n counters (kernels/collision_scan.h, at `level`) emits the keys and zeroes the
  // counters. L > 255 (a byte could overflow) runs Retrieve per head instead, same result.
  // INVALID_ARGUMENT for g outside [1, 32] or a code >= 2^k (outputs empty, scratch untouched).
  absl::Status RetrieveGroup(const uint16_t* query_codes, int g, LshScratch* scratch,
                             std::vector<int32_t>* rows, std::vector<uint32_t>* masks,
                             SimdLevel level = ActiveSimdLevel()) const;

  // What RetrieveGroup's lookups for these g heads (query_codes [g][L]) read from the tables, in
  // 64-byte lines: per table, the line(s) holding each head's two bucket offsets and the lines its
  // bucket's entries span, a line shared by heads counted once. `runs` counts the maximal runs of
  // adjacent lines among them: a run's first line is a random read, the others follow it (a long
  // bucket's entries). For the benchmark's floor (magicpig bench --breakdown); it reads the same
  // offsets, so it costs a fraction of a retrieval. Zero when RetrieveGroup reads nothing (L < 2,
  // n = 0); codes >= 2^K are skipped.
  struct LookupReads {
    int64_t lines = 0;
    int64_t runs = 0;
  };
  LookupReads CountLookupReads(const uint16_t* query_codes, int g) const;

  int64_t size() const { return n_; }
  int k() const { return k_; }
  int l() const { return l_; }
  int64_t num_buckets() const { return int64_t{1} << k_; }
  // Table l's 2^K + 1 offsets, copied (for inspection and tests).
  std::vector<int32_t> TableOffsets(int table) const;
  // Entry p (0 <= p < n) of table l's key indices.
  int32_t index(int table, int64_t p) const {
    return narrow() ? indices16_[static_cast<size_t>(table * n_ + p)]
                    : indices32_[static_cast<size_t>(table * n_ + p)];
  }
  // Table l's n key indices, copied (for inspection and tests).
  std::vector<int32_t> TableIndices(int table) const;
  // Bytes per stored key index: 2 while n <= kMaxNarrowKeys, else 4.
  int index_bytes() const { return narrow() ? 2 : 4; }
  static constexpr int64_t kMaxNarrowKeys = 65536;
  // Bytes per stored offset: 2 while n < kMaxNarrowKeys (an offset reaches n), else 4.
  int offset_bytes() const { return narrow_offsets() ? 2 : 4; }

  // Heap bytes held by the tables (offsets + indices), excluding sizeof(*this).
  int64_t bytes() const {
    return static_cast<int64_t>(
        offsets16_.capacity() * sizeof(uint16_t) + offsets32_.capacity() * sizeof(int32_t) +
        indices16_.capacity() * sizeof(uint16_t) + indices32_.capacity() * sizeof(int32_t));
  }

 private:
  LshTables(int64_t n, int k, int l) : n_(n), k_(k), l_(l) {}
  bool narrow() const { return n_ <= kMaxNarrowKeys; }
  bool narrow_offsets() const { return n_ < kMaxNarrowKeys; }
  // Stores [L][2^K + 1] offsets in the type narrow_offsets() says (n_ must be set first).
  void SetOffsets(std::vector<int32_t> offsets);
  // Calls f with a pointer to the [L][n] indices in their stored type.
  template <class F>
  decltype(auto) WithIndices(F&& f) const {
    return narrow() ? f(indices16_.data()) : f(indices32_.data());
  }

  // Calls f with a pointer to the [L][2^K + 1] offsets in their stored type.
  template <class F>
  decltype(auto) WithOffsets(F&& f) const {
    return narrow_offsets() ? f(offsets16_.data()) : f(offsets32_.data());
  }

  int64_t n_;
  int k_;
  int l_;
  std::vector<uint16_t> offsets16_;  // [L][2^K + 1] while narrow_offsets()
  std::vector<int32_t> offsets32_;   // [L][2^K + 1] otherwise
  std::vector<uint16_t, LargeBufferAllocator<uint16_t>> indices16_;  // [L][n] while narrow()
  std::vector<int32_t, LargeBufferAllocator<int32_t>> indices32_;    // [L][n] otherwise
};

namespace internal {

// Lines first ... last (inclusive) of 64 bytes.
struct LineSpan {
  uintptr_t first = 0;
  uintptr_t last = 0;
};

// The distinct lines the spans cover and the maximal runs of adjacent lines among them (what
// CountLookupReads counts per table). Sorts *spans by first line.
LshTables::LookupReads UnionOfLineSpans(std::vector<LineSpan>* spans);

}  // namespace internal
}  // namespace magicpig::attention

#endif  // MAGICPIG_COMMON_ATTENTION_LSH_TABLES_H_
