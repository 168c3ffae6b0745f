// Internal to common/http: small POSIX socket helpers shared by the server and the Responder.
// Not part of the library's API.
//
// Thread-safety: the functions keep no state; concurrent calls on different descriptors are fine.
#ifndef MAGICPIG_COMMON_HTTP_SOCKET_INTERNAL_H_
#define MAGICPIG_COMMON_HTTP_SOCKET_INTERNAL_H_

#include <initializer_list>
#include <string>
#include <string_view>

namespace magicpig::http::internal {

// SendAll writes every piece in order with sendmsg(MSG_NOSIGNAL), resuming after partial writes
// and EINTR. false when the peer is gone or the send timed out (SO_SNDTIMEO); with
// `nonblocking`, also when the socket buffer is full (MSG_DONTWAIT).
bool SendAll(int fd, std::initializer_list<std::string_view> pieces, bool nonblocking = false);

// PeerHungUp: whether the peer closed or reset the connection, without blocking (poll with
// POLLRDHUP and a zero timeout).
bool PeerHungUp(int fd);

// PeerAddress: "1.2.3.4:port" or "[::1]:port" of a connected socket; "" when unknown.
std::string PeerAddress(int fd);

// ErrnoText: "strerror text (errno N)".
std::string ErrnoText(int err);

}  // namespace magicpig::http::internal

#endif  // MAGICPIG_COMMON_HTTP_SOCKET_INTERNAL_H_
