#include "gpu_node/remote/attention_node_pool.h"

#include <cstdint>

#include "absl/synchronization/mutex.h"

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
  struct Call {
    grpc::ClientContext context;
    v1::ReleaseStaleRequest request;
    v1::ReleaseStaleResponse response;
    grpc::Status status;
  };
  std::vector<std::unique_ptr<Call>> calls;
  absl::Mutex mu;
  size_t done = 0;
  for (auto& node : nodes_) {
    auto call = std::make_unique<Call>();
    call->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    node->Identify(&call->context);
    call->request.set_instance(identity.instance());
    call->request.set_incarnation(identity.incarnation());
    Call* c = call.get();
    calls.push_back(std::move(call));
    node->stub().async()->ReleaseStale(&c->context, &c->request, &c->response,
                                       [c, &mu, &done](grpc::Status s) {
                                         absl::MutexLock lock(&mu);
                                         c->status = std::move(s);
                                         ++done;
                                       });
  }
  absl::MutexLock lock(&mu);
  const size_t total = calls.size();
  auto all_done = [&done, total] { return done == total; };
  mu.Await(absl::Condition(&all_done));
  for (const auto& c : calls) {
    if (!c->status.ok()) {
      ++stale_.unanswered;
      continue;
    }
    stale_.sequences += c->response.sequences();
    stale_.bytes += c->response.bytes_freed();
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
