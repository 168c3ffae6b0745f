// The compute node's request log: an ApiServer over a synthetic engine, driven through real HTTP
// requests, writes exactly one line per request into a test sink, with the response's id, the
// token counts of its usage, the finish reason and the status; refusals (401, 400, 404, 503) get
// their line too, and no line holds the prompt or the API key.
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/http/test_client.h"
#include "common/json/json.h"
#include "common/logging/logger.h"
#include "gpu_node/engine/scheduler.h"
#include "gpu_node/server/api_server.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "tests/testing/synthetic_engine.h"

namespace magicpig::server {
namespace {

constexpr char kKey[] = "sk-test-4f1c";
constexpr char kPrompt[] = "the quick brown fox";

class ApiServerLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    magicpig::testing::SyntheticModelOptions m;
    m.n_layer = 2;
    m.n_embd = 64;
    m.n_ff = 128;
    m.n_head = 4;
    m.n_head_kv = 2;
    m.context_length = 256;
    auto engine =
        magicpig::testing::MakeSyntheticEngine(m, magicpig::testing::FullAttentionOptions());
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
    scheduler_ =
        std::make_unique<engine::Scheduler>(engine_.get(), engine::SchedulerOptions{}, nullptr);
    ApiServerOptions options;
    options.http.host = "127.0.0.1";
    options.http.port = 0;
    options.model_name = "tiny";
    options.api_key = kKey;
    options.logger = &logger_;
    auto server = ApiServer::Start(engine_.get(), scheduler_.get(), &registry_, options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  void TearDown() override {
    if (scheduler_ != nullptr) scheduler_->Shutdown(absl::ZeroDuration());
    if (server_ != nullptr) server_->Shutdown(absl::Seconds(1));
  }

  // One request on a fresh connection; the response.
  http::ClientResponse Send(std::string_view method, std::string_view target, std::string_view body,
                            bool authorized = true) {
    absl::StatusOr<http::RawClient> client = http::RawClient::Connect(server_->port());
    EXPECT_TRUE(client.ok()) << client.status();
    if (!client.ok()) return {};
    std::vector<std::string> headers = {"Connection: close"};
    if (authorized) headers.push_back(absl::StrCat("Authorization: Bearer ", kKey));
    EXPECT_TRUE(client->Send(http::HttpRequest(method, target, body, headers)).ok());
    absl::StatusOr<http::ClientResponse> response = client->ReadResponse(absl::Seconds(60));
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? *std::move(response) : http::ClientResponse{};
  }

  // Waits for the sink to hold `n` lines (a line is written just after the response is sent),
  // then a little longer to see that no more arrive.
  std::vector<std::string> WaitForLines(size_t n) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (sink_.lines().size() < n && absl::Now() < deadline)
      absl::SleepFor(absl::Milliseconds(5));
    absl::SleepFor(absl::Milliseconds(50));
    return sink_.lines();
  }

  logging::MemoryLogSink sink_;
  logging::Logger logger_{"api", logging::LogLevel::kInfo, &sink_};
  prometheus::Registry registry_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<engine::Scheduler> scheduler_;
  std::unique_ptr<ApiServer> server_;
};

// The line's level letter and key=value fields (after "<time> <letter> api ").
struct Line {
  char level = '?';
  std::string fields;
};

Line ParseLine(const std::string& line) {
  static const std::regex kLine(
      R"(^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z ([DIWE]) api (.*)$)");
  std::smatch m;
  if (!std::regex_match(line, m, kLine)) {
    ADD_FAILURE() << "malformed line: " << line;
    return {};
  }
  return {m[1].str()[0], m[2].str()};
}

void ExpectNoSecrets(const std::string& line) {
  EXPECT_EQ(line.find(kKey), std::string::npos) << line;
  EXPECT_EQ(line.find("quick brown"), std::string::npos) << line;
}

TEST_F(ApiServerLogTest, CompletionWritesOneLineWithItsIdTokensAndStatus) {
  const std::string body = absl::StrCat(R"({"model": "tiny", "prompt": [")", kPrompt,
                                        R"(", "hello there"], "max_tokens": 5, "temperature": 0})");
  http::ClientResponse r = Send("POST", "/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  absl::StatusOr<json::Value> v = json::Parse(r.body);
  ASSERT_TRUE(v.ok()) << v.status();
  const std::string id = v->Find("id")->as_string();
  const json::Value& usage = *v->Find("usage");
  const int64_t prompt_tokens = usage.Find("prompt_tokens")->as_int();
  const int64_t completion_tokens = usage.Find("completion_tokens")->as_int();
  std::vector<std::string> finish;
  for (const json::Value& c : v->Find("choices")->as_array()) {
    finish.push_back(c.Find("finish_reason")->as_string());
  }
  ASSERT_EQ(finish.size(), 2u);

  const std::vector<std::string> lines = WaitForLines(1);
  ASSERT_EQ(lines.size(), 1u);
  const Line line = ParseLine(lines[0]);
  EXPECT_EQ(line.level, 'I');
  const std::regex kFields(
      absl::StrCat("^id=", id, " endpoint=/v1/completions stream=no prompt_tokens=", prompt_tokens,
                   " generated_tokens=", completion_tokens, " finish=", finish[0], ",", finish[1],
                   R"( ms=\d+ status=200$)"));
  EXPECT_TRUE(std::regex_match(line.fields, kFields)) << line.fields;
  ExpectNoSecrets(lines[0]);
}

TEST_F(ApiServerLogTest, StreamedChatWritesOneLine) {
  const std::string body =
      absl::StrCat(R"({"messages": [{"role": "user", "content": ")", kPrompt,
                   R"("}], "max_tokens": 4, "temperature": 0, )",
                   R"("stream": true, "stream_options": {"include_usage": true}})");
  http::ClientResponse r = Send("POST", "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  // The id and usage from the stream's events.
  std::string id;
  int64_t prompt_tokens = -1, completion_tokens = -1;
  for (size_t at = r.body.find("data: {"); at != std::string::npos;
       at = r.body.find("data: {", at + 1)) {
    const size_t end = r.body.find("\n\n", at);
    absl::StatusOr<json::Value> event = json::Parse(r.body.substr(at + 6, end - at - 6));
    ASSERT_TRUE(event.ok()) << event.status();
    id = event->Find("id")->as_string();
    if (const json::Value* u = event->Find("usage"); u != nullptr && u->is_object()) {
      prompt_tokens = u->Find("prompt_tokens")->as_int();
      completion_tokens = u->Find("completion_tokens")->as_int();
    }
  }
  ASSERT_TRUE(id.starts_with("chatcmpl-")) << r.body;
  ASSERT_GE(completion_tokens, 1) << r.body;

  const std::vector<std::string> lines = WaitForLines(1);
  ASSERT_EQ(lines.size(), 1u);
  const Line line = ParseLine(lines[0]);
  EXPECT_EQ(line.level, 'I');
  const std::regex kFields(absl::StrCat(
      "^id=", id, " endpoint=/v1/chat/completions stream=yes prompt_tokens=", prompt_tokens,
      " generated_tokens=", completion_tokens, R"( finish=(stop|length) ms=\d+ status=200$)"));
  EXPECT_TRUE(std::regex_match(line.fields, kFields)) << line.fields;
  ExpectNoSecrets(lines[0]);
}

TEST_F(ApiServerLogTest, RefusedRequestsWriteOneLineEach) {
  // 401: refused before the handler (no id yet).
  EXPECT_EQ(Send("POST", "/v1/completions", R"({"prompt": "x"})", /*authorized=*/false).status,
            401);
  std::vector<std::string> lines = WaitForLines(1);
  ASSERT_EQ(lines.size(), 1u);
  Line line = ParseLine(lines[0]);
  EXPECT_EQ(line.level, 'I');
  EXPECT_TRUE(line.fields.starts_with(
      "id=- endpoint=/v1/completions stream=no prompt_tokens=0 generated_tokens=0 finish=- ms="))
      << line.fields;
  EXPECT_TRUE(line.fields.ends_with(
      " status=401 error=\"Incorrect or missing API key: send 'Authorization: Bearer <key>'\""))
      << line.fields;

  // 400: the body is not JSON; the request has its id.
  EXPECT_EQ(Send("POST", "/v1/chat/completions", "{not json").status, 400);
  lines = WaitForLines(2);
  ASSERT_EQ(lines.size(), 2u);
  line = ParseLine(lines[1]);
  EXPECT_EQ(line.level, 'I');
  EXPECT_TRUE(std::regex_search(
      line.fields, std::regex(R"(^id=chatcmpl-\d+-\d+ endpoint=/v1/chat/completions )")))
      << line.fields;
  EXPECT_NE(line.fields.find(" status=400 error=\"the request body is not valid JSON: "),
            std::string::npos)
      << line.fields;

  // 404 from the HTTP layer (no route).
  EXPECT_EQ(Send("GET", "/v1/nothing", "").status, 404);
  lines = WaitForLines(3);
  ASSERT_EQ(lines.size(), 3u);
  line = ParseLine(lines[2]);
  EXPECT_EQ(line.level, 'I');
  EXPECT_EQ(line.fields, "endpoint=- status=404 error=\"no route for /v1/nothing\"");

  // Probes are DEBUG: nothing at INFO.
  EXPECT_EQ(Send("GET", "/healthz", "", /*authorized=*/false).status, 200);
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(sink_.lines().size(), 3u);

  // 503 once the scheduler is shutting down: a WARNING with the public message.
  scheduler_->Shutdown(absl::ZeroDuration());
  const std::string body =
      absl::StrCat(R"({"prompt": ")", kPrompt, R"(", "max_tokens": 2, "temperature": 0})");
  EXPECT_EQ(Send("POST", "/v1/completions", body).status, 503);
  lines = WaitForLines(4);
  ASSERT_EQ(lines.size(), 4u);
  line = ParseLine(lines[3]);
  EXPECT_EQ(line.level, 'W');
  EXPECT_TRUE(std::regex_match(
      line.fields, std::regex(R"(^id=cmpl-\d+-\d+ endpoint=/v1/completions stream=no )"
                              R"(prompt_tokens=[1-9]\d* generated_tokens=0 finish=- ms=\d+ )"
                              R"(status=503 error="the server is shutting down"$)")))
      << line.fields;
  for (const std::string& l : lines) ExpectNoSecrets(l);
}

TEST_F(ApiServerLogTest, NoLoggerMeansNoLines) {
  // A second server on the same engine without a logger: requests work, the sink stays empty.
  ApiServerOptions options;
  options.http.host = "127.0.0.1";
  options.model_name = "tiny";
  prometheus::Registry registry;
  auto quiet = ApiServer::Start(engine_.get(), scheduler_.get(), &registry, options);
  ASSERT_TRUE(quiet.ok()) << quiet.status();
  absl::StatusOr<http::RawClient> client = http::RawClient::Connect((*quiet)->port());
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE(client->Send(http::HttpRequest("GET", "/v1/models", "", {"Connection: close"})).ok());
  absl::StatusOr<http::ClientResponse> r = client->ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  (*quiet)->Shutdown(absl::Seconds(1));
  EXPECT_TRUE(sink_.lines().empty());
}

}  // namespace
}  // namespace magicpig::server
