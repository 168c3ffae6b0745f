#include "gpu_node/engine/transformer.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace magicpig::engine {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

Transformer::Transformer(const model::ModelWeights* weights, backend::Backend* backend)
    : weights_(weights), backend_(backend) {
  const model::ModelConfig& c = weights_->config();
  rope_.pairing = c.rope_style == model::RopeStyle::kNorm ? backend::RopePairing::kAdjacent
                                                          : backend::RopePairing::kHalfOffset;
  rope_.n_rot = c.n_rot;
  rope_.freq_base = c.rope_freq_base;
}

void Transformer::ResizeScratch(int64_t rows) {
  const model::ModelConfig& c = weights_->config();
  norm_.resize(rows * std::max(c.n_embd, c.q_dim()));
  q_.resize(rows * c.q_dim());
  attn_.resize(rows * c.q_dim());
  k_.resize(rows * c.kv_dim());
  v_.resize(rows * c.kv_dim());
  gate_.resize(rows * c.n_ff);
  up_.resize(rows * c.n_ff);
  positions_.resize(rows);
}

absl::Status Transformer::LayerStep(int64_t layer, float* x, int64_t n,
                                    absl::Span<const Slot> slots, const ForwardOptions* options,
                                    StepTimings* timings) {
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

  const Clock::time_point attention_start = Clock::now();
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  for (const Slot& s : slots) {
    const float* q = q_.data() + s.row * c.q_dim();
    const float* k = k_.data() + s.row * c.kv_dim();
    const float* v = v_.data() + s.row * c.kv_dim();
    float* out = attn_.data() + s.row * c.q_dim();
    if (options != nullptr && options->on_qk) options->on_qk(layer, s.first_pos, s.n, q, k);
    const backend::KvLayerView cache = s.kv->layer(layer);
    b.StoreKv(k, v, s.n, s.first_pos, cache);
    bool handled = false;
    if (s.n == 1 && s.hook != nullptr) {
      MAGICPIG_ASSIGN_OR_RETURN(handled, s.hook->Attend(layer, q, s.first_pos, cache, scale, out));
    }
    if (!handled) b.CausalAttention(q, s.n, s.first_pos, c.n_head, scale, cache, out);
  }
  if (timings != nullptr) timings->attention += Seconds(attention_start, Clock::now());

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
  ResizeScratch(chunk);

  // The residual stream of every token of this call: n * n_embd floats.
  std::vector<float> x(n * c.n_embd);
  return backend_->Execute([&]() -> absl::Status {
    MAGICPIG_RETURN_IF_ERROR(backend_->Embed(weights_->token_embd(), tokens, x.data()));
    for (int64_t l = 0; l < c.n_layer; ++l) {
      for (int64_t t0 = 0; t0 < n; t0 += chunk) {
        const int64_t m = std::min(chunk, n - t0);
        for (int64_t i = 0; i < m; ++i) positions_[i] = static_cast<int32_t>(first_pos + t0 + i);
        const Slot slot{&kv, first_pos + t0, 0, m, options.attention_hook};
        MAGICPIG_RETURN_IF_ERROR(
            LayerStep(l, x.data() + t0 * c.n_embd, m, {&slot, 1}, &options, nullptr));
      }
      if (options.attention_hook != nullptr) {
        MAGICPIG_RETURN_IF_ERROR(
            options.attention_hook->OnLayerStored(l, kv.layer(l), first_pos + n));
      }
      if (options.on_layer_done) options.on_layer_done(l, c.n_layer);
    }
    kv.set_size(first_pos + n);
    if (options.logits == LogitsMode::kNone) return absl::OkStatus();
    if (options.logits == LogitsMode::kAll && options.on_logits) {
      // Row blocks of the LM head, handed out one block at a time: n * n_vocab floats for a long
      // prompt would not fit; the last row is also kept in `logits`.
      const int64_t block = chunk;
      std::vector<float> normed(block * c.n_embd), part(block * c.n_vocab);
      for (int64_t t0 = 0; t0 < n; t0 += block) {
        const int64_t m = std::min(block, n - t0);
        backend_->RmsNorm(x.data() + t0 * c.n_embd, weights_->output_norm().data(), m, c.n_embd,
                          static_cast<float>(c.rms_eps), normed.data());
        MAGICPIG_RETURN_IF_ERROR(
            backend_->MatMul(weights_->output(), normed.data(), m, part.data()));
        options.on_logits(t0, m, part.data());
        if (t0 + m == n) {
          logits->assign(part.begin() + (m - 1) * c.n_vocab, part.begin() + m * c.n_vocab);
        }
      }
      return absl::OkStatus();
    }
    const int64_t first_out = options.logits == LogitsMode::kLast ? n - 1 : 0;
    const int64_t n_out = n - first_out;
    std::vector<float> normed(n_out * c.n_embd);
    backend_->RmsNorm(x.data() + first_out * c.n_embd, weights_->output_norm().data(), n_out,
                      c.n_embd, static_cast<float>(c.rms_eps), normed.data());
    logits->resize(n_out * c.n_vocab);
    return backend_->MatMul(weights_->output(), normed.data(), n_out, logits->data());
  });
}

absl::Status Transformer::ForwardBatch(absl::Span<const DecodeItem> items,
                                       std::vector<float>* logits, StepTimings* timings) {
  const model::ModelConfig& c = weights_->config();
  const int64_t n = static_cast<int64_t>(items.size());
  if (n == 0) return absl::InvalidArgumentError("ForwardBatch needs at least one sequence");
  std::vector<Slot> slots(n);
  std::vector<int32_t> tokens(n);
  for (int64_t i = 0; i < n; ++i) {
    const DecodeItem& item = items[i];
    if (item.kv == nullptr) return absl::InvalidArgumentError("a batch item has no KV cache");
    if (item.token < 0 || item.token >= c.n_vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", item.token, " is outside the vocabulary [0, ", c.n_vocab, ")"));
    }
    if (item.kv->size() + 1 > item.kv->capacity()) {
      return absl::OutOfRangeError(absl::StrCat("sequence of ", item.kv->size() + 1,
                                                " tokens exceeds the KV cache capacity of ",
                                                item.kv->capacity()));
    }
    for (int64_t j = 0; j < i; ++j) {
      if (items[j].kv == item.kv) {
        return absl::InvalidArgumentError("a sequence appears twice in one batch");
      }
    }
    slots[i] = Slot{item.kv, item.kv->size(), i, 1, item.attention_hook};
    tokens[i] = item.token;
  }
  ResizeScratch(n);
  std::vector<float> x(n * c.n_embd);
  const Clock::time_point start = Clock::now();
  StepTimings local;
  absl::Status status = backend_->Execute([&]() -> absl::Status {
    MAGICPIG_RETURN_IF_ERROR(backend_->Embed(weights_->token_embd(), tokens, x.data()));
    for (int64_t l = 0; l < c.n_layer; ++l) {
      for (int64_t i = 0; i < n; ++i) positions_[i] = static_cast<int32_t>(slots[i].first_pos);
      MAGICPIG_RETURN_IF_ERROR(LayerStep(l, x.data(), n, slots, nullptr, &local));
      for (const Slot& s : slots) {
        if (s.hook != nullptr) {
          MAGICPIG_RETURN_IF_ERROR(s.hook->OnLayerStored(l, s.kv->layer(l), s.first_pos + 1));
        }
      }
    }
    for (const Slot& s : slots) s.kv->set_size(s.first_pos + 1);
    std::vector<float> normed(n * c.n_embd);
    backend_->RmsNorm(x.data(), weights_->output_norm().data(), n, c.n_embd,
                      static_cast<float>(c.rms_eps), normed.data());
    logits->resize(n * c.n_vocab);
    return backend_->MatMul(weights_->output(), normed.data(), n, logits->data());
  });
  if (timings != nullptr) {
    timings->attention += local.attention;
    timings->dense += Seconds(start, Clock::now()) - local.attention;
  }
  return status;
}

}  // namespace magicpig::engine
