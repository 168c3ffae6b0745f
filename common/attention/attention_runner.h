// AttentionRunner: runs one estimator over many (shard, GQA group) work items of a decode step in
// parallel with oneTBB, each worker thread with its own reusable EstimatorScratch
// (docs/architecture.md §14: parallelism over (sequence, head) work items).
//
// Estimators with a two-phase form (Estimator::two_phase(): MagicPIG) run as a queue of every
// item's selection first, then every item's kernel parts: a thread done with a selection takes the
// next one, and only then a kernel part, so selections never wait behind kernels (on SmolLM2 at 8K,
// 3 groups per layer on 2 threads, the one-call form left one thread idle for a retrieval per
// layer). The others run AttendGroup per item.
//
// A Run from inside a task arena as wide as the runner's (the CPU backend's, in the embedded decode
// step) runs in that arena, isolated; from anywhere else (a GPU backend's host thread, an attention
// node's RPC thread) it runs in the runner's own arena of num_threads.
//
// Thread-safety: Run may be called from several threads at once (each worker uses only its own
// scratch, one task at a time); the work items' shards must not be mutated during a Run.
#ifndef MAGICPIG_COMMON_ATTENTION_ATTENTION_RUNNER_H_
#define MAGICPIG_COMMON_ATTENTION_ATTENTION_RUNNER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "common/attention/estimators.h"
#include "common/attention/kv_shard.h"
#include "common/attention/partial_attention.h"
#include "tbb/enumerable_thread_specific.h"
#include "tbb/task_arena.h"

namespace magicpig::attention {

// The g query heads of one GQA group against one shard (see Estimator::AttendGroup).
struct GroupWork {
  const KvShard* shard = nullptr;
  const float* q = nullptr;         // [g][d] raw queries
  const uint16_t* codes = nullptr;  // [g][L] query codes (null for full / topk / oracle)
  int g = 1;
  PartialAttention* out = nullptr;  // [g]
};

class AttentionRunner {
 public:
  // num_threads <= 0: all cores (tbb default).
  explicit AttentionRunner(int num_threads);

  // Runs estimator.AttendGroup on every item, in parallel; returns the first error (the other
  // items may or may not have run) or OK.
  absl::Status Run(const Estimator& estimator, std::span<const GroupWork> work, float scale);

  int num_threads() const { return arena_.max_concurrency(); }

  // Time the estimators' phases (EstimatorScratch::time_phases) from the next Run on.
  void set_time_phases(bool on) { time_phases_.store(on, std::memory_order_relaxed); }
  // Thread-seconds of MagicPIG's retrieval and kernel, and what they read (EstimatorScratch's
  // counts), summed over every worker since the last call, then zeroed. Not while a Run is in
  // flight.
  struct PhaseStats {
    double retrieve = 0;
    double kernel = 0;
    int64_t bucket_lines = 0;
    int64_t bucket_runs = 0;
    int64_t union_rows = 0;
    int64_t pending_bytes = 0;
  };
  PhaseStats TakePhaseStats();

 private:
  // The two-phase path's per-item state, per calling thread (Run may be called from several
  // threads at once), reused across calls.
  struct TwoPhaseState {
    std::vector<GroupSelection> selections;             // [items]
    std::vector<std::vector<PartialAttention>> second;  // [items][g] part 1's partials
    // [items] 0 while the item's selection runs, its part count + 1 once done, -1 if it failed.
    std::unique_ptr<std::atomic<int>[]> ready;
    // [items] parts not yet attended: the thread that attends the last one finishes the item.
    std::unique_ptr<std::atomic<int>[]> remaining;
    size_t ready_size = 0;
  };
  absl::Status RunTwoPhase(const Estimator& estimator, std::span<const GroupWork> work, float scale,
                           bool time_phases, TwoPhaseState& state);

  tbb::task_arena arena_;
  tbb::enumerable_thread_specific<TwoPhaseState> two_phase_;
  tbb::enumerable_thread_specific<EstimatorScratch> scratch_;
  std::atomic<bool> time_phases_{false};
};

}  // namespace magicpig::attention

#endif  // MAGICPIG_COMMON_ATTENTION_ATTENTION_RUNNER_H_
