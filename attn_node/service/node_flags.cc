#include "attn_node/service/node_flags.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "common/flags/flag_values.h"

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
  table.Custom("listen", "HOST:PORT", "the gRPC address to serve on (port 0 picks a free one)",
               f->listen, [f](absl::string_view text) -> absl::Status {
                 if (absl::Status s = flags::ParseHostPort(text).status(); !s.ok()) return s;
                 f->listen = std::string(text);
                 return absl::OkStatus();
               });
  table.Bytes("memory-budget", &f->memory_budget_bytes, "KV and LSH tables the node may admit");
  table.ShowDefault("memory-budget", "half the RAM");
  table.Number("threads", &f->threads, "attention and table-build threads; 0 = one per core", 0,
               4096);
  table.Number("shutdown-grace", &f->shutdown_grace_seconds,
               "seconds in-flight calls may run after SIGTERM", 0.0, 1e9, "SECONDS");
  table.Custom("metrics-listen", "HOST:PORT|off",
               "HTTP port for /metrics, /healthz and /readyz; off (or empty) disables it",
               f->metrics_listen, [f](absl::string_view text) -> absl::Status {
                 if (text.empty() || text == "off") {
                   f->metrics_listen.clear();
                   return absl::OkStatus();
                 }
                 if (absl::Status s = flags::ParseHostPort(text).status(); !s.ok()) return s;
                 f->metrics_listen = std::string(text);
                 return absl::OkStatus();
               });
  table.Choice("log-level", &f->log_level, "the least severe log lines written to stderr",
               {{"debug", "debug"},
                {"info", "info"},
                {"warning", "warning"},
                {"error", "error"},
                {"off", "off"}});
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
