// DeferredReleases: ReleaseSequence calls that could not be made when a sequence ended because
// its node was marked failed for it (a stall past --attend-timeout-ms, a broken stream), tried
// again in the background until the node answers. Without them a node that comes back keeps the
// orphaned shards until their lease runs out (--sequence-ttl on the node).
//
// A thread tries every pending release every `period` with a short deadline; OK or NOT_FOUND ends
// it (NOT_FOUND: the node restarted or the lease already freed it); other errors keep it until
// `give_up_after` has passed since it was added (by then the node's lease has freed it).
//
// Thread-safety: Add and pending() may be called from any thread. The nodes passed to Add must
// outlive this object.
#ifndef MAGICPIG_GPU_NODE_REMOTE_DEFERRED_RELEASES_H_
#define MAGICPIG_GPU_NODE_REMOTE_DEFERRED_RELEASES_H_

#include <chrono>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/periodic_thread.h"
#include "gpu_node/remote/attention_node_client.h"

namespace magicpig::remote {

class DeferredReleases {
 public:
  explicit DeferredReleases(std::chrono::milliseconds period = std::chrono::seconds(1),
                            std::chrono::seconds give_up_after = std::chrono::seconds(600));
  // Destruction stops the thread; what is still pending is left to the nodes' leases.
  DeferredReleases(const DeferredReleases&) = delete;
  DeferredReleases& operator=(const DeferredReleases&) = delete;

  // Releases sequence `id` on `node` once it answers.
  void Add(AttentionNodeClient* node, std::string id);
  // Releases not yet done (those a round is trying now included).
  int pending() const;

 private:
  struct Pending {
    AttentionNodeClient* node;
    std::string id;
    std::chrono::steady_clock::time_point added;
  };
  // One round: tries every pending release once.
  void Tick();

  const std::chrono::seconds give_up_after_;
  mutable absl::Mutex mu_;
  std::vector<Pending> pending_ ABSL_GUARDED_BY(mu_);
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // taken by the round now running
  PeriodicThread thread_;                   // last: stopped first, while the members it uses exist
};

}  // namespace magicpig::remote

#endif  // MAGICPIG_GPU_NODE_REMOTE_DEFERRED_RELEASES_H_
