// GPT-2 byte-level alphabet and UTF-8 helpers (see byte_unicode.h).
#include "gpu_node/model/byte_unicode.h"

#include <array>

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

void AppendUtf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string BytesToMapped(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) AppendUtf8(ByteToCodepoint(static_cast<uint8_t>(c)), out);
  return out;
}

std::optional<std::string> MappedToBytes(std::string_view mapped) {
  std::string out;
  out.reserve(mapped.size());
  size_t pos = 0;
  while (pos < mapped.size()) {
    char32_t cp;
    int len = DecodeUtf8(mapped, pos, &cp);
    if (len == 0) return std::nullopt;
    std::optional<uint8_t> b = CodepointToByte(cp);
    if (!b.has_value()) return std::nullopt;
    out.push_back(static_cast<char>(*b));
    pos += len;
  }
  return out;
}

int Utf8SequenceLength(uint8_t b) {
  if (b < 0x80) return 1;
  if (b < 0xC2) return 0;
  if (b < 0xE0) return 2;
  if (b < 0xF0) return 3;
  if (b < 0xF5) return 4;
  return 0;
}

int DecodeUtf8(std::string_view s, size_t pos, char32_t* cp) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  uint8_t lead = byte(pos);
  int len = Utf8SequenceLength(lead);
  if (len == 0 || pos + len > s.size()) return 0;
  if (len == 1) {
    *cp = lead;
    return 1;
  }
  char32_t value = lead & (0x7F >> len);
  for (int i = 1; i < len; ++i) {
    uint8_t c = byte(pos + i);
    if ((c & 0xC0) != 0x80) return 0;
    value = (value << 6) | (c & 0x3F);
  }
  // Reject overlong forms, UTF-16 surrogates and values above U+10FFFF.
  static constexpr char32_t kMinForLength[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (value < kMinForLength[len] || (value >= 0xD800 && value <= 0xDFFF) || value > 0x10FFFF) {
    return 0;
  }
  *cp = value;
  return len;
}

}  // namespace magicpig::model
