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
// Owners (common/fabric/call_identity.h): each call acts for the owner CallerOf finds (the client
// certificate's subject with tls, else the owner-token metadata); the store keeps owners apart,
// so another owner's sequence is NOT_FOUND like an unknown one. ReleaseStale drops a caller's
// sequences of a previous incarnation of the same instance.
//
// Upload streams: at most limits.max_upload_streams per owner are open at once (the next one
// finishes RESOURCE_EXHAUSTED at once), and CancelOverdueUploads cancels those open longer than
// limits.upload_deadline (the housekeeping thread of AttentionServer calls it).
//
// Draining: StartDraining makes CreateSequence answer UNAVAILABLE; calls in flight and the other
// methods go on. (AttentionServer also flips the health status.)
//
// Metrics (optional NodeMetrics): every answered Attend message (its ShardStore::Attend time and
// sampled fraction), every committed AppendKV (its ShardStore::Commit time), and every call
// finished with a refusal (NodeMetrics::Finished).
//
// Log (optional logging::Logger): one INFO line per released sequence
//   sequence=ID owner=O layers=N tokens=N attend_calls=N lifetime_ms=N bytes=N status=released
// (the same line at WARNING with status=dropped for the sequences a shutdown drops, expired for a
// lease that ran out, stale for ReleaseStale), and one WARNING line per call that fails with
// anything but CANCELLED
//   rpc=METHOD owner=O sequence=ID code=NOT_FOUND error="..."
// (sequence "-" when the call names none, or several; O is the certificate subject "x509:...",
// "token" for a token owner (never the token) or "-" for none). A successful Attend logs nothing:
// it only increments its sequence's counter in the store.
//
// Thread-safety: the object is shared by all of gRPC's callback threads; it holds no per-call
// state (reactors own theirs and delete themselves in OnDone). The store and the executor must
// outlive the server that serves this service.
#ifndef MAGICPIG_ATTN_NODE_SERVICE_ATTENTION_SERVICE_H_
#define MAGICPIG_ATTN_NODE_SERVICE_ATTENTION_SERVICE_H_

#include <chrono>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
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

// The store's view of a KvChunk (views into the message) for `owner`.
ChunkView ChunkViewOf(const v1::KvChunk& chunk, std::string_view owner);

// The store's views of an AttendRequest's queries (views into the message).
std::vector<QueryView> QueryViewsOf(const v1::AttendRequest& request);

// The grpc::Status of the same code and message.
grpc::Status ToGrpcStatus(const absl::Status& status);

struct ServiceLimits {
  // Callers are identified by their verified client certificate (the server runs mTLS); false:
  // by the owner-token metadata (plaintext, --insecure).
  bool tls = false;
  // AppendKV streams one owner may have open at once.
  int max_upload_streams = 256;
  // An AppendKV stream open longer than this is cancelled (nothing committed).
  std::chrono::milliseconds upload_deadline{std::chrono::minutes(5)};
};

// The open AppendKV streams, per owner, with their start times.
//
// Thread-safety: thread-safe. A stream registered here stays alive until Close (its reactor calls
// Close from OnDone before deleting itself), so CancelOverdue may touch its context under mu_.
class UploadRegistry {
 public:
  // Registers a stream of `owner`; false (nothing registered) when the owner has `limit` open.
  bool Open(const void* stream, grpc::CallbackServerContext* context, const std::string& owner,
            int limit);
  void Close(const void* stream);
  // Cancels the streams opened before `cutoff` (each once); returns their owners.
  std::vector<std::string> CancelOpenedBefore(std::chrono::steady_clock::time_point cutoff);
  int open() const;

 private:
  struct Stream {
    grpc::CallbackServerContext* context;
    std::string owner;
    std::chrono::steady_clock::time_point opened;
  };
  mutable absl::Mutex mu_;
  absl::flat_hash_map<const void*, Stream> streams_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> per_owner_ ABSL_GUARDED_BY(mu_);
};

class AttentionServiceImpl final : public v1::AttentionService::CallbackService {
 public:
  // store, executor, metrics and logger (the last two nullable: none) are borrowed and must
  // outlive every call served.
  AttentionServiceImpl(ShardStore* store, TaskExecutor* executor, NodeMetrics* metrics = nullptr,
                       const logging::Logger* logger = nullptr, ServiceLimits limits = {})
      : store_(store), executor_(executor), metrics_(metrics), logger_(logger), limits_(limits) {}

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
  grpc::ServerUnaryReactor* ReleaseStale(grpc::CallbackServerContext* context,
                                         const v1::ReleaseStaleRequest* request,
                                         v1::ReleaseStaleResponse* response) override;
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

  // Cancels the AppendKV streams open longer than limits.upload_deadline (each logged and
  // counted as DEADLINE_EXCEEDED). Returns how many.
  int CancelOverdueUploads(
      std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now());

  ShardStore* store() const { return store_; }
  const UploadRegistry& uploads() const { return uploads_; }

 private:
  ShardStore* store_;
  TaskExecutor* executor_;
  NodeMetrics* metrics_;
  const logging::Logger* logger_;
  const ServiceLimits limits_;
  UploadRegistry uploads_;
};

}  // namespace magicpig

#endif  // MAGICPIG_ATTN_NODE_SERVICE_ATTENTION_SERVICE_H_
