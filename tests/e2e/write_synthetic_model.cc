// Test driver: writes a small random llama/qwen2 GGUF (tests/testing/synthetic_model.h).
//
//   magicpig_write_synthetic_model OUT.gguf ARCH WEIGHT_TYPE N_LAYER N_EMBD N_HEAD N_HEAD_KV
//                                  [N_FF N_VOCAB CONTEXT]
//
// WEIGHT_TYPE is a ggml type name (F32, F16, Q8_0, Q4_1, ...); the embedding uses the same type.
// Without the optional sizes: N_FF = 2 * N_EMBD, 320 tokens, context 512 (small test models);
// with them, models of real shapes (scripts/device-check writes SmolLM2, Qwen2.5-1.5B and
// Llama-3.1-8B shapes with random weights for the GPU benchmarks).
#include <cstdlib>
#include <iostream>
#include <string>

#include "common/quant/ggml_type.h"
#include "tests/testing/synthetic_model.h"

int main(int argc, char** argv) {
  if (argc != 8 && argc != 11) {
    std::cerr << "usage: magicpig_write_synthetic_model OUT ARCH TYPE N_LAYER N_EMBD N_HEAD "
                 "N_HEAD_KV [N_FF N_VOCAB CONTEXT]\n";
    return 2;
  }
  magicpig::testing::SyntheticModelOptions o;
  o.architecture = argv[2];
  bool found = false;
  for (uint32_t code = 0; code < 64; ++code) {
    auto info = magicpig::LookupGgmlType(code);
    if (info && argv[3] == std::string(info->name)) {
      o.weight_type = o.embd_type = static_cast<magicpig::GgmlType>(code);
      found = true;
    }
  }
  if (!found) {
    std::cerr << "unknown type " << argv[3] << "\n";
    return 2;
  }
  o.n_layer = std::atoi(argv[4]);
  o.n_embd = std::atoi(argv[5]);
  o.n_head = std::atoi(argv[6]);
  o.n_head_kv = std::atoi(argv[7]);
  o.n_ff = argc == 11 ? std::atoll(argv[8]) : 2 * o.n_embd;
  o.n_vocab = argc == 11 ? std::atoll(argv[9]) : 320;
  o.context_length = argc == 11 ? std::atoll(argv[10]) : 512;
  if (o.n_layer <= 0 || o.n_embd <= 0 || o.n_head <= 0 || o.n_head_kv <= 0 || o.n_ff <= 0 ||
      o.n_vocab <= 0 || o.context_length <= 0) {
    std::cerr << "sizes must be positive integers\n";
    return 2;
  }
  auto written = magicpig::testing::WriteSyntheticModel(o, argv[1]);
  if (!written.ok()) {
    std::cerr << written.status() << "\n";
    return 1;
  }
  return 0;
}
