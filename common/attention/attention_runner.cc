#include "common/attention/attention_runner.h"

#include <atomic>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"

namespace magicpig::attention {

AttentionRunner::AttentionRunner(int num_threads)
    : arena_(num_threads > 0 ? num_threads : tbb::task_arena::automatic) {}

absl::Status AttentionRunner::Run(const Estimator& estimator, std::span<const GroupWork> work,
                                  float scale) {
  std::mutex mu;
  absl::Status first_error;
  std::atomic<bool> failed{false};
  const bool time_phases = time_phases_.load(std::memory_order_relaxed);
  auto run_items = [&] {
    tbb::parallel_for(
        tbb::blocked_range<size_t>(0, work.size(), 1), [&](const tbb::blocked_range<size_t>& r) {
          EstimatorScratch& scratch = scratch_.local();
          scratch.time_phases = time_phases;
          for (size_t i = r.begin(); i < r.end(); ++i) {
            if (failed.load(std::memory_order_relaxed)) return;
            const GroupWork& w = work[i];
            absl::Status s =
                w.shard == nullptr
                    ? absl::InvalidArgumentError(absl::StrCat("work item ", i, " has no shard"))
                    : estimator.AttendGroup(*w.shard, w.q, w.codes, w.g, scale, &scratch, w.out);
            if (!s.ok()) {
              std::lock_guard<std::mutex> lock(mu);
              if (first_error.ok()) first_error = s;
              failed = true;
              return;
            }
          }
        });
  };
  if (tbb::this_task_arena::max_concurrency() == arena_.max_concurrency()) {
    // Already in an arena as wide as ours (the embedded decode step runs inside the CPU backend's
    // arena): stay in it. Entering our own arena would make its worker threads leave the
    // backend's and join ours at every sparse layer (~1.4 ms of an 8K SmolLM2 step on 2 threads,
    // docs/benchmarks.md). Isolated, so a waiting thread takes no unrelated outer task.
    tbb::this_task_arena::isolate(run_items);
  } else {
    arena_.execute(run_items);
  }
  return first_error;
}

AttentionRunner::PhaseStats AttentionRunner::TakePhaseStats() {
  PhaseStats sum;
  for (EstimatorScratch& scratch : scratch_) {
    sum.retrieve += scratch.retrieve_seconds;
    sum.kernel += scratch.kernel_seconds;
    sum.bucket_lines += scratch.bucket_lines;
    sum.bucket_runs += scratch.bucket_runs;
    sum.union_rows += scratch.union_rows;
    sum.pending_bytes += scratch.pending_bytes;
    scratch.retrieve_seconds = scratch.kernel_seconds = 0;
    scratch.bucket_lines = scratch.bucket_runs = scratch.union_rows = scratch.pending_bytes = 0;
  }
  return sum;
}

}  // namespace magicpig::attention
