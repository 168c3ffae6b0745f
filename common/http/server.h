// Server: a small HTTP/1.1 server on POSIX sockets for the OpenAI-compatible API, /metrics and the
// health probes of the magicpig nodes.
//
//   Router router;
//   router.Handle("GET", "/healthz", [](const Request&, Responder& res) {
//     res.Send(200, "text/plain", "ok\n").IgnoreError();
//   });
//   ServerOptions options;
//   options.port = 8000;
//   MAGICPIG_ASSIGN_OR_RETURN(std::unique_ptr<Server> server,
//                             Server::Start(options, std::move(router)));
//   ...
//   server->Shutdown(absl::Seconds(10));  // on SIGTERM
//
// Threads. One acceptor thread polls the listening socket and a wake eventfd (written by
// Shutdown). Each accepted connection gets its own thread, which reads and parses requests
// (RequestParser), runs the handler and writes the response, for as many keep-alive requests as
// the connection carries. Handlers therefore may block for as long as they need: a streamed LLM
// generation holds its connection thread and nothing else. The number of threads is bounded by
// max_connections: a connection beyond it is answered "503 Service Unavailable" with
// "Connection: close" by the acceptor and closed. (An event loop with a handler pool would save
// threads, but a blocking handler would then hold a pool worker and the pool bound would be the
// same bound; at a few hundred connections, threads are the simpler correct design.)
//
// Per connection: TCP_NODELAY; keep-alive per HTTP/1.1 rules ("Connection: close"; HTTP/1.0 only
// with "Connection: keep-alive"); pipelined requests answered in order; "Expect: 100-continue"
// answered with "100 Continue" before the body is read (or with the final 404 / 405 and a close
// when there is no route); with ServerOptions::head_check, a request it refuses answered and the
// connection closed before any of the body is read; an idle connection closed after idle_timeout; a
// request whose bytes started arriving but did not complete within read_timeout answered 408 and
// closed. Malformed requests are answered 400 / 413 / 431 / 501 / 505 (request_parser.h) with
// "Connection: close", and the server keeps serving its other connections. The bodies of these
// transport-level errors (and of 404 / 405 / 408 / 500 / 503) come from ServerOptions::error_body.
// A handler that throws gets a 500 (or its half-sent response cut off) and the connection is
// closed. Every send uses MSG_NOSIGNAL: the process need not ignore SIGPIPE.
//
// Thread-safety: port() and connections() may be called from any thread; Shutdown from any
// thread but not from a handler (it waits for handlers).
#ifndef MAGICPIG_COMMON_HTTP_SERVER_H_
#define MAGICPIG_COMMON_HTTP_SERVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/http/message.h"
#include "common/http/responder.h"
#include "common/http/router.h"

namespace magicpig::http {

// ErrorBodyFn: the (content type, body) of a transport-level error response for `status` with a
// human-readable `message` ("no route for /v1/foo"). Called concurrently from connection threads.
using ErrorBodyFn =
    std::function<std::pair<std::string, std::string>(int status, std::string_view message)>;

// DefaultErrorBody: ("text/plain; charset=utf-8", message + "\n").
std::pair<std::string, std::string> DefaultErrorBody(int status, std::string_view message);

// HeadCheckFn: called when a request's head has arrived and a body follows, before any of the body
// is read. A refusal is answered with its status and message (through error_body) and the
// connection is closed without reading the body, so that a client the server will refuse anyway
// (e.g. without credentials) cannot make it buffer a body. Called concurrently from connection
// threads.
struct HeadRefusal {
  int status = 401;
  std::string message;
};
using HeadCheckFn = std::function<std::optional<HeadRefusal>(const Request& head)>;

struct ServerOptions {
  std::string host = "0.0.0.0";  // numeric IPv4 / IPv6 address or a host name to bind
  int port = 0;                  // 0: the kernel picks a free port (see Server::port())
  int max_connections = 256;     // open connections (= connection threads) at most
  // Open connections from one peer IP address at most (0: no such limit), so that one client
  // cannot take every slot; beyond it a connection gets the same 503 as beyond max_connections.
  int max_connections_per_client = 0;
  // Slots kept for probes beyond max_connections (0: none): when every other slot is taken (by a
  // flood from many addresses, say), a connection still gets one of these, and is served one
  // request if it is a GET of one of `probe_paths` (health, readiness, metrics), else 503. Probe
  // connections have 2 s idle and read timeouts and are closed after their request.
  int reserved_probe_connections = 0;
  std::vector<std::string> probe_paths;
  int64_t max_body_bytes = 8 << 20;
  int64_t max_header_bytes = 16 << 10;  // request line + header section
  int max_headers = 100;
  absl::Duration idle_timeout = absl::Seconds(60);   // keep-alive connection with no request
  absl::Duration read_timeout = absl::Seconds(30);   // for a request that started arriving
  absl::Duration write_timeout = absl::Seconds(60);  // a send making no progress this long fails
  ErrorBodyFn error_body;                            // empty: DefaultErrorBody
  HeadCheckFn head_check;                            // empty: every body is read
};

class Server {
 public:
  // Server::Start binds host:port, listens and starts the acceptor thread. INVALID_ARGUMENT for
  // bad options (max_connections < 1, a port outside 0..65535, negative limits, non-positive
  // timeouts, an unresolvable host); UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options, Router router);

  // Shuts down with no grace (see Shutdown).
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Server::port: the bound port.
  int port() const { return port_; }

  // Server::connections: open connections now.
  int connections() const;

  // Server::Shutdown stops accepting (the listening socket is closed), closes every connection
  // that is not running a handler (idle keep-alive connections, requests still arriving), and
  // waits up to `grace` for the running handlers; their responses carry "Connection: close". When
  // `grace` runs out it shuts the remaining sockets down, so their handlers see Write() fail and
  // ClientGone() turn true, and waits for those handlers to return: when Shutdown returns, no
  // handler runs, and whatever the handlers use may be destroyed. (A handler that never writes nor
  // checks ClientGone() would hold it up.) Idempotent.
  void Shutdown(absl::Duration grace);

 private:
  struct Connection;

  Server(const ServerOptions& options, Router router);
  void AcceptLoop();
  void Reject(int fd, std::string_view why);  // 503 to a connection beyond a connection limit
  void ServeConnection(Connection* conn);
  // Runs the handler (or answers 404 / 405 / 500); whether the connection may be reused.
  bool Dispatch(Connection* conn, Request& request);
  void SendError(Responder& responder, int status, std::string_view message,
                 const HeaderList& extra_headers = {});
  // 404, or 405 with "Allow: `allow`" when the path has routes for other methods.
  void SendNoRoute(Responder& responder, const Request& request, const std::string& allow);
  void FinishConnection(Connection* conn);
  void ReapFinishedThreads();

  const ServerOptions options_;
  const Router router_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd; readable once Shutdown began
  int port_ = 0;
  std::atomic<bool> draining_{false};
  std::thread acceptor_;

  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;

  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, std::unique_ptr<Connection>> connections_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> per_client_ ABSL_GUARDED_BY(mu_);  // open connections per peer IP
  int probe_connections_ ABSL_GUARDED_BY(mu_) = 0;              // on reserved probe slots
  std::vector<std::thread> finished_ ABSL_GUARDED_BY(mu_);      // exited connection threads to join
};

// StartProbeListener: a Server for scrapers and probes only (every route of `router` is one),
// on `address` (HOST:PORT; port 0 picks one). They send one small request at once, so idle or
// slow sockets are closed after 2 s (a handful of idle connections cannot hold every slot for a
// minute); 64 slots, at most 16 per address (Prometheus and the kubelet come from addresses of
// their own), and 8 more reserved for one GET of a route each, so a flood from many addresses
// still leaves the probes a way in. Errors as Start's, prefixed "metrics port: ".
absl::StatusOr<std::unique_ptr<Server>> StartProbeListener(std::string_view address, Router router,
                                                           std::vector<std::string> paths);

}  // namespace magicpig::http

#endif  // MAGICPIG_COMMON_HTTP_SERVER_H_
