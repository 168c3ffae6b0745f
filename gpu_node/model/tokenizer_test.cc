// Tests for the byte-level BPE tokenizer on hand-made vocabularies: merge order and ties, special
// tokens, decoding, round trips of arbitrary bytes, construction errors and loading from GGUF.
#include "gpu_node/model/tokenizer.h"

#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gpu_node/model/byte_unicode.h"
#include "gtest/gtest.h"
#include "tests/testing/gguf_writer.h"

namespace magicpig::model {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Specials take ids 0.. (type 3), then the 256 byte tokens, then `extra` (raw bytes).
struct TinyVocab {
  std::vector<std::string> specials = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  std::vector<std::string> extra;
  std::vector<std::pair<std::string, std::string>> merges;  // raw bytes
  std::string pre = "smollm";

  TokenizerVocab Build() const {
    TokenizerVocab v;
    v.model = "gpt2";
    v.pre = pre;
    for (const std::string& s : specials) {
      v.tokens.push_back(s);
      v.token_types.push_back(static_cast<int32_t>(TokenType::kControl));
    }
    for (int b = 0; b < 256; ++b) {
      v.tokens.push_back(BytesToMapped(std::string(1, static_cast<char>(b))));
      v.token_types.push_back(static_cast<int32_t>(TokenType::kNormal));
    }
    for (const std::string& s : extra) {
      v.tokens.push_back(BytesToMapped(s));
      v.token_types.push_back(static_cast<int32_t>(TokenType::kNormal));
    }
    for (const auto& [l, r] : merges) v.merges.push_back(BytesToMapped(l) + " " + BytesToMapped(r));
    v.bos_id = 1;
    v.eos_id = 2;
    v.pad_id = 2;
    return v;
  }
};

std::unique_ptr<Tokenizer> Make(const TinyVocab& tv) {
  auto tok = Tokenizer::Create(tv.Build());
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? *std::move(tok) : nullptr;
}

// The token strings (raw bytes) of an encoding, for readable expectations.
std::vector<std::string> Pieces(const Tokenizer& tok, std::string_view text,
                                bool parse_special = false) {
  std::vector<std::string> out;
  for (int32_t id : tok.Encode(text, parse_special)) out.push_back(tok.TokenBytes(id));
  return out;
}

TEST(TokenizerTest, LowestRankMergesFirst) {
  TinyVocab tv;
  tv.extra = {"ab", "bc"};
  tv.merges = {{"b", "c"}, {"a", "b"}};
  EXPECT_THAT(Pieces(*Make(tv), "abc"), ElementsAre("a", "bc"));
  tv.merges = {{"a", "b"}, {"b", "c"}};
  EXPECT_THAT(Pieces(*Make(tv), "abc"), ElementsAre("ab", "c"));
}

TEST(TokenizerTest, TiesGoToTheLeftmostPair) {
  TinyVocab tv;
  tv.extra = {"aa"};
  tv.merges = {{"a", "a"}};
  auto tok = Make(tv);
  EXPECT_THAT(Pieces(*tok, "aaa"), ElementsAre("aa", "a"));
  EXPECT_THAT(Pieces(*tok, "aaaaa"), ElementsAre("aa", "aa", "a"));
}

TEST(TokenizerTest, MergesChainAndStayInsideWords) {
  TinyVocab tv;
  tv.extra = {"ab", "abc", " a", " ab"};
  tv.merges = {{"a", "b"}, {"ab", "c"}, {" ", "a"}, {" a", "b"}};
  auto tok = Make(tv);
  EXPECT_THAT(Pieces(*tok, "abc"), ElementsAre("abc"));
  // The pre-tokenizer splits "abc abc" into "abc" and " abc"; "a b" outranks "Ġ a".
  EXPECT_THAT(Pieces(*tok, "abc abc"), ElementsAre("abc", " ", "abc"));
  // " abd": " a" (rank 2) is blocked by "ab" (rank 0), so the space stays alone.
  EXPECT_THAT(Pieces(*tok, " abd"), ElementsAre(" ", "ab", "d"));
  EXPECT_THAT(Pieces(*tok, " ad"), ElementsAre(" a", "d"));
  // No merge crosses the digit split.
  EXPECT_THAT(Pieces(*tok, "ab1ab"), ElementsAre("ab", "1", "ab"));
}

TEST(TokenizerTest, MergesWithoutResultTokenAreIgnored) {
  TinyVocab tv;
  tv.merges = {{"a", "b"}};  // "ab" is not a token
  EXPECT_THAT(Pieces(*Make(tv), "ab"), ElementsAre("a", "b"));
}

TEST(TokenizerTest, SpecialTokensAreMatchedLiterallyWhenAsked) {
  TinyVocab tv;
  tv.specials = {"<s>", "<s>x", "<|im_start|>"};
  auto tok = Make(tv);
  EXPECT_THAT(tok->Encode("a<|im_start|>b", true),
              ElementsAre(tok->Encode("a", false)[0], 2, tok->Encode("b", false)[0]));
  // Longest match first.
  EXPECT_THAT(tok->Encode("<s>x<s>", true), ElementsAre(1, 0));
  // Without parse_special the text is ordinary bytes.
  EXPECT_EQ(tok->Encode("<s>", false).size(), 3u);
  EXPECT_EQ(tok->Decode(tok->Encode("<s>", false)), "<s>");
}

TEST(TokenizerTest, DecodeHidesControlTokensUnlessAsked) {
  TinyVocab tv;
  tv.specials = {"<|im_start|>", "<user_token>"};
  TokenizerVocab v = tv.Build();
  v.token_types[1] = static_cast<int32_t>(TokenType::kUserDefined);
  auto tok = Tokenizer::Create(std::move(v));
  ASSERT_TRUE(tok.ok());
  std::vector<int32_t> ids = (*tok)->Encode("<|im_start|>hi<user_token>", true);
  ASSERT_EQ(ids.size(), 4u);
  EXPECT_EQ((*tok)->Decode(ids), "hi<user_token>");
  EXPECT_EQ((*tok)->Decode(ids, /*render_special=*/true), "<|im_start|>hi<user_token>");
  EXPECT_EQ((*tok)->Decode(std::vector<int32_t>{-5, 100000}), "");
}

TEST(TokenizerTest, RoundTripsArbitraryBytes) {
  TinyVocab tv;
  tv.extra = {"ab", " a", "\xC3\xA9", "\xE6\x97"};
  tv.merges = {{"a", "b"}, {" ", "a"}, {"\xC3", "\xA9"}, {"\xE6", "\x97"}};
  for (const char* pre : {"smollm", "llama-bpe", "qwen2"}) {
    tv.pre = pre;
    auto tok = Make(tv);
    std::string all;
    for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
    EXPECT_EQ(tok->Decode(tok->Encode(all, false)), all) << pre;
    std::mt19937 rng(7);
    for (int iter = 0; iter < 300; ++iter) {
      std::string text(rng() % 48, '\0');
      for (char& c : text) c = static_cast<char>(rng() & 0xFF);
      ASSERT_EQ(tok->Decode(tok->Encode(text, false)), text) << pre;
      ASSERT_EQ(tok->Decode(tok->Encode(text, true)), text) << pre;  // no specials in random bytes
    }
  }
}

TEST(TokenizerTest, BytesWithoutATokenAreDropped) {
  TinyVocab tv;
  TokenizerVocab v = tv.Build();
  v.tokens[3 + 0xFF] = "<unused>";  // no token for byte 0xFF any more
  auto tok = Tokenizer::Create(std::move(v));
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->Decode((*tok)->Encode("a\xFF"
                                          "b\xFF",
                                          false)),
            "ab");
  EXPECT_TRUE((*tok)->Encode("\xFF", false).empty());
}

TEST(TokenizerTest, IgnoreMergesForLlama3) {
  TinyVocab tv;
  tv.extra = {"abc"};  // reachable only as a whole word
  tv.pre = "llama-bpe";
  EXPECT_THAT(Pieces(*Make(tv), "abc"), ElementsAre("abc"));
  tv.pre = "smollm";
  EXPECT_THAT(Pieces(*Make(tv), "abc"), ElementsAre("a", "b", "c"));
}

TEST(TokenizerTest, EndOfGenerationAndLookup) {
  TinyVocab tv;
  auto tok = Make(tv);
  EXPECT_TRUE(tok->IsEndOfGeneration(2));   // eos
  EXPECT_TRUE(tok->IsEndOfGeneration(0));   // <|endoftext|>
  EXPECT_FALSE(tok->IsEndOfGeneration(1));  // <|im_start|>
  EXPECT_EQ(tok->FindToken("<|im_end|>"), 2);
  EXPECT_EQ(tok->FindToken("\xC4\xA0"), 3 + ' ');  // "Ġ" is the space byte token
  EXPECT_EQ(tok->FindToken("nope"), std::nullopt);
  EXPECT_EQ(tok->vocab_size(), 3 + 256);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
}

TEST(TokenizerTest, ConcurrentEncodesAgree) {
  TinyVocab tv;
  tv.extra = {"ab", " a"};
  tv.merges = {{"a", "b"}, {" ", "a"}};
  auto tok = Make(tv);
  const std::string text = "ab ab 123 <|im_end|> ab\n\nab";
  const std::vector<int32_t> expected = tok->Encode(text, true);
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        if (tok->Encode(text, true) != expected) ++mismatches;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(TokenizerTest, CreateRejectsBadVocabularies) {
  TinyVocab tv;
  TokenizerVocab v = tv.Build();
  v.model = "llama";
  auto s = Tokenizer::Create(v).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("llama"));

  v = tv.Build();
  v.pre = "mystery";
  s = Tokenizer::Create(v).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("mystery"));

  v = tv.Build();
  v.merges.push_back("nospace");
  EXPECT_EQ(Tokenizer::Create(v).status().code(), absl::StatusCode::kInvalidArgument);

  v = tv.Build();
  v.eos_id = 100000;
  EXPECT_EQ(Tokenizer::Create(v).status().code(), absl::StatusCode::kInvalidArgument);

  v = tv.Build();
  v.token_types.pop_back();
  EXPECT_EQ(Tokenizer::Create(v).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TokenizerTest, FromGgufReadsTokenizerKeys) {
  TinyVocab tv;
  tv.extra = {"ab"};
  tv.merges = {{"a", "b"}};
  TokenizerVocab v = tv.Build();
  magicpig::testing::GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddString("tokenizer.ggml.model", "gpt2");
  w.AddString("tokenizer.ggml.pre", "smollm");
  w.AddStringArray("tokenizer.ggml.tokens", v.tokens);
  w.AddIntArray("tokenizer.ggml.token_type", GgufValueType::kI32,
                std::vector<int64_t>(v.token_types.begin(), v.token_types.end()));
  w.AddStringArray("tokenizer.ggml.merges", v.merges);
  w.AddU32("tokenizer.ggml.bos_token_id", 1);
  w.AddU32("tokenizer.ggml.eos_token_id", 2);
  w.AddBool("tokenizer.ggml.add_bos_token", false);
  auto file = GgufFile::FromBytes(w.Build());
  ASSERT_TRUE(file.ok()) << file.status();
  auto tok = Tokenizer::FromGguf(**file);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 3 + 256 + 1);
  EXPECT_THAT((*tok)->Encode("<|im_start|>ab", true), ElementsAre(1, 3 + 256));
  EXPECT_EQ((*tok)->eos_id(), 2);
  EXPECT_FALSE((*tok)->add_bos());

  magicpig::testing::GgufWriter no_pre;
  no_pre.AddString("tokenizer.ggml.model", "gpt2");
  no_pre.AddStringArray("tokenizer.ggml.tokens", v.tokens);
  no_pre.AddStringArray("tokenizer.ggml.merges", v.merges);
  file = GgufFile::FromBytes(no_pre.Build());
  ASSERT_TRUE(file.ok());
  EXPECT_THAT(Tokenizer::FromGguf(**file).status().message(), HasSubstr("tokenizer.ggml.pre"));
}

}  // namespace
}  // namespace magicpig::model
