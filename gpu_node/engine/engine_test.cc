#include "gpu_node/engine/engine.h"

#include <memory>
#include <string>
#include <vector>

#include "gpu_node/backend/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "tests/testing/synthetic_model.h"

namespace magicpig::engine {
namespace {

std::unique_ptr<Engine> MakeEngine(int64_t context_length = 0, int64_t prefill_chunk = 256) {
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
  auto engine = Engine::Create(std::shared_ptr<const model::GgufFile>(std::move(*file)),
                               std::make_unique<backend::CpuBackend>(1), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return std::move(*engine);
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
