// RequestParser: an incremental HTTP/1.x request parser. It is fed bytes as they arrive (any split,
// one byte at a time included) and yields complete requests, in order, or one parse error carrying
// the HTTP status to answer with. It does no I/O, so it can be unit-tested and fuzzed alone.
//
//   RequestParser parser(limits);
//   parser.Feed(bytes_from_socket);
//   for (;;) {
//     switch (parser.Parse()) {
//       case RequestParser::Result::kNeedMore: ...read more, Feed it...
//       case RequestParser::Result::kHeadersComplete: ...parser.request() has the headers;
//                                                     answer "Expect: 100-continue" here...
//       case RequestParser::Result::kRequestComplete: Handle(parser.TakeRequest()); break;
//       case RequestParser::Result::kError: Reply(parser.error_status(), parser.error_message());
//                                           ...and close the connection...
//     }
//   }
//
// What it accepts (RFC 9112) and what it answers otherwise:
// - Request line "METHOD SP TARGET SP HTTP/1.x": METHOD a token; TARGET origin-form ("/p?q"),
//   absolute-form ("http://host/p?q") or "*"; versions HTTP/1.0 and HTTP/1.1. A well-formed other
//   version ("HTTP/2.0" — the HTTP/2 preface —, "HTTP/3.0", "HTTP/0.9") → 505; anything else → 400.
//   Up to 16 empty lines before a request line are skipped (they count toward the header bytes).
// - Header fields "name: value" (name a token, value trimmed of spaces and tabs). obs-fold (a line
//   starting with space or tab), a missing colon, whitespace before the colon, control characters
//   or a bare CR → 400. HTTP/1.1 without exactly one Host field → 400. Lines may end in CRLF or a
//   bare LF.
// - Limits: the request line and header section together at most max_header_bytes bytes, at most
//   max_headers fields → 431 (detected as soon as the bytes arrive, before the section ends).
// - Body: "Transfer-Encoding: chunked" (decoded; chunk extensions and trailer fields are read and
//   ignored) or "Content-Length" (one value, or a repeated identical one). Both present, an
//   invalid or conflicting Content-Length, or a malformed chunk → 400; another transfer coding →
//   501; a body longer than max_body_bytes → 413 (for Content-Length as soon as the header
//   section ends, before any body byte). No framing header: no body.
// After kError the parser stays in error: the connection must be closed (its framing is lost).
//
// Thread-safety: none; one parser belongs to one connection.
#ifndef MAGICPIG_COMMON_HTTP_REQUEST_PARSER_H_
#define MAGICPIG_COMMON_HTTP_REQUEST_PARSER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/http/message.h"

namespace magicpig::http {

struct ParserLimits {
  int64_t max_header_bytes = 16 << 10;  // request line + header fields (+ their line ends)
  int max_headers = 100;                // header fields per request (trailers: the same again)
  int64_t max_body_bytes = 8 << 20;     // decoded body
};

class RequestParser {
 public:
  enum class Result {
    kNeedMore,         // feed more bytes
    kHeadersComplete,  // request() holds the request line and headers, the body is still coming
                       // (returned once per request, even when the body is empty)
    kRequestComplete,  // TakeRequest() returns the request; call Parse() again for the next one
    kError,            // error_status() / error_message(); the parser is done
  };

  explicit RequestParser(ParserLimits limits = {});

  // RequestParser::Feed appends received bytes. It copies them; it never parses.
  void Feed(std::string_view bytes);

  // RequestParser::Parse advances over the fed bytes as far as it can and reports the first event.
  // After kRequestComplete, call TakeRequest() before parsing on (pipelined requests wait in the
  // buffer until then).
  Result Parse();

  // RequestParser::request: the request being parsed (valid from kHeadersComplete on).
  const Request& request() const { return request_; }

  // RequestParser::TakeRequest moves the complete request out and starts the next one.
  Request TakeRequest();

  // RequestParser::InProgress: whether some bytes of a next request have been fed (and not
  // consumed by a complete request). A server uses it to tell an idle keep-alive connection from a
  // slow request.
  bool InProgress() const;

  // RequestParser::body_expected: after kHeadersComplete, whether the request has a body to come
  // (Content-Length > 0 or chunked) that has not been fully fed yet.
  bool body_expected() const;

  int error_status() const { return error_status_; }
  const std::string& error_message() const { return error_message_; }

 private:
  enum class State {
    kRequestLine,
    kHeaderLines,
    kHeadersDone,  // kHeadersComplete reported; the body comes next
    kBody,         // Content-Length body
    kChunkSize,
    kChunkData,
    kChunkDataEnd,  // the CRLF after a chunk's data
    kTrailers,
    kComplete,  // kRequestComplete reported; waiting for TakeRequest
    kError,
  };

  Result Fail(int status, std::string message);
  // Takes the next complete line (without its CRLF / LF) out of the buffer. false: no complete
  // line yet. A line containing a bare CR sets *bad.
  bool NextLine(std::string_view* line, bool* bad);
  Result OnRequestLine(std::string_view line);
  Result OnHeaderLine(std::string_view line);
  Result OnHeadersEnd();
  Result OnChunkSizeLine(std::string_view line);
  // Bytes of the current unterminated line (for the limits).
  size_t PendingLineBytes() const { return buffer_.size() - pos_; }
  void Compact();

  ParserLimits limits_;
  State state_ = State::kRequestLine;
  std::string buffer_;
  size_t pos_ = 0;   // first unconsumed byte of buffer_
  size_t scan_ = 0;  // where the search for the next '\n' resumes (>= pos_)
  Request request_;
  int64_t header_bytes_ = 0;  // of the current request's head (or trailer section)
  int header_count_ = 0;
  int empty_lines_ = 0;
  int64_t body_remaining_ = 0;  // Content-Length bytes / bytes of the current chunk left
  bool chunked_ = false;
  int error_status_ = 0;
  std::string error_message_;
};

}  // namespace magicpig::http

#endif  // MAGICPIG_COMMON_HTTP_REQUEST_PARSER_H_
