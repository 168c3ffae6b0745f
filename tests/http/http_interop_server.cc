// A small server on common/http for the interop test (http_client_test.py): it prints
// "listening on 127.0.0.1:PORT" and serves until its standard input closes.
//   POST /echo          → 200, the request body (application/octet-stream), with X-Body-Bytes and
//                         X-Chunked (whether the request body came chunked)
//   GET  /stream?N      → 200 text/event-stream, N events "data: {\"i\": i}\n\n", then
//                         "data: [DONE]\n\n"
//   GET  /healthz       → 200 "ok\n"
// Error bodies are OpenAI-style JSON.
#include <cstdio>
#include <iostream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/http/server.h"

using magicpig::http::Request;
using magicpig::http::Responder;
using magicpig::http::Router;
using magicpig::http::Server;
using magicpig::http::ServerOptions;

int main() {
  Router router;
  router.Handle("POST", "/echo", [](const Request& req, Responder& res) {
    const bool chunked = req.headers.HasToken("transfer-encoding", "chunked");
    res.Send(200, "application/octet-stream", req.body,
             {{"X-Body-Bytes", std::to_string(req.body.size())},
              {"X-Chunked", chunked ? "yes" : "no"}})
        .IgnoreError();
  });
  router.Handle("GET", "/stream", [](const Request& req, Responder& res) {
    int n = 0;
    if (!absl::SimpleAtoi(req.query, &n)) n = 5;
    if (!res.StartStream(200, "text/event-stream", {{"Cache-Control", "no-cache"}}).ok()) return;
    for (int i = 0; i < n; ++i) {
      if (!res.Write(absl::StrCat("data: {\"i\": ", i, "}\n\n"))) return;
    }
    res.Write("data: [DONE]\n\n");
    res.End();
  });
  router.Handle("GET", "/healthz", [](const Request&, Responder& res) {
    res.Send(200, "text/plain", "ok\n").IgnoreError();
  });

  ServerOptions options;
  options.host = "127.0.0.1";
  options.max_body_bytes = 1 << 20;
  options.error_body = [](int status, std::string_view message) {
    return std::pair<std::string, std::string>(
        "application/json", absl::StrCat(R"({"error":{"message":")", std::string(message),
                                         R"(","type":"invalid_request_error","param":null,)",
                                         R"("code":)", status, "}}"));
  };
  auto server = Server::Start(options, std::move(router));
  if (!server.ok()) {
    std::cerr << server.status() << "\n";
    return 1;
  }
  std::printf("listening on 127.0.0.1:%d\n", (*server)->port());
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  (*server)->Shutdown(absl::Seconds(5));
  return 0;
}
