// Command-line flags of the attention node (magicpig_attn_node), parsed into NodeFlags so main()
// stays thin and the parsing is testable.
//
//   --listen HOST:PORT       default 0.0.0.0:50051 (port 0: pick a free port)
//   --memory-budget BYTES    KV + tables the node may admit; suffixes K, M, G, T (powers of 1024);
//                            default: half of the physical memory
//   --threads N              attention / table-build threads; default 0 = one per core
//   --shutdown-grace SECONDS how long in-flight calls may run after SIGTERM; default 10
//   --metrics-listen HOST:PORT  HTTP /metrics, /healthz, /readyz; default 0.0.0.0:9091; "" or
//                            "off": none
//   --health                 probe mode: ask the node at --listen for its gRPC health status,
//                            print it, exit 0 iff SERVING (for exec probes and scripts)
//   --help
// Both "--name value" and "--name=value" are accepted.
//
// Thread-safety: pure functions.
#ifndef MAGICPIG_ATTN_NODE_SERVICE_NODE_FLAGS_H_
#define MAGICPIG_ATTN_NODE_SERVICE_NODE_FLAGS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cli_args.h"  // ParseByteSize

namespace magicpig {

struct NodeFlags {
  std::string listen = "0.0.0.0:50051";
  int64_t memory_budget_bytes = 0;  // filled with DefaultMemoryBudget() unless given
  int threads = 0;
  double shutdown_grace_seconds = 10.0;
  std::string metrics_listen = "0.0.0.0:9091";  // empty: no metrics / probe port
  bool health = false;
  bool help = false;
};

// Half of the physical memory (or 1 GiB where it cannot be read).
int64_t DefaultMemoryBudget();

// args excludes argv[0]. INVALID_ARGUMENT naming the flag for unknown flags, missing or bad values.
absl::StatusOr<NodeFlags> ParseNodeFlags(const std::vector<std::string>& args);

// The usage text for --help.
std::string NodeUsage();

}  // namespace magicpig

#endif  // MAGICPIG_ATTN_NODE_SERVICE_NODE_FLAGS_H_
