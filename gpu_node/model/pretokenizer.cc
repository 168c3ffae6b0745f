// Pre-tokenizers for byte-level BPE (see pretokenizer.h).
#include "gpu_node/model/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace magicpig::model {
namespace {

// This absl build's StrCat takes absl::string_view, which is not std::string_view here.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Pattern strings, written with explicit alternatives so each one reads as its documented rule.
// The first alternative that matches at a position wins (PCRE2 alternation is ordered, like the
// Oniguruma engine HF uses).
constexpr std::string_view kSingleDigit = R"(\p{N})";
constexpr std::string_view kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2 = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N})"
                                    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct Spec {
  std::vector<std::string_view> patterns;
  bool ignore_merges = false;
};

// nullopt-like: returns false if the name is unknown.
bool LookupSpec(std::string_view name, Spec* spec) {
  // llama.cpp gives all of these one regex list (LLAMA_VOCAB_PRE_TYPE_STARCODER and friends).
  static constexpr std::array<std::string_view, 7> kSmollmFamily = {
      "smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"};
  for (std::string_view n : kSmollmFamily) {
    if (name == n) {
      *spec = Spec{{kSingleDigit, kGpt2}, false};
      return true;
    }
  }
  if (name == "llama-bpe" || name == "llama3") {
    *spec = Spec{{kLlama3}, true};
    return true;
  }
  if (name == "qwen2") {
    *spec = Spec{{kQwen2}, false};
    return true;
  }
  return false;
}

}  // namespace

struct PreTokenizer::Pattern {
  pcre2_code* code = nullptr;
  ~Pattern() { pcre2_code_free(code); }

  // Appends the pieces of `text` to `out`: every match, and every maximal run of bytes between
  // matches.
  void Split(std::string_view text, std::vector<std::string_view>& out) const {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    const size_t n = text.size();
    size_t pos = 0;
    size_t piece_start = 0;
    while (pos < n) {
      int rc = pcre2_match(code, subject, n, pos, 0, md, nullptr);
      if (rc < 0) break;  // PCRE2_ERROR_NOMATCH (or a resource limit): the rest is one piece
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      size_t begin = ov[0];
      size_t end = ov[1];
      if (end <= begin) {
        // None of our patterns can match empty; step over to stay safe if one ever did.
        pos = begin + 1;
        continue;
      }
      if (begin > piece_start) out.push_back(text.substr(piece_start, begin - piece_start));
      out.push_back(text.substr(begin, end - begin));
      pos = piece_start = end;
    }
    if (piece_start < n) out.push_back(text.substr(piece_start));
    pcre2_match_data_free(md);
  }
};

PreTokenizer::~PreTokenizer() = default;

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::Create(std::string_view name) {
  Spec spec;
  if (!LookupSpec(name, &spec)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown pre-tokenizer \"", Sv(name),
        "\" (tokenizer.ggml.pre); supported: smollm, starcoder, refact, command-r, codeshell, "
        "exaone, minerva, llama-bpe, qwen2"));
  }
  std::unique_ptr<PreTokenizer> pt(new PreTokenizer());
  pt->name_ = std::string(name);
  pt->ignore_merges_ = spec.ignore_merges;
  for (std::string_view pattern : spec.patterns) {
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    // UCP makes \s, \d and \p{..} Unicode-aware; MATCH_INVALID_UTF lets ill-formed input through
    // without a validity pre-check (invalid sequences simply never match).
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error_code,
                                     &error_offset, nullptr);
    if (code == nullptr) {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(error_code, message.data(), message.size());
      return absl::InternalError(absl::StrCat("pre-tokenizer ", Sv(name),
                                              ": PCRE2 compile error at ", error_offset, ": ",
                                              reinterpret_cast<const char*>(message.data())));
    }
    // JIT is an optimisation only; the interpreter is used if it is unavailable.
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    auto p = std::make_unique<Pattern>();
    p->code = code;
    pt->patterns_.push_back(std::move(p));
  }
  return pt;
}

std::vector<std::string_view> PreTokenizer::Split(std::string_view text) const {
  std::vector<std::string_view> pieces;
  if (text.empty()) return pieces;
  pieces.push_back(text);
  std::vector<std::string_view> next;
  for (const auto& pattern : patterns_) {
    next.clear();
    for (std::string_view piece : pieces) pattern->Split(piece, next);
    pieces.swap(next);
  }
  return pieces;
}

}  // namespace magicpig::model
