// BackgroundDeleter: destroys objects on a thread of its own, so that giving back a large
// allocation does not stall the caller. A finished sequence's KV cache and LSH tables are hundreds
// of MB whose pages the kernel unmaps at ~16 GB/s (6 ms for SmolLM2's cache at 4K tokens, 16 ms
// with MagicPIG's shards, measured in docs/benchmarks.md); freed inline, that time is added to the
// decode step of every other sequence in the batch.
//
//   BackgroundDeleter deleter;
//   deleter.Add(std::move(big));  // returns at once; `big` is destroyed on the deleter's thread
//   deleter.Drain();              // everything added before this call is destroyed
//
// Objects are destroyed in the order they were added, one at a time. An object handed over must
// not be referenced by anything that outlives its destruction on the other thread, and its
// destructor must be safe to run on any thread.
//
// Thread-safety: Add and Drain may be called from any thread. The destructor drains, then joins.
#ifndef MAGICPIG_COMMON_BACKGROUND_DELETER_H_
#define MAGICPIG_COMMON_BACKGROUND_DELETER_H_

#include <cstdint>
#include <deque>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace magicpig {

class BackgroundDeleter {
 public:
  BackgroundDeleter();
  ~BackgroundDeleter();
  BackgroundDeleter(const BackgroundDeleter&) = delete;
  BackgroundDeleter& operator=(const BackgroundDeleter&) = delete;

  // Takes ownership of `object` (any movable owner: unique_ptr, a tuple of them, a vector) and
  // destroys it on the deleter's thread.
  template <class T>
  void Add(T object) {
    Enqueue([held = std::move(object)]() mutable { T dropped = std::move(held); });
  }

  // Returns once every object added before the call has been destroyed.
  void Drain();

  // Objects handed over and not yet destroyed (for tests and metrics).
  int64_t pending() const;

 private:
  void Enqueue(absl::AnyInvocable<void() &&> drop);
  void Loop();

  mutable absl::Mutex mu_;
  std::deque<absl::AnyInvocable<void() &&>> queue_ ABSL_GUARDED_BY(mu_);
  int64_t added_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t destroyed_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts once the members it reads exist
};

}  // namespace magicpig

#endif  // MAGICPIG_COMMON_BACKGROUND_DELETER_H_
