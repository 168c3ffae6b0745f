#include "gpu_node/remote/stream_watchdog.h"

#include <utility>

namespace magicpig::remote {

StreamWatchdog::~StreamWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void StreamWatchdog::Arm(std::chrono::steady_clock::time_point deadline,
                         std::vector<grpc::ClientContext*> contexts) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = true;
    fired_ = false;
    deadline_ = deadline;
    contexts_ = std::move(contexts);
    if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
    // A thread asleep until an earlier (or the same) deadline re-checks then and finds this one.
    wake = !timed_sleep_ || deadline < sleeping_until_;
  }
  if (wake) cv_.notify_all();
}

bool StreamWatchdog::Disarm() {
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = false;
  contexts_.clear();
  return fired_;
}

void StreamWatchdog::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (!armed_) {
      cv_.wait(lock);
      continue;
    }
    timed_sleep_ = true;
    sleeping_until_ = deadline_;
    cv_.wait_until(lock, sleeping_until_);
    timed_sleep_ = false;
    // Disarmed, re-armed with a later deadline, or woken early: loop and look again.
    if (armed_ && std::chrono::steady_clock::now() >= deadline_) {
      // TryCancel is thread-safe; the blocked Read returns false and the caller reports it.
      for (grpc::ClientContext* c : contexts_) c->TryCancel();
      fired_ = true;
      armed_ = false;
    }
  }
}

}  // namespace magicpig::remote
