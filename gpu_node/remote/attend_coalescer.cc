#include "gpu_node/remote/attend_coalescer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace magicpig::remote {
namespace v1 = ::magicpig::v1;

AttendCoalescer::AttendCoalescer(AttentionNodeClient* node, std::chrono::milliseconds timeout,
                                 size_t max_request_bytes)
    : node_(node), timeout_(timeout), max_request_bytes_(max_request_bytes) {}

AttendCoalescer::~AttendCoalescer() {
  absl::MutexLock lock(&mu_);
  CancelAttendStream(context_, stream_);
}

std::shared_ptr<AttendCoalescer::Ticket> AttendCoalescer::Add(int32_t layer, float scale,
                                                              const std::string& sequence_id,
                                                              const std::string& q,
                                                              const std::string& codes) {
  absl::MutexLock lock(&mu_);
  // One request carries one layer and scale: queries for others go in the next one.
  const size_t bytes = sequence_id.size() + q.size() + codes.size();
  if (!queued_tickets_.empty() &&
      (queued_.layer() != layer || queued_.scale() != scale ||
       queued_bytes_ + bytes > max_request_bytes_ ||
       queued_tickets_.size() >= static_cast<size_t>(kMaxQueriesPerRequest))) {
    FlushLocked();
  }
  queued_bytes_ += bytes;
  queued_.set_layer(layer);
  queued_.set_scale(scale);
  v1::SequenceQuery* query = queued_.add_queries();
  query->set_sequence_id(sequence_id);
  query->set_q(q);
  query->set_codes(codes);
  auto ticket = std::make_shared<Ticket>();
  ticket->index = static_cast<int>(queued_tickets_.size());
  queued_tickets_.push_back(ticket);
  return ticket;
}

void AttendCoalescer::Flush() {
  absl::MutexLock lock(&mu_);
  FlushLocked();
}

void AttendCoalescer::FlushLocked() {
  if (queued_tickets_.empty()) return;
  std::vector<std::shared_ptr<Ticket>> tickets = std::move(queued_tickets_);
  queued_tickets_.clear();
  queued_bytes_ = 0;
  queued_.set_step_id(++next_step_);
  for (auto& t : tickets) t->request = next_step_;
  if (stream_ == nullptr) {
    context_ = std::make_unique<grpc::ClientContext>();
    node_->Identify(context_.get());
    stream_ = node_->stub().Attend(context_.get());
  }
  const bool sent = stream_->Write(queued_);
  if (sent) {
    ++requests_sent_;
    node_->metrics().Sent(queued_.ByteSizeLong());
    in_flight_.push_back(
        InFlight{next_step_, std::move(tickets), std::chrono::steady_clock::now()});
  }
  queued_.Clear();
  if (!sent) FailAllLocked(CloseFailedAttendStream(*node_, context_, stream_), std::move(tickets));
}

absl::Status AttendCoalescer::Wait(Ticket& ticket) {
  absl::MutexLock lock(&mu_);
  if (!ticket.done && ticket.request == 0) FlushLocked();
  while (!ticket.done) {
    if (in_flight_.empty()) {
      // Cannot happen for a ticket of this coalescer: it is queued, in flight or done.
      return absl::InternalError(absl::StrCat("Attend on attention node ", node_->address(),
                                              ": waiting for a query that was never sent"));
    }
    ReadOneLocked();
  }
  return ticket.status;
}

void AttendCoalescer::ReadOneLocked() {
  std::vector<grpc::ClientContext*> contexts = {context_.get()};
  watchdog_.Arm(std::chrono::steady_clock::now() + timeout_, std::move(contexts));
  v1::AttendResponse resp;
  const bool read = stream_->Read(&resp);
  const bool timed_out = watchdog_.Disarm();
  if (timed_out) {
    // The context was cancelled (as the answer came, or instead of it): the stream is done.
    CancelAttendStream(context_, stream_);
    node_->metrics().Finished(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, ""));
    FailAllLocked(
        absl::DeadlineExceededError(absl::StrCat("Attend on attention node ", node_->address(),
                                                 ": no answer within ", timeout_.count(), " ms")));
    return;
  }
  if (!read) {
    FailAllLocked(CloseFailedAttendStream(*node_, context_, stream_));
    return;
  }
  InFlight& oldest = in_flight_.front();
  node_->metrics().RoundTrip(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - oldest.sent_at).count());
  node_->metrics().Received(resp.ByteSizeLong());
  const bool well_formed = resp.step_id() == oldest.step &&
                           resp.partials_size() == static_cast<int>(oldest.tickets.size());
  if (!well_formed) {
    CancelAttendStream(context_, stream_);
    node_->metrics().Finished(grpc::Status(grpc::StatusCode::INTERNAL, ""));
    FailAllLocked(absl::InternalError(
        absl::StrCat("malformed Attend response from attention node ", node_->address(), ": step ",
                     resp.step_id(), " with ", resp.partials_size(), " partials, expected step ",
                     oldest.step, " with ", oldest.tickets.size())));
    return;
  }
  for (auto& t : oldest.tickets) {
    t->partial = std::move(*resp.mutable_partials(t->index));
    t->status = absl::OkStatus();
    t->done = true;
  }
  in_flight_.pop_front();
}

void AttendCoalescer::FailAllLocked(const absl::Status& status,
                                    std::vector<std::shared_ptr<Ticket>> extra) {
  for (InFlight& f : in_flight_) {
    for (auto& t : f.tickets) {
      t->status = status;
      t->done = true;
    }
  }
  in_flight_.clear();
  for (auto& t : extra) {
    t->status = status;
    t->done = true;
  }
}

void AttendCoalescer::Cancel(const std::shared_ptr<Ticket>& ticket) {
  absl::MutexLock lock(&mu_);
  if (ticket->done || ticket->request != 0) return;
  auto it = std::find(queued_tickets_.begin(), queued_tickets_.end(), ticket);
  if (it == queued_tickets_.end()) return;
  // Rebuild the queued request without the query; later tickets move up one place.
  const int index = ticket->index;
  const v1::SequenceQuery& query = queued_.queries(index);
  queued_bytes_ -= query.sequence_id().size() + query.q().size() + query.codes().size();
  queued_.mutable_queries()->DeleteSubrange(index, 1);
  queued_tickets_.erase(it);
  for (auto& t : queued_tickets_) {
    if (t->index > index) --t->index;
  }
  ticket->status = absl::CancelledError("Attend query withdrawn before it was sent");
  ticket->done = true;
}

uint64_t AttendCoalescer::requests_sent() const {
  absl::MutexLock lock(&mu_);
  return requests_sent_;
}

}  // namespace magicpig::remote
