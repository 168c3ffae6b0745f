// RawClient: a minimal blocking HTTP/1.1 client over a TCP socket, for tests of the server and
// of handlers. It sends exactly the bytes it is given (so tests can send malformed, pipelined or
// byte-at-a-time requests) and parses responses strictly: status line, headers, and a body framed
// by Content-Length, chunked transfer coding (kept chunk by chunk) or the end of the connection.
// Test-only (magicpig_http_test_client); never linked into production code.
//
//   ASSERT_OK_AND_ASSIGN(RawClient c, RawClient::Connect(server->port()));
//   ASSERT_TRUE(c.Send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").ok());
//   absl::StatusOr<ClientResponse> r = c.ReadResponse();
//
// Thread-safety: none; one thread per client.
#ifndef MAGICPIG_COMMON_HTTP_TEST_CLIENT_H_
#define MAGICPIG_COMMON_HTTP_TEST_CLIENT_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/http/message.h"

namespace magicpig::http {

struct ClientResponse {
  int status = 0;
  std::string reason;
  Headers headers;
  std::string body;                 // de-chunked
  bool chunked = false;             // Transfer-Encoding: chunked
  std::vector<std::string> chunks;  // the chunks as received (chunked only)
  bool closed_delimited = false;    // the body ended with the connection
};

class RawClient {
 public:
  // RawClient::Connect opens a TCP connection to host:port (IPv4 literal), from `source` (an IPv4
  // literal to bind, e.g. 127.0.0.2 to appear as another loopback client) when not empty.
  static absl::StatusOr<RawClient> Connect(int port, const std::string& host = "127.0.0.1",
                                           const std::string& source = "");
  RawClient(RawClient&& other) noexcept;
  RawClient& operator=(RawClient&& other) noexcept;
  ~RawClient();

  // RawClient::Send writes all of `bytes`. UNAVAILABLE when the server is gone.
  absl::Status Send(std::string_view bytes);

  // RawClient::ReadResponse reads one response (an interim "100 Continue" is one response too).
  // DEADLINE_EXCEEDED after `timeout`; UNAVAILABLE when the connection ends before a complete
  // response; DATA_LOSS for a malformed one.
  absl::StatusOr<ClientResponse> ReadResponse(absl::Duration timeout = absl::Seconds(10));

  // RawClient::WaitClosed: whether the server closes the connection (EOF or reset) within
  // `timeout`; bytes that arrive meanwhile are discarded.
  bool WaitClosed(absl::Duration timeout = absl::Seconds(5));

  // RawClient::ReadAvailable waits up to `timeout` for some bytes and returns them with whatever
  // else is readable at once (already buffered bytes first); "" when none arrived.
  std::string ReadAvailable(absl::Duration timeout);

  // Half-close (no more requests) and close.
  void ShutdownWrite();
  void Close();

  int fd() const { return fd_; }

 private:
  explicit RawClient(int fd) : fd_(fd) {}
  // Reads more bytes into buffer_ before `deadline`. OK, DEADLINE_EXCEEDED or UNAVAILABLE (EOF).
  absl::Status Fill(absl::Time deadline);
  absl::StatusOr<std::string> ReadLine(absl::Time deadline);
  absl::StatusOr<std::string> ReadExact(size_t n, absl::Time deadline);

  int fd_ = -1;
  std::string buffer_;
};

// HttpRequest: "METHOD target HTTP/1.1" with Host, Content-Length (for a non-empty body or a
// POST) and `extra_headers` (full lines without CRLF, "Connection: close").
std::string HttpRequest(std::string_view method, std::string_view target,
                        std::string_view body = "",
                        const std::vector<std::string>& extra_headers = {});

}  // namespace magicpig::http

#endif  // MAGICPIG_COMMON_HTTP_TEST_CLIENT_H_
