// Tokenizer and chat template against the real SmolLM2-135M-Instruct GGUF
// ($MAGICPIG_SOURCE_DIR/models/SmolLM2-135M-Instruct.Q4_1.gguf; skipped when absent). The expected
// ids were cross-checked with Hugging Face `tokenizers` (tests/tokenizer/compare_hf.sh).
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gpu_node/model/chat_template.h"
#include "gpu_node/model/gguf_file.h"
#include "gpu_node/model/tokenizer.h"
#include "gtest/gtest.h"

namespace magicpig::model {
namespace {

using ::testing::ElementsAre;

class SmolLm2TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* root = std::getenv("MAGICPIG_SOURCE_DIR");
    std::string path =
        std::string(root != nullptr ? root : ".") + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (!std::filesystem::exists(path)) {
      skip_reason_ = new std::string("model file not found: " + path +
                                     " (fetch it with the model download script)");
      return;
    }
    auto file = GgufFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    file_ = file->release();
    auto tok = Tokenizer::FromGguf(*file_);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = tok->release();
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete file_;
    delete skip_reason_;
    tok_ = nullptr;
    file_ = nullptr;
    skip_reason_ = nullptr;
  }
  void SetUp() override {
    if (skip_reason_ != nullptr) GTEST_SKIP() << *skip_reason_;
    ASSERT_NE(tok_, nullptr);
  }

  static GgufFile* file_;
  static Tokenizer* tok_;
  static std::string* skip_reason_;
};

GgufFile* SmolLm2TokenizerTest::file_ = nullptr;
Tokenizer* SmolLm2TokenizerTest::tok_ = nullptr;
std::string* SmolLm2TokenizerTest::skip_reason_ = nullptr;

TEST_F(SmolLm2TokenizerTest, Metadata) {
  EXPECT_EQ(tok_->vocab_size(), 49152);
  EXPECT_EQ(tok_->pre(), "smollm");
  EXPECT_EQ(tok_->bos_id(), 1);
  EXPECT_EQ(tok_->eos_id(), 2);
  EXPECT_FALSE(tok_->add_bos());
  EXPECT_TRUE(tok_->IsEndOfGeneration(2));
  EXPECT_TRUE(tok_->IsEndOfGeneration(0));  // <|endoftext|>
  EXPECT_FALSE(tok_->IsEndOfGeneration(1));
  EXPECT_EQ(tok_->FindToken("<|im_start|>"), 1);
}

TEST_F(SmolLm2TokenizerTest, KnownEncodings) {
  EXPECT_THAT(tok_->Encode("Hello world! 123", true), ElementsAre(19556, 905, 17, 216, 33, 34, 35));
  EXPECT_THAT(tok_->Encode("The capital of France is", true),
              ElementsAre(504, 3575, 282, 4649, 314));
  EXPECT_THAT(tok_->Encode("\n", true), ElementsAre(198));
  EXPECT_THAT(tok_->Encode("  multiple   spaces", true), ElementsAre(216, 2701, 256, 5600));
  EXPECT_THAT(tok_->Encode("<|im_start|>user\n", true), ElementsAre(1, 4093, 198));
}

TEST_F(SmolLm2TokenizerTest, DecodeRoundTrip) {
  const std::string text =
      "Ünïcödé 日本語 🙂 and code: for (int i = 0; i < 10; ++i) {}\r\n\t";
  EXPECT_EQ(tok_->Decode(tok_->Encode(text, true)), text);
}

TEST_F(SmolLm2TokenizerTest, ChatPrompt) {
  auto t = ChatTemplate::FromGguf(*file_);
  ASSERT_TRUE(t.ok()) << t.status();
  auto prompt = t->Render({{"user", "What is the capital of France?"}}, true);
  ASSERT_TRUE(prompt.ok());
  EXPECT_EQ(*prompt,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
            "<|im_start|>assistant\n");
  std::vector<int32_t> ids = tok_->Encode(*prompt, true);
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(tok_->Decode(ids, /*render_special=*/true), *prompt);
}

}  // namespace
}  // namespace magicpig::model
