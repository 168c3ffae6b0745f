#include "gpu_node/remote/attention_node_client.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/metrics/metrics.h"

namespace magicpig::remote {
namespace v1 = ::magicpig::v1;

AttentionRpcMetrics::AttentionRpcMetrics(prometheus::Registry& registry, const std::string& node)
    : node(node),
      latency(&prometheus::BuildHistogram()
                   .Name("magicpig_attn_rpc_latency_seconds")
                   .Help("Round trip of one attention request to one attention node")
                   .Register(registry)
                   .Add({{"node", node}}, metrics::RpcBuckets())),
      errors(&prometheus::BuildCounter()
                  .Name("magicpig_attn_rpc_errors_total")
                  .Help("Failed attention-node calls by gRPC status code name")
                  .Register(registry)) {
  auto& bytes = prometheus::BuildCounter()
                    .Name("magicpig_attn_rpc_bytes_total")
                    .Help(
                        "Serialized message bytes sent to (up) and received from (down) each "
                        "attention node")
                    .Register(registry);
  bytes_up = &bytes.Add({{"node", node}, {"direction", "up"}});
  bytes_down = &bytes.Add({{"node", node}, {"direction", "down"}});
}

void AttentionRpcMetrics::RoundTrip(double seconds) const {
  if (latency != nullptr) latency->Observe(seconds);
}

void AttentionRpcMetrics::Sent(size_t bytes) const {
  if (bytes_up != nullptr) bytes_up->Increment(static_cast<double>(bytes));
}

void AttentionRpcMetrics::Received(size_t bytes) const {
  if (bytes_down != nullptr) bytes_down->Increment(static_cast<double>(bytes));
}

void AttentionRpcMetrics::Finished(const grpc::Status& status) const {
  if (errors == nullptr || status.ok()) return;
  errors
      ->Add(
          {{"node", node},
           {"code", absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code()))}})
      .Increment();
}

AttentionNodeClient::AttentionNodeClient(std::string address, prometheus::Registry* registry,
                                         NodeConnection connection)
    : address_(std::move(address)),
      identity_(std::move(connection.identity)),
      channel_(grpc::CreateCustomChannel(address_,
                                         connection.credentials != nullptr
                                             ? connection.credentials
                                             : grpc::InsecureChannelCredentials(),
                                         connection.arguments)),
      stub_(v1::AttentionService::NewStub(channel_)) {
  if (registry != nullptr) metrics_ = AttentionRpcMetrics(*registry, address_);
}

absl::Status FromGrpc(const grpc::Status& s, std::string_view what, std::string_view address) {
  if (s.ok()) return absl::OkStatus();
  absl::StatusCode code = static_cast<absl::StatusCode>(s.error_code());
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
      // The node refused what this compute node sent: a defect here, never the API client's.
      code = absl::StatusCode::kInternal;
      break;
    default:
      break;
  }
  return absl::Status(code, absl::StrCat(std::string(what), " on attention node ",
                                         std::string(address), ": ", s.error_message()));
}

void CancelAttendStream(std::unique_ptr<grpc::ClientContext>& context,
                        std::unique_ptr<AttendStream>& stream) {
  if (stream != nullptr) {
    context->TryCancel();
    (void)stream->Finish();
  }
  stream.reset();
  context.reset();
}

absl::Status CloseFailedAttendStream(const AttentionNodeClient& node,
                                     std::unique_ptr<grpc::ClientContext>& context,
                                     std::unique_ptr<AttendStream>& stream) {
  grpc::Status s;
  if (stream != nullptr) {
    // Cancel first: Finish waits for every answer still unread on the stream, and for the node to
    // end the call, which a frozen node never does (found by the chaos soak: the scheduler hung
    // here for good). A status the node already sent survives the cancel; else it reads CANCELLED.
    context->TryCancel();
    s = stream->Finish();
  }
  stream.reset();
  context.reset();
  if (s.ok() || s.error_code() == grpc::StatusCode::CANCELLED) {
    s = grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream closed");
  }
  node.metrics().Finished(s);
  return FromGrpc(s, "Attend", node.address());
}

}  // namespace magicpig::remote
