// Test-only tool for tests/spotlight/numpy_reference_test.py: runs every MLP of a .spot file on
// the same rows and writes the codes and outputs, so the C++ forward can be compared with
// eval/spotlight/spotfile.py's float64 reference.
//
//   spotlight_codes_tool FILE.spot X.f32 N LEVEL CODES.u16 Z.f32
//
// X.f32: N x head_dim float32 (row-major, native little-endian). LEVEL: scalar, avx2 or avx512
// (clamped to the CPU's; the level used is printed). For each layer of the file in order, each kv
// head's key MLP then each query head's query MLP, appends codes [N][bits / 16] uint16 to
// CODES.u16 and outputs z [N][bits] float32 to Z.f32. Exit 1 with a message on any error.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/attention/spotlight_hash.h"
#include "common/cpu_features.h"

namespace magicpig::attention {
namespace {

int Fail(const std::string& message) {
  std::cerr << "spotlight_codes_tool: " << message << "\n";
  return 1;
}

int Run(int argc, char** argv) {
  if (argc != 7) {
    return Fail("usage: spotlight_codes_tool FILE.spot X.f32 N LEVEL CODES.u16 Z.f32");
  }
  auto h = SpotlightHashes::Load(argv[1], nullptr);
  if (!h.ok()) return Fail(std::string(h.status().ToString()));
  const int64_t n = std::strtoll(argv[3], nullptr, 10);
  const std::string level_name = argv[4];
  SimdLevel level;
  if (level_name == "scalar") {
    level = SimdLevel::kScalar;
  } else if (level_name == "avx2") {
    level = SimdLevel::kAvx2;
  } else if (level_name == "avx512") {
    level = SimdLevel::kAvx512;
  } else {
    return Fail("LEVEL must be scalar, avx2 or avx512, got " + level_name);
  }
  level = ClampToDetected(level);
  std::cout << "level " << SimdLevelName(level) << "\n";

  std::vector<float> x(static_cast<size_t>(n * h->head_dim()));
  std::ifstream in(argv[2], std::ios::binary);
  if (!in.read(reinterpret_cast<char*>(x.data()), static_cast<std::streamsize>(x.size() * 4)) ||
      in.peek() != std::char_traits<char>::eof()) {
    return Fail(std::string(argv[2]) + " is not " + std::to_string(n) + " x " +
                std::to_string(h->head_dim()) + " float32");
  }
  std::ofstream codes_out(argv[5], std::ios::binary);
  std::ofstream z_out(argv[6], std::ios::binary);
  std::vector<uint16_t> codes(static_cast<size_t>(n * h->words()));
  std::vector<float> z(static_cast<size_t>(n * h->bits()));
  for (int64_t layer : h->layers()) {
    for (int64_t k = 0; k < h->n_head_kv() + h->n_head(); ++k) {
      const bool is_query = k >= h->n_head_kv();
      const int64_t head = is_query ? k - h->n_head_kv() : k;
      absl::Status s = is_query ? h->QueryCodes(layer, head, x.data(), n, codes.data(), level)
                                : h->KeyCodes(layer, head, x.data(), n, codes.data(), level);
      if (s.ok()) {
        s = is_query ? h->QueryOutputs(layer, head, x.data(), n, z.data(), level)
                     : h->KeyOutputs(layer, head, x.data(), n, z.data(), level);
      }
      if (!s.ok()) return Fail(s.ToString());
      codes_out.write(reinterpret_cast<const char*>(codes.data()),
                      static_cast<std::streamsize>(codes.size() * sizeof(uint16_t)));
      z_out.write(reinterpret_cast<const char*>(z.data()),
                  static_cast<std::streamsize>(z.size() * sizeof(float)));
    }
  }
  if (!codes_out || !z_out) return Fail("cannot write the outputs");
  return 0;
}

}  // namespace
}  // namespace magicpig::attention

int main(int argc, char** argv) { return magicpig::attention::Run(argc, argv); }
