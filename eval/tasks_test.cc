// Generators and scoring of the RULER-like tasks (eval/tasks.h), with a stand-in token counter
// (about 4 characters per token); the real tokenizer is used in eval_model_test.
#include "eval/tasks.h"

#include <cctype>
#include <cstdio>
#include <string>

#include "gtest/gtest.h"

namespace magicpig::eval {
namespace {

int64_t ApproxTokens(const std::string& input, int64_t, const std::string& prefix) {
  return static_cast<int64_t>((input.size() + prefix.size()) / 4) + 20;  // + a template's worth
}

TEST(Scoring, StringMatchAllCountsEachReference) {
  EXPECT_DOUBLE_EQ(StringMatchAll(" 1234567 and 7654321.", {"1234567", "7654321"}), 1.0);
  EXPECT_DOUBLE_EQ(StringMatchAll("only 1234567", {"1234567", "7654321"}), 0.5);
  EXPECT_DOUBLE_EQ(StringMatchAll("nothing here", {"1234567"}), 0.0);
  EXPECT_DOUBLE_EQ(StringMatchAll("anything", {}), 0.0);
}

TEST(Scoring, CaseInsensitiveAndControlCharacters) {
  EXPECT_DOUBLE_EQ(StringMatchAll("The words: AMBER-lantern", {"amber-lantern"}), 1.0);
  EXPECT_DOUBLE_EQ(StringMatchAll("Vorzel", {"VORZEL"}), 1.0);
  // A control character becomes a newline: it cannot join two halves of a reference.
  EXPECT_DOUBLE_EQ(StringMatchAll("12\t34", {"12 34"}), 0.0);
  EXPECT_EQ(NormalizePrediction("  \tHello\x01World \n"), "hello\nworld");
}

TEST(Scoring, StringMatchPartNeedsAnyReference) {
  EXPECT_DOUBLE_EQ(StringMatchPart("It was Kalomi.", {"Kalomi", "Renthar"}), 1.0);
  EXPECT_DOUBLE_EQ(StringMatchPart("It was nowhere.", {"Kalomi", "Renthar"}), 0.0);
  Sample qa;
  qa.metric = "part";
  qa.outputs = {"Kalomi", "Renthar"};
  EXPECT_DOUBLE_EQ(ScoreSample(qa, "renthar"), 1.0);
  Sample all = qa;
  all.metric = "all";
  EXPECT_DOUBLE_EQ(ScoreSample(all, "renthar"), 0.5);
}

TEST(Words, ListsAreCleanAndSorted) {
  const WordLists& w = Words();
  for (const auto* list : {&w.adjectives, &w.nouns, &w.verbs}) {
    ASSERT_GT(list->size(), 30u);
    EXPECT_TRUE(std::is_sorted(list->begin(), list->end()));
    for (const std::string& s : *list) {
      ASSERT_GE(s.size(), 3u);
      ASSERT_LE(s.size(), 10u);
      for (char c : s) ASSERT_TRUE(c >= 'a' && c <= 'z') << s;
    }
  }
  std::printf("word lists: %s (%zu adjectives, %zu nouns, %zu verbs)\n", w.source.c_str(),
              w.adjectives.size(), w.nouns.size(), w.verbs.size());
}

TEST(Essay, DeterministicDigitFreeAndWithoutNeedleWords) {
  const std::string a = PseudoEssay(2000, 5), b = PseudoEssay(2000, 5), c = PseudoEssay(2000, 6);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  for (char ch : a) ASSERT_FALSE(std::isdigit(static_cast<unsigned char>(ch)));
  for (const char* w : {" special ", " magic ", " number ", " uuid "}) {
    EXPECT_EQ(a.find(w), std::string::npos) << w;
  }
}

class TaskTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TaskTest, FitsTheLimitAndIsDeterministic) {
  const std::string task = GetParam();
  for (int64_t length : {1024, 2048}) {
    for (int64_t index = 0; index < 3; ++index) {
      const uint64_t seed = SampleSeed(42, task, length, index);
      absl::StatusOr<Sample> s = GenerateSample(task, length, index, seed, ApproxTokens);
      ASSERT_TRUE(s.ok()) << task << " " << length << ": " << s.status();
      // Within the limit, and close to it (the bisection found the largest haystack).
      EXPECT_LE(s->tokens + s->max_new_tokens, length) << task;
      EXPECT_GT(s->tokens + s->max_new_tokens, length * 8 / 10) << task << " " << s->tokens;
      EXPECT_EQ(s->tokens, ApproxTokens(s->input, s->question_offset, s->answer_prefix));
      ASSERT_FALSE(s->outputs.empty());
      EXPECT_GT(s->question_offset, 0);
      EXPECT_LT(s->question_offset, static_cast<int64_t>(s->input.size()));
      if (task.starts_with("niah") || task == "qa_1" || task == "qa_2" || task == "vt") {
        // Each answer is in the context exactly once (and not in the question part).
        const std::string context = s->input.substr(0, static_cast<size_t>(s->question_offset));
        for (const std::string& ref : s->outputs) {
          const int64_t want = task == "vt" ? 2 : 1;  // vt: "VAR X = ..." and "= VAR X "
          if (task == "vt") {
            EXPECT_GE(CountOccurrences(context, ref), 1) << ref;
            EXPECT_LE(CountOccurrences(context, ref), want) << ref;
          } else {
            EXPECT_EQ(CountOccurrences(context, ref), want) << task << " " << ref;
          }
        }
        EXPECT_GE(s->answer_char, 0);
      }
      // Same seed, same sample; another index, another sample.
      absl::StatusOr<Sample> again = GenerateSample(task, length, index, seed, ApproxTokens);
      ASSERT_TRUE(again.ok());
      EXPECT_EQ(again->input, s->input);
      absl::StatusOr<Sample> other = GenerateSample(
          task, length, index + 1, SampleSeed(42, task, length, index + 1), ApproxTokens);
      ASSERT_TRUE(other.ok());
      EXPECT_NE(other->input, s->input);
    }
  }
}

TEST_P(TaskTest, FullScoreForTheReferences) {
  const std::string task = GetParam();
  absl::StatusOr<Sample> s = GenerateSample(task, 2048, 0, 9, ApproxTokens);
  ASSERT_TRUE(s.ok());
  std::string all;
  for (const std::string& r : s->outputs) all += r + ", ";
  EXPECT_DOUBLE_EQ(ScoreSample(*s, all), 1.0);
  EXPECT_DOUBLE_EQ(ScoreSample(*s, "I do not know."), 0.0);
}

INSTANTIATE_TEST_SUITE_P(AllTasks, TaskTest, ::testing::ValuesIn(RulerTasks()),
                         [](const auto& info) { return info.param; });

TEST(Tasks, CweAndFweReferencesAreTheMostFrequent) {
  absl::StatusOr<Sample> cwe = GenerateSample("cwe", 4096, 0, 3, ApproxTokens);
  ASSERT_TRUE(cwe.ok());
  ASSERT_EQ(cwe->outputs.size(), 10u);
  const std::string list = cwe->input.substr(cwe->input.rfind("ones.\n"));
  for (const std::string& w : cwe->outputs) {
    EXPECT_EQ(CountOccurrences(list, ". " + w + " "), 30) << w;  // 30 x at >= 4K
  }
  absl::StatusOr<Sample> fwe = GenerateSample("fwe", 4096, 0, 3, ApproxTokens);
  ASSERT_TRUE(fwe.ok());
  ASSERT_EQ(fwe->outputs.size(), 3u);
  const std::string text = " " + fwe->input.substr(0, fwe->question_offset) + " ";
  const int64_t c2 = CountOccurrences(text, " " + fwe->outputs[0] + " ");
  const int64_t c3 = CountOccurrences(text, " " + fwe->outputs[1] + " ");
  const int64_t c4 = CountOccurrences(text, " " + fwe->outputs[2] + " ");
  EXPECT_GT(c2, c3);
  EXPECT_GT(c3, c4);
  EXPECT_GT(c4, 0);
}

TEST(Tasks, UnknownTaskAndTooShort) {
  EXPECT_EQ(GenerateSample("nope", 1024, 0, 1, ApproxTokens).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GenerateSample("niah_single_2", 200, 0, 1, ApproxTokens).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(Storage, JsonlRoundTrip) {
  std::vector<Sample> samples;
  for (int64_t i = 0; i < 3; ++i) {
    absl::StatusOr<Sample> s = GenerateSample(
        "niah_multiquery", 1024, i, SampleSeed(42, "niah_multiquery", 1024, i), ApproxTokens);
    ASSERT_TRUE(s.ok());
    samples.push_back(*s);
  }
  const std::string path = ::testing::TempDir() + "/eval_tasks_test.jsonl";
  ASSERT_TRUE(WriteSamples(path, samples).ok());
  absl::StatusOr<std::vector<Sample>> back = ReadSamples(path);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ((*back)[i].input, samples[i].input);
    EXPECT_EQ((*back)[i].outputs, samples[i].outputs);
    EXPECT_EQ((*back)[i].seed, samples[i].seed);
    EXPECT_EQ((*back)[i].question_offset, samples[i].question_offset);
    EXPECT_EQ((*back)[i].answer_prefix, samples[i].answer_prefix);
  }
}

}  // namespace
}  // namespace magicpig::eval
