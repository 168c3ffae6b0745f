// magicpig_dump_qk: prefills a text with the real model and writes the post-RoPE keys, values and
// the last queries of chosen layers to a dump file (format in qk_dump.h), for the real-key
// attention accuracy test (real_accuracy_test.cc).
//
//   magicpig_dump_qk --out FILE [--model GGUF] [--text FILE]... [--tokens N] [--queries Q]
//                    [--layers L1,L2,...] [--threads T] [--no-values]
//
// Defaults: --model models/SmolLM2-135M-Instruct.Q4_1.gguf, --text examples/buried_fact.txt
// (repeated at the token level to reach N), --tokens 2048, --queries 16, every layer, all cores.
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "eval/qk_dump.h"

namespace {

int Usage() {
  std::cerr << "usage: magicpig_dump_qk --out FILE [--model GGUF] [--text FILE]... [--tokens N]\n"
               "                        [--queries Q] [--layers L1,L2,...] [--threads T]"
               " [--no-values]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  magicpig::accuracy::QkCaptureOptions options;
  options.model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  std::string out;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (arg == "--no-values") {
      options.capture_values = false;
      continue;
    }
    if ((v = next()) == nullptr) return Usage();
    if (arg == "--out") {
      out = v;
    } else if (arg == "--model") {
      options.model_path = v;
    } else if (arg == "--text") {
      options.text_paths.push_back(v);
    } else if (arg == "--tokens") {
      if (!absl::SimpleAtoi(v, &options.n_tokens)) return Usage();
    } else if (arg == "--queries") {
      if (!absl::SimpleAtoi(v, &options.n_queries)) return Usage();
    } else if (arg == "--threads") {
      if (!absl::SimpleAtoi(v, &options.num_threads)) return Usage();
    } else if (arg == "--layers") {
      for (absl::string_view s : absl::StrSplit(v, ',', absl::SkipEmpty())) {
        int64_t l = 0;
        if (!absl::SimpleAtoi(s, &l)) return Usage();
        options.layers.push_back(l);
      }
    } else {
      return Usage();
    }
  }
  if (out.empty()) return Usage();
  if (options.text_paths.empty()) options.text_paths.push_back("examples/buried_fact.txt");
  auto dump = magicpig::accuracy::CaptureQk(options);
  if (!dump.ok()) {
    std::cerr << "magicpig_dump_qk: " << dump.status() << "\n";
    return 1;
  }
  if (absl::Status s = magicpig::accuracy::WriteQkDump(*dump, out); !s.ok()) {
    std::cerr << "magicpig_dump_qk: " << s << "\n";
    return 1;
  }
  std::cout << "wrote " << out << ": " << dump->n_tokens << " tokens, " << dump->layers.size()
            << " layers, " << dump->n_queries << " queries (the text is " << dump->text_tokens
            << " tokens, repeated as needed)\n";
  return 0;
}
