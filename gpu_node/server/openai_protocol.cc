#include "gpu_node/server/openai_protocol.h"

#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/attention/estimator_params.h"

namespace magicpig::server {
namespace {

using engine::FinishReason;
using engine::GenerateRequest;
using engine::GenerateResult;
using json::Value;

// Reads optional typed fields of a request object; the first problem lands in *error.
class FieldReader {
 public:
  FieldReader(const Value& object, ApiError* error) : object_(object), error_(error) {}
  bool ok() const { return ok_; }

  // Absent or null: leaves *out as it is.
  const Value* Get(std::string_view name) {
    const Value* v = object_.Find(name);
    return v == nullptr || v->is_null() ? nullptr : v;
  }
  void Fail(std::string_view name, std::string message) {
    if (!ok_) return;
    ok_ = false;
    error_->status = 400;
    error_->message = std::move(message);
    error_->param = std::string(name);
  }
  void WrongType(std::string_view name, std::string_view want, const Value& v) {
    Fail(name, absl::StrCat("'", std::string(name), "' must be ", std::string(want), ", not ",
                            std::string(json::TypeName(v.type()))));
  }
  void Int(std::string_view name, int64_t min, int64_t max, int64_t* out) {
    const Value* v = Get(name);
    if (v == nullptr || !ok_) return;
    // 3.0 is accepted as an integer (some clients send floats); 3.5 is not.
    if (!v->is_number() || (!v->is_int() && (v->as_double() != std::floor(v->as_double()) ||
                                             std::fabs(v->as_double()) > 9.0e15))) {
      WrongType(name, "an integer", *v);
      return;
    }
    const int64_t x = v->is_int() ? v->as_int() : static_cast<int64_t>(v->as_double());
    if (x < min || x > max) {
      Fail(name,
           absl::StrCat("'", std::string(name), "' must be in [", min, ", ", max, "], got ", x));
      return;
    }
    *out = x;
  }
  void Number(std::string_view name, double min, double max, double* out) {
    const Value* v = Get(name);
    if (v == nullptr || !ok_) return;
    if (!v->is_number()) {
      WrongType(name, "a number", *v);
      return;
    }
    if (v->as_double() < min || v->as_double() > max) {
      Fail(name, absl::StrCat("'", std::string(name), "' must be in [", min, ", ", max, "], got ",
                              v->as_double()));
      return;
    }
    *out = v->as_double();
  }
  void Bool(std::string_view name, bool* out) {
    const Value* v = Get(name);
    if (v == nullptr || !ok_) return;
    if (!v->is_bool()) {
      WrongType(name, "a boolean", *v);
      return;
    }
    *out = v->as_bool();
  }
  void String(std::string_view name, std::string* out) {
    const Value* v = Get(name);
    if (v == nullptr || !ok_) return;
    if (!v->is_string()) {
      WrongType(name, "a string", *v);
      return;
    }
    *out = v->as_string();
  }
  // A string or an array of strings.
  void Strings(std::string_view name, std::vector<std::string>* out) {
    const Value* v = Get(name);
    if (v == nullptr || !ok_) return;
    if (v->is_string()) {
      out->push_back(v->as_string());
      return;
    }
    if (!v->is_array()) {
      WrongType(name, "a string or an array of strings", *v);
      return;
    }
    for (const Value& s : v->as_array()) {
      if (!s.is_string()) {
        WrongType(name, "a string or an array of strings", s);
        return;
      }
      if (!s.as_string().empty()) out->push_back(s.as_string());
    }
  }

 private:
  const Value& object_;
  ApiError* error_;
  bool ok_ = true;
};

// Token ids of a prompt given as an array of integers; false (and *error) if an element is not
// an integer token id.
bool TokenIds(const Value& array, int64_t n_vocab, std::vector<int32_t>* ids, ApiError* error) {
  for (const Value& t : array.as_array()) {
    if (!t.is_int() || t.as_int() < 0 || t.as_int() >= n_vocab) {
      error->message = absl::StrCat("'prompt' token ids must be integers in [0, ", n_vocab,
                                    "), got ", json::Serialize(t));
      error->param = "prompt";
      return false;
    }
    ids->push_back(static_cast<int32_t>(t.as_int()));
  }
  if (ids->empty()) {
    error->message = "'prompt' must not be empty";
    error->param = "prompt";
    return false;
  }
  return true;
}

// The prompts of a completions request: a string, an array of strings, an array of token ids or
// an array of arrays of token ids.
bool CompletionPrompts(const Value& prompt, const engine::Engine& engine,
                       std::vector<std::vector<int32_t>>* ids, std::vector<std::string>* texts,
                       ApiError* error) {
  const model::Tokenizer& tok = engine.tokenizer();
  auto encode = [&](const std::string& text) {
    std::vector<int32_t> out;
    if (tok.add_bos() && tok.bos_id() >= 0) out.push_back(tok.bos_id());
    std::vector<int32_t> body = tok.Encode(text, /*parse_special=*/true);
    out.insert(out.end(), body.begin(), body.end());
    return out;
  };
  const int64_t n_vocab = engine.config().n_vocab;
  if (prompt.is_string()) {
    ids->push_back(encode(prompt.as_string()));
    texts->push_back(prompt.as_string());
  } else if (prompt.is_array() && prompt.size() > 0 && prompt.as_array()[0].is_number()) {
    ids->emplace_back();
    if (!TokenIds(prompt, n_vocab, &ids->back(), error)) return false;
    texts->push_back(tok.Decode(ids->back()));
  } else if (prompt.is_array() && prompt.size() > 0) {
    for (const Value& p : prompt.as_array()) {
      if (p.is_string()) {
        ids->push_back(encode(p.as_string()));
        texts->push_back(p.as_string());
      } else if (p.is_array()) {
        ids->emplace_back();
        if (!TokenIds(p, n_vocab, &ids->back(), error)) return false;
        texts->push_back(tok.Decode(ids->back()));
      } else {
        error->message =
            "'prompt' must be a string, an array of strings, an array of token ids "
            "or an array of arrays of token ids";
        error->param = "prompt";
        return false;
      }
    }
  } else {
    error->message = prompt.is_array() ? "'prompt' must not be empty"
                                       : "'prompt' must be a string, an array of strings, an "
                                         "array of token ids or an array of arrays of token ids";
    error->param = "prompt";
    return false;
  }
  for (const std::vector<int32_t>& p : *ids) {
    if (p.empty()) {
      error->message = "'prompt' must not be empty";
      error->param = "prompt";
      return false;
    }
  }
  return true;
}

bool ChatMessages(const Value& messages, std::vector<model::ChatMessage>* out, ApiError* error) {
  if (!messages.is_array() || messages.size() == 0) {
    error->message = "'messages' must be a non-empty array of {role, content} objects";
    error->param = "messages";
    return false;
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const Value& m = messages.as_array()[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    const Value* role = m.Find("role");
    const Value* content = m.Find("content");
    if (!m.is_object() || role == nullptr || !role->is_string()) {
      error->message = absl::StrCat("'", where, "' must be an object with a string 'role'");
      error->param = where + ".role";
      return false;
    }
    const std::string& r = role->as_string();
    if (r != "system" && r != "user" && r != "assistant" && r != "developer" && r != "tool") {
      error->message = absl::StrCat("'", where,
                                    ".role' must be one of system, developer, user, "
                                    "assistant, tool; got '",
                                    r, "'");
      error->param = where + ".role";
      return false;
    }
    model::ChatMessage msg{.role = r == "developer" ? "system" : r, .content = ""};
    if (content == nullptr || content->is_null()) {
      // An assistant turn may carry no content.
    } else if (content->is_string()) {
      msg.content = content->as_string();
    } else if (content->is_array()) {
      // Content parts: only text is supported.
      for (const Value& part : content->as_array()) {
        const Value* type = part.Find("type");
        const Value* text = part.Find("text");
        if (type == nullptr || !type->is_string() || type->as_string() != "text" ||
            text == nullptr || !text->is_string()) {
          error->message = absl::StrCat("'", where,
                                        ".content' parts must be {\"type\": \"text\", "
                                        "\"text\": ...}; other part types are not supported");
          error->param = where + ".content";
          return false;
        }
        msg.content += text->as_string();
      }
    } else {
      error->message = absl::StrCat("'", where,
                                    ".content' must be a string or an array of text "
                                    "parts, not ",
                                    std::string(json::TypeName(content->type())));
      error->param = where + ".content";
      return false;
    }
    out->push_back(std::move(msg));
  }
  return true;
}

// The magicpig extension: {"attention": {"mode": "full"|"magicpig"|..., "lsh_k", "lsh_l",
// "budget"}}.
bool AttentionOverride(const Value& v, const engine::SparseAttentionOptions& base,
                       engine::SparseAttentionOptions* out, ApiError* error) {
  if (!v.is_object()) {
    error->message = "'attention' must be an object {\"mode\", \"lsh_k\", \"lsh_l\", \"budget\"}";
    error->param = "attention";
    return false;
  }
  *out = base;
  FieldReader f(v, error);
  std::string mode;
  f.String("mode", &mode);
  int64_t k = out->lsh_k, l = out->lsh_l, budget = out->budget;
  // Bounds from the one declaration of each parameter (common/attention/estimator_params.h).
  for (auto [spec, value] : {std::pair{&attention::kLshK, &k}, std::pair{&attention::kLshL, &l},
                             std::pair{&attention::kBudget, &budget},
                             std::pair{&attention::kSpotRerank, &out->spotlight_rerank},
                             std::pair{&attention::kSketchDims, &out->sketch_dims}}) {
    f.Int(spec->name, spec->min, spec->max, value);
  }
  attention::VAttentionParams va = out->vattention;
  for (auto [spec, value] :
       {std::pair{&attention::kVaEpsilon, &va.epsilon}, std::pair{&attention::kVaDelta, &va.delta},
        std::pair{&attention::kVaBaseRate, &va.base_rate},
        std::pair{&attention::kSpotFraction, &out->spotlight_fraction}}) {
    f.Number(spec->name, spec->min, spec->max, value);
  }
  f.Int(attention::kVaHeavy.name, attention::kVaHeavy.min, attention::kVaHeavy.max, &va.heavy);
  if (!f.ok()) {
    error->param = "attention." + error->param;
    return false;
  }
  if (absl::Status st = attention::CheckSketchDims(out->sketch_dims, "'attention.sketch_dims'");
      !st.ok()) {
    error->message = std::string(st.message());
    error->param = "attention.sketch_dims";
    return false;
  }
  if (!mode.empty()) {
    absl::StatusOr<attention::EstimatorKind> m = attention::ParseEstimator(mode);
    if (!m.ok()) {
      error->message = absl::StrCat("'attention.mode': ", m.status().message());
      error->param = "attention.mode";
      return false;
    }
    out->mode = *m;
  }
  out->lsh_k = static_cast<int>(k);
  out->lsh_l = static_cast<int>(l);
  out->budget = budget;
  out->vattention = va;
  return true;
}

Value Meta(const ResponseMeta& meta, std::string_view object) {
  Value v = Value::Object();
  v.Set("id", meta.id);
  v.Set("object", std::string(object));
  v.Set("created", meta.created);
  v.Set("model", meta.model);
  return v;
}

std::string Event(const Value& v) {
  std::string out = "data: ";
  json::AppendSerialized(v, &out);
  out += "\n\n";
  return out;
}

}  // namespace

std::string ErrorBody(const ApiError& error) {
  Value e = Value::Object();
  e.Set("message", error.message);
  e.Set("type", error.type);
  e.Set("param", error.param.empty() ? Value() : Value(error.param));
  e.Set("code", error.code.empty() ? Value() : Value(error.code));
  Value body = Value::Object();
  body.Set("error", std::move(e));
  return json::Serialize(body);
}

ApiError ErrorFromStatus(const absl::Status& status, std::string_view request_id) {
  ApiError e;
  e.message = std::string(status.message());
  const std::string id(request_id);
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      e.status = 400;
      return e;
    case absl::StatusCode::kResourceExhausted:
      if (e.message.find("queue") != std::string::npos) {
        e.status = 429;
        e.type = "rate_limit_error";
        return e;
      }
      e.status = 503;
      e.detail = std::move(e.message);
      e.message = absl::StrCat("no capacity for this request now; retry later (request ", id, ")");
      break;
    case absl::StatusCode::kUnavailable:
      e.status = 503;
      e.detail = std::move(e.message);
      e.message = absl::StrCat("the service is unavailable; retry later (request ", id, ")");
      break;
    default:
      e.status = 500;
      e.detail = std::move(e.message);
      e.message = absl::StrCat("internal error (request ", id, ")");
      break;
  }
  e.type = "server_error";
  return e;
}

std::optional<ApiRequest> ParseRequest(Endpoint endpoint, std::string_view body,
                                       const ApiContext& context, ApiError* error) {
  *error = ApiError{};
  absl::StatusOr<Value> parsed = json::Parse(body);
  if (!parsed.ok()) {
    error->message =
        absl::StrCat("the request body is not valid JSON: ", parsed.status().message());
    return std::nullopt;
  }
  const Value& root = *parsed;
  if (!root.is_object()) {
    error->message = absl::StrCat("the request body must be a JSON object, not ",
                                  std::string(json::TypeName(root.type())));
    return std::nullopt;
  }
  const engine::Engine& engine = *context.engine;
  FieldReader f(root, error);
  ApiRequest r;
  r.endpoint = endpoint;

  std::string model;
  f.String("model", &model);
  if (f.ok() && !model.empty() && model != context.model_name) {
    error->status = 404;
    error->message = absl::StrCat("The model '", model, "' does not exist; this server serves '",
                                  context.model_name, "'");
    error->param = "model";
    error->code = "model_not_found";
    return std::nullopt;
  }

  GenerateRequest base;
  int64_t max_tokens = endpoint == Endpoint::kCompletions ? 16 : -1;  // chat: up to the context
  f.Int("max_tokens", 0, int64_t{1} << 31, &max_tokens);
  if (endpoint == Endpoint::kChat) f.Int("max_completion_tokens", 0, int64_t{1} << 31, &max_tokens);
  double temperature = 1.0, top_p = 1.0;
  f.Number("temperature", 0.0, 2.0, &temperature);
  f.Number("top_p", 0.0, 1.0, &top_p);
  if (f.ok() && top_p <= 0.0) f.Fail("top_p", "'top_p' must be in (0, 1]");
  int64_t top_k = 0, seed = 0, n = 1;
  // At most INT32_MAX: SamplingParams::top_k is an int32 (2^31 wrapped negative).
  f.Int("top_k", -1, std::numeric_limits<int32_t>::max(), &top_k);
  f.Int("seed", INT64_MIN, INT64_MAX, &seed);
  f.Int("n", 1, 1, &n);
  f.Strings("stop", &base.stop);
  f.Bool("stream", &r.stream);
  if (const Value* so = f.Get("stream_options"); so != nullptr && f.ok()) {
    if (!so->is_object()) {
      f.WrongType("stream_options", "an object", *so);
    } else {
      FieldReader g(*so, error);
      g.Bool("include_usage", &r.include_usage);
      if (!g.ok()) error->param = "stream_options." + error->param;
      if (!g.ok()) return std::nullopt;
    }
  }
  // Sampling penalties are accepted for compatibility only at their neutral values.
  double penalty = 0;
  f.Number("presence_penalty", -2.0, 2.0, &penalty);
  if (f.ok() && penalty != 0) f.Fail("presence_penalty", "'presence_penalty' is not supported");
  f.Number("frequency_penalty", -2.0, 2.0, &penalty);
  if (f.ok() && penalty != 0) f.Fail("frequency_penalty", "'frequency_penalty' is not supported");
  if (endpoint == Endpoint::kCompletions) {
    int64_t logprobs = -1;
    if (const Value* lp = f.Get("logprobs"); lp != nullptr && lp->is_bool()) {
      f.Fail("logprobs", "'logprobs' must be an integer (the number of alternatives) here");
    }
    f.Int("logprobs", 0, 20, &logprobs);
    r.logprobs = static_cast<int>(logprobs);
    f.Bool("echo", &r.echo);
  } else {
    bool logprobs = false;
    int64_t top = 0;
    f.Bool("logprobs", &logprobs);
    f.Int("top_logprobs", 0, 20, &top);
    r.logprobs = logprobs ? static_cast<int>(top) : -1;
  }
  if (!f.ok()) return std::nullopt;
  base.sampling.temperature = static_cast<float>(temperature);
  base.sampling.top_p = static_cast<float>(top_p);
  base.sampling.top_k = static_cast<int32_t>(std::max<int64_t>(top_k, 0));
  base.sampling.seed = static_cast<uint64_t>(seed);
  base.top_logprobs = r.logprobs;
  base.prompt_logprobs = r.echo && r.logprobs >= 0;
  if (const Value* a = f.Get("attention"); a != nullptr) {
    if (!context.allow_attention_override) {
      error->message =
          "'attention' (per-request attention mode) is disabled on this server; "
          "start it with --allow-attention-override";
      error->param = "attention";
      return std::nullopt;
    }
    engine::SparseAttentionOptions attention;
    if (!AttentionOverride(*a, engine.attention_options(), &attention, error)) return std::nullopt;
    if (attention::SpecOf(attention.mode).codes == attention::CodeSource::kLearned &&
        engine.spotlight() == nullptr) {
      error->message =
          absl::StrCat("'attention.mode' ", std::string(attention::EstimatorName(attention.mode)),
                       " needs trained hashes: this server was started without "
                       "--spotlight-file");
      error->param = "attention.mode";
      return std::nullopt;
    }
    base.attention = attention;
  }

  std::vector<std::vector<int32_t>> ids;
  if (endpoint == Endpoint::kCompletions) {
    const Value* prompt = root.Find("prompt");
    if (prompt == nullptr || prompt->is_null()) {
      error->message = "'prompt' is required";
      error->param = "prompt";
      return std::nullopt;
    }
    if (!CompletionPrompts(*prompt, engine, &ids, &r.prompt_texts, error)) return std::nullopt;
  } else {
    const Value* messages = root.Find("messages");
    if (messages == nullptr) {
      error->message = "'messages' is required";
      error->param = "messages";
      return std::nullopt;
    }
    std::vector<model::ChatMessage> chat;
    if (!ChatMessages(*messages, &chat, error)) return std::nullopt;
    absl::StatusOr<std::vector<int32_t>> encoded = engine.EncodeChat(chat);
    if (!encoded.ok()) {
      error->message = std::string(encoded.status().message());
      error->param = "messages";
      return std::nullopt;
    }
    ids.push_back(*std::move(encoded));
    r.prompt_texts.emplace_back();
  }
  const int64_t context_length = engine.context_length();
  for (std::vector<int32_t>& p : ids) {
    const int64_t n_prompt = static_cast<int64_t>(p.size());
    GenerateRequest req = base;
    req.max_tokens = max_tokens < 0 ? context_length - n_prompt : max_tokens;
    if (n_prompt + req.max_tokens > context_length || n_prompt >= context_length) {
      error->message = absl::StrCat(
          "This model's maximum context length is ", context_length,
          " tokens. However, you "
          "requested ",
          n_prompt + req.max_tokens, " tokens (", n_prompt, " in the prompt, ", req.max_tokens,
          " for the completion). Please reduce the prompt or max_tokens.");
      error->param = max_tokens < 0 || n_prompt >= context_length ? "messages" : "max_tokens";
      if (endpoint == Endpoint::kCompletions && n_prompt >= context_length) error->param = "prompt";
      error->code = "context_length_exceeded";
      return std::nullopt;
    }
    req.prompt = std::move(p);
    r.prompts.push_back(std::move(req));
  }
  return r;
}

std::string_view ApiFinishReason(FinishReason finish) {
  return finish == FinishReason::kLength ? "length" : "stop";
}

json::Value Usage(int64_t prompt_tokens, int64_t completion_tokens) {
  Value u = Value::Object();
  u.Set("prompt_tokens", prompt_tokens);
  u.Set("completion_tokens", completion_tokens);
  u.Set("total_tokens", prompt_tokens + completion_tokens);
  return u;
}

json::Value CompletionLogprobs(const engine::Engine& engine, const GenerateRequest& prompt,
                               const GenerateResult& result, bool echo) {
  const model::Tokenizer& tok = engine.tokenizer();
  Value tokens = Value::Array(), token_logprobs = Value::Array(), top = Value::Array(),
        offsets = Value::Array();
  int64_t offset = 0;
  auto add = [&](int32_t id, const engine::TokenLogprob* lp) {
    const int32_t one[1] = {id};
    const std::string text = tok.Decode(one);
    tokens.Push(text);
    offsets.Push(offset);
    offset += static_cast<int64_t>(text.size());
    if (lp == nullptr) {
      token_logprobs.Push(Value());
      top.Push(Value());
      return;
    }
    token_logprobs.Push(static_cast<double>(lp->logprob));
    Value alternatives = Value::Object();
    for (const auto& [alt, logprob] : lp->top) {
      const int32_t a[1] = {alt};
      alternatives.Set(tok.Decode(a), static_cast<double>(logprob));
    }
    top.Push(std::move(alternatives));
  };
  if (echo) {
    for (size_t i = 0; i < prompt.prompt.size(); ++i) {
      add(prompt.prompt[i], i == 0 || i - 1 >= result.prompt_logprobs.size()
                                ? nullptr
                                : &result.prompt_logprobs[i - 1]);
    }
  }
  for (size_t i = 0; i < result.tokens.size(); ++i) {
    // A final end-of-generation token has no text in `text`; it is listed as OpenAI does.
    add(result.tokens[i], i < result.logprobs.size() ? &result.logprobs[i] : nullptr);
  }
  Value v = Value::Object();
  v.Set("tokens", std::move(tokens));
  v.Set("token_logprobs", std::move(token_logprobs));
  v.Set("top_logprobs", std::move(top));
  v.Set("text_offset", std::move(offsets));
  return v;
}

json::Value ChatLogprobs(const engine::Engine& engine, const GenerateResult& result) {
  const model::Tokenizer& tok = engine.tokenizer();
  auto entry = [&](int32_t id, float logprob) {
    const int32_t one[1] = {id};
    const std::string text = tok.Decode(one);
    Value e = Value::Object();
    e.Set("token", text);
    e.Set("logprob", static_cast<double>(logprob));
    Value bytes = Value::Array();
    for (unsigned char c : text) bytes.Push(static_cast<int>(c));
    e.Set("bytes", std::move(bytes));
    return e;
  };
  Value content = Value::Array();
  for (const engine::TokenLogprob& lp : result.logprobs) {
    Value e = entry(lp.token, lp.logprob);
    Value top = Value::Array();
    for (const auto& [alt, logprob] : lp.top) top.Push(entry(alt, logprob));
    e.Set("top_logprobs", std::move(top));
    content.Push(std::move(e));
  }
  Value v = Value::Object();
  v.Set("content", std::move(content));
  return v;
}

std::string FinalResponse(const engine::Engine& engine, const ApiRequest& request,
                          const ResponseMeta& meta, const std::vector<GenerateResult>& results) {
  const bool chat = request.endpoint == Endpoint::kChat;
  Value v = Meta(meta, chat ? "chat.completion" : "text_completion");
  Value choices = Value::Array();
  int64_t prompt_tokens = 0, completion_tokens = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    const GenerateResult& r = results[i];
    prompt_tokens += static_cast<int64_t>(request.prompts[i].prompt.size());
    completion_tokens += static_cast<int64_t>(r.tokens.size());
    Value c = Value::Object();
    c.Set("index", static_cast<int64_t>(i));
    if (chat) {
      Value message = Value::Object();
      message.Set("role", "assistant");
      message.Set("content", r.text);
      c.Set("message", std::move(message));
      c.Set("logprobs", request.logprobs >= 0 ? ChatLogprobs(engine, r) : Value());
    } else {
      c.Set("text", request.echo ? request.prompt_texts[i] + r.text : r.text);
      c.Set("logprobs", request.logprobs >= 0
                            ? CompletionLogprobs(engine, request.prompts[i], r, request.echo)
                            : Value());
    }
    c.Set("finish_reason", std::string(ApiFinishReason(r.finish)));
    choices.Push(std::move(c));
  }
  v.Set("choices", std::move(choices));
  v.Set("usage", Usage(prompt_tokens, completion_tokens));
  return json::Serialize(v);
}

std::string StreamDelta(const ApiRequest& request, const ResponseMeta& meta, int index,
                        std::string_view text, bool first, const json::Value* logprobs) {
  const bool chat = request.endpoint == Endpoint::kChat;
  Value v = Meta(meta, chat ? "chat.completion.chunk" : "text_completion");
  Value c = Value::Object();
  c.Set("index", index);
  if (chat) {
    Value delta = Value::Object();
    if (first) delta.Set("role", "assistant");
    delta.Set("content", text);
    c.Set("delta", std::move(delta));
  } else {
    c.Set("text", text);
  }
  c.Set("logprobs", logprobs != nullptr ? *logprobs : Value());
  c.Set("finish_reason", Value());
  Value choices = Value::Array();
  choices.Push(std::move(c));
  v.Set("choices", std::move(choices));
  if (request.include_usage) v.Set("usage", Value());
  return Event(v);
}

std::string StreamFinish(const ApiRequest& request, const ResponseMeta& meta, int index,
                         FinishReason finish) {
  const bool chat = request.endpoint == Endpoint::kChat;
  Value v = Meta(meta, chat ? "chat.completion.chunk" : "text_completion");
  Value c = Value::Object();
  c.Set("index", index);
  if (chat) {
    c.Set("delta", Value::Object());
  } else {
    c.Set("text", "");
  }
  c.Set("logprobs", Value());
  c.Set("finish_reason", std::string(ApiFinishReason(finish)));
  Value choices = Value::Array();
  choices.Push(std::move(c));
  v.Set("choices", std::move(choices));
  if (request.include_usage) v.Set("usage", Value());
  return Event(v);
}

std::string StreamUsage(const ApiRequest& request, const ResponseMeta& meta, int64_t prompt_tokens,
                        int64_t completion_tokens) {
  const bool chat = request.endpoint == Endpoint::kChat;
  Value v = Meta(meta, chat ? "chat.completion.chunk" : "text_completion");
  v.Set("choices", Value::Array());
  v.Set("usage", Usage(prompt_tokens, completion_tokens));
  return Event(v);
}

std::string StreamError(const ApiError& error) {
  return absl::StrCat("data: ", ErrorBody(error), "\n\n");
}

}  // namespace magicpig::server
