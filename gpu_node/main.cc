// magicpig_gpu_node: the compute node — the OpenAI-compatible HTTP API over the engine (see
// gpu_node/server/serve.h for the flags).
#include <string>
#include <vector>

#include "common/process_runtime.h"
#include "gpu_node/server/serve.h"

int main(int argc, char** argv) {
  magicpig::ConfigureProcessRuntime();
  return magicpig::server::ServeMain(std::vector<std::string>(argv + 1, argv + argc));
}
