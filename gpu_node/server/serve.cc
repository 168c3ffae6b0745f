#include "gpu_node/server/serve.h"

#include <pthread.h>
#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/cli_args.h"
#include "common/metrics/metrics.h"
#include "gpu_node/engine/engine_flags.h"
#include "gpu_node/engine/scheduler.h"
#include "gpu_node/engine/serving_metrics.h"
#include "gpu_node/server/api_server.h"

namespace magicpig::server {
namespace {

std::string Usage() {
  return absl::StrCat(
      "usage: magicpig_gpu_node --model FILE.gguf [options]\n"
      "  --listen HOST:PORT     HTTP API, probes and /metrics (default 0.0.0.0:8000)\n"
      "  --served-model-name N  the model id clients pass (default: the file name stem)\n"
      "  --api-key KEY          require 'Authorization: Bearer KEY' (or env MAGICPIG_API_KEY)\n"
      "  --max-batch N          sequences decoded together (default 8)\n"
      "  --max-queue N          requests waiting beyond the batch (default 64)\n"
      "  --max-body BYTES       request body limit, K/M/G suffixes (default 8M)\n"
      "  --shutdown-grace S     seconds in-flight requests may finish after SIGTERM (default 30)\n"
      "  --allow-attention-override  accept the per-request 'attention' field (evaluation)\n",
      engine::EngineFlagsUsage());
}

int Fail(const absl::Status& s, int code) {
  std::cerr << "magicpig_gpu_node: " << s.message() << "\n";
  return code;
}

}  // namespace

int ServeMain(const std::vector<std::string>& args) {
  std::set<std::string> value_flags = engine::EngineValueFlags();
  value_flags.insert({"listen", "served-model-name", "api-key", "max-batch", "max-queue",
                      "max-body", "shutdown-grace"});
  auto parsed = CliArgs::Parse(args, value_flags, {"allow-attention-override", "help"});
  if (!parsed.ok()) {
    std::cerr << "magicpig_gpu_node: " << parsed.status().message() << "\n" << Usage();
    return 2;
  }
  const CliArgs& a = *parsed;
  if (a.Has("help")) {
    std::cout << Usage();
    return 0;
  }
  auto engine_options = engine::EngineOptionsFromArgs(a);
  if (!engine_options.ok()) return Fail(engine_options.status(), 2);
  auto max_batch = a.GetInt("max-batch", 8);
  auto max_queue = a.GetInt("max-queue", 64);
  auto grace = a.GetDouble("shutdown-grace", 30);
  auto max_body = ParseByteSize(a.Get("max-body", "8M"));
  for (const absl::Status& s :
       {max_batch.status(), max_queue.status(), grace.status(), max_body.status()}) {
    if (!s.ok()) return Fail(s, 2);
  }
  if (*max_batch < 1 || *max_queue < 0 || *grace < 0) {
    return Fail(absl::InvalidArgumentError(
                    "--max-batch must be >= 1, --max-queue and --shutdown-grace >= 0"),
                2);
  }
  ApiServerOptions api;
  const std::string listen = a.Get("listen", "0.0.0.0:8000");
  absl::StatusOr<HostPort> host_port = ParseHostPort(listen);
  if (!host_port.ok()) return Fail(host_port.status(), 2);
  api.http.host = host_port->host;
  api.http.port = host_port->port;
  api.http.max_body_bytes = *max_body;
  api.model_name = a.Has("served-model-name")
                       ? a.Get("served-model-name")
                       : std::filesystem::path(engine_options->model_path).stem().string();
  api.api_key = a.Get("api-key");
  if (api.api_key.empty() && std::getenv("MAGICPIG_API_KEY") != nullptr) {
    api.api_key = std::getenv("MAGICPIG_API_KEY");
  }
  api.allow_attention_override = a.Has("allow-attention-override");

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
  engine::ServingMetrics serving_metrics(registry);
  engine::Scheduler scheduler(
      engine->get(),
      {.max_batch = static_cast<int>(*max_batch), .max_queue = static_cast<int>(*max_queue)},
      &serving_metrics);
  auto server = ApiServer::Start(engine->get(), &scheduler, &registry, api);
  if (!server.ok()) return Fail(server.status(), 1);
  std::cout << "listening on "
            << (api.http.host.find(':') != std::string::npos ? absl::StrCat("[", api.http.host, "]")
                                                             : api.http.host)
            << ":" << (*server)->port() << std::endl;
  std::cerr << "magicpig_gpu_node: model '" << api.model_name << "', max batch " << *max_batch
            << ", attention " << attention::EstimatorName(engine_options->attention.mode)
            << (engine_options->attention_nodes.empty()
                    ? " (embedded)"
                    : absl::StrCat(" on ", engine_options->attention_nodes.size(), " nodes"))
            << "\n";

  int signal_number = 0;
  sigwait(&stop, &signal_number);
  std::cerr << "magicpig_gpu_node: signal " << signal_number << ", draining\n";
  // Stop admitting and let running requests finish (their handlers then answer), then close the
  // HTTP side; whatever is left after the grace period is aborted and its shards released.
  scheduler.Shutdown(absl::Seconds(*grace));
  (*server)->Shutdown(absl::Seconds(5));
  std::cerr << "magicpig_gpu_node: stopped\n";
  return 0;
}

}  // namespace magicpig::server
