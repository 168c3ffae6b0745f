#include "attn_node/service/attention_service.h"

#include <chrono>
#include <cstring>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/attention/estimator_registry.h"
#include "common/fabric/call_identity.h"
#include "common/logging/logger.h"

namespace magicpig {

using ::magicpig::attention::EstimatorKind;
using ::magicpig::attention::KvStorage;

namespace {

using logging::LogLevel;

std::string_view View(const std::string& s) { return std::string_view(s.data(), s.size()); }

// An owner as the log shows it (never a token).
std::string OwnerLogName(const std::string& owner) {
  fabric::Caller caller;
  caller.owner = owner;
  return caller.LogName();
}

// Where the outcome of a call goes: the metrics and the log (both nullable), and who made it.
struct Reporter {
  NodeMetrics* metrics = nullptr;
  const logging::Logger* logger = nullptr;
  std::string owner;  // the caller's owner (Caller::owner)

  // The WARNING line of a call of `method` that failed (sequence_id: "" when it names none);
  // nothing for OK or CANCELLED (the client's cancellation).
  void LogFailure(std::string_view method, std::string_view sequence_id,
                  const absl::Status& status) const {
    if (status.ok() || status.code() == absl::StatusCode::kCancelled) return;
    if (!logging::ShouldLog(logger, LogLevel::kWarning)) return;
    const absl::string_view message = status.message();
    logger->Log(LogLevel::kWarning,
                logging::KeyValues(
                    {{"rpc", std::string(method)},
                     {"owner", logging::Truncated(OwnerLogName(owner), 256)},
                     {"sequence", sequence_id.empty() ? "-" : logging::Truncated(sequence_id, 128)},
                     {"code", absl::StatusCodeToString(status.code())},
                     {"error",
                      logging::Truncated(std::string_view(message.data(), message.size()), 512)}}));
  }

  // The grpc::Status of a call's outcome, counted in the metrics and, when it failed, logged.
  grpc::Status Report(std::string_view method, std::string_view sequence_id,
                      const absl::Status& status) const {
    if (metrics != nullptr) metrics->Finished(status);
    LogFailure(method, sequence_id, status);
    return ToGrpcStatus(status);
  }
};

// The INFO (released) or WARNING (dropped) line of a sequence leaving the node.
void LogSequence(const logging::Logger* logger, LogLevel level, const SequenceSummary& s,
                 std::string_view status) {
  if (!logging::ShouldLog(logger, level)) return;
  logger->Log(level, logging::KeyValues({{"sequence", logging::Truncated(s.id, 128)},
                                         {"owner", logging::Truncated(OwnerLogName(s.owner), 256)},
                                         {"layers", absl::StrCat(s.layers)},
                                         {"tokens", absl::StrCat(s.tokens)},
                                         {"attend_calls", absl::StrCat(s.attend_calls)},
                                         {"lifetime_ms", absl::StrCat(s.lifetime_ms)},
                                         {"bytes", absl::StrCat(s.bytes)},
                                         {"status", std::string(status)}}));
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// AppendKV: stage chunks as they arrive, commit on the executor when the client half-closes.
// Registered in `uploads` while open; refused at once when its owner has `limit` streams open.
class AppendReactor final : public grpc::ServerReadReactor<v1::KvChunk> {
 public:
  AppendReactor(grpc::CallbackServerContext* context, v1::AppendKvResponse* response,
                ShardStore* store, TaskExecutor* executor, Reporter reporter,
                UploadRegistry* uploads, int limit)
      : context_(context),
        response_(response),
        store_(store),
        executor_(executor),
        reporter_(std::move(reporter)),
        uploads_(uploads) {
    if (!uploads_->Open(this, context_, reporter_.owner, limit)) {
      uploads_ = nullptr;
      Finish(reporter_.Report(
          "AppendKV", "",
          absl::ResourceExhaustedError(absl::StrCat(
              "too many open AppendKV streams for this caller (at most ", limit, ")"))));
      return;
    }
    StartRead(&chunk_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // Half-close (commit) or cancellation (commit nothing).
      if (context_->IsCancelled()) {
        Finish(grpc::Status(grpc::StatusCode::CANCELLED, "AppendKV cancelled; nothing committed"));
        return;
      }
      executor_->Submit([this] {
        const auto start = std::chrono::steady_clock::now();
        absl::StatusOr<AppendResult> result = store_->Commit(&staging_);
        if (result.ok()) {
          response_->set_tokens(result->tokens);
          response_->set_bytes(result->bytes);
          if (reporter_.metrics != nullptr) reporter_.metrics->Committed(SecondsSince(start));
        }
        // Last touch of this reactor.
        Finish(reporter_.Report("AppendKV", sequence_id_, result.status()));
      });
      return;
    }
    absl::Status status = store_->Stage(ChunkViewOf(chunk_, reporter_.owner), &staging_);
    if (!status.ok()) {
      // The staged chunks die with the reactor: nothing is committed.
      Finish(reporter_.Report("AppendKV", View(chunk_.sequence_id()), status));
      return;
    }
    // The stream's sequence for the log: "" once it has carried several.
    if (chunks_ == 0) {
      sequence_id_ = chunk_.sequence_id();
    } else if (!sequence_id_.empty() && sequence_id_ != chunk_.sequence_id()) {
      sequence_id_.clear();
    }
    ++chunks_;
    StartRead(&chunk_);
  }

  void OnDone() override {
    if (uploads_ != nullptr) uploads_->Close(this);
    delete this;
  }

 private:
  grpc::CallbackServerContext* context_;
  v1::AppendKvResponse* response_;
  ShardStore* store_;
  TaskExecutor* executor_;
  const Reporter reporter_;
  UploadRegistry* uploads_;  // null when refused
  v1::KvChunk chunk_;
  AppendStaging staging_;
  int64_t chunks_ = 0;       // staged so far
  std::string sequence_id_;  // of the staged chunks ("" for several)
};

// Attend: read ahead, process one request at a time on the executor, write in order.
//
// Who may start which gRPC operation: reactions (OnReadDone / OnWriteDone / OnCancel) may start
// reads and may finish when no request is being processed; while one is (busy_), only the task
// processing it starts the write or the finish. Decisions are taken under mu_, operations are
// started after releasing it (gRPC may run a reaction inline). The processing task holds a
// reference (refs_) so the reactor outlives OnDone until the task has returned.
class AttendReactor final : public grpc::ServerBidiReactor<v1::AttendRequest, v1::AttendResponse> {
 public:
  AttendReactor(ShardStore* store, TaskExecutor* executor, Reporter reporter)
      : store_(store), executor_(executor), reporter_(std::move(reporter)) {
    {
      absl::MutexLock lock(&mu_);
      reading_ = true;
    }
    StartRead(&read_);
  }

  void OnReadDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      reading_ = false;
      if (ok) {
        queue_.push_back(std::move(read_));
        read_.Clear();
      } else {
        reads_done_ = true;
      }
    }
    Step();
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      busy_ = false;
      if (!ok && !error_) {
        error_ = grpc::Status(grpc::StatusCode::CANCELLED, "Attend: write failed");
      }
    }
    Step();
  }

  void OnCancel() override {
    {
      absl::MutexLock lock(&mu_);
      if (!error_) error_ = grpc::Status(grpc::StatusCode::CANCELLED, "Attend cancelled");
    }
    Step();
  }

  void OnDone() override {
    bool last;
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
      last = refs_ == 0;
    }
    if (last) delete this;
  }

 private:
  // Starts whatever the state allows: a read, the next request, or the finish.
  void Step() {
    bool start_read = false;
    std::optional<v1::AttendRequest> next;
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || busy_) {
        // The processing task decides what comes next; we may only read ahead (below).
      } else if (error_) {
        finished_ = true;
        finish = *error_;
      } else if (!queue_.empty()) {
        busy_ = true;
        ++refs_;
        next = std::move(queue_.front());
        queue_.pop_front();
      } else if (reads_done_) {
        finished_ = true;
        finish = grpc::Status::OK;
      }
      start_read = !finished_ && !error_ && !reading_ && !reads_done_ &&
                   queue_.size() < static_cast<size_t>(kMaxQueuedAttends);
      if (start_read) reading_ = true;
    }
    if (start_read) StartRead(&read_);
    if (next) {
      executor_->Submit([this, request = std::move(*next)] { Process(request); });
    }
    if (finish) Finish(*finish);
  }

  // Runs on the executor: attention for one request, then its write (or the stream's finish).
  void Process(const v1::AttendRequest& request) {
    const std::vector<QueryView> queries = QueryViewsOf(request);
    std::vector<SequencePartialResult> results;
    const auto start = std::chrono::steady_clock::now();
    absl::Status status =
        store_->Attend(request.layer(), request.scale(), queries, &results, reporter_.owner);
    const double seconds = SecondsSince(start);
    write_.Clear();
    NodeMetrics* const metrics = reporter_.metrics;
    if (metrics != nullptr && status.ok()) {
      // Sampled fraction over the message's (sequence, query head) pairs.
      int64_t touched = 0, held = 0;
      for (const SequencePartialResult& r : results) {
        for (int64_t t : r.n_touched) touched += t;
        held += r.n_keys * static_cast<int64_t>(r.n_touched.size());
      }
      metrics->Attended(seconds, touched, held);
    } else if (metrics != nullptr) {
      metrics->Finished(status);
    }
    if (!status.ok()) {
      reporter_.LogFailure(
          "Attend", queries.size() == 1 ? queries[0].sequence_id : std::string_view(), status);
    }
    if (status.ok()) {
      write_.set_step_id(request.step_id());
      for (size_t i = 0; i < results.size(); ++i) {
        const SequencePartialResult& r = results[i];
        v1::SequencePartial* p = write_.add_partials();
        p->set_sequence_id(request.queries(static_cast<int>(i)).sequence_id());
        p->mutable_o()->resize(r.o.size() * sizeof(float));
        if (!r.o.empty()) std::memcpy(p->mutable_o()->data(), r.o.data(), r.o.size() * 4);
        p->mutable_lse()->Add(r.lse.begin(), r.lse.end());
        p->mutable_n_touched()->Add(r.n_touched.begin(), r.n_touched.end());
        p->set_n_keys(r.n_keys);
      }
    }
    bool write = false;
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      if (!status.ok() && !error_) error_ = ToGrpcStatus(status);
      if (error_) {
        busy_ = false;
        finished_ = true;
        finish = *error_;
      } else {
        write = true;  // busy_ stays set until OnWriteDone
      }
    }
    if (write) StartWrite(&write_);
    if (finish) Finish(*finish);
    Unref();
  }

  void Unref() {
    bool last;
    {
      absl::MutexLock lock(&mu_);
      last = --refs_ == 0 && done_;
    }
    if (last) delete this;
  }

  ShardStore* store_;
  TaskExecutor* executor_;
  const Reporter reporter_;
  v1::AttendRequest read_;    // the outstanding read's buffer
  v1::AttendResponse write_;  // the outstanding write's buffer (one at a time)

  absl::Mutex mu_;
  std::deque<v1::AttendRequest> queue_ ABSL_GUARDED_BY(mu_);
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // a request is being processed or written
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  int refs_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<grpc::Status> error_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<KvStorage> StorageFromProto(v1::KvDtype d) {
  switch (d) {
    case v1::KV_DTYPE_UNSPECIFIED:
    case v1::KV_DTYPE_BF16:
      return KvStorage::kBf16;
    case v1::KV_DTYPE_F32:
      return KvStorage::kF32;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("shape.dtype: unknown value ", static_cast<int>(d)));
  }
}

}  // namespace

ChunkView ChunkViewOf(const v1::KvChunk& c, std::string_view owner) {
  ChunkView v;
  v.owner = owner;
  v.sequence_id = View(c.sequence_id());
  v.layer = c.layer();
  v.first_pos = c.first_pos();
  v.n_tokens = c.n_tokens();
  v.keys = View(c.keys());
  v.values = View(c.values());
  v.codes = View(c.codes());
  return v;
}

std::vector<QueryView> QueryViewsOf(const v1::AttendRequest& request) {
  std::vector<QueryView> queries;
  queries.reserve(static_cast<size_t>(request.queries_size()));
  for (const v1::SequenceQuery& q : request.queries()) {
    queries.push_back(QueryView{View(q.sequence_id()), View(q.q()), View(q.codes())});
  }
  return queries;
}

absl::StatusOr<SequenceSpec> SequenceSpecFromProto(const v1::CreateSequenceRequest& request) {
  if (!request.has_shape()) return absl::InvalidArgumentError("shape: missing");
  const v1::ShardShape& shape = request.shape();
  SequenceSpec spec;
  spec.id = request.sequence_id();
  spec.layers.assign(shape.layers().begin(), shape.layers().end());
  spec.n_kv_heads = shape.n_kv_heads();
  spec.group = shape.group();
  spec.head_dim = shape.head_dim();
  spec.lsh_k = shape.lsh_k();
  spec.lsh_l = shape.lsh_l();
  absl::StatusOr<KvStorage> storage = StorageFromProto(shape.dtype());
  if (!storage.ok()) return storage.status();
  spec.storage = *storage;
  absl::StatusOr<EstimatorKind> estimator =
      attention::EstimatorFromProtoValue(static_cast<int>(shape.estimator()));
  if (!estimator.ok()) return estimator.status();
  spec.estimator = *estimator;
  spec.budget = shape.budget();
  spec.seed = shape.seed();
  spec.vattention = {.epsilon = shape.va_epsilon(),
                     .delta = shape.va_delta(),
                     .heavy = shape.va_heavy(),
                     .base_rate = shape.va_base_rate()};
  spec.spotlight_fraction = shape.spotlight_fraction();
  spec.spotlight_rerank = shape.spotlight_rerank() == 0 ? 1 : shape.spotlight_rerank();
  spec.token_begin = request.token_begin();
  spec.max_tokens = request.max_tokens();
  if (absl::Status s = ValidateSequenceSpec(spec); !s.ok()) return s;
  return spec;
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

grpc::ServerUnaryReactor* AttentionServiceImpl::CreateSequence(
    grpc::CallbackServerContext* context, const v1::CreateSequenceRequest* request,
    v1::CreateSequenceResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const fabric::Caller caller = fabric::CallerOf(*context, limits_.tls);
  const Reporter reporter{metrics_, logger_, caller.owner};
  absl::StatusOr<SequenceSpec> spec = SequenceSpecFromProto(*request);
  if (!spec.ok()) {
    reactor->Finish(reporter.Report("CreateSequence", View(request->sequence_id()), spec.status()));
    return reactor;
  }
  spec->owner = caller.owner;
  spec->instance = caller.instance;
  spec->incarnation = caller.incarnation;
  executor_->Submit([this, reporter, reactor, response, spec = std::move(*spec)] {
    absl::StatusOr<int64_t> reserved = store_->CreateSequence(spec);
    if (reserved.ok()) response->set_bytes_reserved(*reserved);
    reactor->Finish(reporter.Report("CreateSequence", spec.id, reserved.status()));
  });
  return reactor;
}

grpc::ServerReadReactor<v1::KvChunk>* AttentionServiceImpl::AppendKV(
    grpc::CallbackServerContext* context, v1::AppendKvResponse* response) {
  return new AppendReactor(
      context, response, store_, executor_,
      Reporter{metrics_, logger_, fabric::CallerOf(*context, limits_.tls).owner}, &uploads_,
      limits_.max_upload_streams);
}

grpc::ServerBidiReactor<v1::AttendRequest, v1::AttendResponse>* AttentionServiceImpl::Attend(
    grpc::CallbackServerContext* context) {
  return new AttendReactor(
      store_, executor_,
      Reporter{metrics_, logger_, fabric::CallerOf(*context, limits_.tls).owner});
}

grpc::ServerUnaryReactor* AttentionServiceImpl::ReleaseSequence(
    grpc::CallbackServerContext* context, const v1::ReleaseSequenceRequest* request,
    v1::ReleaseSequenceResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Reporter reporter{metrics_, logger_, fabric::CallerOf(*context, limits_.tls).owner};
  // Freeing a large sequence's buffers is not instant: off the reaction thread.
  executor_->Submit([this, reactor, request, response, reporter = std::move(reporter)] {
    absl::StatusOr<SequenceSummary> released =
        store_->ReleaseSequence(View(request->sequence_id()), reporter.owner);
    if (released.ok()) {
      response->set_bytes_freed(released->bytes);
      LogSequence(logger_, LogLevel::kInfo, *released, "released");
    }
    reactor->Finish(
        reporter.Report("ReleaseSequence", View(request->sequence_id()), released.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* AttentionServiceImpl::ReleaseStale(grpc::CallbackServerContext* context,
                                                             const v1::ReleaseStaleRequest* request,
                                                             v1::ReleaseStaleResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Reporter reporter{metrics_, logger_, fabric::CallerOf(*context, limits_.tls).owner};
  for (const auto& [field, value] : {std::pair{"instance", &request->instance()},
                                     std::pair{"incarnation", &request->incarnation()}}) {
    if (value->empty() || value->size() > 256) {
      reactor->Finish(reporter.Report(
          "ReleaseStale", "",
          absl::InvalidArgumentError(absl::StrCat(
              "ReleaseStaleRequest.", field, ": length must be 1 .. 256, got ", value->size()))));
      return reactor;
    }
  }
  executor_->Submit([this, reactor, request, response, reporter = std::move(reporter)] {
    const std::vector<SequenceSummary> released =
        store_->ReleaseStale(reporter.owner, request->instance(), request->incarnation());
    int64_t bytes = 0;
    for (const SequenceSummary& s : released) {
      bytes += s.bytes;
      LogSequence(logger_, LogLevel::kWarning, s, "stale");
    }
    response->set_sequences(static_cast<int32_t>(released.size()));
    response->set_bytes_freed(bytes);
    reactor->Finish(reporter.Report("ReleaseStale", "", absl::OkStatus()));
  });
  return reactor;
}

int AttentionServiceImpl::CancelOverdueUploads(std::chrono::steady_clock::time_point now) {
  const std::vector<std::string> owners =
      uploads_.CancelOpenedBefore(now - limits_.upload_deadline);
  for (const std::string& owner : owners) {
    const Reporter reporter{metrics_, logger_, owner};
    (void)reporter.Report("AppendKV", "",
                          absl::DeadlineExceededError(absl::StrCat(
                              "upload stream open longer than --upload-deadline (",
                              limits_.upload_deadline.count() / 1000, " s); cancelled")));
  }
  return static_cast<int>(owners.size());
}

bool UploadRegistry::Open(const void* stream, grpc::CallbackServerContext* context,
                          const std::string& owner, int limit) {
  absl::MutexLock lock(&mu_);
  int& open = per_owner_[owner];
  if (open >= limit) {
    if (open == 0) per_owner_.erase(owner);
    return false;
  }
  ++open;
  streams_.emplace(stream, Stream{context, owner, std::chrono::steady_clock::now()});
  return true;
}

void UploadRegistry::Close(const void* stream) {
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(stream);
  if (it == streams_.end()) return;
  auto owner = per_owner_.find(it->second.owner);
  if (owner != per_owner_.end() && --owner->second <= 0) per_owner_.erase(owner);
  streams_.erase(it);
}

std::vector<std::string> UploadRegistry::CancelOpenedBefore(
    std::chrono::steady_clock::time_point cutoff) {
  std::vector<std::string> owners;
  absl::MutexLock lock(&mu_);
  for (auto& [key, stream] : streams_) {
    if (stream.opened >= cutoff || stream.context == nullptr) continue;
    stream.context->TryCancel();
    stream.context = nullptr;  // cancelled once; Close removes it when the reactor is done
    owners.push_back(stream.owner);
  }
  return owners;
}

int UploadRegistry::open() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(streams_.size());
}

void AttentionServiceImpl::LogHeldSequences() const {
  if (!logging::ShouldLog(logger_, LogLevel::kWarning)) return;
  for (const SequenceSummary& s : store_->HeldSequences()) {
    LogSequence(logger_, LogLevel::kWarning, s, "dropped");
  }
}

int AttentionServiceImpl::ExpireIdle(std::chrono::nanoseconds ttl) {
  const std::vector<SequenceSummary> expired = store_->ReleaseIdle(ttl);
  for (const SequenceSummary& s : expired) {
    if (logging::ShouldLog(logger_, LogLevel::kWarning)) {
      LogSequence(logger_, LogLevel::kWarning, s, "expired");
    }
    if (metrics_ != nullptr) metrics_->Expired();
  }
  return static_cast<int>(expired.size());
}

grpc::ServerUnaryReactor* AttentionServiceImpl::NodeStatus(grpc::CallbackServerContext* context,
                                                           const v1::NodeStatusRequest* request,
                                                           v1::NodeStatusResponse* response) {
  const StoreStats stats = store_->Stats();
  response->set_memory_budget_bytes(stats.memory_budget_bytes);
  response->set_memory_used_bytes(stats.memory_used_bytes);
  response->set_sequences(stats.sequences);
  response->set_draining(stats.draining);
  response->set_threads(executor_->threads());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace magicpig
