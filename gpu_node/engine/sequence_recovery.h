// SequenceRecovery: puts a sequence back on its feet after an attention node failed for it
// (docs/architecture.md §9.3). The sequence gets fresh shards on the nodes that still answer and a
// fresh cache (the engine's `place_again`), which are then filled from the token history: the
// prompt prefilled, then every generated token but the last decoded again (teacher-forced, alone).
// With the same hash seed and the same blocks the shards and the cache end as they were, so
// generation goes on with the same tokens. At most kMaxRebuilds placements per sequence.
//
// Thread-safety: called by the Engine under its lock, one sequence at a time.
#ifndef MAGICPIG_GPU_NODE_ENGINE_SEQUENCE_RECOVERY_H_
#define MAGICPIG_GPU_NODE_ENGINE_SEQUENCE_RECOVERY_H_

#include <cstdint>
#include <functional>
#include <utility>

#include "absl/status/status.h"
#include "gpu_node/engine/engine.h"
#include "gpu_node/engine/transformer.h"

namespace magicpig::engine {

class SequenceRecovery {
 public:
  // Placements per sequence before an attention-node failure is returned as it is.
  static constexpr int64_t kMaxRebuilds = 8;

  // place_again: drops the sequence's shards (releasing what the nodes that still answer hold)
  // and cache, and sets up fresh ones that leave out every node that failed for it.
  using PlaceAgain = std::function<absl::Status(const SparseAttentionOptions&, Sequence&)>;

  // prefill_chunk: tokens per layer step of the refill's prefill (EngineOptions::prefill_chunk).
  SequenceRecovery(Transformer* transformer, int64_t prefill_chunk, PlaceAgain place_again)
      : transformer_(transformer),
        prefill_chunk_(prefill_chunk),
        place_again_(std::move(place_again)) {}

  // True when `status` of an attention step of `seq` calls for a rebuild.
  static bool Recoverable(const Sequence& seq, const absl::Status& status);

  // The prompt's prefill (`prefill`, whose logits go to seq's next-token logits) failed with
  // `status`: places the sequence again and reruns the prefill while that is recoverable. Returns
  // the last status.
  absl::Status RetryPrefill(const SparseAttentionOptions& attention, Sequence& seq,
                            ForwardOptions prefill, absl::Status status);

  // A decode step of `seq` failed recoverably: places it again and refills it from the token
  // history, up to the input of the step being retried. Keeps its sparse-attention counters.
  absl::Status Rebuild(const SparseAttentionOptions& attention, Sequence& seq);

 private:
  Transformer* const transformer_;
  const int64_t prefill_chunk_;
  const PlaceAgain place_again_;
};

}  // namespace magicpig::engine

#endif  // MAGICPIG_GPU_NODE_ENGINE_SEQUENCE_RECOVERY_H_
