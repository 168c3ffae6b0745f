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

absl::Status Transformer::PrepareWeights() {
  backend::Backend& b = *backend_;
  const model::ModelConfig& c = weights_->config();
  auto vector = [&b](const std::vector<float>& v) {
    return v.empty() ? absl::OkStatus() : b.PrepareVector(v.data(), static_cast<int64_t>(v.size()));
  };
  MAGICPIG_RETURN_IF_ERROR(b.PrepareMatrix(weights_->token_embd()));
  if (!weights_->tied_embeddings()) MAGICPIG_RETURN_IF_ERROR(b.PrepareMatrix(weights_->output()));
  MAGICPIG_RETURN_IF_ERROR(vector(weights_->output_norm()));
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const model::LayerWeights& w = weights_->layer(l);
    for (const QuantMatrix* m : {&w.wq, &w.wk, &w.wv, &w.wo, &w.w_gate, &w.w_up, &w.w_down}) {
      MAGICPIG_RETURN_IF_ERROR(b.PrepareMatrix(*m));
    }
    for (const std::vector<float>* v : {&w.attn_norm, &w.ffn_norm, &w.bq, &w.bk, &w.bv}) {
      MAGICPIG_RETURN_IF_ERROR(vector(*v));
    }
  }
  return absl::OkStatus();
}

absl::Status Transformer::ResizeScratch(int64_t rows) {
  if (rows <= scratch_rows_) return absl::OkStatus();
  const model::ModelConfig& c = weights_->config();
  backend::Backend& b = *backend_;
  const int64_t f = sizeof(float);
  MAGICPIG_ASSIGN_OR_RETURN(norm_, b.Allocate(rows * std::max(c.n_embd, c.q_dim()) * f));
  MAGICPIG_ASSIGN_OR_RETURN(q_, b.Allocate(rows * c.q_dim() * f));
  MAGICPIG_ASSIGN_OR_RETURN(attn_, b.Allocate(rows * c.q_dim() * f));
  MAGICPIG_ASSIGN_OR_RETURN(k_, b.Allocate(rows * c.kv_dim() * f));
  MAGICPIG_ASSIGN_OR_RETURN(v_, b.Allocate(rows * c.kv_dim() * f));
  MAGICPIG_ASSIGN_OR_RETURN(gate_, b.Allocate(rows * c.n_ff * f));
  MAGICPIG_ASSIGN_OR_RETURN(up_, b.Allocate(rows * c.n_ff * f));
  MAGICPIG_ASSIGN_OR_RETURN(positions_, b.Allocate(rows * static_cast<int64_t>(sizeof(int32_t))));
  positions_host_.resize(rows);
  if (!b.host_memory()) {
    hook_q_.resize(rows * c.q_dim());
    hook_out_.resize(rows * c.q_dim());
    hook_window_o_.resize(rows * c.q_dim());
    hook_window_lse_.resize(rows * c.n_head);
    MAGICPIG_ASSIGN_OR_RETURN(window_o_, b.Allocate(rows * c.q_dim() * f));
    MAGICPIG_ASSIGN_OR_RETURN(window_lse_, b.Allocate(rows * c.n_head * f));
  }
  scratch_rows_ = rows;
  return absl::OkStatus();
}

absl::Status Transformer::UploadPositions(int64_t n) {
  return backend_->CopyIn(positions_.data(), positions_host_.data(),
                          n * static_cast<int64_t>(sizeof(int32_t)));
}

absl::Status Transformer::MirrorRows(int64_t layer, KvCache& kv, int64_t first, int64_t n) {
  if (!kv.has_host_mirror()) {
    return absl::FailedPreconditionError(
        "sparse attention on a device backend needs the cache's host mirror");
  }
  const backend::KvLayerView from = kv.layer(layer);
  const backend::KvLayerView to = kv.host().layer(layer);
  const int64_t row = from.n_head_kv * from.head_dim;
  const int64_t bytes = n * row * static_cast<int64_t>(sizeof(uint16_t));
  // Read on the host after the next FlushCopies (before the hook's StartAttend and
  // OnLayerStored).
  MAGICPIG_RETURN_IF_ERROR(
      backend_->CopyOutLater(to.k + first * row, from.k + from.Row(first) * row, bytes));
  return backend_->CopyOutLater(to.v + first * row, from.v + from.Row(first) * row, bytes);
}

absl::StatusOr<LayerAttentionHook::DeviceResults> Transformer::DeviceWorkFor(
    const LayerAttentionHook::DeviceWork& work, int64_t row, const float* q,
    const backend::KvLayerView& cache, float scale, StepTimings* timings) {
  const model::ModelConfig& c = weights_->config();
  backend::Backend& b = *backend_;
  LayerAttentionHook::DeviceResults results;
  const Clock::time_point start = Clock::now();
  if (work.hash != nullptr) {
    const int64_t per_row = c.n_head * work.hash->l();
    if (static_cast<int64_t>(hook_codes_.size()) < scratch_rows_ * per_row) {
      hook_codes_.resize(scratch_rows_ * per_row);
    }
    uint16_t* codes = hook_codes_.data() + row * per_row;
    MAGICPIG_RETURN_IF_ERROR(b.SimHashCodes(*work.hash, q, c.n_head, codes));
    results.codes = codes;
  }
  const Clock::time_point hashed = Clock::now();
  if (!work.window_ranges.empty()) {
    float* o = window_o_.as<float>() + row * c.q_dim();
    float* lse = window_lse_.as<float>() + row * c.n_head;
    b.RangeAttention(q, c.n_head, scale, cache, work.window_ranges, o, lse);
    float* o_host = hook_window_o_.data() + row * c.q_dim();
    float* lse_host = hook_window_lse_.data() + row * c.n_head;
    MAGICPIG_RETURN_IF_ERROR(b.CopyOutLater(o_host, o, c.q_dim() * 4));
    MAGICPIG_RETURN_IF_ERROR(b.CopyOutLater(lse_host, lse, c.n_head * 4));
    results.window_o = o_host;
    results.window_lse = lse_host;
  }
  if (timings != nullptr) {
    timings->device_hash += Seconds(start, hashed);
    timings->device_window += Seconds(hashed, Clock::now());
  }
  return results;
}

absl::Status Transformer::Logits(const float* x, int64_t n, float* logits) {
  const model::ModelConfig& c = weights_->config();
  backend::Backend& b = *backend_;
  // Kept between calls: a device allocation per decode step would cost more than the step's norm.
  MAGICPIG_RETURN_IF_ERROR(
      b.Reserve(logits_norm_, n * c.n_embd * static_cast<int64_t>(sizeof(float))));
  const backend::Backend::InputNorm norm{weights_->output_norm().data(),
                                         static_cast<float>(c.rms_eps), logits_norm_.as<float>()};
  // A device backend writes the logits to its own memory first.
  const int64_t bytes = n * c.n_vocab * static_cast<int64_t>(sizeof(float));
  if (!b.host_memory()) MAGICPIG_RETURN_IF_ERROR(b.Reserve(logits_out_, bytes));
  const backend::Backend::Product head{&weights_->output(), nullptr,
                                       b.host_memory() ? logits : logits_out_.as<float>()};
  MAGICPIG_RETURN_IF_ERROR(b.MatMuls({&head, 1}, x, n, norm));
  return b.host_memory() ? absl::OkStatus() : b.CopyOut(logits, logits_out_.data(), bytes);
}

absl::Status Transformer::LayerPre(int64_t layer, float* x, int64_t row, int64_t n,
                                   absl::Span<const Slot> slots, const ForwardOptions* options,
                                   std::vector<char>* pending, StepTimings* timings) {
  const model::ModelConfig& c = weights_->config();
  const model::LayerWeights& w = weights_->layer(layer);
  backend::Backend& b = *backend_;
  const float eps = static_cast<float>(c.rms_eps);
  float* xr = x + row * c.n_embd;
  float* norm = norm_.as<float>() + row * c.n_embd;
  float* q = q_.as<float>() + row * c.q_dim();
  float* k = k_.as<float>() + row * c.kv_dim();
  float* v = v_.as<float>() + row * c.kv_dim();

  const backend::Backend::Product qkv[3] = {{&w.wq, c.qkv_bias ? w.bq.data() : nullptr, q},
                                            {&w.wk, c.qkv_bias ? w.bk.data() : nullptr, k},
                                            {&w.wv, c.qkv_bias ? w.bv.data() : nullptr, v}};
  MAGICPIG_RETURN_IF_ERROR(b.MatMuls(qkv, xr, n, {w.attn_norm.data(), eps, norm}));
  // One sequence's rows: rotated and stored in its cache by one operation (a launch fewer per
  // layer on a GPU); several sequences' rows go to their own caches below.
  const bool one_cache = slots.size() == 1;
  const int32_t* positions = positions_.as<int32_t>() + row;
  if (one_cache) {
    b.RopeQkStoreKv(q, c.n_head, k, v, c.n_head_kv, n, c.head_dim, positions, rope_,
                    slots[0].first_pos, slots[0].kv->layer(layer));
  } else {
    b.RopeQk(q, c.n_head, k, c.n_head_kv, n, c.head_dim, positions, rope_);
  }

  const Clock::time_point attention_start = Clock::now();
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  for (size_t i = 0; i < slots.size(); ++i) {
    const Slot& s = slots[i];
    const float* sq = q_.as<float>() + s.row * c.q_dim();
    const float* sk = k_.as<float>() + s.row * c.kv_dim();
    const float* sv = v_.as<float>() + s.row * c.kv_dim();
    float* out = attn_.as<float>() + s.row * c.q_dim();
    if (options != nullptr && options->on_qk) {
      if (b.host_memory()) {
        options->on_qk(layer, s.first_pos, s.n, sq, sk);
      } else {
        q_host_.resize(s.n * c.q_dim());
        k_host_.resize(s.n * c.kv_dim());
        MAGICPIG_RETURN_IF_ERROR(b.CopyOut(q_host_.data(), sq, s.n * c.q_dim() * 4));
        MAGICPIG_RETURN_IF_ERROR(b.CopyOut(k_host_.data(), sk, s.n * c.kv_dim() * 4));
        options->on_qk(layer, s.first_pos, s.n, q_host_.data(), k_host_.data());
      }
    }
    const backend::KvLayerView cache = s.kv->layer(layer);
    if (!one_cache) b.StoreKv(sk, sv, s.n, s.first_pos, cache);
    const bool hooked = s.hook != nullptr && s.hook->AttendsLayer(layer);
    // A device cache's hooked layers mirror their rows to the host; q goes there (and the step
    // waits for it) only where the hook attends this step.
    const bool staged = hooked && !b.host_memory();
    const bool attends = hooked && (!staged || s.n != 1 || s.hook->AttendsAt(layer, s.first_pos));
    const Clock::time_point launch_start = Clock::now();
    if (staged) MAGICPIG_RETURN_IF_ERROR(MirrorRows(layer, *s.kv, s.first_pos, s.n));
    bool started = false;
    if (s.n == 1 && attends) {
      if (staged) {
        // The hook reads q and writes out on the host; LayerPost copies out back. Hashing and
        // the static window (when the hook plans them) run where q and the cache are; the row
        // mirrored above, q, the codes and the window's part come back with one wait.
        float* q_host = hook_q_.data() + s.row * c.q_dim();
        MAGICPIG_RETURN_IF_ERROR(b.CopyOutLater(q_host, sq, c.q_dim() * 4));
        float* out_host = hook_out_.data() + s.row * c.q_dim();
        LayerAttentionHook::DeviceWork work;
        const bool planned = s.hook->PlanDeviceWork(layer, s.first_pos, &work);
        LayerAttentionHook::DeviceResults results;
        if (timings != nullptr) timings->device_mirror += Seconds(launch_start, Clock::now());
        if (planned) {
          MAGICPIG_ASSIGN_OR_RETURN(results, DeviceWorkFor(work, s.row, sq, cache, scale, timings));
        }
        const Clock::time_point flush_start = Clock::now();
        MAGICPIG_RETURN_IF_ERROR(b.FlushCopies());
        const Clock::time_point flush_end = Clock::now();
        const backend::KvLayerView host_cache = s.kv->host().layer(layer);
        MAGICPIG_ASSIGN_OR_RETURN(
            started,
            planned ? s.hook->StartAttendWith(layer, q_host, s.first_pos, host_cache, scale,
                                              out_host, results)
                    : s.hook->StartAttend(layer, q_host, s.first_pos, host_cache, scale, out_host));
        if (timings != nullptr) {
          timings->device_wait += Seconds(flush_start, flush_end);
          timings->hook_start += Seconds(flush_end, Clock::now());
        }
      } else {
        MAGICPIG_ASSIGN_OR_RETURN(started,
                                  s.hook->StartAttend(layer, sq, s.first_pos, cache, scale, out));
      }
    }
    (*pending)[i] = started;
    if (!started) {
      if (cache.has_gap()) {
        return absl::FailedPreconditionError(
            absl::StrCat("layer ", layer,
                         ": exact attention over a cache whose offloaded rows left the device"));
      }
      b.CausalAttention(sq, s.n, s.first_pos, c.n_head, scale, cache, out);
    }
  }
  const Clock::time_point flush_started = Clock::now();
  bool any_pending = false;
  for (size_t i = 0; i < slots.size(); ++i) {
    if ((*pending)[i]) slots[i].hook->FlushStarted();
    any_pending = any_pending || (*pending)[i];
  }
  if (timings != nullptr) {
    const Clock::time_point end = Clock::now();
    timings->attention += Seconds(attention_start, end);
    if (any_pending && !b.host_memory()) timings->hook_start += Seconds(flush_started, end);
  }
  return absl::OkStatus();
}

absl::Status Transformer::LayerPost(int64_t layer, float* x, int64_t row, int64_t n,
                                    absl::Span<const Slot> slots, const std::vector<char>& pending,
                                    StepTimings* timings) {
  const model::ModelConfig& c = weights_->config();
  const model::LayerWeights& w = weights_->layer(layer);
  backend::Backend& b = *backend_;
  const float eps = static_cast<float>(c.rms_eps);
  const Clock::time_point wait_start = Clock::now();
  for (size_t i = 0; i < slots.size(); ++i) {
    if (!pending[i]) continue;
    const Clock::time_point finish_start = Clock::now();
    MAGICPIG_RETURN_IF_ERROR(slots[i].hook->FinishAttend());
    if (!b.host_memory()) {
      const int64_t at = slots[i].row * c.q_dim();
      const Clock::time_point copy_start = Clock::now();
      if (timings != nullptr) timings->hook_finish += Seconds(finish_start, copy_start);
      MAGICPIG_RETURN_IF_ERROR(
          b.CopyIn(attn_.as<float>() + at, hook_out_.data() + at, c.q_dim() * 4));
      if (timings != nullptr) timings->device_wait += Seconds(copy_start, Clock::now());
    }
  }
  if (timings != nullptr) timings->attention += Seconds(wait_start, Clock::now());
  float* xr = x + row * c.n_embd;
  float* norm = norm_.as<float>() + row * c.n_embd;
  float* gate = gate_.as<float>() + row * c.n_ff;
  float* up = up_.as<float>() + row * c.n_ff;

  MAGICPIG_RETURN_IF_ERROR(b.MatMulAdd(w.wo, attn_.as<float>() + row * c.q_dim(), n, xr, norm));
  MAGICPIG_RETURN_IF_ERROR(
      b.GateUpSwiGlu(w.w_gate, w.w_up, xr, n, {w.ffn_norm.data(), eps, norm}, gate, up, gate));
  return b.MatMulAdd(w.w_down, gate, n, xr, norm);
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
  MAGICPIG_RETURN_IF_ERROR(ResizeScratch(chunk));

  // The residual stream of every token of this call: n * n_embd floats.
  MAGICPIG_ASSIGN_OR_RETURN(backend::BackendBuffer x_buffer,
                            backend_->Allocate(n * c.n_embd * static_cast<int64_t>(sizeof(float))));
  float* x = x_buffer.as<float>();
  auto forward = [&]() -> absl::Status {
    MAGICPIG_RETURN_IF_ERROR(backend_->Embed(weights_->token_embd(), tokens, x));
    for (int64_t l = 0; l < c.n_layer; ++l) {
      for (int64_t t0 = 0; t0 < n; t0 += chunk) {
        const int64_t m = std::min(chunk, n - t0);
        for (int64_t i = 0; i < m; ++i) {
          positions_host_[i] = static_cast<int32_t>(first_pos + t0 + i);
        }
        MAGICPIG_RETURN_IF_ERROR(UploadPositions(m));
        const Slot slot{&kv, first_pos + t0, 0, m, options.attention_hook};
        float* xc = x + t0 * c.n_embd;
        std::vector<char> pending(1);
        MAGICPIG_RETURN_IF_ERROR(LayerPre(l, xc, 0, m, {&slot, 1}, &options, &pending, nullptr));
        MAGICPIG_RETURN_IF_ERROR(LayerPost(l, xc, 0, m, {&slot, 1}, pending, nullptr));
      }
      if (options.attention_hook != nullptr) {
        if (!backend_->host_memory()) {
          // The offload's key codes where the rows are (the host then only copies and centres).
          LayerAttentionHook::OffloadCodesPlan plan;
          MAGICPIG_ASSIGN_OR_RETURN(
              const bool device_codes,
              options.attention_hook->PlanOffloadCodes(l, first_pos + n, &plan));
          if (device_codes) {
            MAGICPIG_RETURN_IF_ERROR(backend_->OffloadKeyCodes(*plan.hash, kv.layer(l), plan.begin,
                                                               plan.end, plan.compute_centre,
                                                               plan.centre, plan.codes));
          }
        }
        MAGICPIG_RETURN_IF_ERROR(backend_->FlushCopies());  // the rows MirrorRows queued
        MAGICPIG_RETURN_IF_ERROR(
            options.attention_hook->OnLayerStored(l, kv.host().layer(l), first_pos + n));
        if (!backend_->host_memory() && !kv.layer(l).has_gap()) {
          // The offloaded region is on the shards now: the GPU keeps the window only.
          const auto [begin, end] = options.attention_hook->OffloadedPositions(l);
          MAGICPIG_RETURN_IF_ERROR(kv.DropRows(l, begin, end, first_pos + n));
        }
      }
      if (options.on_layer_done) options.on_layer_done(l, c.n_layer);
    }
    kv.set_size(first_pos + n);
    if (options.logits == LogitsMode::kNone) return absl::OkStatus();
    if (options.logits == LogitsMode::kAll && options.on_logits) {
      // Row blocks of the LM head, handed out one block at a time: n * n_vocab floats for a long
      // prompt would not fit; the last row is also kept in `logits`.
      const int64_t block = chunk;
      std::vector<float> part(block * c.n_vocab);
      for (int64_t t0 = 0; t0 < n; t0 += block) {
        const int64_t m = std::min(block, n - t0);
        MAGICPIG_RETURN_IF_ERROR(Logits(x + t0 * c.n_embd, m, part.data()));
        options.on_logits(t0, m, part.data());
        if (t0 + m == n) {
          logits->assign(part.begin() + (m - 1) * c.n_vocab, part.begin() + m * c.n_vocab);
        }
      }
      return absl::OkStatus();
    }
    const int64_t first_out = options.logits == LogitsMode::kLast ? n - 1 : 0;
    const int64_t n_out = n - first_out;
    logits->resize(n_out * c.n_vocab);
    return Logits(x + first_out * c.n_embd, n_out, logits->data());
  };
  return backend_->Execute([&]() -> absl::Status {
    absl::Status status = forward();
    // The hook may still be offloading the last layers (the LM head ran beside it); on an error
    // too, nothing it does may outlive the call.
    if (options.attention_hook != nullptr) status.Update(options.attention_hook->WaitStored());
    return status;
  });
}

absl::Status Transformer::ForwardBatch(absl::Span<const DecodeItem> items,
                                       std::vector<float>* logits, StepTimings* timings,
                                       int micro_batches) {
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
  MAGICPIG_RETURN_IF_ERROR(ResizeScratch(n));
  MAGICPIG_RETURN_IF_ERROR(
      backend_->Reserve(x_batch_, n * c.n_embd * static_cast<int64_t>(sizeof(float))));
  float* x = x_batch_.as<float>();
  const Clock::time_point start = Clock::now();
  StepTimings local;
  // Without attention hooks a step is the same device operations every time (no host work
  // between layers), so a device backend may record and replay it (ExecuteReplayable). Its
  // host-side effects below are idempotent, as that requires.
  const bool replayable =
      std::all_of(slots.begin(), slots.end(), [](const Slot& s) { return s.hook == nullptr; });
  auto step = [&]() -> absl::Status {
    local = StepTimings();
    MAGICPIG_RETURN_IF_ERROR(backend_->Embed(weights_->token_embd(), tokens, x));
    for (int64_t i = 0; i < n; ++i) positions_host_[i] = static_cast<int32_t>(slots[i].first_pos);
    MAGICPIG_RETURN_IF_ERROR(UploadPositions(n));
    // Micro-batches [begin, end) of rows. With two or more, the attention of one (handed to
    // attention nodes by StartAttend) overlaps the dense work of the others. The micro-batches
    // run staggered by one: while the nodes attend micro-batch m at layer l, this thread runs
    // m - 1's post-attention at l and its pre-attention at l + 1 (for two: pre A0; then per
    // layer l: pre B_l, post A_l, pre A_l+1, post B_l), so each attention hides behind a whole
    // layer's share of dense work, not just the small pre-attention part.
    const int64_t parts = std::clamp<int64_t>(micro_batches, 1, n);
    std::vector<int64_t> bounds(parts + 1);
    for (int64_t m = 0; m <= parts; ++m) bounds[m] = n * m / parts;
    std::vector<std::vector<char>> pending(parts);
    auto part_of = [&](int64_t m) {
      return absl::Span<const Slot>(slots.data() + bounds[m], bounds[m + 1] - bounds[m]);
    };
    auto pre = [&](int64_t m, int64_t l) -> absl::Status {
      pending[m].assign(part_of(m).size(), 0);
      return LayerPre(l, x, bounds[m], bounds[m + 1] - bounds[m], part_of(m), nullptr, &pending[m],
                      &local);
    };
    auto post = [&](int64_t m, int64_t l) -> absl::Status {
      MAGICPIG_RETURN_IF_ERROR(
          LayerPost(l, x, bounds[m], bounds[m + 1] - bounds[m], part_of(m), pending[m], &local));
      // The rows MirrorRows queued, where a hook reads them now; otherwise they land at the next
      // wait (each wait costs a device backend tens of microseconds per layer).
      bool reads_rows = false;
      for (const Slot& s : part_of(m)) {
        if (s.hook != nullptr && s.hook->ReadsRowsAt(l, s.first_pos + 1)) reads_rows = true;
      }
      if (reads_rows) MAGICPIG_RETURN_IF_ERROR(backend_->FlushCopies());
      for (const Slot& s : part_of(m)) {
        if (s.hook != nullptr) {
          // A step's offload (a window overflow, a few hundred rows) is not overlapped.
          MAGICPIG_RETURN_IF_ERROR(
              s.hook->OnLayerStored(l, s.kv->host().layer(l), s.first_pos + 1));
          MAGICPIG_RETURN_IF_ERROR(s.hook->WaitStored());
        }
      }
      return absl::OkStatus();
    };
    if (parts == 1) {
      for (int64_t l = 0; l < c.n_layer; ++l) {
        MAGICPIG_RETURN_IF_ERROR(pre(0, l));
        MAGICPIG_RETURN_IF_ERROR(post(0, l));
      }
    } else {
      MAGICPIG_RETURN_IF_ERROR(pre(0, 0));
      for (int64_t l = 0; l < c.n_layer; ++l) {
        for (int64_t m = 0; m < parts; ++m) {
          if (m + 1 < parts) {
            MAGICPIG_RETURN_IF_ERROR(pre(m + 1, l));
          } else if (l + 1 < c.n_layer) {
            MAGICPIG_RETURN_IF_ERROR(pre(0, l + 1));
          }
          MAGICPIG_RETURN_IF_ERROR(post(m, l));
        }
      }
    }
    for (const Slot& s : slots) s.kv->set_size(s.first_pos + 1);
    logits->resize(n * c.n_vocab);
    const Clock::time_point logits_start = Clock::now();
    const absl::Status logits_status = Logits(x, n, logits->data());
    local.logits = Seconds(logits_start, Clock::now());
    return logits_status;
  };
  absl::Status status = replayable ? backend_->ExecuteReplayable(step) : backend_->Execute(step);
  if (timings != nullptr) {
    timings->attention += local.attention;
    timings->device_wait += local.device_wait;
    timings->device_mirror += local.device_mirror;
    timings->device_hash += local.device_hash;
    timings->device_window += local.device_window;
    timings->hook_start += local.hook_start;
    timings->hook_finish += local.hook_finish;
    timings->logits += local.logits;
    timings->dense += Seconds(start, Clock::now()) - local.attention;
  }
  return status;
}

}  // namespace magicpig::engine
