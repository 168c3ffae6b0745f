#include "eval/prompt.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace magicpig::eval {

absl::StatusOr<RenderedPrompt> PromptRenderer::Render(const std::string& input,
                                                      int64_t question_offset,
                                                      const std::string& answer_prefix) const {
  const model::ChatMessage message{"user", input};
  MAGICPIG_ASSIGN_OR_RETURN(std::vector<model::ChatSegment> segments,
                            engine_->chat_template().RenderSegments({&message, 1}, true));
  const model::Tokenizer& tok = engine_->tokenizer();
  RenderedPrompt p;
  bool found = false;
  auto append = [&](const std::vector<int32_t>& ids) {
    p.tokens.insert(p.tokens.end(), ids.begin(), ids.end());
  };
  for (const model::ChatSegment& seg : segments) {
    if (!found && !seg.trusted && seg.text == input) {
      found = true;
      const size_t q = static_cast<size_t>(question_offset);
      append(tok.Encode(std::string_view(input).substr(0, q), false));
      p.split = static_cast<int64_t>(p.tokens.size());
      append(tok.Encode(std::string_view(input).substr(q), false));
    } else {
      append(tok.Encode(seg.text, seg.trusted));
    }
  }
  if (!found) {
    return absl::InternalError("the chat template does not render the user message verbatim");
  }
  append(tok.Encode(answer_prefix, false));
  return p;
}

int64_t PromptRenderer::Count(const std::string& input, int64_t question_offset,
                              const std::string& answer_prefix) const {
  absl::StatusOr<RenderedPrompt> p = Render(input, question_offset, answer_prefix);
  return p.ok() ? static_cast<int64_t>(p->tokens.size()) : std::numeric_limits<int64_t>::max() / 4;
}

}  // namespace magicpig::eval
