// POSIX socket helpers for common/http (socket_internal.h).
#include "common/http/socket_internal.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace magicpig::http::internal {

bool SendAll(int fd, std::initializer_list<std::string_view> pieces, bool nonblocking) {
  std::vector<iovec> iov;
  iov.reserve(pieces.size());
  for (std::string_view p : pieces) {
    if (!p.empty()) iov.push_back({const_cast<char*>(p.data()), p.size()});
  }
  size_t first = 0;
  const int flags = MSG_NOSIGNAL | (nonblocking ? MSG_DONTWAIT : 0);
  while (first < iov.size()) {
    msghdr msg{};
    msg.msg_iov = iov.data() + first;
    msg.msg_iovlen = std::min<size_t>(iov.size() - first, IOV_MAX);
    const ssize_t n = ::sendmsg(fd, &msg, flags);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;  // EPIPE, ECONNRESET, EAGAIN (timeout or full buffer), ...
    }
    size_t left = static_cast<size_t>(n);
    while (first < iov.size() && left >= iov[first].iov_len) {
      left -= iov[first].iov_len;
      ++first;
    }
    if (left > 0) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
  return true;
}

bool PeerHungUp(int fd) {
  pollfd p{};
  p.fd = fd;
  p.events = POLLRDHUP;
  while (true) {
    const int r = ::poll(&p, 1, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return true;
    return r > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
  }
}

std::string PeerAddress(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "";
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    if (::inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text)) == nullptr) return "";
    return absl::StrCat(text, ":", ntohs(a->sin_port));
  }
  if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    if (::inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text)) == nullptr) return "";
    return absl::StrCat("[", text, "]:", ntohs(a->sin6_port));
  }
  return "";
}

std::string ErrnoText(int err) {
  char buf[256];
  // GNU strerror_r returns the message (possibly not in buf).
  const char* msg = ::strerror_r(err, buf, sizeof(buf));
  return absl::StrCat(msg, " (errno ", err, ")");
}

}  // namespace magicpig::http::internal
