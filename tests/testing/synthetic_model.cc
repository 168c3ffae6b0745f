// Synthetic llama/qwen2 GGUF models for unit tests (see synthetic_model.h).
#include "tests/testing/synthetic_model.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/half.h"
#include "common/text/utf8.h"
#include "tests/testing/gguf_writer.h"

namespace magicpig::testing {
namespace {

// The ChatML template of SmolLM2-Instruct (default system message included), as Jinja.
constexpr char kChatTemplate[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";

// Built-in merges, in rank order; each right-hand piece exists when the merge is reached.
constexpr std::pair<const char*, const char*> kBaseMerges[] = {
    {"\xC4\xA0", "t"}, {"h", "e"}, {"i", "n"}, {"\xC4\xA0", "a"},
    {"e", "r"},        {"o", "n"}, {"r", "e"}, {"\xC4\xA0t", "he"},
};
static_assert(std::size(kBaseMerges) == kSyntheticBaseVocab - 3 - 256);

void PutU16(std::string* s, size_t at, uint16_t v) {
  (*s)[at] = static_cast<char>(v & 0xFF);
  (*s)[at + 1] = static_cast<char>(v >> 8);
}

struct Vocab {
  std::vector<std::string> tokens;
  std::vector<int64_t> types;
  std::vector<std::string> merges;
};

absl::StatusOr<Vocab> BuildVocab(int64_t n_vocab) {
  if (n_vocab < kSyntheticBaseVocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("synthetic n_vocab ", n_vocab, " is below the minimum ", kSyntheticBaseVocab));
  }
  Vocab v;
  absl::flat_hash_set<std::string> seen;
  auto add = [&](std::string tok, int64_t type) {
    seen.insert(tok);
    v.tokens.push_back(std::move(tok));
    v.types.push_back(type);
  };
  add("<|endoftext|>", 3);
  add("<|im_start|>", 3);
  add("<|im_end|>", 3);
  for (int b = 0; b < 256; ++b) add(Gpt2ByteToken(static_cast<uint8_t>(b)), 1);
  for (const auto& [l, r] : kBaseMerges) {
    v.merges.push_back(absl::StrCat(l, " ", r));
    add(absl::StrCat(l, r), 1);
  }
  // Padding: merges growing lowercase words letter by letter ("a b", ..., "ab c", ...), skipping
  // pieces already present, until the requested size is reached.
  std::vector<std::string> frontier;
  for (char c = 'a'; c <= 'z'; ++c) frontier.emplace_back(1, c);
  while (static_cast<int64_t>(v.tokens.size()) < n_vocab) {
    std::vector<std::string> next;
    for (const std::string& p : frontier) {
      for (char c = 'a'; c <= 'z' && static_cast<int64_t>(v.tokens.size()) < n_vocab; ++c) {
        std::string piece = p + c;
        if (seen.contains(piece)) continue;
        v.merges.push_back(absl::StrCat(p, " ", std::string(1, c)));
        add(piece, 1);
        next.push_back(std::move(piece));
      }
      if (static_cast<int64_t>(v.tokens.size()) >= n_vocab) break;
    }
    frontier = std::move(next);
  }
  return v;
}

// The type's name as a std::string, whatever string type GgmlTypeInfo uses for it.
std::string TypeName(const GgmlTypeInfo& info) { return std::string(std::string_view(info.name)); }

// llama.cpp's general.file_type ("mostly X") for a weight type.
int64_t FileTypeOf(GgmlType t) {
  switch (t) {
    case GgmlType::kF32:
      return 0;
    case GgmlType::kF16:
      return 1;
    case GgmlType::kQ4_0:
      return 2;
    case GgmlType::kQ4_1:
      return 3;
    case GgmlType::kQ8_0:
      return 7;
    case GgmlType::kQ5_0:
      return 8;
    case GgmlType::kQ5_1:
      return 9;
    case GgmlType::kQ4_K:
      return 15;
    case GgmlType::kQ5_K:
      return 17;
    case GgmlType::kQ6_K:
      return 18;
    case GgmlType::kBF16:
      return 32;
    default:
      return 0;
  }
}

}  // namespace

std::string Gpt2ByteToken(uint8_t b) {
  // Printable bytes map to themselves; the other 68 map, in byte order, to U+0100 onwards.
  auto printable = [](int x) {
    return (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF);
  };
  uint32_t cp = b;
  if (!printable(b)) {
    int n = 0;
    for (int x = 0; x < b; ++x) n += printable(x) ? 0 : 1;
    cp = 0x100 + n;
  }
  std::string s;
  text::AppendUtf8(cp, &s);
  return s;
}

absl::StatusOr<std::string> RandomTensorBytes(GgmlType type, int64_t n, uint32_t seed) {
  const GgmlTypeInfo& info = GetGgmlTypeInfo(type);
  if (n < 0 || n % info.block_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(n, " values are not whole ", TypeName(info), " blocks of ", info.block_size));
  }
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> value(-0.05f, 0.05f);
  const int64_t blocks = n / info.block_size;
  std::string out(static_cast<size_t>(blocks * info.block_bytes), '\0');
  // Quantised bits: any byte pattern is a valid block except for the scale fields fixed below.
  for (char& c : out) c = static_cast<char>(rng() & 0xFF);
  auto fp16 = [&](float lo, float hi) {
    return FloatToFp16(std::uniform_real_distribution<float>(lo, hi)(rng));
  };
  for (int64_t b = 0; b < blocks; ++b) {
    const size_t at = static_cast<size_t>(b * info.block_bytes);
    switch (type) {
      case GgmlType::kF32: {
        const float f = value(rng);
        std::memcpy(&out[at], &f, 4);
        break;
      }
      case GgmlType::kF16:
        PutU16(&out, at, FloatToFp16(value(rng)));
        break;
      case GgmlType::kBF16:
        PutU16(&out, at, FloatToBf16(value(rng)));
        break;
      case GgmlType::kQ4_0:
      case GgmlType::kQ5_0:
      case GgmlType::kQ8_0:
        PutU16(&out, at, fp16(0.0005f, 0.005f));
        break;
      case GgmlType::kQ4_1:
      case GgmlType::kQ5_1:
        PutU16(&out, at, fp16(0.0005f, 0.005f));     // d
        PutU16(&out, at + 2, fp16(-0.05f, -0.01f));  // m
        break;
      case GgmlType::kQ4_K:
      case GgmlType::kQ5_K:
        PutU16(&out, at, fp16(0.00005f, 0.0002f));      // d
        PutU16(&out, at + 2, fp16(0.00005f, 0.0002f));  // dmin
        break;
      case GgmlType::kQ6_K:
        PutU16(&out, at + 208, fp16(0.00005f, 0.0002f));  // d sits at the end
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("synthetic weights of type ", TypeName(info), " are not supported"));
    }
  }
  return out;
}

absl::StatusOr<std::string> BuildSyntheticModel(const SyntheticModelOptions& o) {
  if (o.n_layer <= 0 || o.n_embd <= 0 || o.n_ff <= 0 || o.n_head <= 0 || o.n_head_kv <= 0 ||
      o.n_embd % o.n_head != 0 || o.n_head % o.n_head_kv != 0) {
    return absl::InvalidArgumentError("inconsistent synthetic model sizes");
  }
  auto vocab_or = BuildVocab(o.n_vocab);
  if (!vocab_or.ok()) return vocab_or.status();
  const Vocab& vocab = *vocab_or;
  const int64_t head_dim = o.n_embd / o.n_head;
  const int64_t kv_dim = o.n_head_kv * head_dim;
  const std::string& a = o.architecture;

  GgufWriter w;
  auto omitted = [&](const std::string& key) {
    for (const std::string& k : o.omit_keys) {
      if (k == key) return true;
    }
    return false;
  };
  auto u32 = [&](const std::string& key, int64_t v) {
    if (!omitted(key)) w.AddU32(key, static_cast<uint32_t>(v));
  };
  auto f32 = [&](const std::string& key, float v) {
    if (!omitted(key)) w.AddF32(key, v);
  };
  auto str = [&](const std::string& key, const std::string& v) {
    if (!omitted(key)) w.AddString(key, v);
  };
  // Key order and types follow llama.cpp's converter output for SmolLM2.
  str("general.architecture", a);
  str("general.name", o.name);
  u32(a + ".block_count", o.n_layer);
  u32(a + ".context_length", o.context_length);
  u32(a + ".embedding_length", o.n_embd);
  u32(a + ".feed_forward_length", o.n_ff);
  u32(a + ".attention.head_count", o.n_head);
  u32(a + ".attention.head_count_kv", o.n_head_kv);
  f32(a + ".rope.freq_base", o.rope_freq_base);
  f32(a + ".attention.layer_norm_rms_epsilon", o.rms_eps);
  u32("general.file_type", FileTypeOf(o.weight_type));
  u32(a + ".vocab_size", o.n_vocab);
  u32(a + ".rope.dimension_count", head_dim);
  str("tokenizer.ggml.model", "gpt2");
  str("tokenizer.ggml.pre", "smollm");
  if (!omitted("tokenizer.ggml.tokens")) w.AddStringArray("tokenizer.ggml.tokens", vocab.tokens);
  if (!omitted("tokenizer.ggml.token_type")) {
    w.AddIntArray("tokenizer.ggml.token_type", model::GgufValueType::kI32, vocab.types);
  }
  if (!omitted("tokenizer.ggml.merges")) w.AddStringArray("tokenizer.ggml.merges", vocab.merges);
  u32("tokenizer.ggml.bos_token_id", kSyntheticImStart);
  u32("tokenizer.ggml.eos_token_id", kSyntheticImEnd);
  u32("tokenizer.ggml.unknown_token_id", kSyntheticEndOfText);
  u32("tokenizer.ggml.padding_token_id", kSyntheticImEnd);
  if (!omitted("tokenizer.ggml.add_bos_token")) w.AddBool("tokenizer.ggml.add_bos_token", false);
  str("tokenizer.chat_template", kChatTemplate);
  u32("general.quantization_version", 2);

  auto omitted_tensor = [&](const std::string& name) {
    return std::find(o.omit_tensors.begin(), o.omit_tensors.end(), name) != o.omit_tensors.end();
  };
  uint32_t tensor_seed = o.seed * 1000003u;
  auto matrix = [&](std::string name, int64_t cols, int64_t rows, GgmlType type) -> absl::Status {
    auto bytes = RandomTensorBytes(type, cols * rows, tensor_seed++);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": ", bytes.status().message()));
    }
    if (omitted_tensor(name)) return absl::OkStatus();
    if (name == o.transposed_tensor) std::swap(cols, rows);
    w.AddTensor(std::move(name), {cols, rows}, type, *std::move(bytes));
    return absl::OkStatus();
  };
  std::mt19937 rng(o.seed);
  auto vector = [&](std::string name, int64_t n, float center, float spread) {
    std::uniform_real_distribution<float> dist(center - spread, center + spread);
    std::string bytes(static_cast<size_t>(n) * 4, '\0');
    for (int64_t i = 0; i < n; ++i) {
      const float f = dist(rng);
      std::memcpy(&bytes[static_cast<size_t>(i) * 4], &f, 4);
    }
    if (!omitted_tensor(name)) w.AddTensor(std::move(name), {n}, GgmlType::kF32, std::move(bytes));
  };

  absl::Status s = matrix("token_embd.weight", o.n_embd, o.n_vocab, o.embd_type);
  if (!s.ok()) return s;
  for (int64_t l = 0; l < o.n_layer; ++l) {
    const std::string p = absl::StrCat("blk.", l, ".");
    vector(p + "attn_norm.weight", o.n_embd, 1.0f, 0.05f);
    for (absl::Status st : {matrix(p + "attn_q.weight", o.n_embd, o.n_embd, o.weight_type),
                            matrix(p + "attn_k.weight", o.n_embd, kv_dim, o.weight_type),
                            matrix(p + "attn_v.weight", o.n_embd, kv_dim, o.weight_type),
                            matrix(p + "attn_output.weight", o.n_embd, o.n_embd, o.weight_type)}) {
      if (!st.ok()) return st;
    }
    if (a == "qwen2") {
      vector(p + "attn_q.bias", o.n_embd, 0.0f, 0.02f);
      vector(p + "attn_k.bias", kv_dim, 0.0f, 0.02f);
      vector(p + "attn_v.bias", kv_dim, 0.0f, 0.02f);
    }
    vector(p + "ffn_norm.weight", o.n_embd, 1.0f, 0.05f);
    for (absl::Status st : {matrix(p + "ffn_gate.weight", o.n_embd, o.n_ff, o.weight_type),
                            matrix(p + "ffn_up.weight", o.n_embd, o.n_ff, o.weight_type),
                            matrix(p + "ffn_down.weight", o.n_ff, o.n_embd, o.weight_type)}) {
      if (!st.ok()) return st;
    }
  }
  vector("output_norm.weight", o.n_embd, 1.0f, 0.05f);
  if (!o.tied_embeddings) {
    s = matrix("output.weight", o.n_embd, o.n_vocab, o.weight_type);
    if (!s.ok()) return s;
  }
  return w.Build();
}

absl::StatusOr<std::string> WriteSyntheticModel(const SyntheticModelOptions& options,
                                                const std::string& path) {
  absl::StatusOr<std::string> bytes = BuildSyntheticModel(options);
  if (!bytes.ok()) return bytes.status();
  absl::Status s = WriteBytesToFile(path, *bytes);
  if (!s.ok()) return s;
  return path;
}

}  // namespace magicpig::testing
