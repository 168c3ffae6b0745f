// Tests of the HTTP server over real sockets on 127.0.0.1, driven by RawClient (test_client.h):
// framing, keep-alive, pipelining, chunked bodies, limits and error statuses, 100-continue,
// streaming, client disconnects, the connection bound, timeouts and shutdown.
#include "common/http/server.h"

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/http/test_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace magicpig::http {
namespace {

using ::testing::HasSubstr;

// What the handlers observed, for the tests that check the handler side.
struct Observed {
  absl::Notification handler_started;
  absl::Notification release;  // lets /block return
  std::atomic<bool> write_failed{false};
  std::atomic<bool> client_gone{false};
  absl::Notification handler_done;
  std::atomic<int> echoes{0};  // /echo handler runs
};

Router TestRoutes(Observed* seen) {
  Router router;
  router.Handle("GET", "/hello", [](const Request&, Responder& r) {
    r.Send(200, "text/plain", "hello").IgnoreError();
  });
  auto echo = [seen](const Request& req, Responder& r) {
    ++seen->echoes;
    r.Send(200, "application/octet-stream", req.body,
           {{"X-Method", req.method}, {"X-Query", req.query}})
        .IgnoreError();
  };
  router.Handle("POST", "/echo", echo);
  router.Handle("PUT", "/echo", echo);
  router.Handle("GET", "/peer", [](const Request& req, Responder& r) {
    r.Send(200, "text/plain", req.peer).IgnoreError();
  });
  // /stream?N: N events "data: i\n\n".
  router.Handle("GET", "/stream", [](const Request& req, Responder& r) {
    int n = 0;
    if (!absl::SimpleAtoi(req.query, &n)) n = 3;
    if (!r.StartStream(200, "text/event-stream", {{"Cache-Control", "no-cache"}}).ok()) return;
    for (int i = 0; i < n; ++i) {
      if (!r.Write(absl::StrCat("data: ", i, "\n\n"))) return;
    }
    r.End();
  });
  // Writes events until the client goes away; records what it saw.
  router.Handle("GET", "/forever", [seen](const Request&, Responder& r) {
    seen->handler_started.Notify();
    if (r.StartStream(200, "text/event-stream").ok()) {
      const absl::Time give_up = absl::Now() + absl::Seconds(20);
      while (absl::Now() < give_up) {
        if (!r.Write("data: tick\n\n")) {
          seen->write_failed = true;
          break;
        }
        absl::SleepFor(absl::Milliseconds(5));
      }
    }
    seen->client_gone = r.ClientGone();
    seen->handler_done.Notify();
  });
  // Waits without writing until the client goes away (or 20 s), like a handler waiting for a
  // long generation; then responds.
  router.Handle("GET", "/wait", [seen](const Request&, Responder& r) {
    seen->handler_started.Notify();
    const absl::Time give_up = absl::Now() + absl::Seconds(20);
    while (!r.ClientGone() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
    seen->client_gone = r.ClientGone();
    r.Send(200, "text/plain", "late").IgnoreError();
    seen->handler_done.Notify();
  });
  // Blocks until the test releases it.
  router.Handle("GET", "/block", [seen](const Request&, Responder& r) {
    seen->handler_started.Notify();
    seen->release.WaitForNotificationWithTimeout(absl::Seconds(20));
    r.Send(200, "text/plain", "released").IgnoreError();
    seen->handler_done.Notify();
  });
  router.Handle("GET", "/silent", [](const Request&, Responder&) {});
  router.Handle("GET", "/throw",
                [](const Request&, Responder&) { throw std::runtime_error("boom"); });
  router.Handle("GET", "/bad-header", [](const Request&, Responder& r) {
    const absl::Status injected = r.Send(200, "text/plain", "x", {{"X-A", "a\r\nX-B: b"}});
    const absl::Status framing = r.Send(200, "text/plain", "x", {{"Content-Length", "9"}});
    r.Send(200, "text/plain",
           absl::StrCat(injected.code() == absl::StatusCode::kInvalidArgument,
                        framing.code() == absl::StatusCode::kInvalidArgument))
        .IgnoreError();
  });
  return router;
}

// JSON error bodies, the way the OpenAI API server makes them.
std::pair<std::string, std::string> JsonError(int status, std::string_view message) {
  return {"application/json", absl::StrCat(R"({"error":{"message":")", std::string(message),
                                           R"(","type":"invalid_request_error",)",
                                           R"("param":null,"code":)", status, "}}")};
}

class ServerTest : public ::testing::Test {
 protected:
  void StartServer(ServerOptions options = {}) {
    options.host = "127.0.0.1";
    if (!options.error_body) options.error_body = JsonError;
    auto server = Server::Start(options, TestRoutes(&seen_));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }
  void SetUp() override {
    ServerOptions options;
    options.max_body_bytes = 1 << 16;
    StartServer(options);
  }

  RawClient Connect() {
    absl::StatusOr<RawClient> c = RawClient::Connect(server_->port());
    EXPECT_TRUE(c.ok()) << c.status();
    return std::move(*c);
  }

  // One request on a fresh connection.
  ClientResponse RoundTrip(std::string_view request) {
    RawClient c = Connect();
    EXPECT_TRUE(c.Send(request).ok());
    absl::StatusOr<ClientResponse> r = c.ReadResponse();
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : ClientResponse{};
  }

  // The server still answers on a new connection and on `keep`, a connection opened earlier.
  void ExpectStillServing(RawClient* keep = nullptr) {
    EXPECT_EQ(RoundTrip(HttpRequest("GET", "/hello")).body, "hello");
    if (keep != nullptr) {
      ASSERT_TRUE(keep->Send(HttpRequest("GET", "/hello")).ok());
      absl::StatusOr<ClientResponse> r = keep->ReadResponse();
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->body, "hello");
    }
  }

  bool WaitForConnections(int n, absl::Duration timeout = absl::Seconds(5)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (server_->connections() != n) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return true;
  }

  Observed seen_;
  std::unique_ptr<Server> server_;
};

TEST_F(ServerTest, SimpleGetAndPost) {
  ClientResponse r = RoundTrip(HttpRequest("GET", "/hello"));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.reason, "OK");
  EXPECT_EQ(r.body, "hello");
  ASSERT_NE(r.headers.Find("content-length"), nullptr);
  EXPECT_EQ(*r.headers.Find("content-length"), "5");
  EXPECT_EQ(*r.headers.Find("content-type"), "text/plain");
  EXPECT_EQ(*r.headers.Find("server"), "magicpig");
  EXPECT_NE(r.headers.Find("date"), nullptr);
  EXPECT_EQ(r.headers.Find("connection"), nullptr);

  r = RoundTrip(HttpRequest("POST", "/echo?a=b", "some body"));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "some body");
  EXPECT_EQ(*r.headers.Find("x-method"), "POST");
  EXPECT_EQ(*r.headers.Find("x-query"), "a=b");

  r = RoundTrip(HttpRequest("GET", "/peer"));
  EXPECT_THAT(r.body, HasSubstr("127.0.0.1:"));
}

TEST_F(ServerTest, KeepAliveCarriesSeveralRequests) {
  RawClient c = Connect();
  for (int i = 0; i < 5; ++i) {
    const std::string body = absl::StrCat("request ", i);
    ASSERT_TRUE(c.Send(HttpRequest("POST", "/echo", body)).ok());
    absl::StatusOr<ClientResponse> r = c.ReadResponse();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->body, body);
  }
  EXPECT_EQ(server_->connections(), 1);
  // "Connection: close" ends it after the response.
  ASSERT_TRUE(c.Send(HttpRequest("GET", "/hello", "", {"Connection: close"})).ok());
  absl::StatusOr<ClientResponse> r = c.ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r->headers.Find("connection"), "close");
  EXPECT_TRUE(c.WaitClosed());
}

TEST_F(ServerTest, PipelinedRequestsInOneWrite) {
  RawClient c = Connect();
  ASSERT_TRUE(c.Send(HttpRequest("POST", "/echo", "one") + HttpRequest("GET", "/hello") +
                     HttpRequest("PUT", "/echo", "three"))
                  .ok());
  for (const char* want : {"one", "hello", "three"}) {
    absl::StatusOr<ClientResponse> r = c.ReadResponse();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->body, want);
  }
}

TEST_F(ServerTest, ByteAtATimeArrival) {
  RawClient c = Connect();
  const std::string request = HttpRequest("POST", "/echo", "slowly");
  for (char ch : request) {
    ASSERT_TRUE(c.Send(std::string_view(&ch, 1)).ok());
    absl::SleepFor(absl::Microseconds(300));
  }
  absl::StatusOr<ClientResponse> r = c.ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->body, "slowly");
}

TEST_F(ServerTest, ChunkedRequestBody) {
  RawClient c = Connect();
  ASSERT_TRUE(c.Send("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                     "4\r\nWiki\r\n5\r\npedia\r\n")
                  .ok());
  absl::SleepFor(absl::Milliseconds(20));
  ASSERT_TRUE(c.Send("E\r\n in\r\n\r\nchunks.\r\n0\r\n\r\n").ok());
  absl::StatusOr<ClientResponse> r = c.ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->body, "Wikipedia in\r\n\r\nchunks.");
}

TEST_F(ServerTest, OversizedHeadersAre431) {
  RawClient keep = Connect();
  const ClientResponse r =
      RoundTrip(HttpRequest("GET", "/hello", "", {"X-Big: " + std::string(20000, 'b')}));
  EXPECT_EQ(r.status, 431);
  EXPECT_EQ(*r.headers.Find("connection"), "close");
  EXPECT_EQ(*r.headers.Find("content-type"), "application/json");
  std::vector<std::string> many;
  for (int i = 0; i < 101; ++i) many.push_back(absl::StrCat("X-H", i, ": v"));
  EXPECT_EQ(RoundTrip(HttpRequest("GET", "/hello", "", many)).status, 431);
  ExpectStillServing(&keep);
}

TEST_F(ServerTest, BodyOverLimitIs413AndCloses) {
  RawClient c = Connect();
  const std::string body((1 << 16) + 1, 'x');
  ASSERT_TRUE(c.Send(HttpRequest("POST", "/echo", body)).ok());
  absl::StatusOr<ClientResponse> r = c.ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 413);
  EXPECT_THAT(r->body, HasSubstr("\"code\":413"));
  EXPECT_TRUE(c.WaitClosed());
  // Chunked over the limit too.
  RawClient d = Connect();
  ASSERT_TRUE(d.Send(absl::StrCat("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked"
                                  "\r\n\r\n10001\r\n",
                                  std::string(0x10001, 'y'), "\r\n0\r\n\r\n"))
                  .ok());
  r = d.ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 413);
  EXPECT_TRUE(d.WaitClosed());
  ExpectStillServing();
}

TEST_F(ServerTest, MalformedRequestLineIs400) {
  for (const char* bad :
       {"GARBAGE\r\n\r\n", "GET /hello HTTP/1.1 extra\r\nHost: x\r\n\r\n",
        "GET /hello HTTP/1.1\r\n folded: x\r\n\r\n", "GET /hello HTTP/1.1\r\n\r\n"}) {
    SCOPED_TRACE(bad);
    RawClient c = Connect();
    ASSERT_TRUE(c.Send(bad).ok());
    absl::StatusOr<ClientResponse> r = c.ReadResponse();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, 400);
    EXPECT_EQ(r->reason, "Bad Request");
    EXPECT_TRUE(c.WaitClosed());
  }
  ExpectStillServing();
}

TEST_F(ServerTest, Http2PrefaceAndHttp3Are505) {
  EXPECT_EQ(RoundTrip("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").status, 505);
  EXPECT_EQ(RoundTrip("GET /hello HTTP/3.0\r\nHost: x\r\n\r\n").status, 505);
  ExpectStillServing();
}

TEST_F(ServerTest, UnknownPathIs404WithCustomErrorBody) {
  RawClient c = Connect();
  ASSERT_TRUE(c.Send(HttpRequest("GET", "/v1/nothing")).ok());
  absl::StatusOr<ClientResponse> r = c.ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(*r->headers.Find("content-type"), "application/json");
  EXPECT_EQ(r->body,
            R"({"error":{"message":"no route for /v1/nothing","type":"invalid_request_error",)"
            R"("param":null,"code":404}})");
  // The request was read whole: the connection stays usable.
  ExpectStillServing(&c);
}

TEST_F(ServerTest, WrongMethodIs405WithAllow) {
  RawClient c = Connect();
  ASSERT_TRUE(c.Send(HttpRequest("GET", "/echo")).ok());
  absl::StatusOr<ClientResponse> r = c.ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 405);
  ASSERT_NE(r->headers.Find("allow"), nullptr);
  EXPECT_EQ(*r->headers.Find("allow"), "POST, PUT");
  ExpectStillServing(&c);
}

TEST_F(ServerTest, DefaultErrorBodyIsPlainText) {
  server_.reset();
  ServerOptions options;
  options.error_body = DefaultErrorBody;
  StartServer(options);
  const ClientResponse r = RoundTrip(HttpRequest("GET", "/nope"));
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(*r.headers.Find("content-type"), "text/plain; charset=utf-8");
  EXPECT_EQ(r.body, "no route for /nope\n");
}

TEST_F(ServerTest, Expect100Continue) {
  RawClient c = Connect();
  ASSERT_TRUE(c.Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\n"
                     "Expect: 100-continue\r\n\r\n")
                  .ok());
  absl::StatusOr<ClientResponse> interim = c.ReadResponse();
  ASSERT_TRUE(interim.ok()) << interim.status();
  EXPECT_EQ(interim->status, 100);
  ASSERT_TRUE(c.Send("payload").ok());
  absl::StatusOr<ClientResponse> r = c.ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "payload");

  // No route: the final status at once, no 100, and the connection closes.
  RawClient d = Connect();
  ASSERT_TRUE(d.Send("POST /nope HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\n"
                     "Expect: 100-continue\r\n\r\n")
                  .ok());
  r = d.ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 404);
  EXPECT_TRUE(d.WaitClosed());
}

// A head check refuses before the body is read: the answer comes with none of the body sent (the
// server would otherwise wait read_timeout for it), and the handler never runs.
TEST_F(ServerTest, HeadCheckRefusesBeforeTheBody) {
  ServerOptions options;
  options.max_body_bytes = 1 << 20;
  options.read_timeout = absl::Seconds(20);
  options.head_check = [](const Request& head) -> std::optional<HeadRefusal> {
    if (head.headers.Find("x-key") != nullptr) return std::nullopt;
    return HeadRefusal{.status = 401, .message = "no key"};
  };
  server_->Shutdown(absl::Seconds(1));
  StartServer(options);
  RawClient c = Connect();
  const absl::Time start = absl::Now();
  ASSERT_TRUE(c.Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 900000\r\n\r\n").ok());
  absl::StatusOr<ClientResponse> r = c.ReadResponse(absl::Seconds(5));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 401);
  EXPECT_NE(r->body.find("no key"), std::string::npos) << r->body;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_TRUE(c.WaitClosed());
  EXPECT_EQ(seen_.echoes.load(), 0);
  // With the key the body is read and the handler answers.
  EXPECT_EQ(RoundTrip(HttpRequest("POST", "/echo", "payload", {"X-Key: 1"})).body, "payload");
  // Requests without a body are not checked.
  EXPECT_EQ(RoundTrip(HttpRequest("GET", "/hello")).body, "hello");
}

TEST_F(ServerTest, StreamReadBackEqualsWhatWasWritten) {
  RawClient c = Connect();
  ASSERT_TRUE(c.Send(HttpRequest("GET", "/stream?50")).ok());
  absl::StatusOr<ClientResponse> r = c.ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  EXPECT_TRUE(r->chunked);
  EXPECT_EQ(*r->headers.Find("content-type"), "text/event-stream");
  EXPECT_EQ(*r->headers.Find("cache-control"), "no-cache");
  EXPECT_EQ(r->headers.Find("content-length"), nullptr);
  std::string want;
  for (int i = 0; i < 50; ++i) want += absl::StrCat("data: ", i, "\n\n");
  EXPECT_EQ(r->body, want);
  EXPECT_EQ(r->chunks.size(), 50u);  // one chunk per Write
  // The connection is reusable after the last chunk.
  ExpectStillServing(&c);
}

TEST_F(ServerTest, Http10StreamEndsWithTheConnection) {
  RawClient c = Connect();
  ASSERT_TRUE(c.Send("GET /stream?4 HTTP/1.0\r\n\r\n").ok());
  absl::StatusOr<ClientResponse> r = c.ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->chunked);
  EXPECT_TRUE(r->closed_delimited);
  EXPECT_EQ(r->body, "data: 0\n\ndata: 1\n\ndata: 2\n\ndata: 3\n\n");
}

TEST_F(ServerTest, Http10KeepAliveOnlyWhenAsked) {
  RawClient c = Connect();
  ASSERT_TRUE(c.Send("GET /hello HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").ok());
  absl::StatusOr<ClientResponse> r = c.ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r->headers.Find("connection"), "keep-alive");
  ASSERT_TRUE(c.Send("GET /hello HTTP/1.0\r\n\r\n").ok());
  r = c.ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->body, "hello");
  EXPECT_EQ(*r->headers.Find("connection"), "close");
  EXPECT_TRUE(c.WaitClosed());
}

TEST_F(ServerTest, ClientDisconnectMidStream) {
  RawClient c = Connect();
  ASSERT_TRUE(c.Send(HttpRequest("GET", "/forever")).ok());
  std::string got;
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (got.find("data: tick") == std::string::npos && absl::Now() < deadline) {
    got += c.ReadAvailable(absl::Milliseconds(100));
  }
  EXPECT_THAT(got, HasSubstr("data: tick"));
  c.Close();
  // Bounded: the handler writes every 5 ms, so it must notice well within 2 s.
  ASSERT_TRUE(seen_.handler_done.WaitForNotificationWithTimeout(absl::Seconds(2)));
  EXPECT_TRUE(seen_.write_failed);
  EXPECT_TRUE(seen_.client_gone);
  EXPECT_TRUE(WaitForConnections(0));
  ExpectStillServing();
}

TEST_F(ServerTest, ClientGoneWhileHandlerWaits) {
  RawClient c = Connect();
  ASSERT_TRUE(c.Send(HttpRequest("GET", "/wait")).ok());
  ASSERT_TRUE(seen_.handler_started.WaitForNotificationWithTimeout(absl::Seconds(5)));
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(seen_.handler_done.HasBeenNotified());  // still waiting: the client is there
  const absl::Time closed = absl::Now();
  c.Close();
  ASSERT_TRUE(seen_.handler_done.WaitForNotificationWithTimeout(absl::Seconds(2)));
  EXPECT_TRUE(seen_.client_gone);
  EXPECT_LT(absl::Now() - closed, absl::Seconds(1));
  ExpectStillServing();
}

TEST_F(ServerTest, ConnectionsBeyondTheBoundGet503) {
  server_.reset();
  ServerOptions options;
  options.max_connections = 2;
  StartServer(options);
  RawClient a = Connect();
  ExpectStillServing(&a);
  ASSERT_TRUE(WaitForConnections(1));  // ExpectStillServing's own connection is gone
  RawClient b = Connect();
  ASSERT_TRUE(b.Send(HttpRequest("GET", "/hello")).ok());
  absl::StatusOr<ClientResponse> first = b.ReadResponse();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->status, 200);
  ASSERT_TRUE(WaitForConnections(2));

  RawClient over = Connect();
  absl::StatusOr<ClientResponse> r = over.ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(*r->headers.Find("connection"), "close");
  EXPECT_THAT(r->body, HasSubstr("too many connections"));
  EXPECT_TRUE(over.WaitClosed());

  // A freed slot is usable again.
  b.Close();
  ASSERT_TRUE(WaitForConnections(1));
  ExpectStillServing(&a);
}

// One client (one peer IP) cannot take every slot: beyond its share it gets 503, while another
// client (127.0.0.2, also loopback) is still served; a closed connection frees its share.
TEST_F(ServerTest, ConnectionsPerClientAreCapped) {
  server_.reset();
  ServerOptions options;
  options.max_connections = 16;
  options.max_connections_per_client = 3;
  StartServer(options);
  std::vector<RawClient> idle;
  for (int i = 0; i < 3; ++i) idle.push_back(Connect());
  ASSERT_TRUE(WaitForConnections(3));
  RawClient over = Connect();
  absl::StatusOr<ClientResponse> r = over.ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 503);
  EXPECT_THAT(r->body, HasSubstr("too many connections from this client"));
  auto hello = [](RawClient& c) {
    EXPECT_TRUE(c.Send(HttpRequest("GET", "/hello")).ok());
    absl::StatusOr<ClientResponse> answer = c.ReadResponse();
    return answer.ok() ? answer->status : -1;
  };
  absl::StatusOr<RawClient> other = RawClient::Connect(server_->port(), "127.0.0.1", "127.0.0.2");
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(hello(*other), 200);
  idle.pop_back();
  ASSERT_TRUE(WaitForConnections(3));  // two idle ones and the other client's
  RawClient again = Connect();
  EXPECT_EQ(hello(again), 200);
}

// A flood that takes every regular slot (from many addresses, so the per-client limit does not
// help) leaves the reserved probe slots: a GET of a probe path is still answered there, any other
// request on such a slot gets 503, and a probe slot serves one request, then closes.
TEST_F(ServerTest, ReservedSlotsKeepProbesAnsweringWhenEveryOtherSlotIsTaken) {
  server_.reset();
  ServerOptions options;
  options.max_connections = 2;
  options.reserved_probe_connections = 1;
  options.probe_paths = {"/hello"};
  StartServer(options);
  std::vector<RawClient> flood;
  for (const char* source : {"127.0.0.2", "127.0.0.3"}) {
    absl::StatusOr<RawClient> c = RawClient::Connect(server_->port(), "127.0.0.1", source);
    ASSERT_TRUE(c.ok()) << c.status();
    flood.push_back(*std::move(c));
  }
  ASSERT_TRUE(WaitForConnections(2));

  RawClient probe = Connect();
  ASSERT_TRUE(probe.Send(HttpRequest("GET", "/hello")).ok());
  absl::StatusOr<ClientResponse> r = probe.ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200) << "the probe is answered on the reserved slot";
  EXPECT_TRUE(probe.WaitClosed()) << "a probe slot serves one request";

  RawClient other = Connect();
  ASSERT_TRUE(other.Send(HttpRequest("GET", "/peer")).ok());
  r = other.ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 503) << "only probe paths on a probe slot";
  EXPECT_TRUE(other.WaitClosed());

  // The probe slot taken by an idle connection: the next one gets 503 until that one's short
  // idle timeout frees the slot.
  ASSERT_TRUE(WaitForConnections(2));
  RawClient idle_probe = Connect();
  ASSERT_TRUE(WaitForConnections(3));
  RawClient refused = Connect();
  r = refused.ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 503);
  EXPECT_TRUE(idle_probe.WaitClosed(absl::Seconds(5))) << "probe slots time out in 2 s";
  ASSERT_TRUE(WaitForConnections(2));
  RawClient again = Connect();
  ASSERT_TRUE(again.Send(HttpRequest("GET", "/hello")).ok());
  r = again.ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
}

TEST_F(ServerTest, HandlerWithoutResponseIs500) {
  RawClient c = Connect();
  ASSERT_TRUE(c.Send(HttpRequest("GET", "/silent")).ok());
  absl::StatusOr<ClientResponse> r = c.ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 500);
  ExpectStillServing(&c);

  RawClient d = Connect();
  ASSERT_TRUE(d.Send(HttpRequest("GET", "/throw")).ok());
  r = d.ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 500);
  EXPECT_THAT(r->body, HasSubstr("boom"));
  EXPECT_TRUE(d.WaitClosed());
}

TEST_F(ServerTest, ResponderRejectsInjectedAndFramingHeaders) {
  EXPECT_EQ(RoundTrip(HttpRequest("GET", "/bad-header")).body, "11");
}

TEST_F(ServerTest, IdleAndReadTimeouts) {
  server_.reset();
  ServerOptions options;
  options.idle_timeout = absl::Milliseconds(200);
  options.read_timeout = absl::Milliseconds(300);
  StartServer(options);
  RawClient idle = Connect();
  const absl::Time start = absl::Now();
  EXPECT_TRUE(idle.WaitClosed(absl::Seconds(5)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(150));

  RawClient slow = Connect();
  ASSERT_TRUE(slow.Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Le").ok());
  absl::StatusOr<ClientResponse> r = slow.ReadResponse(absl::Seconds(5));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 408);
  EXPECT_TRUE(slow.WaitClosed());
}

TEST_F(ServerTest, ShutdownClosesIdleKeepAliveConnections) {
  RawClient c = Connect();
  ExpectStillServing(&c);
  const absl::Time start = absl::Now();
  server_->Shutdown(absl::Seconds(10));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
  EXPECT_TRUE(c.WaitClosed(absl::Seconds(1)));
  EXPECT_FALSE(RawClient::Connect(server_->port()).ok());  // no longer listening
  server_->Shutdown(absl::Seconds(1));                     // idempotent
}

TEST_F(ServerTest, ShutdownWaitsForARunningHandler) {
  RawClient c = Connect();
  ASSERT_TRUE(c.Send(HttpRequest("GET", "/block")).ok());
  ASSERT_TRUE(seen_.handler_started.WaitForNotificationWithTimeout(absl::Seconds(5)));
  std::thread releaser([&] {
    absl::SleepFor(absl::Milliseconds(300));
    seen_.release.Notify();
  });
  const absl::Time start = absl::Now();
  server_->Shutdown(absl::Seconds(10));
  const absl::Duration took = absl::Now() - start;
  releaser.join();
  EXPECT_TRUE(seen_.handler_done.HasBeenNotified());  // Shutdown returned after the handler
  EXPECT_GE(took, absl::Milliseconds(250));
  EXPECT_LT(took, absl::Seconds(5));
  absl::StatusOr<ClientResponse> r = c.ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->body, "released");
  EXPECT_EQ(*r->headers.Find("connection"), "close");  // draining
  EXPECT_TRUE(c.WaitClosed());
}

TEST_F(ServerTest, ShutdownGraceRunsOutForAHandlerThatWaits) {
  RawClient c = Connect();
  ASSERT_TRUE(c.Send(HttpRequest("GET", "/wait")).ok());
  ASSERT_TRUE(seen_.handler_started.WaitForNotificationWithTimeout(absl::Seconds(5)));
  const absl::Time start = absl::Now();
  server_->Shutdown(absl::Milliseconds(300));
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(280));  // it waited the grace
  EXPECT_LT(took, absl::Seconds(3));         // then the handler saw its client gone
  EXPECT_TRUE(seen_.handler_done.HasBeenNotified());
  EXPECT_TRUE(seen_.client_gone);
}

TEST_F(ServerTest, KeepsServingAfterEveryKindOfBadInput) {
  RawClient keep = Connect();
  ExpectStillServing(&keep);
  const std::vector<std::string> bad = {
      "\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03",  // a TLS ClientHello
      std::string(100, '\0'),
      "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
      "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n",
      "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
      "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nshort",  // then close
      "GET /" + std::string(20000, 'a') + " HTTP/1.1\r\n\r\n",
  };
  for (const std::string& b : bad) {
    RawClient c = Connect();
    (void)c.Send(b);
    c.ShutdownWrite();
    (void)c.ReadResponse(absl::Seconds(2));
    c.Close();
  }
  ExpectStillServing(&keep);
  EXPECT_TRUE(WaitForConnections(1));
}

TEST(ServerStartTest, RejectsBadOptionsAndABusyPort) {
  ServerOptions bad;
  bad.max_connections = 0;
  EXPECT_EQ(Server::Start(bad, Router()).status().code(), absl::StatusCode::kInvalidArgument);
  bad = ServerOptions();
  bad.port = 70000;
  EXPECT_EQ(Server::Start(bad, Router()).status().code(), absl::StatusCode::kInvalidArgument);
  bad = ServerOptions();
  bad.read_timeout = absl::ZeroDuration();
  EXPECT_EQ(Server::Start(bad, Router()).status().code(), absl::StatusCode::kInvalidArgument);
  ServerOptions options;
  options.host = "127.0.0.1";
  absl::StatusOr<std::unique_ptr<Server>> a = Server::Start(options, Router());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_GT((*a)->port(), 0);
  options.port = (*a)->port();
  EXPECT_EQ(Server::Start(options, Router()).status().code(), absl::StatusCode::kUnavailable);
}

TEST(ResponderTest, FramingOverASocketPair) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  {
    Responder r(sv[0], 1, true);
    EXPECT_FALSE(r.Write("nothing open"));
    EXPECT_EQ(r.Send(199, "text/plain", "").code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(r.Send(204, "text/plain", "body").code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(r.Send(200, "text/plain", "", {{"Connection", "keep-alive"}}).code(),
              absl::StatusCode::kInvalidArgument);
    ASSERT_TRUE(r.StartStream(200, "text/event-stream").ok());
    EXPECT_EQ(r.Send(200, "text/plain", "").code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(r.Write("abc"));
    EXPECT_TRUE(r.Write(""));  // sends nothing (an empty chunk would end the stream)
    r.End();
    r.End();
    EXPECT_FALSE(r.Write("after end"));
    EXPECT_TRUE(r.reusable());
    EXPECT_FALSE(r.ClientGone());
  }
  char buf[4096];
  const ssize_t n = ::recv(sv[1], buf, sizeof(buf), 0);
  ASSERT_GT(n, 0);
  const std::string wire(buf, static_cast<size_t>(n));
  EXPECT_THAT(wire, HasSubstr("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(wire, HasSubstr("Transfer-Encoding: chunked\r\n"));
  EXPECT_THAT(wire, HasSubstr("\r\n\r\n3\r\nabc\r\n0\r\n\r\n"));
  ::close(sv[1]);
  Responder gone(sv[0], 1, true);
  EXPECT_TRUE(gone.ClientGone());
  EXPECT_EQ(gone.Send(200, "text/plain", "x").code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(gone.reusable());
  ::close(sv[0]);
}

}  // namespace
}  // namespace magicpig::http
