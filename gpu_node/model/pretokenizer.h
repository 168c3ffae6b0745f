// Pre-tokenizers for byte-level BPE: split text into "words" that BPE never merges across.
//
// Chosen by the GGUF key `tokenizer.ggml.pre` and table-driven: each name maps to a list of PCRE2
// patterns applied in sequence (each pattern splits the pieces the previous one produced; text a
// pattern does not match stays a piece of its own, as with Hugging Face's "isolated" split).
//
//   smollm (+ starcoder, refact, command-r, codeshell, exaone, minerva): single \p{N} digits, then
//       the GPT-2 pattern; equals HF Sequence[Digits(individual), ByteLevel(use_regex)].
//   llama-bpe: the Llama 3 pattern, digits in groups of up to three.
//   qwen2:     the Llama 3 pattern with single digits.
//
// Invalid UTF-8: patterns are matched with PCRE2_MATCH_INVALID_UTF, so an ill-formed byte sequence
// is never part of a match; each maximal run of such bytes becomes a piece of its own (and is then
// BPE-encoded byte by byte like any other word). Every input byte lands in exactly one piece, in
// order, so encode/decode round-trips arbitrary bytes.
//
// Thread-safety: immutable after Create; Split may be called concurrently (match data is per call).
#ifndef MAGICPIG_GPU_NODE_MODEL_PRETOKENIZER_H_
#define MAGICPIG_GPU_NODE_MODEL_PRETOKENIZER_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace magicpig::model {

class PreTokenizer {
 public:
  // INVALID_ARGUMENT naming `name` if it is not a known pre-tokenizer.
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> Create(std::string_view name);

  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  const std::string& name() const { return name_; }
  // Llama 3 (llama-bpe) vocabularies emit a whole word directly when it is a token, without
  // running the merges (HF's `ignore_merges`).
  bool ignore_merges() const { return ignore_merges_; }

  // Splits `text` into consecutive, non-empty pieces whose concatenation is `text`. The views
  // point into `text`.
  std::vector<std::string_view> Split(std::string_view text) const;

 private:
  struct Pattern;
  PreTokenizer() = default;

  std::string name_;
  bool ignore_merges_ = false;
  std::vector<std::unique_ptr<Pattern>> patterns_;
};

}  // namespace magicpig::model

#endif  // MAGICPIG_GPU_NODE_MODEL_PRETOKENIZER_H_
