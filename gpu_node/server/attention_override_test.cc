// The per-request "attention" override at its parameters' bounds, parsed as the HTTP server parses
// it and then decoded embedded and through an in-process attention node. The bounds come from one
// declaration (common/attention/estimator_params.h), so what the parser accepts the node accepts:
// lsh_l = 1 (which would sample nothing) is refused with the field named, and lsh_l = 2 decodes in
// both places, samples keys and gives the same tokens.
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "attn_node/service/attention_server.h"
#include "gpu_node/server/openai_protocol.h"
#include "gtest/gtest.h"
#include "tests/testing/service_test_util.h"
#include "tests/testing/synthetic_engine.h"

namespace magicpig::server {
namespace {

// MagicPIG decoding with most of a short prompt offloaded (layers 1 and 2 sparse).
engine::EngineOptions Sparse() {
  engine::EngineOptions o;
  o.attention.dense_layers = {0};
  o.attention.n_sinks = 2;
  o.attention.n_local = 4;
  o.attention.window_budget = 8;
  o.attention.min_offload_keys = 1;  // short test prompts
  o.attention.shard_block = 16;
  return o;
}

std::unique_ptr<engine::Engine> Load(const engine::EngineOptions& options) {
  // AVX2 at most: its products do not depend on the batch (tests/testing/synthetic_engine.h).
  auto e = testing::MakeSyntheticEngine(testing::SmallModel(), options,
                                        std::min(ActiveSimdLevel(), SimdLevel::kAvx2));
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

std::string Body(int lsh_k, int lsh_l) {
  return absl::StrCat(
      R"({"prompt": "the quick brown fox jumps over the lazy dog and then the dog sleeps in the )"
      R"(sun while the fox runs into the woods to find something to eat before night", )"
      R"("max_tokens": 8, "temperature": 0, )"
      R"("attention": {"mode": "magicpig", "lsh_k": )",
      lsh_k, R"(, "lsh_l": )", lsh_l, "}}");
}

TEST(AttentionOverrideTest, LshLBoundHoldsEmbeddedAndRemote) {
  auto embedded = Load(Sparse());
  ASSERT_NE(embedded, nullptr);
  std::unique_ptr<AttentionServer> node = magicpig::testing::StartServer(int64_t{256} << 20, 1);
  ASSERT_NE(node, nullptr);
  engine::EngineOptions remote_options = Sparse();
  remote_options.attention_nodes = {node->address()};
  remote_options.node_security = fabric::TransportSecurity::Plaintext();
  auto remote = Load(remote_options);
  ASSERT_NE(remote, nullptr);

  std::vector<std::vector<int32_t>> tokens;
  for (engine::Engine* e : {embedded.get(), remote.get()}) {
    const std::string where = e == embedded.get() ? "embedded" : "remote";
    ApiContext context{.engine = e, .model_name = "tiny", .allow_attention_override = true};
    ApiError error;
    // Below the bound: refused by the parser, naming the field and the bound.
    EXPECT_FALSE(ParseRequest(Endpoint::kCompletions, Body(2, 1), context, &error).has_value());
    EXPECT_EQ(error.status, 400) << where;
    EXPECT_EQ(error.param, "attention.lsh_l") << where;
    EXPECT_NE(error.message.find("[2, 512]"), std::string::npos) << error.message;
    error = {};
    EXPECT_FALSE(ParseRequest(Endpoint::kCompletions, Body(2, 513), context, &error).has_value());
    EXPECT_EQ(error.param, "attention.lsh_l") << where;

    // At the bound: decodes and samples.
    error = {};
    auto r = ParseRequest(Endpoint::kCompletions, Body(2, 2), context, &error);
    ASSERT_TRUE(r.has_value()) << where << ": " << error.message;
    ASSERT_TRUE(r->prompts[0].attention.has_value());
    EXPECT_EQ(r->prompts[0].attention->lsh_l, 2);
    r->prompts[0].ignore_eos = true;  // eight tokens whatever the synthetic model says
    auto g = e->Generate(r->prompts[0], {});
    ASSERT_TRUE(g.ok()) << where << ": " << g.status();
    EXPECT_EQ(g->tokens.size(), 8u) << where;
    EXPECT_GT(g->stats.attention_keys_offloaded, 0) << where;
    EXPECT_GT(g->stats.attention_keys_touched, 0) << where << ": lsh_l = 2 sampled nothing";
    tokens.push_back(g->tokens);
  }
  EXPECT_EQ(tokens[0], tokens[1]) << "remote decoding differs from embedded";
}

}  // namespace
}  // namespace magicpig::server
