// Test helpers for the attention service tests: synthetic KV data with SimHash codes, proto
// builders and blocking client calls against an in-process AttentionServer. Test-only.
#ifndef MAGICPIG_TESTS_TESTING_SERVICE_TEST_UTIL_H_
#define MAGICPIG_TESTS_TESTING_SERVICE_TEST_UTIL_H_

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "attn_node/service/attention_server.h"
#include "common/attention/code_packing.h"
#include "common/attention/simhash.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "magicpig/v1/attention.grpc.pb.h"

namespace magicpig::testing {

// One layer's data for n_kv heads: centred keys / values [n_kv][n][d], codes [n_kv][n][L].
struct LayerData {
  int n_kv = 0, n = 0, d = 0, k = 0, l = 0;
  std::vector<float> keys, values;
  std::vector<uint16_t> codes;

  const float* key(int h, int t) const { return keys.data() + (int64_t{h} * n + t) * d; }
  const float* value(int h, int t) const { return values.data() + (int64_t{h} * n + t) * d; }
  const uint16_t* code(int h, int t) const { return codes.data() + (int64_t{h} * n + t) * l; }
};

inline std::vector<float> Randn(size_t count, std::mt19937& rng, float sigma = 1.0f) {
  std::normal_distribution<float> nd(0.0f, sigma);
  std::vector<float> v(count);
  for (auto& x : v) x = nd(rng);
  return v;
}

// Keys with a shared direction (so attention is peaked), centred per head by their mean, and
// their codes from hash.
inline LayerData MakeLayer(const attention::SimHash& hash, int n_kv, int n, uint32_t seed) {
  LayerData data;
  data.n_kv = n_kv;
  data.n = n;
  data.d = static_cast<int>(hash.dim());
  data.k = hash.k();
  data.l = hash.l();
  std::mt19937 rng(seed);
  const int d = data.d;
  data.keys = Randn(static_cast<size_t>(n_kv) * n * d, rng);
  data.values = Randn(static_cast<size_t>(n_kv) * n * d, rng);
  for (int h = 0; h < n_kv; ++h) {
    std::vector<double> mean(d, 0.0);
    for (int t = 0; t < n; ++t)
      for (int j = 0; j < d; ++j) mean[j] += data.keys[(int64_t{h} * n + t) * d + j] / n;
    for (int t = 0; t < n; ++t)
      for (int j = 0; j < d; ++j)
        data.keys[(int64_t{h} * n + t) * d + j] -= static_cast<float>(mean[j]);
  }
  data.codes.resize(static_cast<size_t>(n_kv) * n * data.l);
  EXPECT_TRUE(hash.KeyCodes(data.keys.data(), int64_t{n_kv} * n, d, data.codes.data()).ok());
  return data;
}

inline std::string FloatBytes(const float* p, size_t count) {
  return std::string(reinterpret_cast<const char*>(p), count * sizeof(float));
}

inline std::vector<float> BytesToFloats(const std::string& s) {
  std::vector<float> v(s.size() / sizeof(float));
  if (!v.empty()) std::memcpy(v.data(), s.data(), v.size() * sizeof(float));
  return v;
}

// The chunk of positions [begin, begin + count) of `data` (which starts at position `pos0`).
inline v1::KvChunk MakeChunk(const std::string& id, int layer, const LayerData& data, int64_t pos0,
                             int begin, int count) {
  v1::KvChunk c;
  c.set_sequence_id(id);
  c.set_layer(layer);
  c.set_first_pos(pos0 + begin);
  c.set_n_tokens(count);
  std::string keys, values;
  std::vector<uint16_t> codes;
  for (int h = 0; h < data.n_kv; ++h) {
    keys += FloatBytes(data.key(h, begin), static_cast<size_t>(count) * data.d);
    values += FloatBytes(data.value(h, begin), static_cast<size_t>(count) * data.d);
    codes.insert(codes.end(), data.code(h, begin), data.code(h, begin) + int64_t{count} * data.l);
  }
  c.set_keys(keys);
  c.set_values(values);
  std::string packed;
  EXPECT_TRUE(
      attention::PackCodes(codes.data(), static_cast<int64_t>(codes.size()), data.k, &packed).ok());
  c.set_codes(packed);
  return c;
}

inline v1::CreateSequenceRequest MakeCreate(const std::string& id, std::vector<int> layers,
                                            int n_kv, int group, int d, int k, int l,
                                            v1::KvDtype dtype, v1::Estimator estimator,
                                            int64_t token_begin, int64_t max_tokens) {
  v1::CreateSequenceRequest r;
  r.set_sequence_id(id);
  v1::ShardShape* s = r.mutable_shape();
  for (int layer : layers) s->add_layers(layer);
  s->set_n_kv_heads(n_kv);
  s->set_group(group);
  s->set_head_dim(d);
  s->set_lsh_k(k);
  s->set_lsh_l(l);
  s->set_dtype(dtype);
  s->set_estimator(estimator);
  r.set_token_begin(token_begin);
  r.set_max_tokens(max_tokens);
  return r;
}

// A query message: q [heads][d] and their codes from hash.
inline v1::SequenceQuery MakeQuery(const std::string& id, const std::vector<float>& q,
                                   const attention::SimHash& hash,
                                   std::vector<uint16_t>* codes_out) {
  const int64_t heads = static_cast<int64_t>(q.size()) / hash.dim();
  std::vector<uint16_t> codes(static_cast<size_t>(heads * hash.l()));
  EXPECT_TRUE(hash.Codes(q.data(), heads, hash.dim(), codes.data()).ok());
  v1::SequenceQuery m;
  m.set_sequence_id(id);
  m.set_q(FloatBytes(q.data(), q.size()));
  std::string packed;
  EXPECT_TRUE(
      attention::PackCodes(codes.data(), static_cast<int64_t>(codes.size()), hash.k(), &packed)
          .ok());
  m.set_codes(packed);
  if (codes_out != nullptr) *codes_out = std::move(codes);
  return m;
}

// A blocking client of one server: plaintext and anonymous by default; `credentials` (with
// `arguments`) and `metadata` (sent on every call: owner token, instance, incarnation) make it
// someone.
class Client {
 public:
  explicit Client(const std::string& address,
                  std::vector<std::pair<std::string, std::string>> metadata = {},
                  std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr,
                  const grpc::ChannelArguments& arguments = {})
      : stub_(v1::AttentionService::NewStub(grpc::CreateCustomChannel(
            address, credentials != nullptr ? credentials : grpc::InsecureChannelCredentials(),
            arguments))),
        metadata_(std::move(metadata)) {}

  grpc::Status Create(const v1::CreateSequenceRequest& r,
                      v1::CreateSequenceResponse* out = nullptr) {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    v1::CreateSequenceResponse resp;
    grpc::Status s = stub_->CreateSequence(&ctx, r, &resp);
    if (out) *out = resp;
    return s;
  }

  grpc::Status Release(const std::string& id, v1::ReleaseSequenceResponse* out = nullptr) {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    v1::ReleaseSequenceRequest r;
    r.set_sequence_id(id);
    v1::ReleaseSequenceResponse resp;
    grpc::Status s = stub_->ReleaseSequence(&ctx, r, &resp);
    if (out) *out = resp;
    return s;
  }

  grpc::Status ReleaseStale(const std::string& instance, const std::string& incarnation,
                            v1::ReleaseStaleResponse* out = nullptr) {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    v1::ReleaseStaleRequest r;
    r.set_instance(instance);
    r.set_incarnation(incarnation);
    v1::ReleaseStaleResponse resp;
    grpc::Status s = stub_->ReleaseStale(&ctx, r, &resp);
    if (out) *out = resp;
    return s;
  }

  v1::NodeStatusResponse Status() {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    v1::NodeStatusResponse resp;
    EXPECT_TRUE(stub_->NodeStatus(&ctx, v1::NodeStatusRequest(), &resp).ok());
    return resp;
  }

  grpc::Status Append(const std::vector<v1::KvChunk>& chunks, v1::AppendKvResponse* out = nullptr) {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    v1::AppendKvResponse resp;
    auto writer = stub_->AppendKV(&ctx, &resp);
    for (const auto& c : chunks) {
      if (!writer->Write(c)) break;  // the server finished early (a bad chunk)
    }
    writer->WritesDone();
    grpc::Status s = writer->Finish();
    if (out) *out = resp;
    return s;
  }

  grpc::Status Attend(const std::vector<v1::AttendRequest>& requests,
                      std::vector<v1::AttendResponse>* out) {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    auto stream = stub_->Attend(&ctx);
    for (const auto& r : requests) {
      if (!stream->Write(r)) break;
    }
    stream->WritesDone();
    v1::AttendResponse resp;
    out->clear();
    while (stream->Read(&resp)) out->push_back(resp);
    return stream->Finish();
  }

  v1::AttentionService::Stub& stub() { return *stub_; }
  // Adds this client's metadata to a context.
  void Prepare(grpc::ClientContext* ctx) const {
    for (const auto& [key, value] : metadata_) ctx->AddMetadata(key, value);
  }

 private:
  std::unique_ptr<v1::AttentionService::Stub> stub_;
  std::vector<std::pair<std::string, std::string>> metadata_;
};

inline std::unique_ptr<AttentionServer> StartServer(const AttentionServerOptions& options) {
  auto server = AttentionServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(*server) : nullptr;
}

inline std::unique_ptr<AttentionServer> StartServer(int64_t budget, int threads = 2) {
  AttentionServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.memory_budget_bytes = budget;
  options.threads = threads;
  return StartServer(options);
}

}  // namespace magicpig::testing

#endif  // MAGICPIG_TESTS_TESTING_SERVICE_TEST_UTIL_H_
