// UTF-8 decoding (see utf8.h).
#include "common/text/utf8.h"

namespace magicpig::text {

int DecodeUtf8(const unsigned char* p, const unsigned char* end, char32_t* cp, int* bad_length) {
  const int length = Utf8SequenceLength(p, end, bad_length);
  if (length == 0) return 0;
  if (length == 1) {
    *cp = p[0];
    return 1;
  }
  // Utf8SequenceLength checked the ranges, so only the payload bits remain to be gathered.
  char32_t value = p[0] & (0x7F >> length);
  for (int i = 1; i < length; ++i) value = (value << 6) | (p[i] & 0x3F);
  *cp = value;
  return length;
}

int DecodeUtf8(std::string_view s, size_t pos, char32_t* cp, int* bad_length) {
  const auto* data = reinterpret_cast<const unsigned char*>(s.data());
  return DecodeUtf8(data + pos, data + s.size(), cp, bad_length);
}

}  // namespace magicpig::text
