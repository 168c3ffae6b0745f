#include "gpu_node/remote/attention_node_pool.h"

#include <sys/random.h>

#include <cstdint>
#include <random>

#include "absl/strings/escaping.h"

namespace magicpig::remote {

AttentionNodePool::AttentionNodePool(const std::vector<std::string>& addresses,
                                     AttentionNodePoolOptions options)
    : options_(options), deferred_(std::make_unique<DeferredReleases>()) {
  for (const std::string& address : addresses) {
    nodes_.push_back(std::make_unique<AttentionNodeClient>(address, options_.metrics_registry));
    if (options_.coalesce_attend) {
      coalescers_.push_back(
          std::make_unique<AttendCoalescer>(nodes_.back().get(), options_.attend_timeout));
    }
  }
}

AttentionNodePool::~AttentionNodePool() = default;

std::unique_ptr<RemoteAttentionShards> AttentionNodePool::MakeShards(
    const magicpig::v1::ShardShape& shape, int64_t reserve_tokens, int64_t block,
    const std::vector<int>& avoid) {
  std::vector<AttentionNodeClient*> nodes;
  for (auto& n : nodes_) nodes.push_back(n.get());
  std::vector<AttendCoalescer*> coalescers;
  for (auto& c : coalescers_) coalescers.push_back(c.get());
  auto shards = std::make_unique<RemoteAttentionShards>(
      std::move(nodes), NewSequenceId(), shape, reserve_tokens, block, options_.attend_timeout,
      std::move(coalescers));
  shards->AvoidNodes(avoid);
  shards->set_placement(options_.placement);
  shards->set_deferred_releases(deferred_.get());
  return shards;
}

std::string AttentionNodePool::NewSequenceId() {
  uint8_t bytes[16];
  size_t filled = 0;
  while (filled < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + filled, sizeof(bytes) - filled, 0);
    if (n <= 0) break;  // EINTR or no getrandom: fall back below
    filled += static_cast<size_t>(n);
  }
  if (filled < sizeof(bytes)) {
    std::random_device device;  // /dev/urandom on Linux
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(device());
  }
  return "seq-" + absl::BytesToHexString(
                      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

std::vector<int> AttentionNodePool::FailedNodes(const attention::AttentionShards* shards) {
  const auto* remote = dynamic_cast<const RemoteAttentionShards*>(shards);
  return remote != nullptr ? remote->failed() : std::vector<int>{};
}

uint64_t AttentionNodePool::NodeSet(const attention::AttentionShards* shards) {
  const auto* remote = dynamic_cast<const RemoteAttentionShards*>(shards);
  uint64_t set = 0;
  if (remote != nullptr) {
    for (const RemoteAttentionShards::Range& r : remote->ranges()) {
      set |= uint64_t{1} << (r.node % 64);
    }
  }
  return set;
}

}  // namespace magicpig::remote
