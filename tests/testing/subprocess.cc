#include "tests/testing/subprocess.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace magicpig::testing {

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(
    const std::vector<std::string>& argv) {
  int pipe_fd[2];
  if (pipe(pipe_fd) != 0) return absl::InternalError("pipe failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fd[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, pipe_fd[0]);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0].c_str(), &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(pipe_fd[1]);
  if (rc != 0) {
    close(pipe_fd[0]);
    return absl::InternalError(absl::StrCat("cannot start ", argv[0], ": ", std::strerror(rc)));
  }
  return std::unique_ptr<Subprocess>(new Subprocess(pid, fdopen(pipe_fd[0], "r")));
}

Subprocess::~Subprocess() {
  if (!exited_) Stop(SIGKILL);
  if (out_ != nullptr) fclose(out_);
}

absl::StatusOr<std::string> Subprocess::WaitForLine(const std::string& needle) {
  char buf[4096];
  while (fgets(buf, sizeof(buf), out_) != nullptr) {
    std::string line(buf);
    if (line.find(needle) != std::string::npos) return line;
  }
  return absl::NotFoundError(absl::StrCat("the process ended before printing '", needle, "'"));
}

int Subprocess::Stop(int signal) {
  if (exited_) return 0;
  kill(pid_, signal);
  int status = 0;
  waitpid(pid_, &status, 0);
  exited_ = true;
  return status;
}

absl::StatusOr<std::pair<std::unique_ptr<Subprocess>, std::string>> StartAttentionNode(
    const std::string& binary, const std::vector<std::string>& extra_flags) {
  // Port 0 for the metrics port too: several nodes (and parallel tests) never collide on 9091.
  std::vector<std::string> argv = {binary, "--listen", "127.0.0.1:0", "--metrics-listen",
                                   "127.0.0.1:0"};
  argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
  auto proc = Subprocess::Start(argv);
  if (!proc.ok()) return proc.status();
  auto line = (*proc)->WaitForLine("listening on ");
  if (!line.ok()) return line.status();
  std::string address = line->substr(line->find("listening on ") + 13);
  while (!address.empty() && (address.back() == '\n' || address.back() == ' ')) address.pop_back();
  return std::make_pair(*std::move(proc), address);
}

}  // namespace magicpig::testing
