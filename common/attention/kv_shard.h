// A minimal attention shard: the keys and values of one (sequence shard, sparse layer, kv head),
// centred with the layer's mean key c (docs/architecture.md §4.2), their fp32 norms, and the LSH
// tables built from the centred keys' SimHash codes (docs/architecture.md §4.1, §6.1).
//
// Storage: centred keys [n][d] and values [n][d] are held as float32 (KvStorage::kF32, default) or
// bfloat16 (KvStorage::kBf16: round-to-nearest-even via FloatToBf16, 2 bytes per element). With
// bf16 storage the norms are still float32 computed (in float64) from the float32 centred keys; the
// SimHash codes / LSH tables are SimHash::KeyCodes of the centred keys (their bf16 values, for
// either storage); only the stored k̄ and v are rounded. Callers go through the storage-agnostic
// accessors (KeyDot, KeyNorm, CopyKey, CopyValue, AccumulateValue), which read either layout and
// return / accumulate float values.
//
// Append segment (docs/architecture.md §6.4): keys that arrive after the build (tokens leaving the
// compute node's static window) are centred with the same c, hashed, and kept with their codes in a
// pending segment that retrieval scans by brute force; once it holds indexed / 8 keys, clamped to
// [kMinMergeRows, kMaxMergeRows], it is merged into the tables (LshTables::Append), so retrieval
// never scans more than that. Why those bounds: per decode step the scan compares each pending
// key's L codes with each head's (kernels/pending_scan.h: 16 or 32 per instruction), while a merge
// rewrites the block's L tables (n entries each) once per T appended keys; n L / T +
// (T / 2) g L / 16 is least near T = sqrt(32 n / g), 210-420 for blocks of 4K-16K keys and g = 3
// heads per group.
//
// Thread-safety: const methods may be called concurrently; Append and MergePending mutate and must
// not overlap any other call on the same shard (the owner serialises them with the decode step).
#ifndef MAGICPIG_COMMON_ATTENTION_KV_SHARD_H_
#define MAGICPIG_COMMON_ATTENTION_KV_SHARD_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/attention/lsh_tables.h"
#include "common/attention/simhash.h"
#include "common/cpu_features.h"

namespace magicpig::attention {

enum class KvStorage {
  kF32,   // 4 bytes per key / value element
  kBf16,  // 2 bytes per key / value element (round to nearest even)
};

// How the shard indexes its keys' codes.
enum class KvIndex {
  kLshTables,  // SimHash codes in LSH tables (MagicPIG's retrieval; the append segment above)
  kCodes,      // the codes only, [n][L] in key order, scanned whole by the estimator (spotlight's
               // learned codes: Hamming distance to the query's code); no tables, no merge
};

class KvShard {
 public:
  // keys, values: [n][d] row-major float32, d = hash.dim(). center: [d] (the mean key c of the
  // offloaded region) or nullptr when the keys are already centred. The shard stores
  // k̄_i = keys_i - center, |k̄_i| (computed in float64, stored as float32), and LshTables built
  // with hash.k(), hash.l() from hash.KeyCodes(k̄). INVALID_ARGUMENT for n < 0, n > INT32_MAX, or
  // null keys/values with n > 0. n = 0 is a valid empty shard. `storage` selects how k̄ and v are
  // held (see the file comment); norms and tables are identical for both storages.
  static absl::StatusOr<KvShard> Create(const SimHash& hash, const float* keys, const float* center,
                                        const float* values, int64_t n,
                                        KvStorage storage = KvStorage::kBf16);

  // The service path: keys already centred by the compute node (which keeps c; center() is then
  // zeros) and their codes ([n][L], each < 2^K) computed there. Same validation as Create, plus
  // INVALID_ARGUMENT for d < 1, null codes with n > 0, or a code >= 2^K.
  // With KvIndex::kCodes the codes are kept as they are (k = bits per code word, at most 16;
  // l = words per key) and no table is built.
  static absl::StatusOr<KvShard> CreateFromCodes(int64_t d, int k, int l, const float* centred_keys,
                                                 const uint16_t* codes, const float* values,
                                                 int64_t n, KvStorage storage = KvStorage::kBf16,
                                                 KvIndex index = KvIndex::kLshTables);

  // Appends m raw keys / values ([m][d]): centred with this shard's c, hashed with `hash` (which
  // must have the shard's dim, K and L: INVALID_ARGUMENT otherwise, or for m < 0, null inputs with
  // m > 0, or a size beyond INT32_MAX). They join the pending segment; see the file comment.
  absl::Status Append(const SimHash& hash, const float* keys, const float* values, int64_t m);
  // Append for keys centred and hashed by the caller (codes [m][L]); INVALID_ARGUMENT (and no
  // change) for a code >= 2^K or null inputs with m > 0.
  absl::Status AppendWithCodes(const float* centred_keys, const uint16_t* codes,
                               const float* values, int64_t m);
  // Reserves row storage (keys, values, norms) for `rows` keys in total, so appends up to that size
  // never reallocate (a growing vector would briefly hold twice the rows). bytes() counts it.
  void Reserve(int64_t rows);
  // Merges the pending segment into the tables now.
  absl::Status MergePending();

  // Keys in [0, size()) colliding with q_codes ([L], each < 2^K) in >= 2 tables: the tables'
  // result (LshTables::Retrieve) followed by the pending segment's, in increasing index order.
  // INVALID_ARGUMENT for a kCodes shard (it has no tables); likewise RetrieveGroup. `level` is
  // the SIMD level of the pending segment's scan (an estimator passes its own simd_level(), so a
  // test that pins a level runs every kernel of the step at it).
  absl::Status Retrieve(const uint16_t* q_codes, LshScratch* scratch, std::vector<int32_t>* out,
                        SimdLevel level = ActiveSimdLevel()) const;

  // LshTables::RetrieveGroup for the g heads of a GQA group (q_codes [g][L]), then the pending
  // segment's keys (brute force, appended: they are above every indexed key), so *rows stays
  // sorted and each head's set is exactly what Retrieve returns for it.
  absl::Status RetrieveGroup(const uint16_t* q_codes, int g, LshScratch* scratch,
                             std::vector<int32_t>* rows, std::vector<uint32_t>* masks,
                             SimdLevel level = ActiveSimdLevel()) const;

  static constexpr int64_t kMinMergeRows = 256;
  static constexpr int64_t kMaxMergeRows = 512;

  int64_t size() const { return n_; }
  int64_t dim() const { return d_; }
  int k() const { return code_k_; }
  int l() const { return code_l_; }
  KvIndex index() const { return index_; }
  // Codes not in the tables, [pending()][L]: the append segment's, or every key's for kCodes.
  const uint16_t* unindexed_codes() const { return pending_codes_.data(); }
  const LshTables& tables() const { return tables_; }
  // Keys covered by the tables; keys [indexed(), size()) are the pending segment.
  int64_t indexed() const { return tables_.size(); }
  int64_t pending() const { return n_ - tables_.size(); }
  // The c the keys were centred with (zeros when Create had no center).
  const std::vector<float>& center() const { return center_; }
  KvStorage storage() const { return storage_; }

  // |k̄_i|.
  float KeyNorm(int64_t i) const { return norms_[static_cast<size_t>(i)]; }
  // q · k̄_i (the stored, possibly bf16-rounded k̄_i) for q of length dim(), accumulated in float64
  // (scalar reference path).
  double KeyDot(int64_t i, const float* q) const;
  // out[0 .. d) = k̄_i (resp. v_i) as float32.
  void CopyKey(int64_t i, float* out) const;
  void CopyValue(int64_t i, float* out) const;
  // acc[0 .. d) += w * v_i.
  void AccumulateValue(int64_t i, double w, double* acc) const;

  // Raw rows for the SIMD kernels: [size()][dim()] of uint16_t bf16 bits (kBf16) or float (kF32).
  const void* key_rows() const;
  const void* value_rows() const;
  const float* key_norms() const { return norms_.data(); }

  // Heap bytes: keys and values (4 or 2 bytes per element by storage), norms (4 bytes each),
  // center, pending codes and tables (excluding sizeof(*this)).
  int64_t bytes() const;
  // The part of bytes() that indexes the keys: the LSH tables (bucket offsets, key indices) and the
  // pending segment's codes. bytes() - table_bytes() is the rows: keys, values, norms and center.
  int64_t table_bytes() const {
    return tables_.bytes() + static_cast<int64_t>(pending_codes_.capacity() * sizeof(uint16_t));
  }

 private:
  static absl::StatusOr<KvShard> FromCentred(int64_t d, int k_bits, int l, std::vector<float> c,
                                             std::vector<float> k, const uint16_t* codes,
                                             const float* values, int64_t n, KvStorage storage,
                                             KvIndex index = KvIndex::kLshTables);

  KvShard(int64_t n, int64_t d, KvStorage storage, KvIndex index, int code_k, int code_l,
          std::vector<float> center, std::vector<float> keys, std::vector<float> values,
          std::vector<uint16_t> keys16, std::vector<uint16_t> values16, std::vector<float> norms,
          LshTables tables)
      : n_(n),
        d_(d),
        storage_(storage),
        index_(index),
        code_k_(code_k),
        code_l_(code_l),
        center_(std::move(center)),
        keys_(std::move(keys)),
        values_(std::move(values)),
        keys16_(std::move(keys16)),
        values16_(std::move(values16)),
        norms_(std::move(norms)),
        tables_(std::move(tables)) {}

  int64_t n_;
  int64_t d_;
  KvStorage storage_;
  KvIndex index_;
  int code_k_;                           // K: bits per code word
  int code_l_;                           // L: code words per key
  std::vector<float> center_;            // [d]
  std::vector<uint16_t> pending_codes_;  // [pending()][L]
  std::vector<float> keys_;              // [n][d] centred (kF32; empty for kBf16)
  std::vector<float> values_;            // [n][d] (kF32; empty for kBf16)
  std::vector<uint16_t> keys16_;         // [n][d] centred, bf16 bits (kBf16; empty for kF32)
  std::vector<uint16_t> values16_;       // [n][d] bf16 bits (kBf16; empty for kF32)
  std::vector<float> norms_;             // [n]
  LshTables tables_;
};

// What a shard of one (layer, kv head) holding up to max_tokens keys takes in memory, for
// admission: per key its key and value rows, its norm and its index entries (L table indices of 2
// bytes up to LshTables::kMaxNarrowKeys keys, else 4; with KvIndex::kCodes its L 16-bit code
// words), plus a fixed part (the tables' bucket offsets and the centre). The attention node's
// ShardStore and the compute node's embedded shards reserve this.
int64_t ShardBytesPerKey(int64_t head_dim, KvStorage storage, int lsh_l, KvIndex index,
                         int64_t max_tokens);
int64_t ShardFixedBytes(int64_t head_dim, int lsh_k, int lsh_l, KvIndex index, int64_t max_tokens);
inline int64_t EstimateShardBytes(int64_t head_dim, KvStorage storage, int lsh_k, int lsh_l,
                                  KvIndex index, int64_t max_tokens) {
  return max_tokens * ShardBytesPerKey(head_dim, storage, lsh_l, index, max_tokens) +
         ShardFixedBytes(head_dim, lsh_k, lsh_l, index, max_tokens);
}

}  // namespace magicpig::attention

#endif  // MAGICPIG_COMMON_ATTENTION_KV_SHARD_H_
