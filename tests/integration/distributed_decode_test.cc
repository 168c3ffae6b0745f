// Distributed decoding end to end (issue #4): the real model (SmolLM2-135M) decodes greedily
// through 1, 2 and 3 attention-node processes on loopback ports and must give the embedded run's
// tokens (same prompt, same hash seed). Three prompts, one longer than 4K tokens.
//
// Why equality can hold exactly: the offloaded region is stored in blocks (shard_block tokens;
// 256 here, so even the shortest prompt spans two blocks), each block attended on its own
// and the per-block partials merged in block order, embedded and remote alike — the same
// arithmetic wherever the blocks live. (Without that, merging differently split ranges differs in
// the last float bits, which can flip a SimHash bit of a later query and then a near-tie token.)
// Exact attention through the nodes (top-k covering every key, fp32 shards) is checked too.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu_node/engine/engine.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "tests/testing/dev_pki.h"
#include "tests/testing/fake_device_backend.h"
#include "tests/testing/spot_writer.h"
#include "tests/testing/subprocess.h"

namespace magicpig {

using ::magicpig::attention::KvStorage;
namespace {

std::string SourceDir() {
  const char* dir = std::getenv("MAGICPIG_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// magicpig_attn_rpc_errors_total{node, code} from the compute node's registry (0 when absent).
double RpcErrors(prometheus::Registry& registry, const std::string& node, const std::string& code) {
  double total = 0;
  for (const auto& family : registry.Collect()) {
    if (family.name != "magicpig_attn_rpc_errors_total") continue;
    for (const auto& metric : family.metric) {
      bool node_match = false, code_match = false;
      for (const auto& label : metric.label) {
        node_match |= label.name == "node" && label.value == node;
        code_match |= label.name == "code" && label.value == code;
      }
      if (node_match && code_match) total += metric.counter.value;
    }
  }
  return total;
}

// Random (untrained) spotlight hashes of SmolLM2's shape, 64 bits, every layer: which keys are
// near does not matter here, only that the codes travel and the nodes retrieve as embedded.
const std::string& SpotFile() {
  static const std::string path = [] {
    std::vector<uint32_t> layers(30);
    for (uint32_t l = 0; l < 30; ++l) layers[l] = l;
    const std::string p = ::testing::TempDir() + "/smollm2-random.spot";
    EXPECT_TRUE(testing::WriteSpotFile(testing::RandomFile(64, 64, 30, 9, 3, layers, 5, ""), p));
    return p;
  }();
  return path;
}

std::unique_ptr<engine::Engine> LoadEngine(
    const std::vector<std::string>& nodes, bool exact_topk = false,
    std::chrono::milliseconds attend_timeout = std::chrono::milliseconds(10000),
    prometheus::Registry* registry = nullptr, bool fake_device = false,
    const fabric::TransportSecurity& security = fabric::TransportSecurity::Plaintext(),
    attention::EstimatorKind mode = attention::EstimatorKind::kMagicPig) {
  engine::EngineOptions options;
  options.attention.mode = mode;
  options.attention.vattention = {.epsilon = 0.1, .delta = 0.1, .heavy = 0, .base_rate = 0.02};
  if (attention::SpecOf(mode).index == attention::KvIndex::kCodes) {
    options.attention.spotlight_file = SpotFile();
  }
  options.node_security = security;
  options.metrics_registry = registry;
  options.attend_timeout = attend_timeout;
  options.model_path = SourceDir() + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  options.num_threads = 2;
  options.attention_nodes = nodes;
  options.attention.shard_block = 256;
  options.attention.min_offload_keys = 1;  // prompts of a few hundred tokens
  // Every sequence over every node: the tests below are about blocks on several nodes (merging,
  // losing one); packed placement is covered by engine_ping_pong_test.
  options.placement = remote::Placement::kSpread;
  if (exact_topk) {
    options.attention.mode = attention::EstimatorKind::kTopK;
    options.attention.budget = 1 << 20;
    options.attention.storage = KvStorage::kF32;
    options.float_activations = true;
  }
  absl::StatusOr<std::unique_ptr<engine::Engine>> e;
  if (fake_device) {
    // Read the weights in the layout the embedded CPU engine uses (interleaved on AVX-512), so
    // that the two compute the same products.
    auto device = std::make_unique<testing::FakeDeviceBackend>(2);
    auto file = model::GgufFile::Open(options.model_path, device->wants_interleaved_weights()
                                                              ? model::GgufLoad::kReadInterleaved
                                                              : model::GgufLoad::kMap);
    EXPECT_TRUE(file.ok()) << file.status();
    if (!file.ok()) return nullptr;
    e = engine::Engine::Create(std::shared_ptr<const model::GgufFile>(*std::move(file)),
                               std::move(device), options);
  } else {
    e = engine::Engine::Load(options);
  }
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

class DistributedDecodeTest : public ::testing::Test {
 protected:
  // Plaintext nodes (--insecure) unless `flags` name TLS files.
  void StartNodes(int n, std::vector<std::string> flags) {
    if (std::find(flags.begin(), flags.end(), "--tls-cert") == flags.end()) {
      flags.push_back("--insecure");
    }
    for (int i = 0; i < n; ++i) {
      auto node = testing::StartAttentionNode(MAGICPIG_ATTN_NODE_BINARY, flags);
      ASSERT_TRUE(node.ok()) << node.status();
      procs_.push_back(std::move(node->first));
      addresses_.push_back(node->second);
    }
  }
  std::vector<std::string> First(int n) const {
    return std::vector<std::string>(addresses_.begin(), addresses_.begin() + n);
  }
  std::vector<std::unique_ptr<testing::Subprocess>> procs_;
  std::vector<std::string> addresses_;
};

engine::GenerateRequest Request(const std::vector<int32_t>& prompt, int64_t max_tokens) {
  engine::GenerateRequest req;
  req.prompt = prompt;
  req.max_tokens = max_tokens;
  req.ignore_eos = true;
  return req;
}

TEST_F(DistributedDecodeTest, OneTwoThreeNodesMatchEmbedded) {
  const std::string fact = ReadFile(SourceDir() + "/examples/buried_fact.txt");
  ASSERT_GT(fact.size(), 10000u);
  auto embedded = LoadEngine({});
  ASSERT_NE(embedded, nullptr);
  struct Prompt {
    std::string text;
    int64_t max_tokens;
  };
  const std::vector<Prompt> prompts = {
      {fact.substr(0, 1500) + "\n\nSummarise the passage above in one sentence.", 24},
      {fact.substr(fact.size() / 2, 5000) + "\n\nWhat happens next?", 24},
      // > 4K tokens: the whole passage (~3.8K tokens with its question) and more text before it.
      {fact.substr(0, 2400) + "\n\n" + fact, 16},
  };
  std::vector<std::vector<int32_t>> ids, want;
  std::vector<engine::GenerateStats> want_stats;
  for (const Prompt& p : prompts) {
    auto chat = embedded->EncodeChat({{"user", p.text}});
    ASSERT_TRUE(chat.ok());
    ids.push_back(*chat);
    auto r = embedded->Generate(Request(*chat, p.max_tokens), {});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_GT(r->stats.attention_keys_offloaded, 0);
    want.push_back(r->tokens);
    want_stats.push_back(r->stats);
  }
  ASSERT_GT(ids.back().size(), 4096u);
  embedded.reset();

  StartNodes(3, {"--threads", "2", "--memory-budget", "4G"});
  for (int nodes = 1; nodes <= 3; ++nodes) {
    auto remote = LoadEngine(First(nodes));
    ASSERT_NE(remote, nullptr);
    for (size_t p = 0; p < prompts.size(); ++p) {
      auto r = remote->Generate(Request(ids[p], prompts[p].max_tokens), {});
      ASSERT_TRUE(r.ok()) << r.status();
      const std::string what =
          absl::StrCat(nodes, " node(s), prompt ", p, " (", ids[p].size(), " tokens)");
      EXPECT_GT(r->stats.attention_shard_bytes, 0) << what;
      ASSERT_EQ(r->tokens.size(), want[p].size()) << what;
      EXPECT_EQ(r->tokens, want[p]) << what;
      EXPECT_EQ(r->stats.attention_keys_touched, want_stats[p].attention_keys_touched) << what;
      EXPECT_EQ(r->stats.attention_keys_offloaded, want_stats[p].attention_keys_offloaded) << what;
    }
  }

  // The dense layers on a device backend (FakeDeviceBackend: device memory rules, CPU arithmetic)
  // with the router on the cache's host mirror: the same tokens through 2 nodes.
  {
    auto device = LoadEngine(First(2), false, std::chrono::milliseconds(10000), nullptr,
                             /*fake_device=*/true);
    ASSERT_NE(device, nullptr);
    for (size_t p = 0; p < prompts.size(); ++p) {
      auto r = device->Generate(Request(ids[p], prompts[p].max_tokens), {});
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->tokens, want[p]) << "device path, 2 nodes, prompt " << p;
      EXPECT_EQ(r->stats.attention_keys_touched, want_stats[p].attention_keys_touched);
      EXPECT_GT(r->stats.kv_bytes_released, 0) << "the offloaded rows left the host mirror";
    }
  }

  // Exact attention through 2 and 3 nodes equals exact attention in process.
  auto exact_embedded = LoadEngine({}, /*exact_topk=*/true);
  ASSERT_NE(exact_embedded, nullptr);
  std::vector<std::vector<int32_t>> exact_want;
  for (size_t p = 0; p < 2; ++p) {
    auto r = exact_embedded->Generate(Request(ids[p], 16), {});
    ASSERT_TRUE(r.ok()) << r.status();
    exact_want.push_back(r->tokens);
  }
  for (int nodes = 2; nodes <= 3; ++nodes) {
    auto remote = LoadEngine(First(nodes), /*exact_topk=*/true);
    ASSERT_NE(remote, nullptr);
    for (size_t p = 0; p < 2; ++p) {
      auto r = remote->Generate(Request(ids[p], 16), {});
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->tokens, exact_want[p]) << "exact, " << nodes << " nodes, prompt " << p;
      EXPECT_EQ(r->stats.attention_keys_touched, r->stats.attention_keys_offloaded);
    }
  }

  // vAttention's, spotlight's and sketch's estimators through 2 nodes: their parameters travel in
  // ShardShape and the draws depend on the query and the block only, so the tokens and the keys
  // touched are the embedded ones, and the sample leaves keys unread. Spotlight's learned codes and
  // the key sketches travel the same way (lsh_k = 16, lsh_l = words) into codes-only shards.
  for (attention::EstimatorKind mode :
       {attention::EstimatorKind::kVAttention, attention::EstimatorKind::kVAttentionLsh,
        attention::EstimatorKind::kSpotlight, attention::EstimatorKind::kVAttentionSpotlight,
        attention::EstimatorKind::kSketch, attention::EstimatorKind::kVAttentionSketch}) {
    const char* name = attention::EstimatorName(mode).data();
    auto local = LoadEngine({}, false, std::chrono::milliseconds(10000), nullptr, false,
                            fabric::TransportSecurity::Plaintext(), mode);
    auto remote = LoadEngine(First(2), false, std::chrono::milliseconds(10000), nullptr, false,
                             fabric::TransportSecurity::Plaintext(), mode);
    ASSERT_NE(local, nullptr);
    ASSERT_NE(remote, nullptr);
    auto a = local->Generate(Request(ids[0], 12), {});
    auto b = remote->Generate(Request(ids[0], 12), {});
    ASSERT_TRUE(a.ok() && b.ok()) << name << ": " << b.status();
    EXPECT_EQ(a->tokens, b->tokens) << name;
    EXPECT_EQ(a->stats.attention_keys_touched, b->stats.attention_keys_touched) << name;
    EXPECT_GT(a->stats.attention_keys_touched, 0) << name;
    EXPECT_LT(a->stats.attention_keys_touched, a->stats.attention_keys_offloaded) << name;
    if (mode == attention::EstimatorKind::kSpotlight || mode == attention::EstimatorKind::kSketch) {
      // On a device backend the router codes the host copy of each query (the device computes
      // SimHash codes only): the same tokens.
      auto device = LoadEngine(First(2), false, std::chrono::milliseconds(10000), nullptr,
                               /*fake_device=*/true, fabric::TransportSecurity::Plaintext(), mode);
      ASSERT_NE(device, nullptr);
      auto c = device->Generate(Request(ids[0], 12), {});
      ASSERT_TRUE(c.ok()) << c.status();
      EXPECT_EQ(a->tokens, c->tokens) << name << " on a device backend";
    }
    if (mode == attention::EstimatorKind::kSpotlight) {
      // Spotlight's rescoring travels too (ShardShape.spotlight_rerank): rescored from 4x the
      // retrieved keys, the nodes give the embedded log-probabilities, which differ from the
      // unrescored ones (so the parameter took effect on both sides).
      auto logprobs = [&](engine::Engine& e, int64_t rerank) {
        engine::GenerateRequest rq = Request(ids[0], 12);
        rq.top_logprobs = 0;
        rq.attention = e.attention_options();
        rq.attention->spotlight_rerank = rerank;
        auto r = e.Generate(rq, {});
        EXPECT_TRUE(r.ok()) << r.status();
        std::vector<float> lp;
        if (r.ok()) {
          for (const engine::TokenLogprob& t : r->logprobs) lp.push_back(t.logprob);
        }
        return lp;
      };
      const std::vector<float> embedded4 = logprobs(*local, 4);
      const std::vector<float> remote4 = logprobs(*remote, 4);
      const std::vector<float> embedded1 = logprobs(*local, 1);
      ASSERT_EQ(embedded4.size(), 12u);
      ASSERT_EQ(remote4.size(), 12u);
      ASSERT_EQ(embedded1.size(), 12u);
      float largest_change = 0;  // well above the nodes' tolerance below
      for (size_t i = 0; i < embedded4.size(); ++i) {
        EXPECT_NEAR(remote4[i], embedded4[i], 1e-4) << "token " << i;
        largest_change = std::max(largest_change, std::abs(embedded4[i] - embedded1[i]));
      }
      EXPECT_GT(largest_change, 1e-2f);
    }
  }
}

// Mutual TLS (issue #36): nodes that require a client certificate of their CA serve a compute node
// that has one (the embedded run's tokens, through both nodes) and refuse one that has a
// certificate of another CA or none (plaintext): its request fails cleanly.
TEST_F(DistributedDecodeTest, MutualTlsServesTheCertifiedAndRefusesTheRest) {
  testing::DevPki pki("decode");
  ASSERT_TRUE(pki.ok()) << "scripts/dev-certs failed (is openssl installed?)";
  const std::string fact = ReadFile(SourceDir() + "/examples/buried_fact.txt");
  auto embedded = LoadEngine({});
  ASSERT_NE(embedded, nullptr);
  auto chat = embedded->EncodeChat({{"user", fact.substr(0, 1500) + "\n\nWhat is this about?"}});
  ASSERT_TRUE(chat.ok());
  auto want = embedded->Generate(Request(*chat, 8), {});
  ASSERT_TRUE(want.ok()) << want.status();
  embedded.reset();

  std::vector<std::string> flags = {"--threads", "1", "--memory-budget", "1G"};
  for (const std::string& f : pki.Flags("node")) flags.push_back(f);
  StartNodes(2, flags);
  {
    auto remote = LoadEngine(addresses_, false, std::chrono::milliseconds(10000), nullptr, false,
                             pki.Security("compute"));
    ASSERT_NE(remote, nullptr);
    auto r = remote->Generate(Request(*chat, 8), {});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_GT(r->stats.attention_shard_bytes, 0);
    EXPECT_EQ(r->tokens, want->tokens);
  }
  for (const auto& [what, security] :
       {std::pair{"a certificate of another CA", pki.Security("rogue")},
        std::pair{"plaintext", fabric::TransportSecurity::Plaintext()}}) {
    auto stranger =
        LoadEngine(addresses_, false, std::chrono::milliseconds(10000), nullptr, false, security);
    ASSERT_NE(stranger, nullptr) << what;
    auto r = stranger->Generate(Request(*chat, 8), {});
    ASSERT_FALSE(r.ok()) << what << ": a stranger was served";
    // Refused at the handshake: no node can be reached, so none has room for the sequence.
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << what << ": " << r.status();
  }
}

// Kill -9 one of two attention nodes during a generation: the engine rebuilds the sequence on the
// survivor from its token history (prompt prefill, replay of the generated tokens), the
// request completes with the same tokens as the embedded run, and afterwards the survivor holds
// nothing for it (its accounting matches the router's view: sequence released). The node dies
// after the 8th piece of text, so sparse steps ran on both nodes before the failure.
TEST_F(DistributedDecodeTest, NodeKilledMidGenerationRecoversWithSameTokens) {
  const std::string fact = ReadFile(SourceDir() + "/examples/buried_fact.txt");
  auto embedded = LoadEngine({});
  ASSERT_NE(embedded, nullptr);
  auto chat = embedded->EncodeChat({{"user", fact.substr(0, 3000) + "\n\nWhat is this about?"}});
  ASSERT_TRUE(chat.ok());
  auto want = embedded->Generate(Request(*chat, 32), {});
  ASSERT_TRUE(want.ok());
  embedded.reset();

  StartNodes(2, {"--threads", "1", "--memory-budget", "2G"});
  auto remote = LoadEngine(addresses_);
  ASSERT_NE(remote, nullptr);
  int pieces = 0;
  engine::GenerateCallbacks callbacks;
  callbacks.on_text = [&](std::string_view) {
    if (++pieces == 8) procs_[0]->Stop(SIGKILL);
  };
  auto got = remote->Generate(Request(*chat, 32), callbacks);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_GE(pieces, 16);
  EXPECT_EQ(got->tokens, want->tokens);
  EXPECT_GE(got->stats.attention_recoveries, 1);
  EXPECT_GT(got->stats.attention_keys_offloaded, 0);
  // The rebuilt sequence gave its offloaded rows back too: at least half of the sparse layers'
  // share of the cache (28 of 30 layers, ~2.9K of ~3.1K positions offloaded).
  const int64_t row_bytes = 2 * 2 * 3 * 64;  // K and V, fp16, 3 kv heads x 64
  EXPECT_GT(got->stats.kv_bytes_released,
            int64_t{28} * row_bytes * static_cast<int64_t>(chat->size()) / 2);
  // The survivor: the sequence was released at the end, nothing is left reserved.
  remote::AttentionNodeClient survivor(addresses_[1]);
  grpc::ClientContext ctx;
  magicpig::v1::NodeStatusRequest status_req;
  magicpig::v1::NodeStatusResponse status;
  ASSERT_TRUE(survivor.stub().NodeStatus(&ctx, status_req, &status).ok());
  EXPECT_EQ(status.sequences(), 0);
  EXPECT_EQ(status.memory_used_bytes(), 0);
}

// A hung node: SIGSTOP one of two nodes during a generation. Its process keeps the connections
// open but answers nothing, so only the Attend timeout (1 s here) notices; the router places the
// sequence again on the other node and the request completes with the embedded run's tokens. The
// survivor holds nothing at the end. The stopped node is not asked to release anything while it
// hangs (it would hold each release for its deadline); once it runs again the compute node's
// deferred releases free what it held (not its lease, ten minutes away).
TEST_F(DistributedDecodeTest, NodeHungMidGenerationTimesOutWithSameTokens) {
  const std::string fact = ReadFile(SourceDir() + "/examples/buried_fact.txt");
  auto embedded = LoadEngine({});
  ASSERT_NE(embedded, nullptr);
  auto chat = embedded->EncodeChat({{"user", fact.substr(0, 3000) + "\n\nWhat is this about?"}});
  ASSERT_TRUE(chat.ok());
  auto want = embedded->Generate(Request(*chat, 24), {});
  ASSERT_TRUE(want.ok());
  embedded.reset();

  StartNodes(2, {"--threads", "1", "--memory-budget", "2G"});
  auto remote = LoadEngine(addresses_, false, std::chrono::milliseconds(1000));
  ASSERT_NE(remote, nullptr);
  int pieces = 0;
  engine::GenerateCallbacks callbacks;
  callbacks.on_text = [&](std::string_view) {
    if (++pieces == 6) kill(procs_[0]->pid(), SIGSTOP);
  };
  const auto start = std::chrono::steady_clock::now();
  auto got = remote->Generate(Request(*chat, 24), callbacks);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->tokens, want->tokens);
  EXPECT_GE(got->stats.attention_recoveries, 1);
  // Not a speed check: a generous bound that a wait for the 10 s control deadlines (or worse, no
  // timeout at all) would exceed.
  EXPECT_LT(seconds, 60.0);
  remote::AttentionNodeClient survivor(addresses_[1]);
  grpc::ClientContext ctx;
  magicpig::v1::NodeStatusRequest status_req;
  magicpig::v1::NodeStatusResponse status;
  ASSERT_TRUE(survivor.stub().NodeStatus(&ctx, status_req, &status).ok());
  EXPECT_EQ(status.sequences(), 0);
  EXPECT_EQ(status.memory_used_bytes(), 0);
  kill(procs_[0]->pid(), SIGCONT);
  remote::AttentionNodeClient revived(addresses_[0]);
  int64_t held = -1;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < end) {
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    magicpig::v1::NodeStatusResponse st;
    if (revived.stub().NodeStatus(&c, status_req, &st).ok()) {
      held = st.sequences();
      if (held == 0) {
        EXPECT_EQ(st.memory_used_bytes(), 0);
        break;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(held, 0) << "the revived node still holds the moved sequence";
}

// Admission: with 256-token blocks a block of this 1041-token prompt reserves 36.1 MiB on a node
// (bucket offsets dominate; 16-bit offsets and table indices) and the last block 49.3 MiB (it also
// reserves room for the generation). Nodes of 198 MiB and 42 MiB: placement by free memory gives
// the large node three blocks and the small one the last (3.3 : 0.7 blocks, largest remainders),
// the small node refuses (RESOURCE_EXHAUSTED: 49.3 MiB > 42 MiB), and the sequence is placed
// again, all on the large node (157.7 MiB); the tokens are the embedded ones. Two nodes of
// 66 MiB (one block each, not two): both placements are refused and the request fails with a
// clear error, leaving nothing reserved on either node; a smaller request (a 36.1 and a 40.8 MiB
// block) then runs on the same nodes (nothing else was disturbed).
TEST_F(DistributedDecodeTest, RefusedShardIsPlacedElsewhereOrFailsCleanly) {
  const std::string fact = ReadFile(SourceDir() + "/examples/buried_fact.txt");
  auto embedded = LoadEngine({});
  ASSERT_NE(embedded, nullptr);
  auto big = embedded->EncodeChat({{"user", fact.substr(fact.size() / 2, 5000) + "\n\nWhy?"}});
  auto small = embedded->EncodeChat({{"user", fact.substr(0, 1500) + "\n\nWho is there?"}});
  ASSERT_TRUE(big.ok() && small.ok());
  ASSERT_GT(big->size(), 900u);
  ASSERT_LT(big->size(), 1100u);
  auto want = embedded->Generate(Request(*big, 24), {});
  ASSERT_TRUE(want.ok());
  embedded.reset();

  StartNodes(1, {"--threads", "1", "--memory-budget", "198M"});
  StartNodes(1, {"--threads", "1", "--memory-budget", "42M"});
  StartNodes(2, {"--threads", "1", "--memory-budget", "66M"});
  auto node_status = [&](int i) {
    remote::AttentionNodeClient client(addresses_[static_cast<size_t>(i)]);
    grpc::ClientContext ctx;
    magicpig::v1::NodeStatusRequest req;
    magicpig::v1::NodeStatusResponse st;
    EXPECT_TRUE(client.stub().NodeStatus(&ctx, req, &st).ok());
    return st;
  };
  {
    prometheus::Registry registry;
    auto remote = LoadEngine({addresses_[0], addresses_[1]}, false,
                             std::chrono::milliseconds(10000), &registry);
    ASSERT_NE(remote, nullptr);
    auto got = remote->Generate(Request(*big, 24), {});
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->tokens, want->tokens);
    // The small node did refuse its share (the placement above was not all-on-the-large-node from
    // the start), and the large node refused nothing.
    EXPECT_GE(RpcErrors(registry, addresses_[1], "RESOURCE_EXHAUSTED"), 1);
    EXPECT_EQ(RpcErrors(registry, addresses_[0], "RESOURCE_EXHAUSTED"), 0);
  }
  for (int i = 0; i < 2; ++i) EXPECT_EQ(node_status(i).sequences(), 0);

  auto remote = LoadEngine({addresses_[2], addresses_[3]});
  ASSERT_NE(remote, nullptr);
  auto refused = remote->Generate(Request(*big, 24), {});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_NE(refused.status().message().find("no attention node has room"), std::string::npos)
      << refused.status();
  for (int i = 2; i < 4; ++i) {
    EXPECT_EQ(node_status(i).sequences(), 0);
    EXPECT_EQ(node_status(i).memory_used_bytes(), 0);
  }
  auto ok = remote->Generate(Request(*small, 8), {});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->tokens.size(), 8u);
}

}  // namespace
}  // namespace magicpig
