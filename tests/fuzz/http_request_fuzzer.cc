// libFuzzer target for the HTTP request parser (common/http/request_parser.h). The input is fed
// three ways: whole, split at a point taken from its first two bytes, and one byte at a time; the
// three must yield the same requests and the same error (the parser must not depend on how bytes
// arrive), every yielded request must respect the limits, and every error must be one of the
// statuses the parser documents. The third byte picks small or default limits.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/http/request_parser.h"

namespace {

using magicpig::http::IsToken;
using magicpig::http::ParserLimits;
using magicpig::http::Request;
using magicpig::http::RequestParser;

struct Outcome {
  std::vector<Request> requests;
  int error = 0;
};

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

void CheckRequest(const Request& r, const ParserLimits& limits) {
  Check(IsToken(r.method));
  Check(!r.target.empty() && !r.path.empty());
  Check(r.version_minor == 0 || r.version_minor == 1);
  Check(static_cast<int64_t>(r.body.size()) <= limits.max_body_bytes);
  Check(static_cast<int>(r.headers.size()) <= limits.max_headers);
  int64_t header_bytes = static_cast<int64_t>(r.method.size() + r.target.size());
  for (const auto& [name, value] : r.headers.fields()) {
    Check(IsToken(name));
    header_bytes += static_cast<int64_t>(name.size() + value.size());
  }
  Check(header_bytes <= limits.max_header_bytes);
}

// Feeds `pieces` in order, parsing after each; collects what the parser yields.
Outcome Run(const std::vector<std::string_view>& pieces, const ParserLimits& limits) {
  RequestParser parser(limits);
  Outcome out;
  size_t total = 0;
  for (std::string_view p : pieces) total += p.size();
  // Each event consumes input or completes a request, so this many steps means a hang.
  const size_t max_steps = 4 * total + 16 + 4 * pieces.size();
  size_t steps = 0;
  for (std::string_view piece : pieces) {
    parser.Feed(piece);
    while (true) {
      Check(++steps <= max_steps);
      const RequestParser::Result r = parser.Parse();
      if (r == RequestParser::Result::kNeedMore) break;
      if (r == RequestParser::Result::kHeadersComplete) {
        (void)parser.body_expected();
        Check(parser.InProgress());
        continue;
      }
      if (r == RequestParser::Result::kError) {
        out.error = parser.error_status();
        Check(out.error == 400 || out.error == 413 || out.error == 431 || out.error == 501 ||
              out.error == 505);
        Check(!parser.error_message().empty());
        return out;
      }
      Request request = parser.TakeRequest();
      CheckRequest(request, limits);
      out.requests.push_back(std::move(request));
    }
  }
  return out;
}

bool SameRequest(const Request& a, const Request& b) {
  return a.method == b.method && a.target == b.target && a.path == b.path && a.query == b.query &&
         a.version_minor == b.version_minor && a.keep_alive == b.keep_alive &&
         a.headers.fields() == b.headers.fields() && a.body == b.body;
}

void CheckSame(const Outcome& a, const Outcome& b) {
  Check(a.error == b.error);
  Check(a.requests.size() == b.requests.size());
  for (size_t i = 0; i < a.requests.size(); ++i) Check(SameRequest(a.requests[i], b.requests[i]));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const size_t split_seed = (static_cast<size_t>(data[0]) << 8) | data[1];
  ParserLimits limits;
  if (data[2] & 1) {
    limits.max_header_bytes = 64 + (data[2] >> 1);  // 64 .. 191
    limits.max_headers = 1 + (data[2] >> 5);        // 1 .. 8
    limits.max_body_bytes = data[2] >> 2;           // 0 .. 63
  }
  const std::string_view input(reinterpret_cast<const char*>(data) + 3, size - 3);
  const size_t split = split_seed % (input.size() + 1);

  const Outcome whole = Run({input}, limits);
  CheckSame(whole, Run({input.substr(0, split), input.substr(split)}, limits));
  std::vector<std::string_view> bytes;
  bytes.reserve(input.size());
  for (size_t i = 0; i < input.size(); ++i) bytes.push_back(input.substr(i, 1));
  CheckSame(whole, Run(bytes, limits));
  return 0;
}
