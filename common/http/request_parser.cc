// Incremental HTTP/1.x request parser (request_parser.h).
#include "common/http/request_parser.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace magicpig::http {
namespace {

constexpr int kMaxLeadingEmptyLines = 16;
constexpr size_t kMaxChunkSizeLine = 1024;  // hex size + chunk extensions
constexpr size_t kCompactThreshold = 64 << 10;

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string_view TrimOws(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Splits a comma-separated list into its non-empty trimmed items (RFC 9110 §5.6.1).
std::vector<std::string_view> ListItems(std::string_view value) {
  std::vector<std::string_view> items;
  while (true) {
    const size_t comma = value.find(',');
    std::string_view item = TrimOws(value.substr(0, comma));
    if (!item.empty()) items.push_back(item);
    if (comma == std::string_view::npos) break;
    value.remove_prefix(comma + 1);
  }
  return items;
}

bool IsVisibleAscii(std::string_view s) {
  for (char c : s) {
    if (c <= 0x20 || c >= 0x7f) return false;
  }
  return true;
}

}  // namespace

RequestParser::RequestParser(ParserLimits limits) : limits_(limits) {}

void RequestParser::Feed(std::string_view bytes) {
  if (state_ == State::kError) return;
  Compact();
  buffer_.append(bytes.data(), bytes.size());
}

void RequestParser::Compact() {
  if (pos_ == buffer_.size()) {
    buffer_.clear();
    pos_ = scan_ = 0;
  } else if (pos_ >= kCompactThreshold && pos_ * 2 >= buffer_.size()) {
    buffer_.erase(0, pos_);
    scan_ -= pos_;
    pos_ = 0;
  }
}

RequestParser::Result RequestParser::Fail(int status, std::string message) {
  state_ = State::kError;
  error_status_ = status;
  error_message_ = std::move(message);
  buffer_.clear();
  pos_ = scan_ = 0;
  return Result::kError;
}

bool RequestParser::NextLine(std::string_view* line, bool* bad) {
  const size_t nl = buffer_.find('\n', std::max(scan_, pos_));
  if (nl == std::string::npos) {
    scan_ = buffer_.size();
    return false;
  }
  std::string_view l(buffer_.data() + pos_, nl - pos_);
  if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
  *bad = l.find('\r') != std::string_view::npos;
  *line = l;
  pos_ = scan_ = nl + 1;
  return true;
}

bool RequestParser::InProgress() const {
  return state_ != State::kRequestLine || pos_ < buffer_.size() || empty_lines_ > 0;
}

bool RequestParser::body_expected() const {
  if (chunked_) return true;
  return body_remaining_ > static_cast<int64_t>(buffer_.size() - pos_);
}

Request RequestParser::TakeRequest() {
  Request out = std::move(request_);
  request_ = Request();
  if (state_ == State::kComplete) state_ = State::kRequestLine;
  header_bytes_ = 0;
  header_count_ = 0;
  empty_lines_ = 0;
  body_remaining_ = 0;
  chunked_ = false;
  Compact();
  return out;
}

RequestParser::Result RequestParser::Parse() {
  while (true) {
    switch (state_) {
      case State::kRequestLine:
      case State::kHeaderLines:
      case State::kTrailers: {
        std::string_view line;
        bool bad = false;
        const size_t start = pos_;
        if (!NextLine(&line, &bad)) {
          if (header_bytes_ + static_cast<int64_t>(PendingLineBytes()) > limits_.max_header_bytes) {
            return Fail(431, "request header section too large");
          }
          return Result::kNeedMore;
        }
        header_bytes_ += static_cast<int64_t>(pos_ - start);
        if (header_bytes_ > limits_.max_header_bytes) {
          return Fail(431, "request header section too large");
        }
        if (bad) return Fail(400, "bare CR in the request head");
        Result r;
        if (state_ == State::kRequestLine) {
          r = OnRequestLine(line);
        } else if (state_ == State::kHeaderLines) {
          r = OnHeaderLine(line);
        } else if (line.empty()) {
          state_ = State::kComplete;
          return Result::kRequestComplete;
        } else {
          r = OnHeaderLine(line);  // a trailer field: checked like a header, then dropped
        }
        if (r != Result::kNeedMore) return r;
        break;
      }
      case State::kHeadersDone:
        if (chunked_) {
          state_ = State::kChunkSize;
        } else if (body_remaining_ > 0) {
          state_ = State::kBody;
        } else {
          state_ = State::kComplete;
          return Result::kRequestComplete;
        }
        break;
      case State::kBody:
      case State::kChunkData: {
        const size_t avail = buffer_.size() - pos_;
        const size_t n = static_cast<size_t>(std::min<int64_t>(body_remaining_, avail));
        request_.body.append(buffer_.data() + pos_, n);
        pos_ += n;
        scan_ = pos_;
        body_remaining_ -= static_cast<int64_t>(n);
        if (body_remaining_ > 0) return Result::kNeedMore;
        if (state_ == State::kBody) {
          state_ = State::kComplete;
          return Result::kRequestComplete;
        }
        state_ = State::kChunkDataEnd;
        break;
      }
      case State::kChunkDataEnd: {
        const size_t avail = buffer_.size() - pos_;
        if (avail == 0) return Result::kNeedMore;
        if (buffer_[pos_] == '\n') {
          pos_ += 1;
        } else if (buffer_[pos_] == '\r') {
          if (avail < 2) return Result::kNeedMore;
          if (buffer_[pos_ + 1] != '\n') return Fail(400, "chunk data not followed by CRLF");
          pos_ += 2;
        } else {
          return Fail(400, "chunk data not followed by CRLF");
        }
        scan_ = pos_;
        state_ = State::kChunkSize;
        break;
      }
      case State::kChunkSize: {
        std::string_view line;
        bool bad = false;
        if (!NextLine(&line, &bad)) {
          // (+1: the CR of a line that is exactly at the limit)
          if (PendingLineBytes() > kMaxChunkSizeLine + 1) {
            return Fail(400, "chunk size line too long");
          }
          return Result::kNeedMore;
        }
        if (bad || line.size() > kMaxChunkSizeLine) return Fail(400, "malformed chunk size line");
        const Result r = OnChunkSizeLine(line);
        if (r != Result::kNeedMore) return r;
        break;
      }
      case State::kComplete:
        return Result::kRequestComplete;
      case State::kError:
        return Result::kError;
    }
  }
}

RequestParser::Result RequestParser::OnRequestLine(std::string_view line) {
  if (line.empty()) {
    if (++empty_lines_ > kMaxLeadingEmptyLines) return Fail(400, "too many empty lines");
    return Result::kNeedMore;
  }
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos) {
    return Fail(400, "malformed request line");
  }
  const std::string_view method = line.substr(0, sp1);
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = line.substr(sp2 + 1);
  if (!IsToken(method)) return Fail(400, "malformed request method");
  if (version.size() != 8 || version.substr(0, 5) != "HTTP/" || !IsDigit(version[5]) ||
      version[6] != '.' || !IsDigit(version[7])) {
    return Fail(400, "malformed HTTP version");
  }
  if (version[5] != '1' || (version[7] != '0' && version[7] != '1')) {
    return Fail(505, absl::StrCat("HTTP version ", std::string(version), " is not supported"));
  }
  if (target.empty() || !IsVisibleAscii(target)) return Fail(400, "malformed request target");
  std::string_view path_and_query;
  if (target[0] == '/' || target == "*") {
    path_and_query = target;
  } else {
    // absolute-form: scheme "://" authority [path-abempty] ["?" query]
    const size_t scheme_end = target.find("://");
    if (scheme_end == std::string_view::npos ||
        !(EqualsIgnoreCase(target.substr(0, scheme_end), "http") ||
          EqualsIgnoreCase(target.substr(0, scheme_end), "https"))) {
      return Fail(400, "malformed request target");
    }
    const std::string_view rest = target.substr(scheme_end + 3);
    const size_t path_start = rest.find_first_of("/?");
    if (path_start == 0) return Fail(400, "malformed request target");
    path_and_query = path_start == std::string_view::npos ? "/" : rest.substr(path_start);
  }
  const size_t q = path_and_query.find('?');
  request_.method = std::string(method);
  request_.target = std::string(target);
  request_.path = std::string(path_and_query.substr(0, q));
  if (request_.path.empty()) request_.path.push_back('/');  // "http://host?q"
  request_.query = q == std::string_view::npos ? "" : std::string(path_and_query.substr(q + 1));
  request_.version_minor = version[7] - '0';
  state_ = State::kHeaderLines;
  return Result::kNeedMore;
}

RequestParser::Result RequestParser::OnHeaderLine(std::string_view line) {
  if (line.empty()) return OnHeadersEnd();
  if (line[0] == ' ' || line[0] == '\t') return Fail(400, "obsolete header line folding");
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos) return Fail(400, "header line without a colon");
  const std::string_view name = line.substr(0, colon);
  if (!IsToken(name)) return Fail(400, "malformed header name");
  const std::string_view value = TrimOws(line.substr(colon + 1));
  if (!IsFieldValue(value)) return Fail(400, "control character in a header value");
  if (++header_count_ > limits_.max_headers) return Fail(431, "too many header fields");
  if (state_ == State::kHeaderLines) request_.headers.Add(std::string(name), std::string(value));
  return Result::kNeedMore;
}

RequestParser::Result RequestParser::OnHeadersEnd() {
  const Headers& h = request_.headers;
  const size_t hosts = h.FindAll("host").size();
  if (hosts > 1 || (request_.version_minor == 1 && hosts == 0)) {
    return Fail(400, "an HTTP/1.1 request needs exactly one Host header");
  }
  request_.keep_alive = request_.version_minor == 1 ? !h.HasToken("connection", "close")
                                                    : h.HasToken("connection", "keep-alive") &&
                                                          !h.HasToken("connection", "close");
  const std::vector<std::string_view> te = h.FindAll("transfer-encoding");
  const std::vector<std::string_view> cl = h.FindAll("content-length");
  if (!te.empty()) {
    if (!cl.empty()) return Fail(400, "both Transfer-Encoding and Content-Length");
    if (request_.version_minor == 0) return Fail(400, "Transfer-Encoding in an HTTP/1.0 request");
    std::vector<std::string_view> codings;
    for (std::string_view v : te) {
      for (std::string_view item : ListItems(v)) codings.push_back(item);
    }
    for (size_t i = 0; i < codings.size(); ++i) {
      if (!EqualsIgnoreCase(codings[i], "chunked")) {
        return Fail(501, absl::StrCat("transfer coding not supported: ", std::string(codings[i])));
      }
    }
    if (codings.size() != 1) return Fail(400, "malformed Transfer-Encoding");
    chunked_ = true;
  } else if (!cl.empty()) {
    bool have = false;
    int64_t length = 0;
    for (std::string_view v : cl) {
      for (std::string_view item : ListItems(v)) {
        int64_t n = 0;
        for (char c : item) {
          if (!IsDigit(c)) return Fail(400, "invalid Content-Length");
          // Saturate: any value above the body limit is refused with 413 below.
          if (n <= limits_.max_body_bytes && n <= (INT64_MAX - 9) / 10) n = n * 10 + (c - '0');
        }
        if (have && n != length) return Fail(400, "conflicting Content-Length values");
        have = true;
        length = n;
      }
    }
    if (!have) return Fail(400, "invalid Content-Length");
    if (length > limits_.max_body_bytes) {
      return Fail(413, absl::StrCat("request body larger than ", limits_.max_body_bytes, " bytes"));
    }
    body_remaining_ = length;
  }
  state_ = State::kHeadersDone;
  return Result::kHeadersComplete;
}

RequestParser::Result RequestParser::OnChunkSizeLine(std::string_view line) {
  size_t i = 0;
  int64_t size = 0;
  const int64_t room = limits_.max_body_bytes - static_cast<int64_t>(request_.body.size());
  for (; i < line.size() && HexValue(line[i]) >= 0; ++i) {
    if (size > room / 16 || size * 16 > room - HexValue(line[i])) {
      return Fail(413, absl::StrCat("request body larger than ", limits_.max_body_bytes, " bytes"));
    }
    size = size * 16 + HexValue(line[i]);
  }
  if (i == 0) return Fail(400, "malformed chunk size");
  const std::string_view ext = TrimOws(line.substr(i));
  if (!ext.empty() && (ext[0] != ';' || !IsFieldValue(ext))) {
    return Fail(400, "malformed chunk extension");
  }
  if (size == 0) {
    header_bytes_ = 0;
    header_count_ = 0;
    state_ = State::kTrailers;
  } else {
    body_remaining_ = size;
    state_ = State::kChunkData;
  }
  return Result::kNeedMore;
}

}  // namespace magicpig::http
