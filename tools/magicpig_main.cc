// The `magicpig` command: dispatches to its subcommands.
#include <iostream>
#include <string>
#include <vector>

#include "common/process_runtime.h"
#include "eval/evaluators.h"
#include "gpu_node/server/serve.h"
#include "tools/bench_command.h"
#include "tools/run_command.h"

int main(int argc, char** argv) {
  magicpig::ConfigureProcessRuntime();
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "help" || args[0] == "--help") {
    std::cout << "usage: magicpig <command> [flags]\n"
                 "commands:\n"
                 "  run    generate text with the embedded engine (magicpig run --help)\n"
                 "  serve  the OpenAI-compatible HTTP server (same as magicpig_gpu_node)\n"
                 "  bench  prefill/decode throughput at several context depths\n"
                 "  eval   accuracy evaluation: ruler, ppl, attn-error (magicpig eval --help)\n";
    return args.empty() ? 2 : 0;
  }
  const std::string command = args[0];
  args.erase(args.begin());
  if (command == "run") return magicpig::tools::RunCommand(args);
  if (command == "serve") return magicpig::server::ServeMain(args);
  if (command == "bench") return magicpig::tools::BenchCommand(args);
  if (command == "eval") return magicpig::eval::EvalCommand(args);
  std::cerr << "magicpig: unknown command '" << command << "'\n";
  return 2;
}
