// Incremental release of generated text: holds back bytes that may still turn into a stop string
// or that end in an incomplete UTF-8 sequence, so a streaming client never sees text that is later
// taken back or a broken character.
//
// Thread-safety: one per sequence.
#ifndef MAGICPIG_GPU_NODE_ENGINE_TEXT_STREAM_H_
#define MAGICPIG_GPU_NODE_ENGINE_TEXT_STREAM_H_

#include <string>
#include <string_view>
#include <vector>

namespace magicpig::engine {

// Length of the longest prefix of `s` that does not end inside a UTF-8 sequence (a truncated
// multi-byte character at the end is excluded; invalid bytes elsewhere are passed through).
size_t CompleteUtf8PrefixLength(std::string_view s);

class TextStream {
 public:
  explicit TextStream(std::vector<std::string> stop_strings);

  // Appends token bytes. Returns the newly releasable text (possibly empty).
  std::string Append(std::string_view bytes);
  // True once a stop string has appeared; the text is cut before it.
  bool stopped() const { return stopped_; }
  // Releases whatever is held back (at the end of generation, when no stop string matched).
  std::string Flush();
  // All text released or releasable so far (excluding any stop string).
  const std::string& text() const { return text_; }

 private:
  std::vector<std::string> stops_;
  std::string text_;
  size_t released_ = 0;
  bool stopped_ = false;
};

}  // namespace magicpig::engine

#endif  // MAGICPIG_GPU_NODE_ENGINE_TEXT_STREAM_H_
