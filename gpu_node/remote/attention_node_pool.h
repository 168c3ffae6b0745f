// AttentionNodePool: the compute node's set of attention nodes. It owns one client per node (and
// one Attend coalescer per node when coalescing), makes each sequence's RemoteAttentionShards with
// a fresh node-side id, and answers which nodes a sequence's shards saw fail or hold its blocks, so
// that the engine only asks for shards and places a failed sequence again
// (docs/architecture.md §9).
//
// At construction, when the connection carries an identity, it asks every node (in parallel, for
// at most two seconds) to drop what a previous run of this instance left (ReleaseStale); a node
// that does not answer then expires those sequences by its lease instead.
//
//   AttentionNodePool pool({"10.0.0.5:50051", "10.0.0.6:50051"}, {.coalesce_attend = true});
//   std::unique_ptr<RemoteAttentionShards> shards = pool.MakeShards(shape, reserve, block, avoid);
//
// Thread-safety: MakeShards may be called from any thread; the pool outlives every shard set it
// made (they borrow its clients and coalescers).
#ifndef MAGICPIG_GPU_NODE_REMOTE_ATTENTION_NODE_POOL_H_
#define MAGICPIG_GPU_NODE_REMOTE_ATTENTION_NODE_POOL_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpu_node/remote/attend_coalescer.h"
#include "gpu_node/remote/attention_node_client.h"
#include "gpu_node/remote/deferred_releases.h"
#include "gpu_node/remote/remote_attention_shards.h"
#include "prometheus/registry.h"

namespace magicpig::remote {

struct AttentionNodePoolOptions {
  // Queries of a micro-batch to one node at one layer travel as one message (AttendCoalescer).
  bool coalesce_attend = true;
  // A node that does not answer one step's Attend within this counts as failed.
  std::chrono::milliseconds attend_timeout{RemoteAttentionShards::kDefaultAttendTimeout};
  Placement placement = Placement::kPack;
  // Where the per-node RPC metrics go (borrowed; outlives the pool). Null: none.
  prometheus::Registry* metrics_registry = nullptr;
  // Credentials and identity of every call (plaintext and anonymous by default).
  NodeConnection connection;
};

class AttentionNodePool {
 public:
  AttentionNodePool(const std::vector<std::string>& addresses, AttentionNodePoolOptions options);
  ~AttentionNodePool();
  AttentionNodePool(const AttentionNodePool&) = delete;
  AttentionNodePool& operator=(const AttentionNodePool&) = delete;

  // A new sequence's shards over the pool's nodes, leaving out `avoid` (indices of nodes that
  // failed for the sequence it replaces). reserve_tokens and block: RemoteAttentionShards. The
  // node-side id is NewSequenceId(): nothing about it can be guessed from another.
  std::unique_ptr<RemoteAttentionShards> MakeShards(const magicpig::v1::ShardShape& shape,
                                                    int64_t reserve_tokens, int64_t block,
                                                    const std::vector<int>& avoid = {});

  const std::vector<std::unique_ptr<AttentionNodeClient>>& nodes() const { return nodes_; }
  bool empty() const { return nodes_.empty(); }
  // Releases waiting for a node that was marked failed to answer again.
  const DeferredReleases& deferred_releases() const { return *deferred_; }

  // "seq-" and 128 bits from the kernel's CSPRNG (getrandom) in hex.
  static std::string NewSequenceId();

  // What the start-up ReleaseStale calls found: sequences and bytes dropped, over the nodes that
  // answered, and the nodes that did not (their leases take over).
  struct StaleRelease {
    int sequences = 0;
    int64_t bytes = 0;
    int unanswered = 0;
  };
  const StaleRelease& stale_release() const { return stale_; }

  // Indices of the nodes that failed for `shards` (empty unless they are RemoteAttentionShards).
  static std::vector<int> FailedNodes(const attention::AttentionShards* shards);
  // The nodes that hold blocks of `shards`, as a bit set (node i: bit i % 64); 0 when none does
  // (embedded, or nothing offloaded yet).
  static uint64_t NodeSet(const attention::AttentionShards* shards);

 private:
  const AttentionNodePoolOptions options_;
  std::vector<std::unique_ptr<AttentionNodeClient>> nodes_;
  // One per node when coalescing; declared after nodes_, so destroyed before the clients they use.
  std::vector<std::unique_ptr<AttendCoalescer>> coalescers_;
  // Releases of sequences that ended while their node was marked failed; after the clients (it
  // calls them) and before nothing else.
  std::unique_ptr<DeferredReleases> deferred_;
  StaleRelease stale_;

  void ReleaseStale();
};

}  // namespace magicpig::remote

#endif  // MAGICPIG_GPU_NODE_REMOTE_ATTENTION_NODE_POOL_H_
