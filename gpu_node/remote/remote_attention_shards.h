// RemoteAttentionShards: a sequence's offloaded keys on attention nodes over gRPC
// (docs/architecture.md §3, §7-§9, proto/magicpig/v1/attention.proto).
//
// Placement: at the first Append (the prompt region of the first sparse layer) the region is cut
// into blocks of `block` tokens, and runs of consecutive blocks go to the nodes in proportion to
// their free memory (NodeStatus; largest remainders, so a one-block region goes to the node with
// the most free memory) — or, with Placement::kPack, all to the freest node if it admits them; each
// block is a shard of its own on its node (a node-side sequence "<id>/b<k>", CreateSequence)
// reserving room for its tokens, and the last block also for `reserve_tokens` more (the tokens that
// later leave the static window). Blocks are attended separately and their partials merged in block
// order — exactly what LocalAttentionShards does — so the result does not depend on the number of
// nodes. A node that answers RESOURCE_EXHAUSTED is dropped from this sequence's placement and the
// region is split again over the others; with no room anywhere the Append fails with
// RESOURCE_EXHAUSTED naming the size. Every sparse layer uses the same ranges. Rows travel in
// AppendKV chunks of about 1 MiB.
//
// Appends are asynchronous, so a layer's rows travel while the compute node works on the next
// layer (layer-major prefill, docs/architecture.md §7): Append serializes the rows into chunks (the
// caller's buffers are free when it returns) and hands them to a background upload; the next Append
// waits for the previous upload before starting its own (one in flight, so a layer's appends stay
// in order), and StartAttend, Reset and the destructor wait for it too. An upload's failure is
// reported by the call that waits for it; it is recoverable like any other node failure.
//
// A node that does not answer an Attend within `attend_timeout` (hung or stopped, not just dead)
// is treated as failed: a watchdog cancels the step's streams and FinishAttend reports
// DEADLINE_EXCEEDED (recoverable), so the router places the sequence again on the others. Nodes
// that failed are not sent ReleaseSequence (a hung node would hold every release for its
// deadline); what they held is theirs to drop (a restarted node holds nothing).
//
// Attend sends one AttendRequest per node holding a range (on a bidi stream kept per node for the
// block), then reads the answers and merges the per-block partials of each head by LSE. With
// coalescers (one per node, shared by the sequences), StartAttend only queues the queries,
// FlushStarted sends what every sequence of the micro-batch queued as one request per node, and
// FinishAttend waits for this sequence's answers (AttendCoalescer); the partials are the same.
//
// Metrics (AttentionNodeClient with a registry; docs/metrics.md): per node, the round trip of each
// Attend request to it (write to the answer read), the serialized bytes of every message sent and
// received (ByteSizeLong), and failed calls by gRPC status code name.
//
// Thread-safety: one instance per sequence, one caller at a time; the upload and the watchdog
// threads touch only their own data, the (thread-safe) stubs and metrics, and gRPC contexts
// through TryCancel. AttentionNodeClient is shared by all sequences and thread-safe (gRPC stubs and
// prometheus-cpp metrics are).
#ifndef MAGICPIG_GPU_NODE_REMOTE_REMOTE_ATTENTION_SHARDS_H_
#define MAGICPIG_GPU_NODE_REMOTE_REMOTE_ATTENTION_SHARDS_H_

#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/attention/attention_shards.h"
#include "gpu_node/remote/attend_coalescer.h"
#include "gpu_node/remote/attention_node_client.h"
#include "gpu_node/remote/deferred_releases.h"
#include "gpu_node/remote/stream_watchdog.h"
#include "grpcpp/grpcpp.h"
#include "magicpig/v1/attention.grpc.pb.h"

namespace magicpig::remote {

// How a sequence's region is laid over the nodes (RemoteAttentionShards::Place).
enum class Placement {
  // Every block on the node with the most free memory, if it admits them all; else as kSpread.
  // A micro-batch of sequences packed this way talks to fewer nodes (fewer Attend messages), and
  // a batch of sequences still spreads over the nodes (each goes to the freest).
  kPack,
  // Runs of blocks over every node in proportion to its free memory: one sequence's attention is
  // shared by all nodes (for a long context on few sequences).
  kSpread,
};

// Splits n_blocks over nodes in proportion to their free memory (bytes), by largest remainders
// (ties: more free memory, then the lower index): counts[i] blocks for node i, summing to n_blocks
// (all zero when no node has free memory).
std::vector<int64_t> ApportionBlocks(int64_t n_blocks, const std::vector<int64_t>& free);

class RemoteAttentionShards final : public attention::AttentionShards {
 public:
  // shape: the sparse layers, heads, (K, L), dtype and estimator of every shard of the sequence.
  // block: tokens per block of the prompt region (see the file comment).
  // attend_timeout: the longest wait for a node's answer to one Attend before it counts as failed.
  // coalescers: empty (a stream per range), or one per node, in the order of `nodes` (borrowed;
  // they must outlive this).
  RemoteAttentionShards(std::vector<AttentionNodeClient*> nodes, std::string sequence_id,
                        magicpig::v1::ShardShape shape, int64_t reserve_tokens, int64_t block,
                        std::chrono::milliseconds attend_timeout = kDefaultAttendTimeout,
                        std::vector<AttendCoalescer*> coalescers = {});
  static constexpr std::chrono::milliseconds kDefaultAttendTimeout{10000};
  ~RemoteAttentionShards() override;  // releases the sequence on every node

  // Where releases on nodes marked failed go (borrowed; outlives this). Null: they are skipped
  // (the nodes' leases free them).
  void set_deferred_releases(DeferredReleases* deferred) { deferred_ = deferred; }

  absl::Status Append(int64_t layer, int64_t first_pos, int64_t n, const float* keys,
                      const float* values, const uint16_t* codes) override;
  // Writes the request to every range's node (they compute in parallel, and while the caller
  // goes on), then FinishAttend reads and merges the answers.
  absl::Status StartAttend(int64_t layer, const float* q, const uint16_t* codes,
                           float scale) override;
  absl::Status FlushStarted() override;
  bool attends_in_finish() const override { return false; }
  absl::Status FinishAttend(attention::PartialAttention* out) override;
  absl::Status Attend(int64_t layer, const float* q, const uint16_t* codes, float scale,
                      attention::PartialAttention* out) override;
  int64_t size(int64_t layer) const override;
  int64_t bytes() const override;
  // UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED, ABORTED or NOT_FOUND (a restarted node no longer
  // knows the sequence) from a node: the sequence is placed again on the nodes that answer.
  bool IsRecoverable(const absl::Status& status) const override;
  void Reset() override;
  // The node-side id of the sequence (its blocks are "<id>/b<index>").
  const std::string& sequence_id() const { return sequence_id_; }
  // Nodes that failed during this sequence (left out of later placements), by index.
  int failed_nodes() const { return static_cast<int>(failed_.size()); }
  const std::vector<int>& failed() const { return failed_; }
  // Leaves these nodes out from the start (they failed for the sequence this one replaces).
  void AvoidNodes(const std::vector<int>& nodes) {
    for (int n : nodes) failed_.push_back(n);
  }
  // Before the first Append: how the region is placed (default kSpread).
  void set_placement(Placement placement) { placement_ = placement; }

  // Node address and [begin, end) token range of each shard (the router's shard map).
  struct Range {
    std::string id;  // the node-side sequence id of this block: "<sequence id>/b<index>"
    int node = 0;
    int64_t begin = 0, end = 0;  // end grows on the last range as tokens are appended
    int64_t bytes = 0;           // as last reported by the node
    std::unique_ptr<grpc::ClientContext> attend_context;
    std::unique_ptr<AttendStream> attend_stream;
  };
  const std::vector<Range>& ranges() const { return ranges_; }

 private:
  // Places the region on the nodes not marked failed; failing that, on the failed ones (they may
  // be back), which are then no longer marked.
  absl::Status Place(int64_t begin, int64_t n);
  // One placement attempt over `candidates` (node indices): UNAVAILABLE when none answered,
  // RESOURCE_EXHAUSTED when none had room.
  absl::Status PlaceOn(int64_t begin, int64_t n, std::vector<int> candidates);
  // Records the node of `range` as failed when `status` is recoverable; returns status.
  absl::Status NoteFailure(const Range& range, absl::Status status);
  // A Write or Read on range's Attend stream failed: finish it and report why (recoverable).
  absl::Status CloseBrokenStream(Range& range);
  // One range's share of an Append, serialized: its chunks and where they go.
  struct RangeUpload {
    size_t range = 0;
    AttentionNodeClient* node = nullptr;
    std::vector<magicpig::v1::KvChunk> chunks;
  };
  // What an upload reports back: its status, the range that failed, the bytes each node reported.
  struct UploadResult {
    absl::Status status;
    size_t failed_range = 0;
    std::vector<std::pair<size_t, int64_t>> range_bytes;
  };
  absl::Status Serialize(const Range& range, size_t range_index, int64_t layer, int64_t first_pos,
                         int64_t n, int64_t row_offset, int64_t total_rows, const float* keys,
                         const float* values, const uint16_t* codes, RangeUpload* out) const;
  static UploadResult Upload(std::vector<RangeUpload> uploads);
  // Waits for the upload in flight (if any) and applies its result.
  absl::Status WaitUpload();
  void Release();
  // Coalesced path: withdraws queued queries and waits out sent ones (their answers must come
  // before a ReleaseSequence that would make the node refuse the shared request).
  void SettleTickets();
  // Coalesced FinishAttend: waits for the step's tickets into node_parts_.
  absl::Status FinishCoalesced(int64_t n_head);
  // Copies one range's answer into node_parts_[range][*]; false when its sizes do not fit the step.
  bool TakePartial(const magicpig::v1::SequencePartial& p, int64_t n_head, size_t range);
  // node_parts_ ([range][head]) merged per head by LSE into out.
  void MergeNodeParts(int64_t n_head, attention::PartialAttention* out) const;

  std::vector<AttentionNodeClient*> nodes_;
  std::vector<AttendCoalescer*> coalescers_;                       // empty: per-range streams
  std::vector<std::shared_ptr<AttendCoalescer::Ticket>> tickets_;  // per range, coalesced step
  std::string sequence_id_;
  magicpig::v1::ShardShape shape_;
  int64_t reserve_tokens_;
  int64_t block_;
  std::vector<Range> ranges_;
  std::vector<int> failed_;  // node indices that failed for this sequence
  DeferredReleases* deferred_ = nullptr;
  Placement placement_ = Placement::kSpread;
  std::vector<int64_t> layer_size_;  // tokens per layer (indexed by layer id)
  uint64_t step_ = 0;
  int64_t pending_heads_ = 0;  // of the step StartAttend sent (0: none pending)
  std::vector<attention::PartialAttention> node_parts_;
  std::vector<std::chrono::steady_clock::time_point> sent_at_;  // per range, this Attend's write
  std::chrono::milliseconds attend_timeout_;
  std::future<UploadResult> upload_;  // the last Append's rows on their way (invalid: none)
  StreamWatchdog watchdog_;
};

}  // namespace magicpig::remote

#endif  // MAGICPIG_GPU_NODE_REMOTE_REMOTE_ATTENTION_SHARDS_H_
