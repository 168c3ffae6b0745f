#include "gpu_node/model/model_weights.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/quant/dequantize.h"
#include "common/status_macros.h"

namespace magicpig::model {
namespace {

std::string DimsString(const std::vector<int64_t>& dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

absl::StatusOr<const GgufTensor*> Require(const GgufFile& file, const std::string& name,
                                          std::vector<int64_t> expected_dims) {
  const GgufTensor* t = file.FindTensor(name);
  if (t == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("model is missing tensor '", name, "'"));
  }
  if (t->dims != expected_dims) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has dims ",
                                                   DimsString(t->dims), ", expected ",
                                                   DimsString(expected_dims)));
  }
  return t;
}

// A linear layer stored [in, out]: `out` rows of `in` values.
absl::StatusOr<QuantMatrix> LoadMatrix(const GgufFile& file, const std::string& name, int64_t in,
                                       int64_t out) {
  MAGICPIG_ASSIGN_OR_RETURN(const GgufTensor* t, Require(file, name, {in, out}));
  if (!GetGgmlTypeInfo(t->type).supported) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has type ",
                                                   std::string(GgmlTypeName(t->type)),
                                                   ", which magicpig does not support"));
  }
  return QuantMatrix{t->type, t->data, out, in, t->layout};
}

absl::StatusOr<std::vector<float>> LoadVector(const GgufFile& file, const std::string& name,
                                              int64_t n) {
  MAGICPIG_ASSIGN_OR_RETURN(const GgufTensor* t, Require(file, name, {n}));
  std::vector<float> v(n);
  absl::Status s = DequantizeRow(t->type, t->data, v.data(), n);
  if (!s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': ", s.message()));
  }
  return v;
}

int64_t Bytes(const QuantMatrix& m) { return m.rows * GgmlRowBytes(m.type, m.cols); }

}  // namespace

absl::StatusOr<std::unique_ptr<ModelWeights>> ModelWeights::Load(
    std::shared_ptr<const GgufFile> file) {
  std::unique_ptr<ModelWeights> w(new ModelWeights());
  w->file_ = std::move(file);
  const GgufFile& f = *w->file_;
  MAGICPIG_ASSIGN_OR_RETURN(w->config_, ReadModelConfig(f));
  const ModelConfig& c = w->config_;
  MAGICPIG_ASSIGN_OR_RETURN(w->token_embd_,
                            LoadMatrix(f, "token_embd.weight", c.n_embd, c.n_vocab));
  if (f.FindTensor("output.weight") != nullptr) {
    MAGICPIG_ASSIGN_OR_RETURN(w->output_, LoadMatrix(f, "output.weight", c.n_embd, c.n_vocab));
    w->tied_ = false;
  } else {
    w->output_ = w->token_embd_;
    w->tied_ = true;
  }
  MAGICPIG_ASSIGN_OR_RETURN(w->output_norm_, LoadVector(f, "output_norm.weight", c.n_embd));
  w->weight_bytes_ = Bytes(w->output_);
  w->layers_.resize(c.n_layer);
  for (int64_t i = 0; i < c.n_layer; ++i) {
    LayerWeights& L = w->layers_[i];
    const std::string p = absl::StrCat("blk.", i, ".");
    MAGICPIG_ASSIGN_OR_RETURN(L.attn_norm, LoadVector(f, p + "attn_norm.weight", c.n_embd));
    MAGICPIG_ASSIGN_OR_RETURN(L.ffn_norm, LoadVector(f, p + "ffn_norm.weight", c.n_embd));
    MAGICPIG_ASSIGN_OR_RETURN(L.wq, LoadMatrix(f, p + "attn_q.weight", c.n_embd, c.q_dim()));
    MAGICPIG_ASSIGN_OR_RETURN(L.wk, LoadMatrix(f, p + "attn_k.weight", c.n_embd, c.kv_dim()));
    MAGICPIG_ASSIGN_OR_RETURN(L.wv, LoadMatrix(f, p + "attn_v.weight", c.n_embd, c.kv_dim()));
    MAGICPIG_ASSIGN_OR_RETURN(L.wo, LoadMatrix(f, p + "attn_output.weight", c.q_dim(), c.n_embd));
    MAGICPIG_ASSIGN_OR_RETURN(L.w_gate, LoadMatrix(f, p + "ffn_gate.weight", c.n_embd, c.n_ff));
    MAGICPIG_ASSIGN_OR_RETURN(L.w_up, LoadMatrix(f, p + "ffn_up.weight", c.n_embd, c.n_ff));
    MAGICPIG_ASSIGN_OR_RETURN(L.w_down, LoadMatrix(f, p + "ffn_down.weight", c.n_ff, c.n_embd));
    if (c.qkv_bias) {
      MAGICPIG_ASSIGN_OR_RETURN(L.bq, LoadVector(f, p + "attn_q.bias", c.q_dim()));
      MAGICPIG_ASSIGN_OR_RETURN(L.bk, LoadVector(f, p + "attn_k.bias", c.kv_dim()));
      MAGICPIG_ASSIGN_OR_RETURN(L.bv, LoadVector(f, p + "attn_v.bias", c.kv_dim()));
    }
    w->weight_bytes_ += Bytes(L.wq) + Bytes(L.wk) + Bytes(L.wv) + Bytes(L.wo) + Bytes(L.w_gate) +
                        Bytes(L.w_up) + Bytes(L.w_down);
  }
  return w;
}

}  // namespace magicpig::model
