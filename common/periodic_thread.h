// PeriodicThread: a thread of its own that runs `tick` every `period` until stopped (the attention
// node's lease reaper, the compute node's deferred releases).
//
// Thread-safety: Stop may be called from any thread, once or many times; the destructor stops.
// `tick` runs on the periodic thread only, never concurrently with itself.
#ifndef MAGICPIG_COMMON_PERIODIC_THREAD_H_
#define MAGICPIG_COMMON_PERIODIC_THREAD_H_

#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace magicpig {

class PeriodicThread {
 public:
  // The first tick runs one period after construction.
  PeriodicThread(absl::Duration period, std::function<void()> tick);
  ~PeriodicThread();
  PeriodicThread(const PeriodicThread&) = delete;
  PeriodicThread& operator=(const PeriodicThread&) = delete;

  // Wakes the thread, waits for a tick in progress and joins: no tick runs after it returns.
  void Stop();

 private:
  void Loop();

  const absl::Duration period_;
  const std::function<void()> tick_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts once the members it reads exist
};

}  // namespace magicpig

#endif  // MAGICPIG_COMMON_PERIODIC_THREAD_H_
