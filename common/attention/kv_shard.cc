#include "common/attention/kv_shard.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/attention/estimator_params.h"
#include "common/attention/kernels/pending_scan.h"
#include "common/half.h"
#include "common/status_macros.h"

namespace magicpig::attention {

namespace {

absl::Status CheckSizes(int64_t n, const float* keys, const float* values, KvStorage storage) {
  if (n < 0 || n > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvShard: n must be in [0, INT32_MAX], got ", n));
  }
  if (n > 0 && (keys == nullptr || values == nullptr)) {
    return absl::InvalidArgumentError("KvShard: keys and values must be non-null when n > 0");
  }
  if (storage != KvStorage::kF32 && storage != KvStorage::kBf16) {
    return absl::InvalidArgumentError("KvShard: unknown storage");
  }
  return absl::OkStatus();
}

// INVALID_ARGUMENT (prefixed with `who`) unless each of the n x l codes is < 2^k.
absl::Status CheckCodeRange(const uint16_t* codes, int64_t n, int k, int l, const char* who) {
  const int64_t buckets = int64_t{1} << k;
  for (int64_t i = 0; i < n * l; ++i) {
    if (codes[i] >= buckets) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": codes[", i / l, "][", i % l, "] = ", codes[i], " is not < 2^K = ", buckets));
    }
  }
  return absl::OkStatus();
}

// Norms of n rows of d floats, accumulated in float64.
std::vector<float> RowNorms(const float* k, int64_t n, int64_t d) {
  std::vector<float> norms(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double sq = 0.0;
    for (int64_t j = 0; j < d; ++j) sq += static_cast<double>(k[i * d + j]) * k[i * d + j];
    norms[static_cast<size_t>(i)] = static_cast<float>(std::sqrt(sq));
  }
  return norms;
}

}  // namespace

absl::StatusOr<KvShard> KvShard::Create(const SimHash& hash, const float* keys, const float* center,
                                        const float* values, int64_t n, KvStorage storage) {
  MAGICPIG_RETURN_IF_ERROR(CheckSizes(n, keys, values, storage));
  const int64_t d = hash.dim();
  std::vector<float> c(static_cast<size_t>(d), 0.0f);
  if (center != nullptr) std::copy(center, center + d, c.begin());
  std::vector<float> k(static_cast<size_t>(n * d));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d; ++j) k[i * d + j] = keys[i * d + j] - c[j];
  // Codes (and hence tables) are the keys' bf16 values' (SimHash::KeyCodes), for either storage.
  std::vector<uint16_t> codes(static_cast<size_t>(n) * hash.l());
  if (n > 0) MAGICPIG_RETURN_IF_ERROR(hash.KeyCodes(k.data(), n, d, codes.data()));
  return FromCentred(d, hash.k(), hash.l(), std::move(c), std::move(k), codes.data(), values, n,
                     storage);
}

absl::StatusOr<KvShard> KvShard::CreateFromCodes(int64_t d, int k, int l, const float* centred_keys,
                                                 const uint16_t* codes, const float* values,
                                                 int64_t n, KvStorage storage, KvIndex index) {
  MAGICPIG_RETURN_IF_ERROR(CheckSizes(n, centred_keys, values, storage));
  if (d < 1) return absl::InvalidArgumentError(absl::StrCat("KvShard: d must be >= 1, got ", d));
  if (n > 0 && codes == nullptr) {
    return absl::InvalidArgumentError("KvShard: codes must be non-null when n > 0");
  }
  std::vector<float> kc(centred_keys, centred_keys + (n > 0 ? n * d : 0));
  return FromCentred(d, k, l, std::vector<float>(static_cast<size_t>(d), 0.0f), std::move(kc),
                     codes, values, n, storage, index);
}

absl::StatusOr<KvShard> KvShard::FromCentred(int64_t d, int k_bits, int l, std::vector<float> c,
                                             std::vector<float> k, const uint16_t* codes,
                                             const float* values, int64_t n, KvStorage storage,
                                             KvIndex index) {
  std::vector<uint16_t> kept;  // kCodes: every key's codes, checked like an append's
  if (index == KvIndex::kCodes) {
    if (k_bits < 1 || k_bits > 16 || l < 1 || l > kSimHashMaxL) {
      return absl::InvalidArgumentError(absl::StrCat("KvShard: codes of ", l, " words of ", k_bits,
                                                     " bits (need 1..16 bits, 1..", kSimHashMaxL,
                                                     " words)"));
    }
    MAGICPIG_RETURN_IF_ERROR(CheckCodeRange(codes, n, k_bits, l, "KvShard"));
    if (n > 0) kept.assign(codes, codes + n * l);
  } else if (index != KvIndex::kLshTables) {
    return absl::InvalidArgumentError("KvShard: unknown index");
  }
  // A kCodes shard has an empty two-table placeholder (a few bytes) instead of tables.
  MAGICPIG_ASSIGN_OR_RETURN(LshTables tables, index == KvIndex::kCodes
                                                  ? LshTables::Build(nullptr, 0, 1, 2)
                                                  : LshTables::Build(codes, n, k_bits, l));
  std::vector<float> norms = RowNorms(k.data(), n, d);
  const size_t count = static_cast<size_t>(n * d);
  if (storage == KvStorage::kF32) {
    std::vector<float> v(values, values + (n > 0 ? count : 0));
    KvShard shard(n, d, storage, index, k_bits, l, std::move(c), std::move(k), std::move(v), {}, {},
                  std::move(norms), std::move(tables));
    shard.pending_codes_ = std::move(kept);
    return shard;
  }
  std::vector<uint16_t> k16(count);
  std::vector<uint16_t> v16(count);
  for (size_t at = 0; at < count; ++at) {
    k16[at] = FloatToBf16(k[at]);
    v16[at] = FloatToBf16(values[at]);
  }
  KvShard shard(n, d, storage, index, k_bits, l, std::move(c), {}, {}, std::move(k16),
                std::move(v16), std::move(norms), std::move(tables));
  shard.pending_codes_ = std::move(kept);
  return shard;
}

double KvShard::KeyDot(int64_t i, const float* q) const {
  double s = 0.0;
  if (storage_ == KvStorage::kBf16) {
    const uint16_t* k = keys16_.data() + i * d_;
    for (int64_t j = 0; j < d_; ++j) s += static_cast<double>(q[j]) * Bf16ToFloat(k[j]);
    return s;
  }
  const float* k = keys_.data() + i * d_;
  for (int64_t j = 0; j < d_; ++j) s += static_cast<double>(q[j]) * k[j];
  return s;
}

void KvShard::CopyKey(int64_t i, float* out) const {
  if (storage_ == KvStorage::kBf16) {
    const uint16_t* k = keys16_.data() + i * d_;
    for (int64_t j = 0; j < d_; ++j) out[j] = Bf16ToFloat(k[j]);
    return;
  }
  const float* k = keys_.data() + i * d_;
  for (int64_t j = 0; j < d_; ++j) out[j] = k[j];
}

void KvShard::CopyValue(int64_t i, float* out) const {
  if (storage_ == KvStorage::kBf16) {
    const uint16_t* v = values16_.data() + i * d_;
    for (int64_t j = 0; j < d_; ++j) out[j] = Bf16ToFloat(v[j]);
    return;
  }
  const float* v = values_.data() + i * d_;
  for (int64_t j = 0; j < d_; ++j) out[j] = v[j];
}

void KvShard::AccumulateValue(int64_t i, double w, double* acc) const {
  if (storage_ == KvStorage::kBf16) {
    const uint16_t* v = values16_.data() + i * d_;
    for (int64_t j = 0; j < d_; ++j) acc[j] += w * static_cast<double>(Bf16ToFloat(v[j]));
    return;
  }
  const float* v = values_.data() + i * d_;
  for (int64_t j = 0; j < d_; ++j) acc[j] += w * v[j];
}

int64_t KvShard::bytes() const {
  return static_cast<int64_t>(
             (keys_.capacity() + values_.capacity() + norms_.capacity() + center_.capacity()) *
             sizeof(float)) +
         static_cast<int64_t>(
             (keys16_.capacity() + values16_.capacity() + pending_codes_.capacity()) *
             sizeof(uint16_t)) +
         tables_.bytes();
}

const void* KvShard::key_rows() const {
  return storage_ == KvStorage::kBf16 ? static_cast<const void*>(keys16_.data())
                                      : static_cast<const void*>(keys_.data());
}

const void* KvShard::value_rows() const {
  return storage_ == KvStorage::kBf16 ? static_cast<const void*>(values16_.data())
                                      : static_cast<const void*>(values_.data());
}

absl::Status KvShard::Append(const SimHash& hash, const float* keys, const float* values,
                             int64_t m) {
  if (hash.dim() != d_ || hash.k() != k() || hash.l() != l()) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvShard::Append: hash (d, K, L) = (", hash.dim(), ", ", hash.k(), ", ",
                     hash.l(), ") differs from the shard's (", d_, ", ", k(), ", ", l(), ")"));
  }
  if (m < 0 || n_ + m > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KvShard::Append: m must be >= 0 with n + m <= INT32_MAX, got n = ", n_, ", m = ", m));
  }
  if (m == 0) return absl::OkStatus();
  if (keys == nullptr || values == nullptr) {
    return absl::InvalidArgumentError("KvShard::Append: keys and values must be non-null");
  }
  std::vector<float> k(static_cast<size_t>(m * d_));
  std::vector<uint16_t> codes(static_cast<size_t>(m * l()));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < d_; ++j) k[i * d_ + j] = keys[i * d_ + j] - center_[j];
  }
  MAGICPIG_RETURN_IF_ERROR(hash.KeyCodes(k.data(), m, d_, codes.data()));
  return AppendWithCodes(k.data(), codes.data(), values, m);
}

absl::Status KvShard::AppendWithCodes(const float* centred_keys, const uint16_t* codes,
                                      const float* values, int64_t m) {
  if (m < 0 || n_ + m > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KvShard::Append: m must be >= 0 with n + m <= INT32_MAX, got n = ", n_, ", m = ", m));
  }
  if (m == 0) return absl::OkStatus();
  if (centred_keys == nullptr || values == nullptr || codes == nullptr) {
    return absl::InvalidArgumentError("KvShard::Append: keys, codes and values must be non-null");
  }
  MAGICPIG_RETURN_IF_ERROR(CheckCodeRange(codes, m, k(), l(), "KvShard::Append"));
  // Nothing above changed the shard; from here on nothing can fail.
  const std::vector<float> norms = RowNorms(centred_keys, m, d_);
  norms_.insert(norms_.end(), norms.begin(), norms.end());
  const size_t count = static_cast<size_t>(m * d_);
  if (storage_ == KvStorage::kF32) {
    keys_.insert(keys_.end(), centred_keys, centred_keys + count);
    values_.insert(values_.end(), values, values + count);
  } else {
    for (size_t at = 0; at < count; ++at) {
      keys16_.push_back(FloatToBf16(centred_keys[at]));
      values16_.push_back(FloatToBf16(values[at]));
    }
  }
  pending_codes_.insert(pending_codes_.end(), codes, codes + m * l());
  n_ += m;
  if (index_ == KvIndex::kCodes) return absl::OkStatus();
  if (pending() >= std::clamp<int64_t>(indexed() / 8, kMinMergeRows, kMaxMergeRows)) {
    return MergePending();
  }
  return absl::OkStatus();
}

void KvShard::Reserve(int64_t rows) {
  if (rows <= n_) return;
  const size_t count = static_cast<size_t>(rows * d_);
  norms_.reserve(static_cast<size_t>(rows));
  if (storage_ == KvStorage::kF32) {
    keys_.reserve(count);
    values_.reserve(count);
  } else {
    keys16_.reserve(count);
    values16_.reserve(count);
  }
}

absl::Status KvShard::MergePending() {
  if (index_ == KvIndex::kCodes) return absl::OkStatus();  // no tables to merge into
  MAGICPIG_RETURN_IF_ERROR(tables_.Append(pending_codes_.data(), pending()));
  pending_codes_.clear();
  return absl::OkStatus();
}

absl::Status KvShard::Retrieve(const uint16_t* q_codes, LshScratch* scratch,
                               std::vector<int32_t>* out, SimdLevel level) const {
  if (index_ == KvIndex::kCodes) {
    return absl::InvalidArgumentError("KvShard::Retrieve: the shard holds codes without tables");
  }
  MAGICPIG_RETURN_IF_ERROR(tables_.Retrieve(q_codes, scratch, out));
  const size_t before = out->size();
  out->resize(before + static_cast<size_t>(pending()));
  scratch->scan_masks.resize(static_cast<size_t>(pending()));
  const int64_t found = PendingCollisions(level, pending_codes_.data(), pending(), l(), q_codes, 1,
                                          static_cast<int32_t>(indexed()), out->data() + before,
                                          scratch->scan_masks.data());
  out->resize(before + static_cast<size_t>(found));
  return absl::OkStatus();
}

absl::Status KvShard::RetrieveGroup(const uint16_t* q_codes, int g, LshScratch* scratch,
                                    std::vector<int32_t>* rows, std::vector<uint32_t>* masks,
                                    SimdLevel level) const {
  if (index_ == KvIndex::kCodes) {
    return absl::InvalidArgumentError(
        "KvShard::RetrieveGroup: the shard holds codes without tables");
  }
  MAGICPIG_RETURN_IF_ERROR(tables_.RetrieveGroup(q_codes, g, scratch, rows, masks, level));
  // The pending keys follow the indexed ones, so appending keeps *rows sorted.
  const size_t before = rows->size();
  rows->resize(before + static_cast<size_t>(pending()));
  masks->resize(rows->size());
  const int64_t found = PendingCollisions(level, pending_codes_.data(), pending(), l(), q_codes, g,
                                          static_cast<int32_t>(indexed()), rows->data() + before,
                                          masks->data() + before);
  rows->resize(before + static_cast<size_t>(found));
  masks->resize(rows->size());
  return absl::OkStatus();
}

int64_t ShardBytesPerKey(int64_t head_dim, KvStorage storage, int lsh_l, KvIndex index,
                         int64_t max_tokens) {
  const int64_t element = storage == KvStorage::kF32 ? 4 : 2;
  const int64_t index_bytes =
      index == KvIndex::kCodes || max_tokens <= LshTables::kMaxNarrowKeys ? 2 : 4;
  return 2 * head_dim * element + 4 + int64_t{lsh_l} * index_bytes;
}

int64_t ShardFixedBytes(int64_t head_dim, int lsh_k, int lsh_l, KvIndex index, int64_t max_tokens) {
  // A learned-codes shard has no bucket offsets (only an empty two-table placeholder of 3 16-bit
  // offsets each).
  if (index == KvIndex::kCodes) return 2 * 3 * 2 + head_dim * 4;
  const int64_t offset_bytes = max_tokens < LshTables::kMaxNarrowKeys ? 2 : 4;
  return int64_t{lsh_l} * ((int64_t{1} << lsh_k) + 1) * offset_bytes + head_dim * 4;
}

}  // namespace magicpig::attention
