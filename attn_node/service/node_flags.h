// The attention node's command-line flags (magicpig_attn_node), declared once in a
// flags::FlagTable: --help and docs/flags.md are generated from DeclareNodeFlags. Parsed into
// NodeFlags so main() stays thin and the parsing is testable.
//
// Thread-safety: pure functions.
#ifndef MAGICPIG_ATTN_NODE_SERVICE_NODE_FLAGS_H_
#define MAGICPIG_ATTN_NODE_SERVICE_NODE_FLAGS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/fabric/transport_security.h"
#include "common/flags/flag_table.h"
#include "common/logging/logger.h"

namespace magicpig {

struct NodeFlags {
  std::string listen = "0.0.0.0:50051";  // port 0: pick a free port
  int64_t memory_budget_bytes = 0;       // DefaultMemoryBudget() unless given
  int threads = 0;                       // 0: one per core
  double shutdown_grace_seconds = 10.0;
  double sequence_ttl_seconds = 600.0;          // 0: sequences never expire
  std::string metrics_listen = "0.0.0.0:9091";  // empty: no metrics / probe port
  fabric::TransportSecurity security;           // neither mode chosen: Start refuses
  int max_upload_streams = 256;                 // per owner
  double upload_deadline_seconds = 300.0;
  logging::LogLevel log_level = logging::LogLevel::kInfo;
  bool health = false;
  bool help = false;
};

// Half of the physical memory (or 1 GiB where it cannot be read).
int64_t DefaultMemoryBudget();

// The node's flag table, writing into `*flags` (whose current values are the defaults).
std::unique_ptr<flags::FlagTable> NodeFlagTable(NodeFlags* flags);

// args excludes argv[0]. INVALID_ARGUMENT naming the flag for unknown flags, missing or bad values;
// MAGICPIG_* environment variables set the flags that are absent. `help` is set by --help.
absl::StatusOr<NodeFlags> ParseNodeFlags(const std::vector<std::string>& args);

// The usage text for --help.
std::string NodeUsage();

}  // namespace magicpig

#endif  // MAGICPIG_ATTN_NODE_SERVICE_NODE_FLAGS_H_
