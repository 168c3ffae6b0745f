// Incremental UTF-8 assembly for streaming token output (see utf8_stream.h).
#include "gpu_node/model/utf8_stream.h"

#include "common/text/utf8.h"

namespace magicpig::model {

std::string Utf8StreamDecoder::Push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  const auto* begin = reinterpret_cast<const unsigned char*>(pending_.data());
  const auto* end = begin + pending_.size();
  const auto* p = begin;
  while (p < end) {
    int bad = 0;
    const int len = text::Utf8SequenceLength(p, end, &bad);
    if (len > 0) {
      out.append(reinterpret_cast<const char*>(p), len);
      p += len;
    } else if (p + bad == end && text::Utf8LeadLength(*p) > bad) {
      break;  // a valid prefix cut short by the end: hold back until more bytes arrive
    } else {
      out.append(text::kReplacementCharacter);  // one U+FFFD per byte that cannot be completed
      ++p;
    }
  }
  pending_.erase(0, p - begin);
  return out;
}

std::string Utf8StreamDecoder::Flush() {
  std::string out;
  for (size_t i = 0; i < pending_.size(); ++i) out.append(text::kReplacementCharacter);
  pending_.clear();
  return out;
}

}  // namespace magicpig::model
