// AttentionServiceImpl: magicpig.v1.AttentionService (proto/magicpig/v1/attention.proto) on the
// gRPC callback API, a thin shell over a ShardStore (docs/architecture.md §8, §9).
//
// - CreateSequence / ReleaseSequence: unary; the store call runs on the TaskExecutor and finishes
//   the default reactor from there. NodeStatus answers inline (a few counters).
// - AppendKV: a ServerReadReactor. Each chunk is decoded and checked on arrival (ShardStore::Stage;
//   a bad chunk finishes the call at once with its status, nothing committed); when the client
//   closes the stream, ShardStore::Commit (table builds) runs on the executor, which finishes the
//   call. A cancelled stream commits nothing.
// - Attend: a ServerBidiReactor. Requests are read ahead (up to kMaxQueuedAttends), processed one
//   at a time in arrival order on the executor, and each response is written before the next
//   request starts, so responses come in request order. An error (NOT_FOUND for an unknown
//   sequence, INVALID_ARGUMENT naming the field) finishes the stream with that status.
// Every absl::Status maps 1:1 to the grpc::Status of the same code.
//
// Draining: StartDraining makes CreateSequence answer UNAVAILABLE; calls in flight and the other
// methods go on. (AttentionServer also flips the health status.)
//
// Metrics (optional NodeMetrics): every answered Attend message (its ShardStore::Attend time and
// sampled fraction), every committed AppendKV (its ShardStore::Commit time), and every call
// finished with a refusal (NodeMetrics::Finished).
//
// Log (optional logging::Logger): one INFO line per released sequence
//   sequence=ID layers=N tokens=N attend_calls=N lifetime_ms=N bytes=N status=released
// (LogHeldSequences writes the same line with status=dropped, at WARNING, for the sequences a
// shutdown drops), and one WARNING line per call that fails with anything but CANCELLED
//   rpc=METHOD sequence=ID code=NOT_FOUND error="..."
// (sequence "-" when the call names none, or several). A successful Attend logs nothing: it only
// increments its sequence's counter in the store.
//
// Thread-safety: the object is shared by all of gRPC's callback threads; it holds no per-call
// state (reactors own theirs and delete themselves in OnDone). The store and the executor must
// outlive the server that serves this service.
#ifndef MAGICPIG_ATTN_NODE_SERVICE_ATTENTION_SERVICE_H_
#define MAGICPIG_ATTN_NODE_SERVICE_ATTENTION_SERVICE_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attn_node/service/node_metrics.h"
#include "attn_node/service/shard_store.h"
#include "attn_node/service/task_executor.h"
#include "common/logging/logger.h"
#include "grpcpp/grpcpp.h"
#include "magicpig/v1/attention.grpc.pb.h"

namespace magicpig {

// Attend requests read ahead of the one being processed, per stream.
inline constexpr int kMaxQueuedAttends = 8;

// The store's spec for a CreateSequenceRequest: INVALID_ARGUMENT naming the field for a missing
// shape, an unknown dtype or estimator enum value, or anything ValidateSequenceSpec rejects.
absl::StatusOr<SequenceSpec> SequenceSpecFromProto(const v1::CreateSequenceRequest& request);

// The grpc::Status of the same code and message.
grpc::Status ToGrpcStatus(const absl::Status& status);

class AttentionServiceImpl final : public v1::AttentionService::CallbackService {
 public:
  // store, executor, metrics and logger (the last two nullable: none) are borrowed and must
  // outlive every call served.
  AttentionServiceImpl(ShardStore* store, TaskExecutor* executor, NodeMetrics* metrics = nullptr,
                       const logging::Logger* logger = nullptr)
      : store_(store), executor_(executor), metrics_(metrics), logger_(logger) {}

  grpc::ServerUnaryReactor* CreateSequence(grpc::CallbackServerContext* context,
                                           const v1::CreateSequenceRequest* request,
                                           v1::CreateSequenceResponse* response) override;
  grpc::ServerReadReactor<v1::KvChunk>* AppendKV(grpc::CallbackServerContext* context,
                                                 v1::AppendKvResponse* response) override;
  grpc::ServerBidiReactor<v1::AttendRequest, v1::AttendResponse>* Attend(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* ReleaseSequence(grpc::CallbackServerContext* context,
                                            const v1::ReleaseSequenceRequest* request,
                                            v1::ReleaseSequenceResponse* response) override;
  grpc::ServerUnaryReactor* NodeStatus(grpc::CallbackServerContext* context,
                                       const v1::NodeStatusRequest* request,
                                       v1::NodeStatusResponse* response) override;

  // CreateSequence answers UNAVAILABLE from now on (ShardStore::StartDraining).
  void StartDraining() { store_->StartDraining(); }

  // Logs the sequences the store still holds as dropped (call once no call is running, before the
  // store goes away). Nothing without a logger.
  void LogHeldSequences() const;

  // Leases: releases the sequences no call has named for `ttl` (ShardStore::ReleaseIdle), logs
  // each as expired and counts them (magicpig_attn_sequences_expired_total). Returns how many.
  int ExpireIdle(std::chrono::nanoseconds ttl);

  ShardStore* store() const { return store_; }

 private:
  ShardStore* store_;
  TaskExecutor* executor_;
  NodeMetrics* metrics_;
  const logging::Logger* logger_;
};

}  // namespace magicpig

#endif  // MAGICPIG_ATTN_NODE_SERVICE_ATTENTION_SERVICE_H_
