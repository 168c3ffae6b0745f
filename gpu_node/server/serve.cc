#include "gpu_node/server/serve.h"

#include <pthread.h>
#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/flags/flag_values.h"
#include "common/logging/logger.h"
#include "common/metrics/metrics.h"
#include "gpu_node/engine/engine_flags.h"
#include "gpu_node/engine/scheduler.h"
#include "gpu_node/server/api_server.h"
#include "gpu_node/server/serving_metrics.h"

namespace magicpig::server {
namespace {

int Fail(const absl::Status& s, int code) {
  std::cerr << "magicpig_gpu_node: " << s.message() << "\n";
  return code;
}

}  // namespace

std::unique_ptr<flags::FlagTable> ServeFlagTable(ServeFlags* f) {
  auto table = std::make_unique<flags::FlagTable>(
      "magicpig_gpu_node",
      "The compute node: the OpenAI-compatible HTTP API over the engine (also `magicpig serve`).");
  engine::DeclareModelFlags(*table, &f->engine);
  table->Section("serving");
  table->Address("listen", &f->listen, "HTTP API, probes and /metrics (port 0 picks a free one)");
  table->Text("served-model-name", &f->served_model_name, "NAME", "the model id clients pass");
  table->ShowDefault("served-model-name", "the file name stem");
  table->Text("api-key", &f->api_key, "KEY",
              "require 'Authorization: Bearer KEY' on /v1/*; empty: the API is open");
  table->Number("max-batch", &f->max_batch, "sequences decoded together", 1, 4096);
  table->Number("max-queue", &f->max_queue, "requests waiting beyond the batch (more get 429)", 0,
                1 << 20);
  table->Address("metrics-listen", &f->metrics_listen,
                 "a port of its own for GET /metrics (the API port then has none, so that a "
                 "firewall can open them to different clients); off: /metrics on the API port",
                 /*off_allowed=*/true);
  table->ShowDefault("metrics-listen", "off");
  table->Bytes("max-body", &f->max_body_bytes, "request body limit");
  table->Number("max-connections-per-client", &f->max_connections_per_client,
                "open HTTP connections from one client IP address at most (of 256), so that one "
                "client cannot take every slot (probes included); 0 = no per-client limit",
                0, 256);
  table->Number("shutdown-grace", &f->shutdown_grace_seconds,
                "seconds in-flight requests may finish after SIGTERM", 0.0, 1e9, "SECONDS");
  table->Switch("allow-attention-override", &f->allow_attention_override,
                "accept the per-request 'attention' field (evaluation)");
  table->Choice("log-level", &f->log_level, "the least severe log lines written to stderr",
                logging::LogLevelChoices());
  engine::DeclareAttentionFlags(*table, &f->engine.attention);
  engine::DeclareAttentionNodeFlags(*table, &f->engine);
  return table;
}

int ServeMain(const std::vector<std::string>& args) {
  ServeFlags f;
  std::unique_ptr<flags::FlagTable> table = ServeFlagTable(&f);
  if (absl::Status s = table->Parse(args); !s.ok()) {
    std::cerr << "magicpig_gpu_node: " << s.message()
              << "\n(magicpig_gpu_node --help lists the flags)\n";
    return 2;
  }
  if (table->help_requested()) {
    std::cout << table->Help();
    return 0;
  }
  engine::EngineOptions* engine_options = &f.engine;
  logging::Logger logger("api", f.log_level);  // one line per request (api_server.h)
  ApiServerOptions api;
  const flags::HostPort host_port = *flags::ParseHostPort(f.listen);  // checked by the table
  api.http.host = host_port.host;
  api.http.port = host_port.port;
  api.http.max_body_bytes = f.max_body_bytes;
  api.http.max_connections_per_client = f.max_connections_per_client;
  api.model_name = !f.served_model_name.empty()
                       ? f.served_model_name
                       : std::filesystem::path(engine_options->model_path).stem().string();
  api.api_key = f.api_key;
  api.allow_attention_override = f.allow_attention_override;
  api.logger = &logger;
  api.metrics_listen = f.metrics_listen;

  // Block the stop signals in every thread (the server's and oneTBB's inherit the mask).
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  prometheus::Registry registry;  // outlives the engine, which reports its attention-node RPCs
  metrics::AddBuildInfo(registry, "compute");
  engine_options->metrics_registry = &registry;
  auto engine = engine::Engine::Load(*engine_options);
  if (!engine.ok()) return Fail(engine.status(), 1);
  ServingMetrics serving_metrics(registry);
  engine::Scheduler scheduler(engine->get(), {.max_batch = f.max_batch, .max_queue = f.max_queue},
                              &serving_metrics);
  auto server = ApiServer::Start(engine->get(), &scheduler, &registry, api);
  if (!server.ok()) return Fail(server.status(), 1);
  std::cout << "listening on "
            << (api.http.host.find(':') != std::string::npos ? absl::StrCat("[", api.http.host, "]")
                                                             : api.http.host)
            << ":" << (*server)->port() << std::endl;
  if ((*server)->metrics_port() != 0) {
    std::cerr << "metrics on " << flags::ParseHostPort(f.metrics_listen)->host << ":"
              << (*server)->metrics_port() << std::endl;
  }
  std::cerr << "magicpig_gpu_node: model '" << api.model_name << "', max batch " << f.max_batch
            << ", attention " << attention::EstimatorName(engine_options->attention.mode)
            << (engine_options->attention_nodes.empty()
                    ? " (embedded)"
                    : absl::StrCat(" on ", engine_options->attention_nodes.size(), " nodes"))
            << "\n";
  if (!engine_options->attention_nodes.empty() && engine_options->node_security.insecure) {
    std::cerr << "magicpig_gpu_node: WARNING: plaintext gRPC to the attention nodes (--insecure): "
                 "anyone on the network can read and alter the attention traffic; use "
                 "--tls-cert/--tls-key/--tls-ca outside a trusted network\n";
  }

  int signal_number = 0;
  sigwait(&stop, &signal_number);
  std::cerr << "magicpig_gpu_node: signal " << signal_number << ", draining\n";
  // Stop admitting and let running requests finish (their handlers then answer), then close the
  // HTTP side; whatever is left after the grace period is aborted and its shards released.
  scheduler.Shutdown(absl::Seconds(f.shutdown_grace_seconds));
  (*server)->Shutdown(absl::Seconds(5));
  std::cerr << "magicpig_gpu_node: stopped\n";
  return 0;
}

}  // namespace magicpig::server
