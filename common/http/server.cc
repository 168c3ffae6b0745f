// Server: listening, the acceptor thread, connection threads and shutdown (server.h).
#include "common/http/server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <exception>
#include <optional>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/flags/flag_values.h"
#include "common/http/request_parser.h"
#include "common/http/socket_internal.h"

namespace magicpig::http {

struct Server::Connection {
  uint64_t id = 0;
  int fd = -1;
  std::string client;  // peer IP address (per-client limit)
  bool probe = false;  // admitted on a reserved probe slot (ServerOptions::probe_paths only)
  std::thread thread;
};

namespace {

constexpr size_t kReadChunk = 16 << 10;
// Idle and read timeout of a connection on a reserved probe slot, and of every connection of a
// probe listener (StartProbeListener).
constexpr absl::Duration kProbeTimeout = absl::Seconds(2);

// The peer's IP address as text (without the port), the key of the per-client limit.
std::string ClientAddress(const sockaddr_storage& peer) {
  char text[INET6_ADDRSTRLEN] = {};
  if (peer.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&peer);
    ::inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
  } else if (peer.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&peer);
    ::inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
  }
  return text;
}
// Closing a socket with unread input makes the kernel send RST, which can destroy the response
// just sent before the client reads it. So after answering and deciding to close, the server
// half-closes and reads (and drops) what the client still sends, for this long / this much. Once
// Shutdown began it drops only what is already there, so that idle clients cannot hold it up.
constexpr absl::Duration kLingerTime = absl::Seconds(1);
constexpr size_t kLingerMaxBytes = 16 << 20;
constexpr size_t kMaxLingeringRejects = 64;  // 503'd sockets lingering in the acceptor at once
constexpr int kAcceptorTickMs = 500;         // how often finished connection threads are joined

// Milliseconds for poll() until `deadline`, rounded up, in [0, INT_MAX].
int PollMillis(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, INT_MAX));
}

void SetSendTimeout(int fd, absl::Duration timeout) {
  timeval tv = absl::ToTimeval(timeout);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

// Half-closes `fd` and drops what the client still sends, until it closes or `linger` passes;
// once `wake_fd` is readable (Shutdown), only what is already there.
void LingeringClose(int fd, int wake_fd, absl::Duration linger) {
  ::shutdown(fd, SHUT_WR);
  absl::Time deadline = absl::Now() + linger;
  char scratch[4096];
  size_t total = 0;
  while (total < kLingerMaxBytes) {
    pollfd p[2] = {{fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    const int r = ::poll(p, 2, PollMillis(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    if (p[1].revents != 0) deadline = absl::InfinitePast();
    if (p[0].revents == 0) break;
    const ssize_t n = ::recv(fd, scratch, sizeof(scratch), MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF, reset, or nothing more (EAGAIN)
    total += static_cast<size_t>(n);
  }
}

absl::Status ValidateOptions(const ServerOptions& o) {
  if (o.port < 0 || o.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("port ", o.port, " outside 0..65535"));
  }
  if (o.max_connections < 1) return absl::InvalidArgumentError("max_connections must be >= 1");
  if (o.reserved_probe_connections < 0) {
    return absl::InvalidArgumentError("reserved_probe_connections must be >= 0");
  }
  if (o.max_connections_per_client < 0) {
    return absl::InvalidArgumentError("max_connections_per_client must be >= 0");
  }
  if (o.max_body_bytes < 0 || o.max_header_bytes < 1 || o.max_headers < 0) {
    return absl::InvalidArgumentError("negative or zero request limits");
  }
  if (o.idle_timeout <= absl::ZeroDuration() || o.read_timeout <= absl::ZeroDuration() ||
      o.write_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("timeouts must be positive");
  }
  return absl::OkStatus();
}

}  // namespace

std::pair<std::string, std::string> DefaultErrorBody(int status, std::string_view message) {
  return {"text/plain; charset=utf-8", absl::StrCat(std::string(message), "\n")};
}

Server::Server(const ServerOptions& options, Router router)
    : options_(options), router_(std::move(router)) {}

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options, Router router) {
  if (absl::Status s = ValidateOptions(options); !s.ok()) return s;
  std::unique_ptr<Server> server(new Server(options, std::move(router)));

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* addrs = nullptr;
  const std::string port = std::to_string(options.port);
  const int gai = ::getaddrinfo(options.host.empty() ? nullptr : options.host.c_str(), port.c_str(),
                                &hints, &addrs);
  if (gai != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve host \"", options.host, "\": ", ::gai_strerror(gai)));
  }
  std::string error = "no address";
  for (addrinfo* a = addrs; a != nullptr && server->listen_fd_ < 0; a = a->ai_next) {
    const int fd =
        ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      error = internal::ErrnoText(errno);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
      error = internal::ErrnoText(errno);
      ::close(fd);
      continue;
    }
    server->listen_fd_ = fd;
  }
  ::freeaddrinfo(addrs);
  if (server->listen_fd_ < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.host, ":", options.port, ": ", error));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  if (::getsockname(server->listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
    return absl::InternalError(absl::StrCat("getsockname: ", internal::ErrnoText(errno)));
  }
  server->port_ =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
  server->wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (server->wake_fd_ < 0) {
    return absl::InternalError(absl::StrCat("eventfd: ", internal::ErrnoText(errno)));
  }
  server->acceptor_ = std::thread(&Server::AcceptLoop, server.get());
  return server;
}

Server::~Server() {
  Shutdown(absl::ZeroDuration());
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

int Server::connections() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(connections_.size());
}

void Server::AcceptLoop() {
  struct Lingering {
    int fd;
    absl::Time deadline;
  };
  std::vector<Lingering> lingering;
  std::vector<pollfd> fds;
  char scratch[4096];
  while (true) {
    ReapFinishedThreads();
    fds.assign({{wake_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}});
    int timeout = kAcceptorTickMs;
    for (const Lingering& l : lingering) {
      fds.push_back({l.fd, POLLIN, 0});
      timeout = std::min(timeout, PollMillis(l.deadline));
    }
    if (::poll(fds.data(), fds.size(), timeout) < 0 && errno != EINTR) {
      ::usleep(10000);  // ENOMEM: try again shortly
      continue;
    }
    if (fds[0].revents != 0) break;  // Shutdown

    // Rejected sockets: drop what the client still sends until it closes or the time is up.
    const absl::Time now = absl::Now();
    for (size_t i = lingering.size(); i-- > 0;) {
      bool done = now >= lingering[i].deadline;
      if (fds[2 + i].revents != 0) {
        const ssize_t n = ::recv(lingering[i].fd, scratch, sizeof(scratch), MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) done = true;
      }
      if (done) {
        ::close(lingering[i].fd);
        lingering.erase(lingering.begin() + static_cast<ptrdiff_t>(i));
      }
    }

    if ((fds[1].revents & POLLIN) == 0) continue;
    for (int k = 0; k < 64; ++k) {  // a batch of pending connections
      sockaddr_storage peer{};
      socklen_t peer_len = sizeof(peer);
      const int fd =
          ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &peer_len, SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          ::usleep(50000);  // out of descriptors: do not spin on the readable listening socket
        }
        break;
      }
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      const std::string client = ClientAddress(peer);
      bool admitted = false;
      std::string_view why = "too many connections";
      {
        absl::MutexLock lock(&mu_);
        const bool client_full = options_.max_connections_per_client > 0 &&
                                 per_client_[client] >= options_.max_connections_per_client;
        if (client_full) why = "too many connections from this client";
        const size_t regular = connections_.size() - static_cast<size_t>(probe_connections_);
        const bool regular_slot =
            !client_full && regular < static_cast<size_t>(options_.max_connections);
        // Every regular slot taken (or this client's share): a reserved probe slot, if one is
        // free. The per-client limit does not apply: a probe may share its address with a flood.
        const bool probe_slot = !regular_slot && !options_.probe_paths.empty() &&
                                probe_connections_ < options_.reserved_probe_connections;
        if (regular_slot || probe_slot) {
          auto conn = std::make_unique<Connection>();
          conn->id = next_id_++;
          conn->fd = fd;
          conn->client = client;
          conn->probe = probe_slot;
          Connection* c = conn.get();
          connections_.emplace(c->id, std::move(conn));
          try {
            // The thread's exit takes mu_, so it cannot finish before `thread` is assigned.
            c->thread = std::thread(&Server::ServeConnection, this, c);
            admitted = true;
            ++per_client_[client];
            if (probe_slot) ++probe_connections_;
          } catch (const std::system_error&) {
            connections_.erase(c->id);  // no thread to spare: answer 503 below
          }
        }
        if (!admitted && per_client_[client] == 0) per_client_.erase(client);
      }
      if (admitted) continue;
      Reject(fd, why);
      if (lingering.size() < kMaxLingeringRejects) {
        ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
        lingering.push_back({fd, absl::Now() + kLingerTime});
      } else {
        ::close(fd);
      }
    }
  }
  for (const Lingering& l : lingering) ::close(l.fd);
}

void Server::Reject(int fd, std::string_view why) {
  SetSendTimeout(fd, absl::Milliseconds(100));  // the acceptor must not block on a slow client
  Responder responder(fd, /*version_minor=*/1, /*keep_alive=*/false);
  SendError(responder, 503, why);
  ::shutdown(fd, SHUT_WR);
}

void Server::SendError(Responder& responder, int status, std::string_view message,
                       const HeaderList& extra_headers) {
  auto [content_type, body] = options_.error_body ? options_.error_body(status, message)
                                                  : DefaultErrorBody(status, message);
  responder.Send(status, content_type, body, extra_headers).IgnoreError();
}

void Server::SendNoRoute(Responder& responder, const Request& request, const std::string& allow) {
  if (allow.empty()) {
    SendError(responder, 404, absl::StrCat("no route for ", request.path));
  } else {
    SendError(responder, 405,
              absl::StrCat("method ", request.method, " not allowed for ", request.path),
              {{"Allow", allow}});
  }
}

void Server::ServeConnection(Connection* conn) {
  const int fd = conn->fd;
  SetSendTimeout(fd, options_.write_timeout);
  const std::string peer = internal::PeerAddress(fd);
  RequestParser parser(ParserLimits{.max_header_bytes = options_.max_header_bytes,
                                    .max_headers = options_.max_headers,
                                    .max_body_bytes = options_.max_body_bytes});
  std::string buffer(kReadChunk, '\0');
  std::optional<absl::Duration> linger;  // set when we answered and close (see kLingerTime)
  bool in_progress = false;
  absl::Time phase_start = absl::Now();  // when the connection went idle / a request began
  while (true) {
    const RequestParser::Result result = parser.Parse();
    if (result == RequestParser::Result::kError) {
      Responder responder(fd, 1, /*keep_alive=*/false, &draining_);
      SendError(responder, parser.error_status(), parser.error_message());
      linger = kLingerTime;
      break;
    }
    if (result == RequestParser::Result::kHeadersComplete) {
      const Request& request = parser.request();
      if (options_.head_check && parser.body_expected()) {
        if (std::optional<HeadRefusal> refusal = options_.head_check(request)) {
          Responder responder(fd, 1, /*keep_alive=*/false, &draining_);
          SendError(responder, refusal->status, refusal->message);
          linger = kLingerTime;
          break;
        }
      }
      if (request.version_minor == 1 && parser.body_expected() &&
          request.headers.HasToken("expect", "100-continue")) {
        std::string allow;
        if (router_.Find(request.method, request.path, &allow) == nullptr) {
          // Answer now instead of asking for a body nobody will read, then close (the client
          // may send the body anyway).
          Responder responder(fd, 1, /*keep_alive=*/false, &draining_);
          SendNoRoute(responder, request, allow);
          linger = kLingerTime;
          break;
        }
        if (!internal::SendAll(fd, {"HTTP/1.1 100 Continue\r\n\r\n"})) break;
      }
      continue;
    }
    if (result == RequestParser::Result::kRequestComplete) {
      Request request = parser.TakeRequest();
      request.peer = peer;
      const bool reusable = Dispatch(conn, request);
      if (!reusable || draining_.load()) {
        linger = kLingerTime;
        break;
      }
      in_progress = false;
      phase_start = absl::Now();
      continue;
    }

    // kNeedMore: wait for bytes, the idle / read timeout, or Shutdown.
    if (draining_.load()) break;
    if (parser.InProgress() != in_progress) {
      in_progress = !in_progress;
      phase_start = absl::Now();
    }
    const absl::Duration limit = in_progress ? options_.read_timeout : options_.idle_timeout;
    const absl::Time deadline =
        phase_start + (conn->probe ? std::min(limit, kProbeTimeout) : limit);
    if (absl::Now() >= deadline) {
      if (in_progress) {
        Responder responder(fd, 1, /*keep_alive=*/false, &draining_);
        SendError(responder, 408, "the request did not arrive in time");
        linger = kLingerTime;
      }
      break;
    }
    pollfd fds[2] = {{fd, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    const int ready = ::poll(fds, 2, PollMillis(deadline));
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    if (fds[1].revents != 0) break;  // Shutdown: not inside a handler, so close
    if (fds[0].revents == 0) continue;
    const ssize_t n = ::recv(fd, buffer.data(), buffer.size(), 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) break;  // the client closed (or reset) the connection
    parser.Feed(std::string_view(buffer.data(), static_cast<size_t>(n)));
  }
  if (linger.has_value()) LingeringClose(fd, wake_fd_, *linger);
  FinishConnection(conn);
}

bool Server::Dispatch(Connection* conn, Request& request) {
  Responder responder(conn->fd, request.version_minor, request.keep_alive, &draining_);
  if (conn->probe) {
    const bool probe_request = request.method == "GET" &&
                               std::find(options_.probe_paths.begin(), options_.probe_paths.end(),
                                         request.path) != options_.probe_paths.end();
    if (!probe_request) {
      SendError(responder, 503, "too many connections", {{"Connection", "close"}});
      return false;
    }
  }
  std::string allow;
  const Handler* handler = router_.Find(request.method, request.path, &allow);
  if (handler == nullptr) {
    SendNoRoute(responder, request, allow);
    return responder.reusable() && !conn->probe;  // a probe slot serves one request
  }
  std::string failure;
  try {
    (*handler)(request, responder);
  } catch (const std::exception& e) {
    failure = absl::StrCat("the handler failed: ", e.what());
  } catch (...) {
    failure = "the handler failed";
  }
  if (!failure.empty()) {
    // A half-sent response cannot be finished: closing tells the client it is truncated.
    if (!responder.responded()) SendError(responder, 500, failure, {{"Connection", "close"}});
    return false;
  }
  if (!responder.responded()) {
    SendError(responder, 500, "the handler returned without a response");
  } else {
    responder.End();
  }
  return responder.reusable() && !conn->probe;  // a probe slot serves one request
}

void Server::FinishConnection(Connection* conn) {
  absl::MutexLock lock(&mu_);
  // The descriptor is closed under mu_ so that Shutdown never shuts down a reused number.
  ::close(conn->fd);
  auto it = connections_.find(conn->id);
  if (auto c = per_client_.find(conn->client); c != per_client_.end() && --c->second <= 0) {
    per_client_.erase(c);
  }
  if (conn->probe) --probe_connections_;
  finished_.push_back(std::move(it->second->thread));
  connections_.erase(it);
}

void Server::ReapFinishedThreads() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    threads.swap(finished_);
  }
  for (std::thread& t : threads) t.join();
}

void Server::Shutdown(absl::Duration grace) {
  absl::MutexLock shutdown_lock(&shutdown_mu_);
  if (shut_down_) return;
  shut_down_ = true;
  draining_.store(true);
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
  }
  if (acceptor_.joinable()) acceptor_.join();
  if (listen_fd_ >= 0) {
    ::close(listen_fd_);
    listen_fd_ = -1;
  }
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    using ConnectionMap = std::map<uint64_t, std::unique_ptr<Connection>>;
    const absl::Condition no_connections(
        +[](ConnectionMap* c) { return c->empty(); }, &connections_);
    if (!mu_.AwaitWithTimeout(no_connections, grace)) {
      // Out of grace: make the remaining handlers' Writes fail and ClientGone() turn true.
      for (const auto& [id, conn] : connections_) ::shutdown(conn->fd, SHUT_RDWR);
      mu_.Await(no_connections);
    }
    threads.swap(finished_);
  }
  for (std::thread& t : threads) t.join();
}

absl::StatusOr<std::unique_ptr<Server>> StartProbeListener(std::string_view address, Router router,
                                                           std::vector<std::string> paths) {
  absl::StatusOr<flags::HostPort> host_port =
      flags::ParseHostPort(absl::string_view(address.data(), address.size()));
  if (!host_port.ok()) return host_port.status();
  ServerOptions options;
  options.host = host_port->host;
  options.port = host_port->port;
  options.max_connections = 64;
  options.max_connections_per_client = 16;
  options.reserved_probe_connections = 8;
  options.probe_paths = std::move(paths);
  options.idle_timeout = kProbeTimeout;
  options.read_timeout = kProbeTimeout;
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(options, std::move(router));
  if (!server.ok()) {
    return absl::Status(server.status().code(),
                        absl::StrCat("metrics port: ", server.status().message()));
  }
  return server;
}

}  // namespace magicpig::http
