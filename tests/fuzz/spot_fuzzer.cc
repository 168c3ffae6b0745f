// libFuzzer target for the spotlight hash loader (common/attention/spotlight_hash.h). Each input
// is parsed twice: as it is (the structure and checksum checks), and with its trailing CRC-32
// recomputed (so mutations reach the value checks and, when the file parses, the forward of every
// MLP on a few rows).
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/attention/spotlight_hash.h"

namespace {

using magicpig::attention::SpotlightHashes;

void Exercise(const std::string& bytes) {
  auto h = SpotlightHashes::Parse(bytes, nullptr);
  if (!h.ok()) return;
  // Small files only reach here (the fuzzer's max_len), so a few rows per MLP are cheap.
  const int64_t d = h->head_dim();
  std::vector<float> x(static_cast<size_t>(3 * d));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) - 3.0f;
  std::vector<uint16_t> codes(static_cast<size_t>(3 * h->words()));
  for (int64_t layer : h->layers()) {
    for (int64_t g = 0; g < h->n_head_kv(); ++g) {
      (void)h->KeyCodes(layer, g, x.data(), 3, codes.data());
    }
    for (int64_t q = 0; q < h->n_head(); ++q) {
      (void)h->QueryCodes(layer, q, x.data(), 3, codes.data());
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  Exercise(bytes);
  if (size >= 4) {
    const uint32_t crc = static_cast<uint32_t>(
        crc32(0, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(size - 4)));
    std::memcpy(bytes.data() + size - 4, &crc, 4);
    Exercise(bytes);
  }
  return 0;
}
