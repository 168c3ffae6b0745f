// magicpig_attn_node: the attention node's thin main (docs/architecture.md §8, §9). Parses flags,
// starts an AttentionServer, prints "listening on HOST:PORT" on stdout (and "metrics on HOST:PORT",
// the HTTP /metrics and probe port, on stderr), and on SIGTERM / SIGINT drains (stops admitting,
// NOT_SERVING on the health service), shuts down with a grace deadline and exits 0. With --health
// it is instead a probe of a running node (see node_flags.h).
#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "attn_node/service/attention_server.h"
#include "attn_node/service/node_flags.h"
#include "common/logging/logger.h"
#include "common/metrics/metrics.h"
#include "common/process_runtime.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

namespace {

// Asks grpc.health.v1.Health/Check (service "": the whole node) at `address`; 0 iff SERVING.
// With TLS it presents the node's own certificate and expects the node's to name "localhost".
int Probe(std::string address, magicpig::fabric::TransportSecurity security) {
  if (address.rfind("0.0.0.0:", 0) == 0) address = "127.0.0.1" + address.substr(7);
  if (security.tls()) security.server_name = "localhost";
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      magicpig::fabric::ChannelCredentials(security);
  if (!credentials.ok()) {
    std::cerr << "magicpig_attn_node: " << credentials.status().message() << "\n";
    return 1;
  }
  auto channel = grpc::CreateCustomChannel(address, *credentials,
                                           magicpig::fabric::ChannelArgumentsFor(security));
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::Slice empty("", 0);  // HealthCheckRequest{service: ""} encodes to no bytes
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!status.ok()) {
    std::cerr << "health check of " << address << " failed: " << status.error_message() << "\n";
    return 1;
  }
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (response.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices)
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  // HealthCheckResponse{status = 1}: field 1, varint. SERVING = 1, NOT_SERVING = 2.
  const int serving = bytes.size() >= 2 && bytes[0] == 0x08 ? bytes[1] : 0;
  std::cout << (serving == 1 ? "SERVING" : serving == 2 ? "NOT_SERVING" : "UNKNOWN") << "\n";
  return serving == 1 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  magicpig::ConfigureProcessRuntime();
  absl::StatusOr<magicpig::NodeFlags> flags =
      magicpig::ParseNodeFlags(std::vector<std::string>(argv + 1, argv + argc));
  if (!flags.ok()) {
    std::cerr << "magicpig_attn_node: " << flags.status().message()
              << "\n(magicpig_attn_node --help lists the flags)\n";
    return 2;
  }
  if (flags->help) {
    std::cout << magicpig::NodeUsage();
    return 0;
  }
  if (flags->health) return Probe(flags->listen, flags->security);

  // Block the stop signals in every thread (gRPC's and oneTBB's inherit the mask); main waits.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  prometheus::Registry registry;  // outlives the server
  // One line per released sequence and per failed call (attention_service.h); outlives the server.
  magicpig::logging::Logger logger("attn", flags->log_level);
  magicpig::metrics::AddBuildInfo(registry, "attention");
  magicpig::AttentionServerOptions options;
  options.listen_address = flags->listen;
  options.memory_budget_bytes = flags->memory_budget_bytes;
  options.threads = flags->threads;
  options.metrics_listen = flags->metrics_listen;
  options.sequence_ttl =
      std::chrono::milliseconds(static_cast<int64_t>(flags->sequence_ttl_seconds * 1000.0));
  options.metrics_registry = &registry;
  options.logger = &logger;
  options.security = flags->security;
  options.limits.max_upload_streams = flags->max_upload_streams;
  options.limits.upload_deadline =
      std::chrono::milliseconds(static_cast<int64_t>(flags->upload_deadline_seconds * 1000.0));
  absl::StatusOr<std::unique_ptr<magicpig::AttentionServer>> server =
      magicpig::AttentionServer::Start(options);
  if (!server.ok()) {
    std::cerr << "magicpig_attn_node: " << server.status().message() << "\n";
    return 1;
  }
  if (flags->security.insecure) {
    logger.Log(
        magicpig::logging::LogLevel::kWarning,
        "plaintext gRPC (--insecure): any client that reaches this port can create, read "
        "and release sequences; use --tls-cert/--tls-key/--tls-ca outside a trusted network");
  }
  std::cout << "listening on " << (*server)->address() << std::endl;
  std::cerr << "magicpig_attn_node: memory budget " << options.memory_budget_bytes << " bytes, "
            << (*server)->threads() << " threads\n";
  if ((*server)->metrics_port() != 0) {
    std::cerr << "metrics on " << (*server)->metrics_address() << std::endl;
  }

  int signal_number = 0;
  sigwait(&stop, &signal_number);
  std::cerr << "magicpig_attn_node: signal " << signal_number << ", draining\n";
  const auto grace = std::chrono::duration_cast<std::chrono::system_clock::duration>(
      std::chrono::duration<double>(flags->shutdown_grace_seconds));
  (*server)->Shutdown(std::chrono::system_clock::now() + grace);
  server->reset();
  std::cerr << "magicpig_attn_node: stopped\n";
  return 0;
}
