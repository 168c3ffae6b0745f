#include "common/periodic_thread.h"

#include <utility>

namespace magicpig {

PeriodicThread::PeriodicThread(absl::Duration period, std::function<void()> tick)
    : period_(period), tick_(std::move(tick)), thread_([this] { Loop(); }) {}

PeriodicThread::~PeriodicThread() { Stop(); }

void PeriodicThread::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void PeriodicThread::Loop() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stop_), period_);
      if (stop_) return;
    }
    tick_();  // without the lock: Stop waits for it through join
  }
}

}  // namespace magicpig
