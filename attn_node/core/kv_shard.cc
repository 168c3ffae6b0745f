#include "attn_node/core/kv_shard.h"

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
    return KvShard(n, d, storage, std::move(k), std::move(v), {}, {}, std::move(norms),
                   std::move(tables));
  }
  std::vector<uint16_t> k16(count);
  std::vector<uint16_t> v16(count);
  for (size_t at = 0; at < count; ++at) {
    k16[at] = FloatToBf16(k[at]);
    v16[at] = FloatToBf16(values[at]);
  }
  return KvShard(n, d, storage, {}, {}, std::move(k16), std::move(v16), std::move(norms),
                 std::move(tables));
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
  return static_cast<int64_t>((keys_.capacity() + values_.capacity() + norms_.capacity()) *
                              sizeof(float)) +
         static_cast<int64_t>((keys16_.capacity() + values16_.capacity()) * sizeof(uint16_t)) +
         tables_.bytes();
}

}  // namespace magicpig
