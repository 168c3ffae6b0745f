// GPT-2 byte-level BPE tokenizer (see tokenizer.h).
#include "gpu_node/model/tokenizer.h"

#include <algorithm>
#include <array>
#include <queue>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gpu_node/model/byte_unicode.h"

namespace magicpig::model {
namespace {

// This absl build's string functions take absl::string_view, which is not std::string_view here.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Control-token texts that end a turn in the model families we know; llama.cpp applies a similar
// list so that a model trained to emit, say, <|endoftext|> instead of its EOS still stops.
constexpr std::array<std::string_view, 8> kEndMarkers = {
    "<|endoftext|>", "<|im_end|>",    "<|eot_id|>",      "<|eom_id|>",
    "<|end|>",       "<end_of_turn>", "<|end_of_text|>", "<EOT>"};

bool IsSpecialType(TokenType t) { return t == TokenType::kControl || t == TokenType::kUserDefined; }

// Reads an optional integer key; -1 when absent.
absl::StatusOr<int32_t> OptionalId(const GgufFile& gguf, std::string_view key) {
  if (!gguf.HasKey(key)) return -1;
  MAGICPIG_ASSIGN_OR_RETURN(int64_t v, gguf.GetInt(key));
  if (v < -1 || v > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(Sv(key), " = ", v, " is not a token id"));
  }
  return static_cast<int32_t>(v);
}

// One BPE candidate: merging the symbol starting at byte `left` with its right neighbour.
struct Candidate {
  int32_t rank;
  int32_t left;
  int32_t left_id;
  int32_t right_id;
  int32_t merged_id;
  // Lowest rank first, then leftmost.
  bool operator>(const Candidate& o) const {
    return rank != o.rank ? rank > o.rank : left > o.left;
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Create(TokenizerVocab vocab) {
  if (vocab.model != "gpt2") {
    return absl::UnimplementedError(
        absl::StrCat("tokenizer model \"", vocab.model, "\" is not supported (only \"gpt2\")"));
  }
  std::unique_ptr<Tokenizer> tok(new Tokenizer(std::move(vocab)));
  MAGICPIG_RETURN_IF_ERROR(tok->Init());
  return tok;
}

absl::Status Tokenizer::Init() {
  MAGICPIG_ASSIGN_OR_RETURN(pre_tokenizer_, PreTokenizer::Create(vocab_.pre));
  const size_t n = vocab_.tokens.size();
  if (n == 0 || n > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat("vocabulary size ", n, " is not usable"));
  }
  if (vocab_.token_types.empty()) {
    vocab_.token_types.assign(n, static_cast<int32_t>(TokenType::kNormal));
  } else if (vocab_.token_types.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.ggml.token_type has ",
                                                   vocab_.token_types.size(), " entries for ", n,
                                                   " tokens"));
  }
  for (auto [name, id] : {std::pair{"bos", vocab_.bos_id}, std::pair{"eos", vocab_.eos_id},
                          std::pair{"eot", vocab_.eot_id}, std::pair{"pad", vocab_.pad_id}}) {
    if (id < -1 || id >= static_cast<int64_t>(n)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " token id ", id, " is outside the vocabulary of ", n));
    }
  }

  // Token bytes, lookup maps and specials.
  token_bytes_.resize(n);
  specials_by_first_byte_.assign(256, {});
  for (size_t i = 0; i < n; ++i) {
    const std::string& text = vocab_.tokens[i];
    const auto id = static_cast<int32_t>(i);
    text_to_id_.try_emplace(absl::string_view(text), id);
    std::optional<std::string> bytes = MappedToBytes(text);
    if (bytes.has_value()) bytes_to_id_.try_emplace(*bytes, id);  // first id wins on duplicates
    if (IsSpecialType(token_type(id))) {
      token_bytes_[i] = text;
      if (!text.empty()) {
        specials_by_first_byte_[static_cast<uint8_t>(text[0])].push_back({text, id});
      }
    } else {
      // A normal token outside the byte alphabet cannot come out of BPE; decode it literally.
      token_bytes_[i] = bytes.has_value() ? *std::move(bytes) : text;
    }
  }
  for (auto& bucket : specials_by_first_byte_) {
    std::stable_sort(bucket.begin(), bucket.end(), [](const Special& a, const Special& b) {
      return a.text.size() > b.text.size();
    });
  }
  // Real vocabularies may lack some byte tokens (SmolLM2 has none for 21 bytes such as 0x04 and
  // 0xFF); such bytes are dropped when encoding, as HF (without an unknown token) and llama.cpp do.
  for (int b = 0; b < 256; ++b) {
    auto it = bytes_to_id_.find(std::string(1, static_cast<char>(b)));
    byte_ids_[b] = it == bytes_to_id_.end() ? -1 : it->second;
  }

  // Merges: the index is the rank. A merge whose parts or result are not tokens can never apply
  // in an id-based merge loop (HF rejects such vocabularies outright); it is skipped.
  for (size_t rank = 0; rank < vocab_.merges.size(); ++rank) {
    std::string_view merge = vocab_.merges[rank];
    size_t space = merge.find(' ');
    if (space == std::string_view::npos || space == 0 || space + 1 == merge.size() ||
        merge.find(' ', space + 1) != std::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.ggml.merges[", rank, "] = \"",
                                                     Sv(merge), "\" is not \"left right\""));
    }
    std::optional<std::string> left = MappedToBytes(merge.substr(0, space));
    std::optional<std::string> right = MappedToBytes(merge.substr(space + 1));
    if (!left.has_value() || !right.has_value()) continue;
    auto l = bytes_to_id_.find(*left);
    auto r = bytes_to_id_.find(*right);
    auto m = bytes_to_id_.find(*left + *right);
    if (l == bytes_to_id_.end() || r == bytes_to_id_.end() || m == bytes_to_id_.end()) continue;
    merges_.try_emplace(std::pair{l->second, r->second},
                        std::pair{static_cast<int32_t>(rank), m->second});
  }

  for (int32_t id : {vocab_.eos_id, vocab_.eot_id}) {
    if (id >= 0) eog_ids_.insert(id);
  }
  for (std::string_view marker : kEndMarkers) {
    auto it = text_to_id_.find(Sv(marker));
    if (it != text_to_id_.end() && IsSpecialType(token_type(it->second))) {
      eog_ids_.insert(it->second);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& gguf) {
  MAGICPIG_ASSIGN_OR_RETURN(TokenizerVocab vocab, ReadVocab(gguf));
  return Create(std::move(vocab));
}

absl::StatusOr<TokenizerVocab> Tokenizer::ReadVocab(const GgufFile& gguf) {
  TokenizerVocab vocab;
  MAGICPIG_ASSIGN_OR_RETURN(vocab.model, gguf.GetString("tokenizer.ggml.model"));
  if (vocab.model != "gpt2") {
    return absl::UnimplementedError(
        absl::StrCat("tokenizer model \"", vocab.model, "\" is not supported (only \"gpt2\")"));
  }
  if (!gguf.HasKey("tokenizer.ggml.pre")) {
    return absl::InvalidArgumentError(
        "tokenizer.ggml.pre is missing; refusing to guess the pre-tokenizer");
  }
  MAGICPIG_ASSIGN_OR_RETURN(vocab.pre, gguf.GetString("tokenizer.ggml.pre"));
  MAGICPIG_ASSIGN_OR_RETURN(vocab.tokens, gguf.GetStringArray("tokenizer.ggml.tokens"));
  MAGICPIG_ASSIGN_OR_RETURN(vocab.merges, gguf.GetStringArray("tokenizer.ggml.merges"));
  if (gguf.HasKey("tokenizer.ggml.token_type")) {
    MAGICPIG_ASSIGN_OR_RETURN(std::vector<int64_t> types,
                              gguf.GetIntArray("tokenizer.ggml.token_type"));
    vocab.token_types.reserve(types.size());
    for (int64_t t : types) vocab.token_types.push_back(static_cast<int32_t>(t));
  }
  MAGICPIG_ASSIGN_OR_RETURN(vocab.bos_id, OptionalId(gguf, "tokenizer.ggml.bos_token_id"));
  MAGICPIG_ASSIGN_OR_RETURN(vocab.eos_id, OptionalId(gguf, "tokenizer.ggml.eos_token_id"));
  MAGICPIG_ASSIGN_OR_RETURN(vocab.eot_id, OptionalId(gguf, "tokenizer.ggml.eot_token_id"));
  MAGICPIG_ASSIGN_OR_RETURN(vocab.pad_id, OptionalId(gguf, "tokenizer.ggml.padding_token_id"));
  if (gguf.HasKey("tokenizer.ggml.add_bos_token")) {
    MAGICPIG_ASSIGN_OR_RETURN(vocab.add_bos, gguf.GetBool("tokenizer.ggml.add_bos_token"));
  }
  return vocab;
}

TokenType Tokenizer::token_type(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return TokenType::kUnused;
  return static_cast<TokenType>(vocab_.token_types[id]);
}

std::string_view Tokenizer::TokenText(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return vocab_.tokens[id];
}

std::string Tokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return token_bytes_[id];
}

std::optional<int32_t> Tokenizer::FindToken(std::string_view text) const {
  auto it = text_to_id_.find(Sv(text));
  if (it == text_to_id_.end()) return std::nullopt;
  return it->second;
}

void Tokenizer::EncodeWord(std::string_view word, std::vector<int32_t>& out) const {
  if (word.size() == 1) {
    int32_t id = byte_ids_[static_cast<uint8_t>(word[0])];
    if (id >= 0) out.push_back(id);
    return;
  }
  if (pre_tokenizer_->ignore_merges()) {
    auto it = bytes_to_id_.find(Sv(word));
    if (it != bytes_to_id_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // Symbols are indexed by their first byte; merged-away symbols and bytes without a token have
  // id -1 (the latter never merge and are dropped).
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
  };
  const auto n = static_cast<int32_t>(word.size());
  std::vector<Symbol> symbols(n);
  for (int32_t i = 0; i < n; ++i) {
    symbols[i] = {byte_ids_[static_cast<uint8_t>(word[i])], i - 1, i + 1 < n ? i + 1 : -1};
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto consider = [&](int32_t left) {
    if (left < 0) return;
    int32_t right = symbols[left].next;
    if (right < 0) return;
    auto it = merges_.find(std::pair{symbols[left].id, symbols[right].id});
    if (it == merges_.end()) return;
    queue.push({it->second.first, left, symbols[left].id, symbols[right].id, it->second.second});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!queue.empty()) {
    Candidate c = queue.top();
    queue.pop();
    Symbol& left = symbols[c.left];
    // Stale if either side changed since the candidate was queued: a symbol's id only changes by
    // growing, so an unchanged id means an unchanged symbol.
    if (left.id != c.left_id || left.next < 0 || symbols[left.next].id != c.right_id) continue;
    Symbol& right = symbols[left.next];
    left.id = c.merged_id;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = c.left;
    right.id = -1;
    consider(left.prev);
    consider(c.left);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) {
    if (symbols[i].id >= 0) out.push_back(symbols[i].id);
  }
}

void Tokenizer::EncodeOrdinary(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  for (std::string_view word : pre_tokenizer_->Split(text)) EncodeWord(word, out);
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> out;
  if (!parse_special) {
    EncodeOrdinary(text, out);
    return out;
  }
  size_t segment_start = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const Special* match = nullptr;
    for (const Special& s : specials_by_first_byte_[static_cast<uint8_t>(text[pos])]) {
      if (text.substr(pos, s.text.size()) == s.text) {
        match = &s;  // buckets are sorted longest first
        break;
      }
    }
    if (match == nullptr) {
      ++pos;
      continue;
    }
    EncodeOrdinary(text.substr(segment_start, pos - segment_start), out);
    out.push_back(match->id);
    pos += match->text.size();
    segment_start = pos;
  }
  EncodeOrdinary(text.substr(segment_start), out);
  return out;
}

std::string Tokenizer::Decode(absl::Span<const int32_t> ids, bool render_special) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) continue;
    if (!render_special && token_type(id) == TokenType::kControl) continue;
    out += token_bytes_[id];
  }
  return out;
}

}  // namespace magicpig::model
