// The evaluators behind `magicpig eval ruler|ppl|attn-error` (issue #6; docs/evaluation.md).
//
// ruler: RULER-like task scores per attention mode and setup. Per sample the context is
//   prefilled exactly once (ForkDecoder); setup A extends that prefix exactly by the question
//   part, setup B feeds the question part token by token through each mode's decode path; every
//   mode then decodes greedily from a fork of the prefix. Modes: full, magicpig(K, L) per config,
//   and topk / oracle at the budget that magicpig(K, L) touched on the same sample and setup
//   (round(|S|/n_off * n_off) keys per head). Rows go to a JSONL file, one per (task, length,
//   index, setup, method); a rerun skips what is there (resume).
// ppl: teacher-forced decode agreement (eval-tasks.md §6.1): exact prefill of P tokens of a long
//   generated multi-document text, then M ground-truth tokens fed one at a time through each mode's
//   decode path; perplexity, KL(full || mode) and top-1 agreement against the full-attention
//   branch's distributions at the same positions.
// attn-error: per (layer, kv head, query head, query) relative L2 error of the attention output for
//   magicpig(K, L), oracle sampling and top-k at the same |S| (tests/accuracy's HeadEvaluator), on
//   real post-RoPE keys captured from an exact prefill (tests/accuracy's CaptureQk).
#ifndef MAGICPIG_EVAL_EVALUATORS_H_
#define MAGICPIG_EVAL_EVALUATORS_H_

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/attention/estimator_params.h"
#include "common/flags/flag_table.h"

namespace magicpig::eval {

using LshConfig = std::pair<int, int>;  // (K, L)

struct RulerOptions {
  std::string model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  int threads = 2;
  std::vector<std::string> tasks;  // empty: all 13
  std::vector<int64_t> lengths = {4096};
  int64_t samples = 3;
  // Runs sample indices [first_sample, samples) only, so one evaluation can be split over
  // machines (each writes its own rows; concatenated, they resume and summarise as one run).
  int64_t first_sample = 0;
  uint64_t seed = 42;
  std::string data_dir = "eval/data";  // the generated samples (JSONL per task, length, seed)
  std::string out = "eval/results/ruler.jsonl";  // per-sample rows (resume reads it)
  std::string csv;                               // summary table (optional)
  std::string json;                              // summary (optional)
  std::vector<std::string> setups = {"A"};
  std::vector<LshConfig> configs = {{10, 150}, {9, 120}, {8, 75}};
  // Per setup, only these methods (names as printed, e.g. "magicpig(10,150)", "topk@(10,150)";
  // empty: all). topk@/oracle@ take their budget from the same setup's magicpig run, so keep it.
  std::vector<std::string> a_methods, b_methods;
  bool baselines = true;  // topk and oracle at the budget magicpig touched
  // vattention and vattention-lsh(K,L) for each config, with these parameters (their budgets are
  // their own: the keys they touch are reported, not matched).
  bool vattention = false;
  attention::VAttentionParams va;
  // Non-empty: also spotlight@(K,L) with these trained hashes, retrieving the fraction of keys
  // that magicpig(K,L) touched on the same sample (equal touched keys).
  std::string spotlight_file;
  // With both vattention and spotlight_file: also vattention-spotlight, its candidates this
  // fraction of the keys (as vattention's heavy hitters default to 1%).
  double spotlight_candidates = 0.01;
  // Each R > 1 (with spotlight_file): also spotlight-rerankR@(K,L), spotlight@(K,L) whose heads
  // score R times its retrieved keys exactly and keep the best (--spotlight-rerank).
  std::vector<int64_t> spotlight_rerank;
  // Each R: also sketchR@(K,L), the low-rank key sketch of R int8 coordinates (--attention sketch)
  // retrieving the fraction of keys magicpig(K,L) touched on the same sample.
  std::vector<int64_t> sketch_dims;
  bool early_stop = true;  // stop a generation once the score can no longer change
  uint64_t lsh_seed = 1234;
  bool quiet = false;         // no progress on stderr
  bool summary_only = false;  // no runs: the tables from the rows already in `out`
  // > 0: once this many minutes have passed, start no further sample index (the run stops
  // between whole samples, summarises, and a rerun resumes); at least one sample with work runs.
  double max_minutes = 0;
};
absl::Status RunRuler(const RulerOptions& options, std::ostream& out);

struct PplOptions {
  std::string model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  int threads = 2;
  std::vector<int64_t> prefixes = {2048, 5888};  // exact-prefill lengths P
  int64_t steps = 256;                           // M teacher-forced decode steps per P
  std::vector<LshConfig> configs = {{10, 150}, {9, 120}, {8, 75}};
  std::vector<uint64_t> lsh_seeds = {1234, 1, 2};
  bool baselines = true;
  // Oracle sampling with every --lsh-seeds seed as its draw seed (mean ± sd, as MagicPIG); by
  // default only the first, to bound the cost.
  bool oracle_all_seeds = false;
  uint64_t text_seed = 7;
  std::string json;  // rows and summary
  std::string csv;
  bool quiet = false;
};
absl::Status RunPpl(const PplOptions& options, std::ostream& out);

// The multi-document text for ppl (several generated documents, no copyrighted prose).
std::string PplText(uint64_t seed, int64_t n_docs, int64_t words_per_doc);

struct AttnErrorOptions {
  std::string model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  int threads = 2;
  int64_t tokens = 2048;
  int64_t queries = 8;
  std::vector<LshConfig> configs = {{10, 150}, {9, 120}, {8, 75}};
  std::vector<uint64_t> lsh_seeds = {1, 2, 3};
  uint64_t text_seed = 7;
  std::string work_dir = "eval/results";  // where the captured text goes
  std::string csv;                        // per (config, seed, layer, head) rows
  std::string json;                       // summary
  bool quiet = false;
  // Also vattention and vattention-lsh(K,L) with these parameters: per layer, the fraction of
  // (head, query) pairs whose error is within epsilon (the empirical guarantee).
  bool vattention = false;
  attention::VAttentionParams va;
};
absl::Status RunAttnError(const AttnErrorOptions& options, std::ostream& out);

// `magicpig eval <ruler|ppl|attn-error> [flags]`; returns the process exit code.
int EvalCommand(const std::vector<std::string>& args);

// The evaluators' flag tables (eval_command.cc), writing into the options (whose current values
// are the defaults).
std::unique_ptr<flags::FlagTable> RulerFlagTable(RulerOptions* options);
std::unique_ptr<flags::FlagTable> PplFlagTable(PplOptions* options);
std::unique_ptr<flags::FlagTable> AttnErrorFlagTable(AttnErrorOptions* options);

}  // namespace magicpig::eval

#endif  // MAGICPIG_EVAL_EVALUATORS_H_
