#include "gpu_node/remote/attention_node_pool.h"

#include <cstdint>

namespace magicpig::remote {
namespace v1 = ::magicpig::v1;

AttentionNodePool::AttentionNodePool(const std::vector<std::string>& addresses,
                                     AttentionNodePoolOptions options)
    : options_(options), deferred_(std::make_unique<DeferredReleases>()) {
  for (const std::string& address : addresses) {
    nodes_.push_back(std::make_unique<AttentionNodeClient>(address, options_.metrics_registry,
                                                           options_.connection));
    if (options_.coalesce_attend) {
      coalescers_.push_back(
          std::make_unique<AttendCoalescer>(nodes_.back().get(), options_.attend_timeout));
    }
  }
  if (options_.connection.identity != nullptr) ReleaseStale();
}

void AttentionNodePool::ReleaseStale() {
  const fabric::CallIdentity& identity = *options_.connection.identity;
  std::vector<AttentionNodeClient*> nodes;
  for (auto& node : nodes_) nodes.push_back(node.get());
  std::vector<v1::ReleaseStaleRequest> requests(nodes.size());
  for (v1::ReleaseStaleRequest& r : requests) {
    r.set_instance(identity.instance());
    r.set_incarnation(identity.incarnation());
  }
  std::vector<v1::ReleaseStaleResponse> responses;
  const std::vector<grpc::Status> statuses =
      CallAll(nodes, requests, &responses, std::chrono::seconds(2),
              [](AttentionNodeClient& node, grpc::ClientContext* context,
                 const v1::ReleaseStaleRequest* request, v1::ReleaseStaleResponse* response,
                 std::function<void(grpc::Status)> done) {
                node.stub().async()->ReleaseStale(context, request, response, std::move(done));
              });
  for (size_t i = 0; i < statuses.size(); ++i) {
    if (!statuses[i].ok()) {
      ++stale_.unanswered;
      continue;
    }
    stale_.sequences += responses[i].sequences();
    stale_.bytes += responses[i].bytes_freed();
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
  return "seq-" + fabric::CallIdentity::RandomHex128();
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
