// KvCache: one sequence's exact key/value cache on the compute node, fp16, per layer.
//
// Layout per layer: [position][n_head_kv][head_dim] for K (post-RoPE) and V. Capacity is fixed at
// creation (the context length the sequence may reach); the address space is reserved up front
// (anonymous mappings, one per layer and tensor) so a sequence that was admitted cannot fail
// later for lack of address space.
//
// Release gives the physical memory of a range of positions back to the system (madvise
// MADV_DONTNEED on the whole pages inside it): with attention nodes the offloaded rows of sparse
// layers live there, and the compute node keeps only the static window. Released rows read as
// zeros; nobody reads them (docs/architecture.md §7: the hashed region is the attention nodes').
//
// On a backend whose memory is not the host's (CUDA), the cache is allocated in the backend's
// memory instead (Create's `memory`): all of it is resident from the start, and Release and
// ResidentBytes only account (nothing is given back until the cache is destroyed). Sparse
// attention reads keys and values on the host (the router offloads them and attends the static
// window there), so such a cache can also keep a host mirror (EnsureHostMirror): the transformer
// copies each row there as it is stored, and hooks see host().
//
// Thread-safety: owned by one sequence; not shared.
#ifndef MAGICPIG_GPU_NODE_ENGINE_KV_CACHE_H_
#define MAGICPIG_GPU_NODE_ENGINE_KV_CACHE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu_node/backend/backend.h"

namespace magicpig::engine {

// Bytes of KV caches alive now, by where they live, summed over the caches created with it (for
// /metrics). Host bytes count the address space minus what Release gave back. Thread-safe.
struct KvAccounting {
  std::atomic<int64_t> device_bytes{0};
  std::atomic<int64_t> host_bytes{0};
};

class KvCache {
 public:
  // RESOURCE_EXHAUSTED if the allocation fails. `memory`: the backend whose memory holds the
  // cache when it is not host memory (null or a host-memory backend: anonymous mappings).
  // `accounting` (optional, must outlive the cache) counts its bytes and its mirror's.
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(int64_t n_layer, int64_t n_head_kv,
                                                         int64_t head_dim, int64_t capacity,
                                                         backend::Backend* memory = nullptr,
                                                         KvAccounting* accounting = nullptr);

  backend::KvLayerView layer(int64_t l);
  // The cache in host memory: the mirror when there is one, else this cache (host memory unless
  // created on a device backend without a mirror).
  KvCache& host() { return mirror_ != nullptr ? *mirror_ : *this; }
  bool has_host_mirror() const { return mirror_ != nullptr; }
  // Adds the host mirror to a cache in device memory (a no-op for a host cache).
  absl::Status EnsureHostMirror();
  // Device caches: drops positions [begin, end) of `layer` from device memory (a sparse layer's
  // offloaded region, once the shards have it): the layer is reallocated without them, the
  // `filled` rows outside are copied over, and its view has the gap (backend.h). At most once per
  // layer. A no-op for a host cache (Release gives host memory back).
  absl::Status DropRows(int64_t layer, int64_t begin, int64_t end, int64_t filled);
  int64_t capacity() const { return capacity_; }
  // Positions filled so far (all layers agree after each forward pass).
  int64_t size() const { return size_; }
  void set_size(int64_t n) {
    size_ = n;
    if (mirror_ != nullptr) mirror_->set_size(n);
  }
  // Address space of the whole cache (K and V, every layer).
  int64_t bytes() const;
  // bytes() of a cache of that shape.
  static int64_t BytesFor(int64_t n_layer, int64_t n_head_kv, int64_t head_dim, int64_t capacity);
  // Releases positions [begin, end) of `layer` (see the class comment); returns the bytes given
  // back (whole pages only, so rows sharing a page with kept rows stay).
  int64_t Release(int64_t layer, int64_t begin, int64_t end);
  // Bytes given back by Release so far (the mirror's when there is one).
  int64_t released_bytes() const {
    return mirror_ != nullptr ? mirror_->released_bytes() : released_bytes_;
  }
  // Bytes of the cache resident in memory now (mincore; for tests and diagnostics).
  int64_t ResidentBytes() const;

  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

 private:
  KvCache() = default;
  int64_t layer_bytes() const;
  // Bytes of the device buffers held now (less than bytes() after DropRows).
  int64_t DeviceBytes() const;
  int64_t n_layer_ = 0, n_head_kv_ = 0, head_dim_ = 0, capacity_ = 0, size_ = 0;
  int64_t released_bytes_ = 0;
  std::vector<uint16_t*> k_, v_;  // mappings (or device buffers) of layer_bytes() each
  std::vector<backend::BackendBuffer> device_;  // owns k_ and v_ when on a device
  std::unique_ptr<KvCache> mirror_;             // host copy of a device cache
  KvAccounting* accounting_ = nullptr;
  backend::Backend* memory_ = nullptr;             // the device backend, for device caches
  std::vector<std::pair<int64_t, int64_t>> gaps_;  // per layer: positions dropped (DropRows)
};

}  // namespace magicpig::engine

#endif  // MAGICPIG_GPU_NODE_ENGINE_KV_CACHE_H_
