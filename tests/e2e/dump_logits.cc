// Test driver: runs the engine on prompts and writes what an independent reference must reproduce.
//
//   magicpig_dump_logits MODEL PROMPTS_FILE OUT_DIR GREEDY_TOKENS [float|q8]
//
// The last argument picks the activation precision of weight products (default q8, the fast
// path; float = MatMulFloatActivations). MAGICPIG_PREFILL_CHUNK overrides the prefill chunk.
//
// PROMPTS_FILE holds prompts separated by lines "=====". For prompt i it writes OUT_DIR/i.ids
// (prompt token ids, one line), OUT_DIR/i.logits (float32 little-endian, [n_prompt][n_vocab],
// every position), and OUT_DIR/i.greedy (GREEDY_TOKENS greedy continuation ids, one line).
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "gpu_node/engine/engine.h"

namespace {

std::vector<std::string> SplitPrompts(const std::string& text) {
  std::vector<std::string> prompts;
  std::istringstream in(text);
  std::string line, current;
  bool first = true;
  while (std::getline(in, line)) {
    if (line == "=====") {
      prompts.push_back(current);
      current.clear();
      first = true;
      continue;
    }
    if (!first) current += "\n";
    current += line;
    first = false;
  }
  if (!current.empty()) prompts.push_back(current);
  return prompts;
}

template <typename T>
void WriteIds(const std::string& path, const std::vector<T>& ids) {
  std::ofstream out(path);
  for (size_t i = 0; i < ids.size(); ++i) out << (i ? " " : "") << ids[i];
  out << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5 && argc != 6) {
    std::cerr
        << "usage: magicpig_dump_logits MODEL PROMPTS_FILE OUT_DIR GREEDY_TOKENS [float|q8]\n";
    return 2;
  }
  magicpig::engine::EngineOptions options;
  options.model_path = argv[1];
  // The float64 comparison is of exact attention.
  options.attention.mode = magicpig::attention::EstimatorKind::kFull;
  options.float_activations = argc == 6 && std::string(argv[5]) == "float";
  // Small chunks exercise multi-chunk layer-major prefill on short prompts.
  if (const char* chunk = std::getenv("MAGICPIG_PREFILL_CHUNK")) {
    options.prefill_chunk = std::atoi(chunk);
  }
  auto engine = magicpig::engine::Engine::Load(options);
  if (!engine.ok()) {
    std::cerr << engine.status() << "\n";
    return 1;
  }
  std::ifstream in(argv[2]);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string out_dir = argv[3];
  const int greedy = std::stoi(argv[4]);
  const int64_t n_vocab = (*engine)->config().n_vocab;
  std::vector<std::string> prompts = SplitPrompts(ss.str());
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int32_t> ids = (*engine)->tokenizer().Encode(prompts[i], true);
    WriteIds(out_dir + "/" + std::to_string(i) + ".ids", ids);
    auto logits = (*engine)->ScoreAll(ids);
    if (!logits.ok()) {
      std::cerr << logits.status() << "\n";
      return 1;
    }
    std::ofstream lf(out_dir + "/" + std::to_string(i) + ".logits", std::ios::binary);
    lf.write(reinterpret_cast<const char*>(logits->data()),
             static_cast<std::streamsize>(ids.size() * n_vocab * sizeof(float)));
    magicpig::engine::GenerateRequest req;
    req.prompt = ids;
    req.max_tokens = greedy;
    req.ignore_eos = true;
    auto result = (*engine)->Generate(req, {});
    if (!result.ok()) {
      std::cerr << result.status() << "\n";
      return 1;
    }
    WriteIds(out_dir + "/" + std::to_string(i) + ".greedy", result->tokens);
    std::cout << "prompt " << i << ": " << ids.size() << " tokens\n";
  }
  return 0;
}
