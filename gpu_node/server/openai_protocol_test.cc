#include "gpu_node/server/openai_protocol.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "tests/testing/synthetic_engine.h"

namespace magicpig::server {
namespace {

using json::Value;

class ProtocolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::SyntheticModelOptions o;
    o.n_layer = 1;
    o.n_embd = 32;
    o.n_ff = 64;
    o.n_head = 2;
    o.n_head_kv = 1;
    o.context_length = 256;
    auto e = testing::MakeSyntheticEngine(o, testing::FullAttentionOptions());
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
    context_.engine = engine_.get();
    context_.model_name = "tiny";
  }

  std::optional<ApiRequest> Parse(Endpoint endpoint, const std::string& body) {
    return ParseRequest(endpoint, body, context_, &error_);
  }
  // Parsing fails with `status` and the error names `param`.
  void ExpectError(Endpoint endpoint, const std::string& body, int status,
                   const std::string& param) {
    EXPECT_FALSE(Parse(endpoint, body).has_value()) << body;
    EXPECT_EQ(error_.status, status) << body << " -> " << error_.message;
    EXPECT_EQ(error_.param, param) << body << " -> " << error_.message;
    EXPECT_FALSE(error_.message.empty());
  }

  std::unique_ptr<engine::Engine> engine_;
  ApiContext context_;
  ApiError error_;
};

TEST_F(ProtocolTest, PromptFormsAndDefaults) {
  auto r = Parse(Endpoint::kCompletions, R"({"prompt": "hello world"})");
  ASSERT_TRUE(r.has_value()) << error_.message;
  ASSERT_EQ(r->prompts.size(), 1u);
  EXPECT_EQ(r->prompts[0].prompt, engine_->tokenizer().Encode("hello world", true));
  EXPECT_EQ(r->prompts[0].max_tokens, 16);  // OpenAI's default for completions
  EXPECT_EQ(r->prompts[0].sampling.temperature, 1.0f);
  EXPECT_FALSE(r->stream);

  r = Parse(Endpoint::kCompletions, R"({"prompt": ["a b", "c"], "model": "tiny"})");
  ASSERT_TRUE(r.has_value()) << error_.message;
  EXPECT_EQ(r->prompts.size(), 2u);
  r = Parse(Endpoint::kCompletions, R"({"prompt": [5, 6, 7], "max_tokens": 3})");
  ASSERT_TRUE(r.has_value()) << error_.message;
  EXPECT_EQ(r->prompts[0].prompt, (std::vector<int32_t>{5, 6, 7}));
  r = Parse(Endpoint::kCompletions,
            R"({"prompt": [[5, 6], [7]], "max_tokens": 1, "logprobs": 1, "echo": true,
                "temperature": 0, "seed": 1234, "stop": ["\n", "END"], "top_p": 0.5,
                "top_k": 3, "stream": true, "stream_options": {"include_usage": true},
                "user": "ignored", "unknown_field": {"is": "ignored"}})");
  ASSERT_TRUE(r.has_value()) << error_.message;
  ASSERT_EQ(r->prompts.size(), 2u);
  EXPECT_EQ(r->prompts[1].prompt, (std::vector<int32_t>{7}));
  EXPECT_TRUE(r->echo);
  EXPECT_EQ(r->logprobs, 1);
  EXPECT_TRUE(r->prompts[0].prompt_logprobs);
  EXPECT_EQ(r->prompts[0].top_logprobs, 1);
  EXPECT_EQ(r->prompts[0].sampling.seed, 1234u);
  EXPECT_EQ(r->prompts[0].sampling.top_k, 3);
  EXPECT_EQ(r->prompts[0].stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_TRUE(r->stream && r->include_usage);
}

TEST_F(ProtocolTest, ChatUsesTheTemplateAndFillsTheContext) {
  auto r = Parse(Endpoint::kChat,
                 R"({"messages": [{"role": "system", "content": "be brief"},
                                  {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                     "max_completion_tokens": 5, "logprobs": true, "top_logprobs": 2})");
  ASSERT_TRUE(r.has_value()) << error_.message << " " << error_.param;
  std::vector<model::ChatMessage> messages = {{"system", "be brief"}, {"user", "hi"}};
  EXPECT_EQ(r->prompts[0].prompt, *engine_->EncodeChat(messages));
  EXPECT_EQ(r->prompts[0].max_tokens, 5);
  EXPECT_EQ(r->logprobs, 2);
  EXPECT_FALSE(r->prompts[0].prompt_logprobs);
  r = Parse(Endpoint::kChat, R"({"messages": [{"role": "user", "content": "hi"}]})");
  ASSERT_TRUE(r.has_value()) << error_.message;
  EXPECT_EQ(r->prompts[0].max_tokens,
            engine_->context_length() - static_cast<int64_t>(r->prompts[0].prompt.size()));
}

TEST_F(ProtocolTest, BadRequestsNameTheProblem) {
  ExpectError(Endpoint::kCompletions, "{\"prompt\": \"x\",", 400, "");
  EXPECT_NE(error_.message.find("not valid JSON"), std::string::npos);
  ExpectError(Endpoint::kCompletions, "[1, 2]", 400, "");
  ExpectError(Endpoint::kCompletions, R"({"max_tokens": 3})", 400, "prompt");
  ExpectError(Endpoint::kCompletions, R"({"prompt": "x", "max_tokens": "ten"})", 400, "max_tokens");
  // top_k is an int32 downstream: 2^31 is refused naming the field instead of wrapping negative.
  ExpectError(Endpoint::kCompletions, R"({"prompt": "x", "top_k": 2147483648})", 400, "top_k");
  auto widest = Parse(Endpoint::kCompletions, R"({"prompt": "x", "top_k": 2147483647})");
  ASSERT_TRUE(widest.has_value()) << error_.message;
  EXPECT_EQ(widest->prompts[0].sampling.top_k, 2147483647);
  ExpectError(Endpoint::kCompletions, R"({"prompt": "x", "max_tokens": 2.5})", 400, "max_tokens");
  ExpectError(Endpoint::kCompletions, R"({"prompt": "x", "max_tokens": -1})", 400, "max_tokens");
  ExpectError(Endpoint::kCompletions, R"({"prompt": "x", "temperature": 3})", 400, "temperature");
  ExpectError(Endpoint::kCompletions, R"({"prompt": "x", "top_p": 0})", 400, "top_p");
  ExpectError(Endpoint::kCompletions, R"({"prompt": "x", "n": 2})", 400, "n");
  ExpectError(Endpoint::kCompletions, R"({"prompt": "x", "stream": "yes"})", 400, "stream");
  ExpectError(Endpoint::kCompletions, R"({"prompt": "x", "stop": [1]})", 400, "stop");
  ExpectError(Endpoint::kCompletions, R"({"prompt": "x", "logprobs": 21})", 400, "logprobs");
  ExpectError(Endpoint::kCompletions, R"({"prompt": [1, 999999]})", 400, "prompt");
  ExpectError(Endpoint::kCompletions, R"({"prompt": []})", 400, "prompt");
  ExpectError(Endpoint::kCompletions, R"({"prompt": {"a": 1}})", 400, "prompt");
  ExpectError(Endpoint::kCompletions, R"({"prompt": "x", "model": "gpt-4"})", 404, "model");
  EXPECT_EQ(error_.code, "model_not_found");
  ExpectError(Endpoint::kCompletions, R"({"prompt": "x", "max_tokens": 256})", 400, "max_tokens");
  EXPECT_EQ(error_.code, "context_length_exceeded");
  ExpectError(Endpoint::kCompletions, R"({"prompt": "x", "attention": {"mode": "full"}})", 400,
              "attention");
  ExpectError(Endpoint::kChat, R"({"messages": []})", 400, "messages");
  ExpectError(Endpoint::kChat, R"({"messages": [{"content": "x"}]})", 400, "messages[0].role");
  ExpectError(Endpoint::kChat, R"({"messages": [{"role": "wizard", "content": "x"}]})", 400,
              "messages[0].role");
  ExpectError(Endpoint::kChat, R"({"messages": [{"role": "user", "content": 5}]})", 400,
              "messages[0].content");
  ExpectError(Endpoint::kChat,
              R"({"messages": [{"role": "user", "content": "x"}], "stream_options": 1})", 400,
              "stream_options");
}

TEST_F(ProtocolTest, AttentionOverrideWhenAllowed) {
  context_.allow_attention_override = true;
  auto r = Parse(Endpoint::kCompletions,
                 R"({"prompt": "x", "attention": {"mode": "magicpig", "lsh_k": 8, "lsh_l": 75}})");
  ASSERT_TRUE(r.has_value()) << error_.message;
  ASSERT_TRUE(r->prompts[0].attention.has_value());
  EXPECT_EQ(r->prompts[0].attention->mode, attention::EstimatorKind::kMagicPig);
  EXPECT_EQ(r->prompts[0].attention->lsh_k, 8);
  EXPECT_EQ(r->prompts[0].attention->lsh_l, 75);
  ExpectError(Endpoint::kCompletions, R"({"prompt": "x", "attention": {"mode": "psychic"}})", 400,
              "attention.mode");
  ExpectError(Endpoint::kCompletions, R"({"prompt": "x", "attention": {"lsh_k": 40}})", 400,
              "attention.lsh_k");
  // vAttention's parameters, each from its one declaration; the ones not given keep the server's.
  r = Parse(Endpoint::kCompletions,
            R"({"prompt": "x", "attention": {"mode": "vattention-lsh", "va_epsilon": 0.2,
                "va_delta": 0.01, "va_heavy": 12}})");
  ASSERT_TRUE(r.has_value()) << error_.message;
  ASSERT_TRUE(r->prompts[0].attention.has_value());
  EXPECT_EQ(r->prompts[0].attention->mode, attention::EstimatorKind::kVAttentionLsh);
  EXPECT_EQ(r->prompts[0].attention->vattention.epsilon, 0.2);
  EXPECT_EQ(r->prompts[0].attention->vattention.delta, 0.01);
  EXPECT_EQ(r->prompts[0].attention->vattention.heavy, 12);
  EXPECT_EQ(r->prompts[0].attention->vattention.base_rate, attention::kVaBaseRate.default_value);
  ExpectError(Endpoint::kCompletions,
              R"({"prompt": "x", "attention": {"mode": "vattention", "va_delta": 0.9}})", 400,
              "attention.va_delta");
  ExpectError(Endpoint::kCompletions,
              R"({"prompt": "x", "attention": {"mode": "vattention", "va_epsilon": "small"}})", 400,
              "attention.va_epsilon");
  // spotlight's fraction is read and bounded like the others; the mode itself needs trained
  // hashes, which this engine was not given.
  ExpectError(Endpoint::kCompletions,
              R"({"prompt": "x", "attention": {"mode": "spotlight", "spotlight_fraction": 0.1}})",
              400, "attention.mode");
  ExpectError(Endpoint::kCompletions,
              R"({"prompt": "x", "attention": {"mode": "magicpig", "spotlight_fraction": 2}})", 400,
              "attention.spotlight_fraction");
  r = Parse(Endpoint::kCompletions,
            R"({"prompt": "x", "attention": {"mode": "magicpig", "spotlight_fraction": 0.25}})");
  ASSERT_TRUE(r.has_value()) << error_.message;
  EXPECT_EQ(r->prompts[0].attention->spotlight_fraction, 0.25);
  ExpectError(Endpoint::kCompletions,
              R"({"prompt": "x", "attention": {"mode": "magicpig", "spotlight_rerank": 0}})", 400,
              "attention.spotlight_rerank");
  r = Parse(Endpoint::kCompletions,
            R"({"prompt": "x", "attention": {"mode": "magicpig", "spotlight_rerank": 8}})");
  ASSERT_TRUE(r.has_value()) << error_.message;
  EXPECT_EQ(r->prompts[0].attention->spotlight_rerank, 8);
  // sketch needs no trained hashes; its code length is bounded and even.
  r = Parse(Endpoint::kCompletions,
            R"({"prompt": "x", "attention": {"mode": "sketch", "sketch_dims": 16}})");
  ASSERT_TRUE(r.has_value()) << error_.message;
  EXPECT_EQ(r->prompts[0].attention->mode, attention::EstimatorKind::kSketch);
  EXPECT_EQ(r->prompts[0].attention->sketch_dims, 16);
  ExpectError(Endpoint::kCompletions,
              R"({"prompt": "x", "attention": {"mode": "sketch", "sketch_dims": 15}})", 400,
              "attention.sketch_dims");
  ExpectError(Endpoint::kCompletions,
              R"({"prompt": "x", "attention": {"mode": "sketch", "sketch_dims": 40}})", 400,
              "attention.sketch_dims");
}

TEST_F(ProtocolTest, ResponsesHaveTheOpenAIShapes) {
  auto r = Parse(Endpoint::kCompletions,
                 R"({"prompt": [5, 6, 7], "max_tokens": 2, "logprobs": 1, "echo": true})");
  ASSERT_TRUE(r.has_value()) << error_.message;
  auto result = engine_->Generate(r->prompts[0], {});
  ASSERT_TRUE(result.ok());
  ResponseMeta meta{"cmpl-1", 1700000000, "tiny"};
  auto body = json::Parse(FinalResponse(*engine_, *r, meta, {*result}));
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_EQ(body->Find("object")->as_string(), "text_completion");
  const Value& choice = body->Find("choices")->as_array()[0];
  EXPECT_EQ(choice.Find("index")->as_int(), 0);
  // (The synthetic vocabulary's bytes are not all UTF-8: compare through the same JSON encoding.)
  EXPECT_EQ(choice.Find("text")->as_string(),
            json::Parse(json::Serialize(Value(r->prompt_texts[0] + result->text)))->as_string());
  const Value& lp = *choice.Find("logprobs");
  // lm-eval reads token_logprobs[ctxlen:-1]: one entry per echoed prompt token + the generated.
  ASSERT_EQ(lp.Find("token_logprobs")->size(), 3u + result->tokens.size());
  EXPECT_TRUE(lp.Find("token_logprobs")->as_array()[0].is_null());
  EXPECT_TRUE(lp.Find("top_logprobs")->as_array()[0].is_null());
  EXPECT_DOUBLE_EQ(lp.Find("token_logprobs")->as_array()[1].as_double(),
                   result->prompt_logprobs[0].logprob);
  EXPECT_EQ(lp.Find("top_logprobs")->as_array()[1].size(), 1u);
  EXPECT_EQ(lp.Find("text_offset")->size(), lp.Find("tokens")->size());
  const Value& usage = *body->Find("usage");
  EXPECT_EQ(usage.Find("prompt_tokens")->as_int(), 3);
  EXPECT_EQ(usage.Find("total_tokens")->as_int(), 3 + static_cast<int64_t>(result->tokens.size()));

  auto chat = Parse(Endpoint::kChat,
                    R"({"messages": [{"role": "user", "content": "hi"}], "stream": true,
                        "stream_options": {"include_usage": true}})");
  ASSERT_TRUE(chat.has_value());
  const std::string first = StreamDelta(*chat, meta, 0, "he", true, nullptr);
  ASSERT_EQ(first.rfind("data: ", 0), 0u);
  ASSERT_EQ(first.substr(first.size() - 2), "\n\n");
  auto chunk = json::Parse(first.substr(6));
  ASSERT_TRUE(chunk.ok());
  EXPECT_EQ(chunk->Find("object")->as_string(), "chat.completion.chunk");
  const Value& delta = *chunk->Find("choices")->as_array()[0].Find("delta");
  EXPECT_EQ(delta.Find("role")->as_string(), "assistant");
  EXPECT_EQ(delta.Find("content")->as_string(), "he");
  EXPECT_TRUE(chunk->Find("usage")->is_null());
  auto usage_chunk = json::Parse(StreamUsage(*chat, meta, 4, 2).substr(6));
  ASSERT_TRUE(usage_chunk.ok());
  EXPECT_EQ(usage_chunk->Find("choices")->size(), 0u);
  EXPECT_EQ(usage_chunk->Find("usage")->Find("total_tokens")->as_int(), 6);
  auto finish = json::Parse(StreamFinish(*chat, meta, 0, engine::FinishReason::kLength).substr(6));
  ASSERT_TRUE(finish.ok());
  EXPECT_EQ(finish->Find("choices")->as_array()[0].Find("finish_reason")->as_string(), "length");

  auto err = json::Parse(ErrorBody({.status = 400, .message = "bad", .param = "x", .code = ""}));
  ASSERT_TRUE(err.ok());
  EXPECT_EQ(err->Find("error")->Find("message")->as_string(), "bad");
  EXPECT_EQ(err->Find("error")->Find("type")->as_string(), "invalid_request_error");
  EXPECT_EQ(err->Find("error")->Find("param")->as_string(), "x");
  EXPECT_TRUE(err->Find("error")->Find("code")->is_null());
}

// Server-side failures reach the client as a fixed message with the request id; their cause
// (node addresses, sequence ids, budgets) goes only to `detail`, for the log.
TEST(ErrorFromStatusTest, ServerErrorsRevealNoInternals) {
  const std::string internals =
      "no attention node has room: 10.0.0.7:50051 has 12 of 6442450944 bytes free for "
      "seq-1234-0x55d0/b0";
  for (const absl::Status& s :
       {absl::UnavailableError(internals), absl::ResourceExhaustedError(internals),
        absl::InternalError(internals), absl::DeadlineExceededError(internals)}) {
    const ApiError e = ErrorFromStatus(s, "cmpl-7-3");
    EXPECT_GE(e.status, 500) << s;
    EXPECT_EQ(e.type, "server_error");
    EXPECT_EQ(e.detail, internals);
    EXPECT_NE(e.message.find("(request cmpl-7-3)"), std::string::npos) << e.message;
    const std::string body = ErrorBody(e);
    for (const char* secret : {"10.0.0.7", "50051", "seq-", "6442450944", "room"}) {
      EXPECT_EQ(body.find(secret), std::string::npos) << secret << " in " << body;
    }
  }
  EXPECT_EQ(ErrorFromStatus(absl::UnavailableError(internals), "x").status, 503);
  EXPECT_EQ(ErrorFromStatus(absl::InternalError(internals), "x").status, 500);
  // The request's own faults keep their message (it names the field) and are not the server's.
  const ApiError bad =
      ErrorFromStatus(absl::InvalidArgumentError("the prompt has 9000 tokens"), "x");
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(bad.message, "the prompt has 9000 tokens");
  EXPECT_TRUE(bad.detail.empty());
  const ApiError full = ErrorFromStatus(
      absl::ResourceExhaustedError("the request queue is full (64 waiting requests)"), "x");
  EXPECT_EQ(full.status, 429);
  EXPECT_EQ(full.type, "rate_limit_error");
}

}  // namespace
}  // namespace magicpig::server
