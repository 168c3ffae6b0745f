// MicroBatchTuner: decides, step by step, whether a batched decode step with attention nodes runs
// as one batch or as two micro-batches (ping-pong), from the measured wall time of the steps.
//
// Why measured: ping-pong hides one micro-batch's remote attention behind the other's dense work,
// at the price of a second pass over the weights and twice the Attend messages per layer. It pays
// when the attention nodes compute on other cores than the compute node (separate hosts, the
// deployment it is for) and when attention is a large part of the step; when the nodes share the
// compute node's cores, or the context is short, one batch is faster (docs/benchmarks.md, issue
// #4). Which holds depends on the hardware, the nodes, the batch and the context depth, so the
// engine tries both and keeps the faster (`--ping-pong auto`, the default).
//
// Policy, per batch size (steps of different sizes do not compare): one choice is current
// (ping-pong at first). A probe runs the other choice for one step and compares its time with the
// step just before it, which ran the current choice: adjacent steps see the same machine load and
// nearly the same context, where steps far apart on a shared host do not. The first probes
// alternate with current steps until kRatios comparisons exist; after that every kProbeEvery-th
// step is a probe. When the median of the last kRatios comparisons says the other choice was
// faster, it becomes the current one. A probe costs at most one step in kProbeEvery run the slower
// way; a median of comparisons, not one, so that a step slowed by an upload or a preemption does
// not decide.
//
// Thread-safety: not thread-safe; the engine calls it under its step lock.
#ifndef MAGICPIG_GPU_NODE_REMOTE_MICRO_BATCH_TUNER_H_
#define MAGICPIG_GPU_NODE_REMOTE_MICRO_BATCH_TUNER_H_

#include <cstdint>
#include <deque>
#include <map>

namespace magicpig::remote {

class MicroBatchTuner {
 public:
  static constexpr int kRatios = 3;
  static constexpr int kProbeEvery = 8;

  // Micro-batches (1 or 2) for the next step of a batch of `batch_size` sequences (>= 2).
  int Choose(int64_t batch_size);
  // The wall time of a step of `batch_size` sequences that ran as `micro_batches` (1 or 2).
  void Report(int64_t batch_size, int micro_batches, double seconds);

 private:
  struct PerSize {
    int current = 2;          // micro-batches of the current choice
    double last_current = 0;  // seconds of the last step that ran it (0: none yet)
    bool last_was_probe = false;
    int64_t steps = 0;          // steps chosen since the comparisons were complete
    std::deque<double> ratios;  // probe seconds / seconds of the current step before it
  };
  std::map<int64_t, PerSize> sizes_;
};

}  // namespace magicpig::remote

#endif  // MAGICPIG_GPU_NODE_REMOTE_MICRO_BATCH_TUNER_H_
