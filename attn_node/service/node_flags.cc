#include "attn_node/service/node_flags.h"

#include <unistd.h>

namespace magicpig {

int64_t DefaultMemoryBudget() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return int64_t{1} << 30;
  return static_cast<int64_t>(pages) * page / 2;
}

std::unique_ptr<flags::FlagTable> NodeFlagTable(NodeFlags* f) {
  auto owned = std::make_unique<flags::FlagTable>(
      "magicpig_attn_node",
      "The attention node: holds KV shards and LSH tables in host memory and answers Attend.");
  flags::FlagTable& table = *owned;
  table.Address("listen", &f->listen, "the gRPC address to serve on (port 0 picks a free one)");
  table.Bytes("memory-budget", &f->memory_budget_bytes, "KV and LSH tables the node may admit");
  table.ShowDefault("memory-budget", "half the RAM");
  table.Number("threads", &f->threads, "attention and table-build threads; 0 = one per core", 0,
               4096);
  table.Number("sequence-ttl", &f->sequence_ttl_seconds,
               "a sequence that no call (AppendKV, Attend) names for this long is released: its "
               "compute node is gone or moved on; 0 = never. Longer than the longest pause of a "
               "live sequence (a long prefill of another request)",
               0.0, 1e9, "SECONDS");
  table.Number("max-upload-streams", &f->max_upload_streams,
               "AppendKV streams one caller (owner) may have open at once; more are refused with "
               "RESOURCE_EXHAUSTED",
               1, 1 << 20);
  table.Number("upload-deadline", &f->upload_deadline_seconds,
               "an AppendKV stream still open after this long is cancelled (nothing committed)",
               1.0, 1e6, "SECONDS");
  table.Number("shutdown-grace", &f->shutdown_grace_seconds,
               "seconds in-flight calls may run after SIGTERM", 0.0, 1e9, "SECONDS");
  table.Address("metrics-listen", &f->metrics_listen,
                "HTTP port for /metrics, /healthz and /readyz; off (or empty) disables it",
                /*off_allowed=*/true);
  table.Choice("log-level", &f->log_level, "the least severe log lines written to stderr",
               logging::LogLevelChoices());
  fabric::DeclareTransportSecurityFlags(table, &f->security, /*client=*/false);
  table.Section("probe");
  table.Switch("health", &f->health,
               "probe mode: ask the node at --listen for its gRPC health status, print it and "
               "exit 0 iff SERVING (for exec probes and scripts)");
  return owned;
}

absl::StatusOr<NodeFlags> ParseNodeFlags(const std::vector<std::string>& args) {
  NodeFlags f;
  f.memory_budget_bytes = DefaultMemoryBudget();
  std::unique_ptr<flags::FlagTable> table = NodeFlagTable(&f);
  if (absl::Status s = table->Parse(args); !s.ok()) return s;
  f.help = table->help_requested();
  return f;
}

std::string NodeUsage() {
  NodeFlags f;
  return NodeFlagTable(&f)->Help();
}

}  // namespace magicpig
