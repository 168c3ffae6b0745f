// Router: the server's routing table: exact request path + method → handler. Built before the
// server starts and fixed from then on.
//
//   Router router;
//   router.Handle("POST", "/v1/completions", [&](const Request& req, Responder& res) { ... });
//   router.Handle("GET", "/healthz", [](const Request&, Responder& res) {
//     res.Send(200, "text/plain", "ok\n").IgnoreError();
//   });
//
// The server answers a request whose path has no route with 404, and one whose path has routes but
// not for its method with 405 and an "Allow" header listing the path's methods.
//
// Thread-safety: Handle must not run concurrently with anything. Find is const and may be called
// concurrently. Handlers are called concurrently from the connection threads, so they must be
// thread-safe; they may block (see server.h).
#ifndef MAGICPIG_COMMON_HTTP_ROUTER_H_
#define MAGICPIG_COMMON_HTTP_ROUTER_H_

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/http/message.h"
#include "common/http/responder.h"

namespace magicpig::http {

// Handler: answers one request through the Responder (see responder.h), on the connection's
// thread.
using Handler = std::function<void(const Request&, Responder&)>;

class Router {
 public:
  // Router::Handle routes `method` (case-sensitive, "GET") on the exact `path` ("/v1/models", no
  // query) to `handler`, replacing an earlier handler of the same method and path.
  Router& Handle(std::string method, std::string path, Handler handler);

  // Router::Find returns the handler for `method` on `path`, or nullptr. Then `*allow` is the
  // comma-separated methods routed on `path` ("GET, POST"), empty when the path is unknown.
  const Handler* Find(std::string_view method, std::string_view path, std::string* allow) const;

 private:
  // path → (method, handler) in registration order.
  std::map<std::string, std::vector<std::pair<std::string, Handler>>, std::less<>> routes_;
};

}  // namespace magicpig::http

#endif  // MAGICPIG_COMMON_HTTP_ROUTER_H_
