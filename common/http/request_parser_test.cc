// Tests of RequestParser: request line, headers, limits, Content-Length and chunked bodies,
// pipelining, and that the result never depends on how the bytes are split.
#include "common/http/request_parser.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace magicpig::http {
namespace {

using ::testing::ElementsAre;

// What a parser made of a byte stream: its requests, then its error status (0: none) and message.
struct Outcome {
  std::vector<Request> requests;
  int error = 0;
  std::string message;
  int headers_events = 0;
};

// Feeds `input` in pieces of `piece` bytes (0: all at once), parsing after each piece.
Outcome ParseAll(std::string_view input, size_t piece = 0, ParserLimits limits = {}) {
  RequestParser parser(limits);
  Outcome out;
  size_t pos = 0;
  while (true) {
    const RequestParser::Result r = parser.Parse();
    if (r == RequestParser::Result::kRequestComplete) {
      out.requests.push_back(parser.TakeRequest());
    } else if (r == RequestParser::Result::kHeadersComplete) {
      ++out.headers_events;
    } else if (r == RequestParser::Result::kError) {
      out.error = parser.error_status();
      out.message = parser.error_message();
      return out;
    } else if (pos < input.size()) {
      const size_t n = piece == 0 ? input.size() - pos : std::min(piece, input.size() - pos);
      parser.Feed(input.substr(pos, n));
      pos += n;
    } else {
      return out;
    }
  }
}

int ErrorOf(std::string_view input, ParserLimits limits = {}) {
  return ParseAll(input, 0, limits).error;
}

TEST(RequestParserTest, SimpleGet) {
  const Outcome o = ParseAll("GET /healthz?verbose=1 HTTP/1.1\r\nHost: a\r\nX-Y:  z \r\n\r\n");
  ASSERT_EQ(o.error, 0) << o.message;
  ASSERT_EQ(o.requests.size(), 1u);
  const Request& r = o.requests[0];
  EXPECT_EQ(r.method, "GET");
  EXPECT_EQ(r.target, "/healthz?verbose=1");
  EXPECT_EQ(r.path, "/healthz");
  EXPECT_EQ(r.query, "verbose=1");
  EXPECT_EQ(r.version_minor, 1);
  EXPECT_TRUE(r.keep_alive);
  ASSERT_NE(r.headers.Find("x-y"), nullptr);
  EXPECT_EQ(*r.headers.Find("X-Y"), "z");
  EXPECT_EQ(r.headers.Find("missing"), nullptr);
  EXPECT_EQ(r.body, "");
  EXPECT_EQ(o.headers_events, 1);
}

TEST(RequestParserTest, ContentLengthBodyAndPipelining) {
  const std::string two =
      "POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello"
      "GET /b HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
  for (size_t piece : {0, 1, 2, 7}) {
    SCOPED_TRACE(piece);
    const Outcome o = ParseAll(two, piece);
    ASSERT_EQ(o.error, 0) << o.message;
    ASSERT_EQ(o.requests.size(), 2u);
    EXPECT_EQ(o.requests[0].body, "hello");
    EXPECT_EQ(o.requests[0].path, "/v1/completions");
    EXPECT_TRUE(o.requests[0].keep_alive);
    EXPECT_EQ(o.requests[1].path, "/b");
    EXPECT_FALSE(o.requests[1].keep_alive);
  }
}

TEST(RequestParserTest, ChunkedBodyWithExtensionsAndTrailers) {
  const std::string req =
      "POST /up HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5;name=value\r\nhello\r\n"
      "1\r\n \r\n"
      "A\r\n0123456789\r\n"
      "0\r\nX-Trailer: t\r\n\r\n"
      "GET /next HTTP/1.1\r\nHost: a\r\n\r\n";
  for (size_t piece : {0, 1, 3}) {
    SCOPED_TRACE(piece);
    const Outcome o = ParseAll(req, piece);
    ASSERT_EQ(o.error, 0) << o.message;
    ASSERT_EQ(o.requests.size(), 2u);
    EXPECT_EQ(o.requests[0].body, "hello 0123456789");
    EXPECT_EQ(o.requests[0].headers.Find("x-trailer"), nullptr);  // trailers are dropped
    EXPECT_EQ(o.requests[1].path, "/next");
  }
}

TEST(RequestParserTest, BareLineFeedsAndLeadingEmptyLines) {
  const Outcome o = ParseAll("\r\n\nGET / HTTP/1.1\nHost: a\n\n");
  ASSERT_EQ(o.error, 0) << o.message;
  ASSERT_EQ(o.requests.size(), 1u);
  EXPECT_EQ(o.requests[0].path, "/");
}

TEST(RequestParserTest, Http10KeepAliveOnlyWhenAsked) {
  Outcome o = ParseAll("GET / HTTP/1.0\r\n\r\n");
  ASSERT_EQ(o.requests.size(), 1u);
  EXPECT_EQ(o.requests[0].version_minor, 0);
  EXPECT_FALSE(o.requests[0].keep_alive);
  o = ParseAll("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n");
  ASSERT_EQ(o.requests.size(), 1u);
  EXPECT_TRUE(o.requests[0].keep_alive);
  o = ParseAll("GET / HTTP/1.1\r\nHost: a\r\nConnection: foo, CLOSE\r\n\r\n");
  ASSERT_EQ(o.requests.size(), 1u);
  EXPECT_FALSE(o.requests[0].keep_alive);
}

TEST(RequestParserTest, TargetForms) {
  Outcome o = ParseAll("GET http://example.com:80/v1/models?x HTTP/1.1\r\nHost: a\r\n\r\n");
  ASSERT_EQ(o.requests.size(), 1u);
  EXPECT_EQ(o.requests[0].path, "/v1/models");
  EXPECT_EQ(o.requests[0].query, "x");
  o = ParseAll("GET http://example.com HTTP/1.1\r\nHost: a\r\n\r\n");
  ASSERT_EQ(o.requests.size(), 1u);
  EXPECT_EQ(o.requests[0].path, "/");
  o = ParseAll("OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n");
  ASSERT_EQ(o.requests.size(), 1u);
  EXPECT_EQ(o.requests[0].path, "*");
}

TEST(RequestParserTest, MalformedRequestLinesAre400) {
  for (const char* line :
       {"GET /\r\n", "GET  / HTTP/1.1\r\n", "GET / HTTP/1.1 x\r\n", "G(T / HTTP/1.1\r\n",
        "GET / http/1.1\r\n", "GET / HTTP/1.10\r\n", "GET / HTTP/2\r\n", "GET foo HTTP/1.1\r\n",
        "GET /a\x01 HTTP/1.1\r\n", "GET ftp://x/ HTTP/1.1\r\n", "\x16\x03\x01\x02\x00\x01\r\n",
        "GET / HTTP/1.1\r\r\n"}) {
    SCOPED_TRACE(line);
    EXPECT_EQ(ErrorOf(std::string(line) + "Host: a\r\n\r\n"), 400);
  }
  EXPECT_EQ(ErrorOf(std::string(17 * 2, '\n') + "GET / HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
}

TEST(RequestParserTest, OtherVersionsAre505) {
  EXPECT_EQ(ErrorOf("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 505);  // the HTTP/2 preface
  EXPECT_EQ(ErrorOf("GET / HTTP/3.0\r\nHost: a\r\n\r\n"), 505);
  EXPECT_EQ(ErrorOf("GET / HTTP/1.2\r\nHost: a\r\n\r\n"), 505);
  EXPECT_EQ(ErrorOf("GET / HTTP/0.9\r\n\r\n"), 505);
}

TEST(RequestParserTest, MalformedHeadersAre400) {
  for (const char* headers :
       {"Host: a\r\n folded\r\n", "Host: a\r\nNoColon\r\n", "Host: a\r\nBad Name: x\r\n",
        "Host: a\r\nName : x\r\n", "Host: a\r\n: x\r\n", "Host: a\r\nX: a\x01z\r\n",
        "Host: a\r\nX: a\rb\r\n", "", "Host: a\r\nHost: b\r\n"}) {
    SCOPED_TRACE(headers);
    EXPECT_EQ(ErrorOf(std::string("GET / HTTP/1.1\r\n") + headers + "\r\n"), 400);
  }
  // HTTP/1.0 needs no Host.
  EXPECT_EQ(ErrorOf("GET / HTTP/1.0\r\n\r\n"), 0);
}

TEST(RequestParserTest, HeaderLimitsAre431) {
  ParserLimits limits;
  limits.max_header_bytes = 200;
  limits.max_headers = 3;
  const std::string head = "GET / HTTP/1.1\r\nHost: a\r\n";
  EXPECT_EQ(ErrorOf(head + "A: 1\r\nB: 2\r\n\r\n", limits), 0);
  EXPECT_EQ(ErrorOf(head + "A: 1\r\nB: 2\r\nC: 3\r\n\r\n", limits), 431);
  EXPECT_EQ(ErrorOf(head + "A: " + std::string(200, 'x') + "\r\n\r\n", limits), 431);
  // Detected before the line ends: an endless header line is refused as soon as it is too long.
  RequestParser parser(limits);
  parser.Feed(head + "A: " + std::string(300, 'x'));
  EXPECT_EQ(parser.Parse(), RequestParser::Result::kError);
  EXPECT_EQ(parser.error_status(), 431);
  // The default limit: 16 KiB.
  EXPECT_EQ(ErrorOf(head + "A: " + std::string(16 << 10, 'x') + "\r\n\r\n"), 431);
  EXPECT_EQ(ErrorOf(head + "A: " + std::string(15 << 10, 'x') + "\r\n\r\n"), 0);
}

TEST(RequestParserTest, ContentLengthRules) {
  const std::string head = "POST / HTTP/1.1\r\nHost: a\r\n";
  EXPECT_EQ(ErrorOf(head + "Content-Length: 3\r\nContent-Length: 3\r\n\r\nabc"), 0);
  EXPECT_EQ(ErrorOf(head + "Content-Length: 3, 3\r\n\r\nabc"), 0);
  EXPECT_EQ(ErrorOf(head + "Content-Length: 3\r\nContent-Length: 4\r\n\r\nabcd"), 400);
  EXPECT_EQ(ErrorOf(head + "Content-Length: -1\r\n\r\n"), 400);
  EXPECT_EQ(ErrorOf(head + "Content-Length: +1\r\n\r\na"), 400);
  EXPECT_EQ(ErrorOf(head + "Content-Length: 1x\r\n\r\na"), 400);
  EXPECT_EQ(ErrorOf(head + "Content-Length:\r\n\r\n"), 400);
  EXPECT_EQ(ErrorOf(head + "Content-Length: 99999999999999999999999999\r\n\r\n"), 413);
  EXPECT_EQ(ErrorOf(head + "Content-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"), 400);
}

TEST(RequestParserTest, BodyLimitIs413) {
  ParserLimits limits;
  limits.max_body_bytes = 10;
  const std::string head = "POST / HTTP/1.1\r\nHost: a\r\n";
  EXPECT_EQ(ErrorOf(head + "Content-Length: 10\r\n\r\n0123456789", limits), 0);
  // Refused at the end of the header section, before any body byte.
  RequestParser parser(limits);
  parser.Feed(head + "Content-Length: 11\r\n\r\n");
  EXPECT_EQ(parser.Parse(), RequestParser::Result::kError);
  EXPECT_EQ(parser.error_status(), 413);
  const std::string chunked = head + "Transfer-Encoding: chunked\r\n\r\n";
  EXPECT_EQ(ErrorOf(chunked + "5\r\n01234\r\n5\r\n56789\r\n0\r\n\r\n", limits), 0);
  EXPECT_EQ(ErrorOf(chunked + "5\r\n01234\r\n6\r\n", limits), 413);
  EXPECT_EQ(ErrorOf(chunked + "ffffffffffffffffffffffff\r\n", limits), 413);
}

TEST(RequestParserTest, TransferEncodingRules) {
  const std::string head = "POST / HTTP/1.1\r\nHost: a\r\n";
  EXPECT_EQ(ErrorOf(head + "Transfer-Encoding: gzip, chunked\r\n\r\n"), 501);
  EXPECT_EQ(ErrorOf(head + "Transfer-Encoding: chunked, chunked\r\n\r\n"), 400);
  EXPECT_EQ(ErrorOf(head + "Transfer-Encoding: CHUNKED\r\n\r\n0\r\n\r\n"), 0);
  EXPECT_EQ(ErrorOf("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"), 400);
}

TEST(RequestParserTest, MalformedChunksAre400) {
  const std::string head = "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (const char* body : {"x\r\n", "\r\n", "5\r\nhelloX\r\n", "5 x\r\nhello\r\n0\r\n\r\n",
                           "-5\r\nhello\r\n", "0\r\nbad trailer\r\n\r\n"}) {
    SCOPED_TRACE(body);
    EXPECT_EQ(ErrorOf(head + body), 400);
  }
  EXPECT_EQ(ErrorOf(head + "5 ; ext\r\nhello\r\n0\r\n\r\n"), 0);
  EXPECT_EQ(ErrorOf(head + std::string(2000, '0') + "\r\n"), 400);
}

TEST(RequestParserTest, InProgressAndBodyExpected) {
  RequestParser parser;
  EXPECT_FALSE(parser.InProgress());
  parser.Feed("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n");
  EXPECT_TRUE(parser.InProgress());
  ASSERT_EQ(parser.Parse(), RequestParser::Result::kHeadersComplete);
  EXPECT_TRUE(parser.body_expected());
  EXPECT_EQ(parser.Parse(), RequestParser::Result::kNeedMore);
  parser.Feed("abcd");
  ASSERT_EQ(parser.Parse(), RequestParser::Result::kRequestComplete);
  EXPECT_EQ(parser.TakeRequest().body, "abcd");
  EXPECT_FALSE(parser.InProgress());
  EXPECT_EQ(parser.Parse(), RequestParser::Result::kNeedMore);
}

TEST(RequestParserTest, ErrorIsFinal) {
  RequestParser parser;
  parser.Feed("BAD\r\n");
  EXPECT_EQ(parser.Parse(), RequestParser::Result::kError);
  parser.Feed("GET / HTTP/1.1\r\nHost: a\r\n\r\n");
  EXPECT_EQ(parser.Parse(), RequestParser::Result::kError);
  EXPECT_EQ(parser.error_status(), 400);
}

// The outcome must not depend on how the bytes are split.
TEST(RequestParserTest, SplitInvariance) {
  const std::vector<std::string> inputs = {
      "POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nxyzGET /b?q HTTP/1.0\r\n\r\n",
      "POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
      "GET / HTTP/1.1\r\nHost: a\r\nX: " +
          std::string(500, 'y') + "\r\n\r\n",
      "GET / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/9.9\r\n\r\n",
  };
  ParserLimits limits;
  limits.max_header_bytes = 300;
  for (const std::string& in : inputs) {
    const Outcome whole = ParseAll(in, 0, limits);
    for (size_t piece = 1; piece < 12; ++piece) {
      const Outcome split = ParseAll(in, piece, limits);
      EXPECT_EQ(split.error, whole.error) << in << " piece " << piece;
      ASSERT_EQ(split.requests.size(), whole.requests.size());
      for (size_t i = 0; i < whole.requests.size(); ++i) {
        EXPECT_EQ(split.requests[i].target, whole.requests[i].target);
        EXPECT_EQ(split.requests[i].body, whole.requests[i].body);
        EXPECT_EQ(split.requests[i].headers.fields(), whole.requests[i].headers.fields());
      }
    }
  }
}

TEST(HeadersTest, FindIsCaseInsensitiveAndHasTokenReadsLists) {
  Headers h;
  h.Add("Content-Type", "text/plain");
  h.Add("connection", "Upgrade, Keep-Alive");
  h.Add("Connection", "te");
  EXPECT_EQ(*h.Find("CONTENT-TYPE"), "text/plain");
  EXPECT_THAT(h.FindAll("Connection"), ElementsAre("Upgrade, Keep-Alive", "te"));
  EXPECT_TRUE(h.HasToken("Connection", "keep-alive"));
  EXPECT_TRUE(h.HasToken("Connection", "TE"));
  EXPECT_FALSE(h.HasToken("Connection", "close"));
  EXPECT_EQ(ReasonPhrase(431), "Request Header Fields Too Large");
  EXPECT_EQ(ReasonPhrase(799), "Unknown");
}

}  // namespace
}  // namespace magicpig::http
