#include "gpu_node/engine/engine_flags.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/attention/estimator_registry.h"
#include "common/status_macros.h"

namespace magicpig::engine {

using ::magicpig::remote::Placement;

std::set<std::string> EngineValueFlags() {
  return {"model",           "threads",           "ctx",      "attention",       "lsh-k",
          "lsh-l",           "lsh-seed",          "budget",   "attention-nodes", "ping-pong",
          "coalesce-attend", "attend-timeout-ms", "placement"};
}

std::string EngineFlagsUsage() {
  // The attention lines come from the estimator registry and the parameters' declarations.
  std::string usage = absl::StrCat(
      "  --model FILE.gguf      the model (required)\n"
      "  --threads N            CPU threads (default: all cores)\n"
      "  --ctx N                context length (default: the model's)\n",
      "  --attention MODE       decode attention, one of: ", attention::EstimatorNames(),
      " (default ", std::string(attention::EstimatorName(attention::EstimatorKind::kMagicPig)),
      ")\n");
  for (const attention::ParamSpec* p :
       {&attention::kLshK, &attention::kLshL, &attention::kLshSeed, &attention::kBudget}) {
    absl::StrAppend(&usage,
                    absl::StrFormat("  --%-20s %s [%d, %d] (default %d)\n",
                                    absl::StrCat(std::string(p->flag), " N"), std::string(p->help),
                                    p->min, p->max, p->default_value));
  }
  return usage +
         "  --attention-nodes A    comma-separated attention nodes host:port (default: in "
         "process)\n"
         "  --ping-pong on|off|auto  with attention nodes, decode a batch as two micro-batches "
         "whose\n"
         "                         remote attention overlaps the other's dense work (on), as one\n"
         "                         batch (off), or as whichever of the two recent steps ran "
         "faster\n"
         "                         (auto, default)\n"
         "  --coalesce-attend on|off  with attention nodes, send a micro-batch's queries to a "
         "node as\n"
         "                         one message instead of one per sequence (default on)\n"
         "  --attend-timeout-ms N  an attention node that does not answer a step within N ms "
         "counts\n"
         "                         as failed and its sequences are placed again (default 10000)\n"
         "  --placement pack|spread  with attention nodes, put a sequence's blocks all on the "
         "node\n"
         "                         with the most free memory when it admits them (pack, "
         "default),\n"
         "                         or over every node in proportion to its free memory "
         "(spread)\n";
}

absl::StatusOr<EngineOptions> EngineOptionsFromArgs(const CliArgs& a) {
  if (!a.Has("model")) return absl::InvalidArgumentError("--model is required");
  EngineOptions options;
  options.model_path = a.Get("model");
  auto threads = a.GetInt("threads", 0);
  auto ctx = a.GetInt("ctx", 0);
  auto lsh_k = a.GetInt("lsh-k", attention::kLshK.default_value);
  auto lsh_l = a.GetInt("lsh-l", attention::kLshL.default_value);
  auto lsh_seed = a.GetInt("lsh-seed", attention::kLshSeed.default_value);
  auto budget = a.GetInt("budget", attention::kBudget.default_value);
  auto attend_timeout = a.GetInt("attend-timeout-ms", 10000);
  for (const absl::Status& s : {threads.status(), ctx.status(), lsh_k.status(), lsh_l.status(),
                                lsh_seed.status(), budget.status(), attend_timeout.status()}) {
    if (!s.ok()) return s;
  }
  auto mode = attention::ParseEstimator(
      a.Has("attention")
          ? a.Get("attention")
          : std::string(attention::EstimatorName(attention::EstimatorKind::kMagicPig)));
  if (!mode.ok()) return mode.status();
  for (auto [spec, value] :
       {std::pair{&attention::kLshK, *lsh_k}, std::pair{&attention::kLshL, *lsh_l},
        std::pair{&attention::kLshSeed, *lsh_seed}, std::pair{&attention::kBudget, *budget}}) {
    MAGICPIG_RETURN_IF_ERROR(spec->Check(value, absl::StrCat("--", std::string(spec->flag))));
  }
  if (*attend_timeout < 1) return absl::InvalidArgumentError("--attend-timeout-ms must be >= 1");
  options.attend_timeout = std::chrono::milliseconds(*attend_timeout);
  if (*threads < 0 || *ctx < 0) {
    return absl::InvalidArgumentError("--threads and --ctx must be >= 0");
  }
  options.attention.mode = *mode;
  options.attention.lsh_k = static_cast<int>(*lsh_k);
  options.attention.lsh_l = static_cast<int>(*lsh_l);
  options.attention.lsh_seed = static_cast<uint64_t>(*lsh_seed);
  options.attention.budget = *budget;
  if (a.Has("attention-nodes")) {
    for (absl::string_view node :
         absl::StrSplit(a.Get("attention-nodes"), ',', absl::SkipEmpty())) {
      options.attention_nodes.emplace_back(node);
    }
  }
  const std::string ping_pong = a.Get("ping-pong", "auto");
  if (ping_pong != "on" && ping_pong != "off" && ping_pong != "auto") {
    return absl::InvalidArgumentError("--ping-pong must be on, off or auto");
  }
  options.ping_pong = ping_pong == "on"    ? PingPong::kOn
                      : ping_pong == "off" ? PingPong::kOff
                                           : PingPong::kAuto;
  const std::string coalesce = a.Get("coalesce-attend", "on");
  if (coalesce != "on" && coalesce != "off") {
    return absl::InvalidArgumentError("--coalesce-attend must be on or off");
  }
  options.coalesce_attend = coalesce == "on";
  const std::string placement = a.Get("placement", "pack");
  if (placement != "pack" && placement != "spread") {
    return absl::InvalidArgumentError("--placement must be pack or spread");
  }
  options.placement = placement == "pack" ? Placement::kPack : Placement::kSpread;
  options.num_threads = static_cast<int>(*threads);
  options.context_length = *ctx;
  return options;
}

}  // namespace magicpig::engine
