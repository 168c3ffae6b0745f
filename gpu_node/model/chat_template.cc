// Chat prompt formats (see chat_template.h).
#include "gpu_node/model/chat_template.h"

#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace magicpig::model {
namespace {

// This absl build's string functions take absl::string_view, which is not std::string_view here.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }
std::string_view Std(absl::string_view s) { return std::string_view(s.data(), s.size()); }

constexpr absl::string_view kImStart = "<|im_start|>";
constexpr absl::string_view kImEnd = "<|im_end|>";

// Undoes the escapes of a Jinja (Python-style) string literal that a system prompt may use.
// nullopt if the text is not a plain literal: it holds an unescaped quote or Jinja markup, which
// means the template builds the text from expressions rather than stating it.
std::optional<std::string> UnescapeLiteral(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '\'' || c == '"' || c == '{' || c == '}') return std::nullopt;
    if (c != '\\') {
      out.push_back(c);
      continue;
    }
    if (++i == s.size()) return std::nullopt;
    switch (s[i]) {
      case 'n':
        out.push_back('\n');
        break;
      case 't':
        out.push_back('\t');
        break;
      case '\\':
      case '\'':
      case '"':
        out.push_back(s[i]);
        break;
      default:
        return std::nullopt;
    }
  }
  return out;
}

// Finds a literal default system message: the first "<|im_start|>system" + newline (a real one or
// the two-character escape) followed by plain literal text up to "<|im_end|>".
std::string FindChatMlDefaultSystem(std::string_view jinja) {
  const std::string header = absl::StrCat(kImStart, "system");
  for (size_t pos = jinja.find(header); pos != std::string_view::npos;
       pos = jinja.find(header, pos + 1)) {
    size_t body = pos + header.size();
    if (jinja.substr(body, 1) == "\n") {
      body += 1;
    } else if (jinja.substr(body, 2) == "\\n") {
      body += 2;
    } else {
      continue;
    }
    size_t end = jinja.find(Std(kImEnd), body);
    if (end == std::string_view::npos) break;
    std::optional<std::string> text = UnescapeLiteral(jinja.substr(body, end - body));
    if (text.has_value() && !text->empty()) return *std::move(text);
  }
  return "";
}

bool IsValidRole(std::string_view role) {
  if (role.empty()) return false;
  for (char c : role) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::FromJinja(std::string_view jinja) {
  if (jinja.empty()) return absl::InvalidArgumentError("chat template is empty");
  if (absl::StrContains(Sv(jinja), kImStart)) {
    return ChatMl(FindChatMlDefaultSystem(jinja));
  }
  if (absl::StrContains(Sv(jinja), "<|start_header_id|>")) {
    // Llama 3.1+ templates add a dated system header and tool blocks we do not reproduce.
    if (absl::StrContains(Sv(jinja), "Cutting Knowledge Date")) {
      return absl::UnimplementedError(
          "Llama 3.1+ chat template (with \"Cutting Knowledge Date\" system header) is not "
          "supported; only the Llama 3 format is");
    }
    return Llama3();
  }
  return absl::UnimplementedError(
      absl::StrCat("unrecognised chat template (supported: ChatML, Llama 3): \"",
                   Sv(jinja.substr(0, 120)), jinja.size() > 120 ? "...\"" : "\""));
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromGguf(const GgufFile& gguf) {
  if (!gguf.HasKey("tokenizer.chat_template")) {
    return absl::NotFoundError("the model file has no tokenizer.chat_template");
  }
  MAGICPIG_ASSIGN_OR_RETURN(std::string jinja, gguf.GetString("tokenizer.chat_template"));
  return FromJinja(jinja);
}

ChatTemplate ChatTemplate::ChatMl(std::string default_system) {
  return ChatTemplate(Format::kChatMl, std::move(default_system));
}

ChatTemplate ChatTemplate::Llama3() { return ChatTemplate(Format::kLlama3, ""); }

absl::StatusOr<std::vector<ChatSegment>> ChatTemplate::RenderSegments(
    absl::Span<const ChatMessage> messages, bool add_generation_prompt) const {
  for (const ChatMessage& m : messages) {
    if (!IsValidRole(m.role)) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid chat role \"", m.role, "\" (expected [A-Za-z0-9_-]+)"));
    }
  }
  std::vector<ChatSegment> out;
  auto trusted = [&](std::string text) { out.push_back({std::move(text), true}); };
  auto content = [&](std::string_view text) {
    if (!text.empty()) out.push_back({std::string(text), false});
  };
  switch (format_) {
    case Format::kChatMl:
      // As the templates do: the default is inserted only before a non-system first message.
      if (!messages.empty() && messages[0].role != "system" && !default_system_.empty()) {
        trusted(absl::StrCat(kImStart, "system\n", default_system_, kImEnd, "\n"));
      }
      for (const ChatMessage& m : messages) {
        trusted(absl::StrCat(kImStart, m.role, "\n"));
        content(m.content);
        trusted(absl::StrCat(kImEnd, "\n"));
      }
      if (add_generation_prompt) trusted(absl::StrCat(kImStart, "assistant\n"));
      break;
    case Format::kLlama3:
      trusted("<|begin_of_text|>");
      for (const ChatMessage& m : messages) {
        trusted(absl::StrCat("<|start_header_id|>", m.role, "<|end_header_id|>\n\n"));
        // The template applies Jinja's `trim` to the content.
        content(Std(absl::StripAsciiWhitespace(m.content)));
        trusted("<|eot_id|>");
      }
      if (add_generation_prompt) trusted("<|start_header_id|>assistant<|end_header_id|>\n\n");
      break;
  }
  return out;
}

absl::StatusOr<std::string> ChatTemplate::Render(absl::Span<const ChatMessage> messages,
                                                 bool add_generation_prompt) const {
  MAGICPIG_ASSIGN_OR_RETURN(std::vector<ChatSegment> segments,
                            RenderSegments(messages, add_generation_prompt));
  std::string out;
  for (const ChatSegment& s : segments) out += s.text;
  return out;
}

}  // namespace magicpig::model
