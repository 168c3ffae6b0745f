#include "gpu_node/remote/remote_attention_shards.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/attention/code_packing.h"
#include "common/status_macros.h"

namespace magicpig::remote {

using ::magicpig::attention::MergePartials;
using ::magicpig::attention::PackCodes;
using ::magicpig::attention::PartialAttention;
namespace v1 = ::magicpig::v1;

namespace {
// Deadlines: control calls are small; a chunked AppendKV of one layer's rows is bounded by the
// network; a node that stops answering is treated as failed (recoverable) rather than waited on.
constexpr int kControlSeconds = 10;
constexpr int kAppendSeconds = 120;
// NodeStatus before a placement and ReleaseSequence: a node that cannot answer these small calls
// this fast gets no new shards now (and its releases are retried in the background).
constexpr std::chrono::milliseconds kProbeTimeout{2000};

std::chrono::system_clock::time_point Deadline(int seconds) {
  return std::chrono::system_clock::now() + std::chrono::seconds(seconds);
}
}  // namespace

namespace {
// A unary call's metrics: its message bytes (the response only when it came) and its failure.
void Count(const AttentionNodeClient& node, const grpc::Status& status,
           const google::protobuf::Message& request, const google::protobuf::Message& response) {
  node.metrics().Sent(request.ByteSizeLong());
  if (status.ok()) node.metrics().Received(response.ByteSizeLong());
  node.metrics().Finished(status);
}
}  // namespace

RemoteAttentionShards::RemoteAttentionShards(std::vector<AttentionNodeClient*> nodes,
                                             std::string sequence_id, v1::ShardShape shape,
                                             int64_t reserve_tokens, int64_t block,
                                             std::chrono::milliseconds attend_timeout,
                                             std::vector<AttendCoalescer*> coalescers)
    : nodes_(std::move(nodes)),
      coalescers_(std::move(coalescers)),
      sequence_id_(std::move(sequence_id)),
      shape_(std::move(shape)),
      reserve_tokens_(reserve_tokens),
      block_(block > 0 ? block : int64_t{1} << 40),
      attend_timeout_(attend_timeout) {
  int64_t max_layer = 0;
  for (int32_t l : shape_.layers()) max_layer = std::max<int64_t>(max_layer, l);
  layer_size_.assign(static_cast<size_t>(max_layer + 1), 0);
}

RemoteAttentionShards::~RemoteAttentionShards() {
  (void)WaitUpload();
  SettleTickets();
  Release();
}

void RemoteAttentionShards::SettleTickets() {
  for (size_t ri = 0; ri < tickets_.size(); ++ri) {
    if (tickets_[ri] == nullptr || ri >= ranges_.size()) continue;
    AttendCoalescer& c = *coalescers_[static_cast<size_t>(ranges_[ri].node)];
    c.Cancel(tickets_[ri]);
    (void)c.Wait(*tickets_[ri]);  // done at once if cancelled or failed
  }
  tickets_.clear();
}

void RemoteAttentionShards::Release() {
  std::vector<AttentionNodeClient*> nodes;
  std::vector<v1::ReleaseSequenceRequest> requests;
  for (Range& r : ranges_) {
    // Cancelled: the stream may hold an unread answer (after another node failed mid-step).
    CancelAttendStream(r.attend_context, r.attend_stream);
    AttentionNodeClient* node = nodes_[static_cast<size_t>(r.node)];
    if (std::find(failed_.begin(), failed_.end(), r.node) != failed_.end()) {
      // A failed node would hold this call for its deadline: try again in the background.
      if (deferred_ != nullptr) deferred_->Add(node, r.id);
      continue;
    }
    nodes.push_back(node);
    requests.emplace_back().set_sequence_id(r.id);
  }
  // All at once, briefly: a node that does not answer (frozen, or gone meanwhile) gets the
  // release again in the background, or its lease frees the shard.
  std::vector<v1::ReleaseSequenceResponse> answers;
  const std::vector<grpc::Status> statuses =
      CallAll(nodes, requests, &answers, kProbeTimeout,
              [](AttentionNodeClient& node, grpc::ClientContext* context,
                 const v1::ReleaseSequenceRequest* request, v1::ReleaseSequenceResponse* response,
                 std::function<void(grpc::Status)> done) {
                node.stub().async()->ReleaseSequence(context, request, response, std::move(done));
              });
  for (size_t k = 0; k < nodes.size(); ++k) {
    Count(*nodes[k], statuses[k], requests[k], answers[k]);
    const grpc::StatusCode code = statuses[k].error_code();
    if ((code == grpc::StatusCode::DEADLINE_EXCEEDED || code == grpc::StatusCode::UNAVAILABLE) &&
        deferred_ != nullptr) {
      deferred_->Add(nodes[k], requests[k].sequence_id());
    }
  }
  ranges_.clear();
}

bool RemoteAttentionShards::IsRecoverable(const absl::Status& status) const {
  return absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status) ||
         absl::IsCancelled(status) || absl::IsAborted(status) || absl::IsNotFound(status);
}

absl::Status RemoteAttentionShards::NoteFailure(const Range& range, absl::Status status) {
  if (IsRecoverable(status) &&
      std::find(failed_.begin(), failed_.end(), range.node) == failed_.end()) {
    failed_.push_back(range.node);
  }
  return status;
}

void RemoteAttentionShards::Reset() {
  // Streams to a dead node end with an error; Release ignores it, and so does Reset an upload's.
  (void)WaitUpload();
  SettleTickets();
  pending_heads_ = 0;
  Release();
  std::fill(layer_size_.begin(), layer_size_.end(), 0);
}

std::vector<int64_t> ApportionBlocks(int64_t n_blocks, const std::vector<int64_t>& free) {
  std::vector<int64_t> counts(free.size(), 0);
  double total = 0;
  for (int64_t f : free) total += static_cast<double>(f);
  if (free.empty() || n_blocks <= 0 || total <= 0) return counts;
  // Largest remainders: each node first gets the whole blocks of its share, then the blocks left
  // go to the largest fractions (ties: more free memory, then the lower index). Rounding every
  // share down and giving the rest to the last node would send every one-block region (a 4K
  // prompt with 4K blocks) to that node whatever the others hold.
  std::vector<double> fraction(free.size());
  int64_t given = 0;
  for (size_t i = 0; i < free.size(); ++i) {
    const double share = static_cast<double>(n_blocks) * static_cast<double>(free[i]) / total;
    counts[i] = static_cast<int64_t>(share);
    fraction[i] = share - static_cast<double>(counts[i]);
    given += counts[i];
  }
  std::vector<size_t> order(free.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (fraction[a] != fraction[b]) return fraction[a] > fraction[b];
    return free[a] > free[b];
  });
  for (size_t k = 0; given < n_blocks; k = (k + 1) % order.size(), ++given) ++counts[order[k]];
  return counts;
}

absl::Status RemoteAttentionShards::Place(int64_t begin, int64_t n) {
  std::vector<int> candidates;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (std::find(failed_.begin(), failed_.end(), static_cast<int>(i)) == failed_.end()) {
      candidates.push_back(static_cast<int>(i));
    }
  }
  absl::Status status = PlaceOn(begin, n, candidates);
  if (status.ok() || failed_.empty()) return status;
  const bool only_failed = candidates.empty();
  // The nodes that failed for this sequence (or the one it replaces) may be back: restarted,
  // thawed or reachable again. Rather than fail, try them too, as fresh candidates.
  const std::vector<int> failed = failed_;
  failed_.clear();
  absl::Status retry = PlaceOn(begin, n, failed);
  if (retry.ok()) return retry;
  failed_ = failed;
  return only_failed ? retry : status;
}

absl::Status RemoteAttentionShards::PlaceOn(int64_t begin, int64_t n, std::vector<int> candidates) {
  const size_t tried = candidates.size();
  absl::Status last_refusal;
  // Whether any node answered NodeStatus, and why the last one that did not failed: with none
  // answering, the sequence fails as UNAVAILABLE (unreachable, or refused at the TLS handshake),
  // not as a lack of room.
  bool any_answered = false;
  grpc::Status last_unreachable;
  bool whole = placement_ == Placement::kPack;  // first try: every block on the freest node
  while (!candidates.empty()) {
    // Free memory per candidate, asked of all at once; a node that does not answer within
    // kProbeTimeout (a frozen or unreachable one) is left out.
    std::vector<int> live;
    std::vector<int64_t> free;
    std::vector<AttentionNodeClient*> asked;
    for (int c : candidates) asked.push_back(nodes_[static_cast<size_t>(c)]);
    std::vector<v1::NodeStatusRequest> requests(asked.size());
    std::vector<v1::NodeStatusResponse> answers;
    const std::vector<grpc::Status> statuses =
        CallAll(asked, requests, &answers, std::min(attend_timeout_, kProbeTimeout),
                [](AttentionNodeClient& node, grpc::ClientContext* context,
                   const v1::NodeStatusRequest* request, v1::NodeStatusResponse* response,
                   std::function<void(grpc::Status)> done) {
                  node.stub().async()->NodeStatus(context, request, response, std::move(done));
                });
    for (size_t k = 0; k < candidates.size(); ++k) {
      Count(*asked[k], statuses[k], requests[k], answers[k]);
      if (!statuses[k].ok()) {
        last_unreachable = statuses[k];
        continue;
      }
      any_answered = true;
      const v1::NodeStatusResponse& st = answers[k];
      if (st.draining()) continue;
      live.push_back(candidates[k]);
      free.push_back(std::max<int64_t>(0, st.memory_budget_bytes() - st.memory_used_bytes()));
    }
    int64_t total = 0;
    for (int64_t f : free) total += f;
    if (live.empty() || total == 0) break;
    // Blocks of the region; runs of consecutive blocks per node in node order, sized in proportion
    // to free memory.
    const int64_t n_blocks = (n + block_ - 1) / block_;
    // Whole: the node that one block would go to (the freest, by the same tie rule) takes all.
    std::vector<int64_t> counts = ApportionBlocks(whole ? 1 : n_blocks, free);
    if (whole) {
      for (int64_t& c : counts) c *= n_blocks;
    }
    std::vector<Range> ranges;
    int64_t next_block = 0;
    for (size_t i = 0; i < live.size(); ++i) {
      const int64_t count = counts[i];
      for (int64_t b = next_block; b < next_block + count; ++b) {
        Range r;
        r.id = absl::StrCat(sequence_id_, "/b", b);
        r.node = live[i];
        r.begin = begin + b * block_;
        r.end = std::min(begin + n, r.begin + block_);
        ranges.push_back(std::move(r));
      }
      next_block += count;
    }
    absl::Status status;
    size_t created = 0;
    for (; created < ranges.size(); ++created) {
      Range& r = ranges[created];
      grpc::ClientContext ctx;
      ctx.set_deadline(Deadline(kControlSeconds));
      v1::CreateSequenceRequest req;
      v1::CreateSequenceResponse resp;
      req.set_sequence_id(r.id);
      *req.mutable_shape() = shape_;
      req.set_token_begin(r.begin);
      req.set_max_tokens(r.end - r.begin + (created + 1 == ranges.size() ? reserve_tokens_ : 0));
      AttentionNodeClient& node = *nodes_[static_cast<size_t>(r.node)];
      node.Identify(&ctx);
      const grpc::Status created_status = node.stub().CreateSequence(&ctx, req, &resp);
      Count(node, created_status, req, resp);
      status = FromGrpc(created_status, "CreateSequence", node.address());
      if (!status.ok()) break;
    }
    if (status.ok()) {
      ranges_ = std::move(ranges);
      return absl::OkStatus();
    }
    // Undo this attempt; a full node leaves the placement, anything else is an error.
    for (size_t i = 0; i < created; ++i) {
      grpc::ClientContext ctx;
      ctx.set_deadline(Deadline(kControlSeconds));
      v1::ReleaseSequenceRequest req;
      v1::ReleaseSequenceResponse resp;
      req.set_sequence_id(ranges[i].id);
      AttentionNodeClient& node = *nodes_[static_cast<size_t>(ranges[i].node)];
      node.Identify(&ctx);
      const grpc::Status released = node.stub().ReleaseSequence(&ctx, req, &resp);
      Count(node, released, req, resp);
    }
    if (!absl::IsResourceExhausted(status)) return status;
    last_refusal = status;
    if (whole) {
      whole = false;  // it does not fit on one node: spread it over all of them
      continue;
    }
    candidates.erase(std::find(candidates.begin(), candidates.end(), ranges[created].node));
  }
  if (!any_answered && !last_unreachable.ok()) {
    return absl::UnavailableError(absl::StrCat("no attention node answered (", tried,
                                               " tried) for sequence ", sequence_id_,
                                               "; last error: ", last_unreachable.error_message()));
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "no attention node has room for the ", n, " offloaded tokens of sequence ", sequence_id_,
      last_refusal.ok() ? "" : absl::StrCat(" (last refusal: ", last_refusal.message(), ")")));
}

absl::Status RemoteAttentionShards::Serialize(const Range& range, size_t range_index, int64_t layer,
                                              int64_t first_pos, int64_t n, int64_t row_offset,
                                              int64_t total_rows, const float* keys,
                                              const float* values, const uint16_t* codes,
                                              RangeUpload* out) const {
  const int64_t n_kv = shape_.n_kv_heads(), d = shape_.head_dim(), l = shape_.lsh_l();
  // About 1 MiB of keys + values per chunk.
  const int64_t per_chunk = std::clamp<int64_t>((int64_t{1} << 20) / (n_kv * d * 8), 1, 4096);
  out->range = range_index;
  out->node = nodes_[static_cast<size_t>(range.node)];
  std::vector<uint16_t> chunk_codes;
  for (int64_t c0 = 0; c0 < n; c0 += per_chunk) {
    const int64_t cn = std::min(per_chunk, n - c0);
    v1::KvChunk& chunk = out->chunks.emplace_back();
    chunk.set_sequence_id(range.id);
    chunk.set_layer(static_cast<int32_t>(layer));
    chunk.set_first_pos(first_pos + c0);
    chunk.set_n_tokens(static_cast<int32_t>(cn));
    std::string* k = chunk.mutable_keys();
    std::string* v = chunk.mutable_values();
    k->resize(static_cast<size_t>(n_kv * cn * d * 4));
    v->resize(k->size());
    chunk_codes.resize(static_cast<size_t>(n_kv * cn * l));
    for (int64_t g = 0; g < n_kv; ++g) {
      const int64_t src_row = g * total_rows + row_offset + c0;
      std::memcpy(k->data() + g * cn * d * 4, keys + src_row * d, cn * d * 4);
      std::memcpy(v->data() + g * cn * d * 4, values + src_row * d, cn * d * 4);
      std::copy(codes + src_row * l, codes + (src_row + cn) * l, chunk_codes.begin() + g * cn * l);
    }
    MAGICPIG_RETURN_IF_ERROR(
        PackCodes(chunk_codes.data(), n_kv * cn * l, shape_.lsh_k(), chunk.mutable_codes()));
  }
  return absl::OkStatus();
}

RemoteAttentionShards::UploadResult RemoteAttentionShards::Upload(
    std::vector<RangeUpload> uploads) {
  UploadResult result;
  for (RangeUpload& u : uploads) {
    AttentionNodeClient& node = *u.node;
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline(kAppendSeconds));
    node.Identify(&ctx);
    v1::AppendKvResponse resp;
    std::unique_ptr<grpc::ClientWriter<v1::KvChunk>> writer = node.stub().AppendKV(&ctx, &resp);
    for (const v1::KvChunk& chunk : u.chunks) {
      if (!writer->Write(chunk)) break;  // the stream failed: Finish says why
      node.metrics().Sent(chunk.ByteSizeLong());
    }
    writer->WritesDone();
    const grpc::Status status = writer->Finish();
    node.metrics().Finished(status);
    if (!status.ok()) {
      result.status = FromGrpc(status, "AppendKV", node.address());
      result.failed_range = u.range;
      return result;
    }
    node.metrics().Received(resp.ByteSizeLong());
    result.range_bytes.emplace_back(u.range, resp.bytes());
  }
  return result;
}

absl::Status RemoteAttentionShards::WaitUpload() {
  if (!upload_.valid()) return absl::OkStatus();
  UploadResult result = upload_.get();
  for (const auto& [range, bytes] : result.range_bytes) {
    if (range < ranges_.size()) ranges_[range].bytes = bytes;
  }
  if (result.status.ok()) return absl::OkStatus();
  return NoteFailure(ranges_[result.failed_range], std::move(result.status));
}

absl::Status RemoteAttentionShards::Append(int64_t layer, int64_t first_pos, int64_t n,
                                           const float* keys, const float* values,
                                           const uint16_t* codes) {
  if (n <= 0) return absl::OkStatus();
  if (layer < 0 || layer >= static_cast<int64_t>(layer_size_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", layer, " is not a sparse layer"));
  }
  if (ranges_.empty()) MAGICPIG_RETURN_IF_ERROR(Place(first_pos, n));
  // Rows past the placed region (tokens leaving the static window) go to the last range.
  if (first_pos + n > ranges_.back().end) ranges_.back().end = first_pos + n;
  std::vector<RangeUpload> uploads;
  for (size_t ri = 0; ri < ranges_.size(); ++ri) {
    const Range& r = ranges_[ri];
    const int64_t lo = std::max(r.begin, first_pos), hi = std::min(r.end, first_pos + n);
    if (lo >= hi) continue;
    MAGICPIG_RETURN_IF_ERROR(Serialize(r, ri, layer, lo, hi - lo, lo - first_pos, n, keys, values,
                                       codes, &uploads.emplace_back()));
  }
  // One upload in flight: the previous one (another layer, or this layer's earlier rows) first.
  MAGICPIG_RETURN_IF_ERROR(WaitUpload());
  upload_ = std::async(std::launch::async, &RemoteAttentionShards::Upload, std::move(uploads));
  layer_size_[static_cast<size_t>(layer)] += n;
  return absl::OkStatus();
}

absl::Status RemoteAttentionShards::CloseBrokenStream(Range& r) {
  return NoteFailure(r, CloseFailedAttendStream(*nodes_[static_cast<size_t>(r.node)],
                                                r.attend_context, r.attend_stream));
}

absl::Status RemoteAttentionShards::Attend(int64_t layer, const float* q, const uint16_t* codes,
                                           float scale, PartialAttention* out) {
  MAGICPIG_RETURN_IF_ERROR(StartAttend(layer, q, codes, scale));
  return FinishAttend(out);
}

absl::Status RemoteAttentionShards::StartAttend(int64_t layer, const float* q,
                                                const uint16_t* codes, float scale) {
  const int64_t n_head = static_cast<int64_t>(shape_.n_kv_heads()) * shape_.group();
  const int64_t d = shape_.head_dim();
  if (pending_heads_ != 0) {
    // The last step was abandoned (another sequence's failure ended the batched step between
    // StartAttend and FinishAttend): its answers are unread on the streams, so drop them.
    for (Range& r : ranges_) CancelAttendStream(r.attend_context, r.attend_stream);
  }
  SettleTickets();  // a coalesced step that was given up
  pending_heads_ = 0;
  MAGICPIG_RETURN_IF_ERROR(WaitUpload());  // the rows this step attends to are all on the nodes
  if (!coalescers_.empty()) {
    const std::string q_bytes(reinterpret_cast<const char*>(q), n_head * d * sizeof(float));
    std::string packed;
    MAGICPIG_RETURN_IF_ERROR(PackCodes(codes, n_head * shape_.lsh_l(), shape_.lsh_k(), &packed));
    tickets_.resize(ranges_.size());
    for (size_t ri = 0; ri < ranges_.size(); ++ri) {
      const Range& r = ranges_[ri];
      tickets_[ri] = coalescers_[static_cast<size_t>(r.node)]->Add(static_cast<int32_t>(layer),
                                                                   scale, r.id, q_bytes, packed);
    }
    pending_heads_ = n_head;
    return absl::OkStatus();
  }
  v1::AttendRequest req;
  req.set_step_id(++step_);
  req.set_layer(static_cast<int32_t>(layer));
  req.set_scale(scale);
  v1::SequenceQuery* query = req.add_queries();
  query->set_q(std::string(reinterpret_cast<const char*>(q), n_head * d * sizeof(float)));
  MAGICPIG_RETURN_IF_ERROR(
      PackCodes(codes, n_head * shape_.lsh_l(), shape_.lsh_k(), query->mutable_codes()));
  // Send to every node first so they work in parallel; FinishAttend collects.
  sent_at_.resize(ranges_.size());
  for (size_t ri = 0; ri < ranges_.size(); ++ri) {
    Range& r = ranges_[ri];
    AttentionNodeClient& node = *nodes_[static_cast<size_t>(r.node)];
    query->set_sequence_id(r.id);
    if (r.attend_stream == nullptr) {
      r.attend_context = std::make_unique<grpc::ClientContext>();
      node.Identify(r.attend_context.get());
      r.attend_stream = node.stub().Attend(r.attend_context.get());
    }
    sent_at_[ri] = std::chrono::steady_clock::now();
    if (!r.attend_stream->Write(req)) return CloseBrokenStream(r);
    node.metrics().Sent(req.ByteSizeLong());
  }
  pending_heads_ = n_head;
  return absl::OkStatus();
}

absl::Status RemoteAttentionShards::FlushStarted() {
  for (size_t ri = 0; ri < tickets_.size(); ++ri) {
    coalescers_[static_cast<size_t>(ranges_[ri].node)]->Flush();  // no-op once sent
  }
  return absl::OkStatus();
}

absl::Status RemoteAttentionShards::FinishCoalesced(int64_t n_head) {
  for (size_t ri = 0; ri < ranges_.size(); ++ri) {
    const Range& r = ranges_[ri];
    AttendCoalescer::Ticket& t = *tickets_[ri];
    const absl::Status status = coalescers_[static_cast<size_t>(r.node)]->Wait(t);
    if (!status.ok()) {
      // The step's other tickets stay: Reset (recovery) or the next StartAttend settles them
      // before anything is released on their nodes.
      return NoteFailure(r, status);
    }
    if (t.partial.sequence_id() != r.id || !TakePartial(t.partial, n_head, ri)) {
      return absl::InternalError(absl::StrCat("malformed Attend answer for ", r.id,
                                              " from attention node ",
                                              nodes_[static_cast<size_t>(r.node)]->address()));
    }
  }
  tickets_.clear();
  return absl::OkStatus();
}

absl::Status RemoteAttentionShards::FinishAttend(PartialAttention* out) {
  const int64_t n_head = pending_heads_;
  if (n_head == 0) return absl::FailedPreconditionError("FinishAttend without a started step");
  pending_heads_ = 0;
  node_parts_.assign(ranges_.size() * static_cast<size_t>(n_head), PartialAttention{});
  if (!coalescers_.empty()) {
    MAGICPIG_RETURN_IF_ERROR(FinishCoalesced(n_head));
    MergeNodeParts(n_head, out);
    return absl::OkStatus();
  }
  std::vector<grpc::ClientContext*> contexts;
  for (Range& r : ranges_) contexts.push_back(r.attend_context.get());
  watchdog_.Arm(std::chrono::steady_clock::now() + attend_timeout_, std::move(contexts));
  for (size_t ri = 0; ri < ranges_.size(); ++ri) {
    Range& r = ranges_[ri];
    AttentionNodeClient& node = *nodes_[static_cast<size_t>(r.node)];
    v1::AttendResponse resp;
    if (!r.attend_stream->Read(&resp)) {
      if (!watchdog_.Disarm()) return CloseBrokenStream(r);
      // No answer in time: the node counts as failed (hung or stopped); the others' streams were
      // cancelled too and are finished by the Reset that recovery starts with.
      node.metrics().Finished(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, ""));
      return NoteFailure(r, absl::DeadlineExceededError(absl::StrCat(
                                "Attend on attention node ", node.address(), ": no answer within ",
                                attend_timeout_.count(), " ms")));
    }
    node.metrics().RoundTrip(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - sent_at_[ri]).count());
    node.metrics().Received(resp.ByteSizeLong());
    if (resp.step_id() != step_ || resp.partials_size() != 1 ||
        !TakePartial(resp.partials(0), n_head, ri)) {
      watchdog_.Disarm();
      return absl::InternalError(
          absl::StrCat("malformed Attend response from attention node ", node.address()));
    }
  }
  if (watchdog_.Disarm()) {
    // The deadline passed as the last answer came: the streams were cancelled, so the next step
    // would fail on them; close them now and let the next StartAttend open fresh ones.
    for (Range& r : ranges_) {
      if (r.attend_stream == nullptr) continue;
      (void)r.attend_stream->Finish();
      r.attend_stream.reset();
      r.attend_context.reset();
    }
  }
  MergeNodeParts(n_head, out);
  return absl::OkStatus();
}

bool RemoteAttentionShards::TakePartial(const v1::SequencePartial& p, int64_t n_head,
                                        size_t range) {
  const int64_t d = shape_.head_dim();
  if (p.o().size() != static_cast<size_t>(n_head * d * 4) || p.lse_size() != n_head ||
      p.n_touched_size() != n_head) {
    return false;
  }
  for (int64_t h = 0; h < n_head; ++h) {
    PartialAttention& part = node_parts_[range * n_head + h];
    part.o.resize(static_cast<size_t>(d));
    std::memcpy(part.o.data(), p.o().data() + h * d * 4, d * 4);
    part.lse = p.lse(static_cast<int>(h));
    part.n_touched = p.n_touched(static_cast<int>(h));
  }
  return true;
}

void RemoteAttentionShards::MergeNodeParts(int64_t n_head, PartialAttention* out) const {
  const int64_t d = shape_.head_dim();
  std::vector<PartialAttention> per_head(ranges_.size());
  for (int64_t h = 0; h < n_head; ++h) {
    for (size_t ri = 0; ri < ranges_.size(); ++ri) per_head[ri] = node_parts_[ri * n_head + h];
    out[h] = MergePartials(per_head);
    if (out[h].o.empty()) out[h].o.assign(static_cast<size_t>(d), 0.0f);
  }
}

int64_t RemoteAttentionShards::size(int64_t layer) const {
  return layer < static_cast<int64_t>(layer_size_.size()) ? layer_size_[static_cast<size_t>(layer)]
                                                          : 0;
}

int64_t RemoteAttentionShards::bytes() const {
  int64_t b = 0;
  for (const Range& r : ranges_) b += r.bytes;
  return b;
}

}  // namespace magicpig::remote
