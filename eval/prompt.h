// Prompt rendering for the evaluation (eval-tasks.md §1.3): the model's chat template around the
// task text (one user message), then the answer prefix after the generation prompt. The token ids
// are the segments encoded one by one (template text with special tokens, message content
// without), and the task text is encoded as two pieces, [0, question_offset) and the rest, so that
// setup B's split point is a token boundary. Count() uses the very same rendering, so samples are
// sized exactly as they are run.
//
// Thread-safety: const methods only; the engine must outlive the renderer.
#ifndef MAGICPIG_EVAL_PROMPT_H_
#define MAGICPIG_EVAL_PROMPT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "eval/tasks.h"
#include "gpu_node/engine/engine.h"

namespace magicpig::eval {

struct RenderedPrompt {
  std::vector<int32_t> tokens;
  int64_t split = 0;  // tokens[0, split): template head + context; the rest: question part
};

class PromptRenderer {
 public:
  explicit PromptRenderer(const engine::Engine* engine) : engine_(engine) {}
  absl::StatusOr<RenderedPrompt> Render(const std::string& input, int64_t question_offset,
                                        const std::string& answer_prefix) const;
  absl::StatusOr<RenderedPrompt> Render(const Sample& s) const {
    return Render(s.input, s.question_offset, s.answer_prefix);
  }
  // Tokens of the rendered prompt (-1 on a rendering error).
  int64_t Count(const std::string& input, int64_t question_offset,
                const std::string& answer_prefix) const;

 private:
  const engine::Engine* engine_;
};

}  // namespace magicpig::eval

#endif  // MAGICPIG_EVAL_PROMPT_H_
