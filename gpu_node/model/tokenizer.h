// GPT-2 byte-level BPE tokenizer (tokenizer.ggml.model = "gpt2") with the pre-tokenizers of
// pretokenizer.h, built from GGUF metadata or from an in-memory vocabulary.
//
// Encode: (1) with parse_special, control/user-defined tokens (types 3 and 4) are matched
// literally, longest first, and the text is split around them; (2) each remaining span is split
// by the pre-tokenizer; (3) each word's bytes are merged by BPE, lowest merge rank first and the
// leftmost pair on ties. Output ids equal Hugging Face `tokenizers` with the same vocabulary,
// merges, pre-tokenizer and the specials registered as added tokens.
//
// Invalid UTF-8 input is accepted: ill-formed bytes become words of their own (pretokenizer.h), so
// Decode(Encode(x)) == x for every byte string x, except that bytes the vocabulary has no token
// for are dropped (as HF without an unknown token, and llama.cpp, do; SmolLM2 lacks 21 of the 256,
// e.g. 0x04 and 0xFF) and control tokens decode to nothing unless rendered.
//
//   MAGICPIG_ASSIGN_OR_RETURN(auto tok, Tokenizer::FromGguf(*gguf));
//   std::vector<int32_t> ids = tok->Encode(prompt, /*parse_special=*/true);
//
// Thread-safety: immutable after creation; all const methods may be called concurrently.
#ifndef MAGICPIG_GPU_NODE_MODEL_TOKENIZER_H_
#define MAGICPIG_GPU_NODE_MODEL_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "gpu_node/model/gguf_file.h"
#include "gpu_node/model/pretokenizer.h"

namespace magicpig::model {

// Values of tokenizer.ggml.token_type.
enum class TokenType : int32_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// The tokenizer.ggml.* metadata, as plain data.
struct TokenizerVocab {
  std::string model;                 // tokenizer.ggml.model; only "gpt2" is supported
  std::string pre;                   // tokenizer.ggml.pre
  std::vector<std::string> tokens;   // mapped alphabet (byte_unicode.h); the index is the id
  std::vector<int32_t> token_types;  // empty = all normal; otherwise one per token
  std::vector<std::string> merges;   // "left right"; the index is the rank
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  int32_t eot_id = -1;
  int32_t pad_id = -1;
  bool add_bos = false;
};

class Tokenizer {
 public:
  // UNIMPLEMENTED for a model other than "gpt2"; INVALID_ARGUMENT for an unknown pre-tokenizer,
  // an empty vocabulary, mismatched token_types, a special id out of range or a malformed merge.
  // Merges whose parts or result are not tokens are ignored (they can never apply).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Create(TokenizerVocab vocab);
  // ReadVocab + Create. The file may be closed afterwards.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& gguf);
  // Reads the tokenizer.ggml.* keys (tokens, merges and model required; pre must be present).
  static absl::StatusOr<TokenizerVocab> ReadVocab(const GgufFile& gguf);

  // Token ids of `text`. Never adds BOS (callers check add_bos()). With parse_special, the text of
  // control and user-defined tokens becomes those tokens; without it, that text is ordinary text
  // (use this for untrusted user content).
  std::vector<int32_t> Encode(std::string_view text, bool parse_special) const;

  // The bytes of `ids` concatenated; not necessarily valid UTF-8 (see Utf8StreamDecoder). Control
  // tokens render as nothing unless render_special; out-of-range ids render as nothing.
  std::string Decode(absl::Span<const int32_t> ids, bool render_special = false) const;

  // The raw bytes of one token: unmapped for normal tokens, the literal text for control and
  // user-defined ones. Empty for an out-of-range id.
  std::string TokenBytes(int32_t id) const;
  // The token as stored in the vocabulary (mapped alphabet). Empty for an out-of-range id.
  std::string_view TokenText(int32_t id) const;
  TokenType token_type(int32_t id) const;

  int32_t vocab_size() const { return static_cast<int32_t>(vocab_.tokens.size()); }
  int32_t bos_id() const { return vocab_.bos_id; }
  int32_t eos_id() const { return vocab_.eos_id; }
  int32_t eot_id() const { return vocab_.eot_id; }
  int32_t pad_id() const { return vocab_.pad_id; }
  bool add_bos() const { return vocab_.add_bos; }
  const std::string& pre() const { return vocab_.pre; }

  // True for ids that end a generation: eos, eot, and control tokens whose text is a well-known
  // end marker (<|endoftext|>, <|im_end|>, <|eot_id|>, <|end_of_text|>, <end_of_turn>, ...).
  bool IsEndOfGeneration(int32_t id) const { return eog_ids_.contains(id); }

  // The id whose vocabulary text is exactly `text` (mapped alphabet for normal tokens, literal for
  // specials, e.g. "<|im_end|>" or "Ġworld").
  std::optional<int32_t> FindToken(std::string_view text) const;

 private:
  struct Special {
    std::string text;
    int32_t id;
  };

  explicit Tokenizer(TokenizerVocab vocab) : vocab_(std::move(vocab)) {}
  absl::Status Init();
  void EncodeWord(std::string_view word, std::vector<int32_t>& out) const;
  void EncodeOrdinary(std::string_view text, std::vector<int32_t>& out) const;

  TokenizerVocab vocab_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::vector<std::string> token_bytes_;                        // by id
  absl::flat_hash_map<std::string, int32_t> bytes_to_id_;       // BPE symbols (raw bytes) -> id
  absl::flat_hash_map<absl::string_view, int32_t> text_to_id_;  // vocabulary text -> id
  int32_t byte_ids_[256] = {};  // -1 where the vocabulary has no token for the byte
  // (left id, right id) -> (rank, merged id).
  absl::flat_hash_map<std::pair<int32_t, int32_t>, std::pair<int32_t, int32_t>> merges_;
  // Specials grouped by first byte, longest first, for literal matching.
  std::vector<std::vector<Special>> specials_by_first_byte_;
  absl::flat_hash_set<int32_t> eog_ids_;
};

}  // namespace magicpig::model

#endif  // MAGICPIG_GPU_NODE_MODEL_TOKENIZER_H_
