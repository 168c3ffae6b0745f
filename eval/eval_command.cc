// `magicpig eval ruler|ppl|attn-error`: the evaluators' flag tables (evaluators.h).
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/attention/estimator_params.h"
#include "common/flags/flag_table.h"
#include "eval/evaluators.h"
#include "gpu_node/engine/engine_flags.h"

namespace magicpig::eval {
namespace {

constexpr int64_t kMaxCount = int64_t{1} << 40;

std::string ConfigsText(const std::vector<LshConfig>& configs) {
  std::vector<std::string> parts;
  for (const auto& [k, l] : configs) parts.push_back(absl::StrCat(k, ":", l));
  return absl::StrJoin(parts, ",");
}

// The flags every evaluator takes: --model, --threads, --configs, --quiet.
template <typename Options>
void DeclareCommonFlags(flags::FlagTable& table, Options* o) {
  table.Text("model", &o->model_path, "FILE.gguf", "the model");
  table.Number("threads", &o->threads, "CPU threads", 1, 4096);
  table.Custom("configs", "K:L,...", "MagicPIG (K, L) configurations", ConfigsText(o->configs),
               [o](absl::string_view text) -> absl::Status {
                 std::vector<LshConfig> configs;
                 for (absl::string_view p : absl::StrSplit(
                          absl::string_view(text.data(), text.size()), ',', absl::SkipEmpty())) {
                   std::vector<std::string> kl = absl::StrSplit(p, ':');
                   int k = 0, l = 0;
                   if (kl.size() != 2 || !absl::SimpleAtoi(kl[0], &k) ||
                       !absl::SimpleAtoi(kl[1], &l) || k <= 0 || l <= 0) {
                     return absl::InvalidArgumentError(
                         absl::StrCat("expected K:L, got '", std::string(p), "'"));
                   }
                   configs.emplace_back(k, l);
                 }
                 o->configs = std::move(configs);
                 return absl::OkStatus();
               });
  table.Switch("quiet", &o->quiet, "no progress on stderr");
}

}  // namespace

std::unique_ptr<flags::FlagTable> RulerFlagTable(RulerOptions* o) {
  auto table = std::make_unique<flags::FlagTable>(
      "magicpig eval ruler",
      "The RULER-like long-context suite: every method on the same generated samples "
      "(docs/evaluation.md).");
  DeclareCommonFlags(*table, o);
  table->List("tasks", &o->tasks, "A,B", "tasks to run (all 13 when empty)");
  table->NumberList("lengths", &o->lengths, "context lengths", int64_t{1}, kMaxCount);
  table->Number("samples", &o->samples, "samples per task and length", int64_t{1}, kMaxCount);
  table->Number("first-sample", &o->first_sample,
                "run sample indices I..N-1 only (to split a run over machines)", int64_t{0},
                kMaxCount, "I");
  table->Number("seed", &o->seed, "the samples' generation seed", uint64_t{0},
                std::numeric_limits<uint64_t>::max());
  table->Text("data-dir", &o->data_dir, "DIR", "the generated samples");
  table->Text("out", &o->out, "ROWS.jsonl", "per-sample rows (a rerun resumes from them)");
  table->Text("csv", &o->csv, "FILE", "summary table");
  table->Text("json", &o->json, "FILE", "summary");
  table->Choice("setups", &o->setups, "A (sparse after prefill) and/or B (sparse from the start)",
                {{"A", {"A"}}, {"B", {"B"}}, {"A,B", {"A", "B"}}, {"B,A", {"B", "A"}}});
  for (auto [name, target] :
       {std::pair{"a-methods", &o->a_methods}, std::pair{"b-methods", &o->b_methods}}) {
    // Method names hold commas ("magicpig(10,150)"): these lists are separated by ';'.
    table->Custom(name, "M1;M2", "only these methods in that setup", "",
                  [target = target](absl::string_view text) {
                    target->clear();
                    for (absl::string_view m : absl::StrSplit(
                             absl::string_view(text.data(), text.size()), ';', absl::SkipEmpty())) {
                      target->emplace_back(m);
                    }
                    return absl::OkStatus();
                  });
  }
  table->Switch("no-baselines", &o->baselines,
                "skip topk and oracle at the budget magicpig touched", false);
  table->Switch("vattention", &o->vattention,
                "also run vattention and vattention-lsh(K,L) for each config, with the --va-* "
                "parameters (budgets their own, reported as keys touched)",
                true);
  engine::DeclareVAttentionFlags(*table, &o->va);
  table->Text("spotlight-file", &o->spotlight_file, "FILE.spot",
              "also run spotlight@(K,L) with these trained hashes (eval/spotlight/train.py), "
              "retrieving the fraction of keys magicpig(K,L) touched on the same sample (and, with "
              "--vattention, vattention-spotlight)");
  table->Number("spotlight-candidates", &o->spotlight_candidates,
                "vattention-spotlight and vattention-sketch: the fraction of keys nearest by "
                "learned code (or best by key sketch) kept exact",
                attention::kSpotFraction.min, attention::kSpotFraction.max);
  table->NumberList("spotlight-rerank", &o->spotlight_rerank,
                    "also run spotlight-rerankR@(K,L) for each R: spotlight@(K,L) scoring R times "
                    "its retrieved keys exactly and attending the best (docs/spotlight.md)",
                    int64_t{2}, attention::kSpotRerank.max);
  table->NumberList("sketch-dims", &o->sketch_dims,
                    "also run sketchR@(K,L) for each R: the low-rank key sketch of R int8 "
                    "coordinates (even) retrieving the fraction of keys magicpig(K,L) touched on "
                    "the same sample (docs/sketch.md); with --vattention also "
                    "vattention-sketchR, the sketch finding vattention's heavy hitters",
                    attention::kSketchDims.min, attention::kSketchDims.max);
  table->Switch("no-early-stop", &o->early_stop,
                "generate every answer token even when the score can no longer change", false);
  table->Number("lsh-seed", &o->lsh_seed, "SimHash projection seed", uint64_t{0},
                std::numeric_limits<uint64_t>::max());
  table->Switch("summary-only", &o->summary_only, "no runs: the tables from the rows in --out");
  table->Number("max-minutes", &o->max_minutes,
                "start no new sample index after M minutes (a rerun resumes); 0 = no limit", 0.0,
                1e9, "M");
  return table;
}

std::unique_ptr<flags::FlagTable> PplFlagTable(PplOptions* o) {
  auto table = std::make_unique<flags::FlagTable>(
      "magicpig eval ppl", "Teacher-forced perplexity of every method after an exact prefill.");
  DeclareCommonFlags(*table, o);
  table->NumberList("prefixes", &o->prefixes, "exact-prefill lengths", int64_t{1}, kMaxCount);
  table->Number("steps", &o->steps, "teacher-forced decode steps per prefix", int64_t{1},
                kMaxCount);
  table->NumberList("lsh-seeds", &o->lsh_seeds, "SimHash projection seeds", uint64_t{0},
                    std::numeric_limits<uint64_t>::max());
  table->Switch("no-baselines", &o->baselines, "skip topk and oracle", false);
  table->Switch("oracle-all-seeds", &o->oracle_all_seeds,
                "oracle sampling with every seed (default the first only)");
  table->Number("text-seed", &o->text_seed, "the text's generation seed", uint64_t{0},
                std::numeric_limits<uint64_t>::max());
  table->Text("json", &o->json, "FILE", "rows and summary");
  table->Text("csv", &o->csv, "FILE", "rows");
  return table;
}

std::unique_ptr<flags::FlagTable> AttnErrorFlagTable(AttnErrorOptions* o) {
  auto table = std::make_unique<flags::FlagTable>(
      "magicpig eval attn-error",
      "Attention-output error of each estimator against exact attention on real queries and keys.");
  DeclareCommonFlags(*table, o);
  table->Number("tokens", &o->tokens, "context tokens captured", int64_t{1}, kMaxCount);
  table->Number("queries", &o->queries, "queries per head", int64_t{1}, kMaxCount);
  table->NumberList("lsh-seeds", &o->lsh_seeds, "SimHash projection seeds", uint64_t{0},
                    std::numeric_limits<uint64_t>::max());
  table->Number("text-seed", &o->text_seed, "the text's generation seed", uint64_t{0},
                std::numeric_limits<uint64_t>::max());
  table->Text("work-dir", &o->work_dir, "DIR", "where the captured text goes");
  table->Switch("vattention", &o->vattention,
                "also vattention and vattention-lsh(K,L): per layer, the fraction of (head, "
                "query) pairs within --va-epsilon",
                true);
  engine::DeclareVAttentionFlags(*table, &o->va);
  table->Text("csv", &o->csv, "FILE", "per (config, seed, layer, head) rows");
  table->Text("json", &o->json, "FILE", "summary");
  return table;
}

namespace {

constexpr const char* kUsage =
    "usage: magicpig eval <ruler|ppl|attn-error> [flags]  (magicpig eval <command> --help)\n";

template <typename Options>
absl::Status Run(std::unique_ptr<flags::FlagTable> (*make_table)(Options*),
                 absl::Status (*run)(const Options&, std::ostream&),
                 const std::vector<std::string>& args) {
  Options o;
  std::unique_ptr<flags::FlagTable> table = make_table(&o);
  if (absl::Status s = table->Parse(args); !s.ok()) return s;
  if (table->help_requested()) {
    std::cout << table->Help();
    return absl::OkStatus();
  }
  return run(o, std::cout);
}

}  // namespace

int EvalCommand(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "help") {
    std::cout << kUsage;
    return args.empty() ? 2 : 0;
  }
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  absl::Status s;
  if (args[0] == "ruler") {
    s = Run<RulerOptions>(RulerFlagTable, RunRuler, rest);
  } else if (args[0] == "ppl") {
    s = Run<PplOptions>(PplFlagTable, RunPpl, rest);
  } else if (args[0] == "attn-error") {
    s = Run<AttnErrorOptions>(AttnErrorFlagTable, RunAttnError, rest);
  } else {
    s = absl::InvalidArgumentError(absl::StrCat("unknown eval command '", args[0], "'"));
  }
  if (!s.ok()) {
    std::cerr << "magicpig eval " << args[0] << ": " << s.message() << "\n";
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}

}  // namespace magicpig::eval
