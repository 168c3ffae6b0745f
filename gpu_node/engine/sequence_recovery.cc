#include "gpu_node/engine/sequence_recovery.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace magicpig::engine {

bool SequenceRecovery::Recoverable(const Sequence& seq, const absl::Status& status) {
  return !status.ok() && seq.router_ != nullptr && seq.router_->needs_rebuild();
}

absl::Status SequenceRecovery::RetryPrefill(const SparseAttentionOptions& attention, Sequence& seq,
                                            ForwardOptions prefill, absl::Status status) {
  for (int64_t attempt = 1; Recoverable(seq, status) && attempt <= kMaxRebuilds; ++attempt) {
    MAGICPIG_RETURN_IF_ERROR(place_again_(attention, seq));
    prefill.attention_hook = seq.router_.get();
    status = transformer_->Forward(seq.request_.prompt, *seq.kv_, prefill, &seq.logits_);
    if (status.ok()) {
      SparseAttentionStats stats = seq.router_->stats();
      stats.recoveries = attempt;
      seq.router_->RestoreStats(stats);
    }
  }
  return status;
}

absl::Status SequenceRecovery::Rebuild(const SparseAttentionOptions& attention, Sequence& seq) {
  SparseAttentionStats stats = seq.router_->stats();
  ForwardOptions prefill;
  prefill.logits = LogitsMode::kNone;
  prefill.max_chunk = prefill_chunk_;
  absl::Status status;
  do {
    if (++stats.recoveries > kMaxRebuilds) {
      // UNAVAILABLE whatever the last node said (a restarted node's NOT_FOUND included): the
      // client may retry, and the API must not call it an internal error.
      return absl::UnavailableError(
          absl::StrCat("attention nodes keep failing (", kMaxRebuilds, " rebuilds)",
                       status.ok() ? "" : absl::StrCat("; last: ", status.message())));
    }
    MAGICPIG_RETURN_IF_ERROR(place_again_(attention, seq));
    prefill.attention_hook = seq.router_.get();
    status = transformer_->Forward(seq.request_.prompt, *seq.kv_, prefill, nullptr);
    std::vector<float> logits;
    for (int64_t i = 0; status.ok() && i + 1 < seq.generated(); ++i) {
      const DecodeItem item{seq.result_.tokens[static_cast<size_t>(i)], seq.kv_.get(),
                            seq.router_.get()};
      status = transformer_->ForwardBatch({&item, 1}, &logits, nullptr, 1);
    }
    if (!status.ok() && !seq.router_->needs_rebuild()) return status;
  } while (!status.ok());
  seq.router_->RestoreStats(stats);
  return absl::OkStatus();
}

}  // namespace magicpig::engine
