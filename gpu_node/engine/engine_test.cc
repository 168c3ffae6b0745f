#include "gpu_node/engine/engine.h"

#include <memory>
#include <string>
#include <vector>

#include "gpu_node/backend/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "tests/testing/synthetic_model.h"

namespace magicpig::engine {
namespace {

SparseAttentionOptions FullAttention() {
  SparseAttentionOptions a;
  a.mode = AttentionMode::kFull;
  return a;
}

std::unique_ptr<Engine> MakeEngine(int64_t context_length = 0, int64_t prefill_chunk = 256,
                                   SparseAttentionOptions attention = FullAttention()) {
  testing::SyntheticModelOptions o;
  o.n_layer = 2;
  o.n_embd = 64;
  o.n_ff = 128;
  o.n_head = 4;
  o.n_head_kv = 2;
  o.context_length = 128;
  auto bytes = testing::BuildSyntheticModel(o);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  auto file = model::GgufFile::FromBytes(*bytes);
  EXPECT_TRUE(file.ok()) << file.status();
  EngineOptions options;
  options.context_length = context_length;
  options.prefill_chunk = prefill_chunk;
  options.attention = attention;
  auto engine = Engine::Create(std::shared_ptr<const model::GgufFile>(std::move(*file)),
                               std::make_unique<backend::CpuBackend>(1), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return std::move(*engine);
}

// The sparse decode path end to end on a synthetic model (layer 1 sparse): with top-k at a budget
// covering every offloaded key and fp32 shards, each step is exact attention split into the static
// window (backend) and the shard (attention core, centred keys) merged by LSE, so the greedy tokens
// equal the full-attention run's. A small window budget makes generated tokens overflow into the
// shards' append segment several times. MagicPIG itself must run and sample a fraction of keys.
TEST(EngineTest, SparseDecodeSplitAndMergeIsExact) {
  SparseAttentionOptions exact;
  exact.mode = AttentionMode::kTopK;
  exact.budget = 1 << 20;
  exact.dense_layers = {0};
  exact.n_local = 8;
  exact.window_budget = 12;
  exact.storage = KvStorage::kF32;
  exact.shard_block = 16;  // several blocks, merged in order
  auto full = MakeEngine();
  auto split = MakeEngine(0, 256, exact);
  GenerateRequest req;
  req.prompt = full->tokenizer().Encode(
      "a long prompt about many things: the cat, the dog, the bird and the fish all went to the "
      "market to buy bread and milk and honey for the winter",
      false);
  ASSERT_GT(req.prompt.size(), 30u);
  req.max_tokens = 40;
  req.ignore_eos = true;
  auto a = full->Generate(req, {});
  auto b = split->Generate(req, {});
  ASSERT_TRUE(a.ok() && b.ok()) << b.status();
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_EQ(a->stats.attention_keys_offloaded, 0);
  EXPECT_GT(b->stats.attention_keys_offloaded, 0);
  EXPECT_EQ(b->stats.attention_keys_touched, b->stats.attention_keys_offloaded);  // budget >= n

  SparseAttentionOptions pig;
  pig.dense_layers = {0};
  pig.lsh_k = 4;
  pig.lsh_l = 8;
  pig.n_local = 8;
  pig.window_budget = 12;
  auto sparse = MakeEngine(0, 256, pig);
  auto c = sparse->Generate(req, {});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tokens.size(), a->tokens.size());  // up to the context length
  EXPECT_GT(c->stats.attention_keys_offloaded, 0);
  EXPECT_GT(c->stats.sampled_fraction(), 0.0);
  EXPECT_LT(c->stats.sampled_fraction(), 1.0);
  EXPECT_GT(c->stats.attention_shard_bytes, 0);
}

TEST(EngineTest, GreedyIsDeterministicAndRespectsMaxTokens) {
  auto e = MakeEngine();
  GenerateRequest req;
  req.prompt = e->tokenizer().Encode("hello world", false);
  req.max_tokens = 12;
  req.ignore_eos = true;
  auto a = e->Generate(req, {});
  auto b = e->Generate(req, {});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->tokens.size(), 12u);
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_EQ(a->finish, FinishReason::kLength);
  EXPECT_EQ(a->stats.prompt_tokens, static_cast<int64_t>(req.prompt.size()));
  EXPECT_EQ(a->stats.generated_tokens, 12);
}

TEST(EngineTest, DecodeStepsMatchTeacherForcedLogits) {
  // Greedy tokens from incremental decoding equal the argmax of a one-shot forward over the
  // prompt + generated tokens (KV cache consistency, chunked prefill included).
  auto e = MakeEngine(0, /*prefill_chunk=*/3);
  GenerateRequest req;
  req.prompt = e->tokenizer().Encode("the quick brown fox", false);
  req.max_tokens = 10;
  req.ignore_eos = true;
  auto r = e->Generate(req, {});
  ASSERT_TRUE(r.ok());
  std::vector<int32_t> all = req.prompt;
  all.insert(all.end(), r->tokens.begin(), r->tokens.end() - 1);
  auto logits = e->ScoreAll(all);
  ASSERT_TRUE(logits.ok());
  const int64_t v = e->config().n_vocab, n = static_cast<int64_t>(req.prompt.size());
  for (size_t i = 0; i < r->tokens.size(); ++i) {
    absl::Span<const float> row(logits->data() + (n - 1 + i) * v, v);
    EXPECT_EQ(Argmax(row), r->tokens[i]) << "step " << i;
  }
}

TEST(EngineTest, StopStringEndsGenerationAndIsCut) {
  auto e = MakeEngine();
  GenerateRequest req;
  req.prompt = e->tokenizer().Encode("hello", false);
  req.max_tokens = 20;
  req.ignore_eos = true;
  auto full = e->Generate(req, {});
  ASSERT_TRUE(full.ok());
  ASSERT_GE(full->text.size(), 4u);
  // Stop on a piece of what greedy decoding produces anyway.
  const std::string stop = full->text.substr(2, 2);
  req.stop = {stop};
  std::string streamed;
  GenerateCallbacks cb;
  cb.on_text = [&](std::string_view s) { streamed.append(s.data(), s.size()); };
  auto cut = e->Generate(req, cb);
  ASSERT_TRUE(cut.ok());
  EXPECT_EQ(cut->finish, FinishReason::kStop);
  EXPECT_EQ(cut->text, full->text.substr(0, full->text.find(stop)));
  EXPECT_EQ(streamed, cut->text);
}

TEST(EngineTest, RejectsBadRequests) {
  auto e = MakeEngine(/*context_length=*/16);
  GenerateRequest req;
  EXPECT_EQ(e->Generate(req, {}).status().code(), absl::StatusCode::kInvalidArgument);
  req.prompt = std::vector<int32_t>(16, 5);
  EXPECT_EQ(e->Generate(req, {}).status().code(), absl::StatusCode::kOutOfRange);
  req.prompt = {5, 100000};
  EXPECT_EQ(e->Generate(req, {}).status().code(), absl::StatusCode::kInvalidArgument);
  req.prompt = {5, 6};
  req.sampling.top_p = 2.0f;
  EXPECT_EQ(e->Generate(req, {}).status().code(), absl::StatusCode::kInvalidArgument);
  // A valid request still works afterwards.
  req.sampling = SamplingParams{};
  req.max_tokens = 3;
  EXPECT_TRUE(e->Generate(req, {}).ok());
}

TEST(EngineTest, ContextLengthCapsGeneration) {
  auto e = MakeEngine(/*context_length=*/10);
  GenerateRequest req;
  req.prompt = {5, 6, 7, 8};
  req.max_tokens = 100;
  req.ignore_eos = true;
  auto r = e->Generate(req, {});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->tokens.size(), 7u);  // 4 prompt + 6 cached positions, the 7th token needs no cache
  EXPECT_EQ(r->finish, FinishReason::kLength);
}

}  // namespace
}  // namespace magicpig::engine
