// ApiServer: the compute node's HTTP API on the project's HTTP server — the OpenAI-compatible
// /v1/completions, /v1/chat/completions (Server-Sent Events when streaming) and /v1/models, the
// tokenizer endpoints lm-evaluation-harness probes (/tokenize, /detokenize, /tokenizer_info),
// /healthz (alive), /readyz and /health (model loaded and every attention node answering) and
// /metrics (Prometheus text; the same port as the API).
//
// Generation requests go to the Scheduler (continuous batching); the handler thread waits for its
// tokens and writes them out, and cancels the request when the client goes away. With an API key
// configured, every endpoint except the probes and /metrics requires "Authorization: Bearer
// <key>" (compared in constant time).
//
// Thread-safety: handlers run concurrently on the HTTP server's connection threads; the server
// state they share is immutable or thread-safe (scheduler, metrics). Shutdown from one thread.
#ifndef MAGICPIG_GPU_NODE_SERVER_API_SERVER_H_
#define MAGICPIG_GPU_NODE_SERVER_API_SERVER_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/http/server.h"
#include "gpu_node/engine/engine.h"
#include "gpu_node/engine/scheduler.h"
#include "gpu_node/server/openai_protocol.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/registry.h"

namespace magicpig::server {

struct ApiServerOptions {
  http::ServerOptions http;
  std::string model_name = "magicpig";
  std::string api_key;  // empty: no authentication
  bool allow_attention_override = false;
};

class ApiServer {
 public:
  // engine, scheduler and registry outlive the server.
  static absl::StatusOr<std::unique_ptr<ApiServer>> Start(engine::Engine* engine,
                                                          engine::Scheduler* scheduler,
                                                          prometheus::Registry* registry,
                                                          ApiServerOptions options);
  ~ApiServer();

  int port() const { return http_->port(); }
  // Stops the HTTP server: waits up to `grace` for running handlers (call after the scheduler has
  // drained, so they have their results).
  void Shutdown(absl::Duration grace);

 private:
  ApiServer(engine::Engine* engine, engine::Scheduler* scheduler, prometheus::Registry* registry,
            ApiServerOptions options);
  using ApiHandler = std::function<int(const http::Request&, http::Responder&)>;
  http::Handler Wrap(std::string name, bool authenticated, ApiHandler handler);

  int Generate(Endpoint endpoint, const http::Request& request, http::Responder& responder);
  int Models(http::Responder& responder);
  int Tokenize(const http::Request& request, http::Responder& responder);
  int Detokenize(const http::Request& request, http::Responder& responder);
  int TokenizerInfo(http::Responder& responder);
  int Ready(http::Responder& responder);
  int Metrics(http::Responder& responder);
  int SendError(http::Responder& responder, const ApiError& error);
  int SendJson(http::Responder& responder, int status, const std::string& body);
  bool Authorized(const http::Request& request) const;

  engine::Engine* const engine_;
  engine::Scheduler* const scheduler_;
  prometheus::Registry* const registry_;
  const ApiServerOptions options_;
  ApiContext context_;
  prometheus::Family<prometheus::Counter>& http_requests_;
  const int64_t started_;  // Unix seconds
  std::atomic<uint64_t> next_id_{0};
  std::unique_ptr<http::Server> http_;
};

}  // namespace magicpig::server

#endif  // MAGICPIG_GPU_NODE_SERVER_API_SERVER_H_
