// Micro-batch ping-pong against in-process attention nodes: a batch decoded as two micro-batches
// whose remote attention overlaps the other's dense work gives every sequence the tokens it gets
// alone, embedded — the split changes when work happens, not what is computed. (The backend is
// capped at AVX2, whose products are batch-invariant; see tests/testing/synthetic_engine.h.)
#include <algorithm>
#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "attn_node/service/attention_server.h"
#include "gpu_node/engine/engine.h"
#include "gtest/gtest.h"
#include "tests/testing/service_test_util.h"
#include "tests/testing/synthetic_engine.h"

namespace magicpig::engine {

using ::magicpig::attention::KvStorage;
using ::magicpig::remote::Placement;
namespace {

SimdLevel BatchInvariantLevel() { return std::min(ActiveSimdLevel(), SimdLevel::kAvx2); }

EngineOptions ExactSparse(int64_t shard_block = 16) {
  EngineOptions o;
  o.attention.mode =
      attention::EstimatorKind::kTopK;  // at a budget above n: exact, split and merged
  o.attention.budget = 1 << 20;
  o.attention.dense_layers = {0};
  o.attention.n_local = 4;
  o.attention.window_budget = 8;     // generated tokens overflow into the shards too
  o.attention.min_offload_keys = 1;  // short test prompts
  o.attention.storage = KvStorage::kF32;
  o.attention.shard_block = shard_block;
  return o;
}

// Each text generated alone (14 tokens, EOS ignored) on `engine`: the requests and their tokens,
// which the batched remote runs must reproduce.
void GenerateAlone(Engine& engine, const std::vector<std::string>& texts,
                   std::vector<GenerateRequest>* requests,
                   std::vector<std::vector<int32_t>>* alone) {
  for (const std::string& t : texts) {
    GenerateRequest r;
    r.prompt = engine.tokenizer().Encode(t, false);
    r.max_tokens = 14;
    r.ignore_eos = true;
    auto g = engine.Generate(r, {});
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_GT(g->stats.attention_keys_offloaded, 0);
    requests->push_back(r);
    alone->push_back(g->tokens);
  }
}

// The same on an embedded engine built with `options` (before any attention node is added).
void GenerateAloneEmbedded(const EngineOptions& options, const std::vector<std::string>& texts,
                           std::vector<GenerateRequest>* requests,
                           std::vector<std::vector<int32_t>>* alone) {
  auto embedded =
      testing::MakeSyntheticEngine(testing::SmallModel(), options, BatchInvariantLevel());
  ASSERT_TRUE(embedded.ok()) << embedded.status();
  GenerateAlone(**embedded, texts, requests, alone);
}

// n in-process attention nodes (256 MiB, one thread each), added to options' node list.
std::vector<std::unique_ptr<AttentionServer>> StartNodes(int n, EngineOptions* options) {
  std::vector<std::unique_ptr<AttentionServer>> nodes;
  for (int i = 0; i < n; ++i) {
    nodes.push_back(magicpig::testing::StartServer(int64_t{256} << 20, 1));
    if (nodes.back() == nullptr) return {};
    options->attention_nodes.push_back(nodes.back()->address());
    options->node_security = fabric::TransportSecurity::Plaintext();
  }
  return nodes;
}

// Starts every request on `engine` (prefill) for batched stepping.
void StartAll(Engine& engine, const std::vector<GenerateRequest>& requests,
              std::vector<std::unique_ptr<Sequence>>* batch) {
  for (const GenerateRequest& r : requests) {
    auto seq = engine.Start(r, {});
    ASSERT_TRUE(seq.ok()) << seq.status();
    batch->push_back(std::move(*seq));
  }
}

// Spread placement with blocks of 16 tokens lays every sequence over both nodes; blocks of 256
// (the context), or packed placement, keep each sequence on one node: the sequences alternate
// between the nodes, and the engine regroups them by node before splitting the batch into
// micro-batches. Ping-pong on, off, and auto (which switches between the two while it measures).
TEST(PingPongTest, TwoMicroBatchesOverRemoteNodesGiveTheEmbeddedTokens) {
  const std::vector<std::string> texts = {
      "the harbour master kept a ledger of every ship that came and went in the long winter",
      "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen",
      "a quiet morning by the river with the birds and the boats and the old stone bridge again",
      "lists of colours: red, green, blue, yellow, orange, purple, white, black, grey and brown",
      "the last one is a little shorter than the others but still long enough to offload",
  };
  const std::pair<int64_t, Placement> layouts[] = {
      {16, Placement::kSpread}, {256, Placement::kSpread}, {16, Placement::kPack}};
  for (const auto& [block, placement] : layouts) {
    SCOPED_TRACE(::testing::Message() << "shard_block " << block << " placement "
                                      << (placement == Placement::kPack ? "pack" : "spread"));
    auto embedded = testing::MakeSyntheticEngine(testing::SmallModel(), ExactSparse(block),
                                                 BatchInvariantLevel());
    ASSERT_TRUE(embedded.ok()) << embedded.status();
    std::vector<GenerateRequest> requests;
    std::vector<std::vector<int32_t>> alone;
    ASSERT_NO_FATAL_FAILURE(GenerateAlone(**embedded, texts, &requests, &alone));

    EngineOptions remote_options = ExactSparse(block);
    remote_options.placement = placement;
    std::vector<std::unique_ptr<AttentionServer>> nodes = StartNodes(2, &remote_options);
    ASSERT_EQ(nodes.size(), 2u);
    for (PingPong ping_pong : {PingPong::kOn, PingPong::kOff, PingPong::kAuto}) {
      remote_options.ping_pong = ping_pong;
      auto remote = testing::MakeSyntheticEngine(testing::SmallModel(), remote_options,
                                                 BatchInvariantLevel());
      ASSERT_TRUE(remote.ok()) << remote.status();
      std::vector<std::unique_ptr<Sequence>> batch;
      ASSERT_NO_FATAL_FAILURE(StartAll(**remote, requests, &batch));
      // Both nodes hold sequences (with one block each: 3 and 2 of the 5).
      for (auto& node : nodes) EXPECT_GT(node->store().Stats().sequences, 0);
      std::vector<Sequence*> step;
      for (auto& s : batch) step.push_back(s.get());
      std::set<int> splits;  // how the steps ran: 1 batch, 2 micro-batches
      for (int i = 0; i < 20; ++i) {
        StepTimings timings;
        ASSERT_TRUE((*remote)->Step(step, &timings).ok());
        if (timings.micro_batches > 0) splits.insert(timings.micro_batches);
      }
      // auto tries both during its warm-up, switching in the middle of the generation.
      const std::set<int> expected = ping_pong == PingPong::kOn    ? std::set<int>{2}
                                     : ping_pong == PingPong::kOff ? std::set<int>{1}
                                                                   : std::set<int>{1, 2};
      EXPECT_EQ(splits, expected);
      for (size_t i = 0; i < batch.size(); ++i) {
        ASSERT_TRUE(batch[i]->finished());
        EXPECT_EQ(batch[i]->result().tokens, alone[i])
            << "sequence " << i << " ping_pong " << static_cast<int>(ping_pong);
        EXPECT_GT(batch[i]->result().stats.attention_keys_offloaded, 0);
      }
    }
    // Every sequence released its shards on the nodes.
    for (auto& node : nodes) EXPECT_EQ(node->store().Stats().sequences, 0);
  }
}

// An attention node stops in the middle of batched, ping-pong decoding (a step fails while the
// other micro-batch's Attend is in flight): the sequences it held are rebuilt from their token
// history on the other nodes, the step runs again, and every sequence still gets the tokens it
// gets alone, embedded. (The rows released from the compute node's cache are checked with the
// real model in tests/integration: this model's rows fill less than a page.)
TEST(PingPongTest, NodeLostDuringBatchedStepsRebuildsWithTheSameTokens) {
  const std::vector<std::string> texts = {
      "the harbour master kept a ledger of every ship that came and went in the long winter",
      "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen",
      "a quiet morning by the river with the birds and the boats and the old stone bridge again",
      "lists of colours: red, green, blue, yellow, orange, purple, white, black, grey and brown",
  };
  EngineOptions options = ExactSparse();
  options.attention.shard_block = 4;  // every node holds blocks of every sequence
  options.placement = Placement::kSpread;
  std::vector<GenerateRequest> requests;
  std::vector<std::vector<int32_t>> alone;
  ASSERT_NO_FATAL_FAILURE(GenerateAloneEmbedded(options, texts, &requests, &alone));

  std::vector<std::unique_ptr<AttentionServer>> nodes = StartNodes(3, &options);
  ASSERT_EQ(nodes.size(), 3u);
  options.ping_pong = PingPong::kOn;
  auto remote = testing::MakeSyntheticEngine(testing::SmallModel(), options, BatchInvariantLevel());
  ASSERT_TRUE(remote.ok()) << remote.status();
  std::vector<std::unique_ptr<Sequence>> batch;
  ASSERT_NO_FATAL_FAILURE(StartAll(**remote, requests, &batch));
  std::vector<Sequence*> step;
  for (auto& s : batch) step.push_back(s.get());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE((*remote)->Step(step).ok());
  ASSERT_GT(nodes[1]->store().Stats().sequences, 0);
  nodes[1]->Shutdown(std::chrono::system_clock::now());
  nodes[1].reset();
  for (int i = 0; i < 15; ++i) ASSERT_TRUE((*remote)->Step(step).ok()) << "step " << i;
  int64_t recoveries = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    ASSERT_TRUE(batch[i]->finished());
    EXPECT_EQ(batch[i]->result().tokens, alone[i]) << "sequence " << i;
    recoveries += batch[i]->result().stats.attention_recoveries;
  }
  EXPECT_EQ(recoveries, static_cast<int64_t>(batch.size()));  // each held blocks on the lost node
  batch.clear();
  for (auto& node : nodes) {
    if (node != nullptr) {
      EXPECT_EQ(node->store().Stats().sequences, 0);
    }
  }
}

// A sequence whose shards cannot be rebuilt anywhere (its node died, the other node has no room
// for it) fails alone: the step goes on for the rest of the batch, which keeps its tokens, and the
// failed sequence is finished with its own error.
TEST(PingPongTest, SequenceThatCannotBeRebuiltFailsAloneAndTheBatchGoesOn) {
  const std::vector<std::string> texts = {
      "the harbour master kept a ledger of every ship that came and went in the long winter",
      "a quiet morning by the river with the birds and the boats and the old stone bridge again",
  };
  EngineOptions options = ExactSparse(/*shard_block=*/256);  // one block per sequence
  options.placement = Placement::kPack;
  std::vector<GenerateRequest> requests;
  std::vector<std::vector<int32_t>> alone;
  ASSERT_NO_FATAL_FAILURE(GenerateAloneEmbedded(options, texts, &requests, &alone));

  // What one sequence is charged on a node, measured on a probe node.
  int64_t charge = 0;
  {
    EngineOptions probe_options = options;
    std::vector<std::unique_ptr<AttentionServer>> probe = StartNodes(1, &probe_options);
    ASSERT_EQ(probe.size(), 1u);
    auto engine =
        testing::MakeSyntheticEngine(testing::SmallModel(), probe_options, BatchInvariantLevel());
    ASSERT_TRUE(engine.ok()) << engine.status();
    for (const GenerateRequest& r : requests) {
      auto seq = (*engine)->Start(r, {});
      ASSERT_TRUE(seq.ok()) << seq.status();
      charge = std::max(charge, probe[0]->store().Stats().memory_used_bytes);
    }
  }
  ASSERT_GT(charge, 0);
  // Two nodes with room for one sequence each (and a half).
  std::vector<std::unique_ptr<AttentionServer>> nodes;
  for (int i = 0; i < 2; ++i) {
    nodes.push_back(magicpig::testing::StartServer(charge * 3 / 2, 1));
    ASSERT_NE(nodes.back(), nullptr);
    options.attention_nodes.push_back(nodes.back()->address());
  }
  options.node_security = fabric::TransportSecurity::Plaintext();
  options.ping_pong = PingPong::kOff;
  auto remote = testing::MakeSyntheticEngine(testing::SmallModel(), options, BatchInvariantLevel());
  ASSERT_TRUE(remote.ok()) << remote.status();
  std::vector<std::unique_ptr<Sequence>> batch;
  ASSERT_NO_FATAL_FAILURE(StartAll(**remote, requests, &batch));
  ASSERT_EQ(nodes[0]->store().Stats().sequences, 1);
  ASSERT_EQ(nodes[1]->store().Stats().sequences, 1);
  std::vector<Sequence*> step;
  for (auto& s : batch) step.push_back(s.get());
  ASSERT_TRUE((*remote)->Step(step).ok());
  nodes[0]->Shutdown(std::chrono::system_clock::now());  // the first sequence's node
  nodes[0].reset();
  for (int i = 0; i < 20 && !batch[1]->finished(); ++i) {
    ASSERT_TRUE((*remote)->Step(step).ok()) << "step " << i;
  }
  ASSERT_TRUE(batch[0]->finished());
  EXPECT_FALSE(batch[0]->error().ok());
  EXPECT_TRUE(absl::IsResourceExhausted(batch[0]->error()) ||
              absl::IsUnavailable(batch[0]->error()))
      << batch[0]->error();
  ASSERT_TRUE(batch[1]->finished());
  EXPECT_TRUE(batch[1]->error().ok()) << batch[1]->error();
  EXPECT_EQ(batch[1]->result().tokens, alone[1]);
  batch.clear();
  EXPECT_EQ(nodes[1]->store().Stats().sequences, 0);
}

}  // namespace
}  // namespace magicpig::engine
