#include "gpu_node/model/model_weights.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "tests/testing/synthetic_model.h"

namespace magicpig::model {
namespace {

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadSynthetic(
    const testing::SyntheticModelOptions& o) {
  auto bytes = testing::BuildSyntheticModel(o);
  if (!bytes.ok()) return bytes.status();
  auto file = GgufFile::FromBytes(*bytes);
  if (!file.ok()) return file.status();
  return ModelWeights::Load(std::shared_ptr<const GgufFile>(std::move(*file)));
}

TEST(ModelWeightsTest, LoadsEveryLayerWithViewsIntoTheFile) {
  testing::SyntheticModelOptions o;
  o.weight_type = GgmlType::kQ4_1;
  o.embd_type = GgmlType::kQ8_0;
  o.n_layer = 3;
  auto w = LoadSynthetic(o);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE((*w)->tied_embeddings());
  EXPECT_EQ((*w)->output().data, (*w)->token_embd().data);
  const LayerWeights& l2 = (*w)->layer(2);
  EXPECT_EQ(l2.wq.type, GgmlType::kQ4_1);
  EXPECT_EQ(l2.wq.rows, o.n_embd);
  EXPECT_EQ(l2.w_down.rows, o.n_embd);
  EXPECT_EQ(l2.w_down.cols, o.n_ff);
  EXPECT_EQ(l2.wk.rows, o.n_embd / o.n_head * o.n_head_kv);
  EXPECT_EQ(static_cast<int64_t>(l2.attn_norm.size()), o.n_embd);
  EXPECT_TRUE(l2.bq.empty());
  // Every matrix counted once, the tied LM head once.
  const int64_t q4 = GgmlRowBytes(GgmlType::kQ4_1, o.n_embd);
  const int64_t kv = o.n_embd / o.n_head * o.n_head_kv;
  const int64_t per_layer =
      q4 * (2 * o.n_embd + 2 * kv + 2 * o.n_ff) + GgmlRowBytes(GgmlType::kQ4_1, o.n_ff) * o.n_embd;
  EXPECT_EQ((*w)->weight_bytes(),
            3 * per_layer + GgmlRowBytes(GgmlType::kQ8_0, o.n_embd) * o.n_vocab);
}

TEST(ModelWeightsTest, Qwen2HasBiases) {
  testing::SyntheticModelOptions o;
  o.architecture = "qwen2";
  auto w = LoadSynthetic(o);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(static_cast<int64_t>((*w)->layer(0).bq.size()), o.n_embd);
  EXPECT_EQ((*w)->config().rope_style, RopeStyle::kNeox);
}

TEST(ModelWeightsTest, MissingTensorIsNamed) {
  testing::SyntheticModelOptions o;
  o.omit_tensors = {"blk.1.ffn_up.weight"};
  auto w = LoadSynthetic(o);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(w.status().message().find("blk.1.ffn_up.weight"), std::string::npos) << w.status();
}

TEST(ModelWeightsTest, MissingQwenBiasIsNamed) {
  testing::SyntheticModelOptions o;
  o.architecture = "qwen2";
  o.omit_tensors = {"blk.0.attn_k.bias"};
  auto w = LoadSynthetic(o);
  EXPECT_NE(w.status().message().find("blk.0.attn_k.bias"), std::string::npos) << w.status();
}

TEST(ModelWeightsTest, WrongShapeIsNamedWithDims) {
  testing::SyntheticModelOptions o;
  o.transposed_tensor = "blk.0.ffn_gate.weight";
  auto w = LoadSynthetic(o);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(w.status().message().find("blk.0.ffn_gate.weight"), std::string::npos);
  EXPECT_NE(w.status().message().find("[128, 64]"), std::string::npos) << w.status();
}

TEST(ModelWeightsTest, UnsupportedTypeIsNamed) {
  testing::SyntheticModelOptions o;
  o.weight_type = GgmlType::kQ5_K;  // parsed by the reader, not multiplied by magicpig
  auto w = LoadSynthetic(o);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(w.status().message().find("Q5_K"), std::string::npos) << w.status();
}

TEST(ModelWeightsTest, UnknownArchitectureIsUnimplemented) {
  testing::SyntheticModelOptions o;
  o.architecture = "gemma3";
  auto w = LoadSynthetic(o);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(w.status().message().find("gemma3"), std::string::npos);
}

}  // namespace
}  // namespace magicpig::model
