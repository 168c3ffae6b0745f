// Incremental UTF-8 assembly for streaming token output.
//
// A byte-level BPE token may end in the middle of a multi-byte character, so a token's bytes alone
// are not always printable. Utf8StreamDecoder buffers bytes across tokens and releases only
// complete, valid UTF-8: a trailing sequence that may still be completed by later bytes is held
// back; bytes that can never form a valid sequence become U+FFFD (one per byte), so every string
// it returns is valid UTF-8 (safe to put in JSON).
//
//   Utf8StreamDecoder dec;
//   for (int32_t id : generated) send(dec.Push(tok.TokenBytes(id)));
//   send(dec.Flush());
//
// Thread-safety: none; use one decoder per stream.
#ifndef MAGICPIG_GPU_NODE_MODEL_UTF8_STREAM_H_
#define MAGICPIG_GPU_NODE_MODEL_UTF8_STREAM_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace magicpig::model {

class Utf8StreamDecoder {
 public:
  // Adds `bytes` and returns the text that is now complete (possibly empty).
  std::string Push(std::string_view bytes);
  // Ends the stream: returns the held-back bytes as U+FFFD (they can no longer be completed) and
  // resets the decoder.
  std::string Flush();
  // Number of bytes held back.
  size_t pending() const { return pending_.size(); }

 private:
  std::string pending_;
};

}  // namespace magicpig::model

#endif  // MAGICPIG_GPU_NODE_MODEL_UTF8_STREAM_H_
