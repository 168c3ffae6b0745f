// AttendCoalescer: one attention node's Attend stream, shared by every sequence of the compute
// node, so that the queries a micro-batch starts at one layer travel to the node as ONE
// AttendRequest and come back as one AttendResponse, instead of one round trip per sequence and
// block. A message costs the two processes ~0.1-0.2 ms of CPU on loopback (gRPC, thread wake-ups;
// docs/benchmarks.md), which at batch 4 with 28 sparse layers was a fifth of a decode step; the
// node already attends the queries of one request in parallel (ShardStore::Attend).
//
// Use: each sequence of the micro-batch Add()s its queries (one per block held on this node);
// Flush() sends everything added as one request (queries for another layer or scale than those
// queued first, or a request grown to its size cap, flush the queue); Wait(ticket) reads the
// answers, in the order the requests were sent, until the ticket's has come. Answers to tickets
// nobody waits for any more (a step that was given up) are read and dropped by a later Wait.
//
// Failure: a broken stream, a malformed answer or no answer within `timeout` fails every request
// in flight on the stream (their tickets get the status: the node's gRPC status, UNAVAILABLE or
// DEADLINE_EXCEEDED, naming the node), the stream is closed, and the next Flush opens a fresh one.
// The sequences then recover as after any node failure (SparseAttentionRouter).
//
// Metrics (the node's AttentionRpcMetrics): one round trip per request, the bytes of each message,
// failed streams by status code.
//
// Thread-safety: every method is thread-safe (one mutex; Wait holds it while it reads, so callers
// take turns). The watchdog's thread only cancels the stream's context.
#ifndef MAGICPIG_GPU_NODE_REMOTE_ATTEND_COALESCER_H_
#define MAGICPIG_GPU_NODE_REMOTE_ATTEND_COALESCER_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "gpu_node/remote/attention_node_client.h"
#include "gpu_node/remote/stream_watchdog.h"
#include "grpcpp/grpcpp.h"
#include "magicpig/v1/attention.grpc.pb.h"

namespace magicpig::remote {

class AttendCoalescer {
 public:
  // One query's answer, shared by the caller and the coalescer. Fields are written under the
  // coalescer's mutex and read by the caller after Wait returned.
  struct Ticket {
    bool done = false;
    absl::Status status;                    // when done: how the request ended for this query
    magicpig::v1::SequencePartial partial;  // when done and OK: the node's answer to the query
    uint64_t request = 0;  // step id of the request that carries the query (0: still queued)
    int index = -1;        // the query's position in that request
  };

  // A request is sent before it would grow past this many payload bytes (or queries), so that
  // requests and their answers stay well under gRPC's default 4 MiB message limit however many
  // sequences and blocks a micro-batch holds.
  static constexpr size_t kDefaultMaxRequestBytes = size_t{1} << 20;
  static constexpr int kMaxQueriesPerRequest = 1024;

  // node: borrowed, must outlive this. timeout: the longest wait for one answer.
  AttendCoalescer(AttentionNodeClient* node, std::chrono::milliseconds timeout,
                  size_t max_request_bytes = kDefaultMaxRequestBytes);
  ~AttendCoalescer();  // cancels the stream (answers still in flight are dropped)
  AttendCoalescer(const AttendCoalescer&) = delete;
  AttendCoalescer& operator=(const AttendCoalescer&) = delete;

  // Queues one query against `sequence_id` (a node-side sequence: one block) for the next Flush.
  // q: the heads' float32 queries as bytes; codes: the bit-packed query codes.
  std::shared_ptr<Ticket> Add(int32_t layer, float scale, const std::string& sequence_id,
                              const std::string& q, const std::string& codes);
  // Sends the queued queries as one request (nothing queued: nothing sent). A failed send fails
  // the tickets (Wait reports it), so there is no status to return.
  void Flush();
  // Blocks until `ticket` is answered (sending it first if it is still queued); returns its
  // status. `ticket` must come from this coalescer's Add.
  absl::Status Wait(Ticket& ticket);
  // Takes `ticket` out of the queue if it was not sent (its sequence gave the step up); a sent
  // one is answered and dropped as usual.
  void Cancel(const std::shared_ptr<Ticket>& ticket);

  // Requests sent so far (for tests and metrics).
  uint64_t requests_sent() const;

 private:
  struct InFlight {
    uint64_t step = 0;
    std::vector<std::shared_ptr<Ticket>> tickets;
    std::chrono::steady_clock::time_point sent_at;
  };
  void FlushLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads the next answer and hands it to the oldest request in flight.
  void ReadOneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails every request in flight (and `extra`, a request that could not be sent) with `status`;
  // the stream must be closed already.
  void FailAllLocked(const absl::Status& status, std::vector<std::shared_ptr<Ticket>> extra = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  AttentionNodeClient* const node_;
  const std::chrono::milliseconds timeout_;
  const size_t max_request_bytes_;
  mutable absl::Mutex mu_;
  magicpig::v1::AttendRequest queued_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Ticket>> queued_tickets_ ABSL_GUARDED_BY(mu_);
  size_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // payload of the queued queries
  std::unique_ptr<grpc::ClientContext> context_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<AttendStream> stream_ ABSL_GUARDED_BY(mu_);
  std::deque<InFlight> in_flight_ ABSL_GUARDED_BY(mu_);
  uint64_t next_step_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t requests_sent_ ABSL_GUARDED_BY(mu_) = 0;
  StreamWatchdog watchdog_;
};

}  // namespace magicpig::remote

#endif  // MAGICPIG_GPU_NODE_REMOTE_ATTEND_COALESCER_H_
