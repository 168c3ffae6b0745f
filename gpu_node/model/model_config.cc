#include "gpu_node/model/model_config.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace magicpig::model {
namespace {

absl::StatusOr<int64_t> GetPositive(const GgufFile& file, const std::string& key) {
  MAGICPIG_ASSIGN_OR_RETURN(int64_t v, file.GetInt(key));
  if (v <= 0 || v > (int64_t{1} << 40)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model metadata ", key, " = ", v, " is out of range"));
  }
  return v;
}

absl::StatusOr<int64_t> GetPositiveOr(const GgufFile& file, const std::string& key,
                                      int64_t fallback) {
  if (!file.HasKey(key)) return fallback;
  return GetPositive(file, key);
}

}  // namespace

absl::StatusOr<ModelConfig> ReadModelConfig(const GgufFile& file) {
  ModelConfig c;
  MAGICPIG_ASSIGN_OR_RETURN(c.architecture, file.GetString("general.architecture"));
  if (c.architecture == "llama") {
    c.rope_style = RopeStyle::kNorm;
    c.qkv_bias = false;
  } else if (c.architecture == "qwen2") {
    c.rope_style = RopeStyle::kNeox;
    c.qkv_bias = true;
  } else {
    return absl::UnimplementedError(absl::StrCat("unsupported model architecture '", c.architecture,
                                                 "' (magicpig runs llama and qwen2)"));
  }
  if (file.HasKey("general.name")) {
    MAGICPIG_ASSIGN_OR_RETURN(c.name, file.GetString("general.name"));
  }
  const std::string p = c.architecture + ".";
  MAGICPIG_ASSIGN_OR_RETURN(c.n_layer, GetPositive(file, p + "block_count"));
  MAGICPIG_ASSIGN_OR_RETURN(c.n_embd, GetPositive(file, p + "embedding_length"));
  MAGICPIG_ASSIGN_OR_RETURN(c.n_ff, GetPositive(file, p + "feed_forward_length"));
  MAGICPIG_ASSIGN_OR_RETURN(c.n_head, GetPositive(file, p + "attention.head_count"));
  MAGICPIG_ASSIGN_OR_RETURN(c.n_head_kv,
                            GetPositiveOr(file, p + "attention.head_count_kv", c.n_head));
  MAGICPIG_ASSIGN_OR_RETURN(c.context_length, GetPositiveOr(file, p + "context_length", 2048));
  if (c.n_head % c.n_head_kv != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attention.head_count ", c.n_head, " is not a multiple of head_count_kv ", c.n_head_kv));
  }
  if (c.n_embd % c.n_head != 0 && !file.HasKey(p + "attention.key_length")) {
    return absl::InvalidArgumentError(
        absl::StrCat("embedding_length ", c.n_embd, " is not a multiple of head_count ", c.n_head));
  }
  MAGICPIG_ASSIGN_OR_RETURN(c.head_dim,
                            GetPositiveOr(file, p + "attention.key_length", c.n_embd / c.n_head));
  if (c.head_dim % 16 != 0 || c.head_dim > 256) {
    // The CPU attention kernels work in 16-float vectors over at most 256 dims.
    return absl::UnimplementedError(absl::StrCat("head_dim ", c.head_dim,
                                                 " is not supported (must be a multiple of 16, "
                                                 "at most 256)"));
  }
  MAGICPIG_ASSIGN_OR_RETURN(c.n_rot, GetPositiveOr(file, p + "rope.dimension_count", c.head_dim));
  if (c.n_rot % 2 != 0 || c.n_rot > c.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rope.dimension_count ", c.n_rot, " must be even and at most head_dim ", c.head_dim));
  }
  if (file.HasKey(p + "rope.freq_base")) {
    MAGICPIG_ASSIGN_OR_RETURN(c.rope_freq_base, file.GetFloat(p + "rope.freq_base"));
  }
  if (file.HasKey(p + "attention.layer_norm_rms_epsilon")) {
    MAGICPIG_ASSIGN_OR_RETURN(c.rms_eps, file.GetFloat(p + "attention.layer_norm_rms_epsilon"));
  }
  if (!(c.rope_freq_base > 0) || !(c.rms_eps > 0)) {
    return absl::InvalidArgumentError("rope.freq_base and layer_norm_rms_epsilon must be > 0");
  }
  if (file.HasKey(p + "vocab_size")) {
    MAGICPIG_ASSIGN_OR_RETURN(c.n_vocab, GetPositive(file, p + "vocab_size"));
  } else {
    const GgufValue* tokens = file.FindValue("tokenizer.ggml.tokens");
    if (tokens == nullptr || tokens->type != GgufValueType::kArray) {
      return absl::InvalidArgumentError(
          "model has neither <arch>.vocab_size nor tokenizer.ggml.tokens");
    }
    c.n_vocab = static_cast<int64_t>(tokens->array.size());
  }
  return c;
}

}  // namespace magicpig::model
