#include "tools/run_command.h"

#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "gpu_node/engine/engine.h"
#include "gpu_node/engine/engine_flags.h"
#include "tbb/task_arena.h"

namespace magicpig::tools {
namespace {

int Fail(const absl::Status& s) {
  std::cerr << "magicpig run: " << s.message() << "\n";
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace

std::unique_ptr<flags::FlagTable> RunFlagTable(RunFlags* f) {
  auto table = std::make_unique<flags::FlagTable>(
      "magicpig run",
      "Generate text with the embedded engine: load the model, prefill the prompt (--prompt or "
      "--prompt-file), stream the completion to stdout and a one-line summary to stderr.");
  engine::DeclareModelFlags(*table, &f->engine);
  table->Section("prompt and generation");
  table->Text("prompt", &f->prompt, "TEXT", "the prompt");
  table->Text("prompt-file", &f->prompt_file, "FILE", "read the prompt from FILE");
  table->Switch("chat", &f->chat, "wrap the prompt as a user message in the model's chat template");
  table->Text("system", &f->system, "TEXT", "system message (with --chat)");
  table->Number("max-tokens", &f->max_tokens, "tokens to generate", int64_t{0},
                std::numeric_limits<int64_t>::max());
  table->Number("temperature", &f->sampling.temperature, "0 = greedy", 0.0f, 1e6f);
  table->Number("top-k", &f->sampling.top_k, "keep the K most likely tokens; 0 = off", 0,
                std::numeric_limits<int32_t>::max());
  table->Number("top-p", &f->sampling.top_p, "nucleus sampling mass; 1 = off", 0.0f, 1.0f);
  table->Number("seed", &f->sampling.seed, "sampling seed", uint64_t{0},
                std::numeric_limits<uint64_t>::max());
  table->Repeated("stop", &f->stop, "TEXT", "stop string");
  table->Switch("ignore-eos", &f->ignore_eos, "keep generating past end-of-sequence");
  engine::DeclareAttentionFlags(*table, &f->engine.attention);
  engine::DeclareAttentionNodeFlags(*table, &f->engine);
  return table;
}

int RunCommand(const std::vector<std::string>& args) {
  RunFlags f;
  std::unique_ptr<flags::FlagTable> table = RunFlagTable(&f);
  if (absl::Status s = table->Parse(args); !s.ok()) {
    std::cerr << "magicpig run: " << s.message() << "\n(magicpig run --help lists the flags)\n";
    return 2;
  }
  if (table->help_requested()) {
    std::cout << table->Help();
    return 0;
  }
  if (f.prompt.empty() == f.prompt_file.empty()) {
    return Fail(absl::InvalidArgumentError("give one of --prompt and --prompt-file"));
  }
  std::string prompt = f.prompt;
  if (!f.prompt_file.empty()) {
    std::ifstream in(f.prompt_file, std::ios::binary);
    if (!in) return Fail(absl::NotFoundError("cannot read --prompt-file " + f.prompt_file));
    std::stringstream ss;
    ss << in.rdbuf();
    prompt = ss.str();
  }
  // Reject bad flags before the (slow) model load.
  if (absl::Status s = engine::ValidateSamplingParams(f.sampling); !s.ok()) return Fail(s);
  const engine::EngineOptions* options = &f.engine;
  auto engine = engine::Engine::Load(*options);
  if (!engine.ok()) return Fail(engine.status());
  engine::Engine& e = **engine;

  engine::GenerateRequest request;
  if (f.chat) {
    std::vector<model::ChatMessage> messages;
    if (!f.system.empty()) messages.push_back({"system", f.system});
    messages.push_back({"user", prompt});
    auto ids = e.EncodeChat(messages);
    if (!ids.ok()) return Fail(ids.status());
    request.prompt = *std::move(ids);
  } else {
    request.prompt = e.tokenizer().Encode(prompt, /*parse_special=*/true);
  }
  request.max_tokens = f.max_tokens;
  request.sampling = f.sampling;
  request.stop = f.stop;
  request.ignore_eos = f.ignore_eos;

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
