// `magicpig run`: embedded generation with one command — load the model, prefill the prompt,
// stream the completion to stdout, then a one-line summary (prompt tokens, prefill and decode
// tokens/s) on stderr. Long prefills show per-layer progress on stderr.
#ifndef MAGICPIG_TOOLS_RUN_COMMAND_H_
#define MAGICPIG_TOOLS_RUN_COMMAND_H_

#include <memory>
#include <string>
#include <vector>

#include "common/flags/flag_table.h"
#include "gpu_node/engine/engine.h"

namespace magicpig::tools {

struct RunFlags {
  engine::EngineOptions engine;
  std::string prompt;
  std::string prompt_file;
  bool chat = false;
  std::string system;
  int64_t max_tokens = 128;
  engine::SamplingParams sampling;
  std::vector<std::string> stop;
  bool ignore_eos = false;
};

// The command's flag table (the engine's flags and the generation flags), writing into `*flags`.
std::unique_ptr<flags::FlagTable> RunFlagTable(RunFlags* flags);

// Returns the process exit code (0 on success, 2 on usage errors, 1 on failures).
int RunCommand(const std::vector<std::string>& args);

}  // namespace magicpig::tools

#endif  // MAGICPIG_TOOLS_RUN_COMMAND_H_
