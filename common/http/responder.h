// Responder: how a handler answers one HTTP request: a whole response with Content-Length
// framing, or a stream (Server-Sent Events) written piece by piece as it is produced.
//
//   void Completions(const Request& request, Responder& responder) {
//     if (!stream) { responder.Send(200, "application/json", body).IgnoreError(); return; }
//     if (!responder.StartStream(200, "text/event-stream").ok()) return;
//     while (generating) {
//       if (!responder.Write("data: {...}\n\n")) { CancelGeneration(); return; }  // client gone
//     }
//     responder.Write("data: [DONE]\n\n");
//     responder.End();
//   }
//
// A stream to an HTTP/1.1 client uses "Transfer-Encoding: chunked", one chunk per Write, each
// sent at once (the socket has TCP_NODELAY, so small events are not held back); to an HTTP/1.0
// client it has no framing and the connection closes after End(). A handler waiting for a long
// result without writing can poll ClientGone() to stop work for a client that disconnected.
//
// A handler that returns without responding gets a 500; one that returns with an open stream has
// it ended for it. Sends never raise SIGPIPE (MSG_NOSIGNAL); a send that cannot progress for
// ServerOptions::write_timeout (a client that stopped reading) fails like a vanished client.
//
// Thread-safety: Send, StartStream, Write and End must not be called concurrently (one thread at
// a time; the handler may hand the Responder to another thread while it waits). ClientGone may be
// called from any thread at any time. The Responder lives until the handler returns; it must not
// be used after that.
#ifndef MAGICPIG_COMMON_HTTP_RESPONDER_H_
#define MAGICPIG_COMMON_HTTP_RESPONDER_H_

#include <atomic>
#include <cstddef>
#include <initializer_list>
#include <string_view>

#include "absl/status/status.h"
#include "common/http/message.h"

namespace magicpig::http {

class Responder {
 public:
  // Made by the server for each request (tests may make one over a socketpair): `fd` is the
  // connection (not owned), `version_minor` / `keep_alive` come from the Request (a parse-error
  // response passes 1 / false). While `*draining` is true (the server shuts down) responses carry
  // "Connection: close".
  Responder(int fd, int version_minor, bool keep_alive,
            const std::atomic<bool>* draining = nullptr);
  Responder(const Responder&) = delete;
  Responder& operator=(const Responder&) = delete;

  // Responder::Send sends a complete response: status line, Content-Type (omitted when empty),
  // Content-Length, Date, Server, `extra_headers`, and the body, in one write.
  // `extra_headers` must not frame the message (Content-Length, Transfer-Encoding) and may hold
  // "Connection: close" to close the connection after this response. FAILED_PRECONDITION when a
  // response was already started, INVALID_ARGUMENT for a status outside 200..599, a body with 204
  // / 304, or a malformed or framing extra header; UNAVAILABLE when the client is gone.
  absl::Status Send(int status, std::string_view content_type, std::string_view body,
                    const HeaderList& extra_headers = {});

  // Responder::StartStream sends the status line and headers of a streamed response at once.
  // Errors as for Send (204 / 304 cannot stream).
  absl::Status StartStream(int status, std::string_view content_type,
                           const HeaderList& extra_headers = {});

  // Responder::Write sends `data` as one chunk and flushes it. true: handed to the kernel; false:
  // no stream is open, or the client is gone (EPIPE / ECONNRESET / write timeout) — from then on
  // every Write returns false and ClientGone() is true. Empty data sends nothing and returns
  // whether the stream is still usable.
  bool Write(std::string_view data);

  // Responder::End finishes an open stream (the last chunk, or the end of an HTTP/1.0 stream).
  // Idempotent; does nothing without a stream.
  void End();

  // Responder::ClientGone: whether the peer closed or reset the connection (or a send failed). It
  // does not block: it polls the socket for a hang-up (POLLRDHUP). A client that only half-closed
  // its side and still waits for the response looks the same until a write fails: a handler that
  // must serve such clients writes something harmless and checks Write's result (ApiServer).
  bool ClientGone() const;

  // Whether a response (complete or streamed) has been started.
  bool responded() const { return responded_; }
  // Whether the connection can carry another request after this response.
  bool reusable() const { return responded_ && !close_after_ && !gone_.load(); }

 private:
  absl::Status Begin(int status, std::string_view content_type, const HeaderList& extra_headers,
                     bool stream, size_t content_length, std::string* head);
  bool SendPieces(std::initializer_list<std::string_view> pieces);

  const int fd_;
  const int version_minor_;
  const bool keep_alive_;
  const std::atomic<bool>* const draining_;
  bool responded_ = false;
  bool streaming_ = false;
  bool chunked_ = false;
  bool ended_ = false;
  bool close_after_ = false;
  std::atomic<bool> gone_{false};
};

}  // namespace magicpig::http

#endif  // MAGICPIG_COMMON_HTTP_RESPONDER_H_
