#include "gpu_node/engine/kv_cache.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace magicpig::engine {

namespace {
int64_t PageSize() { return static_cast<int64_t>(sysconf(_SC_PAGESIZE)); }

// One layer's K (or V): capacity rows of fp16, at least one element (a mapping is never empty).
int64_t LayerBytesFor(int64_t n_head_kv, int64_t head_dim, int64_t capacity) {
  return std::max<int64_t>(1, capacity * n_head_kv * head_dim) *
         static_cast<int64_t>(sizeof(uint16_t));
}

}  // namespace

int64_t KvCache::layer_bytes() const { return LayerBytesFor(n_head_kv_, head_dim_, capacity_); }

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(int64_t n_layer, int64_t n_head_kv,
                                                         int64_t head_dim, int64_t capacity,
                                                         backend::Backend* memory,
                                                         KvAccounting* accounting) {
  std::unique_ptr<KvCache> c(new KvCache());
  c->n_layer_ = n_layer;
  c->n_head_kv_ = n_head_kv;
  c->head_dim_ = head_dim;
  c->capacity_ = capacity;
  const size_t bytes = static_cast<size_t>(c->layer_bytes());
  if (memory != nullptr && !memory->host_memory()) {
    for (int64_t l = 0; l < n_layer; ++l) {
      for (std::vector<uint16_t*>* tensor : {&c->k_, &c->v_}) {
        absl::StatusOr<backend::BackendBuffer> b = memory->Allocate(c->layer_bytes());
        if (!b.ok()) {
          return absl::ResourceExhaustedError(absl::StrCat(
              "cannot allocate the KV cache for ", capacity, " tokens on the ",
              std::string(memory->name()), " backend: ", std::string(b.status().message())));
        }
        tensor->push_back(b->as<uint16_t>());
        c->device_.push_back(*std::move(b));
      }
    }
    c->accounting_ = accounting;
    c->memory_ = memory;
    c->gaps_.assign(static_cast<size_t>(n_layer), {0, 0});
    if (accounting != nullptr) accounting->device_bytes += c->bytes();
    return c;
  }
  for (int64_t l = 0; l < n_layer; ++l) {
    for (std::vector<uint16_t*>* tensor : {&c->k_, &c->v_}) {
      // Zero pages until written: rows are written before they are read.
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) {
        return absl::ResourceExhaustedError(
            absl::StrCat("cannot allocate the KV cache for ", capacity, " tokens"));
      }
      tensor->push_back(static_cast<uint16_t*>(p));
    }
  }
  c->accounting_ = accounting;
  if (accounting != nullptr) accounting->host_bytes += c->bytes();
  return c;
}

absl::Status KvCache::EnsureHostMirror() {
  if (device_.empty() || mirror_ != nullptr) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<KvCache>> m =
      Create(n_layer_, n_head_kv_, head_dim_, capacity_, nullptr, accounting_);
  if (!m.ok()) return m.status();
  mirror_ = *std::move(m);
  mirror_->set_size(size_);
  return absl::OkStatus();
}

KvCache::~KvCache() {
  if (accounting_ != nullptr) {
    if (device_.empty()) {
      accounting_->host_bytes -= bytes() - released_bytes_;
    } else {
      accounting_->device_bytes -= DeviceBytes();
    }
  }
  if (!device_.empty()) return;  // the buffers give themselves back
  const size_t bytes = static_cast<size_t>(layer_bytes());
  for (uint16_t* p : k_) munmap(p, bytes);
  for (uint16_t* p : v_) munmap(p, bytes);
}

backend::KvLayerView KvCache::layer(int64_t l) {
  backend::KvLayerView view{k_[l], v_[l], capacity_, n_head_kv_, head_dim_};
  if (!gaps_.empty()) {
    view.gap_begin = gaps_[l].first;
    view.gap_end = gaps_[l].second;
    view.capacity -= view.gap_end - view.gap_begin;
  }
  return view;
}

absl::Status KvCache::DropRows(int64_t layer, int64_t begin, int64_t end, int64_t filled) {
  if (device_.empty() || end <= begin) return absl::OkStatus();
  if (layer < 0 || layer >= n_layer_ || begin < 0 || end > capacity_ || filled > capacity_) {
    return absl::InvalidArgumentError(
        absl::StrCat("DropRows(", layer, ", ", begin, ", ", end, ") outside the cache"));
  }
  std::pair<int64_t, int64_t>& gap = gaps_[static_cast<size_t>(layer)];
  if (gap.second > gap.first) {
    return absl::FailedPreconditionError(absl::StrCat("layer ", layer, " already dropped rows"));
  }
  const int64_t row_bytes = n_head_kv_ * head_dim_ * static_cast<int64_t>(sizeof(uint16_t));
  const int64_t dropped = end - begin;
  const int64_t kept_bytes = std::max<int64_t>(row_bytes, (capacity_ - dropped) * row_bytes);
  const int64_t before = std::min(begin, filled);            // rows [0, before) keep their place
  const int64_t after = std::max<int64_t>(0, filled - end);  // rows [end, filled) move down
  for (int t = 0; t < 2; ++t) {
    std::vector<uint16_t*>& tensor = t == 0 ? k_ : v_;
    absl::StatusOr<backend::BackendBuffer> fresh = memory_->Allocate(kept_bytes);
    if (!fresh.ok()) return fresh.status();
    uint16_t* old = tensor[static_cast<size_t>(layer)];
    uint16_t* now = fresh->as<uint16_t>();
    const int64_t row = n_head_kv_ * head_dim_;
    MAGICPIG_RETURN_IF_ERROR(memory_->CopyWithin(now, old, before * row_bytes));
    MAGICPIG_RETURN_IF_ERROR(
        memory_->CopyWithin(now + begin * row, old + end * row, after * row_bytes));
    tensor[static_cast<size_t>(layer)] = now;
    device_[static_cast<size_t>(2 * layer + t)] = *std::move(fresh);  // frees the old buffer
  }
  gap = {begin, end};
  if (accounting_ != nullptr) accounting_->device_bytes -= 2 * (layer_bytes() - kept_bytes);
  return absl::OkStatus();
}

int64_t KvCache::bytes() const { return BytesFor(n_layer_, n_head_kv_, head_dim_, capacity_); }

int64_t KvCache::DeviceBytes() const {
  int64_t held = 0;
  for (const backend::BackendBuffer& b : device_) held += b.bytes();
  return held;
}

int64_t KvCache::BytesFor(int64_t n_layer, int64_t n_head_kv, int64_t head_dim, int64_t capacity) {
  return 2 * n_layer * LayerBytesFor(n_head_kv, head_dim, capacity);
}

int64_t KvCache::Release(int64_t layer, int64_t begin, int64_t end) {
  if (layer < 0 || layer >= n_layer_) return 0;
  begin = std::max<int64_t>(begin, 0);
  end = std::min(end, capacity_);
  if (end <= begin) return 0;
  const int64_t row = n_head_kv_ * head_dim_ * static_cast<int64_t>(sizeof(uint16_t));
  const int64_t page = PageSize();
  // Whole pages inside [begin * row, end * row) of the mapping (which starts on a page).
  const int64_t lo = (begin * row + page - 1) / page * page;
  const int64_t hi = end * row / page * page;
  if (hi <= lo) return 0;
  if (!device_.empty()) return 0;  // device memory stays until the cache is destroyed
  int64_t freed = 0;
  for (uint16_t* base : {k_[layer], v_[layer]}) {
    if (madvise(reinterpret_cast<char*>(base) + lo, static_cast<size_t>(hi - lo), MADV_DONTNEED) ==
        0) {
      freed += hi - lo;
    }
  }
  released_bytes_ += freed;
  if (accounting_ != nullptr) accounting_->host_bytes -= freed;
  return freed;
}

int64_t KvCache::ResidentBytes() const {
  if (!device_.empty()) return DeviceBytes();
  const int64_t page = PageSize();
  const int64_t bytes = layer_bytes();
  std::vector<unsigned char> vec(static_cast<size_t>((bytes + page - 1) / page));
  int64_t resident = 0;
  for (const std::vector<uint16_t*>* tensor : {&k_, &v_}) {
    for (uint16_t* p : *tensor) {
      if (mincore(p, static_cast<size_t>(bytes), vec.data()) != 0) continue;
      for (unsigned char v : vec) resident += (v & 1) ? page : 0;
    }
  }
  return resident;
}

}  // namespace magicpig::engine
