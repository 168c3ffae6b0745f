// `magicpig eval ruler|ppl|attn-error`: flag parsing for the evaluators (evaluators.h).
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/cli_args.h"
#include "eval/evaluators.h"

namespace magicpig::eval {

namespace {

constexpr const char* kUsage =
    "usage: magicpig eval <ruler|ppl|attn-error> [flags]\n"
    "common flags: --model PATH (models/SmolLM2-135M-Instruct.Q4_1.gguf) --threads N (2)\n"
    "  --configs K:L,... (10:150,9:120,8:75) --quiet\n"
    "ruler: --tasks a,b (all 13) --lengths 4096,8192 --samples N (3) --seed S (42)\n"
    "  --first-sample I (0: run sample indices I..N-1 only, to split a run over machines)\n"
    "  --data-dir DIR (eval/data) --out ROWS.jsonl (eval/results/ruler.jsonl) --csv F --json F\n"
    "  --setups A,B (A) --a-methods 'M1;M2' --b-methods 'M1;M2' (only these per setup)\n"
    "  --no-baselines --no-early-stop --lsh-seed S (1234) --summary-only (tables from --out)\n"
    "  --max-minutes M (start no new sample index after M minutes; rerun resumes)\n"
    "ppl: --prefixes 2048,5888 --steps M (256) --lsh-seeds 1234,1,2 --no-baselines\n"
    "  --oracle-all-seeds (oracle sampling with every seed; default the first only)\n"
    "  --text-seed S (7) --json F --csv F\n"
    "attn-error: --tokens N (2048) --queries Q (8) --lsh-seeds 1,2,3 --text-seed S (7)\n"
    "  --work-dir DIR (eval/results) --csv F --json F\n";

std::vector<std::string> List(const std::string& s) {
  std::vector<std::string> out;
  for (absl::string_view p : absl::StrSplit(s, ',', absl::SkipEmpty())) out.emplace_back(p);
  return out;
}

template <typename T>
absl::StatusOr<std::vector<T>> Numbers(const std::string& flag, const std::string& s) {
  std::vector<T> out;
  for (const std::string& p : List(s)) {
    T v;
    if (!absl::SimpleAtoi(p, &v)) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": bad number '", p, "'"));
    }
    out.push_back(v);
  }
  return out;
}

absl::StatusOr<std::vector<LshConfig>> Configs(const std::string& s) {
  std::vector<LshConfig> out;
  for (const std::string& p : List(s)) {
    std::vector<std::string> kl = absl::StrSplit(p, ':');
    int k = 0, l = 0;
    if (kl.size() != 2 || !absl::SimpleAtoi(kl[0], &k) || !absl::SimpleAtoi(kl[1], &l) || k <= 0 ||
        l <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("--configs: expected K:L, got '", p, "'"));
    }
    out.emplace_back(k, l);
  }
  return out;
}

absl::Status Run(const std::string& which, const std::vector<std::string>& args) {
  const std::set<std::string> values = {
      "model",    "threads",  "configs",   "tasks",     "lengths",     "samples",
      "seed",     "data-dir", "out",       "csv",       "json",        "setups",
      "lsh-seed", "prefixes", "steps",     "lsh-seeds", "text-seed",   "tokens",
      "queries",  "work-dir", "a-methods", "b-methods", "max-minutes", "first-sample"};
  const std::set<std::string> bools = {"quiet", "no-baselines", "no-early-stop", "summary-only",
                                       "oracle-all-seeds"};
  absl::StatusOr<CliArgs> parsed = CliArgs::Parse(args, values, bools);
  if (!parsed.ok()) return parsed.status();
  const CliArgs& a = *parsed;
  absl::StatusOr<int64_t> threads = a.GetInt("threads", 2);
  if (!threads.ok()) return threads.status();
  std::vector<LshConfig> configs = {{10, 150}, {9, 120}, {8, 75}};
  if (a.Has("configs")) {
    absl::StatusOr<std::vector<LshConfig>> c = Configs(a.Get("configs"));
    if (!c.ok()) return c.status();
    configs = *c;
  }
  const std::string model = a.Get("model", "models/SmolLM2-135M-Instruct.Q4_1.gguf");
  if (which == "ruler") {
    RulerOptions o;
    o.model_path = model;
    o.threads = static_cast<int>(*threads);
    o.configs = configs;
    if (a.Has("tasks")) o.tasks = List(a.Get("tasks"));
    // Method names hold commas ("magicpig(10,150)"): these lists are separated by ';'.
    for (absl::string_view m : absl::StrSplit(a.Get("a-methods"), ';', absl::SkipEmpty())) {
      o.a_methods.emplace_back(m);
    }
    for (absl::string_view m : absl::StrSplit(a.Get("b-methods"), ';', absl::SkipEmpty())) {
      o.b_methods.emplace_back(m);
    }
    if (a.Has("lengths")) {
      absl::StatusOr<std::vector<int64_t>> l = Numbers<int64_t>("lengths", a.Get("lengths"));
      if (!l.ok()) return l.status();
      o.lengths = *l;
    }
    absl::StatusOr<int64_t> samples = a.GetInt("samples", o.samples);
    absl::StatusOr<int64_t> first_sample = a.GetInt("first-sample", 0);
    absl::StatusOr<int64_t> seed = a.GetInt("seed", 42);
    absl::StatusOr<int64_t> lsh_seed = a.GetInt("lsh-seed", 1234);
    for (const auto* s : {&samples, &first_sample, &seed, &lsh_seed}) {
      if (!s->ok()) return s->status();
    }
    if (*first_sample < 0 || (*first_sample > 0 && *first_sample >= *samples)) {
      return absl::InvalidArgumentError(absl::StrCat("--first-sample: ", *first_sample,
                                                     " is outside [0, --samples ", *samples, ")"));
    }
    o.samples = *samples;
    o.first_sample = *first_sample;
    o.seed = static_cast<uint64_t>(*seed);
    o.lsh_seed = static_cast<uint64_t>(*lsh_seed);
    o.data_dir = a.Get("data-dir", o.data_dir);
    o.out = a.Get("out", o.out);
    o.csv = a.Get("csv");
    o.json = a.Get("json");
    if (a.Has("setups")) o.setups = List(a.Get("setups"));
    for (const std::string& s : o.setups) {
      if (s != "A" && s != "B") return absl::InvalidArgumentError("--setups: A and/or B");
    }
    o.baselines = !a.Has("no-baselines");
    o.early_stop = !a.Has("no-early-stop");
    o.quiet = a.Has("quiet");
    o.summary_only = a.Has("summary-only");
    absl::StatusOr<double> max_minutes = a.GetDouble("max-minutes", 0);
    if (!max_minutes.ok()) return max_minutes.status();
    if (!(*max_minutes >= 0)) return absl::InvalidArgumentError("--max-minutes: must be >= 0");
    o.max_minutes = *max_minutes;
    return RunRuler(o, std::cout);
  }
  if (which == "ppl") {
    PplOptions o;
    o.model_path = model;
    o.threads = static_cast<int>(*threads);
    o.configs = configs;
    if (a.Has("prefixes")) {
      absl::StatusOr<std::vector<int64_t>> p = Numbers<int64_t>("prefixes", a.Get("prefixes"));
      if (!p.ok()) return p.status();
      o.prefixes = *p;
    }
    if (a.Has("lsh-seeds")) {
      absl::StatusOr<std::vector<uint64_t>> s = Numbers<uint64_t>("lsh-seeds", a.Get("lsh-seeds"));
      if (!s.ok()) return s.status();
      o.lsh_seeds = *s;
    }
    absl::StatusOr<int64_t> steps = a.GetInt("steps", o.steps);
    absl::StatusOr<int64_t> text_seed = a.GetInt("text-seed", 7);
    if (!steps.ok()) return steps.status();
    if (!text_seed.ok()) return text_seed.status();
    o.steps = *steps;
    o.text_seed = static_cast<uint64_t>(*text_seed);
    o.baselines = !a.Has("no-baselines");
    o.oracle_all_seeds = a.Has("oracle-all-seeds");
    o.json = a.Get("json");
    o.csv = a.Get("csv");
    o.quiet = a.Has("quiet");
    return RunPpl(o, std::cout);
  }
  if (which == "attn-error") {
    AttnErrorOptions o;
    o.model_path = model;
    o.threads = static_cast<int>(*threads);
    o.configs = configs;
    if (a.Has("lsh-seeds")) {
      absl::StatusOr<std::vector<uint64_t>> s = Numbers<uint64_t>("lsh-seeds", a.Get("lsh-seeds"));
      if (!s.ok()) return s.status();
      o.lsh_seeds = *s;
    }
    absl::StatusOr<int64_t> tokens = a.GetInt("tokens", o.tokens);
    absl::StatusOr<int64_t> queries = a.GetInt("queries", o.queries);
    absl::StatusOr<int64_t> text_seed = a.GetInt("text-seed", 7);
    for (const auto* s : {&tokens, &queries, &text_seed}) {
      if (!s->ok()) return s->status();
    }
    o.tokens = *tokens;
    o.queries = *queries;
    o.text_seed = static_cast<uint64_t>(*text_seed);
    o.work_dir = a.Get("work-dir", o.work_dir);
    o.csv = a.Get("csv");
    o.json = a.Get("json");
    o.quiet = a.Has("quiet");
    return RunAttnError(o, std::cout);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown eval command '", which, "'"));
}

}  // namespace

int EvalCommand(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "help") {
    std::cout << kUsage;
    return args.empty() ? 2 : 0;
  }
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (!rest.empty() && rest[0] == "--help") {
    std::cout << kUsage;
    return 0;
  }
  const absl::Status s = Run(args[0], rest);
  if (!s.ok()) {
    std::cerr << "magicpig eval " << args[0] << ": " << s << "\n";
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}

}  // namespace magicpig::eval
