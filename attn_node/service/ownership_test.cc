// Owners on an attention node (issue #36): each owner (a client certificate's subject with mTLS, a
// bearer token on plaintext) sees only its own sequences, and another owner's sequence answers
// exactly as an unknown id does; ReleaseStale drops a previous incarnation of the caller's own
// instance only; open upload streams are capped per owner and cancelled past their deadline.
#include <chrono>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "attn_node/service/attention_server.h"
#include "common/attention/simhash.h"
#include "common/fabric/call_identity.h"
#include "gtest/gtest.h"
#include "tests/testing/dev_pki.h"
#include "tests/testing/service_test_util.h"

namespace magicpig {
namespace {

using ::magicpig::attention::SimHash;
using testing::Client;
using testing::LayerData;

constexpr int kKv = 1, kGroup = 2, kDim = 32, kK = 4, kL = 8, kTokens = 64, kLayer = 0;

using Metadata = std::vector<std::pair<std::string, std::string>>;

Metadata Token(const std::string& token, const std::string& instance = "",
               const std::string& incarnation = "") {
  Metadata m = {{fabric::kOwnerTokenKey, token}};
  if (!instance.empty()) m.emplace_back(fabric::kInstanceKey, instance);
  if (!incarnation.empty()) m.emplace_back(fabric::kIncarnationKey, incarnation);
  return m;
}

class OwnershipTest : public ::testing::Test {
 protected:
  OwnershipTest()
      : hash_(*SimHash::Create(kDim, kK, kL, 7)),
        data_(testing::MakeLayer(hash_, kKv, kTokens, 3)) {}

  v1::CreateSequenceRequest Create(const std::string& id) const {
    return testing::MakeCreate(id, {kLayer}, kKv, kGroup, kDim, kK, kL, v1::KV_DTYPE_F32,
                               v1::ESTIMATOR_FULL, 0, 256);
  }
  v1::KvChunk Chunk(const std::string& id) const {
    return testing::MakeChunk(id, kLayer, data_, 0, 0, kTokens);
  }
  // Creates `id` and uploads its rows as `client`.
  void Fill(Client& client, const std::string& id) const {
    ASSERT_TRUE(client.Create(Create(id)).ok());
    const grpc::Status s = client.Append({Chunk(id)});
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  // One Attend of `id` as `client`.
  grpc::Status Attend(Client& client, const std::string& id) const {
    v1::AttendRequest request;
    request.set_step_id(1);
    request.set_layer(kLayer);
    request.set_scale(1.0f / std::sqrt(static_cast<float>(kDim)));
    std::mt19937 rng(1);
    *request.add_queries() = testing::MakeQuery(
        id, testing::Randn(static_cast<size_t>(kKv) * kGroup * kDim, rng), hash_, nullptr);
    std::vector<v1::AttendResponse> responses;
    return client.Attend({request}, &responses);
  }

  SimHash hash_;
  LayerData data_;
};

// What a stranger gets for someone's sequence is exactly what it gets for a free id.
TEST_F(OwnershipTest, AnotherOwnersSequenceLooksLikeNoSequence) {
  auto server = testing::StartServer(int64_t{1} << 30, 1);
  ASSERT_NE(server, nullptr);
  Client alice(server->address(), Token("alice")), bob(server->address(), Token("bob"));
  Client anonymous(server->address());

  // Before alice holds "s": bob's answers for a free id.
  const grpc::Status attend_free = Attend(bob, "s");
  const grpc::Status append_free = bob.Append({Chunk("s")});
  const grpc::Status release_free = bob.Release("s");
  ASSERT_EQ(attend_free.error_code(), grpc::StatusCode::NOT_FOUND);
  ASSERT_EQ(append_free.error_code(), grpc::StatusCode::NOT_FOUND);
  ASSERT_EQ(release_free.error_code(), grpc::StatusCode::NOT_FOUND);

  Fill(alice, "s");
  ASSERT_TRUE(Attend(alice, "s").ok());
  for (Client* stranger : {&bob, &anonymous}) {
    const grpc::Status attend = Attend(*stranger, "s");
    EXPECT_EQ(attend.error_code(), attend_free.error_code());
    EXPECT_EQ(attend.error_message(), attend_free.error_message());
    const grpc::Status append = stranger->Append({Chunk("s")});
    EXPECT_EQ(append.error_code(), append_free.error_code());
    EXPECT_EQ(append.error_message(), append_free.error_message());
    const grpc::Status release = stranger->Release("s");
    EXPECT_EQ(release.error_code(), release_free.error_code());
    EXPECT_EQ(release.error_message(), release_free.error_message());
  }
  // Alice's sequence is untouched: still attended, still holding its rows only once.
  EXPECT_TRUE(Attend(alice, "s").ok());
  EXPECT_EQ(server->store().Stats().kv_tokens, kTokens);

  // Ids are per owner: bob may use "s" too, and each sees its own.
  Fill(bob, "s");
  EXPECT_EQ(alice.Status().sequences(), 2);
  EXPECT_TRUE(Attend(bob, "s").ok());
  ASSERT_TRUE(alice.Release("s").ok());
  EXPECT_TRUE(Attend(bob, "s").ok());
  EXPECT_EQ(Attend(alice, "s").error_code(), grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(bob.Release("s").ok());
  EXPECT_EQ(server->store().Stats().memory_used_bytes, 0);
}

TEST_F(OwnershipTest, ReleaseStaleDropsOnlyTheCallersPreviousIncarnation) {
  auto server = testing::StartServer(int64_t{1} << 30, 1);
  ASSERT_NE(server, nullptr);
  const std::string& a = server->address();
  Client old_run(a, Token("alice", "pod-a", "run-1")), new_run(a, Token("alice", "pod-a", "run-2"));
  Client other_pod(a, Token("alice", "pod-b", "run-1")), bob(a, Token("bob", "pod-a", "run-1"));
  Fill(old_run, "s1");
  Fill(old_run, "s2");
  Fill(other_pod, "s3");
  Fill(bob, "s4");
  Fill(new_run, "s5");
  const int64_t before = server->store().Stats().memory_used_bytes;

  v1::ReleaseStaleResponse released;
  ASSERT_TRUE(new_run.ReleaseStale("pod-a", "run-2", &released).ok());
  EXPECT_EQ(released.sequences(), 2);
  EXPECT_EQ(server->store().Stats().memory_used_bytes, before - released.bytes_freed());
  EXPECT_GT(released.bytes_freed(), 0);
  EXPECT_EQ(Attend(new_run, "s1").error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Attend(new_run, "s2").error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(Attend(other_pod, "s3").ok()) << "another instance of the same owner";
  EXPECT_TRUE(Attend(bob, "s4").ok()) << "another owner with the same instance name";
  EXPECT_TRUE(Attend(new_run, "s5").ok()) << "the current incarnation";
  EXPECT_EQ(server->store().Stats().sequences, 3);

  // Bob cannot use ReleaseStale against alice: it only ever reaches the caller's own sequences.
  ASSERT_TRUE(bob.ReleaseStale("pod-b", "x", &released).ok());
  EXPECT_EQ(released.sequences(), 0);
  EXPECT_TRUE(Attend(other_pod, "s3").ok());

  const grpc::Status empty = new_run.ReleaseStale("", "run-2");
  EXPECT_EQ(empty.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(empty.error_message().find("instance"), std::string::npos) << empty.error_message();
}

// One upload stream that has sent a chunk and stays open.
struct OpenUpload {
  grpc::ClientContext context;
  v1::AppendKvResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::KvChunk>> writer;
};

std::unique_ptr<OpenUpload> Open(Client& client, const v1::KvChunk& chunk) {
  auto u = std::make_unique<OpenUpload>();
  client.Prepare(&u->context);
  u->writer = client.stub().AppendKV(&u->context, &u->response);
  u->writer->Write(chunk);
  return u;
}

grpc::Status Close(OpenUpload& u) {
  u.writer->WritesDone();
  return u.writer->Finish();
}

TEST_F(OwnershipTest, UploadStreamsAreCappedPerOwnerAndCancelledPastTheirDeadline) {
  AttentionServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.threads = 1;
  options.limits.max_upload_streams = 2;
  options.limits.upload_deadline = std::chrono::milliseconds(1500);
  auto server = testing::StartServer(options);
  ASSERT_NE(server, nullptr);
  Client alice(server->address(), Token("alice")), bob(server->address(), Token("bob"));
  ASSERT_TRUE(alice.Create(Create("a")).ok());
  ASSERT_TRUE(bob.Create(Create("b")).ok());

  auto first = Open(alice, Chunk("a"));
  auto second = Open(alice, Chunk("a"));
  // Both are registered (and staged) before the third arrives.
  for (int i = 0; i < 100 && server->service().uploads().open() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(server->service().uploads().open(), 2);
  auto third = Open(alice, Chunk("a"));
  const grpc::Status refused = Close(*third);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(refused.error_message().find("too many open AppendKV streams"), std::string::npos)
      << refused.error_message();
  // The cap is per owner: bob's stream goes through.
  EXPECT_TRUE(bob.Append({Chunk("b")}).ok());

  // Past the deadline (1.5 s; the housekeeping looks every second) alice's two idle streams are
  // cancelled: nothing committed, the staging given back, room for new streams.
  for (int i = 0; i < 500 && server->service().uploads().open() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(server->service().uploads().open(), 0);
  const grpc::Status cancelled = Close(*first);
  EXPECT_EQ(cancelled.error_code(), grpc::StatusCode::CANCELLED) << cancelled.error_message();
  EXPECT_EQ(Close(*second).error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(server->store().Stats().staging_bytes, 0);
  EXPECT_EQ(server->store().Stats().kv_tokens, kTokens) << "only bob's rows were committed";
  EXPECT_TRUE(alice.Append({Chunk("a")}).ok());
}

TEST_F(OwnershipTest, WithMutualTlsTheCertificateIsTheOwner) {
  testing::DevPki pki("owners");
  ASSERT_TRUE(pki.ok()) << "scripts/dev-certs failed (is openssl installed?)";
  AttentionServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.threads = 1;
  options.security = pki.Security("node");
  auto server = testing::StartServer(options);
  ASSERT_NE(server, nullptr);
  auto client = [&](const std::string& who, Metadata metadata = {}) {
    auto credentials = fabric::ChannelCredentials(pki.Security(who));
    EXPECT_TRUE(credentials.ok()) << credentials.status();
    return std::make_unique<Client>(server->address(), std::move(metadata), *credentials);
  };
  auto compute = client("compute");
  Fill(*compute, "s");
  // A second connection with the same certificate is the same owner.
  EXPECT_TRUE(Attend(*client("compute"), "s").ok());
  // Another certificate of the same CA is another owner, whatever token it sends.
  auto other = client("other", Token("anything"));
  EXPECT_EQ(Attend(*other, "s").error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(other->Release("s").error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(Attend(*compute, "s").ok());
  const std::vector<SequenceSummary> held = server->store().HeldSequences();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_NE(held[0].owner.find("CN=compute"), std::string::npos) << held[0].owner;
}

}  // namespace
}  // namespace magicpig
