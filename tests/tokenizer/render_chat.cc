// magicpig_render_chat: renders conversations with magicpig's chat templates, for comparison with
// the model's own Jinja template rendered by the `jinja2` package (compare_chat.sh).
//
//   magicpig_render_chat MODEL.gguf CONVERSATIONS.json OUT.json
//
// CONVERSATIONS.json is an array of conversations, each an array of {"role", "content"} objects.
// OUT.json receives an array of the rendered prompts (with the generation prompt), one per
// conversation, or null where the template refuses the conversation. Exits 1 on bad input.
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "common/json/parse.h"
#include "common/json/serialize.h"
#include "common/json/value.h"
#include "gpu_node/model/chat_template.h"
#include "gpu_node/model/gguf_file.h"

int main(int argc, char** argv) {
  using magicpig::json::Value;
  if (argc != 4) {
    std::cerr << "usage: magicpig_render_chat MODEL.gguf CONVERSATIONS.json OUT.json\n";
    return 1;
  }
  auto file = magicpig::model::GgufFile::Open(argv[1]);
  if (!file.ok()) {
    std::cerr << file.status() << "\n";
    return 1;
  }
  auto chat = magicpig::model::ChatTemplate::FromGguf(**file);
  if (!chat.ok()) {
    std::cerr << chat.status() << "\n";
    return 1;
  }
  std::ifstream in(argv[2], std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  auto conversations = magicpig::json::Parse(text.str());
  if (!conversations.ok() || !conversations->is_array()) {
    std::cerr << "bad conversations file " << argv[2] << "\n";
    return 1;
  }
  Value out = Value::Array();
  for (const Value& conv : conversations->as_array()) {
    std::vector<magicpig::model::ChatMessage> messages;
    if (!conv.is_array()) {
      std::cerr << "a conversation is not an array\n";
      return 1;
    }
    for (const Value& m : conv.as_array()) {
      const Value* role = m.Find("role");
      const Value* content = m.Find("content");
      if (role == nullptr || !role->is_string() || content == nullptr || !content->is_string()) {
        std::cerr << "a message lacks a string role or content\n";
        return 1;
      }
      messages.push_back({role->as_string(), content->as_string()});
    }
    auto rendered = chat->Render(messages, /*add_generation_prompt=*/true);
    out.Push(rendered.ok() ? Value(*rendered) : Value());
  }
  std::ofstream(argv[3], std::ios::binary) << magicpig::json::Serialize(out);
  return 0;
}
