// libFuzzer target for the attention node's request handling: the input is a script of protobuf
// messages, each decoded and handed to the same code the gRPC service runs (SequenceSpecFromProto,
// ChunkViewOf, QueryViewsOf and the ShardStore calls), as one of two owners.
//
// Script: repeated [op: 1 byte][length: 2 bytes, little-endian][length bytes of the message].
//   op % 8: 0 CreateSequenceRequest, 1 KvChunk (staged), 2 commit the staging, 3 AttendRequest,
//           4 ReleaseSequenceRequest, 5 ReleaseStaleRequest, 6 expire idle sequences (TTL 0),
//           7 drop the staging uncommitted
//   op / 8 % 2: the owner ("" or "token:b"); instance / incarnation come from the op too.
// A message that does not parse is skipped (gRPC would refuse it before the service).
//
// Checked after every step: the admitted charges never pass the budget; an OK Attend returns one
// result per query with finite outputs (lse finite or -inf). At the end, releasing everything
// leaves the store at 0 bytes, 0 staged bytes and 0 sequences.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attn_node/service/attention_service.h"
#include "attn_node/service/shard_store.h"
#include "google/protobuf/stubs/logging.h"
#include "magicpig/v1/attention.pb.h"
#include "tbb/global_control.h"

namespace {

using magicpig::AppendStaging;
using magicpig::ShardStore;
namespace v1 = ::magicpig::v1;

constexpr int64_t kBudget = int64_t{32} << 20;
const char* const kOwners[2] = {"", "token:b"};

void CheckBudget(const ShardStore& store) {
  const magicpig::StoreStats s = store.Stats();
  if (s.memory_used_bytes < 0 || s.memory_used_bytes > kBudget) __builtin_trap();
  if (s.staging_bytes < 0) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // One thread: table builds and attention run inline, so a crash has one stack.
  static tbb::global_control one_thread(tbb::global_control::max_allowed_parallelism, 1);
  // A string field with invalid UTF-8 fails to parse (as on the wire) and protobuf logs each such
  // failure: silence, not a finding.
  static const bool quiet = [] {
    google::protobuf::SetLogHandler(nullptr);
    return true;
  }();
  (void)quiet;
  ShardStore store(kBudget);
  {
    std::unique_ptr<AppendStaging> staging[2] = {std::make_unique<AppendStaging>(),
                                                 std::make_unique<AppendStaging>()};
    size_t at = 0;
    while (at + 3 <= size) {
      const uint8_t op = data[at];
      const size_t length = data[at + 1] | (static_cast<size_t>(data[at + 2]) << 8);
      at += 3;
      if (length > size - at) break;
      const void* bytes = data + at;
      at += length;
      const int who = (op / 8) % 2;
      const std::string owner = kOwners[who];
      switch (op % 8) {
        case 0: {
          v1::CreateSequenceRequest m;
          if (!m.ParseFromArray(bytes, static_cast<int>(length))) break;
          absl::StatusOr<magicpig::SequenceSpec> spec = magicpig::SequenceSpecFromProto(m);
          if (!spec.ok()) break;
          spec->owner = owner;
          spec->instance = (op & 16) ? "pod-a" : "pod-b";
          spec->incarnation = (op & 32) ? "1" : "2";
          (void)store.CreateSequence(*spec);
          break;
        }
        case 1: {
          v1::KvChunk m;
          if (!m.ParseFromArray(bytes, static_cast<int>(length))) break;
          (void)store.Stage(magicpig::ChunkViewOf(m, owner), staging[who].get());
          break;
        }
        case 2:
          (void)store.Commit(staging[who].get());
          break;
        case 3: {
          v1::AttendRequest m;
          if (!m.ParseFromArray(bytes, static_cast<int>(length))) break;
          const std::vector<magicpig::QueryView> queries = magicpig::QueryViewsOf(m);
          std::vector<magicpig::SequencePartialResult> out;
          const absl::Status s = store.Attend(m.layer(), m.scale(), queries, &out, owner);
          if (!s.ok()) break;
          if (out.size() != queries.size()) __builtin_trap();
          for (const magicpig::SequencePartialResult& r : out) {
            for (float x : r.o) {
              if (!std::isfinite(x)) __builtin_trap();
            }
            for (float l : r.lse) {
              if (std::isnan(l) || l == INFINITY) __builtin_trap();
            }
          }
          break;
        }
        case 4: {
          v1::ReleaseSequenceRequest m;
          if (!m.ParseFromArray(bytes, static_cast<int>(length))) break;
          (void)store.ReleaseSequence(m.sequence_id(), owner);
          break;
        }
        case 5: {
          v1::ReleaseStaleRequest m;
          if (!m.ParseFromArray(bytes, static_cast<int>(length))) break;
          (void)store.ReleaseStale(owner, m.instance(), m.incarnation());
          break;
        }
        case 6:
          (void)store.ReleaseIdle(std::chrono::nanoseconds(0),
                                  std::chrono::steady_clock::now() + std::chrono::hours(1));
          break;
        case 7:
          staging[who] = std::make_unique<AppendStaging>();
          break;
      }
      CheckBudget(store);
    }
  }  // the stagings are gone: their bytes must be back
  for (const magicpig::SequenceSummary& s : store.HeldSequences()) {
    if (!store.ReleaseSequence(s.id, s.owner).ok()) __builtin_trap();
  }
  const magicpig::StoreStats end = store.Stats();
  if (end.memory_used_bytes != 0 || end.staging_bytes != 0 || end.sequences != 0) {
    __builtin_trap();
  }
  return 0;
}
