#include "gpu_node/server/api_server.h"

#include <chrono>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/metrics/metrics.h"
#include "grpcpp/grpcpp.h"

namespace magicpig::server {
namespace {

using engine::FinishReason;
using engine::GenerateResult;
using json::Value;
using logging::LogLevel;

constexpr std::string_view kJson = "application/json";
constexpr std::string_view kInvalidKeyMessage =
    "Incorrect or missing API key: send 'Authorization: Bearer <key>'";

// What the scheduler hands to the waiting handler thread for one HTTP request (all its prompts).
// Shared with the scheduler's callbacks, which may outlive the handler (client gone).
struct Channel {
  struct Token {
    int index;
    std::string text;
    std::optional<engine::TokenLogprob> logprob;
  };
  absl::Mutex mu;
  std::deque<Token> tokens ABSL_GUARDED_BY(mu);
  std::vector<std::optional<absl::StatusOr<GenerateResult>>> results ABSL_GUARDED_BY(mu);
  std::deque<int> finished ABSL_GUARDED_BY(mu);  // indices, in the order they finished
  int remaining ABSL_GUARDED_BY(mu) = 0;
  int64_t generated_tokens ABSL_GUARDED_BY(mu) = 0;  // over all prompts (for the log)

  bool Ready() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return !tokens.empty() || !finished.empty();
  }
};

// Constant-time comparison (no early exit on the first differing byte).
bool SecretEquals(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
}

// The finish reason of a prompt's outcome for the log.
std::string FinishForLog(const absl::StatusOr<GenerateResult>& r) {
  if (!r.ok()) return "error";
  return std::string(engine::FinishReasonName(r->finish));
}

// The log's finish field: the prompts' reasons joined by commas ("-" for one that did not finish,
// and for none at all).
std::string FinishField(const std::vector<std::string>& finish) {
  if (finish.empty()) return "-";
  return absl::StrJoin(finish, ",", [](std::string* out, const std::string& f) {
    out->append(f.empty() ? "-" : f);
  });
}

}  // namespace

struct ApiServer::RequestLog {
  std::string id = "-";  // the response id, once assigned
  bool stream = false;
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  std::vector<std::string> finish;  // per prompt, in prompt order ("" until it finished)
  std::string error;                // the public error message of a failure
};

ApiServer::ApiServer(engine::Engine* engine, engine::Scheduler* scheduler,
                     prometheus::Registry* registry, ApiServerOptions options)
    : engine_(engine),
      scheduler_(scheduler),
      registry_(registry),
      options_(std::move(options)),
      http_requests_(prometheus::BuildCounter()
                         .Name("magicpig_http_requests_total")
                         .Help("HTTP requests answered, by handler and status code")
                         .Register(*registry)),
      started_(absl::ToUnixSeconds(absl::Now())) {
  context_.engine = engine_;
  context_.model_name = options_.model_name;
  context_.allow_attention_override = options_.allow_attention_override;
}

ApiServer::~ApiServer() { Shutdown(absl::ZeroDuration()); }

void ApiServer::Shutdown(absl::Duration grace) {
  if (http_ != nullptr) http_->Shutdown(grace);
  if (metrics_http_ != nullptr) metrics_http_->Shutdown(absl::Seconds(1));
}

absl::StatusOr<std::unique_ptr<ApiServer>> ApiServer::Start(engine::Engine* engine,
                                                            engine::Scheduler* scheduler,
                                                            prometheus::Registry* registry,
                                                            ApiServerOptions options) {
  std::unique_ptr<ApiServer> s(new ApiServer(engine, scheduler, registry, std::move(options)));
  ApiServer* self = s.get();
  http::Router router;
  router.Handle("POST", "/v1/completions",
                s->Wrap("/v1/completions", RouteKind::kGeneration,
                        [self](const auto& req, auto& res, RequestLog* log) {
                          return self->Generate(Endpoint::kCompletions, req, res, log);
                        }));
  router.Handle("POST", "/v1/chat/completions",
                s->Wrap("/v1/chat/completions", RouteKind::kGeneration,
                        [self](const auto& req, auto& res, RequestLog* log) {
                          return self->Generate(Endpoint::kChat, req, res, log);
                        }));
  router.Handle("GET", "/v1/models",
                s->Wrap("/v1/models", RouteKind::kApi,
                        [self](const auto&, auto& res, RequestLog*) { return self->Models(res); }));
  router.Handle(
      "POST", "/tokenize",
      s->Wrap("/tokenize", RouteKind::kApi, [self](const auto& req, auto& res, RequestLog* log) {
        return self->Tokenize(req, res, log);
      }));
  router.Handle(
      "POST", "/detokenize",
      s->Wrap("/detokenize", RouteKind::kApi, [self](const auto& req, auto& res, RequestLog* log) {
        return self->Detokenize(req, res, log);
      }));
  router.Handle(
      "GET", "/tokenizer_info",
      s->Wrap("/tokenizer_info", RouteKind::kApi,
              [self](const auto&, auto& res, RequestLog*) { return self->TokenizerInfo(res); }));
  router.Handle("GET", "/healthz",
                s->Wrap("/healthz", RouteKind::kProbe, [self](const auto&, auto& res, RequestLog*) {
                  return self->SendJson(res, 200, R"({"status":"ok"})");
                }));
  for (const char* path : {"/readyz", "/health"}) {
    router.Handle("GET", path,
                  s->Wrap(path, RouteKind::kProbe, [self](const auto&, auto& res, RequestLog* log) {
                    return self->Ready(res, log);
                  }));
  }
  const http::Handler metrics =
      s->Wrap("/metrics", RouteKind::kProbe,
              [self](const auto&, auto& res, RequestLog*) { return self->Metrics(res); });
  if (s->options_.metrics_listen.empty()) router.Handle("GET", "/metrics", metrics);
  http::ServerOptions http_options = s->options_.http;
  // Probes and scrapes keep 16 slots of their own: a flood from many addresses that takes every
  // regular slot cannot make the kubelet restart the pod or blind Prometheus.
  http_options.reserved_probe_connections = 16;
  http_options.probe_paths = {"/healthz", "/readyz", "/health"};
  if (s->options_.metrics_listen.empty()) http_options.probe_paths.push_back("/metrics");
  http_options.error_body = [logger = s->options_.logger](int status, std::string_view message) {
    // The errors the HTTP layer answers without a handler (no route, malformed request, too many
    // connections) get their line here. Its 500s follow a handler, whose line Wrap wrote.
    const LogLevel level = status >= 500 ? LogLevel::kWarning : LogLevel::kInfo;
    if (status != 500 && logging::ShouldLog(logger, level)) {
      logger->Log(level, logging::KeyValues({{"endpoint", "-"},
                                             {"status", absl::StrCat(status)},
                                             {"error", logging::Truncated(message, 512)}}));
    }
    ApiError e;
    e.status = status;
    e.message = std::string(message);
    if (status >= 500) e.type = "server_error";
    if (status == 401) e.code = "invalid_api_key";
    return std::make_pair(std::string(kJson), ErrorBody(e));
  };
  // A request with a body and without the key is refused before its body is read: an
  // unauthenticated client cannot make the server buffer up to --max-body per connection.
  http_options.head_check = [self](const http::Request& head) -> std::optional<http::HeadRefusal> {
    if (self->Authorized(head)) return std::nullopt;
    return http::HeadRefusal{.status = 401, .message = std::string(kInvalidKeyMessage)};
  };
  absl::StatusOr<std::unique_ptr<http::Server>> http =
      http::Server::Start(http_options, std::move(router));
  if (!http.ok()) return http.status();
  s->http_ = *std::move(http);
  if (!s->options_.metrics_listen.empty()) {
    http::Router metrics_router;
    metrics_router.Handle("GET", "/metrics", metrics);
    absl::StatusOr<std::unique_ptr<http::Server>> m = http::StartProbeListener(
        s->options_.metrics_listen, std::move(metrics_router), {"/metrics"});
    if (!m.ok()) return m.status();
    s->metrics_http_ = *std::move(m);
  }
  return s;
}

http::Handler ApiServer::Wrap(std::string name, RouteKind kind, ApiHandler handler) {
  return [this, name = std::move(name), kind, handler = std::move(handler)](
             const http::Request& request, http::Responder& responder) {
    const auto start = std::chrono::steady_clock::now();
    const auto elapsed_ms = [&start] {
      return std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::steady_clock::now() - start)
          .count();
    };
    RequestLog log;
    int status;
    if (kind != RouteKind::kProbe && !Authorized(request)) {
      ApiError e;
      e.status = 401;
      e.message = std::string(kInvalidKeyMessage);
      e.code = "invalid_api_key";
      status = SendError(responder, e, &log);
    } else {
      try {
        status = handler(request, responder, &log);
      } catch (...) {
        // The HTTP server answers 500 (or cuts the response off); the line is written here.
        log.error = "the handler failed";
        LogRequest(name, kind, 500, log, elapsed_ms());
        throw;
      }
    }
    http_requests_.Add({{"handler", name}, {"status", std::to_string(status)}}).Increment();
    LogRequest(name, kind, status, log, elapsed_ms());
  };
}

void ApiServer::LogRequest(std::string_view name, RouteKind kind, int status, const RequestLog& log,
                           int64_t ms) const {
  // A 2xx with an error: a stream that failed after its status line was sent.
  const bool failed = status >= 500 || (status < 400 && !log.error.empty());
  const LogLevel level = kind == RouteKind::kProbe ? LogLevel::kDebug
                         : failed                  ? LogLevel::kWarning
                                                   : LogLevel::kInfo;
  if (!logging::ShouldLog(options_.logger, level)) return;
  std::string line;
  if (kind == RouteKind::kGeneration) {
    line = logging::KeyValues({{"id", log.id},
                               {"endpoint", std::string(name)},
                               {"stream", log.stream ? "yes" : "no"},
                               {"prompt_tokens", absl::StrCat(log.prompt_tokens)},
                               {"generated_tokens", absl::StrCat(log.generated_tokens)},
                               {"finish", FinishField(log.finish)},
                               {"ms", absl::StrCat(ms)},
                               {"status", absl::StrCat(status)}});
  } else {
    line = logging::KeyValues({{"endpoint", std::string(name)},
                               {"ms", absl::StrCat(ms)},
                               {"status", absl::StrCat(status)}});
  }
  if (!log.error.empty()) {
    // Error messages may quote what the client sent (a model name, a role): bounded.
    absl::StrAppend(&line, " ",
                    logging::KeyValues({{"error", logging::Truncated(log.error, 512)}}));
  }
  options_.logger->Log(level, line);
}

bool ApiServer::Authorized(const http::Request& request) const {
  if (options_.api_key.empty()) return true;
  const std::string* header = request.headers.Find("authorization");
  if (header == nullptr) return false;
  std::string_view value = *header;
  constexpr std::string_view kBearer = "Bearer ";
  if (value.size() < kBearer.size() ||
      !absl::EqualsIgnoreCase(absl::string_view(value.data(), kBearer.size()),
                              absl::string_view("Bearer "))) {
    return false;
  }
  return SecretEquals(value.substr(kBearer.size()), options_.api_key);
}

int ApiServer::SendJson(http::Responder& responder, int status, const std::string& body) {
  if (responder.responded()) {
    // A half-closed client's response already went out as a 200 stream of JSON whitespace
    // (Generate's heartbeats): the body completes it, whatever `status` says (the log keeps it).
    responder.Write(body);
    responder.End();
    return status;
  }
  responder.Send(status, kJson, body).IgnoreError();
  return status;
}

int ApiServer::SendError(http::Responder& responder, const ApiError& error, RequestLog* log) {
  log->error = error.detail.empty() ? error.message : error.detail;
  return SendJson(responder, error.status, ErrorBody(error));
}

int ApiServer::Generate(Endpoint endpoint, const http::Request& request, http::Responder& responder,
                        RequestLog* log) {
  const auto arrival = engine::Scheduler::Clock::now();
  ResponseMeta meta;
  // Assigned before parsing, so that a refused request's log line has an id too.
  meta.id = absl::StrCat(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-", started_, "-",
                         next_id_.fetch_add(1));
  log->id = meta.id;
  ApiError error;
  std::optional<ApiRequest> parsed = ParseRequest(endpoint, request.body, context_, &error);
  if (!parsed.has_value()) return SendError(responder, error, log);
  const ApiRequest& api = *parsed;
  const int n = static_cast<int>(api.prompts.size());
  // More prompts than the batch and the queue together can hold would be refused with 429 on
  // every retry: the request itself is too large.
  const int capacity = scheduler_->options().max_batch + scheduler_->options().max_queue;
  if (n > capacity) {
    ApiError too_many;
    too_many.message =
        absl::StrCat("at most ", capacity, " prompts per request on this server, got ", n);
    too_many.param = "prompt";
    return SendError(responder, too_many, log);
  }
  log->stream = api.stream;
  for (const engine::GenerateRequest& prompt : api.prompts) {
    log->prompt_tokens += static_cast<int64_t>(prompt.prompt.size());
  }
  log->finish.resize(n);
  meta.created = absl::ToUnixSeconds(absl::Now());
  meta.model = options_.model_name;

  auto channel = std::make_shared<Channel>();
  {
    absl::MutexLock lock(&channel->mu);
    channel->results.resize(n);
    channel->remaining = n;
  }
  // However the request ends, the log gets the tokens generated so far.
  absl::Cleanup count_generated = [&channel, log] {
    absl::MutexLock lock(&channel->mu);
    log->generated_tokens = channel->generated_tokens;
  };
  const bool want_logprobs = api.logprobs >= 0;
  std::vector<std::shared_ptr<engine::RequestHandle>> handles;
  auto cancel_all = [&handles] {
    for (auto& h : handles) h->Cancel();
  };
  for (int i = 0; i < n; ++i) {
    engine::RequestCallbacks callbacks;
    callbacks.on_token = [channel, i, want_logprobs](const engine::TokenOutput& t) {
      absl::MutexLock lock(&channel->mu);
      if (t.token >= 0) ++channel->generated_tokens;  // (-1: text flushed at the end)
      Channel::Token token{i, std::string(t.text), std::nullopt};
      if (want_logprobs && t.logprob != nullptr) token.logprob = *t.logprob;
      if (token.text.empty() && !token.logprob.has_value()) return;
      channel->tokens.push_back(std::move(token));
    };
    callbacks.on_done = [channel, i](absl::StatusOr<GenerateResult> result) {
      absl::MutexLock lock(&channel->mu);
      channel->results[i] = std::move(result);
      channel->finished.push_back(i);
      --channel->remaining;
    };
    absl::StatusOr<std::shared_ptr<engine::RequestHandle>> handle =
        scheduler_->Submit(api.prompts[i], std::move(callbacks), arrival);
    if (!handle.ok()) {
      cancel_all();
      return SendError(responder, ErrorFromStatus(handle.status(), meta.id), log);
    }
    handles.push_back(*std::move(handle));
  }

  // The client shut its sending side: it is gone, or it only half-closed and still reads. Only a
  // write tells which, so while nothing else is written the connection gets bytes that do not
  // change the response (JSON whitespace before the body, which then goes out as a 200 stream; an
  // SSE comment); once the peer has really closed, a write fails (about one round trip later).
  auto heartbeat = [&]() -> bool {
    if (api.stream) return responder.Write(": keep-alive\n\n");
    if (!responder.responded() && !responder.StartStream(200, kJson).ok()) return false;
    return responder.Write(" ");
  };
  // Waits for the next tokens or results; false when the client went away (requests cancelled).
  auto wait = [&](std::deque<Channel::Token>* tokens, std::deque<int>* finished) {
    for (;;) {
      {
        absl::MutexLock lock(&channel->mu);
        channel->mu.AwaitWithTimeout(absl::Condition(channel.get(), &Channel::Ready),
                                     absl::Milliseconds(100));
        if (channel->Ready()) {
          tokens->swap(channel->tokens);
          finished->swap(channel->finished);
          return true;
        }
      }
      if (responder.ClientGone() && !heartbeat()) {
        cancel_all();
        return false;
      }
    }
  };
  auto result_of = [&](int i) {
    absl::MutexLock lock(&channel->mu);
    return *channel->results[i];
  };
  auto aborted_error = [] {
    ApiError e;
    e.status = 503;
    e.type = "server_error";
    e.message = "the request was aborted: the server is shutting down";
    return e;
  };

  if (!api.stream) {
    int done = 0;
    while (done < n) {
      std::deque<Channel::Token> tokens;
      std::deque<int> finished;
      if (!wait(&tokens, &finished)) return 499;  // client closed the request (nginx's code)
      done += static_cast<int>(finished.size());
    }
    std::vector<GenerateResult> results;
    for (int i = 0; i < n; ++i) {
      absl::MutexLock lock(&channel->mu);
      log->finish[i] = FinishForLog(*channel->results[i]);
    }
    for (int i = 0; i < n; ++i) {
      absl::StatusOr<GenerateResult> r = result_of(i);
      if (!r.ok()) return SendError(responder, ErrorFromStatus(r.status(), meta.id), log);
      if (r->finish == FinishReason::kAbort) return SendError(responder, aborted_error(), log);
      results.push_back(*std::move(r));
    }
    return SendJson(responder, 200, FinalResponse(*engine_, api, meta, results));
  }

  if (!responder.StartStream(200, "text/event-stream", {{"Cache-Control", "no-cache"}}).ok()) {
    cancel_all();
    return 499;
  }
  std::vector<bool> started(n, false);
  int64_t prompt_tokens = 0, completion_tokens = 0;
  auto write = [&](const std::string& event) {
    if (responder.Write(event)) return true;
    cancel_all();
    return false;
  };
  // The first event of each choice: the role (chat) or the echoed prompt (completions).
  auto open_choice = [&](int i) {
    if (started[i]) return true;
    started[i] = true;
    if (api.endpoint == Endpoint::kChat || api.echo) {
      return write(StreamDelta(api, meta, i, api.echo ? api.prompt_texts[i] : "", true, nullptr));
    }
    return true;
  };
  int done = 0;
  while (done < n) {
    std::deque<Channel::Token> tokens;
    std::deque<int> finished;
    if (!wait(&tokens, &finished)) return 200;
    for (Channel::Token& t : tokens) {
      if (!open_choice(t.index)) return 200;
      std::optional<Value> logprobs;
      if (t.logprob.has_value()) {
        GenerateResult one;
        one.tokens = {t.logprob->token};
        one.logprobs = {*t.logprob};
        logprobs = api.endpoint == Endpoint::kChat
                       ? ChatLogprobs(*engine_, one)
                       : CompletionLogprobs(*engine_, api.prompts[t.index], one, false);
      }
      if (!write(StreamDelta(api, meta, t.index, t.text, false,
                             logprobs.has_value() ? &*logprobs : nullptr))) {
        return 200;
      }
    }
    for (int i : finished) {
      ++done;
      absl::StatusOr<GenerateResult> r = result_of(i);
      log->finish[i] = FinishForLog(r);
      if (!open_choice(i)) return 200;
      if (!r.ok() || r->finish == FinishReason::kAbort) {
        // The status line is sent: the error goes inside the stream.
        const ApiError e = r.ok() ? aborted_error() : ErrorFromStatus(r.status(), meta.id);
        log->error = e.detail.empty() ? e.message : e.detail;
        write(StreamError(e));
        cancel_all();
        responder.End();
        return 200;
      }
      prompt_tokens += static_cast<int64_t>(api.prompts[i].prompt.size());
      completion_tokens += static_cast<int64_t>(r->tokens.size());
      if (!write(StreamFinish(api, meta, i, r->finish))) return 200;
    }
  }
  if (api.include_usage && !write(StreamUsage(api, meta, prompt_tokens, completion_tokens))) {
    return 200;
  }
  write(std::string(kStreamDone));
  responder.End();
  return 200;
}

int ApiServer::Models(http::Responder& responder) {
  Value model = Value::Object();
  model.Set("id", options_.model_name);
  model.Set("object", "model");
  model.Set("created", started_);
  model.Set("owned_by", "magicpig");
  model.Set("max_model_len", engine_->context_length());
  Value data = Value::Array();
  data.Push(std::move(model));
  Value v = Value::Object();
  v.Set("object", "list");
  v.Set("data", std::move(data));
  return SendJson(responder, 200, json::Serialize(v));
}

int ApiServer::Tokenize(const http::Request& request, http::Responder& responder, RequestLog* log) {
  ApiError error;
  absl::StatusOr<Value> body = json::Parse(request.body);
  const Value* prompt = body.ok() ? body->Find("prompt") : nullptr;
  if (prompt == nullptr || !prompt->is_string()) {
    error.message =
        body.ok() ? "'prompt' must be a string"
                  : absl::StrCat("the request body is not valid JSON: ", body.status().message());
    error.param = body.ok() ? "prompt" : "";
    return SendError(responder, error, log);
  }
  bool add_special = false;
  if (const Value* a = body->Find("add_special_tokens"); a != nullptr && a->is_bool()) {
    add_special = a->as_bool();
  }
  const model::Tokenizer& tok = engine_->tokenizer();
  Value tokens = Value::Array();
  if (add_special && tok.add_bos() && tok.bos_id() >= 0) tokens.Push(tok.bos_id());
  // Special-token text is recognised either way: add_special_tokens only adds BOS/EOS.
  for (int32_t id : tok.Encode(prompt->as_string(), /*parse_special=*/true)) tokens.Push(id);
  Value v = Value::Object();
  v.Set("count", static_cast<int64_t>(tokens.size()));
  v.Set("max_model_len", engine_->context_length());
  v.Set("tokens", std::move(tokens));
  return SendJson(responder, 200, json::Serialize(v));
}

int ApiServer::Detokenize(const http::Request& request, http::Responder& responder,
                          RequestLog* log) {
  ApiError error;
  absl::StatusOr<Value> body = json::Parse(request.body);
  const Value* tokens = body.ok() ? body->Find("tokens") : nullptr;
  std::vector<int32_t> ids;
  bool ok = tokens != nullptr && tokens->is_array();
  for (size_t i = 0; ok && i < tokens->size(); ++i) {
    const Value& t = tokens->as_array()[i];
    ok = t.is_int() && t.as_int() >= 0 && t.as_int() < engine_->config().n_vocab;
    if (ok) ids.push_back(static_cast<int32_t>(t.as_int()));
  }
  if (!ok) {
    error.message =
        body.ok() ? absl::StrCat("'tokens' must be an array of token ids in [0, ",
                                 engine_->config().n_vocab, ")")
                  : absl::StrCat("the request body is not valid JSON: ", body.status().message());
    error.param = body.ok() ? "tokens" : "";
    return SendError(responder, error, log);
  }
  Value v = Value::Object();
  v.Set("prompt", engine_->tokenizer().Decode(ids, /*render_special=*/true));
  return SendJson(responder, 200, json::Serialize(v));
}

int ApiServer::TokenizerInfo(http::Responder& responder) {
  const model::Tokenizer& tok = engine_->tokenizer();
  Value v = Value::Object();
  auto text = [&](int32_t id) { return id >= 0 ? Value(tok.TokenText(id)) : Value(); };
  v.Set("eos_token", text(tok.eos_id()));
  v.Set("bos_token", text(tok.bos_id()));
  v.Set("pad_token", text(tok.eos_id()));
  v.Set("add_bos_token", tok.add_bos());
  v.Set("model_max_length", engine_->context_length());
  return SendJson(responder, 200, json::Serialize(v));
}

int ApiServer::Ready(http::Responder& responder, RequestLog* log) {
  // Ready = can serve: embedded, or at least one attention node answers NodeStatus within a second
  // (the engine places new sequences on the nodes that answer and rebuilds those of a lost one).
  // The body gives counts only; which nodes failed, and why, goes to the log.
  const auto& nodes = engine_->attention_nodes();
  int reachable = 0;
  std::string failures;
  for (const auto& node : nodes) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
    magicpig::v1::NodeStatusRequest request;
    magicpig::v1::NodeStatusResponse response;
    node->Identify(&context);
    const grpc::Status s = node->stub().NodeStatus(&context, request, &response);
    if (s.ok()) {
      ++reachable;
    } else {
      absl::StrAppend(&failures, failures.empty() ? "" : "; ", node->address(), ": ",
                      s.error_message());
    }
  }
  const bool ready = nodes.empty() || reachable > 0;
  if (!failures.empty()) log->error = absl::StrCat("attention nodes unreachable: ", failures);
  Value counts = Value::Object();
  counts.Set("reachable", static_cast<int64_t>(reachable));
  counts.Set("total", static_cast<int64_t>(nodes.size()));
  Value v = Value::Object();
  v.Set("status", ready ? "ok" : "no attention node reachable");
  v.Set("model", options_.model_name);
  v.Set("attention_nodes", std::move(counts));
  return SendJson(responder, ready ? 200 : 503, json::Serialize(v));
}

int ApiServer::Metrics(http::Responder& responder) {
  engine_->RefreshMemoryMetrics();
  responder.Send(200, metrics::kContentType, metrics::Render(*registry_)).IgnoreError();
  return 200;
}

}  // namespace magicpig::server
