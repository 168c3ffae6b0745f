// AttendCoalescer against two in-process attention nodes (AttentionServer on loopback): the
// queries that several sequences start at one layer go to each node as one request, and every
// sequence gets exactly the partials it gets over its own per-block streams (also when the
// requests are cut at their size cap); a step given up
// (started, never finished) is dropped without disturbing later steps; a stopped node fails the
// tickets of its requests recoverably while the other node keeps serving.
#include "gpu_node/remote/attend_coalescer.h"

#include <chrono>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "attn_node/service/attention_server.h"
#include "common/attention/simhash.h"
#include "gpu_node/remote/remote_attention_shards.h"
#include "gtest/gtest.h"
#include "tests/testing/service_test_util.h"

namespace magicpig::remote {

using ::magicpig::attention::PartialAttention;
using ::magicpig::attention::SimHash;
namespace {

constexpr int kKv = 2, kGroup = 2, kD = 32, kK = 5, kL = 12, kTokens = 256, kBlock = 64;
constexpr int kHeads = kKv * kGroup;
constexpr int kSequences = 3;
const float kScale = 1.0f / std::sqrt(static_cast<float>(kD));

v1::ShardShape Shape() {
  return magicpig::testing::MakeCreate("", {0, 1}, kKv, kGroup, kD, kK, kL, v1::KV_DTYPE_F32,
                                       v1::ESTIMATOR_MAGICPIG, 0, 0)
      .shape();
}

class AttendCoalescerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 2; ++i) {
      servers_.push_back(magicpig::testing::StartServer(int64_t{256} << 20, 2));
      ASSERT_NE(servers_.back(), nullptr);
      clients_.push_back(std::make_unique<AttentionNodeClient>(servers_.back()->address()));
      coalescers_.push_back(
          std::make_unique<AttendCoalescer>(clients_.back().get(), std::chrono::seconds(10)));
    }
    auto hash = SimHash::Create(kD, kK, kL, 11);
    ASSERT_TRUE(hash.ok());
    hash_ = std::make_unique<SimHash>(std::move(*hash));
    std::mt19937 rng(4);
    for (int s = 0; s < kSequences; ++s) {
      data_.push_back(magicpig::testing::MakeLayer(*hash_, kKv, kTokens, 3 + s));
      q_.push_back(magicpig::testing::Randn(static_cast<size_t>(kHeads) * kD, rng));
      codes_.emplace_back(static_cast<size_t>(kHeads) * kL);
      ASSERT_TRUE(hash_->Codes(q_.back().data(), kHeads, kD, codes_.back().data()).ok());
    }
  }

  // kSequences sequences over both nodes, each with its rows in layers 0 and 1; coalesced or
  // with a stream per block.
  std::vector<std::unique_ptr<RemoteAttentionShards>> MakeSequences(const std::string& prefix,
                                                                    bool coalesced) {
    std::vector<std::unique_ptr<RemoteAttentionShards>> seqs;
    std::vector<AttendCoalescer*> coalescers;
    if (coalesced) {
      for (auto& c : coalescers_) coalescers.push_back(c.get());
    }
    for (int s = 0; s < kSequences; ++s) {
      seqs.push_back(std::make_unique<RemoteAttentionShards>(
          std::vector<AttentionNodeClient*>{clients_[0].get(), clients_[1].get()},
          prefix + std::to_string(s), Shape(), 16, kBlock,
          RemoteAttentionShards::kDefaultAttendTimeout, coalescers));
      const magicpig::testing::LayerData& d = data_[static_cast<size_t>(s)];
      for (int layer = 0; layer < 2; ++layer) {
        EXPECT_TRUE(seqs.back()
                        ->Append(layer, 0, kTokens, d.keys.data(), d.values.data(), d.codes.data())
                        .ok());
      }
    }
    return seqs;
  }

  // One batched step at `layer`: every sequence starts, then the flush, then every one finishes.
  std::vector<std::vector<PartialAttention>> Step(
      std::vector<std::unique_ptr<RemoteAttentionShards>>& seqs, int layer) {
    std::vector<std::vector<PartialAttention>> out(seqs.size());
    for (size_t s = 0; s < seqs.size(); ++s) {
      EXPECT_TRUE(seqs[s]->StartAttend(layer, q_[s].data(), codes_[s].data(), kScale).ok());
    }
    for (auto& seq : seqs) EXPECT_TRUE(seq->FlushStarted().ok());
    for (size_t s = 0; s < seqs.size(); ++s) {
      out[s].resize(kHeads);
      EXPECT_TRUE(seqs[s]->FinishAttend(out[s].data()).ok());
    }
    return out;
  }

  uint64_t RequestsSent() const {
    uint64_t n = 0;
    for (const auto& c : coalescers_) n += c->requests_sent();
    return n;
  }

  std::vector<std::unique_ptr<AttentionServer>> servers_;
  std::vector<std::unique_ptr<AttentionNodeClient>> clients_;
  std::vector<std::unique_ptr<AttendCoalescer>> coalescers_;
  std::unique_ptr<SimHash> hash_;
  std::vector<magicpig::testing::LayerData> data_;
  std::vector<std::vector<float>> q_;
  std::vector<std::vector<uint16_t>> codes_;
};

void ExpectSamePartials(const std::vector<PartialAttention>& a,
                        const std::vector<PartialAttention>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t h = 0; h < a.size(); ++h) {
    EXPECT_EQ(a[h].lse, b[h].lse) << "head " << h;
    EXPECT_EQ(a[h].n_touched, b[h].n_touched) << "head " << h;
    EXPECT_EQ(a[h].o, b[h].o) << "head " << h;
  }
}

TEST_F(AttendCoalescerTest, OneRequestPerNodeAndStepWithTheSamePartials) {
  auto separate = MakeSequences("sep", /*coalesced=*/false);
  auto shared = MakeSequences("co", /*coalesced=*/true);
  int nodes_used = 0;
  for (int n = 0; n < 2; ++n) {
    bool used = false;
    for (const auto& r : shared[0]->ranges()) used |= r.node == n;
    nodes_used += used;
  }
  ASSERT_EQ(nodes_used, 2);                   // every sequence has blocks on both nodes
  ASSERT_GT(shared[0]->ranges().size(), 2u);  // and more than one block on some node
  for (int step = 0; step < 3; ++step) {
    const int layer = step % 2;
    const auto want = Step(separate, layer);
    const uint64_t before = RequestsSent();
    const auto got = Step(shared, layer);
    // kSequences x (4 blocks) queries, two requests: one per node.
    EXPECT_EQ(RequestsSent() - before, 2u);
    for (int s = 0; s < kSequences; ++s) {
      SCOPED_TRACE(::testing::Message() << "step " << step << " sequence " << s);
      ExpectSamePartials(got[static_cast<size_t>(s)], want[static_cast<size_t>(s)]);
      for (const PartialAttention& p : got[static_cast<size_t>(s)]) EXPECT_GT(p.n_touched, 0);
    }
  }
}

// A request is cut before it passes the byte cap: with room for 3 queries per request, a step of
// 3 sequences x 4 blocks needs more than one request per node, with the same answers.
TEST_F(AttendCoalescerTest, RequestsAreCutAtTheirSizeCap) {
  const size_t per_query = std::string("co0/b0").size() + kHeads * kD * 4 +
                           static_cast<size_t>((kHeads * kL * kK + 7) / 8);
  for (int n = 0; n < 2; ++n) {
    coalescers_[static_cast<size_t>(n)] = std::make_unique<AttendCoalescer>(
        clients_[static_cast<size_t>(n)].get(), std::chrono::seconds(10), 3 * per_query + 8);
  }
  auto separate = MakeSequences("sep", /*coalesced=*/false);
  auto shared = MakeSequences("co", /*coalesced=*/true);
  size_t queries = 0;
  for (const auto& seq : shared) queries += seq->ranges().size();
  const uint64_t before = RequestsSent();
  const auto got = Step(shared, 0);
  const auto want = Step(separate, 0);
  // At most 3 queries per request: at least ceil(queries / 3) requests, more than one per node.
  EXPECT_GE(RequestsSent() - before, (queries + 2) / 3);
  EXPECT_GT(RequestsSent() - before, 2u);
  for (int s = 0; s < kSequences; ++s) {
    SCOPED_TRACE(::testing::Message() << "sequence " << s);
    ExpectSamePartials(got[static_cast<size_t>(s)], want[static_cast<size_t>(s)]);
  }
}

TEST_F(AttendCoalescerTest, AStepGivenUpIsDroppedAndLaterStepsAreExact) {
  auto separate = MakeSequences("sep", /*coalesced=*/false);
  auto shared = MakeSequences("co", /*coalesced=*/true);
  // Sequence 0 starts at layer 1 and is sent, then gives the step up; sequence 1 starts at layer
  // 1 and gives up before the flush (its query is withdrawn).
  ASSERT_TRUE(shared[0]->StartAttend(1, q_[0].data(), codes_[0].data(), kScale).ok());
  ASSERT_TRUE(shared[0]->FlushStarted().ok());
  ASSERT_TRUE(shared[1]->StartAttend(1, q_[1].data(), codes_[1].data(), kScale).ok());
  const auto want = Step(separate, 0);
  const auto got = Step(shared, 0);
  for (int s = 0; s < kSequences; ++s) {
    SCOPED_TRACE(::testing::Message() << "sequence " << s);
    ExpectSamePartials(got[static_cast<size_t>(s)], want[static_cast<size_t>(s)]);
  }
  // A plain Attend (start and finish with no flush in between) sends its own query.
  std::vector<PartialAttention> one(kHeads), ref(kHeads);
  ASSERT_TRUE(shared[2]->Attend(1, q_[2].data(), codes_[2].data(), kScale, one.data()).ok());
  ASSERT_TRUE(separate[2]->Attend(1, q_[2].data(), codes_[2].data(), kScale, ref.data()).ok());
  ExpectSamePartials(one, ref);
}

TEST_F(AttendCoalescerTest, StoppedNodeFailsItsTicketsRecoverably) {
  auto shared = MakeSequences("co", /*coalesced=*/true);
  (void)Step(shared, 0);
  servers_[1]->Shutdown(std::chrono::system_clock::now());
  servers_[1].reset();
  for (size_t s = 0; s < shared.size(); ++s) {
    ASSERT_TRUE(shared[s]->StartAttend(0, q_[s].data(), codes_[s].data(), kScale).ok());
  }
  for (auto& seq : shared) ASSERT_TRUE(seq->FlushStarted().ok());
  for (auto& seq : shared) {
    std::vector<PartialAttention> out(kHeads);
    const absl::Status status = seq->FinishAttend(out.data());
    ASSERT_FALSE(status.ok());
    EXPECT_TRUE(seq->IsRecoverable(status)) << status;
    EXPECT_NE(status.message().find(clients_[1]->address()), std::string::npos) << status;
  }
  // Node 0 still serves through its coalescer: a sequence placed there alone answers exactly
  // as over its own streams.
  RemoteAttentionShards alone({clients_[0].get()}, "alone", Shape(), 16, kBlock,
                              RemoteAttentionShards::kDefaultAttendTimeout, {coalescers_[0].get()});
  RemoteAttentionShards reference({clients_[0].get()}, "reference", Shape(), 16, kBlock);
  for (RemoteAttentionShards* seq : {&alone, &reference}) {
    ASSERT_TRUE(seq->Append(0, 0, kTokens, data_[0].keys.data(), data_[0].values.data(),
                            data_[0].codes.data())
                    .ok());
  }
  std::vector<PartialAttention> got(kHeads), want(kHeads);
  ASSERT_TRUE(alone.Attend(0, q_[0].data(), codes_[0].data(), kScale, got.data()).ok());
  ASSERT_TRUE(reference.Attend(0, q_[0].data(), codes_[0].data(), kScale, want.data()).ok());
  ExpectSamePartials(got, want);
  // The failed sequences recover by a fresh placement (on node 0, the one that answers).
  shared[0]->Reset();
  ASSERT_TRUE(shared[0]
                  ->Append(0, 0, kTokens, data_[0].keys.data(), data_[0].values.data(),
                           data_[0].codes.data())
                  .ok());
  std::vector<PartialAttention> again(kHeads);
  ASSERT_TRUE(shared[0]->Attend(0, q_[0].data(), codes_[0].data(), kScale, again.data()).ok());
  for (const auto& r : shared[0]->ranges()) EXPECT_EQ(r.node, 0);
}

}  // namespace
}  // namespace magicpig::remote
