// The engine's device path (activations, positions and the KV cache in backend memory, weights
// prepared, logits copied out) on FakeDeviceBackend: every operation checks that it gets device
// memory and prepared weights, and the arithmetic is the CPU backend's, so the results must be
// bit-identical to the CPU backend's. This is what the CUDA backend relies on, checked without a
// GPU.
#include <algorithm>
#include <functional>
#include <memory>
#include <vector>

#include "gpu_node/backend/cpu/cpu_backend.h"
#include "gpu_node/engine/engine.h"
#include "gpu_node/engine/kv_cache.h"
#include "gpu_node/engine/scheduler.h"
#include "gpu_node/engine/transformer.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "tests/testing/fake_device_backend.h"
#include "tests/testing/synthetic_engine.h"
#include "tests/testing/synthetic_model.h"

namespace magicpig::engine {
namespace {

std::shared_ptr<const model::GgufFile> ModelFile(const testing::SyntheticModelOptions& m) {
  auto bytes = testing::BuildSyntheticModel(m);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  auto file = model::GgufFile::FromBytes(*bytes);
  EXPECT_TRUE(file.ok()) << file.status();
  return std::shared_ptr<const model::GgufFile>(*std::move(file));
}

std::unique_ptr<Engine> MakeEngine(const testing::SyntheticModelOptions& model,
                                   std::unique_ptr<backend::Backend> backend,
                                   const EngineOptions& options) {
  auto e = testing::MakeSyntheticEngine(model, options, std::move(backend));
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? *std::move(e) : nullptr;
}

class DevicePathTest : public ::testing::TestWithParam<const char*> {
 protected:
  testing::SyntheticModelOptions Model() const {
    testing::SyntheticModelOptions m = testing::SmallModel(3);
    m.architecture = GetParam();  // qwen2 adds q/k/v biases and the half-offset RoPE
    m.weight_type = GgmlType::kQ8_0;
    m.tied_embeddings = false;
    return m;
  }
};

TEST_P(DevicePathTest, ScoresAndGreedyTokensEqualTheCpuBackends) {
  auto cpu = MakeEngine(Model(), std::make_unique<backend::CpuBackend>(1),
                        testing::FullAttentionOptions());
  auto dev = MakeEngine(Model(), std::make_unique<testing::FakeDeviceBackend>(1),
                        testing::FullAttentionOptions());
  ASSERT_NE(cpu, nullptr);
  ASSERT_NE(dev, nullptr);
  const std::vector<int32_t> tokens = cpu->tokenizer().Encode(
      "the cat, the dog, the bird and the fish all went to the market to buy bread and milk",
      false);
  auto a = cpu->ScoreAll(tokens);
  auto b = dev->ScoreAll(tokens);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*a, *b);
  GenerateRequest req;
  req.prompt = tokens;
  req.max_tokens = 24;
  req.ignore_eos = true;
  auto ga = cpu->Generate(req, {});
  auto gb = dev->Generate(req, {});
  ASSERT_TRUE(ga.ok()) << ga.status();
  ASSERT_TRUE(gb.ok()) << gb.status();
  EXPECT_EQ(ga->tokens, gb->tokens);
}

// Batched decode steps (one and two micro-batches) over caches in device memory.
TEST_P(DevicePathTest, BatchedStepsEqualTheCpuBackends) {
  auto file = ModelFile(Model());
  auto weights = model::ModelWeights::Load(file);
  ASSERT_TRUE(weights.ok()) << weights.status();
  const model::ModelConfig& c = (*weights)->config();
  backend::CpuBackend cpu(1);
  testing::FakeDeviceBackend dev(1);
  Transformer tc(weights->get(), &cpu), td(weights->get(), &dev);
  ASSERT_TRUE(td.PrepareWeights().ok());
  for (int micro_batches : {1, 2}) {
    std::vector<std::unique_ptr<KvCache>> kc, kd;
    for (int i = 0; i < 3; ++i) {
      kc.push_back(*KvCache::Create(c.n_layer, c.n_head_kv, c.head_dim, 64));
      kd.push_back(*KvCache::Create(c.n_layer, c.n_head_kv, c.head_dim, 64, &dev));
      const std::vector<int32_t> prompt(5 + 7 * i, 40 + i);
      std::vector<float> la, lb;
      ASSERT_TRUE(tc.Forward(prompt, *kc.back(), {}, &la).ok());
      ASSERT_TRUE(td.Forward(prompt, *kd.back(), {}, &lb).ok());
      ASSERT_EQ(la, lb);
    }
    for (int step = 0; step < 4; ++step) {
      std::vector<DecodeItem> ic, id;
      for (int i = 0; i < 3; ++i) {
        ic.push_back({100 + step + i, kc[i].get(), nullptr});
        id.push_back({100 + step + i, kd[i].get(), nullptr});
      }
      std::vector<float> la, lb;
      ASSERT_TRUE(tc.ForwardBatch(ic, &la, nullptr, micro_batches).ok());
      const absl::Status s = td.ForwardBatch(id, &lb, nullptr, micro_batches);
      ASSERT_TRUE(s.ok()) << s;
      ASSERT_EQ(la, lb) << "micro-batches " << micro_batches << " step " << step;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, DevicePathTest, ::testing::Values("llama", "qwen2"));

TEST(DevicePathTest, KvCacheLivesInDeviceMemory) {
  testing::FakeDeviceBackend dev(1);
  {
    auto kv = KvCache::Create(3, 2, 16, 100, &dev);
    ASSERT_TRUE(kv.ok()) << kv.status();
    EXPECT_EQ(dev.bytes_in_use(), (*kv)->bytes());
    EXPECT_EQ((*kv)->ResidentBytes(), (*kv)->bytes());
    EXPECT_EQ((*kv)->Release(0, 0, 100), 0);  // device memory stays until the cache goes
  }
  EXPECT_EQ(dev.bytes_in_use(), 0);
}

// Sparse attention on a device backend: the prefill's offloaded keys are centred and hashed on the
// device (PlanOffloadCodes), the queries hashed and the static window attended there
// (PlanDeviceWork), the router offloads from the cache's host mirror and merges: the tokens and
// log-probabilities equal the CPU backend's, embedded MagicPIG.
TEST(DevicePathTest, MagicPigThroughTheHostMirrorEqualsTheCpuBackends) {
  EngineOptions options;  // MagicPIG by default
  options.attention.n_sinks = 4;
  options.attention.n_local = 8;
  options.attention.min_offload_keys = 1;  // short test prompts
  options.num_threads = 1;
  auto cpu = MakeEngine(testing::SmallModel(3), std::make_unique<backend::CpuBackend>(1), options);
  auto device = std::make_unique<testing::FakeDeviceBackend>(1);
  testing::FakeDeviceBackend* fake = device.get();
  auto dev = MakeEngine(testing::SmallModel(3), std::move(device), options);
  ASSERT_NE(cpu, nullptr);
  ASSERT_NE(dev, nullptr);
  GenerateRequest req;
  req.prompt = cpu->tokenizer().Encode(
      "a long prompt about many things: the cat, the dog, the bird and the fish all went to the "
      "market to buy bread and milk and honey for the winter",
      false);
  req.max_tokens = 24;
  req.ignore_eos = true;
  req.top_logprobs = 0;  // the chosen token's log-probability: any change in the logits shows
  auto a = cpu->Generate(req, {});
  auto b = dev->Generate(req, {});
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_GT(a->stats.attention_keys_offloaded, 0);  // the sparse path really ran
  EXPECT_EQ(a->stats.attention_keys_touched, b->stats.attention_keys_touched);
  EXPECT_EQ(a->tokens, b->tokens);
  // The queries were hashed and the static windows attended on the device, and so were the keys
  // each sparse layer's prefill offloaded (one call per sparse layer).
  const std::vector<bool> dense = DenseLayers(dev->config().n_layer, options.attention);
  EXPECT_EQ(fake->offload_key_codes_calls(), std::count(dense.begin(), dense.end(), false));
  // --no-device-key-codes: the host hashes them, with the same result.
  options.attention.device_key_codes = false;
  auto device2 = std::make_unique<testing::FakeDeviceBackend>(1);
  testing::FakeDeviceBackend* fake2 = device2.get();
  auto dev2 = MakeEngine(testing::SmallModel(3), std::move(device2), options);
  ASSERT_NE(dev2, nullptr);
  auto c = dev2->Generate(req, {});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(fake2->offload_key_codes_calls(), 0);
  EXPECT_EQ(a->tokens, c->tokens);
  ASSERT_EQ(a->logprobs.size(), c->logprobs.size());
  for (size_t i = 0; i < a->logprobs.size(); ++i) {
    EXPECT_EQ(a->logprobs[i].logprob, c->logprobs[i].logprob) << "token " << i;
  }
  EXPECT_GT(fake->simhash_calls(), 0);
  EXPECT_EQ(fake->range_attention_calls(), fake->simhash_calls());
  ASSERT_EQ(a->logprobs.size(), b->logprobs.size());
  for (size_t i = 0; i < a->logprobs.size(); ++i) {
    EXPECT_EQ(a->logprobs[i].logprob, b->logprobs[i].logprob) << "token " << i;
  }
}

// Offloading that begins during decode (the prompt is shorter than the offload depth): before it,
// the hooked layers' rows reach the host mirror without a wait of their own; the first offload
// reads them, with no local window the step's own row too (the fake device poisons rows not yet
// delivered), and the tokens and log-probabilities still equal the CPU backend's.
TEST(DevicePathTest, OffloadStartingDuringDecodeEqualsTheCpuBackends) {
  EngineOptions options;
  options.attention.n_sinks = 4;
  options.attention.n_local = 0;
  options.num_threads = 1;
  auto cpu = MakeEngine(testing::SmallModel(3), std::make_unique<backend::CpuBackend>(1), options);
  ASSERT_NE(cpu, nullptr);
  GenerateRequest req;
  req.prompt = cpu->tokenizer().Encode("the cat and the dog went to the market for bread", false);
  const int64_t prompt = static_cast<int64_t>(req.prompt.size());
  // Offload once the cache holds prompt + 10 tokens: the 11th decode step.
  options.attention.min_offload_keys =
      prompt + 10 - options.attention.n_sinks - options.attention.n_local;
  ASSERT_GT(options.attention.min_offload_keys, prompt - options.attention.n_sinks);
  cpu = MakeEngine(testing::SmallModel(3), std::make_unique<backend::CpuBackend>(1), options);
  auto dev =
      MakeEngine(testing::SmallModel(3), std::make_unique<testing::FakeDeviceBackend>(1), options);
  ASSERT_NE(cpu, nullptr);
  ASSERT_NE(dev, nullptr);
  req.max_tokens = 24;
  req.ignore_eos = true;
  req.top_logprobs = 0;
  auto a = cpu->Generate(req, {});
  auto b = dev->Generate(req, {});
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_GT(a->stats.attention_keys_offloaded, 0);  // it offloaded, during decode
  EXPECT_EQ(a->stats.attention_keys_touched, b->stats.attention_keys_touched);
  EXPECT_EQ(a->tokens, b->tokens);
  ASSERT_EQ(a->logprobs.size(), b->logprobs.size());
  for (size_t i = 0; i < a->logprobs.size(); ++i) {
    EXPECT_EQ(a->logprobs[i].logprob, b->logprobs[i].logprob) << "token " << i;
  }
}

// Below the offload depth no layer is sparse: a decode step waits for the device once (the
// logits), not once or twice per hooked layer for copies nobody reads yet. Two generations that
// differ by 8 decode steps differ by 8 waits.
TEST(DevicePathTest, DecodeBelowTheOffloadDepthWaitsOncePerStep) {
  EngineOptions options;  // MagicPIG by default
  options.attention.min_offload_keys = 100000;
  options.num_threads = 1;
  auto device = std::make_unique<testing::FakeDeviceBackend>(1);
  testing::FakeDeviceBackend* fake = device.get();
  auto dev = MakeEngine(testing::SmallModel(3), std::move(device), options);
  ASSERT_NE(dev, nullptr);
  GenerateRequest req;
  req.prompt = dev->tokenizer().Encode("the cat and the dog went to the market", false);
  req.ignore_eos = true;
  std::vector<int64_t> waits;
  for (int tokens : {4, 12}) {
    req.max_tokens = tokens;
    const int64_t before = fake->waits();
    auto r = dev->Generate(req, {});
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->tokens.size(), static_cast<size_t>(tokens));
    EXPECT_EQ(r->stats.attention_keys_offloaded, 0);
    waits.push_back(fake->waits() - before);
  }
  EXPECT_EQ(waits[1] - waits[0], 8);
}

double GaugeValue(prometheus::Registry& registry, const std::string& name, const std::string& label,
                  const std::string& value) {
  for (const prometheus::MetricFamily& f : registry.Collect()) {
    if (f.name != name) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      for (const prometheus::ClientMetric::Label& l : m.label) {
        if (l.name == label && l.value == value) return m.gauge.value;
      }
    }
  }
  ADD_FAILURE() << "no " << name << "{" << label << "=" << value << "}";
  return -1;
}

// The memory gauges follow the live sequences: the device cache, and with MagicPIG its host
// mirror, from Start until the sequence is destroyed.
TEST(DevicePathTest, MemoryGaugesFollowTheLiveCaches) {
  prometheus::Registry registry;
  EngineOptions options;  // MagicPIG: the device cache gets a host mirror
  options.attention.n_sinks = 4;
  options.attention.n_local = 8;
  options.attention.min_offload_keys = 1;  // short test prompts
  options.metrics_registry = &registry;
  auto device = std::make_unique<testing::FakeDeviceBackend>(1);
  testing::FakeDeviceBackend* fake = device.get();
  auto e = MakeEngine(testing::SmallModel(3), std::move(device), options);
  ASSERT_NE(e, nullptr);
  e->RefreshMemoryMetrics();
  const double idle = GaugeValue(registry, "magicpig_gpu_memory_bytes", "kind", "in_use");
  EXPECT_EQ(idle, static_cast<double>(fake->bytes_in_use()));
  EXPECT_EQ(GaugeValue(registry, "magicpig_kv_cache_bytes", "memory", "gpu"), 0);
  GenerateRequest req;
  req.prompt = std::vector<int32_t>(200, 100);
  req.max_tokens = 4;
  auto seq = e->Start(req, {});
  ASSERT_TRUE(seq.ok()) << seq.status();
  e->RefreshMemoryMetrics();
  // Capacity 204 tokens x 3 layers x (K, V) x 2 heads x 16 dims x 2 bytes. On the device, the one
  // sparse layer (dense layers {0, 1}) dropped its offloaded positions [4, 192) (sinks 4, local 8)
  // once the prefill left it: 188 rows of 64 bytes, K and V. The host mirror gave the whole pages
  // among those rows back (the shards hold them).
  const double cache = 204.0 * 3 * 2 * 2 * 16 * 2;
  const double dropped = 2.0 * 188 * 64;
  EXPECT_EQ(GaugeValue(registry, "magicpig_kv_cache_bytes", "memory", "gpu"), cache - dropped);
  const double host = GaugeValue(registry, "magicpig_kv_cache_bytes", "memory", "host");
  EXPECT_LT(host, cache);
  EXPECT_GE(host, cache - dropped);
  EXPECT_GE(GaugeValue(registry, "magicpig_gpu_memory_bytes", "kind", "in_use"),
            idle + cache - dropped);
  seq->reset();
  e->RefreshMemoryMetrics();
  EXPECT_EQ(GaugeValue(registry, "magicpig_kv_cache_bytes", "memory", "gpu"), 0);
  EXPECT_EQ(GaugeValue(registry, "magicpig_kv_cache_bytes", "memory", "host"), 0);
}

// What a scheduler over `e` made of `requests` (submitted at once, waited for): each one's
// outcome, how many finished and how many were refused for capacity, and the largest value of
// `usage` read at any token.
struct QueuedRun {
  std::vector<absl::Status> results;
  int ok = 0, exhausted = 0;
  int64_t peak = 0;
};
QueuedRun RunQueued(Engine* e, const std::vector<GenerateRequest>& requests,
                    const std::function<int64_t()>& usage) {
  absl::Mutex mu;
  QueuedRun run;
  Scheduler scheduler(e, SchedulerOptions{8, 64}, nullptr);  // stopped before mu and run go
  for (const GenerateRequest& req : requests) {
    RequestCallbacks cb;
    cb.on_token = [&](const TokenOutput&) {
      absl::MutexLock lock(&mu);
      run.peak = std::max(run.peak, usage());
    };
    cb.on_done = [&](absl::StatusOr<GenerateResult> r) {
      absl::MutexLock lock(&mu);
      run.results.push_back(r.status());
    };
    EXPECT_TRUE(scheduler.Submit(req, std::move(cb)).ok());
  }
  {
    struct Waiting {
      const std::vector<absl::Status>* results;
      size_t n;
    } waiting{&run.results, requests.size()};
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](Waiting* w) { return w->results->size() == w->n; }, &waiting));
  }
  for (const absl::Status& r : run.results) {
    run.ok += r.ok();
    run.exhausted += absl::IsResourceExhausted(r);
  }
  return run;
}

// --gpu-kv-budget: requests whose caches do not fit beside the running ones wait in the queue
// (all finish, and the device KV never exceeds the budget); one that can never fit fails.
TEST(DevicePathTest, GpuKvBudgetQueuesWhatDoesNotFit) {
  const auto model = testing::SmallModel(3);  // 3 layers, 2 KV heads of 16 dims
  const int64_t prompt = 20, max_tokens = 8;
  const int64_t one = KvCache::BytesFor(3, 2, 16, prompt + max_tokens);
  EngineOptions options = testing::FullAttentionOptions();
  options.gpu_kv_budget = one + one / 2;  // room for one sequence at a time
  auto e = MakeEngine(model, std::make_unique<testing::FakeDeviceBackend>(1), options);
  ASSERT_NE(e, nullptr);
  std::vector<GenerateRequest> requests(4);
  for (int i = 0; i < 4; ++i) {
    requests[i].prompt = std::vector<int32_t>(i < 3 ? prompt : 100, 50 + i);  // the last: too big
    requests[i].max_tokens = max_tokens;
    requests[i].ignore_eos = true;
  }
  const QueuedRun run =
      RunQueued(e.get(), requests, [&] { return e->kv_accounting().device_bytes.load(); });
  EXPECT_EQ(run.ok, 3);
  EXPECT_EQ(run.exhausted, 1);
  EXPECT_EQ(run.peak, one);  // one at a time, never over the budget
}

// --host-kv-budget, on the CPU backend with embedded MagicPIG shards: each request is charged its
// cache and shards at its capacity (at least what it really takes: the shards' measured bytes
// plus the cache's), requests that do not fit beside the running ones wait in the queue (all
// finish, the charge never exceeds the budget, and it is all given back when they finish), and
// one that can never fit fails with RESOURCE_EXHAUSTED naming the flag.
TEST(DevicePathTest, HostKvBudgetQueuesWhatDoesNotFit) {
  const auto model = testing::SmallModel(3);  // 3 layers (one sparse), 2 KV heads of 16 dims
  const int64_t prompt = 40, max_tokens = 8;
  EngineOptions options;  // MagicPIG, embedded
  options.attention.n_sinks = 4;
  options.attention.n_local = 8;
  options.attention.min_offload_keys = 1;
  options.num_threads = 1;
  std::vector<GenerateRequest> requests(4);
  for (int i = 0; i < 4; ++i) {
    // The last one too big (the synthetic model's context is 256).
    requests[i].prompt = std::vector<int32_t>(i < 3 ? prompt : 240, 50 + i);
    requests[i].max_tokens = max_tokens;
    requests[i].ignore_eos = true;
  }
  int64_t one = 0;
  {
    auto probe = MakeEngine(model, std::make_unique<backend::CpuBackend>(1), options);
    ASSERT_NE(probe, nullptr);
    one = probe->HostBytesFor(requests[0]);
    auto r = probe->Generate(requests[0], {});
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_GT(r->stats.attention_shard_bytes, 0);  // the shards were built
    EXPECT_GE(one,
              r->stats.attention_shard_bytes + KvCache::BytesFor(3, 2, 16, prompt + max_tokens));
  }
  options.host_kv_budget = one + one / 4;  // room for one sequence at a time
  auto e = MakeEngine(model, std::make_unique<backend::CpuBackend>(1), options);
  ASSERT_NE(e, nullptr);
  ASSERT_GT(e->HostBytesFor(requests[3]), options.host_kv_budget);
  const QueuedRun run = RunQueued(e.get(), requests, [&] { return e->host_reserved_bytes(); });
  EXPECT_EQ(run.ok, 3);
  EXPECT_EQ(run.exhausted, 1);
  for (const absl::Status& r : run.results) {
    if (absl::IsResourceExhausted(r)) {
      EXPECT_NE(r.message().find("--host-kv-budget"), r.message().npos);
    }
  }
  EXPECT_EQ(run.peak, one);  // one at a time, never over the budget
  e->DrainReleases();
  EXPECT_EQ(e->host_reserved_bytes(), 0);
}

// The fake itself: host memory handed to an operation fails the batch, as a GPU would fault.
TEST(DevicePathTest, FakeDeviceRefusesHostMemory) {
  testing::FakeDeviceBackend dev(1);
  std::vector<float> host(64, 1.0f), w(64, 1.0f);
  ASSERT_TRUE(dev.PrepareVector(w.data(), 64).ok());
  auto out = dev.Allocate(64 * 4);
  ASSERT_TRUE(out.ok());
  const absl::Status s = dev.Execute([&] {
    dev.RmsNorm(host.data(), w.data(), 1, 64, 1e-5f, out->as<float>());
    return absl::OkStatus();
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
}

}  // namespace
}  // namespace magicpig::engine
