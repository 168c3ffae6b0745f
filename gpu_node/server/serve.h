// The compute node's program: flags -> Engine + Scheduler + ApiServer, SIGTERM drain. Shared by
// the `magicpig_gpu_node` binary and `magicpig serve`, so their mains stay one line. The flags
// (ServeFlagTable: the server's and the engine's) are listed by --help and in docs/flags.md.
// "listening on HOST:PORT" is printed on stdout once the port is bound.
//
// Thread-safety: call once from main.
#ifndef MAGICPIG_GPU_NODE_SERVER_SERVE_H_
#define MAGICPIG_GPU_NODE_SERVER_SERVE_H_

#include <memory>
#include <string>
#include <vector>

#include "common/flags/flag_table.h"
#include "common/logging/logger.h"
#include "gpu_node/engine/engine.h"

namespace magicpig::server {

struct ServeFlags {
  engine::EngineOptions engine;
  std::string listen = "0.0.0.0:8000";
  std::string metrics_listen;     // empty: /metrics on the API port
  std::string served_model_name;  // empty: the GGUF file name stem
  std::string api_key;
  int max_batch = 8;
  int max_queue = 64;
  int64_t max_body_bytes = int64_t{8} << 20;
  int max_connections_per_client = 64;  // of the 256 connection slots; 0: no per-client limit
  double shutdown_grace_seconds = 30;
  bool allow_attention_override = false;
  logging::LogLevel log_level = logging::LogLevel::kInfo;
};

// The server's flag table, writing into `*flags` (whose current values are the defaults).
std::unique_ptr<flags::FlagTable> ServeFlagTable(ServeFlags* flags);

// args exclude the program name. Returns the process exit code (0 after a clean drain, 2 for bad
// flags, 1 for a failure to start).
int ServeMain(const std::vector<std::string>& args);

}  // namespace magicpig::server

#endif  // MAGICPIG_GPU_NODE_SERVER_SERVE_H_
