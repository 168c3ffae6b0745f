#include "attn_node/core/kv_shard.h"

#include <cmath>
#include <cstddef>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace magicpig {

absl::StatusOr<KvShard> KvShard::Create(const SimHash& hash, const float* keys, const float* center,
                                        const float* values, int64_t n) {
  if (n < 0 || n > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvShard: n must be in [0, INT32_MAX], got ", n));
  }
  if (n > 0 && (keys == nullptr || values == nullptr)) {
    return absl::InvalidArgumentError("KvShard: keys and values must be non-null when n > 0");
  }
  const int64_t d = hash.dim();
  const size_t count = static_cast<size_t>(n * d);
  std::vector<float> k(count);
  std::vector<float> v(count);
  std::vector<float> norms(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double sq = 0.0;
    for (int64_t j = 0; j < d; ++j) {
      const size_t at = static_cast<size_t>(i * d + j);
      const float c = center != nullptr ? center[j] : 0.0f;
      k[at] = keys[at] - c;
      v[at] = values[at];
      sq += static_cast<double>(k[at]) * k[at];
    }
    norms[static_cast<size_t>(i)] = static_cast<float>(std::sqrt(sq));
  }
  std::vector<uint16_t> codes(static_cast<size_t>(n) * hash.l());
  if (n > 0) MAGICPIG_RETURN_IF_ERROR(hash.Codes(k.data(), n, d, codes.data()));
  MAGICPIG_ASSIGN_OR_RETURN(LshTables tables,
                            LshTables::Build(codes.data(), n, hash.k(), hash.l()));
  return KvShard(n, d, std::move(k), std::move(v), std::move(norms), std::move(tables));
}

double KvShard::KeyDot(int64_t i, const float* q) const {
  const float* k = keys_.data() + i * d_;
  double s = 0.0;
  for (int64_t j = 0; j < d_; ++j) s += static_cast<double>(q[j]) * k[j];
  return s;
}

void KvShard::CopyKey(int64_t i, float* out) const {
  const float* k = keys_.data() + i * d_;
  for (int64_t j = 0; j < d_; ++j) out[j] = k[j];
}

void KvShard::CopyValue(int64_t i, float* out) const {
  const float* v = values_.data() + i * d_;
  for (int64_t j = 0; j < d_; ++j) out[j] = v[j];
}

void KvShard::AccumulateValue(int64_t i, double w, double* acc) const {
  const float* v = values_.data() + i * d_;
  for (int64_t j = 0; j < d_; ++j) acc[j] += w * v[j];
}

int64_t KvShard::bytes() const {
  return static_cast<int64_t>((keys_.capacity() + values_.capacity() + norms_.capacity()) *
                              sizeof(float)) +
         tables_.bytes();
}

}  // namespace magicpig
