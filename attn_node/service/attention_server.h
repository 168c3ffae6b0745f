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
//   ...
//   server->StartDraining();                                  // stop admitting
//   server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(10));
//
// oneTBB: the executor's arena is fed by enqueued tasks only (no thread joins it), so it can use
// at most oneTBB's worker count, which defaults to cores - 1. While alive, the server holds a
// tbb::global_control raising max_allowed_parallelism to threads + 1 so that `threads` workers
// exist (process-wide, like any global_control; the most demanding live one wins).
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
#include "attn_node/service/shard_store.h"
#include "attn_node/service/task_executor.h"
#include "grpcpp/grpcpp.h"
#include "tbb/global_control.h"

namespace magicpig {

struct AttentionServerOptions {
  std::string listen_address = "0.0.0.0:50051";  // HOST:PORT; port 0 picks a free port
  int64_t memory_budget_bytes = int64_t{1} << 30;
  int threads = 0;  // attention / table-build threads; <= 0: one per core
};

class AttentionServer {
 public:
  // Binds and starts serving. INVALID_ARGUMENT for a negative budget, UNAVAILABLE when the address
  // cannot be bound.
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

  // Stops admitting sequences (CreateSequence -> UNAVAILABLE) and reports NOT_SERVING on the
  // health service; calls in flight and later Attend / AppendKV / Release go on.
  void StartDraining();

  // Drains, then shuts the server down: calls still running at `deadline` are cancelled. Waits
  // for every call and executor task to finish.
  void Shutdown(std::chrono::system_clock::time_point deadline);

 private:
  AttentionServer() = default;

  std::string address_;
  int port_ = 0;
  // Declaration order is destruction order in reverse: the server goes first.
  std::unique_ptr<tbb::global_control> parallelism_;
  std::unique_ptr<ShardStore> store_;
  std::unique_ptr<TaskExecutor> executor_;
  std::unique_ptr<AttentionServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace magicpig

#endif  // MAGICPIG_ATTN_NODE_SERVICE_ATTENTION_SERVER_H_
