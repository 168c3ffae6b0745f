// /readyz means "can serve" (ready while at least one attention node answers, since the engine
// fails over), and its body names no node; a prompt array that the batch and the queue together
// can never hold is the request's fault (400), not a 429 to retry forever; the API key is checked
// before a body is read. Through real HTTP against in-process attention nodes.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attn_node/service/attention_server.h"
#include "common/http/test_client.h"
#include "common/json/json.h"
#include "gpu_node/engine/scheduler.h"
#include "gpu_node/server/api_server.h"
#include "gpu_node/server/serving_metrics.h"
#include "gtest/gtest.h"
#include "tests/testing/service_test_util.h"
#include "tests/testing/synthetic_engine.h"

namespace magicpig::server {
namespace {

// Nobody listens there: connecting fails at once.
constexpr char kDeadNode[] = "127.0.0.1:1";

struct Serving {
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<engine::Scheduler> scheduler;
  prometheus::Registry registry;
  std::unique_ptr<ApiServer> api;

  Serving(std::vector<std::string> nodes, engine::SchedulerOptions scheduling,
          std::string api_key = "", std::string metrics_listen = "") {
    engine::EngineOptions options;
    options.attention.dense_layers = {0};
    options.attention_nodes = std::move(nodes);
    options.node_security = fabric::TransportSecurity::Plaintext();
    auto e = testing::MakeSyntheticEngine(testing::SmallModel(), options);
    EXPECT_TRUE(e.ok()) << e.status();
    if (!e.ok()) return;
    engine = *std::move(e);
    scheduler = std::make_unique<engine::Scheduler>(engine.get(), scheduling, nullptr);
    ApiServerOptions api_options;
    api_options.http.host = "127.0.0.1";
    api_options.http.port = 0;
    api_options.model_name = "tiny";
    api_options.api_key = std::move(api_key);
    api_options.metrics_listen = std::move(metrics_listen);
    auto s = ApiServer::Start(engine.get(), scheduler.get(), &registry, api_options);
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) api = *std::move(s);
  }
  ~Serving() {
    if (scheduler != nullptr) scheduler->Shutdown(absl::ZeroDuration());
    if (api != nullptr) api->Shutdown(absl::Seconds(1));
  }

  http::ClientResponse Send(std::string_view method, std::string_view target,
                            std::string_view body = "", int port = 0) {
    absl::StatusOr<http::RawClient> client = http::RawClient::Connect(port ? port : api->port());
    EXPECT_TRUE(client.ok()) << client.status();
    if (!client.ok()) return {};
    EXPECT_TRUE(client->Send(http::HttpRequest(method, target, body, {"Connection: close"})).ok());
    absl::StatusOr<http::ClientResponse> response = client->ReadResponse(absl::Seconds(30));
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? *std::move(response) : http::ClientResponse{};
  }
};

TEST(ReadinessTest, ReadyWhileOneNodeAnswersAndNamesNoNode) {
  std::unique_ptr<AttentionServer> node = magicpig::testing::StartServer(int64_t{64} << 20, 1);
  ASSERT_NE(node, nullptr);
  {
    Serving serving({node->address(), kDeadNode}, {});
    ASSERT_NE(serving.api, nullptr);
    const http::ClientResponse r = serving.Send("GET", "/readyz");
    EXPECT_EQ(r.status, 200) << r.body;
    auto body = json::Parse(r.body);
    ASSERT_TRUE(body.ok()) << r.body;
    EXPECT_EQ(body->Find("attention_nodes")->Find("reachable")->as_int(), 1);
    EXPECT_EQ(body->Find("attention_nodes")->Find("total")->as_int(), 2);
    for (const std::string& address : {node->address(), std::string(kDeadNode)}) {
      EXPECT_EQ(r.body.find(address), std::string::npos) << r.body;
    }
  }
  Serving lost({kDeadNode}, {});
  ASSERT_NE(lost.api, nullptr);
  const http::ClientResponse r = lost.Send("GET", "/readyz");
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_EQ(r.body.find(kDeadNode), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("\"reachable\":0"), std::string::npos) << r.body;
}

TEST(ReadinessTest, PromptArrayBeyondBatchAndQueueIsTheRequestsFault) {
  Serving serving({}, {.max_batch = 1, .max_queue = 1});
  ASSERT_NE(serving.api, nullptr);
  const http::ClientResponse too_many =
      serving.Send("POST", "/v1/completions", R"({"prompt": ["a", "b", "c"], "max_tokens": 1})");
  EXPECT_EQ(too_many.status, 400) << too_many.body;
  auto body = json::Parse(too_many.body);
  ASSERT_TRUE(body.ok()) << too_many.body;
  EXPECT_EQ(body->Find("error")->Find("param")->as_string(), "prompt");
  EXPECT_NE(too_many.body.find("at most 2 prompts"), std::string::npos) << too_many.body;
  const http::ClientResponse fits =
      serving.Send("POST", "/v1/completions", R"({"prompt": ["a", "b"], "max_tokens": 1})");
  EXPECT_EQ(fits.status, 200) << fits.body;
}

// Without the key a request is refused before its body is read: the server does not wait for (or
// buffer) the 4 MB announced, and says why in the API's error shape.
TEST(ReadinessTest, KeyCheckedBeforeTheBody) {
  Serving serving({}, {}, "sesame");
  ASSERT_NE(serving.api, nullptr);
  absl::StatusOr<http::RawClient> client = http::RawClient::Connect(serving.api->port());
  ASSERT_TRUE(client.ok()) << client.status();
  const absl::Time start = absl::Now();
  ASSERT_TRUE(client
                  ->Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                         "Content-Type: application/json\r\nContent-Length: 4000000\r\n\r\n")
                  .ok());
  absl::StatusOr<http::ClientResponse> r = client->ReadResponse(absl::Seconds(10));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 401);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  auto body = json::Parse(r->body);
  ASSERT_TRUE(body.ok()) << r->body;
  EXPECT_EQ(body->Find("error")->Find("code")->as_string(), "invalid_api_key");
  EXPECT_TRUE(client->WaitClosed());
  // With the key, the same route reads the body and answers.
  absl::StatusOr<http::RawClient> keyed = http::RawClient::Connect(serving.api->port());
  ASSERT_TRUE(keyed.ok());
  ASSERT_TRUE(
      keyed
          ->Send(http::HttpRequest("POST", "/v1/completions", R"({"prompt": "a", "max_tokens": 1})",
                                   {"Authorization: Bearer sesame", "Connection: close"}))
          .ok());
  r = keyed->ReadResponse(absl::Seconds(30));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200) << r->body;
}

// --metrics-listen: /metrics moves to a port of its own (so a NetworkPolicy can open it to
// Prometheus only); the API port no longer serves it, the probes stay there.
TEST(ReadinessTest, MetricsOnAPortOfTheirOwn) {
  Serving serving({}, {}, "", "127.0.0.1:0");
  ASSERT_NE(serving.api, nullptr);
  ServingMetrics series(serving.registry);  // something to expose
  ASSERT_NE(serving.api->metrics_port(), 0);
  ASSERT_NE(serving.api->metrics_port(), serving.api->port());
  const http::ClientResponse metrics =
      serving.Send("GET", "/metrics", "", serving.api->metrics_port());
  EXPECT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.body.find("magicpig_num_requests_running"), std::string::npos) << metrics.body;
  EXPECT_EQ(serving.Send("GET", "/metrics").status, 404);
  EXPECT_EQ(serving.Send("GET", "/healthz").status, 200);
  EXPECT_EQ(serving.Send("GET", "/healthz", "", serving.api->metrics_port()).status, 404);
}

}  // namespace
}  // namespace magicpig::server
