// The estimator registry against its contract: one entry per kind with distinct names and wire
// values, names and wire values that round-trip, the budget rule recomputed here by hand, and
// factories that build the declared class with the declared parameters. The wire values are
// checked against the proto's own enum names in attn_node/service/attention_service_test.cc.
#include "common/attention/estimator_registry.h"

#include <set>
#include <string>

#include "common/attention/spotlight_estimator.h"
#include "common/attention/vattention.h"
#include "gtest/gtest.h"

namespace magicpig::attention {
namespace {

TEST(EstimatorRegistryTest, OneEntryPerKindWithDistinctNamesAndWireValues) {
  std::set<EstimatorKind> kinds;
  std::set<std::string_view> names;
  std::set<int> values;
  for (const EstimatorSpec& s : AllEstimators()) {
    EXPECT_TRUE(kinds.insert(s.kind).second) << s.name;
    EXPECT_TRUE(names.insert(s.name).second) << s.name;
    EXPECT_TRUE(values.insert(s.proto_value).second) << s.name;
    EXPECT_GT(s.proto_value, 0) << s.name << ": 0 is ESTIMATOR_UNSPECIFIED";
    EXPECT_NE(s.make, nullptr) << s.name;
    EXPECT_FALSE(s.help.empty()) << s.name;
    EXPECT_EQ(&SpecOf(s.kind), &s);
  }
  for (EstimatorKind k :
       {EstimatorKind::kFull, EstimatorKind::kMagicPig, EstimatorKind::kTopK,
        EstimatorKind::kOracle, EstimatorKind::kVAttention, EstimatorKind::kVAttentionLsh,
        EstimatorKind::kSpotlight, EstimatorKind::kVAttentionSpotlight, EstimatorKind::kSketch,
        EstimatorKind::kVAttentionSketch}) {
    EXPECT_EQ(kinds.count(k), 1u) << static_cast<int>(k);
  }
}

TEST(EstimatorRegistryTest, NamesAndWireValuesRoundTrip) {
  for (const EstimatorSpec& s : AllEstimators()) {
    auto by_name = ParseEstimator(s.name);
    ASSERT_TRUE(by_name.ok()) << by_name.status();
    EXPECT_EQ(*by_name, s.kind);
    EXPECT_EQ(EstimatorName(s.kind), s.name);
    auto by_value = EstimatorFromProtoValue(s.proto_value);
    ASSERT_TRUE(by_value.ok()) << by_value.status();
    EXPECT_EQ(*by_value, s.kind);
  }
  EXPECT_EQ(*EstimatorFromProtoValue(0), EstimatorKind::kMagicPig);  // unspecified: the default
  EXPECT_EQ(EstimatorNames(),
            "magicpig, full, topk, oracle, vattention, vattention-lsh, spotlight, "
            "vattention-spotlight, sketch, vattention-sketch");
  auto bad = ParseEstimator("psychic");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("psychic"), std::string::npos);
  EXPECT_NE(bad.status().message().find(EstimatorNames()), std::string::npos);
  auto bad_value = EstimatorFromProtoValue(99);
  ASSERT_FALSE(bad_value.ok());
  EXPECT_NE(bad_value.status().message().find("shape.estimator"), std::string::npos);
}

TEST(EstimatorRegistryTest, BudgetRule) {
  EstimatorParams p;
  for (int64_t offloaded : {-5, 0, 1, 49, 50, 99, 100, 5000, 123457}) {
    // topk and oracle: 2% of the offloaded keys, at least 1; magicpig and full take no budget.
    const int64_t want = offloaded / 50 > 1 ? offloaded / 50 : 1;
    EXPECT_EQ(EstimatorBudget(EstimatorKind::kTopK, p, offloaded), want) << offloaded;
    EXPECT_EQ(EstimatorBudget(EstimatorKind::kOracle, p, offloaded), want) << offloaded;
    EXPECT_EQ(EstimatorBudget(EstimatorKind::kMagicPig, p, offloaded), 0);
    EXPECT_EQ(EstimatorBudget(EstimatorKind::kFull, p, offloaded), 0);
  }
  p.budget = 7;
  EXPECT_EQ(EstimatorBudget(EstimatorKind::kTopK, p, 100000), 7);
  EXPECT_EQ(EstimatorBudget(EstimatorKind::kOracle, p, 3), 7);
  EXPECT_EQ(EstimatorBudget(EstimatorKind::kMagicPig, p, 100000), 0);
}

TEST(EstimatorRegistryTest, FactoriesBuildTheDeclaredEstimator) {
  EstimatorParams p{.lsh_k = 8, .lsh_l = 75, .lsh_seed = 99, .budget = 0};
  auto m = MakeEstimator(EstimatorKind::kMagicPig, p, 1000);
  ASSERT_TRUE(m.ok()) << m.status();
  const auto* mp = dynamic_cast<const MagicPigEstimator*>(m->get());
  ASSERT_NE(mp, nullptr);
  EXPECT_EQ(mp->k(), 8);
  EXPECT_EQ(mp->l(), 75);

  auto t = MakeEstimator(EstimatorKind::kTopK, p, 1000);
  ASSERT_TRUE(t.ok());
  const auto* tk = dynamic_cast<const TopKEstimator*>(t->get());
  ASSERT_NE(tk, nullptr);
  EXPECT_EQ(tk->budget(), 20);

  auto o = MakeEstimator(EstimatorKind::kOracle, p, 1000);
  ASSERT_TRUE(o.ok());
  const auto* oe = dynamic_cast<const OracleEstimator*>(o->get());
  ASSERT_NE(oe, nullptr);
  EXPECT_EQ(oe->budget(), 20);
  EXPECT_EQ(oe->seed(), 99u);

  auto f = MakeEstimator(EstimatorKind::kFull, p, 1000);
  ASSERT_TRUE(f.ok());
  EXPECT_NE(dynamic_cast<const FullEstimator*>(f->get()), nullptr);

  p.vattention = {.epsilon = 0.2, .delta = 0.01, .heavy = 17, .base_rate = 0.03};
  auto va = MakeEstimator(EstimatorKind::kVAttention, p, 1000);
  ASSERT_TRUE(va.ok());
  const auto* vae = dynamic_cast<const VAttentionEstimator*>(va->get());
  ASSERT_NE(vae, nullptr);
  EXPECT_EQ(vae->params().epsilon, 0.2);
  EXPECT_EQ(vae->params().delta, 0.01);
  EXPECT_EQ(vae->params().heavy, 17);
  EXPECT_EQ(vae->params().base_rate, 0.03);
  auto vl = MakeEstimator(EstimatorKind::kVAttentionLsh, p, 1000);
  ASSERT_TRUE(vl.ok());
  const auto* vle = dynamic_cast<const VAttentionLshEstimator*>(vl->get());
  ASSERT_NE(vle, nullptr);
  EXPECT_EQ(vle->params().epsilon, 0.2);
  EXPECT_TRUE(SpecOf(EstimatorKind::kVAttentionLsh).retrieves);
  EXPECT_FALSE(SpecOf(EstimatorKind::kVAttention).retrieves);
  EXPECT_TRUE(SpecOf(EstimatorKind::kVAttention).verified);
  EXPECT_FALSE(SpecOf(EstimatorKind::kMagicPig).verified);
  p.spotlight_fraction = 0.07;
  auto sp = MakeEstimator(EstimatorKind::kSpotlight, p, 1000);
  ASSERT_TRUE(sp.ok());
  const auto* spe = dynamic_cast<const SpotlightEstimator*>(sp->get());
  ASSERT_NE(spe, nullptr);
  EXPECT_EQ(spe->fraction(), 0.07);
  EXPECT_EQ(spe->rerank(), 1);
  p.spotlight_rerank = 8;
  auto spr = MakeEstimator(EstimatorKind::kSpotlight, p, 1000);
  ASSERT_TRUE(spr.ok());
  EXPECT_EQ(dynamic_cast<const SpotlightEstimator*>(spr->get())->rerank(), 8);
  // Learned codes and key sketches live in codes-only shards; every other estimator's shards
  // have tables (SimHash codes).
  for (const EstimatorSpec& s : AllEstimators()) {
    const bool learned =
        s.kind == EstimatorKind::kSpotlight || s.kind == EstimatorKind::kVAttentionSpotlight;
    const bool sketch =
        s.kind == EstimatorKind::kSketch || s.kind == EstimatorKind::kVAttentionSketch;
    EXPECT_EQ(s.index == KvIndex::kCodes, learned || sketch) << s.name;
    EXPECT_EQ(s.codes, learned  ? CodeSource::kLearned
                       : sketch ? CodeSource::kKeySketch
                                : CodeSource::kSimHash)
        << s.name;
  }
  p.spotlight_rerank = 2;
  auto sk = MakeEstimator(EstimatorKind::kSketch, p, 1000);
  ASSERT_TRUE(sk.ok());
  const auto* ske = dynamic_cast<const SpotlightEstimator*>(sk->get());
  ASSERT_NE(ske, nullptr);
  EXPECT_EQ(ske->score(), CodeScore::kSketch);
  EXPECT_EQ(ske->fraction(), 0.07);
  EXPECT_EQ(ske->rerank(), 2);
  EXPECT_EQ(spe->score(), CodeScore::kHamming);
  auto vs = MakeEstimator(EstimatorKind::kVAttentionSpotlight, p, 1000);
  ASSERT_TRUE(vs.ok());
  const auto* vse = dynamic_cast<const VAttentionLshEstimator*>(vs->get());
  ASSERT_NE(vse, nullptr);
  EXPECT_EQ(vse->spotlight_fraction(), 0.07);
  EXPECT_EQ(vse->params().epsilon, 0.2);
  EXPECT_EQ(vse->score(), CodeScore::kHamming);
  auto vk = MakeEstimator(EstimatorKind::kVAttentionSketch, p, 1000);
  ASSERT_TRUE(vk.ok());
  const auto* vke = dynamic_cast<const VAttentionLshEstimator*>(vk->get());
  ASSERT_NE(vke, nullptr);
  EXPECT_EQ(vke->spotlight_fraction(), 0.07);
  EXPECT_EQ(vke->params().epsilon, 0.2);
  EXPECT_EQ(vke->score(), CodeScore::kSketch);
}

TEST(EstimatorRegistryTest, ParametersAreCheckedAgainstTheirOneDeclaration) {
  struct Case {
    EstimatorParams p;
    std::string want;
  };
  const Case cases[] = {
      {{.lsh_k = 0}, "lsh_k must be in [1, 16], got 0"},
      {{.lsh_k = 17}, "lsh_k must be in [1, 16], got 17"},
      {{.lsh_l = 1}, "lsh_l must be in [2, 512], got 1"},  // would sample nothing
      {{.lsh_l = 513}, "lsh_l must be in [2, 512], got 513"},
      {{.budget = -1}, "budget must be in [0, 2147483647], got -1"},
      {{.vattention = {.epsilon = 0}}, "va_epsilon must be in [0.0001, 1], got 0"},
      {{.vattention = {.delta = 0.7}}, "va_delta must be in [1e-06, 0.5], got 0.7"},
      {{.vattention = {.heavy = -1}}, "va_heavy must be in [0, 2147483647], got -1"},
      {{.vattention = {.base_rate = 1.5}}, "va_base_rate must be in [0, 1], got 1.5"},
      {{.spotlight_fraction = 0}, "spotlight_fraction must be in [1e-06, 1], got 0"},
      {{.spotlight_fraction = 1.5}, "spotlight_fraction must be in [1e-06, 1], got 1.5"},
      {{.spotlight_rerank = 0}, "spotlight_rerank must be in [1, 64], got 0"},
      {{.spotlight_rerank = 65}, "spotlight_rerank must be in [1, 64], got 65"},
  };
  for (const Case& c : cases) {
    for (const EstimatorSpec& s : AllEstimators()) {
      auto e = MakeEstimator(s.kind, c.p, 100);
      ASSERT_FALSE(e.ok()) << s.name << " " << c.want;
      EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_EQ(e.status().message(), c.want);
    }
  }
  EXPECT_TRUE(MakeEstimator(EstimatorKind::kMagicPig, {.lsh_k = 1, .lsh_l = 2}, 0).ok());
  EXPECT_TRUE(MakeEstimator(EstimatorKind::kMagicPig, {.lsh_k = 16, .lsh_l = 512}, 0).ok());
  EXPECT_EQ(ValidateEstimatorParams({.lsh_l = 1}, "shape.").message(),
            "shape.lsh_l must be in [2, 512], got 1");
}

}  // namespace
}  // namespace magicpig::attention
