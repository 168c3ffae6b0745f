#include "gpu_node/engine/stream_watchdog.h"

#include <utility>

namespace magicpig::engine {

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
  {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = true;
    fired_ = false;
    deadline_ = deadline;
    contexts_ = std::move(contexts);
    if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
  }
  cv_.notify_all();
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
    if (cv_.wait_until(lock, deadline_) == std::cv_status::timeout && armed_ &&
        std::chrono::steady_clock::now() >= deadline_) {
      // TryCancel is thread-safe; the blocked Read returns false and the caller reports it.
      for (grpc::ClientContext* c : contexts_) c->TryCancel();
      fired_ = true;
      armed_ = false;
    }
  }
}

}  // namespace magicpig::engine
