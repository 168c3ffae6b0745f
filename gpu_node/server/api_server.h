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
// Log: with options.logger set, every request gets exactly one line when it ends (never the
// prompt, the output or the API key). Generation requests:
//   id=chatcmpl-1732700000-7 endpoint=/v1/chat/completions stream=yes prompt_tokens=12
//   generated_tokens=30 finish=stop ms=456 status=200
// (finish: one reason per prompt, comma-separated; "-" when none finished; id "-" for a request
// refused before it got one), with error="<the public error message>" added for a failure. The
// other API endpoints write "endpoint=... ms=... status=..." (and error=...), the probes and
// /metrics the same at DEBUG, and the errors the HTTP layer answers itself (no route, malformed
// request, too many connections) "endpoint=- status=... error=...". The level is WARNING for a
// 5xx status and INFO otherwise (DEBUG for the probes and /metrics).
//
// Thread-safety: handlers run concurrently on the HTTP server's connection threads; the server
// state they share is immutable or thread-safe (scheduler, metrics). Shutdown from one thread.
#ifndef MAGICPIG_GPU_NODE_SERVER_API_SERVER_H_
#define MAGICPIG_GPU_NODE_SERVER_API_SERVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/http/server.h"
#include "common/logging/logger.h"
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
  // Where the per-request lines go (borrowed; must outlive the server). Null: no logging.
  logging::Logger* logger = nullptr;
  // HOST:PORT of a listener of its own for GET /metrics (port 0 picks one); the API port then has
  // no /metrics, so that a NetworkPolicy can open the API to clients and metrics to Prometheus
  // only. Empty: /metrics on the API port.
  std::string metrics_listen;
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
  // The metrics listener's port (0 without metrics_listen).
  int metrics_port() const { return metrics_http_ != nullptr ? metrics_http_->port() : 0; }
  // Stops the HTTP server: waits up to `grace` for running handlers (call after the scheduler has
  // drained, so they have their results).
  void Shutdown(absl::Duration grace);

 private:
  ApiServer(engine::Engine* engine, engine::Scheduler* scheduler, prometheus::Registry* registry,
            ApiServerOptions options);
  // What one request's log line reports besides its endpoint, status and time (filled in by the
  // handler, written by Wrap).
  struct RequestLog;
  // kGeneration: /v1/completions and /v1/chat/completions; kApi: the other authenticated routes;
  // kProbe: the probes and /metrics (no authentication, logged at DEBUG).
  enum class RouteKind { kGeneration, kApi, kProbe };
  // A handler returns the HTTP status it answered (499: the client went away first).
  using ApiHandler = std::function<int(const http::Request&, http::Responder&, RequestLog*)>;
  http::Handler Wrap(std::string name, RouteKind kind, ApiHandler handler);
  void LogRequest(std::string_view name, RouteKind kind, int status, const RequestLog& log,
                  int64_t ms) const;

  int Generate(Endpoint endpoint, const http::Request& request, http::Responder& responder,
               RequestLog* log);
  int Models(http::Responder& responder);
  int Tokenize(const http::Request& request, http::Responder& responder, RequestLog* log);
  int Detokenize(const http::Request& request, http::Responder& responder, RequestLog* log);
  int TokenizerInfo(http::Responder& responder);
  int Ready(http::Responder& responder, RequestLog* log);
  int Metrics(http::Responder& responder);
  // Sends the error body; records the message in *log.
  int SendError(http::Responder& responder, const ApiError& error, RequestLog* log);
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
  std::unique_ptr<http::Server> metrics_http_;  // with metrics_listen only
};

}  // namespace magicpig::server

#endif  // MAGICPIG_GPU_NODE_SERVER_API_SERVER_H_
