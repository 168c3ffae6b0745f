// Round trip of one Attend on an attention node (issue #4 benchmark): the fixed cost of a remote
// sparse layer step, apart from the attention work itself.
//
// Against a running node (`magicpig_attn_node --listen 127.0.0.1:PORT`), with SmolLM2-135M's shard
// shape (3 kv heads x group 3, head_dim 64, K 10, L 150):
// - "empty": a sequence that holds no keys, so the node answers at once (gRPC + proto + dispatch
//   to oneTBB and back); the raw stub on one bidi stream, as the compute node keeps it;
// - "N tokens": RemoteAttentionShards (the compute node's code path: code packing, per-range
//   streams, LSE merge) over one block of N keys, so the node samples and attends them.
// Prints the median, p90, p99 and mean of each. A measurement: nothing is asserted.
//
// usage: magicpig_attend_rtt_bench --node HOST:PORT [--steps 2000] [--tokens 1024]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/attention/code_packing.h"
#include "common/attention/simhash.h"
#include "common/flags/flag_table.h"
#include "gpu_node/remote/remote_attention_shards.h"

namespace magicpig {

using ::magicpig::attention::PackCodes;
using ::magicpig::attention::PartialAttention;
using ::magicpig::attention::SimHash;
namespace {

constexpr int kKv = 3, kGroup = 3, kD = 64, kK = 10, kL = 150;
constexpr int kHeads = kKv * kGroup;

v1::ShardShape Shape() {
  v1::ShardShape s;
  s.add_layers(0);
  s.set_n_kv_heads(kKv);
  s.set_group(kGroup);
  s.set_head_dim(kD);
  s.set_lsh_k(kK);
  s.set_lsh_l(kL);
  s.set_dtype(v1::KV_DTYPE_BF16);
  s.set_estimator(v1::ESTIMATOR_MAGICPIG);
  s.set_seed(1234);
  return s;
}

std::vector<float> Randn(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

void Report(const char* what, std::vector<double> us) {
  std::sort(us.begin(), us.end());
  double mean = 0;
  for (double x : us) mean += x / static_cast<double>(us.size());
  auto at = [&](double p) {
    return us[static_cast<size_t>(p * static_cast<double>(us.size() - 1))];
  };
  std::printf("| %s | %zu | %.1f | %.1f | %.1f | %.1f |\n", what, us.size(), at(0.5), at(0.9),
              at(0.99), mean);
}

double Micros(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

struct Flags {
  std::string node;
  int64_t steps = 2000;
  int64_t tokens = 1024;
};

int Run(const Flags& flags) {
  const int64_t* steps = &flags.steps;
  const int64_t* tokens = &flags.tokens;
  remote::AttentionNodeClient node(flags.node);
  std::mt19937 rng(7);
  auto hash = SimHash::Create(kD, kK, kL, 1234);
  if (!hash.ok()) return 1;
  const std::vector<float> q = Randn(kHeads * kD, rng);
  std::vector<uint16_t> q_codes(kHeads * kL);
  if (!hash->Codes(q.data(), kHeads, kD, q_codes.data()).ok()) return 1;
  std::printf(
      "| Attend | steps | p50 us | p90 us | p99 us | mean us |\n|---|---|---|---|---|---|\n");

  {  // Empty: the raw stub on one stream.
    grpc::ClientContext ctx;
    v1::CreateSequenceRequest create;
    v1::CreateSequenceResponse created;
    create.set_sequence_id("rtt-empty");
    *create.mutable_shape() = Shape();
    create.set_max_tokens(1);
    const grpc::Status s = node.stub().CreateSequence(&ctx, create, &created);
    if (!s.ok()) {
      std::fprintf(stderr, "CreateSequence: %s\n", s.error_message().c_str());
      return 1;
    }
    v1::AttendRequest req;
    req.set_layer(0);
    req.set_scale(0.125f);
    v1::SequenceQuery* query = req.add_queries();
    query->set_sequence_id("rtt-empty");
    query->set_q(std::string(reinterpret_cast<const char*>(q.data()), q.size() * sizeof(float)));
    if (!PackCodes(q_codes.data(), kHeads * kL, kK, query->mutable_codes()).ok()) return 1;
    grpc::ClientContext stream_ctx;
    auto stream = node.stub().Attend(&stream_ctx);
    std::vector<double> us;
    for (int64_t i = 0; i < *steps; ++i) {
      req.set_step_id(static_cast<uint64_t>(i + 1));
      v1::AttendResponse resp;
      const auto t0 = std::chrono::steady_clock::now();
      if (!stream->Write(req) || !stream->Read(&resp)) {
        stream->WritesDone();
        std::fprintf(stderr, "Attend: %s\n", stream->Finish().error_message().c_str());
        return 1;
      }
      if (i >= 10) us.push_back(Micros(t0));  // the first few warm the connection
    }
    stream->WritesDone();
    (void)stream->Finish();
    grpc::ClientContext release_ctx;
    v1::ReleaseSequenceRequest release;
    v1::ReleaseSequenceResponse released;
    release.set_sequence_id("rtt-empty");
    (void)node.stub().ReleaseSequence(&release_ctx, release, &released);
    Report("empty sequence (raw stub)", std::move(us));
  }

  {  // The compute node's path over one block of `tokens` keys.
    const int64_t n = *tokens;
    std::vector<float> keys = Randn(static_cast<size_t>(kKv * n * kD), rng);
    std::vector<float> values = Randn(keys.size(), rng);
    std::vector<uint16_t> codes(static_cast<size_t>(kKv * n * kL));
    if (!hash->KeyCodes(keys.data(), kKv * n, kD, codes.data()).ok()) return 1;
    remote::RemoteAttentionShards shards({&node}, "rtt-shards", Shape(), 0, 0);
    absl::Status s = shards.Append(0, 0, n, keys.data(), values.data(), codes.data());
    std::vector<PartialAttention> out(kHeads);
    std::vector<double> us;
    for (int64_t i = 0; i < *steps && s.ok(); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      s = shards.Attend(0, q.data(), q_codes.data(), 0.125f, out.data());
      if (i >= 10) us.push_back(Micros(t0));
    }
    if (!s.ok()) {
      std::fprintf(stderr, "Attend: %s\n", s.ToString().c_str());
      return 1;
    }
    Report(absl::StrCat(n, " tokens (RemoteAttentionShards)").c_str(), std::move(us));
  }
  return 0;
}

}  // namespace
}  // namespace magicpig

int main(int argc, char** argv) {
  magicpig::Flags flags;
  magicpig::flags::FlagTable table(
      "magicpig_attend_rtt_bench",
      "Round-trip time of Attend against a running attention node: the raw stub on an empty "
      "sequence, then the compute node's client over one block of keys.");
  table.Text("node", &flags.node, "HOST:PORT", "the attention node");
  table.Require("node");
  table.Number("steps", &flags.steps, "Attend calls per case", int64_t{10}, int64_t{1} << 30);
  table.Number("tokens", &flags.tokens, "keys in the block", int64_t{1}, int64_t{1} << 30);
  if (absl::Status s = table.Parse(std::vector<std::string>(argv + 1, argv + argc)); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (table.help_requested()) {
    std::fputs(table.Help().c_str(), stdout);
    return 0;
  }
  return magicpig::Run(flags);
}
