// GPT-2 byte-level alphabet (see byte_unicode.h).
#include "gpu_node/model/byte_unicode.h"

#include <array>

#include "common/text/utf8.h"

namespace magicpig::model {
namespace {

bool IsSelfMapped(uint32_t b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct Tables {
  std::array<char32_t, 256> byte_to_cp{};
  // Every mapped code point is below U+0144 (U+0100 + 68), so a flat table covers them.
  static constexpr size_t kMaxCp = 0x200;
  std::array<int16_t, kMaxCp> cp_to_byte{};

  Tables() {
    cp_to_byte.fill(-1);
    char32_t next = 0x100;
    for (uint32_t b = 0; b < 256; ++b) {
      char32_t cp = IsSelfMapped(b) ? static_cast<char32_t>(b) : next++;
      byte_to_cp[b] = cp;
      cp_to_byte[cp] = static_cast<int16_t>(b);
    }
  }
};

const Tables& GetTables() {
  static const Tables* const tables = new Tables();
  return *tables;
}

}  // namespace

char32_t ByteToCodepoint(uint8_t b) { return GetTables().byte_to_cp[b]; }

std::optional<uint8_t> CodepointToByte(char32_t cp) {
  if (cp >= Tables::kMaxCp) return std::nullopt;
  int16_t b = GetTables().cp_to_byte[cp];
  if (b < 0) return std::nullopt;
  return static_cast<uint8_t>(b);
}

std::string BytesToMapped(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) text::AppendUtf8(ByteToCodepoint(static_cast<uint8_t>(c)), &out);
  return out;
}

std::optional<std::string> MappedToBytes(std::string_view mapped) {
  std::string out;
  out.reserve(mapped.size());
  size_t pos = 0;
  while (pos < mapped.size()) {
    char32_t cp;
    const int len = text::DecodeUtf8(mapped, pos, &cp);
    if (len == 0) return std::nullopt;
    std::optional<uint8_t> b = CodepointToByte(cp);
    if (!b.has_value()) return std::nullopt;
    out.push_back(static_cast<char>(*b));
    pos += len;
  }
  return out;
}

}  // namespace magicpig::model
