#include "gpu_node/engine/kv_cache.h"

#include <new>

#include "absl/strings/str_cat.h"

namespace magicpig::engine {

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(int64_t n_layer, int64_t n_head_kv,
                                                         int64_t head_dim, int64_t capacity) {
  std::unique_ptr<KvCache> c(new KvCache());
  c->n_layer_ = n_layer;
  c->n_head_kv_ = n_head_kv;
  c->head_dim_ = head_dim;
  c->capacity_ = capacity;
  const int64_t per_layer = capacity * n_head_kv * head_dim;
  for (int64_t l = 0; l < n_layer; ++l) {
    // Default-initialised (not zeroed): rows are written before they are read.
    c->k_.emplace_back(new (std::nothrow) uint16_t[per_layer]);
    c->v_.emplace_back(new (std::nothrow) uint16_t[per_layer]);
    if (!c->k_.back() || !c->v_.back()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate the KV cache for ", capacity, " tokens"));
    }
  }
  return c;
}

backend::KvLayerView KvCache::layer(int64_t l) {
  return backend::KvLayerView{k_[l].get(), v_[l].get(), capacity_, n_head_kv_, head_dim_};
}

int64_t KvCache::bytes() const {
  return 2 * n_layer_ * capacity_ * n_head_kv_ * head_dim_ * static_cast<int64_t>(sizeof(uint16_t));
}

}  // namespace magicpig::engine
