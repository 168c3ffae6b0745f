// AttentionShards: where one sequence's offloaded keys live and who answers the sampled part of
// its decode steps (docs/architecture.md §3, §7, §8). The router (attention_router.h) centres keys,
// computes codes and merges; an AttentionShards implementation only stores rows and returns
// per-head partials:
// - LocalAttentionShards: KvShards in this process (the embedded mode);
// - RemoteAttentionShards: token ranges on attention nodes over gRPC (remote_attention_shards.h).
//
// Thread-safety: one instance per sequence, driven by one decode loop at a time.
#ifndef MAGICPIG_COMMON_ATTENTION_ATTENTION_SHARDS_H_
#define MAGICPIG_COMMON_ATTENTION_ATTENTION_SHARDS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/attention/partial_attention.h"

namespace magicpig::attention {

class AttentionShards {
 public:
  virtual ~AttentionShards() = default;

  // Adds the rows of positions [first_pos, first_pos + n) of `layer`: keys already centred
  // ([n_kv][n][d]), values ([n_kv][n][d]) and the keys' codes ([n_kv * n][L]). A layer's first
  // call starts at the region's first position; later calls continue where the last ended.
  virtual absl::Status Append(int64_t layer, int64_t first_pos, int64_t n, const float* keys,
                              const float* values, const uint16_t* codes) = 0;

  // The offloaded part of one decode step of `layer`: q [n_head][d] raw, codes [n_head][L];
  // writes out[0 .. n_head) (lse without the centring term; the router adds scale * q.c).
  virtual absl::Status Attend(int64_t layer, const float* q, const uint16_t* codes, float scale,
                              PartialAttention* out) = 0;

  // Attend in two halves, so that the caller can do other work while the shards compute (the
  // micro-batch ping-pong of a batched step): StartAttend hands the query over, FinishAttend
  // waits for the partials. q and codes must stay valid until FinishAttend; one step may be
  // pending at a time. By default everything happens in FinishAttend.
  virtual absl::Status StartAttend(int64_t layer, const float* q, const uint16_t* codes,
                                   float scale) {
    pending_ = Pending{layer, q, codes, scale};
    return absl::OkStatus();
  }
  // True when the work of a step happens in the caller's FinishAttend (the default: shards in this
  // process), so the caller may run other work beside it in parallel; false when StartAttend or
  // FlushStarted hand it to elsewhere (attention nodes) and FinishAttend only waits.
  virtual bool attends_in_finish() const { return true; }
  // After every sequence of a micro-batch has started its step: sends what StartAttend only
  // queued (shards that batch the queries of several sequences into one message). By default
  // nothing is queued.
  virtual absl::Status FlushStarted() { return absl::OkStatus(); }
  virtual absl::Status FinishAttend(PartialAttention* out) {
    return Attend(pending_.layer, pending_.q, pending_.codes, pending_.scale, out);
  }

  // True for a failure of where the shards live (a node died or stopped answering) that Reset and
  // a fresh Append of every layer can repair.
  virtual bool IsRecoverable(const absl::Status& status) const { return false; }
  // Forgets every layer (releasing what is still reachable) so the router can offload again.
  virtual void Reset() {}

  // Keys held for `layer` (per kv head) and memory held by all layers.
  virtual int64_t size(int64_t layer) const = 0;
  virtual int64_t bytes() const = 0;

 private:
  struct Pending {
    int64_t layer = 0;
    const float* q = nullptr;
    const uint16_t* codes = nullptr;
    float scale = 0;
  };
  Pending pending_;
};

}  // namespace magicpig::attention

#endif  // MAGICPIG_COMMON_ATTENTION_ATTENTION_SHARDS_H_
