#include "gpu_node/engine/transformer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace magicpig::engine {

Transformer::Transformer(const model::ModelWeights* weights, backend::Backend* backend)
    : weights_(weights), backend_(backend) {
  const model::ModelConfig& c = weights_->config();
  rope_.pairing = c.rope_style == model::RopeStyle::kNorm ? backend::RopePairing::kAdjacent
                                                          : backend::RopePairing::kHalfOffset;
  rope_.n_rot = c.n_rot;
  rope_.freq_base = c.rope_freq_base;
}

absl::Status Transformer::LayerChunk(int64_t layer, float* x, int64_t n, int64_t first_pos,
                                     KvCache& kv, const ForwardOptions& options) {
  const model::ModelConfig& c = weights_->config();
  const model::LayerWeights& w = weights_->layer(layer);
  backend::Backend& b = *backend_;
  const float eps = static_cast<float>(c.rms_eps);

  b.RmsNorm(x, w.attn_norm.data(), n, c.n_embd, eps, norm_.data());
  MAGICPIG_RETURN_IF_ERROR(b.MatMul(w.wq, norm_.data(), n, q_.data()));
  MAGICPIG_RETURN_IF_ERROR(b.MatMul(w.wk, norm_.data(), n, k_.data()));
  MAGICPIG_RETURN_IF_ERROR(b.MatMul(w.wv, norm_.data(), n, v_.data()));
  if (c.qkv_bias) {
    b.AddBias(q_.data(), w.bq.data(), n, c.q_dim());
    b.AddBias(k_.data(), w.bk.data(), n, c.kv_dim());
    b.AddBias(v_.data(), w.bv.data(), n, c.kv_dim());
  }
  b.Rope(q_.data(), n, c.n_head, c.head_dim, positions_.data(), rope_);
  b.Rope(k_.data(), n, c.n_head_kv, c.head_dim, positions_.data(), rope_);
  if (options.on_qk) options.on_qk(layer, first_pos, n, q_.data(), k_.data());
  const backend::KvLayerView cache = kv.layer(layer);
  b.StoreKv(k_.data(), v_.data(), n, first_pos, cache);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  bool handled = false;
  if (n == 1 && options.attention_hook != nullptr) {
    MAGICPIG_ASSIGN_OR_RETURN(handled, options.attention_hook->Attend(layer, q_.data(), first_pos,
                                                                      cache, scale, attn_.data()));
  }
  if (!handled) b.CausalAttention(q_.data(), n, first_pos, c.n_head, scale, cache, attn_.data());
  MAGICPIG_RETURN_IF_ERROR(b.MatMul(w.wo, attn_.data(), n, norm_.data()));
  b.Add(norm_.data(), x, n * c.n_embd);

  b.RmsNorm(x, w.ffn_norm.data(), n, c.n_embd, eps, norm_.data());
  MAGICPIG_RETURN_IF_ERROR(b.MatMul(w.w_gate, norm_.data(), n, gate_.data()));
  MAGICPIG_RETURN_IF_ERROR(b.MatMul(w.w_up, norm_.data(), n, up_.data()));
  b.SwiGlu(gate_.data(), up_.data(), n * c.n_ff, gate_.data());
  MAGICPIG_RETURN_IF_ERROR(b.MatMul(w.w_down, gate_.data(), n, norm_.data()));
  b.Add(norm_.data(), x, n * c.n_embd);
  return absl::OkStatus();
}

absl::Status Transformer::Forward(absl::Span<const int32_t> tokens, KvCache& kv,
                                  const ForwardOptions& options, std::vector<float>* logits) {
  const model::ModelConfig& c = weights_->config();
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t first_pos = kv.size();
  if (n == 0) return absl::InvalidArgumentError("Forward needs at least one token");
  if (first_pos + n > kv.capacity()) {
    return absl::OutOfRangeError(absl::StrCat(
        "sequence of ", first_pos + n, " tokens exceeds the KV cache capacity of ", kv.capacity()));
  }
  for (int32_t id : tokens) {
    if (id < 0 || id >= c.n_vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " is outside the vocabulary [0, ", c.n_vocab, ")"));
    }
  }
  const int64_t chunk = std::max<int64_t>(1, std::min(options.max_chunk, n));
  norm_.resize(chunk * std::max(c.n_embd, c.q_dim()));
  q_.resize(chunk * c.q_dim());
  attn_.resize(chunk * c.q_dim());
  k_.resize(chunk * c.kv_dim());
  v_.resize(chunk * c.kv_dim());
  gate_.resize(chunk * c.n_ff);
  up_.resize(chunk * c.n_ff);
  positions_.resize(chunk);

  // The residual stream of every token of this call: n * n_embd floats.
  std::vector<float> x(n * c.n_embd);
  return backend_->Execute([&]() -> absl::Status {
    MAGICPIG_RETURN_IF_ERROR(backend_->Embed(weights_->token_embd(), tokens, x.data()));
    for (int64_t l = 0; l < c.n_layer; ++l) {
      for (int64_t t0 = 0; t0 < n; t0 += chunk) {
        const int64_t m = std::min(chunk, n - t0);
        for (int64_t i = 0; i < m; ++i) positions_[i] = static_cast<int32_t>(first_pos + t0 + i);
        MAGICPIG_RETURN_IF_ERROR(
            LayerChunk(l, x.data() + t0 * c.n_embd, m, first_pos + t0, kv, options));
      }
      if (options.attention_hook != nullptr) {
        MAGICPIG_RETURN_IF_ERROR(
            options.attention_hook->OnLayerStored(l, kv.layer(l), first_pos + n));
      }
      if (options.on_layer_done) options.on_layer_done(l, c.n_layer);
    }
    kv.set_size(first_pos + n);
    if (options.logits == LogitsMode::kNone) return absl::OkStatus();
    const int64_t first_out = options.logits == LogitsMode::kLast ? n - 1 : 0;
    const int64_t n_out = n - first_out;
    std::vector<float> normed(n_out * c.n_embd);
    backend_->RmsNorm(x.data() + first_out * c.n_embd, weights_->output_norm().data(), n_out,
                      c.n_embd, static_cast<float>(c.rms_eps), normed.data());
    logits->resize(n_out * c.n_vocab);
    return backend_->MatMul(weights_->output(), normed.data(), n_out, logits->data());
  });
}

}  // namespace magicpig::engine
