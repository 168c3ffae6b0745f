#include "gpu_node/engine/engine.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/synthetic_engine.h"

namespace magicpig::engine {

using ::magicpig::attention::KvStorage;
namespace {

SparseAttentionOptions FullAttention() {
  SparseAttentionOptions a;
  a.mode = attention::EstimatorKind::kFull;
  return a;
}

std::unique_ptr<Engine> MakeEngine(int64_t context_length = 0, int64_t prefill_chunk = 256,
                                   SparseAttentionOptions attention = FullAttention(),
                                   int64_t n_layer = 2) {
  testing::SyntheticModelOptions o = testing::SmallModel(n_layer);
  o.context_length = 128;
  EngineOptions options;
  options.context_length = context_length;
  options.prefill_chunk = prefill_chunk;
  options.attention = attention;
  auto engine = testing::MakeSyntheticEngine(o, options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return std::move(*engine);
}

// Long enough (> 30 tokens) for the small windows below to offload most of it.
constexpr char kLongPrompt[] =
    "a long prompt about many things: the cat, the dog, the bird and the fish all went to the "
    "market to buy bread and milk and honey for the winter";

// The sparse decode path end to end on a synthetic model (layer 1 sparse): with top-k at a budget
// covering every offloaded key and fp32 shards, each step is exact attention split into the static
// window (backend) and the shard (attention core, centred keys) merged by LSE, so the greedy tokens
// equal the full-attention run's. A small window budget makes generated tokens overflow into the
// shards' append segment several times. MagicPIG itself must run and sample a fraction of keys.
// MagicPIG (4, 8) over all but layer 0, with a window small enough that a short prompt offloads.
SparseAttentionOptions SmallMagicPig() {
  SparseAttentionOptions pig;
  pig.dense_layers = {0};
  pig.lsh_k = 4;
  pig.lsh_l = 8;
  pig.n_local = 8;
  pig.window_budget = 12;
  // Short test prompts: sample from the first offloaded key (serving waits for
  // SparseAttentionOptions::kDefaultMinOffloadKeys).
  pig.min_offload_keys = 1;
  return pig;
}

TEST(EngineTest, SparseDecodeSplitAndMergeIsExact) {
  SparseAttentionOptions exact;
  exact.mode = attention::EstimatorKind::kTopK;
  exact.budget = 1 << 20;
  exact.dense_layers = {0};
  exact.n_local = 8;
  exact.window_budget = 12;
  exact.min_offload_keys = 1;
  exact.storage = KvStorage::kF32;
  exact.shard_block = 16;  // several blocks, merged in order
  auto full = MakeEngine();
  auto split = MakeEngine(0, 256, exact);
  GenerateRequest req;
  req.prompt = full->tokenizer().Encode(kLongPrompt, false);
  ASSERT_GT(req.prompt.size(), 30u);
  req.max_tokens = 40;
  req.ignore_eos = true;
  auto a = full->Generate(req, {});
  auto b = split->Generate(req, {});
  ASSERT_TRUE(a.ok() && b.ok()) << b.status();
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_EQ(a->stats.attention_keys_offloaded, 0);
  EXPECT_GT(b->stats.attention_keys_offloaded, 0);
  EXPECT_EQ(b->stats.attention_keys_touched, b->stats.attention_keys_offloaded);  // budget >= n

  const SparseAttentionOptions pig = SmallMagicPig();
  auto sparse = MakeEngine(0, 256, pig);
  auto c = sparse->Generate(req, {});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tokens.size(), a->tokens.size());  // up to the context length
  EXPECT_GT(c->stats.attention_keys_offloaded, 0);
  EXPECT_GT(c->stats.sampled_fraction(), 0.0);
  EXPECT_LT(c->stats.sampled_fraction(), 1.0);
  EXPECT_GT(c->stats.attention_shard_bytes, 0);
}

// A sparse layer stays exact until its offloaded region holds min_offload_keys keys: with the
// threshold above the prompt's region the first steps are exact attention (the tokens of the full
// run, nothing offloaded), and the step at which the region reaches it starts sampling; with a
// threshold never reached the whole run is the full run.
TEST(EngineTest, LayersStayExactUntilTheRegionHoldsMinOffloadKeys) {
  auto full = MakeEngine();
  GenerateRequest req;
  req.prompt = full->tokenizer().Encode(kLongPrompt, false);
  SparseAttentionOptions later = SmallMagicPig();
  const int64_t region = static_cast<int64_t>(req.prompt.size()) - later.n_sinks - later.n_local;
  ASSERT_GT(region, 20);
  req.max_tokens = 40;
  req.ignore_eos = true;
  auto exact = full->Generate(req, {});
  ASSERT_TRUE(exact.ok()) << exact.status();

  later.min_offload_keys = region + 10;  // reached by the 10th decode step
  auto a = MakeEngine(0, 256, later)->Generate(req, {});
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->tokens.size(), exact->tokens.size());
  EXPECT_TRUE(std::equal(a->tokens.begin(), a->tokens.begin() + 10, exact->tokens.begin()));
  EXPECT_GT(a->stats.attention_keys_offloaded, 0);
  EXPECT_GT(a->stats.sampled_fraction(), 0.0);
  EXPECT_LT(a->stats.sampled_fraction(), 1.0);

  SparseAttentionOptions never = SmallMagicPig();
  never.min_offload_keys = int64_t{1} << 30;
  auto b = MakeEngine(0, 256, never)->Generate(req, {});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->tokens, exact->tokens);
  EXPECT_EQ(b->stats.attention_keys_offloaded, 0);
}

// The offload overlapped with the next layers' prefill (the default) hands the shards the same
// rows as one done before OnLayerStored returns: the same tokens and the same sample sizes, on
// four layers (three sparse, each offload overlapping the next layer), with prefill in one chunk
// and in chunks of 16 tokens, and with the window overflowing during decode.
TEST(EngineTest, OverlappedOffloadChangesNoToken) {
  for (int64_t chunk : {256, 16}) {
    SparseAttentionOptions overlapped = SmallMagicPig();
    SparseAttentionOptions in_place = overlapped;
    in_place.overlap_offload = false;
    ASSERT_TRUE(overlapped.overlap_offload);  // the default
    auto a_engine = MakeEngine(0, chunk, overlapped, 4);
    auto b_engine = MakeEngine(0, chunk, in_place, 4);
    GenerateRequest req;
    req.prompt = a_engine->tokenizer().Encode(kLongPrompt, false);
    req.max_tokens = 30;
    req.ignore_eos = true;
    auto a = a_engine->Generate(req, {});
    auto b = b_engine->Generate(req, {});
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
    EXPECT_EQ(a->tokens, b->tokens) << chunk;
    EXPECT_GT(a->stats.attention_keys_offloaded, 0);
    EXPECT_EQ(a->stats.attention_keys_offloaded, b->stats.attention_keys_offloaded) << chunk;
    EXPECT_EQ(a->stats.attention_keys_touched, b->stats.attention_keys_touched) << chunk;
  }
}

// Phase timers: off they read no clock (all zero); on they time every sparse decode step, and
// the tokens do not change.
TEST(EngineTest, PhaseTimersAreOffByDefaultAndChangeNoToken) {
  const SparseAttentionOptions pig = SmallMagicPig();
  SparseAttentionOptions timed = pig;
  timed.time_phases = true;
  auto quiet = MakeEngine(0, 256, pig);
  auto loud = MakeEngine(0, 256, timed);
  GenerateRequest req;
  req.prompt = quiet->tokenizer().Encode(
      "the phases of a sparse decode step: hashing, the window, the shards and the merge of the "
      "two parts, timed only when asked",
      false);
  req.max_tokens = 12;
  req.ignore_eos = true;
  auto a = quiet->Generate(req, {});
  auto b = loud->Generate(req, {});
  ASSERT_TRUE(a.ok() && b.ok()) << b.status();
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_EQ(a->stats.attention_phases.total(), 0);
  EXPECT_EQ(quiet->TakeEstimatorPhaseStats().kernel, 0);
  const AttentionPhaseSeconds& p = b->stats.attention_phases;
  EXPECT_GT(p.hash, 0);
  EXPECT_GT(p.window, 0);
  EXPECT_GT(p.shards, 0);
  EXPECT_GT(p.merge, 0);
  const attention::AttentionRunner::PhaseStats est = loud->TakeEstimatorPhaseStats();
  EXPECT_GT(est.retrieve, 0);
  EXPECT_GT(est.kernel, 0);
  // A group's union holds at least 1/g of its g heads' samples and at most all of them; every
  // group lookup reads at least its offsets' line in each table, a run or part of one.
  const int64_t g = loud->config().n_head / loud->config().n_head_kv;
  EXPECT_GE(est.union_rows, b->stats.attention_keys_touched / g);
  EXPECT_LE(est.union_rows, b->stats.attention_keys_touched);
  EXPECT_GT(est.bucket_runs, 0);
  EXPECT_GE(est.bucket_lines, est.bucket_runs);
  const attention::AttentionRunner::PhaseStats taken = loud->TakeEstimatorPhaseStats();
  EXPECT_EQ(taken.kernel, 0);  // taken: zeroed
  EXPECT_EQ(taken.union_rows, 0);
  EXPECT_EQ(taken.bucket_lines, 0);
}

TEST(EngineTest, GreedyIsDeterministicAndRespectsMaxTokens) {
  auto e = MakeEngine();
  GenerateRequest req;
  req.prompt = e->tokenizer().Encode("hello world", false);
  req.max_tokens = 12;
  req.ignore_eos = true;
  auto a = e->Generate(req, {});
  auto b = e->Generate(req, {});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->tokens.size(), 12u);
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_EQ(a->finish, FinishReason::kLength);
  EXPECT_EQ(a->stats.prompt_tokens, static_cast<int64_t>(req.prompt.size()));
  EXPECT_EQ(a->stats.generated_tokens, 12);
}

TEST(EngineTest, DecodeStepsMatchTeacherForcedLogits) {
  // Greedy tokens from incremental decoding equal the argmax of a one-shot forward over the
  // prompt + generated tokens (KV cache consistency, chunked prefill included).
  auto e = MakeEngine(0, /*prefill_chunk=*/3);
  GenerateRequest req;
  req.prompt = e->tokenizer().Encode("the quick brown fox", false);
  req.max_tokens = 10;
  req.ignore_eos = true;
  auto r = e->Generate(req, {});
  ASSERT_TRUE(r.ok());
  std::vector<int32_t> all = req.prompt;
  all.insert(all.end(), r->tokens.begin(), r->tokens.end() - 1);
  auto logits = e->ScoreAll(all);
  ASSERT_TRUE(logits.ok());
  const int64_t v = e->config().n_vocab, n = static_cast<int64_t>(req.prompt.size());
  for (size_t i = 0; i < r->tokens.size(); ++i) {
    absl::Span<const float> row(logits->data() + (n - 1 + i) * v, v);
    EXPECT_EQ(Argmax(row), r->tokens[i]) << "step " << i;
  }
}

TEST(EngineTest, StopStringEndsGenerationAndIsCut) {
  auto e = MakeEngine();
  GenerateRequest req;
  req.prompt = e->tokenizer().Encode("hello", false);
  req.max_tokens = 20;
  req.ignore_eos = true;
  auto full = e->Generate(req, {});
  ASSERT_TRUE(full.ok());
  ASSERT_GE(full->text.size(), 4u);
  // Stop on a piece of what greedy decoding produces anyway.
  const std::string stop = full->text.substr(2, 2);
  req.stop = {stop};
  std::string streamed;
  GenerateCallbacks cb;
  cb.on_text = [&](std::string_view s) { streamed.append(s.data(), s.size()); };
  auto cut = e->Generate(req, cb);
  ASSERT_TRUE(cut.ok());
  EXPECT_EQ(cut->finish, FinishReason::kStop);
  EXPECT_EQ(cut->text, full->text.substr(0, full->text.find(stop)));
  EXPECT_EQ(streamed, cut->text);
}

TEST(EngineTest, RejectsBadRequests) {
  auto e = MakeEngine(/*context_length=*/16);
  GenerateRequest req;
  EXPECT_EQ(e->Generate(req, {}).status().code(), absl::StatusCode::kInvalidArgument);
  req.prompt = std::vector<int32_t>(16, 5);
  EXPECT_EQ(e->Generate(req, {}).status().code(), absl::StatusCode::kOutOfRange);
  req.prompt = {5, 100000};
  EXPECT_EQ(e->Generate(req, {}).status().code(), absl::StatusCode::kInvalidArgument);
  req.prompt = {5, 6};
  req.sampling.top_p = 2.0f;
  EXPECT_EQ(e->Generate(req, {}).status().code(), absl::StatusCode::kInvalidArgument);
  // A valid request still works afterwards.
  req.sampling = SamplingParams{};
  req.max_tokens = 3;
  EXPECT_TRUE(e->Generate(req, {}).ok());
}

TEST(EngineTest, ContextLengthCapsGeneration) {
  auto e = MakeEngine(/*context_length=*/10);
  GenerateRequest req;
  req.prompt = {5, 6, 7, 8};
  req.max_tokens = 100;
  req.ignore_eos = true;
  auto r = e->Generate(req, {});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->tokens.size(), 7u);  // 4 prompt + 6 cached positions, the 7th token needs no cache
  EXPECT_EQ(r->finish, FinishReason::kLength);
}

// Continuous batching: sequences of different lengths, started at different steps and finishing
// at different steps, decoded together with Step, give each sequence the tokens it gets alone —
// with exact attention and with the sparse (top-k at full budget, exact) router alike.
TEST(EngineTest, BatchedStepsGiveEachSequenceItsOwnTokens) {
  SparseAttentionOptions exact;
  exact.mode = attention::EstimatorKind::kTopK;
  exact.budget = 1 << 20;
  exact.dense_layers = {0};
  exact.n_local = 4;
  exact.window_budget = 8;
  exact.min_offload_keys = 1;
  exact.storage = KvStorage::kF32;
  for (const SparseAttentionOptions& attention : {FullAttention(), exact}) {
    auto e = MakeEngine(0, 256, attention);
    const std::vector<std::string> texts = {
        "the cat sat on the mat and looked at the bird in the tree",
        "hello",
        "one two three four five six seven eight nine ten eleven twelve",
        "a b c d e f g",
    };
    std::vector<GenerateRequest> requests;
    std::vector<std::vector<int32_t>> alone;
    for (size_t i = 0; i < texts.size(); ++i) {
      GenerateRequest req;
      req.prompt = e->tokenizer().Encode(texts[i], false);
      req.max_tokens = 6 + 5 * static_cast<int64_t>(i);
      req.ignore_eos = true;
      req.sampling.temperature = i % 2 == 0 ? 0.0f : 0.8f;
      req.sampling.seed = 7 + i;
      auto r = e->Generate(req, {});
      ASSERT_TRUE(r.ok()) << r.status();
      requests.push_back(req);
      alone.push_back(r->tokens);
    }
    // Sequence i joins the batch at step 2 * i.
    std::vector<std::unique_ptr<Sequence>> running;
    std::vector<std::vector<int32_t>> streamed(texts.size());
    for (int step = 0; step < 100; ++step) {
      if (step % 2 == 0 && static_cast<size_t>(step / 2) < requests.size()) {
        const size_t i = static_cast<size_t>(step / 2);
        GenerateCallbacks cb;
        cb.on_token = [&streamed, i](const TokenOutput& t) {
          if (t.token >= 0) streamed[i].push_back(t.token);
        };
        auto seq = e->Start(requests[i], cb);
        ASSERT_TRUE(seq.ok()) << seq.status();
        running.push_back(std::move(*seq));
      }
      std::vector<Sequence*> batch;
      for (auto& s : running) batch.push_back(s.get());
      ASSERT_TRUE(e->Step(batch).ok());
    }
    ASSERT_EQ(running.size(), requests.size());
    for (size_t i = 0; i < running.size(); ++i) {
      ASSERT_TRUE(running[i]->finished());
      EXPECT_EQ(running[i]->result().tokens, alone[i]) << "sequence " << i;
      EXPECT_EQ(streamed[i], alone[i]) << "sequence " << i;
      EXPECT_EQ(running[i]->result().finish, FinishReason::kLength);
    }
  }
}

// Log-probabilities against an independent computation in float64 from ScoreAll's logits: the
// prompt's (teacher forced, for echo) and the generated tokens', with the top alternatives sorted
// and the greedy token's value identical to the top entry's.
TEST(EngineTest, LogprobsMatchLogSoftmaxOfTheLogits) {
  auto e = MakeEngine();
  GenerateRequest req;
  req.prompt = e->tokenizer().Encode("the quick brown fox jumps", false);
  req.max_tokens = 4;
  req.ignore_eos = true;
  req.top_logprobs = 3;
  req.prompt_logprobs = true;
  auto r = e->Generate(req, {});
  ASSERT_TRUE(r.ok()) << r.status();
  const int64_t n = static_cast<int64_t>(req.prompt.size());
  ASSERT_EQ(r->prompt_logprobs.size(), static_cast<size_t>(n - 1));
  ASSERT_EQ(r->logprobs.size(), 4u);
  std::vector<int32_t> all = req.prompt;
  all.insert(all.end(), r->tokens.begin(), r->tokens.end() - 1);
  auto logits = e->ScoreAll(all);
  ASSERT_TRUE(logits.ok());
  const int64_t v = e->config().n_vocab;
  auto log_softmax = [&](int64_t row, int32_t token) {
    const float* x = logits->data() + row * v;
    double max = x[0];
    for (int64_t j = 0; j < v; ++j) max = std::max<double>(max, x[j]);
    double sum = 0;
    for (int64_t j = 0; j < v; ++j) sum += std::exp(x[j] - max);
    return x[token] - max - std::log(sum);
  };
  for (int64_t p = 0; p + 1 < n; ++p) {
    const TokenLogprob& lp = r->prompt_logprobs[p];
    EXPECT_EQ(lp.token, req.prompt[p + 1]);
    EXPECT_NEAR(lp.logprob, log_softmax(p, lp.token), 1e-4) << "prompt position " << p + 1;
    ASSERT_EQ(lp.top.size(), 3u);
    EXPECT_GE(lp.top[0].second, lp.top[1].second);
    EXPECT_GE(lp.top[1].second, lp.top[2].second);
    EXPECT_EQ(lp.top[0].first, Argmax(absl::MakeConstSpan(logits->data() + p * v, v)));
  }
  for (size_t i = 0; i < r->logprobs.size(); ++i) {
    const TokenLogprob& lp = r->logprobs[i];
    EXPECT_EQ(lp.token, r->tokens[i]);
    EXPECT_NEAR(lp.logprob, log_softmax(n - 1 + i, lp.token), 1e-4);
    ASSERT_EQ(lp.top.size(), 3u);
    EXPECT_EQ(lp.top[0].first, lp.token);     // greedy
    EXPECT_EQ(lp.top[0].second, lp.logprob);  // the very same float
  }
}

TEST(EngineTest, AbortAndZeroMaxTokens) {
  auto e = MakeEngine();
  GenerateRequest req;
  req.prompt = e->tokenizer().Encode("hello world", false);
  req.max_tokens = 0;
  req.prompt_logprobs = true;
  req.top_logprobs = 0;
  auto seq = e->Start(req, {});
  ASSERT_TRUE(seq.ok()) << seq.status();
  EXPECT_TRUE((*seq)->finished());
  EXPECT_EQ((*seq)->result().finish, FinishReason::kLength);
  EXPECT_TRUE((*seq)->result().tokens.empty());
  EXPECT_EQ((*seq)->result().prompt_logprobs.size(), req.prompt.size() - 1);

  req.max_tokens = 50;
  req.ignore_eos = true;
  auto running = e->Start(req, {});
  ASSERT_TRUE(running.ok());
  Sequence* batch[1] = {running->get()};
  ASSERT_TRUE(e->Step(batch).ok());
  ASSERT_TRUE(e->Step(batch).ok());
  (*running)->Abort();
  EXPECT_TRUE((*running)->finished());
  EXPECT_EQ((*running)->result().finish, FinishReason::kAbort);
  EXPECT_EQ((*running)->result().tokens.size(), 2u);
  ASSERT_TRUE(e->Step(batch).ok());  // a finished sequence is skipped
  EXPECT_EQ((*running)->result().tokens.size(), 2u);
}

}  // namespace
}  // namespace magicpig::engine
