// KvCache: one sequence's exact key/value cache on the compute node, fp16, per layer.
//
// Layout per layer: [position][n_head_kv][head_dim] for K (post-RoPE) and V. Capacity is fixed at
// creation (the context length the sequence may reach); memory is allocated up front so a
// sequence that was admitted cannot fail later for lack of memory.
//
// Thread-safety: owned by one sequence; not shared.
#ifndef MAGICPIG_GPU_NODE_ENGINE_KV_CACHE_H_
#define MAGICPIG_GPU_NODE_ENGINE_KV_CACHE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu_node/backend/backend.h"

namespace magicpig::engine {

class KvCache {
 public:
  // RESOURCE_EXHAUSTED if the allocation fails.
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(int64_t n_layer, int64_t n_head_kv,
                                                         int64_t head_dim, int64_t capacity);

  backend::KvLayerView layer(int64_t l);
  int64_t capacity() const { return capacity_; }
  // Positions filled so far (all layers agree after each forward pass).
  int64_t size() const { return size_; }
  void set_size(int64_t n) { size_ = n; }
  int64_t bytes() const;

 private:
  KvCache() = default;
  int64_t n_layer_ = 0, n_head_kv_ = 0, head_dim_ = 0, capacity_ = 0, size_ = 0;
  std::vector<std::unique_ptr<uint16_t[]>> k_, v_;
};

}  // namespace magicpig::engine

#endif  // MAGICPIG_GPU_NODE_ENGINE_KV_CACHE_H_
