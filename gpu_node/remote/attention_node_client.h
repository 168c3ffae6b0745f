// AttentionNodeClient: the compute node's handle on one attention node: its address, one gRPC
// channel and stub (mTLS or plaintext: NodeConnection), and the Prometheus metrics of the calls
// made to it (AttentionRpcMetrics). One per node, shared by every sequence
// (RemoteAttentionShards) and by the node's AttendCoalescer. Every call's context goes through
// Identify first, so the node knows the owner, instance and incarnation (call_identity.h).
//
// Thread-safety: thread-safe after construction (gRPC stubs and prometheus-cpp metrics are).
#ifndef MAGICPIG_GPU_NODE_REMOTE_ATTENTION_NODE_CLIENT_H_
#define MAGICPIG_GPU_NODE_REMOTE_ATTENTION_NODE_CLIENT_H_

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/fabric/call_identity.h"
#include "grpcpp/grpcpp.h"
#include "magicpig/v1/attention.grpc.pb.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace magicpig::remote {

// The compute node's metrics of its calls to one attention node (label node="host:port"):
// magicpig_attn_rpc_latency_seconds, magicpig_attn_rpc_bytes_total{direction="up"|"down"},
// magicpig_attn_rpc_errors_total{code}. Default-constructed: no metrics (every method a no-op).
struct AttentionRpcMetrics {
  AttentionRpcMetrics() = default;
  // Registers the families in `registry` (which must outlive this) and the node's series.
  AttentionRpcMetrics(prometheus::Registry& registry, const std::string& node);

  // One Attend round trip.
  void RoundTrip(double seconds) const;
  // Serialized bytes sent to / received from the node.
  void Sent(size_t bytes) const;
  void Received(size_t bytes) const;
  // A finished call: counted by its code name when not OK.
  void Finished(const grpc::Status& status) const;

  std::string node;
  prometheus::Histogram* latency = nullptr;
  prometheus::Counter* bytes_up = nullptr;
  prometheus::Counter* bytes_down = nullptr;
  prometheus::Family<prometheus::Counter>* errors = nullptr;
};

// How the compute node reaches its attention nodes.
struct NodeConnection {
  // fabric::ChannelCredentials and fabric::ChannelArgumentsFor; null credentials: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  grpc::ChannelArguments arguments;
  // What every call says about its caller; null: nothing (the node sees the owner "" on
  // plaintext).
  std::shared_ptr<const fabric::CallIdentity> identity;
};

// One attention node: its address, a channel/stub to it and the metrics of calls to it.
class AttentionNodeClient {
 public:
  // registry: where the RPC metrics go (borrowed, must outlive the client); null: none.
  explicit AttentionNodeClient(std::string address, prometheus::Registry* registry = nullptr,
                               NodeConnection connection = {});
  const std::string& address() const { return address_; }
  magicpig::v1::AttentionService::Stub& stub() { return *stub_; }
  const AttentionRpcMetrics& metrics() const { return metrics_; }
  // Adds the caller's identity metadata to a call's context (before the call starts).
  void Identify(grpc::ClientContext* context) const {
    if (identity_ != nullptr) identity_->Apply(context);
  }
  const fabric::CallIdentity* identity() const { return identity_.get(); }

 private:
  std::string address_;
  std::shared_ptr<const fabric::CallIdentity> identity_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<magicpig::v1::AttentionService::Stub> stub_;
  AttentionRpcMetrics metrics_;
};

// Unary calls to several nodes at once, each with its own context (identified, deadline
// `timeout`): start(i, context, request, response, done) issues call i on the async stub and
// done(status) is called when it ends. Returns when every call has ended, so at most `timeout`
// after the slowest start: a frozen node costs its deadline once, not once per node.
template <typename Request, typename Response, typename Start>
std::vector<grpc::Status> CallAll(const std::vector<AttentionNodeClient*>& nodes,
                                  std::vector<Request>& requests, std::vector<Response>* responses,
                                  std::chrono::milliseconds timeout, Start start) {
  const size_t n = nodes.size();
  responses->assign(n, Response());
  // Shared with the callbacks, so that none touches a destroyed mutex after the wait returns.
  struct State {
    absl::Mutex mu;
    size_t done ABSL_GUARDED_BY(mu) = 0;
    std::vector<grpc::Status> statuses ABSL_GUARDED_BY(mu);
  };
  auto state = std::make_shared<State>();
  {
    absl::MutexLock lock(&state->mu);
    state->statuses.resize(n);
  }
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts(n);
  for (size_t i = 0; i < n; ++i) {
    contexts[i] = std::make_unique<grpc::ClientContext>();
    contexts[i]->set_deadline(std::chrono::system_clock::now() + timeout);
    nodes[i]->Identify(contexts[i].get());
    start(*nodes[i], contexts[i].get(), &requests[i], &(*responses)[i], [state, i](grpc::Status s) {
      absl::MutexLock lock(&state->mu);
      state->statuses[i] = std::move(s);
      ++state->done;
    });
  }
  absl::MutexLock lock(&state->mu);
  State* st = state.get();
  auto all_done = [st, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(st->mu) { return st->done == n; };
  state->mu.Await(absl::Condition(&all_done));
  return state->statuses;
}

// A gRPC status as an absl::Status, prefixed with what failed and where. Same code, except that a
// node's INVALID_ARGUMENT, OUT_OF_RANGE, FAILED_PRECONDITION and ALREADY_EXISTS become INTERNAL:
// the node refused what this compute node sent, which the API must not answer as the client's
// fault (400).
absl::Status FromGrpc(const grpc::Status& s, std::string_view what, std::string_view address);

// The client side of one Attend bidi stream, with the context it runs under.
using AttendStream =
    grpc::ClientReaderWriter<magicpig::v1::AttendRequest, magicpig::v1::AttendResponse>;

// Ends an Attend stream that may still hold unread answers: cancels it first (a plain Finish would
// wait for them), then finishes and drops it and its context. Counts nothing. No-op when null.
void CancelAttendStream(std::unique_ptr<grpc::ClientContext>& context,
                        std::unique_ptr<AttendStream>& stream);

// Ends an Attend stream whose Write or Read failed and drops it and its context, without waiting
// for the node (it cancels the call first): the status the call ended with (the node's if it sent
// one; UNAVAILABLE "stream closed" when it gave none, the call was cancelled or the stream is
// null), counted in node's error metrics and returned naming the node.
absl::Status CloseFailedAttendStream(const AttentionNodeClient& node,
                                     std::unique_ptr<grpc::ClientContext>& context,
                                     std::unique_ptr<AttendStream>& stream);

}  // namespace magicpig::remote

#endif  // MAGICPIG_GPU_NODE_REMOTE_ATTENTION_NODE_CLIENT_H_
