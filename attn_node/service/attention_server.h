// AttentionServer: one running attention node in a process: a ShardStore, the TaskExecutor, the
// AttentionServiceImpl and a gRPC server bound to a listen address, with the default health
// service (grpc.health.v1; overall status "" and "magicpig.v1.AttentionService"). main() and
// in-process tests use it the same way:
//
//   AttentionServerOptions options;
//   options.listen_address = "127.0.0.1:0";  // port 0: the kernel picks one
//   options.memory_budget_bytes = int64_t{1} << 30;
//   MAGICPIG_ASSIGN_OR_RETURN(std::unique_ptr<AttentionServer> server,
//                             AttentionServer::Start(options));
//   auto channel = grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials());
//
// Transport security: options.security (common/fabric/transport_security.h). The struct's default
// here is plaintext, for in-process tests; the binary makes the choice explicit (--tls-* or
// --insecure).
//   ...
//   server->StartDraining();                                  // stop admitting
//   server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(10));
//
// oneTBB: with threads >= 2 the executor's arena is fed by enqueued tasks only (no thread joins
// it), so it can use at most oneTBB's worker count, which defaults to cores - 1. While alive, the
// server holds a tbb::global_control raising max_allowed_parallelism to threads + 1 so that
// `threads` workers exist (process-wide, like any global_control; the most demanding live one
// wins). With threads = 1 the executor's own dispatcher thread is the arena's only thread
// (task_executor.h), and the control asks for nothing that arena uses.
//
// Metrics and probes over HTTP: with metrics_listen set, an http::Server on that address answers
//   GET /metrics   the registry in the Prometheus text format (the node's gauges refreshed from
//                  ShardStore::Stats() first; node_metrics.h lists the metrics)
//   GET /healthz   200 while the process runs (liveness)
//   GET /readyz    200 while serving, 503 once draining (readiness); /health is an alias
// The metrics go to options.metrics_registry, or to a registry the server owns when it is null.
// The HTTP server stops last, after the gRPC server has drained, so readiness reads 503 throughout.
//
// Log: with options.logger set, the service writes one line per released sequence and one per
// failed call (attention_service.h), and Shutdown one line per sequence it drops. Null: no log.
//
// Housekeeping: a thread wakes every second (or every sequence_ttl / 4 when shorter) and
// releases the sequences that no call has named for sequence_ttl (leases; when > 0;
// AttentionServiceImpl::ExpireIdle) and cancels the upload streams open past
// limits.upload_deadline (AttentionServiceImpl::CancelOverdueUploads).
//
// Thread-safety: StartDraining, Shutdown and the accessors may be called from any thread;
// Shutdown is idempotent (the destructor calls it with an immediate deadline).
#ifndef MAGICPIG_ATTN_NODE_SERVICE_ATTENTION_SERVER_H_
#define MAGICPIG_ATTN_NODE_SERVICE_ATTENTION_SERVER_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "attn_node/service/attention_service.h"
#include "attn_node/service/node_metrics.h"
#include "attn_node/service/shard_store.h"
#include "attn_node/service/task_executor.h"
#include "common/fabric/transport_security.h"
#include "common/http/server.h"
#include "common/logging/logger.h"
#include "common/periodic_thread.h"
#include "grpcpp/grpcpp.h"
#include "prometheus/registry.h"
#include "tbb/global_control.h"

namespace magicpig {

struct AttentionServerOptions {
  std::string listen_address = "0.0.0.0:50051";  // HOST:PORT; port 0 picks a free port
  int64_t memory_budget_bytes = int64_t{1} << 30;
  int threads = 0;  // attention / table-build threads; <= 0: one per core
  // HOST:PORT of the HTTP metrics / health port (port 0 picks a free port); empty: none.
  std::string metrics_listen;
  // Where the node's metrics are registered (borrowed; must outlive the server). Null: a registry
  // owned by the server.
  prometheus::Registry* metrics_registry = nullptr;
  // Where the per-sequence and failed-call lines go (borrowed; must outlive the server). Null: no
  // logging.
  logging::Logger* logger = nullptr;
  // Leases: a sequence that no call names for this long is released (its owner is gone: a
  // compute node that crashed, or marked this node failed and moved on). 0: never.
  std::chrono::milliseconds sequence_ttl{0};
  // mTLS or plaintext; plaintext by default here (see the file comment).
  fabric::TransportSecurity security = fabric::TransportSecurity::Plaintext();
  // Upload-stream caps and deadline (limits.tls is set from `security`).
  ServiceLimits limits;
};

class AttentionServer {
 public:
  // Binds and starts serving. INVALID_ARGUMENT for a negative budget, a metrics_listen that is
  // not HOST:PORT or a bad security choice or file (ValidateTransportSecurity), UNAVAILABLE when
  // an address cannot be bound.
  static absl::StatusOr<std::unique_ptr<AttentionServer>> Start(
      const AttentionServerOptions& options);
  ~AttentionServer();
  AttentionServer(const AttentionServer&) = delete;
  AttentionServer& operator=(const AttentionServer&) = delete;

  // The bound port, and HOST:PORT with it (HOST as given in listen_address).
  int port() const { return port_; }
  const std::string& address() const { return address_; }

  ShardStore& store() { return *store_; }
  AttentionServiceImpl& service() { return *service_; }
  int threads() const { return executor_->threads(); }

  // The HTTP port and HOST:PORT (0 and "" without metrics_listen).
  int metrics_port() const { return http_ != nullptr ? http_->port() : 0; }
  const std::string& metrics_address() const { return metrics_address_; }
  prometheus::Registry& registry() { return *registry_; }
  // The registry in the text exposition format, the node's gauges refreshed first (what GET
  // /metrics answers).
  std::string RenderMetrics();

  // Stops admitting sequences (CreateSequence -> UNAVAILABLE) and reports NOT_SERVING on the
  // health service; calls in flight and later Attend / AppendKV / Release go on.
  void StartDraining();

  // Drains, then shuts the server down: calls still running at `deadline` are cancelled. Waits
  // for every call and executor task to finish.
  void Shutdown(std::chrono::system_clock::time_point deadline);

 private:
  AttentionServer() = default;

  // Routes of the HTTP port.
  http::Router MakeRouter();

  std::string address_;
  int port_ = 0;
  std::string metrics_address_;
  // Declaration order is destruction order in reverse: the servers go first.
  std::unique_ptr<prometheus::Registry> owned_registry_;
  prometheus::Registry* registry_ = nullptr;
  std::unique_ptr<NodeMetrics> metrics_;
  std::unique_ptr<tbb::global_control> parallelism_;
  std::unique_ptr<ShardStore> store_;
  std::unique_ptr<TaskExecutor> executor_;
  std::unique_ptr<AttentionServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<http::Server> http_;
  absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  // Housekeeping (leases, upload deadlines) until Shutdown.
  std::unique_ptr<PeriodicThread> housekeeping_;
};

}  // namespace magicpig

#endif  // MAGICPIG_ATTN_NODE_SERVICE_ATTENTION_SERVER_H_
