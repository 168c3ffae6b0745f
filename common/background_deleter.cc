#include "common/background_deleter.h"

namespace magicpig {

BackgroundDeleter::BackgroundDeleter() : thread_([this] { Loop(); }) {}

BackgroundDeleter::~BackgroundDeleter() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();  // Loop empties the queue before it returns
}

void BackgroundDeleter::Enqueue(absl::AnyInvocable<void() &&> drop) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(drop));
  ++added_;
}

void BackgroundDeleter::Drain() {
  struct Target {
    const BackgroundDeleter* deleter;
    int64_t count;
  };
  absl::MutexLock lock(&mu_);
  Target target{this, added_};
  mu_.Await(absl::Condition(
      +[](Target* t) ABSL_NO_THREAD_SAFETY_ANALYSIS { return t->deleter->destroyed_ >= t->count; },
      &target));
}

int64_t BackgroundDeleter::pending() const {
  absl::MutexLock lock(&mu_);
  return added_ - destroyed_;
}

void BackgroundDeleter::Loop() {
  for (;;) {
    absl::AnyInvocable<void() &&> drop;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](BackgroundDeleter* d)
               ABSL_NO_THREAD_SAFETY_ANALYSIS { return d->stop_ || !d->queue_.empty(); },
          this));
      if (queue_.empty()) return;  // stopped and nothing left
      drop = std::move(queue_.front());
      queue_.pop_front();
    }
    std::move(drop)();  // the destruction runs outside the lock
    absl::MutexLock lock(&mu_);
    ++destroyed_;
  }
}

}  // namespace magicpig
