#include "gpu_node/remote/deferred_releases.h"

#include <utility>

#include "magicpig/v1/attention.grpc.pb.h"

namespace magicpig::remote {

DeferredReleases::DeferredReleases(std::chrono::milliseconds period,
                                   std::chrono::seconds give_up_after)
    : give_up_after_(give_up_after), thread_(absl::FromChrono(period), [this] { Tick(); }) {}

void DeferredReleases::Add(AttentionNodeClient* node, std::string id) {
  absl::MutexLock lock(&mu_);
  pending_.push_back(Pending{node, std::move(id), std::chrono::steady_clock::now()});
}

int DeferredReleases::pending() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(pending_.size()) + in_flight_;
}

void DeferredReleases::Tick() {
  std::vector<Pending> batch;
  {
    absl::MutexLock lock(&mu_);
    batch.swap(pending_);
    in_flight_ = static_cast<int>(batch.size());
  }
  std::vector<Pending> keep;
  const auto now = std::chrono::steady_clock::now();
  for (Pending& p : batch) {
    grpc::ClientContext ctx;
    // Short: a node that still does not answer costs this thread little.
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
    v1::ReleaseSequenceRequest req;
    v1::ReleaseSequenceResponse resp;
    req.set_sequence_id(p.id);
    p.node->Identify(&ctx);
    const grpc::Status status = p.node->stub().ReleaseSequence(&ctx, req, &resp);
    p.node->metrics().Finished(status);
    const bool done = status.ok() || status.error_code() == grpc::StatusCode::NOT_FOUND;
    if (!done && now - p.added < give_up_after_) keep.push_back(std::move(p));
  }
  absl::MutexLock lock(&mu_);
  for (Pending& p : keep) pending_.push_back(std::move(p));
  in_flight_ = 0;
}

}  // namespace magicpig::remote
