#include "gpu_node/engine/scheduler.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/synthetic_engine.h"

namespace magicpig::engine {
namespace {

std::unique_ptr<Engine> MakeEngine() {
  auto engine =
      testing::MakeSyntheticEngine(testing::SmallModel(2), testing::FullAttentionOptions());
  EXPECT_TRUE(engine.ok()) << engine.status();
  return std::move(*engine);
}

// What one request's owner sees: tokens in order, then exactly one on_done.
struct Outcome {
  absl::Mutex mu;
  std::vector<int32_t> tokens;
  std::string text;
  int done_calls = 0;
  absl::StatusOr<GenerateResult> result = absl::UnknownError("not done");

  RequestCallbacks Callbacks() {
    RequestCallbacks cb;
    cb.on_token = [this](const TokenOutput& t) {
      absl::MutexLock lock(&mu);
      if (t.token >= 0) tokens.push_back(t.token);
      text.append(t.text);
    };
    cb.on_done = [this](absl::StatusOr<GenerateResult> r) {
      absl::MutexLock lock(&mu);
      ++done_calls;
      result = std::move(r);
    };
    return cb;
  }
  void Wait() {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](int* calls) { return *calls > 0; }, &done_calls));
  }
};

// Totals of what the scheduler reported (the server turns the same calls into Prometheus
// metrics: gpu_node/server/serving_metrics_test.cc).
class CountingObserver : public SchedulerObserver {
 public:
  void OnOccupancy(int waiting, int running) override {
    absl::MutexLock lock(&mu_);
    waiting_ = waiting;
    running_ = running;
  }
  void OnDequeued(double) override {}
  void OnStarted(int64_t prompt_tokens) override {
    absl::MutexLock lock(&mu_);
    prompt_tokens_ += prompt_tokens;
  }
  void OnToken(bool first, double) override {
    absl::MutexLock lock(&mu_);
    ++(first ? first_tokens_ : later_tokens_);
  }
  void OnFinished(const GenerateResult& result, double) override {
    absl::MutexLock lock(&mu_);
    ++finished_[static_cast<int>(result.finish)];
  }
  void OnFailed(const absl::Status&, double) override {
    absl::MutexLock lock(&mu_);
    ++failed_;
  }
  void OnStep(int batch_size, double, const StepTimings&, double) override {
    absl::MutexLock lock(&mu_);
    ++steps_;
    step_sequences_ += batch_size;
  }

  int64_t prompt_tokens() const { return Read(&CountingObserver::prompt_tokens_); }
  int64_t first_tokens() const { return Read(&CountingObserver::first_tokens_); }
  int64_t later_tokens() const { return Read(&CountingObserver::later_tokens_); }
  int64_t steps() const { return Read(&CountingObserver::steps_); }
  int64_t step_sequences() const { return Read(&CountingObserver::step_sequences_); }
  int64_t waiting() const { return Read(&CountingObserver::waiting_); }
  int64_t running() const { return Read(&CountingObserver::running_); }
  int64_t failed() const { return Read(&CountingObserver::failed_); }
  int64_t finished(FinishReason reason) const {
    absl::MutexLock lock(&mu_);
    return finished_[static_cast<int>(reason)];
  }

 private:
  int64_t Read(int64_t CountingObserver::*field) const {
    absl::MutexLock lock(&mu_);
    return this->*field;
  }
  mutable absl::Mutex mu_;
  int64_t waiting_ = -1, running_ = -1, prompt_tokens_ = 0, first_tokens_ = 0, later_tokens_ = 0,
          steps_ = 0, step_sequences_ = 0, failed_ = 0;
  int64_t finished_[8] = {};
};

// Wraps `cb` so that the request's first token notifies `started` and then waits for `release`:
// the request stays running at a known point while the test arranges what it checks (the tiny
// model could otherwise finish before a loaded machine gets there).
RequestCallbacks HoldFirstToken(RequestCallbacks cb, absl::Notification* started,
                                absl::Notification* release) {
  cb.on_token = [started, release, inner = std::move(cb.on_token)](const TokenOutput& t) {
    if (!started->HasBeenNotified()) {
      started->Notify();
      release->WaitForNotification();
    }
    inner(t);
  };
  return cb;
}

GenerateRequest Request(const Engine& e, const std::string& text, int64_t max_tokens,
                        float temperature, uint64_t seed) {
  GenerateRequest req;
  req.prompt = e.tokenizer().Encode(text, false);
  req.max_tokens = max_tokens;
  req.ignore_eos = true;
  req.sampling.temperature = temperature;
  req.sampling.seed = seed;
  return req;
}

TEST(SchedulerTest, ConcurrentRequestsGetTheirOwnTokensAndMetricsCountThem) {
  auto engine = MakeEngine();
  std::vector<GenerateRequest> requests;
  std::vector<GenerateResult> alone;
  int64_t prompt_total = 0, generated_total = 0;
  for (int i = 0; i < 6; ++i) {
    requests.push_back(Request(*engine, "request number " + std::to_string(i) + " says hello",
                               20 + 3 * i, i % 2 ? 0.7f : 0.0f, 100 + i));
    auto r = engine->Generate(requests.back(), {});
    ASSERT_TRUE(r.ok());
    alone.push_back(*r);
    prompt_total += static_cast<int64_t>(requests.back().prompt.size());
    generated_total += static_cast<int64_t>(r->tokens.size());
  }
  CountingObserver observer;
  Scheduler scheduler(engine.get(), {.max_batch = 4, .max_queue = 16}, &observer);
  std::vector<std::unique_ptr<Outcome>> outcomes;
  for (const GenerateRequest& req : requests) {
    outcomes.push_back(std::make_unique<Outcome>());
    ASSERT_TRUE(scheduler.Submit(req, outcomes.back()->Callbacks()).ok());
  }
  for (size_t i = 0; i < outcomes.size(); ++i) {
    outcomes[i]->Wait();
    ASSERT_TRUE(outcomes[i]->result.ok()) << outcomes[i]->result.status();
    EXPECT_EQ(outcomes[i]->result->tokens, alone[i].tokens) << "request " << i;
    EXPECT_EQ(outcomes[i]->tokens, alone[i].tokens) << "request " << i;
    EXPECT_EQ(outcomes[i]->text, alone[i].text) << "request " << i;
    EXPECT_EQ(outcomes[i]->done_calls, 1);
  }
  scheduler.Shutdown(absl::Seconds(5));
  EXPECT_EQ(observer.prompt_tokens(), prompt_total);
  EXPECT_EQ(observer.first_tokens() + observer.later_tokens(), generated_total);
  EXPECT_EQ(observer.finished(FinishReason::kLength), 6);
  EXPECT_EQ(observer.first_tokens(), 6);
  EXPECT_EQ(observer.running(), 0);
  EXPECT_EQ(observer.waiting(), 0);
  // Decode steps ran with more than one sequence: fewer steps than tokens.
  EXPECT_GT(observer.steps(), 0);
  EXPECT_LT(observer.steps(), generated_total);
  EXPECT_EQ(observer.step_sequences(), generated_total);
}

TEST(SchedulerTest, QueueLimitCancellationErrorsAndShutdown) {
  auto engine = MakeEngine();
  CountingObserver observer;
  Scheduler scheduler(engine.get(), {.max_batch = 1, .max_queue = 2}, &observer);
  // A long request holds the only batch place; two wait; the fourth is refused. The long request
  // holds its first token until the refusal has been checked (a loaded CI machine once saw it
  // finish all 200 tokens before the fourth submission).
  Outcome first, second, third;
  absl::Notification first_started, refusal_checked;
  // A failed ASSERT below must not leave the scheduler thread held (the test would hang).
  absl::Cleanup release_first = [&refusal_checked] {
    if (!refusal_checked.HasBeenNotified()) refusal_checked.Notify();
  };
  auto h1 = scheduler.Submit(Request(*engine, "a long one", 200, 0, 1),
                             HoldFirstToken(first.Callbacks(), &first_started, &refusal_checked));
  ASSERT_TRUE(h1.ok());
  first_started.WaitForNotification();
  auto h2 = scheduler.Submit(Request(*engine, "bad", 5, -1.0f, 1), second.Callbacks());
  ASSERT_TRUE(h2.ok());  // validation errors come through on_done
  auto h3 =
      scheduler.Submit(Request(*engine, "cancelled while waiting", 5, 0, 1), third.Callbacks());
  ASSERT_TRUE(h3.ok());
  (*h3)->Cancel();
  // One running and two waiting: no room.
  Outcome refused;
  auto h4 = scheduler.Submit(Request(*engine, "no room", 5, 0, 1), refused.Callbacks());
  EXPECT_EQ(h4.status().code(), absl::StatusCode::kResourceExhausted);
  (*h1)->Cancel();
  refusal_checked.Notify();
  first.Wait();
  ASSERT_TRUE(first.result.ok());
  EXPECT_EQ(first.result->finish, FinishReason::kAbort);
  EXPECT_LT(first.tokens.size(), 200u);
  second.Wait();
  EXPECT_EQ(second.result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(observer.failed(), 1);  // the invalid request, reported as a failure
  third.Wait();
  ASSERT_TRUE(third.result.ok());
  EXPECT_EQ(third.result->finish, FinishReason::kAbort);
  EXPECT_TRUE(third.tokens.empty());

  // Shutdown with no grace aborts a running request; later submissions are refused. The request
  // holds its first token until the shutdown has begun.
  Outcome last;
  absl::Notification first_token, shutdown_begun;
  ASSERT_TRUE(scheduler
                  .Submit(Request(*engine, "cut short", 250, 0, 1),
                          HoldFirstToken(last.Callbacks(), &first_token, &shutdown_begun))
                  .ok());
  first_token.WaitForNotification();
  std::thread stopper([&scheduler] { scheduler.Shutdown(absl::ZeroDuration()); });
  while (!scheduler.stopping()) absl::SleepFor(absl::Milliseconds(1));
  shutdown_begun.Notify();
  stopper.join();
  last.Wait();
  ASSERT_TRUE(last.result.ok());
  EXPECT_EQ(last.result->finish, FinishReason::kAbort);
  EXPECT_EQ(last.done_calls, 1);
  Outcome after;
  EXPECT_EQ(scheduler.Submit(Request(*engine, "late", 5, 0, 1), after.Callbacks()).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_GE(observer.finished(FinishReason::kAbort), 3);
}

}  // namespace
}  // namespace magicpig::engine
