// RawClient: a blocking test client (test_client.h).
#include "common/http/test_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace magicpig::http {
namespace {

int Millis(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, INT_MAX));
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

absl::StatusOr<RawClient> RawClient::Connect(int port, const std::string& host,
                                             const std::string& source) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("socket failed");
  if (!source.empty()) {
    sockaddr_in from{};
    from.sin_family = AF_INET;
    if (::inet_pton(AF_INET, source.c_str(), &from.sin_addr) != 1 ||
        ::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0) {
      ::close(fd);
      return absl::InvalidArgumentError(absl::StrCat("cannot bind source address ", source));
    }
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("not an IPv4 address: ", host));
  }
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("connect: errno ", err));
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return RawClient(fd);
}

RawClient::RawClient(RawClient&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), buffer_(std::move(other.buffer_)) {}

RawClient& RawClient::operator=(RawClient&& other) noexcept {
  if (this != &other) {
    Close();
    fd_ = std::exchange(other.fd_, -1);
    buffer_ = std::move(other.buffer_);
  }
  return *this;
}

RawClient::~RawClient() { Close(); }

void RawClient::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void RawClient::ShutdownWrite() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_WR);
}

absl::Status RawClient::Send(std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::UnavailableError(absl::StrCat("send: errno ", errno));
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::Status RawClient::Fill(absl::Time deadline) {
  while (true) {
    pollfd p{fd_, POLLIN, 0};
    const int r = ::poll(&p, 1, Millis(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) return absl::DeadlineExceededError("no response in time");
    char buf[8192];
    const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::UnavailableError("connection closed");
    buffer_.append(buf, static_cast<size_t>(n));
    return absl::OkStatus();
  }
}

absl::StatusOr<std::string> RawClient::ReadLine(absl::Time deadline) {
  size_t nl;
  while ((nl = buffer_.find("\r\n")) == std::string::npos) {
    if (absl::Status s = Fill(deadline); !s.ok()) return s;
  }
  std::string line = buffer_.substr(0, nl);
  buffer_.erase(0, nl + 2);
  return line;
}

absl::StatusOr<std::string> RawClient::ReadExact(size_t n, absl::Time deadline) {
  while (buffer_.size() < n) {
    if (absl::Status s = Fill(deadline); !s.ok()) return s;
  }
  std::string out = buffer_.substr(0, n);
  buffer_.erase(0, n);
  return out;
}

absl::StatusOr<ClientResponse> RawClient::ReadResponse(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  ClientResponse r;
  absl::StatusOr<std::string> line = ReadLine(deadline);
  if (!line.ok()) return line.status();
  // "HTTP/1.1 200 OK"
  if (line->size() < 12 || line->compare(0, 5, "HTTP/") != 0 || (*line)[8] != ' ' ||
      !absl::SimpleAtoi(line->substr(9, 3), &r.status)) {
    return absl::DataLossError(absl::StrCat("bad status line: ", *line));
  }
  r.reason = line->size() > 13 ? line->substr(13) : "";
  while (true) {
    line = ReadLine(deadline);
    if (!line.ok()) return line.status();
    if (line->empty()) break;
    const size_t colon = line->find(':');
    if (colon == std::string::npos) return absl::DataLossError("bad header line: " + *line);
    r.headers.Add(line->substr(0, colon),
                  std::string(Trim(std::string_view(*line).substr(colon + 1))));
  }
  if (r.status < 200 || r.status == 204 || r.status == 304) return r;
  if (r.headers.HasToken("transfer-encoding", "chunked")) {
    r.chunked = true;
    while (true) {
      line = ReadLine(deadline);
      if (!line.ok()) return line.status();
      size_t size = 0;
      if (!absl::SimpleHexAtoi(line->substr(0, line->find(';')), &size)) {
        return absl::DataLossError("bad chunk size: " + *line);
      }
      if (size == 0) break;
      absl::StatusOr<std::string> data = ReadExact(size + 2, deadline);
      if (!data.ok()) return data.status();
      if (data->substr(size) != "\r\n") return absl::DataLossError("chunk without CRLF");
      data->resize(size);
      r.body += *data;
      r.chunks.push_back(std::move(*data));
    }
    while (true) {  // trailers
      line = ReadLine(deadline);
      if (!line.ok()) return line.status();
      if (line->empty()) break;
    }
    return r;
  }
  if (const std::string* cl = r.headers.Find("content-length")) {
    size_t n = 0;
    if (!absl::SimpleAtoi(*cl, &n)) return absl::DataLossError("bad Content-Length");
    absl::StatusOr<std::string> body = ReadExact(n, deadline);
    if (!body.ok()) return body.status();
    r.body = std::move(*body);
    return r;
  }
  // Delimited by the end of the connection.
  r.closed_delimited = true;
  while (true) {
    absl::Status s = Fill(deadline);
    if (absl::IsUnavailable(s)) break;
    if (!s.ok()) return s;
  }
  r.body = std::move(buffer_);
  buffer_.clear();
  return r;
}

bool RawClient::WaitClosed(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  buffer_.clear();
  while (true) {
    absl::Status s = Fill(deadline);
    buffer_.clear();
    if (absl::IsUnavailable(s)) return true;
    if (!s.ok()) return false;
  }
}

std::string RawClient::ReadAvailable(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (buffer_.empty()) {
    if (!Fill(deadline).ok()) break;
  }
  // And whatever else is already readable, without waiting.
  char buf[8192];
  ssize_t n;
  while ((n = ::recv(fd_, buf, sizeof(buf), MSG_DONTWAIT)) > 0) {
    buffer_.append(buf, static_cast<size_t>(n));
  }
  return std::exchange(buffer_, std::string());
}

std::string HttpRequest(std::string_view method, std::string_view target, std::string_view body,
                        const std::vector<std::string>& extra_headers) {
  std::string out = absl::StrCat(std::string(method), " ", std::string(target),
                                 " HTTP/1.1\r\nHost: localhost\r\n");
  if (!body.empty() || method == "POST") {
    absl::StrAppend(&out, "Content-Length: ", body.size(), "\r\n");
  }
  for (const std::string& h : extra_headers) absl::StrAppend(&out, h, "\r\n");
  absl::StrAppend(&out, "\r\n", std::string(body));
  return out;
}

}  // namespace magicpig::http
