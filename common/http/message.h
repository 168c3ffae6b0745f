// HTTP/1.1 message pieces shared by the request parser, the server and its handlers: a header list
// with case-insensitive lookup, the parsed Request, status reason phrases and the RFC 9110 token /
// field-value character rules.
//
//   const std::string* auth = request.headers.Find("authorization");
//   if (auth == nullptr) ...
//
// Thread-safety: plain values. Const methods may be called concurrently; anything else needs
// external synchronisation.
#ifndef MAGICPIG_COMMON_HTTP_MESSAGE_H_
#define MAGICPIG_COMMON_HTTP_MESSAGE_H_

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace magicpig::http {

// Extra response headers a handler passes to Responder::Send / StartStream: (name, value) pairs.
using HeaderList = std::vector<std::pair<std::string, std::string>>;

// Headers: the header fields of one message in arrival order. Names keep their original spelling;
// lookups compare them case-insensitively (RFC 9110 §5.1).
class Headers {
 public:
  // Headers::Add appends one field; an existing field with the same name is kept (Find returns the
  // first one, FindAll both).
  void Add(std::string name, std::string value);

  // Headers::Find returns the value of the first field named `name` (any case), or nullptr.
  const std::string* Find(std::string_view name) const;

  // Headers::FindAll returns the values of every field named `name`, in arrival order.
  std::vector<std::string_view> FindAll(std::string_view name) const;

  // Headers::HasToken: whether a comma-separated list header (Connection, Expect,
  // Transfer-Encoding) named `name` holds `token`, both compared case-insensitively, in any of its
  // fields.
  bool HasToken(std::string_view name, std::string_view token) const;

  size_t size() const { return fields_.size(); }
  bool empty() const { return fields_.empty(); }
  const HeaderList& fields() const { return fields_; }

 private:
  HeaderList fields_;
};

// Request: one complete request as RequestParser yields it and handlers see it.
struct Request {
  std::string method;      // as sent; methods are case-sensitive ("GET", "POST")
  std::string target;      // the request-target as sent: "/v1/completions?x=1"
  std::string path;        // target up to '?', not percent-decoded ("/v1/completions"); for an
                           // absolute-form target ("http://host/p?q") the path part ("/p")
  std::string query;       // after '?', without it; empty when there is none
  int version_minor = 1;   // HTTP/1.<version_minor>: 0 or 1
  bool keep_alive = true;  // the client lets the connection stay open after the response:
                           // HTTP/1.1 unless "Connection: close"; HTTP/1.0 only with
                           // "Connection: keep-alive"
  Headers headers;
  std::string body;  // de-chunked for Transfer-Encoding: chunked
  std::string peer;  // "127.0.0.1:54321" / "[::1]:54321"; set by the server, empty from the parser
};

// ReasonPhrase: the reason phrase of a status code ("Not Found"); "Unknown" for codes it does not
// list. Covers at least 100, 200, 201, 204, 400, 401, 403, 404, 405, 408, 409, 411, 413, 415, 417,
// 422, 429, 431, 500, 501, 502, 503, 504, 505.
std::string_view ReasonPhrase(int status);

// IsTokenChar / IsToken: RFC 9110 tchar / token (methods, header names).
bool IsTokenChar(char c);
bool IsToken(std::string_view s);

// IsFieldValue: whether `s` may be sent as a header field value: no CR, LF or NUL and no other
// control character but HTAB (obs-text bytes >= 0x80 allowed).
bool IsFieldValue(std::string_view s);

// EqualsIgnoreCase: ASCII case-insensitive equality.
bool EqualsIgnoreCase(std::string_view a, std::string_view b);

}  // namespace magicpig::http

#endif  // MAGICPIG_COMMON_HTTP_MESSAGE_H_
