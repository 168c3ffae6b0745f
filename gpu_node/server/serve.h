// The compute node's program: flags -> Engine + Scheduler + ApiServer, SIGTERM drain. Shared by
// the `magicpig_gpu_node` binary and `magicpig serve`, so their mains stay one line.
//
//   --listen HOST:PORT           HTTP API, probes and /metrics (default 0.0.0.0:8000; port 0:
//                                pick a free one; "listening on HOST:PORT" is printed)
//   --served-model-name NAME     the model id of the API (default: the GGUF file name stem)
//   --api-key KEY                require "Authorization: Bearer KEY" (or env MAGICPIG_API_KEY)
//   --max-batch N                sequences decoded together (default 8)
//   --max-queue N                requests waiting beyond the batch (default 64; more get 429)
//   --max-body BYTES             request body limit (default 8M)
//   --shutdown-grace SECONDS     how long in-flight requests may finish after SIGTERM (30)
//   --allow-attention-override   accept the per-request "attention" field (evaluation)
//   and the engine flags (engine_flags.h).
//
// Thread-safety: call once from main.
#ifndef MAGICPIG_GPU_NODE_SERVER_SERVE_H_
#define MAGICPIG_GPU_NODE_SERVER_SERVE_H_

#include <string>
#include <vector>

namespace magicpig::server {

// args exclude the program name. Returns the process exit code (0 after a clean drain, 2 for bad
// flags, 1 for a failure to start).
int ServeMain(const std::vector<std::string>& args);

}  // namespace magicpig::server

#endif  // MAGICPIG_GPU_NODE_SERVER_SERVE_H_
