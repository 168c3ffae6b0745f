// A writer of .spot files for tests (the layout of eval/spotlight/spotfile.py, written field by
// field so tests can make any field invalid), and random files of a given model shape.
//
// Thread-safety: plain data and free functions.
#ifndef MAGICPIG_TESTS_TESTING_SPOT_WRITER_H_
#define MAGICPIG_TESTS_TESTING_SPOT_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "tests/testing/gguf_writer.h"  // AppendU32 (little-endian), shared with the GGUF writer

namespace magicpig::testing {

struct TestMlp {
  float in_scale = 1.0f;
  std::vector<float> w1, b1, w2, b2;  // [d][d], [d], [bits][d], [bits]
};

// A .spot file's fields, written verbatim (so tests can make them invalid).
struct TestFile {
  uint32_t version = 1;
  uint32_t head_dim = 0;
  uint32_t bits = 0;
  uint32_t n_layer_model = 0;
  uint32_t n_head = 0;
  uint32_t n_head_kv = 0;
  std::string model_name;
  std::vector<uint32_t> layers;
  std::vector<TestMlp> mlps;  // [slot][n_head_kv key MLPs, then n_head query MLPs]

  const TestMlp& Key(size_t slot, size_t kv_head) const {
    return mlps[slot * (n_head_kv + n_head) + kv_head];
  }
  const TestMlp& Query(size_t slot, size_t head) const {
    return mlps[slot * (n_head_kv + n_head) + n_head_kv + head];
  }
};

// zlib CRC-32 of bytes.
uint32_t Crc(const std::string& bytes);
// Replaces the trailing checksum with the right one for the bytes before it.
void FixCrc(std::string* bytes);
// The file's bytes, checksum included.
std::string Serialize(const TestFile& f);
// Random weights at scales that give outputs of order 1 and a non-trivial residual layer.
TestFile RandomFile(uint32_t d, uint32_t bits, uint32_t n_layer_model, uint32_t n_head,
                    uint32_t n_head_kv, std::vector<uint32_t> layers, uint64_t seed,
                    std::string name = "Test Model");
// Serialize(f) written to path; false on an I/O error.
bool WriteSpotFile(const TestFile& f, const std::string& path);

}  // namespace magicpig::testing

#endif  // MAGICPIG_TESTS_TESTING_SPOT_WRITER_H_
