// ServingMetrics turns the scheduler's reports into the series docs/metrics.md names: checked on
// the rendered exposition text after a known sequence of reports, and after a real scheduler run.
#include "gpu_node/server/serving_metrics.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/metrics/metrics.h"
#include "gpu_node/engine/scheduler.h"
#include "gtest/gtest.h"
#include "tests/testing/exposition.h"
#include "tests/testing/synthetic_engine.h"

namespace magicpig::server {
namespace {

double Value(const prometheus::Registry& registry, const std::string& series) {
  return magicpig::testing::ExpositionSample(metrics::Render(registry), series);
}

TEST(ServingMetricsTest, ReportsBecomeTheDocumentedSeries) {
  prometheus::Registry registry;
  ServingMetrics m(registry);
  // Every outcome series exists before any request finishes (rate() needs the zero).
  for (const char* reason : {"stop", "length", "abort"}) {
    EXPECT_EQ(Value(registry, absl::StrCat("magicpig_request_success_total{finished_reason=\"",
                                           reason, "\"}")),
              0)
        << reason;
  }
  m.OnOccupancy(3, 2);
  EXPECT_EQ(Value(registry, "magicpig_num_requests_waiting"), 3);
  EXPECT_EQ(Value(registry, "magicpig_num_requests_running"), 2);
  m.OnDequeued(0.25);
  m.OnStarted(17);
  m.OnStarted(5);
  m.OnToken(true, 0.5);
  m.OnToken(false, 0.01);
  m.OnToken(false, 0.02);
  engine::GenerateResult result;
  result.finish = engine::FinishReason::kLength;
  result.stats.attention_keys_offloaded = 1000;
  result.stats.attention_keys_touched = 40;
  result.stats.attention_recoveries = 2;
  for (int64_t keys : std::vector<int64_t>{1, 3, 4, 40, 40, int64_t{1} << 30}) {
    result.stats.attention_keys_per_head.Add(keys);
  }
  m.OnFinished(result, 1.5);
  engine::StepTimings timings;
  timings.dense = 0.003;
  timings.attention = 0.002;
  timings.micro_batches = 2;
  m.OnStep(4, 0.006, timings, 0.001);

  EXPECT_EQ(Value(registry, "magicpig_request_queue_time_seconds_sum"), 0.25);
  EXPECT_EQ(Value(registry, "magicpig_prompt_tokens_total"), 22);
  EXPECT_EQ(Value(registry, "magicpig_generation_tokens_total"), 3);
  EXPECT_EQ(Value(registry, "magicpig_time_to_first_token_seconds_count"), 1);
  EXPECT_EQ(Value(registry, "magicpig_time_to_first_token_seconds_sum"), 0.5);
  EXPECT_EQ(Value(registry, "magicpig_inter_token_latency_seconds_count"), 2);
  EXPECT_EQ(Value(registry, "magicpig_request_success_total{finished_reason=\"length\"}"), 1);
  EXPECT_EQ(Value(registry, "magicpig_e2e_request_latency_seconds_sum"), 1.5);
  EXPECT_DOUBLE_EQ(Value(registry, "magicpig_lsh_sampled_fraction_sum"),
                   result.stats.sampled_fraction());
  EXPECT_EQ(Value(registry, "magicpig_attn_recoveries_total"), 2);
  // Per-head budgets: cumulative buckets (le = 2^i) of 1, 3, 4, 40, 40 and 2^30 keys.
  EXPECT_EQ(Value(registry, "magicpig_attention_keys_per_head_count"), 6);
  EXPECT_EQ(Value(registry, "magicpig_attention_keys_per_head_sum"), 88.0 + (int64_t{1} << 30));
  EXPECT_EQ(Value(registry, "magicpig_attention_keys_per_head_bucket{le=\"1\"}"), 1);
  EXPECT_EQ(Value(registry, "magicpig_attention_keys_per_head_bucket{le=\"2\"}"), 1);
  EXPECT_EQ(Value(registry, "magicpig_attention_keys_per_head_bucket{le=\"4\"}"), 3);
  EXPECT_EQ(Value(registry, "magicpig_attention_keys_per_head_bucket{le=\"32\"}"), 3);
  EXPECT_EQ(Value(registry, "magicpig_attention_keys_per_head_bucket{le=\"64\"}"), 5);
  EXPECT_EQ(Value(registry, "magicpig_attention_keys_per_head_bucket{le=\"16777216\"}"), 5);
  EXPECT_EQ(Value(registry, "magicpig_attention_keys_per_head_bucket{le=\"+Inf\"}"), 6);
  EXPECT_EQ(Value(registry, "magicpig_batch_size_sum"), 4);
  EXPECT_EQ(Value(registry, "magicpig_decode_step_seconds_count"), 1);
  EXPECT_EQ(Value(registry, "magicpig_decode_phase_seconds_total{phase=\"dense\"}"), 0.003);
  EXPECT_EQ(Value(registry, "magicpig_decode_phase_seconds_total{phase=\"sampling\"}"), 0.001);
  EXPECT_EQ(Value(registry, "magicpig_decode_micro_batch_steps_total{micro_batches=\"2\"}"), 1);
  EXPECT_EQ(Value(registry, "magicpig_decode_micro_batch_steps_total{micro_batches=\"1\"}"), 0);

  // Failures: by code, every common code's series present from the start.
  EXPECT_EQ(Value(registry, "magicpig_request_failure_total{code=\"unavailable\"}"), 0);
  m.OnFailed(absl::UnavailableError("node gone"), 0.75);
  m.OnFailed(absl::UnavailableError("node gone"), 0.25);
  m.OnFailed(absl::DeadlineExceededError("slow"), 1);
  EXPECT_EQ(Value(registry, "magicpig_request_failure_total{code=\"unavailable\"}"), 2);
  EXPECT_EQ(Value(registry, "magicpig_request_failure_total{code=\"deadline_exceeded\"}"), 1);
  EXPECT_EQ(Value(registry, "magicpig_request_failure_total{code=\"internal\"}"), 0);
  EXPECT_EQ(Value(registry, "magicpig_e2e_request_latency_seconds_count"), 4);
}

TEST(ServingMetricsTest, SchedulerRunCountsEveryToken) {
  auto engine =
      testing::MakeSyntheticEngine(testing::SmallModel(2), testing::FullAttentionOptions());
  ASSERT_TRUE(engine.ok()) << engine.status();
  prometheus::Registry registry;
  ServingMetrics m(registry);
  int64_t generated = 0, prompt = 0;
  {
    engine::Scheduler scheduler(engine->get(), {.max_batch = 2, .max_queue = 4}, &m);
    absl::Mutex mu;
    int done = 0;
    for (int i = 0; i < 3; ++i) {
      engine::GenerateRequest req;
      req.prompt = (*engine)->tokenizer().Encode("request " + std::to_string(i), false);
      req.max_tokens = 7 + i;
      req.ignore_eos = true;
      prompt += static_cast<int64_t>(req.prompt.size());
      generated += req.max_tokens;
      engine::RequestCallbacks cb;
      cb.on_done = [&](absl::StatusOr<engine::GenerateResult> r) {
        EXPECT_TRUE(r.ok()) << r.status();
        absl::MutexLock lock(&mu);
        ++done;
      };
      ASSERT_TRUE(scheduler.Submit(req, cb).ok());
    }
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](int* d) { return *d == 3; }, &done));
  }
  EXPECT_EQ(Value(registry, "magicpig_prompt_tokens_total"), prompt);
  EXPECT_EQ(Value(registry, "magicpig_generation_tokens_total"), generated);
  EXPECT_EQ(Value(registry, "magicpig_time_to_first_token_seconds_count"), 3);
  EXPECT_EQ(Value(registry, "magicpig_request_success_total{finished_reason=\"length\"}"), 3);
  EXPECT_EQ(Value(registry, "magicpig_batch_size_sum"), generated);
  EXPECT_EQ(Value(registry, "magicpig_num_requests_running"), 0);
  EXPECT_EQ(Value(registry, "magicpig_num_requests_waiting"), 0);
}

}  // namespace
}  // namespace magicpig::server
