// The OpenAI-compatible wire format of the compute node's HTTP API, without any I/O: request
// bodies of /v1/completions and /v1/chat/completions parsed and validated into engine requests
// (errors name the offending field), and the JSON of responses, stream chunks and error bodies.
// See ../../docs/api.md for the fields supported and how they differ from OpenAI's.
//
// Thread-safety: plain functions over values.
#ifndef MAGICPIG_GPU_NODE_SERVER_OPENAI_PROTOCOL_H_
#define MAGICPIG_GPU_NODE_SERVER_OPENAI_PROTOCOL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "common/json/json.h"
#include "gpu_node/engine/engine.h"

namespace magicpig::server {

// An error as the API reports it: HTTP status and the OpenAI error object's fields.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty: null
  std::string code;   // empty: null
  // What the log gets instead of `message` (the internal cause of a 5xx); never sent to clients.
  std::string detail;
};

// {"error": {"message", "type", "param", "code"}}
std::string ErrorBody(const ApiError& error);
// The API error for an engine / scheduler status: INVALID_ARGUMENT and OUT_OF_RANGE -> 400 with
// the status message (the engine's own checks of the request); RESOURCE_EXHAUSTED of the queue ->
// 429; other RESOURCE_EXHAUSTED and UNAVAILABLE -> 503; anything else -> 500. A 5xx body carries
// a fixed message and `request_id` only: the status message (sequence ids, node addresses,
// budgets) goes to `detail`, for the log line keyed by the same id.
ApiError ErrorFromStatus(const absl::Status& status, std::string_view request_id);

// What the server knows when it parses a request.
struct ApiContext {
  const engine::Engine* engine = nullptr;
  std::string model_name;
  bool allow_attention_override = false;  // the per-request "attention" extension
};

enum class Endpoint { kCompletions, kChat };

// A parsed /v1/completions or /v1/chat/completions request: one engine request per prompt (chat:
// exactly one).
struct ApiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::vector<engine::GenerateRequest> prompts;
  std::vector<std::string> prompt_texts;  // for echo
  bool stream = false;
  bool include_usage = false;
  bool echo = false;
  // completions: `logprobs` (top alternatives); chat: `logprobs: true` with `top_logprobs`.
  int logprobs = -1;  // -1: none
};

// Parses and validates a request body. Errors: malformed JSON, wrong types, values out of range,
// an unknown model (404), a prompt that does not fit the context.
std::optional<ApiRequest> ParseRequest(Endpoint endpoint, std::string_view body,
                                       const ApiContext& context, ApiError* error);

// Response builders. `id` names the whole request; `created` is Unix seconds.
struct ResponseMeta {
  std::string id;
  int64_t created = 0;
  std::string model;
};

// The completions `logprobs` object / chat `logprobs` object for a choice.
json::Value CompletionLogprobs(const engine::Engine& engine, const engine::GenerateRequest& prompt,
                               const engine::GenerateResult& result, bool echo);
json::Value ChatLogprobs(const engine::Engine& engine, const engine::GenerateResult& result);

json::Value Usage(int64_t prompt_tokens, int64_t completion_tokens);

// The non-streaming response body for all prompts' results (in prompt order).
std::string FinalResponse(const engine::Engine& engine, const ApiRequest& request,
                          const ResponseMeta& meta,
                          const std::vector<engine::GenerateResult>& results);

// One Server-Sent Event ("data: {...}\n\n") of a streamed response: a text delta of choice
// `index` (chat: with the role on the first one), or its end (finish_reason set), or the final
// usage chunk (choices: []), or the end marker.
std::string StreamDelta(const ApiRequest& request, const ResponseMeta& meta, int index,
                        std::string_view text, bool first, const json::Value* logprobs);
std::string StreamFinish(const ApiRequest& request, const ResponseMeta& meta, int index,
                         engine::FinishReason finish);
std::string StreamUsage(const ApiRequest& request, const ResponseMeta& meta, int64_t prompt_tokens,
                        int64_t completion_tokens);
std::string StreamError(const ApiError& error);
inline constexpr std::string_view kStreamDone = "data: [DONE]\n\n";

// finish_reason of the API: "stop", "length" ("abort" does not reach clients).
std::string_view ApiFinishReason(engine::FinishReason finish);

}  // namespace magicpig::server

#endif  // MAGICPIG_GPU_NODE_SERVER_OPENAI_PROTOCOL_H_
