// `magicpig run`: embedded generation with one command — load the model, prefill the prompt,
// stream the completion to stdout, then a one-line summary (prompt tokens, prefill and decode
// tokens/s) on stderr. Long prefills show per-layer progress on stderr.
#ifndef MAGICPIG_TOOLS_RUN_COMMAND_H_
#define MAGICPIG_TOOLS_RUN_COMMAND_H_

#include <string>
#include <vector>

namespace magicpig::tools {

// Returns the process exit code (0 on success, 2 on usage errors, 1 on failures).
int RunCommand(const std::vector<std::string>& args);

}  // namespace magicpig::tools

#endif  // MAGICPIG_TOOLS_RUN_COMMAND_H_
