// Responder: response framing and sending (responder.h).
#include "common/http/responder.h"

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/http/socket_internal.h"

namespace magicpig::http {
namespace {

// IMF-fixdate (RFC 9110 §5.6.7): "Sun, 06 Nov 1994 08:49:37 GMT".
std::string HttpDate() {
  return absl::FormatTime("%a, %d %b %Y %H:%M:%S GMT", absl::Now(), absl::UTCTimeZone());
}

}  // namespace

Responder::Responder(int fd, int version_minor, bool keep_alive, const std::atomic<bool>* draining)
    : fd_(fd), version_minor_(version_minor), keep_alive_(keep_alive), draining_(draining) {}

absl::Status Responder::Begin(int status, std::string_view content_type,
                              const HeaderList& extra_headers, bool stream, size_t content_length,
                              std::string* head) {
  if (responded_) return absl::FailedPreconditionError("a response was already started");
  if (status < 200 || status > 599) {
    return absl::InvalidArgumentError(absl::StrCat("status ", status, " is not a final status"));
  }
  const bool no_body = status == 204 || status == 304;
  if (no_body && (stream || content_length > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("status ", status, " cannot carry a body"));
  }
  if (!IsFieldValue(content_type)) return absl::InvalidArgumentError("malformed content type");
  bool close = !keep_alive_ || (draining_ != nullptr && draining_->load());
  for (const auto& [name, value] : extra_headers) {
    if (!IsToken(name) || !IsFieldValue(value)) {
      return absl::InvalidArgumentError(absl::StrCat("malformed header \"", name, "\""));
    }
    if (EqualsIgnoreCase(name, "content-length") || EqualsIgnoreCase(name, "transfer-encoding")) {
      return absl::InvalidArgumentError(absl::StrCat("header ", name, " is set by the server"));
    }
    if (EqualsIgnoreCase(name, "connection")) {
      if (!EqualsIgnoreCase(value, "close")) {
        return absl::InvalidArgumentError("only \"Connection: close\" may be set by a handler");
      }
      close = true;
    }
  }
  if (stream && version_minor_ == 0) close = true;  // the end of the stream is the end of the data

  absl::StrAppend(head, "HTTP/1.1 ", status, " ", std::string(ReasonPhrase(status)), "\r\n");
  if (!content_type.empty()) {
    absl::StrAppend(head, "Content-Type: ", std::string(content_type), "\r\n");
  }
  if (stream) {
    if (version_minor_ == 1) absl::StrAppend(head, "Transfer-Encoding: chunked\r\n");
  } else if (!no_body) {
    absl::StrAppend(head, "Content-Length: ", content_length, "\r\n");
  }
  absl::StrAppend(head, "Date: ", HttpDate(), "\r\nServer: magicpig\r\n");
  for (const auto& [name, value] : extra_headers) {
    if (!EqualsIgnoreCase(name, "connection")) absl::StrAppend(head, name, ": ", value, "\r\n");
  }
  if (close) {
    absl::StrAppend(head, "Connection: close\r\n");
  } else if (version_minor_ == 0) {
    absl::StrAppend(head, "Connection: keep-alive\r\n");
  }
  absl::StrAppend(head, "\r\n");

  responded_ = true;
  close_after_ = close;
  streaming_ = stream;
  chunked_ = stream && version_minor_ == 1;
  return absl::OkStatus();
}

bool Responder::SendPieces(std::initializer_list<std::string_view> pieces) {
  if (gone_.load()) return false;
  if (!internal::SendAll(fd_, pieces)) {
    gone_.store(true);
    return false;
  }
  return true;
}

absl::Status Responder::Send(int status, std::string_view content_type, std::string_view body,
                             const HeaderList& extra_headers) {
  std::string head;
  if (absl::Status s =
          Begin(status, content_type, extra_headers, /*stream=*/false, body.size(), &head);
      !s.ok()) {
    return s;
  }
  if (!SendPieces({head, body})) return absl::UnavailableError("the client is gone");
  return absl::OkStatus();
}

absl::Status Responder::StartStream(int status, std::string_view content_type,
                                    const HeaderList& extra_headers) {
  std::string head;
  if (absl::Status s = Begin(status, content_type, extra_headers, /*stream=*/true, 0, &head);
      !s.ok()) {
    return s;
  }
  if (!SendPieces({head})) return absl::UnavailableError("the client is gone");
  return absl::OkStatus();
}

bool Responder::Write(std::string_view data) {
  if (!streaming_ || ended_) return false;
  if (data.empty()) return !gone_.load();
  if (!chunked_) return SendPieces({data});
  char size_line[24];
  const int n = snprintf(size_line, sizeof(size_line), "%zx\r\n", data.size());
  return SendPieces({std::string_view(size_line, static_cast<size_t>(n)), data, "\r\n"});
}

void Responder::End() {
  if (!streaming_ || ended_) return;
  ended_ = true;
  if (chunked_) SendPieces({"0\r\n\r\n"});
}

bool Responder::ClientGone() const {
  if (gone_.load()) return true;
  return internal::PeerHungUp(fd_);
}

}  // namespace magicpig::http
