// End-to-end tests of the AttentionService over loopback gRPC (an in-process AttentionServer on
// 127.0.0.1:0 and a blocking C++ client): results equal the attention core called directly on
// shards built from the same data (magicpig, bitwise) and a float64 softmax (full); every kind of
// bad message gets its status code and a message naming the field, and leaves the node and the
// sequence's data intact; memory admission and NodeStatus accounting; draining.
#include "attn_node/service/attention_service.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_replace.h"
#include "common/attention/estimator_registry.h"
#include "common/attention/estimators.h"
#include "common/attention/kv_shard.h"
#include "common/attention/simhash.h"
#include "common/logging/logger.h"
#include "gtest/gtest.h"
#include "tests/testing/service_test_util.h"

namespace magicpig {

using ::magicpig::attention::EstimatorScratch;
using ::magicpig::attention::FullEstimator;
using ::magicpig::attention::KvShard;
using ::magicpig::attention::KvStorage;
using ::magicpig::attention::MagicPigEstimator;
using ::magicpig::attention::PartialAttention;
using ::magicpig::attention::SimHash;
namespace {

using testing::Client;
using testing::LayerData;
using testing::MakeChunk;
using testing::MakeCreate;
using testing::MakeLayer;
using testing::MakeQuery;

constexpr int64_t kBudget = int64_t{1} << 30;

// The registry's wire values are the proto's: value N of magicpig.v1.Estimator is named
// ESTIMATOR_<NAME> for the registry entry with proto_value N, and every value but UNSPECIFIED has
// an entry.
TEST(EstimatorWireTest, RegistryMatchesTheProtoEnum) {
  for (const attention::EstimatorSpec& s : attention::AllEstimators()) {
    ASSERT_TRUE(v1::Estimator_IsValid(s.proto_value)) << s.name;
    EXPECT_EQ(v1::Estimator_Name(static_cast<v1::Estimator>(s.proto_value)),
              "ESTIMATOR_" +
                  absl::StrReplaceAll(absl::AsciiStrToUpper(std::string(s.name)), {{"-", "_"}}));
  }
  const auto* e = v1::Estimator_descriptor();
  for (int i = 0; i < e->value_count(); ++i) {
    const int v = e->value(i)->number();
    if (v == v1::ESTIMATOR_UNSPECIFIED) continue;
    auto kind = attention::EstimatorFromProtoValue(v);
    ASSERT_TRUE(kind.ok()) << e->value(i)->name() << " has no registry entry";
    EXPECT_EQ(attention::SpecOf(*kind).proto_value, v);
  }
}

// A status check that names the code and a substring of the message.
void ExpectStatus(const grpc::Status& s, grpc::StatusCode code, const std::string& field) {
  EXPECT_EQ(s.error_code(), code) << s.error_message();
  EXPECT_NE(s.error_message().find(field), std::string::npos)
      << "message '" << s.error_message() << "' does not name '" << field << "'";
}

// float64 softmax attention of q over keys [n][d] / values [n][d] (one kv head).
void ReferenceSoftmax(const float* q, const float* keys, const float* values, int n, int d,
                      double scale, std::vector<double>* o, double* lse) {
  std::vector<double> logits(n);
  double m = -std::numeric_limits<double>::infinity();
  for (int t = 0; t < n; ++t) {
    double s = 0;
    for (int j = 0; j < d; ++j) s += static_cast<double>(q[j]) * keys[int64_t{t} * d + j];
    logits[t] = scale * s;
    m = std::max(m, logits[t]);
  }
  double z = 0;
  for (double x : logits) z += std::exp(x - m);
  o->assign(d, 0.0);
  for (int t = 0; t < n; ++t) {
    const double w = std::exp(logits[t] - m) / z;
    for (int j = 0; j < d; ++j) (*o)[j] += w * values[int64_t{t} * d + j];
  }
  *lse = m + std::log(z);
}

// Checks a full-estimator partial against the float64 reference over the first n keys per head.
void ExpectFullMatches(const v1::SequencePartial& p, const LayerData& data, int n, int group,
                       const std::vector<float>& q, float scale) {
  const int d = data.d;
  const std::vector<float> o = testing::BytesToFloats(p.o());
  ASSERT_EQ(o.size(), static_cast<size_t>(data.n_kv) * group * d);
  ASSERT_EQ(p.lse_size(), data.n_kv * group);
  EXPECT_EQ(p.n_keys(), n);
  for (int h = 0; h < data.n_kv; ++h) {
    for (int j = 0; j < group; ++j) {
      const int head = h * group + j;
      std::vector<double> want;
      double lse;
      ReferenceSoftmax(q.data() + int64_t{head} * d, data.key(h, 0), data.value(h, 0), n, d, scale,
                       &want, &lse);
      EXPECT_NEAR(p.lse(head), lse, 1e-5 * std::max(1.0, std::fabs(lse))) << head;
      for (int t = 0; t < d; ++t) EXPECT_NEAR(o[int64_t{head} * d + t], want[t], 1e-5) << head;
      EXPECT_EQ(p.n_touched(head), n);
    }
  }
}

v1::AttendRequest MakeAttend(uint64_t step, int layer, float scale) {
  v1::AttendRequest r;
  r.set_step_id(step);
  r.set_layer(layer);
  r.set_scale(scale);
  return r;
}

// MagicPIG through the service, chunked, equals MagicPigEstimator::AttendGroup on a shard built
// with CreateFromCodes from the same rows -- bitwise; for bf16 and f32 storage, two sequences in
// one request, two requests on one stream (responses in order, step ids echoed).
TEST(AttentionServiceTest, MagicPigMatchesDirectCoreCall) {
  auto server = testing::StartServer(kBudget);
  ASSERT_NE(server, nullptr);
  Client client(server->address());
  const int n_kv = 2, group = 4, d = 64, k = 6, l = 40, n = 700, layer = 3;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  auto hash = SimHash::Create(d, k, l, 1234);
  ASSERT_TRUE(hash.ok());
  const v1::KvDtype dtypes[] = {v1::KV_DTYPE_BF16, v1::KV_DTYPE_F32};
  std::vector<LayerData> data;
  for (int s = 0; s < 2; ++s) {
    data.push_back(MakeLayer(*hash, n_kv, n, 10 + s));
    const std::string id = "seq-" + std::to_string(s);
    ASSERT_TRUE(client
                    .Create(MakeCreate(id, {1, layer}, n_kv, group, d, k, l, dtypes[s],
                                       v1::ESTIMATOR_UNSPECIFIED, 100, 4096))
                    .ok());
    v1::AppendKvResponse resp;
    grpc::Status st = client.Append(
        {MakeChunk(id, layer, data[s], 100, 0, 250), MakeChunk(id, layer, data[s], 100, 250, 250),
         MakeChunk(id, layer, data[s], 100, 500, 200)},
        &resp);
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(resp.tokens(), n);
    EXPECT_GT(resp.bytes(), 0);
  }

  std::mt19937 rng(5);
  std::vector<v1::AttendRequest> requests;
  std::vector<std::vector<std::vector<float>>> qs(2);  // [request][sequence] -> q
  std::vector<std::vector<std::vector<uint16_t>>> codes(2);
  for (int r = 0; r < 2; ++r) {
    requests.push_back(MakeAttend(100 + r, layer, scale));
    for (int s = 0; s < 2; ++s) {
      // Queries near some key so that sampling finds keys.
      std::vector<float> q = testing::Randn(static_cast<size_t>(n_kv) * group * d, rng, 0.3f);
      for (int h = 0; h < n_kv * group; ++h)
        for (int j = 0; j < d; ++j)
          q[int64_t{h} * d + j] += 2.0f * data[s].key(h / group, 7 * h)[j];
      std::vector<uint16_t> c;
      *requests.back().add_queries() = MakeQuery("seq-" + std::to_string(s), q, *hash, &c);
      qs[r].push_back(q);
      codes[r].push_back(c);
    }
  }
  std::vector<v1::AttendResponse> responses;
  grpc::Status st = client.Attend(requests, &responses);
  ASSERT_TRUE(st.ok()) << st.error_message();
  ASSERT_EQ(responses.size(), 2u);

  MagicPigEstimator estimator(k, l);
  EstimatorScratch scratch;
  int64_t touched_total = 0;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(responses[r].step_id(), 100u + r);
    ASSERT_EQ(responses[r].partials_size(), 2);
    for (int s = 0; s < 2; ++s) {
      const v1::SequencePartial& p = responses[r].partials(s);
      EXPECT_EQ(p.sequence_id(), "seq-" + std::to_string(s));
      EXPECT_EQ(p.n_keys(), n);
      const std::vector<float> o = testing::BytesToFloats(p.o());
      ASSERT_EQ(o.size(), static_cast<size_t>(n_kv) * group * d);
      for (int h = 0; h < n_kv; ++h) {
        auto shard = KvShard::CreateFromCodes(d, k, l, data[s].key(h, 0), data[s].code(h, 0),
                                              data[s].value(h, 0), n,
                                              s == 0 ? KvStorage::kBf16 : KvStorage::kF32);
        ASSERT_TRUE(shard.ok());
        std::vector<PartialAttention> want(group);
        ASSERT_TRUE(estimator
                        .AttendGroup(*shard, qs[r][s].data() + int64_t{h} * group * d,
                                     codes[r][s].data() + int64_t{h} * group * l, group, scale,
                                     &scratch, want.data())
                        .ok());
        for (int j = 0; j < group; ++j) {
          const int head = h * group + j;
          EXPECT_EQ(p.lse(head), want[j].lse)
              << "request " << r << " seq " << s << " head " << head;
          EXPECT_EQ(p.n_touched(head), want[j].n_touched);
          touched_total += want[j].n_touched;
          for (int t = 0; t < d; ++t) {
            const float w = want[j].o.empty() ? 0.0f : want[j].o[t];
            ASSERT_EQ(o[int64_t{head} * d + t], w) << head << " " << t;
          }
        }
      }
    }
  }
  EXPECT_GT(touched_total, 0);  // the comparison is not vacuous
}

// FullEstimator through the service equals a float64 softmax; a second AppendKV stream (the
// append segment) extends the layer; an empty layer answers lse = -inf, o = 0, n_keys = 0.
TEST(AttentionServiceTest, FullEstimatorMatchesFloat64Softmax) {
  auto server = testing::StartServer(kBudget);
  ASSERT_NE(server, nullptr);
  Client client(server->address());
  const int n_kv = 2, group = 2, d = 32, k = 4, l = 8, n = 300;
  const float scale = 0.2f;
  auto hash = SimHash::Create(d, k, l, 7);
  ASSERT_TRUE(hash.ok());
  const LayerData data = MakeLayer(*hash, n_kv, n, 3);
  ASSERT_TRUE(client
                  .Create(MakeCreate("full", {0, 5}, n_kv, group, d, k, l, v1::KV_DTYPE_F32,
                                     v1::ESTIMATOR_FULL, 0, 1000))
                  .ok());
  ASSERT_TRUE(client.Append({MakeChunk("full", 5, data, 0, 0, 200)}).ok());

  std::mt19937 rng(9);
  const std::vector<float> q = testing::Randn(static_cast<size_t>(n_kv) * group * d, rng);
  auto attend = [&](int layer) {
    v1::AttendRequest r = MakeAttend(1, layer, scale);
    *r.add_queries() = MakeQuery("full", q, *hash, nullptr);
    r.mutable_queries(0)->clear_codes();  // codes are optional for the full estimator
    std::vector<v1::AttendResponse> out;
    grpc::Status st = client.Attend({r}, &out);
    EXPECT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(out.size(), 1u);
    return out.empty() ? v1::SequencePartial() : out[0].partials(0);
  };
  ExpectFullMatches(attend(5), data, 200, group, q, scale);
  // Tokens leaving the static window later: a second stream appends [200, 300).
  v1::AppendKvResponse resp;
  ASSERT_TRUE(
      client
          .Append({MakeChunk("full", 5, data, 0, 200, 60), MakeChunk("full", 5, data, 0, 260, 40)},
                  &resp)
          .ok());
  EXPECT_EQ(resp.tokens(), n);
  ExpectFullMatches(attend(5), data, n, group, q, scale);

  const v1::SequencePartial empty = attend(0);
  EXPECT_EQ(empty.n_keys(), 0);
  for (int h = 0; h < n_kv * group; ++h) {
    EXPECT_EQ(empty.lse(h), -std::numeric_limits<float>::infinity());
    EXPECT_EQ(empty.n_touched(h), 0);
  }
  for (float x : testing::BytesToFloats(empty.o())) EXPECT_EQ(x, 0.0f);
}

// MagicPIG after an append in a second stream (pending segment / table merge) equals the core on
// a shard built the same way: CreateFromCodes over the first part, AppendWithCodes the rest.
TEST(AttentionServiceTest, MagicPigAfterLaterAppendMatchesCore) {
  auto server = testing::StartServer(kBudget);
  ASSERT_NE(server, nullptr);
  Client client(server->address());
  const int n_kv = 1, group = 3, d = 32, k = 5, l = 30, n = 900, first = 500;
  const float scale = 0.18f;
  auto hash = SimHash::Create(d, k, l, 77);
  ASSERT_TRUE(hash.ok());
  const LayerData data = MakeLayer(*hash, n_kv, n, 21);
  ASSERT_TRUE(client
                  .Create(MakeCreate("s", {2}, n_kv, group, d, k, l, v1::KV_DTYPE_F32,
                                     v1::ESTIMATOR_MAGICPIG, 4, n))
                  .ok());
  ASSERT_TRUE(client.Append({MakeChunk("s", 2, data, 4, 0, first)}).ok());
  ASSERT_TRUE(client
                  .Append({MakeChunk("s", 2, data, 4, first, 100),
                           MakeChunk("s", 2, data, 4, first + 100, n - first - 100)})
                  .ok());

  auto shard = KvShard::CreateFromCodes(d, k, l, data.key(0, 0), data.code(0, 0), data.value(0, 0),
                                        first, KvStorage::kF32);
  ASSERT_TRUE(shard.ok());
  ASSERT_TRUE(shard
                  ->AppendWithCodes(data.key(0, first), data.code(0, first), data.value(0, first),
                                    n - first)
                  .ok());
  std::mt19937 rng(4);
  std::vector<float> q = testing::Randn(static_cast<size_t>(group) * d, rng, 0.3f);
  for (int h = 0; h < group; ++h)
    for (int j = 0; j < d; ++j) q[int64_t{h} * d + j] += 2.0f * data.key(0, 600 + h)[j];
  std::vector<uint16_t> codes;
  v1::AttendRequest r = MakeAttend(9, 2, scale);
  *r.add_queries() = MakeQuery("s", q, *hash, &codes);
  std::vector<v1::AttendResponse> out;
  ASSERT_TRUE(client.Attend({r}, &out).ok());
  ASSERT_EQ(out.size(), 1u);
  const v1::SequencePartial& p = out[0].partials(0);
  EXPECT_EQ(p.n_keys(), n);
  MagicPigEstimator estimator(k, l);
  EstimatorScratch scratch;
  std::vector<PartialAttention> want(group);
  ASSERT_TRUE(
      estimator.AttendGroup(*shard, q.data(), codes.data(), group, scale, &scratch, want.data())
          .ok());
  const std::vector<float> o = testing::BytesToFloats(p.o());
  for (int h = 0; h < group; ++h) {
    EXPECT_GT(want[h].n_touched, 0);
    EXPECT_EQ(p.n_touched(h), want[h].n_touched);
    EXPECT_NEAR(p.lse(h), want[h].lse, 1e-6);
    for (int t = 0; t < d; ++t) EXPECT_NEAR(o[int64_t{h} * d + t], want[h].o[t], 1e-6);
  }
}

TEST(AttentionServiceTest, MalformedRequestsGetFieldNamedErrorsAndChangeNothing) {
  auto server = testing::StartServer(kBudget);
  ASSERT_NE(server, nullptr);
  Client client(server->address());
  const int n_kv = 2, group = 2, d = 16, k = 4, l = 6;
  const float scale = 0.25f;
  auto hash = SimHash::Create(d, k, l, 3);
  ASSERT_TRUE(hash.ok());
  const LayerData data = MakeLayer(*hash, n_kv, 64, 8);
  auto create = [&](const std::string& id) {
    return MakeCreate(id, {4}, n_kv, group, d, k, l, v1::KV_DTYPE_F32, v1::ESTIMATOR_FULL, 0, 64);
  };

  // CreateSequence.
  using C = grpc::StatusCode;
  ExpectStatus(client.Create(create("")), C::INVALID_ARGUMENT, "sequence_id");
  ExpectStatus(client.Create(create(std::string(129, 'x'))), C::INVALID_ARGUMENT, "sequence_id");
  auto bad = create("a");
  bad.clear_shape();
  ExpectStatus(client.Create(bad), C::INVALID_ARGUMENT, "shape");
  bad = create("a");
  bad.mutable_shape()->set_head_dim(100);
  ExpectStatus(client.Create(bad), C::INVALID_ARGUMENT, "shape.head_dim");
  bad = create("a");
  bad.mutable_shape()->set_lsh_k(17);
  ExpectStatus(client.Create(bad), C::INVALID_ARGUMENT, "shape.lsh_k");
  bad = create("a");
  bad.mutable_shape()->set_lsh_l(1);
  ExpectStatus(client.Create(bad), C::INVALID_ARGUMENT, "shape.lsh_l");
  bad = create("a");
  bad.mutable_shape()->set_n_kv_heads(0);
  ExpectStatus(client.Create(bad), C::INVALID_ARGUMENT, "shape.n_kv_heads");
  bad = create("a");
  bad.mutable_shape()->set_group(0);
  ExpectStatus(client.Create(bad), C::INVALID_ARGUMENT, "shape.group");
  bad = create("a");
  bad.mutable_shape()->add_layers(4);
  ExpectStatus(client.Create(bad), C::INVALID_ARGUMENT, "shape.layers");
  bad = create("a");
  bad.mutable_shape()->set_layers(0, -1);
  ExpectStatus(client.Create(bad), C::INVALID_ARGUMENT, "shape.layers");
  bad = create("a");
  bad.mutable_shape()->set_dtype(static_cast<v1::KvDtype>(9));
  ExpectStatus(client.Create(bad), C::INVALID_ARGUMENT, "shape.dtype");
  bad = create("a");
  bad.mutable_shape()->set_estimator(static_cast<v1::Estimator>(99));
  ExpectStatus(client.Create(bad), C::INVALID_ARGUMENT, "shape.estimator");
  bad = create("a");
  bad.mutable_shape()->set_estimator(v1::ESTIMATOR_TOPK);  // budget 0
  ExpectStatus(client.Create(bad), C::INVALID_ARGUMENT, "shape.budget");
  bad = create("a");
  bad.mutable_shape()->set_estimator(v1::ESTIMATOR_VATTENTION);  // va_epsilon 0: unset
  ExpectStatus(client.Create(bad), C::INVALID_ARGUMENT, "shape.va_epsilon");
  bad.mutable_shape()->set_va_epsilon(0.1);
  bad.mutable_shape()->set_va_delta(0.1);
  bad.mutable_shape()->set_va_base_rate(std::nan(""));
  ExpectStatus(client.Create(bad), C::INVALID_ARGUMENT, "shape.va_base_rate");
  bad = create("a");
  bad.set_max_tokens(0);
  ExpectStatus(client.Create(bad), C::INVALID_ARGUMENT, "max_tokens");
  bad = create("a");
  bad.set_token_begin(-1);
  ExpectStatus(client.Create(bad), C::INVALID_ARGUMENT, "token_begin");
  EXPECT_EQ(client.Status().sequences(), 0);

  // A valid sequence holding [0, 32).
  ASSERT_TRUE(client.Create(create("a")).ok());
  ExpectStatus(client.Create(create("a")), C::ALREADY_EXISTS, "a");
  ASSERT_TRUE(client.Append({MakeChunk("a", 4, data, 0, 0, 32)}).ok());

  std::mt19937 rng(1);
  const std::vector<float> q = testing::Randn(static_cast<size_t>(n_kv) * group * d, rng);
  auto attend_a = [&]() {
    v1::AttendRequest r = MakeAttend(1, 4, scale);
    *r.add_queries() = MakeQuery("a", q, *hash, nullptr);
    std::vector<v1::AttendResponse> out;
    EXPECT_TRUE(client.Attend({r}, &out).ok());
    return out.empty() ? v1::SequencePartial() : out[0].partials(0);
  };
  const v1::SequencePartial before = attend_a();
  ExpectFullMatches(before, data, 32, group, q, scale);

  // AppendKV: each stream = one valid chunk [32, 40) then a bad one; nothing may be committed.
  const v1::KvChunk good = MakeChunk("a", 4, data, 0, 32, 8);
  auto bad_append = [&](v1::KvChunk chunk, C code, const std::string& field) {
    ExpectStatus(client.Append({good, chunk}), code, field);
    const v1::SequencePartial after = attend_a();
    EXPECT_EQ(after.n_keys(), 32) << field;
    EXPECT_EQ(after.o(), before.o()) << field;
  };
  v1::KvChunk c = MakeChunk("a", 4, data, 0, 40, 8);
  c.set_sequence_id("nobody");
  bad_append(c, C::NOT_FOUND, "nobody");
  c = MakeChunk("a", 4, data, 0, 40, 8);
  c.set_sequence_id("");
  bad_append(c, C::INVALID_ARGUMENT, "KvChunk.sequence_id");
  c = MakeChunk("a", 4, data, 0, 40, 8);
  c.set_layer(5);
  bad_append(c, C::INVALID_ARGUMENT, "KvChunk.layer");
  bad_append(MakeChunk("a", 4, data, 0, 41, 8), C::INVALID_ARGUMENT, "KvChunk.first_pos");
  bad_append(MakeChunk("a", 4, data, 0, 32, 8), C::INVALID_ARGUMENT, "KvChunk.first_pos");
  c = MakeChunk("a", 4, data, 0, 40, 8);
  c.set_n_tokens(0);
  bad_append(c, C::INVALID_ARGUMENT, "KvChunk.n_tokens");
  c.set_n_tokens(5000);
  bad_append(c, C::INVALID_ARGUMENT, "KvChunk.n_tokens");
  c = MakeChunk("a", 4, data, 0, 40, 8);
  c.mutable_keys()->resize(c.keys().size() - 4);  // truncated
  bad_append(c, C::INVALID_ARGUMENT, "KvChunk.keys");
  c = MakeChunk("a", 4, data, 0, 40, 8);
  c.mutable_values()->append("1234");
  bad_append(c, C::INVALID_ARGUMENT, "KvChunk.values");
  c = MakeChunk("a", 4, data, 0, 40, 8);
  c.mutable_codes()->pop_back();
  bad_append(c, C::INVALID_ARGUMENT, "KvChunk.codes");
  c = MakeChunk("a", 4, data, 0, 40, 8);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(c.mutable_keys()->data() + 12, &nan, 4);
  bad_append(c, C::INVALID_ARGUMENT, "KvChunk.keys");
  // Finite but absurd: 3e38 in a key or a value overflows the attention arithmetic (a non-finite
  // lse came back before the bound).
  const float huge = 3e38f;
  c = MakeChunk("a", 4, data, 0, 40, 8);
  std::memcpy(c.mutable_keys()->data() + 12, &huge, 4);
  bad_append(c, C::INVALID_ARGUMENT, "KvChunk.keys");
  c = MakeChunk("a", 4, data, 0, 40, 8);
  std::memcpy(c.mutable_values()->data() + 8, &huge, 4);
  bad_append(c, C::INVALID_ARGUMENT, "KvChunk.values");
  c = MakeChunk("a", 4, data, 0, 40, 24);
  c.set_first_pos(40);
  c.set_n_tokens(25);  // 65 tokens > max_tokens 64 (checked before the byte lengths)
  bad_append(c, C::RESOURCE_EXHAUSTED, "max_tokens");

  // Attend.
  auto bad_attend = [&](v1::AttendRequest r, C code, const std::string& field) {
    std::vector<v1::AttendResponse> out;
    ExpectStatus(client.Attend({r}, &out), code, field);
    EXPECT_TRUE(out.empty()) << field;
  };
  v1::AttendRequest r = MakeAttend(1, 4, scale);
  *r.add_queries() = MakeQuery("nobody", q, *hash, nullptr);
  bad_attend(r, C::NOT_FOUND, "nobody");
  r = MakeAttend(1, 7, scale);
  *r.add_queries() = MakeQuery("a", q, *hash, nullptr);
  bad_attend(r, C::INVALID_ARGUMENT, "AttendRequest.layer");
  r = MakeAttend(1, 4, scale);
  bad_attend(r, C::INVALID_ARGUMENT, "AttendRequest.queries");
  r = MakeAttend(1, 4, 0.0f);
  *r.add_queries() = MakeQuery("a", q, *hash, nullptr);
  bad_attend(r, C::INVALID_ARGUMENT, "AttendRequest.scale");
  r.set_scale(std::numeric_limits<float>::quiet_NaN());
  bad_attend(r, C::INVALID_ARGUMENT, "AttendRequest.scale");
  // Absurdly large: with keys and queries at their bound it would overflow the logits to inf.
  r.set_scale(1e30f);
  bad_attend(r, C::INVALID_ARGUMENT, "AttendRequest.scale");
  r = MakeAttend(1, 4, scale);
  *r.add_queries() = MakeQuery("a", q, *hash, nullptr);
  r.mutable_queries(0)->mutable_q()->resize(r.queries(0).q().size() - 1);
  bad_attend(r, C::INVALID_ARGUMENT, "AttendRequest.queries[0].q");
  r = MakeAttend(1, 4, scale);
  *r.add_queries() = MakeQuery("a", q, *hash, nullptr);
  r.mutable_queries(0)->mutable_codes()->append("x");
  bad_attend(r, C::INVALID_ARGUMENT, "AttendRequest.queries[0].codes");
  r = MakeAttend(1, 4, scale);
  *r.add_queries() = MakeQuery("a", q, *hash, nullptr);
  std::memcpy(r.mutable_queries(0)->mutable_q()->data() + 4, &huge, 4);
  bad_attend(r, C::INVALID_ARGUMENT, "AttendRequest.queries[0].q");

  // A stream whose second request is bad: the first is answered, then the stream ends.
  {
    v1::AttendRequest ok = MakeAttend(11, 4, scale);
    *ok.add_queries() = MakeQuery("a", q, *hash, nullptr);
    v1::AttendRequest unknown = MakeAttend(12, 4, scale);
    *unknown.add_queries() = MakeQuery("zzz", q, *hash, nullptr);
    std::vector<v1::AttendResponse> out;
    ExpectStatus(client.Attend({ok, unknown, ok}, &out), C::NOT_FOUND, "zzz");
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].step_id(), 11u);
  }

  // Release of an unknown sequence.
  ExpectStatus(client.Release("nobody"), C::NOT_FOUND, "nobody");

  // The node still works: the first sequence is unchanged, a second valid one answers correctly
  // (magicpig needs codes: missing ones are named).
  const v1::SequencePartial after = attend_a();
  EXPECT_EQ(after.o(), before.o());
  ASSERT_TRUE(client
                  .Create(MakeCreate("b", {4}, n_kv, group, d, k, l, v1::KV_DTYPE_F32,
                                     v1::ESTIMATOR_FULL, 0, 64))
                  .ok());
  ASSERT_TRUE(client.Append({MakeChunk("b", 4, data, 0, 0, 64)}).ok());
  v1::AttendRequest rb = MakeAttend(2, 4, scale);
  *rb.add_queries() = MakeQuery("b", q, *hash, nullptr);
  std::vector<v1::AttendResponse> out;
  ASSERT_TRUE(client.Attend({rb}, &out).ok());
  ASSERT_EQ(out.size(), 1u);
  ExpectFullMatches(out[0].partials(0), data, 64, group, q, scale);

  ASSERT_TRUE(client
                  .Create(MakeCreate("m", {4}, n_kv, group, d, k, l, v1::KV_DTYPE_F32,
                                     v1::ESTIMATOR_MAGICPIG, 0, 64))
                  .ok());
  r = MakeAttend(1, 4, scale);
  *r.add_queries() = MakeQuery("m", q, *hash, nullptr);
  r.mutable_queries(0)->clear_codes();
  bad_attend(r, C::INVALID_ARGUMENT, "AttendRequest.queries[0].codes");
}

TEST(AttentionServiceTest, MemoryAdmissionAndAccounting) {
  // One sequence: 2 layers x 2 kv heads, d = 16, K = 4, L = 6, f32, max_tokens 100:
  // per (layer, head): 100 * (2*16*4 + 4 + 6*2) + 6 * 17 * 2 + 16 * 4 = 14400 + 204 + 64 (table
  // indices and bucket offsets are 16-bit for shards of fewer than 65536 keys).
  const int64_t per_sequence = 4 * (100 * (128 + 4 + 12) + 6 * 17 * 2 + 16 * 4);
  auto make = [](const std::string& id) {
    return MakeCreate(id, {1, 2}, 2, 1, 16, 4, 6, v1::KV_DTYPE_F32, v1::ESTIMATOR_FULL, 0, 100);
  };
  auto spec = SequenceSpecFromProto(make("x"));
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(EstimateSequenceBytes(*spec), per_sequence);

  auto server = testing::StartServer(per_sequence * 2 + 10);
  ASSERT_NE(server, nullptr);
  Client client(server->address());
  v1::NodeStatusResponse st = client.Status();
  EXPECT_EQ(st.memory_budget_bytes(), per_sequence * 2 + 10);
  EXPECT_EQ(st.memory_used_bytes(), 0);
  EXPECT_EQ(st.threads(), 2);

  v1::CreateSequenceResponse created;
  ASSERT_TRUE(client.Create(make("one"), &created).ok());
  EXPECT_EQ(created.bytes_reserved(), per_sequence);
  ASSERT_TRUE(client.Create(make("two")).ok());
  ExpectStatus(client.Create(make("three")), grpc::StatusCode::RESOURCE_EXHAUSTED, "budget");
  st = client.Status();
  EXPECT_EQ(st.sequences(), 2);
  EXPECT_EQ(st.memory_used_bytes(), 2 * per_sequence);

  // Filling a layer stays within the reservation.
  auto hash = SimHash::Create(16, 4, 6, 1);
  ASSERT_TRUE(hash.ok());
  const LayerData data = MakeLayer(*hash, 2, 100, 2);
  v1::AppendKvResponse appended;
  ASSERT_TRUE(client.Append({MakeChunk("one", 1, data, 0, 0, 100)}, &appended).ok());
  EXPECT_EQ(appended.tokens(), 100);
  StoreStats stats = server->store().Stats();
  EXPECT_GT(stats.memory_actual_bytes, 0);
  EXPECT_LE(stats.memory_actual_bytes, per_sequence);
  EXPECT_EQ(appended.bytes(), stats.memory_actual_bytes);
  EXPECT_EQ(client.Status().memory_used_bytes(), 2 * per_sequence);

  v1::ReleaseSequenceResponse released;
  ASSERT_TRUE(client.Release("one", &released).ok());
  EXPECT_EQ(released.bytes_freed(), per_sequence);
  st = client.Status();
  EXPECT_EQ(st.sequences(), 1);
  EXPECT_EQ(st.memory_used_bytes(), per_sequence);
  ASSERT_TRUE(client.Create(make("three")).ok());  // fits again
  ASSERT_TRUE(client.Release("two").ok());
  ASSERT_TRUE(client.Release("three").ok());
  st = client.Status();
  EXPECT_EQ(st.sequences(), 0);
  EXPECT_EQ(st.memory_used_bytes(), 0);
  EXPECT_EQ(server->store().Stats().memory_actual_bytes, 0);
  ExpectStatus(client.Append({MakeChunk("one", 1, data, 0, 0, 10)}), grpc::StatusCode::NOT_FOUND,
               "one");
}

TEST(AttentionServiceTest, DrainingRefusesNewSequencesOnly) {
  auto server = testing::StartServer(kBudget);
  ASSERT_NE(server, nullptr);
  Client client(server->address());
  auto make = [](const std::string& id) {
    return MakeCreate(id, {0}, 1, 1, 16, 4, 6, v1::KV_DTYPE_BF16, v1::ESTIMATOR_FULL, 0, 10);
  };
  ASSERT_TRUE(client.Create(make("before")).ok());
  server->StartDraining();
  ExpectStatus(client.Create(make("after")), grpc::StatusCode::UNAVAILABLE, "draining");
  EXPECT_TRUE(client.Status().draining());
  auto hash = SimHash::Create(16, 4, 6, 1);
  ASSERT_TRUE(hash.ok());
  const LayerData data = MakeLayer(*hash, 1, 10, 2);
  ASSERT_TRUE(client.Append({MakeChunk("before", 0, data, 0, 0, 10)}).ok());
  std::mt19937 rng(1);
  v1::AttendRequest r = MakeAttend(1, 0, 0.25f);
  *r.add_queries() = MakeQuery("before", testing::Randn(16, rng), *hash, nullptr);
  std::vector<v1::AttendResponse> out;
  ASSERT_TRUE(client.Attend({r}, &out).ok());
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].partials(0).n_keys(), 10);
  ASSERT_TRUE(client.Release("before").ok());
}

// Many requests pipelined on one stream (more than the read-ahead queue) come back in order; a
// client that cancels a busy stream, and a shutdown with a stream still open, leave the node
// working / return promptly.
TEST(AttentionServiceTest, PipelinedCancelledAndOpenStreams) {
  auto server = testing::StartServer(kBudget);
  ASSERT_NE(server, nullptr);
  Client client(server->address());
  const int n_kv = 2, group = 2, d = 32, k = 4, l = 10, n = 400;
  auto hash = SimHash::Create(d, k, l, 11);
  ASSERT_TRUE(hash.ok());
  const LayerData data = MakeLayer(*hash, n_kv, n, 6);
  ASSERT_TRUE(client
                  .Create(MakeCreate("p", {0}, n_kv, group, d, k, l, v1::KV_DTYPE_BF16,
                                     v1::ESTIMATOR_MAGICPIG, 0, n))
                  .ok());
  ASSERT_TRUE(client.Append({MakeChunk("p", 0, data, 0, 0, n)}).ok());
  std::mt19937 rng(2);
  std::vector<v1::AttendRequest> requests;
  for (int i = 0; i < 3 * kMaxQueuedAttends; ++i) {
    requests.push_back(MakeAttend(1000 + i, 0, 0.2f));
    *requests.back().add_queries() =
        MakeQuery("p", testing::Randn(static_cast<size_t>(n_kv) * group * d, rng), *hash, nullptr);
  }
  std::vector<v1::AttendResponse> out;
  ASSERT_TRUE(client.Attend(requests, &out).ok());
  ASSERT_EQ(out.size(), requests.size());
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i].step_id(), 1000 + i);

  auto stub = v1::AttentionService::NewStub(
      grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
  for (int round = 0; round < 5; ++round) {
    grpc::ClientContext ctx;
    auto stream = stub->Attend(&ctx);
    for (const auto& r : requests) stream->Write(r);
    v1::AttendResponse resp;
    if (round % 2 == 0) stream->Read(&resp);
    ctx.TryCancel();
    while (stream->Read(&resp)) {
    }
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  // A cancelled AppendKV commits nothing.
  {
    grpc::ClientContext ctx;
    v1::AppendKvResponse resp;
    auto writer = stub->AppendKV(&ctx, &resp);
    ASSERT_TRUE(client.Release("p").ok());
    ASSERT_TRUE(client
                    .Create(MakeCreate("p", {0}, n_kv, group, d, k, l, v1::KV_DTYPE_BF16,
                                       v1::ESTIMATOR_MAGICPIG, 0, n))
                    .ok());
    writer->Write(MakeChunk("p", 0, data, 0, 0, 100));
    ctx.TryCancel();
    EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  ASSERT_TRUE(client.Append({MakeChunk("p", 0, data, 0, 0, 50)}).ok());  // position 0 still free
  ASSERT_TRUE(client.Attend({requests[0]}, &out).ok());
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].partials(0).n_keys(), 50);

  // Shutdown while a stream is open and idle (the client never half-closes).
  grpc::ClientContext ctx;
  auto stream = stub->Attend(&ctx);
  ASSERT_TRUE(stream->Write(requests[0]));
  v1::AttendResponse resp;
  ASSERT_TRUE(stream->Read(&resp));
  const auto start = std::chrono::steady_clock::now();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_FALSE(stream->Read(&resp));
  EXPECT_FALSE(stream->Finish().ok());
}

// Several clients attend while another appends to the same sequences (commits take the
// sequences' locks exclusively while attention holds them shared, all on the executor's two
// threads): everything completes, n_keys only grows, and the final state is complete.
TEST(AttentionServiceTest, ConcurrentClientsAttendWhileAppending) {
  auto server = testing::StartServer(kBudget, /*threads=*/2);
  ASSERT_NE(server, nullptr);
  const int n_kv = 2, group = 2, d = 32, k = 4, l = 10, n = 1200, chunk = 100;
  auto hash = SimHash::Create(d, k, l, 12);
  ASSERT_TRUE(hash.ok());
  const LayerData data = MakeLayer(*hash, n_kv, n, 7);
  Client setup(server->address());
  for (const char* id : {"c0", "c1"}) {
    ASSERT_TRUE(setup
                    .Create(MakeCreate(id, {0}, n_kv, group, d, k, l, v1::KV_DTYPE_BF16,
                                       v1::ESTIMATOR_MAGICPIG, 0, n))
                    .ok());
  }
  std::atomic<bool> done{false};
  std::thread writer([&] {
    Client client(server->address());
    for (int begin = 0; begin < n; begin += chunk) {
      // One stream carries both sequences' chunks (one commit locking both).
      EXPECT_TRUE(client
                      .Append({MakeChunk("c0", 0, data, 0, begin, chunk),
                               MakeChunk("c1", 0, data, 0, begin, chunk)})
                      .ok());
    }
    done = true;
  });
  std::vector<std::thread> readers;
  for (int t = 0; t < 3; ++t) {
    readers.emplace_back([&, t] {
      Client client(server->address());
      std::mt19937 rng(t);
      int64_t last = 0;
      while (!done) {
        std::vector<v1::AttendRequest> requests;
        for (int i = 0; i < 4; ++i) {
          requests.push_back(MakeAttend(i, 0, 0.2f));
          for (const char* id : {"c1", "c0"}) {
            *requests.back().add_queries() = MakeQuery(
                id, testing::Randn(static_cast<size_t>(n_kv) * group * d, rng), *hash, nullptr);
          }
        }
        std::vector<v1::AttendResponse> out;
        grpc::Status st = client.Attend(requests, &out);
        ASSERT_TRUE(st.ok()) << st.error_message();
        ASSERT_EQ(out.size(), requests.size());
        for (const auto& r : out) {
          EXPECT_GE(r.partials(0).n_keys(), last);
          EXPECT_EQ(r.partials(0).n_keys() % chunk, 0);
          last = r.partials(0).n_keys();
        }
      }
    });
  }
  writer.join();
  for (auto& r : readers) r.join();
  std::vector<v1::AttendResponse> out;
  v1::AttendRequest r = MakeAttend(0, 0, 0.2f);
  std::mt19937 rng(9);
  *r.add_queries() =
      MakeQuery("c0", testing::Randn(static_cast<size_t>(n_kv) * group * d, rng), *hash, nullptr);
  ASSERT_TRUE(setup.Attend({r}, &out).ok());
  EXPECT_EQ(out[0].partials(0).n_keys(), n);
}

// The node's log: nothing for successful calls (Attend included), one INFO line per released
// sequence with its id, layers, tokens, attend calls and bytes, one WARNING line per failed call
// (method, sequence, code, message), and a WARNING line per sequence a shutdown drops.
TEST(AttentionServiceTest, LogsReleasesAndFailedCalls) {
  logging::MemoryLogSink sink;
  logging::Logger logger("attn", logging::LogLevel::kInfo, &sink);
  AttentionServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.memory_budget_bytes = kBudget;
  options.threads = 2;
  options.logger = &logger;
  absl::StatusOr<std::unique_ptr<AttentionServer>> server = AttentionServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  Client client((*server)->address());
  const int n_kv = 1, group = 2, d = 16, k = 4, l = 6;
  auto hash = SimHash::Create(d, k, l, 3);
  ASSERT_TRUE(hash.ok());
  const LayerData data = MakeLayer(*hash, n_kv, 40, 4);
  ASSERT_TRUE(client
                  .Create(MakeCreate("seq-7", {2, 5}, n_kv, group, d, k, l, v1::KV_DTYPE_F32,
                                     v1::ESTIMATOR_FULL, 0, 64))
                  .ok());
  ASSERT_TRUE(client.Append({MakeChunk("seq-7", 2, data, 0, 0, 40)}).ok());
  ASSERT_TRUE(client.Append({MakeChunk("seq-7", 5, data, 0, 0, 25)}).ok());
  std::mt19937 rng(5);
  std::vector<v1::AttendRequest> requests;
  for (int i = 0; i < 3; ++i) {
    requests.push_back(MakeAttend(i, i == 2 ? 5 : 2, 0.25f));
    *requests.back().add_queries() =
        MakeQuery("seq-7", testing::Randn(size_t{n_kv} * group * d, rng), *hash, nullptr);
  }
  std::vector<v1::AttendResponse> out;
  ASSERT_TRUE(client.Attend(requests, &out).ok());
  ASSERT_EQ(out.size(), 3u);
  EXPECT_TRUE(sink.lines().empty()) << sink.lines()[0];

  // One INFO line for the release: the fullest layer's 40 tokens, 3 attend calls, the bytes freed.
  v1::ReleaseSequenceResponse released;
  ASSERT_TRUE(client.Release("seq-7", &released).ok());
  std::vector<std::string> lines = sink.lines();
  ASSERT_EQ(lines.size(), 1u);
  const std::string kStamp = R"(^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z )";
  EXPECT_TRUE(std::regex_match(
      lines[0],
      std::regex(kStamp + "I attn sequence=seq-7 owner=- layers=2 tokens=40 attend_calls=3 " +
                 R"(lifetime_ms=\d+ bytes=)" + std::to_string(released.bytes_freed()) +
                 " status=released$")))
      << lines[0];

  // A failed release: one WARNING line naming the method, the sequence, the code and the message.
  ExpectStatus(client.Release("seq-7"), grpc::StatusCode::NOT_FOUND, "seq-7");
  lines = sink.lines();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_TRUE(std::regex_match(
      lines[1],
      std::regex(kStamp + "W attn rpc=ReleaseSequence owner=- sequence=seq-7 code=NOT_FOUND " +
                 R"(error="sequence_id 'seq-7' is not on this node"$)")))
      << lines[1];

  // Other failures: a bad CreateSequence, an Attend on an unknown sequence, a bad chunk.
  v1::CreateSequenceRequest bad =
      MakeCreate("odd", {0}, n_kv, group, 15, k, l, v1::KV_DTYPE_F32, v1::ESTIMATOR_FULL, 0, 64);
  EXPECT_EQ(client.Create(bad).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::AttendRequest unknown = MakeAttend(9, 2, 0.25f);
  *unknown.add_queries() =
      MakeQuery("gone", testing::Randn(size_t{n_kv} * group * d, rng), *hash, nullptr);
  EXPECT_EQ(client.Attend({unknown}, &out).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(client.Append({MakeChunk("gone", 2, data, 0, 0, 5)}).error_code(),
            grpc::StatusCode::NOT_FOUND);
  lines = sink.lines();
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_NE(
      lines[2].find(" W attn rpc=CreateSequence owner=- sequence=odd code=INVALID_ARGUMENT error="),
      std::string::npos)
      << lines[2];
  EXPECT_NE(lines[3].find(" W attn rpc=Attend owner=- sequence=gone code=NOT_FOUND error="),
            std::string::npos)
      << lines[3];
  EXPECT_NE(lines[4].find(" W attn rpc=AppendKV owner=- sequence=gone code=NOT_FOUND error="),
            std::string::npos)
      << lines[4];

  // A sequence still held at shutdown is logged as dropped.
  ASSERT_TRUE(client
                  .Create(MakeCreate("kept", {2}, n_kv, group, d, k, l, v1::KV_DTYPE_F32,
                                     v1::ESTIMATOR_FULL, 0, 64))
                  .ok());
  (*server)->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  lines = sink.lines();
  ASSERT_EQ(lines.size(), 6u);
  EXPECT_TRUE(std::regex_match(
      lines[5],
      std::regex(kStamp + "W attn sequence=kept owner=- layers=1 tokens=0 attend_calls=0 " +
                 R"(lifetime_ms=\d+ bytes=\d+ status=dropped$)")))
      << lines[5];
}

}  // namespace
}  // namespace magicpig
