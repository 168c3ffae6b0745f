#include "attn_node/service/attention_server.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/metrics/metrics.h"
#include "grpcpp/health_check_service_interface.h"
#include "tbb/info.h"

namespace magicpig {

namespace {

constexpr char kServiceName[] = "magicpig.v1.AttentionService";

// "HOST:PORT" -> HOST (brackets of an IPv6 literal kept).
std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

}  // namespace

absl::StatusOr<std::unique_ptr<AttentionServer>> AttentionServer::Start(
    const AttentionServerOptions& options) {
  if (options.memory_budget_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory budget must be >= 0, got ", options.memory_budget_bytes));
  }
  std::unique_ptr<AttentionServer> s(new AttentionServer());
  if (options.metrics_registry != nullptr) {
    s->registry_ = options.metrics_registry;
  } else {
    s->owned_registry_ = std::make_unique<prometheus::Registry>();
    s->registry_ = s->owned_registry_.get();
  }
  s->metrics_ = std::make_unique<NodeMetrics>(*s->registry_);
  const int threads = options.threads > 0 ? options.threads : tbb::info::default_concurrency();
  s->parallelism_ = std::make_unique<tbb::global_control>(
      tbb::global_control::max_allowed_parallelism, static_cast<size_t>(threads) + 1);
  s->store_ = std::make_unique<ShardStore>(options.memory_budget_bytes);
  s->executor_ = std::make_unique<TaskExecutor>(threads);
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      fabric::ServerCredentials(options.security);
  if (!credentials.ok()) return credentials.status();
  ServiceLimits limits = options.limits;
  limits.tls = options.security.tls();
  s->service_ = std::make_unique<AttentionServiceImpl>(s->store_.get(), s->executor_.get(),
                                                       s->metrics_.get(), options.logger, limits);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen_address, *credentials, &port);
  builder.RegisterService(s->service_.get());
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on '", options.listen_address, "'"));
  }
  s->port_ = port;
  s->address_ = absl::StrCat(HostOf(options.listen_address), ":", port);
  if (grpc::HealthCheckServiceInterface* health = s->server_->GetHealthCheckService()) {
    health->SetServingStatus(true);
    health->SetServingStatus(kServiceName, true);
  }
  if (!options.metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<http::Server>> http = http::StartProbeListener(
        options.metrics_listen, s->MakeRouter(), {"/healthz", "/readyz", "/health", "/metrics"});
    if (!http.ok()) return http.status();
    s->http_ = std::move(*http);
    s->metrics_address_ = absl::StrCat(HostOf(options.metrics_listen), ":", s->http_->port());
  }
  const std::chrono::milliseconds ttl = options.sequence_ttl;
  absl::Duration period = absl::Seconds(1);
  if (ttl.count() > 0) period = std::min(absl::FromChrono(ttl) / 4, period);
  AttentionServiceImpl* service = s->service_.get();
  s->housekeeping_ = std::make_unique<PeriodicThread>(period, [service, ttl] {
    if (ttl.count() > 0) service->ExpireIdle(ttl);
    service->CancelOverdueUploads();
  });
  return s;
}

std::string AttentionServer::RenderMetrics() {
  metrics_->Refresh(store_->Stats());
  return metrics::Render(*registry_);
}

http::Router AttentionServer::MakeRouter() {
  http::Router router;
  router.Handle("GET", "/metrics", [this](const http::Request&, http::Responder& responder) {
    responder.Send(200, metrics::kContentType, RenderMetrics()).IgnoreError();
  });
  router.Handle("GET", "/healthz", [](const http::Request&, http::Responder& responder) {
    responder.Send(200, "text/plain; charset=utf-8", "ok\n").IgnoreError();
  });
  auto ready = [this](const http::Request&, http::Responder& responder) {
    const bool draining = store_->draining();
    responder
        .Send(draining ? 503 : 200, "text/plain; charset=utf-8", draining ? "draining\n" : "ok\n")
        .IgnoreError();
  };
  router.Handle("GET", "/readyz", ready);
  router.Handle("GET", "/health", ready);
  return router;
}

AttentionServer::~AttentionServer() { Shutdown(std::chrono::system_clock::now()); }

void AttentionServer::StartDraining() {
  service_->StartDraining();
  if (server_ != nullptr) {
    if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) {
      health->SetServingStatus(kServiceName, false);
      health->SetServingStatus(false);
    }
  }
}

void AttentionServer::Shutdown(std::chrono::system_clock::time_point deadline) {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  if (housekeeping_ != nullptr) housekeeping_->Stop();
  if (server_ != nullptr) {
    StartDraining();
    server_->Shutdown(deadline);
    server_->Wait();
    executor_->WaitIdle();
    service_->LogHeldSequences();  // what the compute nodes did not release goes with the store
  }
  // Last: readiness answers 503 while the gRPC calls drain.
  if (http_ != nullptr) http_->Shutdown(absl::Seconds(1));
}

}  // namespace magicpig
