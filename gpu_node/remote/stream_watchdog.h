// StreamWatchdog: bounds a blocking read on gRPC streams. Arm it with a deadline and the
// streams' contexts before a blocking Read; if the deadline passes before Disarm, it cancels the
// contexts (ClientContext::TryCancel), so the Read returns false and the caller reports the
// node as not answering instead of waiting forever on a hung or stopped peer.
//
// Cost: an Arm wakes the watchdog's thread only when it sleeps with nothing armed (or until a
// later deadline than the new one); otherwise the thread finds the new deadline when its timed
// sleep ends. A stream read every fraction of a millisecond (an Attend per layer) then costs no
// thread wake-up per read, only one per timeout period.
//
// Thread-safety: Arm and Disarm from one caller thread at a time; the watchdog's own thread
// (started at the first Arm) touches only the armed contexts, through the thread-safe TryCancel.
#ifndef MAGICPIG_GPU_NODE_REMOTE_STREAM_WATCHDOG_H_
#define MAGICPIG_GPU_NODE_REMOTE_STREAM_WATCHDOG_H_

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "grpcpp/client_context.h"

namespace magicpig::remote {

class StreamWatchdog {
 public:
  StreamWatchdog() = default;
  ~StreamWatchdog();
  StreamWatchdog(const StreamWatchdog&) = delete;
  StreamWatchdog& operator=(const StreamWatchdog&) = delete;

  // The contexts must stay alive until Disarm.
  void Arm(std::chrono::steady_clock::time_point deadline,
           std::vector<grpc::ClientContext*> contexts);
  // Returns true when the deadline passed before Disarm (the contexts were cancelled).
  bool Disarm();

 private:
  void Run();
  std::mutex mu_;
  std::condition_variable cv_;
  bool armed_ = false, fired_ = false, stop_ = false;
  std::chrono::steady_clock::time_point deadline_;
  // The thread's current sleep: until `sleeping_until_` when `timed_sleep_`, else until notified.
  bool timed_sleep_ = false;
  std::chrono::steady_clock::time_point sleeping_until_;
  std::vector<grpc::ClientContext*> contexts_;
  std::thread thread_;  // started at the first Arm
};

}  // namespace magicpig::remote

#endif  // MAGICPIG_GPU_NODE_REMOTE_STREAM_WATCHDOG_H_
