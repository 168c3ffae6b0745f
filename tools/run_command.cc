#include "tools/run_command.h"

#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/cli_args.h"
#include "gpu_node/engine/engine.h"
#include "gpu_node/engine/engine_flags.h"
#include "tbb/task_arena.h"

namespace magicpig::tools {
namespace {

std::string Usage() {
  return absl::StrCat(
      "usage: magicpig run --model FILE.gguf (--prompt TEXT | --prompt-file FILE) [options]\n"
      "  --chat                 wrap the prompt as a user message in the model's chat template\n"
      "  --system TEXT          system message (with --chat)\n"
      "  --max-tokens N         tokens to generate (default 128)\n"
      "  --temperature T        0 = greedy (default 0)\n"
      "  --top-k K  --top-p P   sampling filters (default off)\n"
      "  --seed S               sampling seed (default 0)\n"
      "  --stop TEXT            stop string (repeatable)\n"
      "  --ignore-eos           keep generating past end-of-sequence\n",
      engine::EngineFlagsUsage());
}

std::set<std::string> ValueFlags() {
  std::set<std::string> flags = engine::EngineValueFlags();
  flags.insert({"prompt", "prompt-file", "system", "max-tokens", "temperature", "top-k", "top-p",
                "seed", "stop"});
  return flags;
}

int Fail(const absl::Status& s) {
  std::cerr << "magicpig run: " << s.message() << "\n";
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace

int RunCommand(const std::vector<std::string>& args) {
  auto parsed = CliArgs::Parse(args, ValueFlags(), {"chat", "ignore-eos", "help"});
  if (!parsed.ok()) {
    std::cerr << "magicpig run: " << parsed.status().message() << "\n" << Usage();
    return 2;
  }
  const CliArgs& a = *parsed;
  if (a.Has("help")) {
    std::cout << Usage();
    return 0;
  }
  if (!a.Has("model") || (a.Has("prompt") == a.Has("prompt-file"))) {
    std::cerr << Usage();
    return 2;
  }
  std::string prompt = a.Get("prompt");
  if (a.Has("prompt-file")) {
    std::ifstream in(a.Get("prompt-file"), std::ios::binary);
    if (!in) return Fail(absl::NotFoundError("cannot read --prompt-file " + a.Get("prompt-file")));
    std::stringstream ss;
    ss << in.rdbuf();
    prompt = ss.str();
  }
  auto options = engine::EngineOptionsFromArgs(a);
  if (!options.ok()) return Fail(options.status());
  auto max_tokens = a.GetInt("max-tokens", 128);
  auto temperature = a.GetDouble("temperature", 0.0);
  auto top_k = a.GetInt("top-k", 0);
  auto top_p = a.GetDouble("top-p", 1.0);
  auto seed = a.GetInt("seed", 0);
  for (const absl::Status& s :
       {max_tokens.status(), temperature.status(), top_k.status(), top_p.status(), seed.status()}) {
    if (!s.ok()) return Fail(s);
  }
  engine::SamplingParams sampling;
  sampling.temperature = static_cast<float>(*temperature);
  sampling.top_k = static_cast<int32_t>(*top_k);
  sampling.top_p = static_cast<float>(*top_p);
  sampling.seed = static_cast<uint64_t>(*seed);
  // Reject bad flags before the (slow) model load.
  if (absl::Status s = engine::ValidateSamplingParams(sampling); !s.ok()) return Fail(s);
  if (*max_tokens < 0) return Fail(absl::InvalidArgumentError("--max-tokens must be >= 0"));
  auto engine = engine::Engine::Load(*options);
  if (!engine.ok()) return Fail(engine.status());
  engine::Engine& e = **engine;

  engine::GenerateRequest request;
  if (a.Has("chat")) {
    std::vector<model::ChatMessage> messages;
    if (a.Has("system")) messages.push_back({"system", a.Get("system")});
    messages.push_back({"user", prompt});
    auto ids = e.EncodeChat(messages);
    if (!ids.ok()) return Fail(ids.status());
    request.prompt = *std::move(ids);
  } else {
    request.prompt = e.tokenizer().Encode(prompt, /*parse_special=*/true);
  }
  request.max_tokens = *max_tokens;
  request.sampling = sampling;
  request.stop = a.GetAll("stop");
  request.ignore_eos = a.Has("ignore-eos");

  const bool show_progress = request.prompt.size() >= 512;
  engine::GenerateCallbacks callbacks;
  callbacks.on_text = [](std::string_view piece) { std::cout << piece << std::flush; };
  if (show_progress) {
    callbacks.on_prefill_layer = [n = request.prompt.size()](int64_t layer, int64_t n_layer) {
      std::cerr << absl::StrFormat("\rprefill: %zu tokens, layer %d/%d", n, layer + 1, n_layer)
                << (layer + 1 == n_layer ? "\n" : "") << std::flush;
    };
  }
  auto result = e.Generate(request, callbacks);
  if (!result.ok()) return Fail(result.status());
  std::cout << "\n" << std::flush;
  const engine::GenerateStats& st = result->stats;
  std::string attention(attention::EstimatorName(options->attention.mode));
  if (options->attention.mode == attention::EstimatorKind::kMagicPig) {
    attention += absl::StrFormat("(%d,%d)", options->attention.lsh_k, options->attention.lsh_l);
  }
  if (st.attention_keys_offloaded > 0) {
    attention +=
        absl::StrFormat(" | keys sampled: %.2f%% | shards: %.1f MiB", 100.0 * st.sampled_fraction(),
                        st.attention_shard_bytes / 1048576.0);
  }
  std::cerr << absl::StrFormat(
      "[magicpig] prompt tokens: %d | prefill: %.1f tok/s | decode: %.1f tok/s | generated: %d "
      "(%s) | threads: %d | attention: %s\n",
      st.prompt_tokens, st.prefill_tokens_per_second(), st.decode_tokens_per_second(),
      st.generated_tokens, std::string(engine::FinishReasonName(result->finish)),
      options->num_threads > 0 ? options->num_threads : tbb::this_task_arena::max_concurrency(),
      attention);
  return 0;
}

}  // namespace magicpig::tools
