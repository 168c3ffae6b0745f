#include "attn_node/service/node_flags.h"

#include <unistd.h>

#include <cctype>
#include <cmath>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace magicpig {

int64_t DefaultMemoryBudget() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return int64_t{1} << 30;
  return static_cast<int64_t>(pages) * page / 2;
}

std::string NodeUsage() {
  return "usage: magicpig_attn_node [--listen HOST:PORT] [--memory-budget BYTES[K|M|G|T]]\n"
         "                          [--threads N] [--shutdown-grace SECONDS]\n"
         "                          [--metrics-listen HOST:PORT|off] [--health]\n"
         "  --listen          address to serve on (default 0.0.0.0:50051; port 0 picks one)\n"
         "  --memory-budget   KV + LSH tables the node may admit (default: half the RAM)\n"
         "  --threads         attention / table-build threads (default: one per core)\n"
         "  --shutdown-grace  seconds in-flight calls may run after SIGTERM (default 10)\n"
         "  --metrics-listen  HTTP port for /metrics, /healthz, /readyz (default 0.0.0.0:9091;\n"
         "                    'off' or '' disables it)\n"
         "  --health          probe the node at --listen; exit 0 iff it is SERVING\n";
}

absl::StatusOr<NodeFlags> ParseNodeFlags(const std::vector<std::string>& args) {
  NodeFlags flags;
  bool budget_given = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    std::string name = arg.substr(2);
    std::string value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
      has_value = true;
    }
    if (name == "health" || name == "help") {
      if (has_value) return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
      (name == "health" ? flags.health : flags.help) = true;
      continue;
    }
    if (name != "listen" && name != "memory-budget" && name != "threads" &&
        name != "shutdown-grace" && name != "metrics-listen") {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
    if (!has_value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      }
      value = args[++i];
    }
    if (name == "listen") {
      if (value.find(':') == std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat("--listen: expected HOST:PORT, got '", value, "'"));
      }
      flags.listen = value;
    } else if (name == "metrics-listen") {
      if (value.empty() || value == "off") {
        flags.metrics_listen.clear();
        continue;
      }
      if (!ParseHostPort(value).ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--metrics-listen: expected HOST:PORT or 'off', got '", value, "'"));
      }
      flags.metrics_listen = value;
    } else if (name == "memory-budget") {
      absl::StatusOr<int64_t> bytes = ParseByteSize(value);
      if (!bytes.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--memory-budget: ", bytes.status().message()));
      }
      flags.memory_budget_bytes = *bytes;
      budget_given = true;
    } else if (name == "threads") {
      if (!absl::SimpleAtoi(value, &flags.threads) || flags.threads < 0 || flags.threads > 4096) {
        return absl::InvalidArgumentError(
            absl::StrCat("--threads: expected an integer in [0, 4096], got '", value, "'"));
      }
    } else {
      if (!absl::SimpleAtod(value, &flags.shutdown_grace_seconds) ||
          !std::isfinite(flags.shutdown_grace_seconds) || flags.shutdown_grace_seconds < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("--shutdown-grace: expected seconds >= 0, got '", value, "'"));
      }
    }
  }
  if (!budget_given) flags.memory_budget_bytes = DefaultMemoryBudget();
  return flags;
}

}  // namespace magicpig
