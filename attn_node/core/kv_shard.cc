#include "attn_node/core/kv_shard.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/half.h"
#include "common/status_macros.h"

namespace magicpig {

absl::StatusOr<KvShard> KvShard::Create(const SimHash& hash, const float* keys, const float* center,
                                        const float* values, int64_t n, KvStorage storage) {
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
  const int64_t d = hash.dim();
  const size_t count = static_cast<size_t>(n * d);
  std::vector<float> c(static_cast<size_t>(d), 0.0f);
  if (center != nullptr) std::copy(center, center + d, c.begin());
  std::vector<float> k(count);
  std::vector<float> norms(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double sq = 0.0;
    for (int64_t j = 0; j < d; ++j) {
      const size_t at = static_cast<size_t>(i * d + j);
      const float c = center != nullptr ? center[j] : 0.0f;
      k[at] = keys[at] - c;
      sq += static_cast<double>(k[at]) * k[at];
    }
    norms[static_cast<size_t>(i)] = static_cast<float>(std::sqrt(sq));
  }
  // Codes (and hence tables) always come from the float32 centred keys.
  std::vector<uint16_t> codes(static_cast<size_t>(n) * hash.l());
  if (n > 0) MAGICPIG_RETURN_IF_ERROR(hash.Codes(k.data(), n, d, codes.data()));
  MAGICPIG_ASSIGN_OR_RETURN(LshTables tables,
                            LshTables::Build(codes.data(), n, hash.k(), hash.l()));
  if (storage == KvStorage::kF32) {
    std::vector<float> v(values, values + (n > 0 ? count : 0));
    return KvShard(n, d, storage, std::move(c), std::move(k), std::move(v), {}, {},
                   std::move(norms), std::move(tables));
  }
  std::vector<uint16_t> k16(count);
  std::vector<uint16_t> v16(count);
  for (size_t at = 0; at < count; ++at) {
    k16[at] = FloatToBf16(k[at]);
    v16[at] = FloatToBf16(values[at]);
  }
  return KvShard(n, d, storage, std::move(c), {}, {}, std::move(k16), std::move(v16),
                 std::move(norms), std::move(tables));
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
  MAGICPIG_RETURN_IF_ERROR(hash.Codes(k.data(), m, d_, codes.data()));
  // Nothing above changed the shard; from here on nothing can fail.
  for (int64_t i = 0; i < m; ++i) {
    double sq = 0.0;
    for (int64_t j = 0; j < d_; ++j) sq += static_cast<double>(k[i * d_ + j]) * k[i * d_ + j];
    norms_.push_back(static_cast<float>(std::sqrt(sq)));
  }
  const size_t count = static_cast<size_t>(m * d_);
  if (storage_ == KvStorage::kF32) {
    keys_.insert(keys_.end(), k.begin(), k.end());
    values_.insert(values_.end(), values, values + count);
  } else {
    for (size_t at = 0; at < count; ++at) {
      keys16_.push_back(FloatToBf16(k[at]));
      values16_.push_back(FloatToBf16(values[at]));
    }
  }
  pending_codes_.insert(pending_codes_.end(), codes.begin(), codes.end());
  n_ += m;
  if (pending() >= std::max<int64_t>(kMinMergeRows, indexed() / 8)) return MergePending();
  return absl::OkStatus();
}

absl::Status KvShard::MergePending() {
  MAGICPIG_RETURN_IF_ERROR(tables_.Append(pending_codes_.data(), pending()));
  pending_codes_.clear();
  return absl::OkStatus();
}

absl::Status KvShard::Retrieve(const uint16_t* q_codes, LshScratch* scratch,
                               std::vector<int32_t>* out) const {
  MAGICPIG_RETURN_IF_ERROR(tables_.Retrieve(q_codes, scratch, out));
  const int l = this->l();
  const int64_t base = indexed();
  const int64_t pend = pending();
  for (int64_t i = 0; i < pend; ++i) {
    const uint16_t* c = pending_codes_.data() + i * l;
    int hits = 0;
    for (int t = 0; t < l && hits < 2; ++t) hits += c[t] == q_codes[t];
    if (hits >= 2) out->push_back(static_cast<int32_t>(base + i));
  }
  return absl::OkStatus();
}

}  // namespace magicpig
