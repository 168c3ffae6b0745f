// Test driver: writes a small random llama/qwen2 GGUF (tests/testing/synthetic_model.h).
//
//   magicpig_write_synthetic_model OUT.gguf ARCH WEIGHT_TYPE N_LAYER N_EMBD N_HEAD N_HEAD_KV
//
// WEIGHT_TYPE is a ggml type name (F32, F16, Q8_0, Q4_1, ...); the embedding uses the same type.
#include <cstdlib>
#include <iostream>
#include <string>

#include "common/quant/ggml_type.h"
#include "tests/testing/synthetic_model.h"

int main(int argc, char** argv) {
  if (argc != 8) {
    std::cerr << "usage: magicpig_write_synthetic_model OUT ARCH TYPE N_LAYER N_EMBD N_HEAD "
                 "N_HEAD_KV\n";
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
  o.n_ff = 2 * o.n_embd;
  o.n_vocab = 320;
  o.context_length = 512;
  auto written = magicpig::testing::WriteSyntheticModel(o, argv[1]);
  if (!written.ok()) {
    std::cerr << written.status() << "\n";
    return 1;
  }
  return 0;
}
