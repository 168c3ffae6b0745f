#include "common/attention/attention_runner.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/attention/group_kernel_runner.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"

namespace magicpig::attention {

AttentionRunner::AttentionRunner(int num_threads)
    : arena_(num_threads > 0 ? num_threads : tbb::task_arena::automatic) {}

namespace {

// Whether the two-phase path takes every item (it checks what AttendGroup would; an item it does
// not take goes through AttendGroup, which reports the error).
bool TwoPhaseTakes(const Estimator& estimator, std::span<const GroupWork> work) {
  if (!estimator.two_phase()) return false;
  EstimatorScratch probe;
  for (const GroupWork& w : work) {
    if (w.shard == nullptr || w.g > kMaxSelectionHeads ||
        !internal::CheckGroup(*w.shard, w.q, w.g, &probe, w.out, "AttentionRunner").ok()) {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::Status AttentionRunner::RunTwoPhase(const Estimator& estimator,
                                          std::span<const GroupWork> work, float scale,
                                          bool time_phases, TwoPhaseState& state) {
  const size_t n = work.size();
  if (state.selections.size() < n) state.selections.resize(n);
  if (state.second.size() < n) state.second.resize(n);
  if (state.ready_size < n) {
    state.ready = std::make_unique<std::atomic<int>[]>(n);
    state.remaining = std::make_unique<std::atomic<int>[]>(n);
    state.ready_size = n;
  }
  for (size_t i = 0; i < n; ++i) {
    state.second[i].resize(static_cast<size_t>(work[i].g));
    state.ready[i].store(0, std::memory_order_relaxed);
  }
  std::mutex mu;
  absl::Status first_error;
  std::atomic<bool> failed{false};
  std::atomic<size_t> next_select{0}, next_part{0};
  const int workers =
      static_cast<int>(std::min<size_t>(tbb::this_task_arena::max_concurrency(), 2 * n));
  tbb::parallel_for(tbb::blocked_range<int>(0, workers, 1), [&](const tbb::blocked_range<int>& r) {
    EstimatorScratch& scratch = scratch_.local();
    scratch.time_phases = time_phases;
    for (int worker = r.begin(); worker < r.end(); ++worker) {
      for (;;) {
        if (failed.load(std::memory_order_relaxed)) return;
        // Selections first, in item order.
        if (const size_t i = next_select.fetch_add(1, std::memory_order_relaxed); i < n) {
          const GroupWork& w = work[i];
          const absl::Status s =
              estimator.SelectGroup(*w.shard, w.codes, w.g, &scratch, &state.selections[i]);
          if (!s.ok()) {
            {
              std::lock_guard<std::mutex> lock(mu);
              if (first_error.ok()) first_error = s;
            }
            failed = true;
            state.ready[i].store(-1, std::memory_order_release);
            return;
          }
          state.remaining[i].store(state.selections[i].parts, std::memory_order_relaxed);
          state.ready[i].store(state.selections[i].parts + 1, std::memory_order_release);
          continue;
        }
        // Then the parts, two slots per item. A part's selection was claimed before it, so it is
        // running on another thread and finishes without waiting for anything: the wait is short.
        const size_t k = next_part.fetch_add(1, std::memory_order_relaxed);
        if (k >= 2 * n) break;
        const size_t item = k / 2;
        const int part = static_cast<int>(k % 2);
        int ready;
        while ((ready = state.ready[item].load(std::memory_order_acquire)) == 0) {
          std::this_thread::yield();
        }
        if (ready < 0 || part >= ready - 1) continue;
        const GroupWork& w = work[item];
        estimator.AttendPart(*w.shard, w.q, w.g, scale, state.selections[item], part, &scratch,
                             part == 0 ? w.out : state.second[item].data());
        // The last part of the item merges the parts (acq_rel: the other part's partials, written
        // by another thread, are visible here).
        if (state.remaining[item].fetch_sub(1, std::memory_order_acq_rel) == 1) {
          PartialAttention* second = state.second[item].data();
          FinishGroup(state.selections[item], w.g, w.out, &second);
        }
      }
    }
  });
  return first_error;
}

absl::Status AttentionRunner::Run(const Estimator& estimator, std::span<const GroupWork> work,
                                  float scale) {
  const bool time_phases = time_phases_.load(std::memory_order_relaxed);
  if (TwoPhaseTakes(estimator, work)) {
    TwoPhaseState& state = two_phase_.local();  // the calling thread's
    absl::Status status;
    auto run = [&] { status = RunTwoPhase(estimator, work, scale, time_phases, state); };
    if (tbb::this_task_arena::max_concurrency() == arena_.max_concurrency()) {
      tbb::this_task_arena::isolate(run);
    } else {
      arena_.execute(run);
    }
    return status;
  }
  std::mutex mu;
  absl::Status first_error;
  std::atomic<bool> failed{false};
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
    // docs/sparse-decode.md). Isolated, so a waiting thread takes no unrelated outer task.
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
