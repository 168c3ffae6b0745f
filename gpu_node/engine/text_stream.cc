#include "gpu_node/engine/text_stream.h"

#include <algorithm>

namespace magicpig::engine {

size_t CompleteUtf8PrefixLength(std::string_view s) {
  // Look back at most 3 bytes for the lead byte of a final multi-byte sequence.
  const size_t n = s.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    const unsigned char c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = 1;
    if ((c & 0xE0) == 0xC0)
      need = 2;
    else if ((c & 0xF0) == 0xE0)
      need = 3;
    else if ((c & 0xF8) == 0xF0)
      need = 4;
    return back < need ? n - back : n;
  }
  return n;
}

TextStream::TextStream(std::vector<std::string> stop_strings) : stops_(std::move(stop_strings)) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
}

std::string TextStream::Append(std::string_view bytes) {
  if (stopped_) return "";
  const size_t search_from = text_.size();
  text_.append(bytes);
  // A stop string may straddle old and new bytes: search from where it could start.
  size_t cut = std::string::npos;
  for (const std::string& stop : stops_) {
    const size_t from = search_from >= stop.size() ? search_from - stop.size() + 1 : 0;
    const size_t at = text_.find(stop, from);
    if (at != std::string::npos) cut = std::min(cut, at);
  }
  if (cut != std::string::npos) {
    stopped_ = true;
    text_.resize(cut);
    std::string out = text_.size() > released_ ? text_.substr(released_) : "";
    released_ = text_.size();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& stop : stops_) {
    for (size_t len = std::min(stop.size() - 1, text_.size()); len > hold; --len) {
      if (text_.compare(text_.size() - len, len, stop, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  size_t safe = CompleteUtf8PrefixLength(std::string_view(text_).substr(0, text_.size() - hold));
  if (safe <= released_) return "";
  std::string out = text_.substr(released_, safe - released_);
  released_ = safe;
  return out;
}

std::string TextStream::Flush() {
  std::string out = text_.substr(released_);
  released_ = text_.size();
  return out;
}

}  // namespace magicpig::engine
