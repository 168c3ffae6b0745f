// A child process for integration tests: started with posix_spawn, its stdout read line by line
// (e.g. to learn the port a server bound), stopped with a signal; killed with SIGKILL if still
// running at destruction.
//
// Thread-safety: one owner.
#ifndef MAGICPIG_TESTS_TESTING_SUBPROCESS_H_
#define MAGICPIG_TESTS_TESTING_SUBPROCESS_H_

#include <sys/types.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace magicpig::testing {

class Subprocess {
 public:
  // argv[0] is the executable path.
  static absl::StatusOr<std::unique_ptr<Subprocess>> Start(const std::vector<std::string>& argv);
  ~Subprocess();

  // Reads stdout lines until one contains `needle` (returned), or EOF (NOT_FOUND).
  absl::StatusOr<std::string> WaitForLine(const std::string& needle);
  // Sends `signal` and waits for the exit; returns the wait status.
  int Stop(int signal);
  pid_t pid() const { return pid_; }

 private:
  Subprocess(pid_t pid, FILE* out) : pid_(pid), out_(out) {}
  pid_t pid_;
  FILE* out_;
  bool exited_ = false;
};

// Starts a magicpig_attn_node on 127.0.0.1:0 (its metrics port on 127.0.0.1:0 too) with the given
// extra flags and returns it with the "host:port" it listens on (parsed from its "listening on
// HOST:PORT" line).
absl::StatusOr<std::pair<std::unique_ptr<Subprocess>, std::string>> StartAttentionNode(
    const std::string& binary, const std::vector<std::string>& extra_flags);

}  // namespace magicpig::testing

#endif  // MAGICPIG_TESTS_TESTING_SUBPROCESS_H_
