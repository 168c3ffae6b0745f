// RULER-like long-context tasks, rebuilt offline (docs/architecture.md
// §15; the suite and its results: docs/evaluation.md).
//
// GenerateSample builds one sample of a task at a target length N: the task text (instruction,
// haystack with needles, question), the answer prefix and the reference outputs. The haystack size
// (lines, words, list entries, documents) is the largest n with
//   count(input, question_offset, answer_prefix) + max_new_tokens <= N,
// found by bisection per sample with the caller's token-count callback, so that the
// generator sizes prompts with the evaluated model's own tokenizer and chat template.
//
// Offline substitutes, all deterministic (listed in docs/evaluation.md):
//   - word lists: Debian wordnet-base (/usr/share/wordnet/index.{noun,adj,verb}: lowercase,
//     alphabetic, 3-10 letters, deduplicated and sorted); a small built-in list when it is absent
//     (WordSource() says which);
//   - essay haystack: a pseudo-essay generator of our own (template sentences over the WordNet
//     vocabulary, no digits, none of the needle-sentence words);
//   - qa_1 / qa_2: the synthetic doc-QA substitute with invented entities, towns and persons.
//
// Scoring (RULER's metrics): string_match_all (niah*, vt, cwe, fwe) and string_match_part (qa),
// after stripping, control characters -> newline, case-insensitive.
//
// Thread-safety: free functions; the word lists are built once (thread-safe static).
#ifndef MAGICPIG_EVAL_TASKS_H_
#define MAGICPIG_EVAL_TASKS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/json/value.h"

namespace magicpig::eval {

// A small deterministic generator (splitmix64), the same on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next();
  // Uniform in [0, n), n > 0.
  uint64_t Uniform(uint64_t n) { return Next() % n; }
  int64_t Range(int64_t lo, int64_t hi) {  // [lo, hi]
    return lo + static_cast<int64_t>(Uniform(static_cast<uint64_t>(hi - lo + 1)));
  }
  template <typename T>
  void Shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[Uniform(i)]);
  }

 private:
  uint64_t state_;
};

struct WordLists {
  std::vector<std::string> adjectives, nouns, verbs;
  std::string source;  // "wordnet-base (/usr/share/wordnet)" or "built-in"
};
// The lists used by every generator (WordNet when installed, else built-in).
const WordLists& Words();
std::string WordSource();

// Counts the tokens of the rendered prompt: chat template around `input` (split for setup B at
// question_offset), then `answer_prefix`.
using TokenCounter = std::function<int64_t(const std::string& input, int64_t question_offset,
                                           const std::string& answer_prefix)>;

struct Sample {
  std::string task;
  int64_t length = 0;  // target N
  int64_t index = 0;
  uint64_t seed = 0;
  std::string input;  // the task text (the user message)
  // Characters of `input` before the question part: setup B prefills input[0, question_offset)
  // densely and sends the rest (question, template tail, answer prefix) through the sparse path.
  int64_t question_offset = 0;
  std::vector<std::string> outputs;  // references
  std::string answer_prefix;
  int64_t max_new_tokens = 0;
  int64_t tokens = 0;        // tokens of the rendered prompt
  int64_t haystack_n = 0;    // the sized haystack parameter
  int64_t answer_char = -1;  // character position of the first reference in the input
  double answer_depth = -1;  // answer_char / question_offset (0..1)
  std::string metric;        // "all" or "part"
};

// The 13 task names, in report order (niah x8, vt, cwe, fwe, qa_1, qa_2).
const std::vector<std::string>& RulerTasks();
// Output cap per task (RULER's per-task generation lengths); 0 for an unknown task.
int64_t TaskMaxNewTokens(std::string_view task);

// The seed of sample `index` of (task, length) from the base seed (42 by convention).
uint64_t SampleSeed(uint64_t base_seed, std::string_view task, int64_t length, int64_t index);

// One sample; INVALID_ARGUMENT for an unknown task, FAILED_PRECONDITION when even the smallest
// haystack does not fit in `length` tokens.
absl::StatusOr<Sample> GenerateSample(const std::string& task, int64_t length, int64_t index,
                                      uint64_t seed, const TokenCounter& count);

// Deterministic pseudo-essay prose of about n_words words (no digits; sentences end in ". ",
// "! " or "? ").
std::string PseudoEssay(int64_t n_words, uint64_t seed);

// Scoring (RULER's metrics; see above).
std::string NormalizePrediction(std::string_view prediction);
double StringMatchAll(std::string_view prediction, const std::vector<std::string>& refs);
double StringMatchPart(std::string_view prediction, const std::vector<std::string>& refs);
double ScoreSample(const Sample& sample, std::string_view prediction);  // in [0, 1]

// Occurrences of `needle` in `text` (non-overlapping, case-sensitive).
int64_t CountOccurrences(std::string_view text, std::string_view needle);

// JSONL storage: one sample per line.
json::Value SampleToJson(const Sample& s);
absl::StatusOr<Sample> SampleFromJson(const json::Value& v);
absl::Status WriteSamples(const std::string& path, const std::vector<Sample>& samples);
absl::StatusOr<std::vector<Sample>> ReadSamples(const std::string& path);

}  // namespace magicpig::eval

#endif  // MAGICPIG_EVAL_TASKS_H_
