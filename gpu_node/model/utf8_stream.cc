// Incremental UTF-8 assembly for streaming token output (see utf8_stream.h).
#include "gpu_node/model/utf8_stream.h"

#include <cstdint>

#include "gpu_node/model/byte_unicode.h"

namespace magicpig::model {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// True if s[pos..] is a proper prefix of some valid UTF-8 sequence, i.e. more bytes could still
// complete it. The second byte has a narrower range after E0, ED, F0 and F4 (overlongs, surrogates,
// values above U+10FFFF).
bool IsIncompletePrefix(std::string_view s, size_t pos) {
  const auto lead = static_cast<uint8_t>(s[pos]);
  const int need = Utf8SequenceLength(lead);
  const size_t have = s.size() - pos;
  if (need <= 1 || have >= static_cast<size_t>(need)) return false;
  for (size_t i = 1; i < have; ++i) {
    const auto c = static_cast<uint8_t>(s[pos + i]);
    uint8_t lo = 0x80;
    uint8_t hi = 0xBF;
    if (i == 1) {
      if (lead == 0xE0) lo = 0xA0;
      if (lead == 0xED) hi = 0x9F;
      if (lead == 0xF0) lo = 0x90;
      if (lead == 0xF4) hi = 0x8F;
    }
    if (c < lo || c > hi) return false;
  }
  return true;
}

}  // namespace

std::string Utf8StreamDecoder::Push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  size_t pos = 0;
  while (pos < pending_.size()) {
    char32_t cp;
    int len = DecodeUtf8(pending_, pos, &cp);
    if (len > 0) {
      out.append(pending_, pos, len);
      pos += len;
    } else if (IsIncompletePrefix(pending_, pos)) {
      break;  // hold back until more bytes arrive
    } else {
      out.append(kReplacement);
      ++pos;
    }
  }
  pending_.erase(0, pos);
  return out;
}

std::string Utf8StreamDecoder::Flush() {
  std::string out;
  for (size_t i = 0; i < pending_.size(); ++i) out.append(kReplacement);
  pending_.clear();
  return out;
}

}  // namespace magicpig::model
