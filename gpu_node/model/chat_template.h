// Chat prompt formats, implemented natively (there is no C++ Jinja engine) and selected from the
// model's `tokenizer.chat_template`:
//
//   ChatML  (template contains "<|im_start|>"; SmolLM2, Qwen2.5):
//     [<|im_start|>system\n{default}<|im_end|>\n]  when the first message is not "system" and the
//                                                   template carries a default system message
//     <|im_start|>{role}\n{content}<|im_end|>\n    per message
//     <|im_start|>assistant\n                      with add_generation_prompt
//   The default system message is read from the template itself (the literal text it emits after
//   "<|im_start|>system\n"), e.g. SmolLM2's "You are a helpful AI assistant named SmolLM, trained
//   by Hugging Face" and Qwen2.5's "You are Qwen, created by Alibaba Cloud. You are a helpful
//   assistant."; none if the template has no such literal.
//
//   Llama 3  (template contains "<|start_header_id|>" and no Llama 3.1+ date header):
//     <|begin_of_text|> then <|start_header_id|>{role}<|end_header_id|>\n\n{trimmed
//     content}<|eot_id|> per message, and <|start_header_id|>assistant<|end_header_id|>\n\n for
//     generation.
//
// Anything else is UNIMPLEMENTED rather than guessed. Tool calls and multimodal content are not
// supported.
//
// Rendered prompts contain special-token text and must be encoded with parse_special; to keep
// message content from injecting special tokens, tokenize RenderSegments() instead: only the
// template's own text (trusted) is parsed for specials.
#ifndef MAGICPIG_GPU_NODE_MODEL_CHAT_TEMPLATE_H_
#define MAGICPIG_GPU_NODE_MODEL_CHAT_TEMPLATE_H_

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "gpu_node/model/gguf_file.h"

namespace magicpig::model {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", "tool", ...
  std::string content;
};

// A piece of a rendered prompt. `trusted` pieces come from the template (encode with
// parse_special = true); the others are message content (encode with parse_special = false).
struct ChatSegment {
  std::string text;
  bool trusted = false;
};

class ChatTemplate {
 public:
  enum class Format { kChatMl, kLlama3 };

  // Chooses the format from a Jinja template string. UNIMPLEMENTED (quoting the start of the
  // template) if it is not recognised; INVALID_ARGUMENT if empty.
  static absl::StatusOr<ChatTemplate> FromJinja(std::string_view jinja);
  // FromJinja(tokenizer.chat_template); NOT_FOUND if the file has no template.
  static absl::StatusOr<ChatTemplate> FromGguf(const GgufFile& gguf);
  // Plain ChatML with the given default system message ("" for none).
  static ChatTemplate ChatMl(std::string default_system);
  static ChatTemplate Llama3();

  Format format() const { return format_; }
  const std::string& default_system() const { return default_system_; }

  // INVALID_ARGUMENT if a role is empty or not [A-Za-z0-9_-]+ (a role is template text, so it
  // must not smuggle markup).
  absl::StatusOr<std::vector<ChatSegment>> RenderSegments(absl::Span<const ChatMessage> messages,
                                                          bool add_generation_prompt) const;
  // The segments concatenated: the exact prompt text the model's template would produce.
  absl::StatusOr<std::string> Render(absl::Span<const ChatMessage> messages,
                                     bool add_generation_prompt) const;

 private:
  ChatTemplate(Format format, std::string default_system)
      : format_(format), default_system_(std::move(default_system)) {}

  Format format_;
  std::string default_system_;
};

}  // namespace magicpig::model

#endif  // MAGICPIG_GPU_NODE_MODEL_CHAT_TEMPLATE_H_
