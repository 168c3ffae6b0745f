// The attention node's Prometheus metrics against what was done to an in-process AttentionServer
// over loopback gRPC: gauges equal ShardStore::Stats() at scrape time, the Attend counter and the
// histograms count the messages and commits made (the sampled fraction's sum is recomputed from
// the responses), refusals are counted by reason. Then the HTTP port: /metrics over a real socket
// passes `promtool check metrics` (no lint output), and /healthz, /readyz and /health before and
// while draining.
#include "attn_node/service/node_metrics.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "attn_node/service/attention_server.h"
#include "common/attention/simhash.h"
#include "common/http/test_client.h"
#include "common/metrics/metrics.h"
#include "gtest/gtest.h"
#include "tests/testing/exposition.h"
#include "tests/testing/service_test_util.h"

namespace magicpig {

using ::magicpig::attention::SimHash;
namespace {

using testing::Client;
using testing::LayerData;
using testing::MakeChunk;
using testing::MakeCreate;
using testing::MakeLayer;
using testing::MakeQuery;

constexpr int kKv = 2, kGroup = 2, kD = 32, kK = 5, kL = 12;
constexpr int64_t kBudget = int64_t{64} << 20;

double Sample(const std::string& text, const std::string& series) {
  return magicpig::testing::ExpositionSample(text, series);
}

std::unique_ptr<AttentionServer> StartServer(prometheus::Registry* registry) {
  AttentionServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.memory_budget_bytes = kBudget;
  options.threads = 2;
  options.metrics_listen = "127.0.0.1:0";
  options.metrics_registry = registry;
  auto server = AttentionServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(*server) : nullptr;
}

v1::CreateSequenceRequest Create(const std::string& id, std::vector<int> layers,
                                 int64_t max_tokens) {
  return MakeCreate(id, std::move(layers), kKv, kGroup, kD, kK, kL, v1::KV_DTYPE_F32,
                    v1::ESTIMATOR_MAGICPIG, 0, max_tokens);
}

// An Attend request for `id` at `layer` with a query near key `near` of each head.
v1::AttendRequest Attend(uint64_t step, const std::string& id, int layer, const LayerData& data,
                         const SimHash& hash, int near, std::mt19937& rng) {
  v1::AttendRequest r;
  r.set_step_id(step);
  r.set_layer(layer);
  r.set_scale(1.0f / std::sqrt(static_cast<float>(kD)));
  std::vector<float> q = testing::Randn(static_cast<size_t>(kKv) * kGroup * kD, rng, 0.3f);
  for (int h = 0; h < kKv * kGroup; ++h)
    for (int j = 0; j < kD; ++j) q[int64_t{h} * kD + j] += 2.0f * data.key(h / kGroup, near)[j];
  *r.add_queries() = MakeQuery(id, q, hash, nullptr);
  return r;
}

// `promtool check metrics` on `text`: its exit status and everything it printed.
std::pair<int, std::string> Promtool(const std::string& text) {
  char path[] = "/tmp/magicpig_metrics_XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return {-1, "mkstemp failed"};
  close(fd);
  std::ofstream(path) << text;
  FILE* p = popen(("promtool check metrics < " + std::string(path) + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while (p != nullptr && (n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = p != nullptr ? pclose(p) : -1;
  unlink(path);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

bool HavePromtool() { return std::system("command -v promtool > /dev/null 2>&1") == 0; }

absl::StatusOr<http::ClientResponse> Get(int port, const std::string& path) {
  auto c = http::RawClient::Connect(port);
  if (!c.ok()) return c.status();
  if (absl::Status s = c->Send(http::HttpRequest("GET", path)); !s.ok()) return s;
  return c->ReadResponse();
}

TEST(NodeMetricsTest, MetricsMatchWhatWasDone) {
  prometheus::Registry registry;
  metrics::AddBuildInfo(registry, "attention");
  auto server = StartServer(&registry);
  ASSERT_NE(server, nullptr);
  Client client(server->address());
  auto hash = SimHash::Create(kD, kK, kL, 77);
  ASSERT_TRUE(hash.ok());
  const LayerData data0 = MakeLayer(*hash, kKv, 300, 1);
  const LayerData data1 = MakeLayer(*hash, kKv, 120, 2);

  // Nothing yet: the gauges read the empty store; every refusal series exists at 0.
  std::string text = server->RenderMetrics();
  EXPECT_EQ(Sample(text, "magicpig_attn_sequences"), 0);
  EXPECT_EQ(Sample(text, "magicpig_attn_memory_budget_bytes"), kBudget);
  EXPECT_EQ(Sample(text, "magicpig_attn_memory_usage_ratio"), 0);
  for (const char* reason : {"budget", "invalid", "draining", "not_found"}) {
    EXPECT_EQ(Sample(text, "magicpig_attn_rejected_total{reason=\"" + std::string(reason) + "\"}"),
              0)
        << reason;
  }
  EXPECT_EQ(Sample(text, "magicpig_build_info{node_kind=\"attention\",version=\"" +
                             std::string(metrics::Version()) + "\"}"),
            1);

  // Two sequences; three AppendKV streams (commits); the first of two chunks.
  ASSERT_TRUE(client.Create(Create("a", {0, 1}, 400)).ok());
  ASSERT_TRUE(client.Create(Create("b", {0}, 200)).ok());
  ASSERT_TRUE(
      client.Append({MakeChunk("a", 0, data0, 0, 0, 200), MakeChunk("a", 0, data0, 0, 200, 100)})
          .ok());
  ASSERT_TRUE(client.Append({MakeChunk("a", 1, data1, 0, 0, 120)}).ok());
  ASSERT_TRUE(client.Append({MakeChunk("b", 0, data1, 0, 0, 80)}).ok());

  // Five Attend messages on two streams.
  std::mt19937 rng(9);
  std::vector<v1::AttendRequest> on_a, on_b;
  for (int i = 0; i < 3; ++i)
    on_a.push_back(Attend(i, "a", i == 2 ? 1 : 0, data0, *hash, 5 * i, rng));
  for (int i = 0; i < 2; ++i) on_b.push_back(Attend(i, "b", 0, data1, *hash, 3 + i, rng));
  std::vector<v1::AttendResponse> responses, more;
  ASSERT_TRUE(client.Attend(on_a, &responses).ok());
  ASSERT_TRUE(client.Attend(on_b, &more).ok());
  responses.insert(responses.end(), more.begin(), more.end());
  ASSERT_EQ(responses.size(), 5u);
  double fraction_sum = 0;
  int64_t touched_total = 0;
  for (const v1::AttendResponse& r : responses) {
    int64_t touched = 0, held = 0;
    for (const v1::SequencePartial& p : r.partials()) {
      for (int64_t t : p.n_touched()) touched += t;
      held += p.n_keys() * p.n_touched_size();
    }
    ASSERT_GT(held, 0);
    fraction_sum += static_cast<double>(touched) / static_cast<double>(held);
    touched_total += touched;
  }
  EXPECT_GT(touched_total, 0);  // the fraction is not trivially 0

  // Refusals: over the budget, an invalid shape, an unknown sequence in Attend and in Release,
  // and an id that exists.
  EXPECT_EQ(client.Create(Create("huge", {0, 1, 2, 3}, 1 << 20)).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  v1::CreateSequenceRequest bad = Create("bad", {0}, 10);
  bad.mutable_shape()->set_head_dim(17);
  EXPECT_EQ(client.Create(bad).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(client.Create(Create("a", {0}, 10)).error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(client.Attend({Attend(0, "nobody", 0, data0, *hash, 0, rng)}, &more).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(client.Release("nobody").error_code(), grpc::StatusCode::NOT_FOUND);

  const StoreStats stats = server->store().Stats();
  text = server->RenderMetrics();
  EXPECT_EQ(Sample(text, "magicpig_attn_sequences"), 2);
  EXPECT_EQ(stats.kv_tokens, 300 + 80);  // "a": its fullest layer; "b"
  EXPECT_EQ(Sample(text, "magicpig_attn_kv_tokens"), stats.kv_tokens);
  EXPECT_EQ(Sample(text, "magicpig_attn_kv_bytes"), stats.kv_bytes);
  EXPECT_EQ(Sample(text, "magicpig_attn_hash_table_bytes"), stats.table_bytes);
  EXPECT_GT(stats.kv_bytes, 0);
  EXPECT_GT(stats.table_bytes, 0);
  EXPECT_EQ(stats.kv_bytes + stats.table_bytes, stats.memory_actual_bytes);
  EXPECT_EQ(Sample(text, "magicpig_attn_memory_budget_bytes"), kBudget);
  EXPECT_DOUBLE_EQ(Sample(text, "magicpig_attn_memory_usage_ratio"),
                   static_cast<double>(stats.memory_used_bytes) / kBudget);
  EXPECT_GT(stats.memory_used_bytes, 0);

  EXPECT_EQ(Sample(text, "magicpig_attn_attend_requests_total"), 5);
  EXPECT_EQ(Sample(text, "magicpig_attn_step_duration_seconds_count"), 5);
  EXPECT_GT(Sample(text, "magicpig_attn_step_duration_seconds_sum"), 0);
  EXPECT_EQ(Sample(text, "magicpig_attn_step_duration_seconds_bucket{le=\"+Inf\"}"), 5);
  EXPECT_EQ(Sample(text, "magicpig_attn_sampled_fraction_count"), 5);
  EXPECT_NEAR(Sample(text, "magicpig_attn_sampled_fraction_sum"), fraction_sum, 1e-9);
  EXPECT_EQ(Sample(text, "magicpig_attn_sampled_fraction_bucket{le=\"1\"}"), 5);
  EXPECT_EQ(Sample(text, "magicpig_attn_table_build_seconds_count"), 3);
  EXPECT_EQ(Sample(text, "magicpig_attn_rejected_total{reason=\"budget\"}"), 1);
  EXPECT_EQ(Sample(text, "magicpig_attn_rejected_total{reason=\"invalid\"}"), 2);
  EXPECT_EQ(Sample(text, "magicpig_attn_rejected_total{reason=\"not_found\"}"), 2);
  EXPECT_EQ(Sample(text, "magicpig_attn_rejected_total{reason=\"draining\"}"), 0);

  // Releasing a sequence shows at the next scrape.
  ASSERT_TRUE(client.Release("b").ok());
  text = server->RenderMetrics();
  EXPECT_EQ(Sample(text, "magicpig_attn_sequences"), 1);
  EXPECT_EQ(Sample(text, "magicpig_attn_kv_tokens"), 300);
  EXPECT_EQ(Sample(text, "magicpig_attn_kv_bytes"), server->store().Stats().kv_bytes);

  // Draining: a new sequence is refused and counted.
  server->StartDraining();
  EXPECT_EQ(client.Create(Create("late", {0}, 10)).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Sample(server->RenderMetrics(), "magicpig_attn_rejected_total{reason=\"draining\"}"),
            1);
}

// Idle sockets that fill every slot of the probe port are dropped after its short idle timeout:
// /healthz answers again within seconds, not after the default minute (a liveness probe fails
// in 30 s).
TEST(NodeMetricsTest, IdleSocketsCannotStarveTheProbes) {
  prometheus::Registry registry;
  auto server = StartServer(&registry);
  ASSERT_NE(server, nullptr);
  std::vector<http::RawClient> idle;
  for (int i = 0; i < 80; ++i) {  // more than the port's 64 slots
    auto c = http::RawClient::Connect(server->metrics_port());
    ASSERT_TRUE(c.ok()) << c.status();
    idle.push_back(*std::move(c));
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<http::ClientResponse> r = absl::UnavailableError("not tried");
  while (absl::Now() - start < absl::Seconds(20)) {
    r = Get(server->metrics_port(), "/healthz");
    if (r.ok() && r->status == 200) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST(NodeMetricsTest, HttpPortServesMetricsAndProbes) {
  prometheus::Registry registry;
  metrics::AddBuildInfo(registry, "attention");
  auto server = StartServer(&registry);
  ASSERT_NE(server, nullptr);
  ASSERT_GT(server->metrics_port(), 0);
  EXPECT_EQ(server->metrics_address(), "127.0.0.1:" + std::to_string(server->metrics_port()));
  Client client(server->address());
  auto hash = SimHash::Create(kD, kK, kL, 77);
  ASSERT_TRUE(hash.ok());
  const LayerData data = MakeLayer(*hash, kKv, 100, 1);
  ASSERT_TRUE(client.Create(Create("a", {0}, 100)).ok());
  ASSERT_TRUE(client.Append({MakeChunk("a", 0, data, 0, 0, 100)}).ok());
  std::mt19937 rng(1);
  std::vector<v1::AttendResponse> responses;
  ASSERT_TRUE(client.Attend({Attend(0, "a", 0, data, *hash, 3, rng)}, &responses).ok());

  auto metrics_response = Get(server->metrics_port(), "/metrics");
  ASSERT_TRUE(metrics_response.ok()) << metrics_response.status();
  EXPECT_EQ(metrics_response->status, 200);
  ASSERT_NE(metrics_response->headers.Find("content-type"), nullptr);
  EXPECT_EQ(*metrics_response->headers.Find("content-type"), metrics::kContentType);
  const std::string& body = metrics_response->body;
  EXPECT_EQ(Sample(body, "magicpig_attn_sequences"), 1);
  EXPECT_EQ(Sample(body, "magicpig_attn_kv_tokens"), 100);
  EXPECT_EQ(Sample(body, "magicpig_attn_kv_bytes"), server->store().Stats().kv_bytes);
  EXPECT_EQ(Sample(body, "magicpig_attn_attend_requests_total"), 1);
  EXPECT_NE(body.find("# TYPE magicpig_attn_step_duration_seconds histogram"), std::string::npos);
  EXPECT_NE(body.find("# TYPE magicpig_attn_rejected_total counter"), std::string::npos);

  if (HavePromtool()) {
    const auto [code, output] = Promtool(body);
    EXPECT_EQ(code, 0) << output;
    EXPECT_EQ(output, "") << "promtool check metrics printed lint problems";
  } else {
    ADD_FAILURE() << "promtool not found (Debian package 'prometheus'; scripts/bootstrap)";
  }

  for (const char* path : {"/healthz", "/readyz", "/health"}) {
    auto r = Get(server->metrics_port(), path);
    ASSERT_TRUE(r.ok()) << path << ": " << r.status();
    EXPECT_EQ(r->status, 200) << path;
  }
  auto missing = Get(server->metrics_port(), "/nope");
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ(missing->status, 404);

  // Draining: not ready, still alive; metrics still served.
  server->StartDraining();
  for (const auto& [path, want] : std::vector<std::pair<std::string, int>>{
           {"/healthz", 200}, {"/readyz", 503}, {"/health", 503}, {"/metrics", 200}}) {
    auto r = Get(server->metrics_port(), path);
    ASSERT_TRUE(r.ok()) << path << ": " << r.status();
    EXPECT_EQ(r->status, want) << path;
  }

  // After shutdown the port is closed.
  const int port = server->metrics_port();
  server->Shutdown(std::chrono::system_clock::now());
  EXPECT_FALSE(Get(port, "/healthz").ok());
}

// Leases over gRPC: an orphaned sequence (its client gone) is released after --sequence-ttl and
// counted; one whose client keeps attending lives on.
TEST(NodeMetricsTest, OrphanedSequencesExpireWhileUsedOnesLive) {
  prometheus::Registry registry;
  AttentionServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.memory_budget_bytes = kBudget;
  options.threads = 1;
  options.metrics_registry = &registry;
  // 1 s: an Attend every 100 ms renews it with room to spare on a loaded machine.
  options.sequence_ttl = std::chrono::milliseconds(1000);
  auto server = AttentionServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  Client client((*server)->address());
  auto hash = SimHash::Create(kD, kK, kL, 77);
  ASSERT_TRUE(hash.ok());
  const LayerData data = MakeLayer(*hash, kKv, 100, 1);
  ASSERT_TRUE(client.Create(Create("orphan", {0}, 200)).ok());
  ASSERT_TRUE(client.Create(Create("used", {0}, 200)).ok());
  ASSERT_TRUE(client.Append({MakeChunk("used", 0, data, 0, 0, 100)}).ok());
  EXPECT_EQ(Sample((*server)->RenderMetrics(), "magicpig_attn_sequences_expired_total"), 0);
  // Three seconds (three TTLs) of attending "used" every 100 ms.
  std::mt19937 rng(3);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  uint64_t step = 0;
  while (std::chrono::steady_clock::now() < end) {
    std::vector<v1::AttendResponse> responses;
    ASSERT_TRUE(client.Attend({Attend(step++, "used", 0, data, *hash, 3, rng)}, &responses).ok())
        << "the used sequence expired at step " << step;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const StoreStats stats = (*server)->store().Stats();
  EXPECT_EQ(stats.sequences, 1);
  ASSERT_EQ((*server)->store().HeldSequences().size(), 1u);
  EXPECT_EQ((*server)->store().HeldSequences()[0].id, "used");
  EXPECT_EQ(Sample((*server)->RenderMetrics(), "magicpig_attn_sequences_expired_total"), 1);
}

TEST(NodeMetricsTest, NoMetricsPortAndOwnRegistry) {
  AttentionServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.memory_budget_bytes = kBudget;
  options.threads = 1;
  auto server = AttentionServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ((*server)->metrics_port(), 0);
  EXPECT_EQ((*server)->metrics_address(), "");
  // The server's own registry still counts.
  EXPECT_EQ(Sample((*server)->RenderMetrics(), "magicpig_attn_memory_budget_bytes"), kBudget);

  options.metrics_listen = "no-port";
  EXPECT_EQ(AttentionServer::Start(options).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace magicpig
