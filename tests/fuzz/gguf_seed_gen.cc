// Writes the seed corpus of gguf_fuzzer (tests/fuzz/corpus/gguf/): small valid GGUF images that
// reach the metadata, array, tensor-info and model-config paths. Usage: gguf_seed_gen <dir>
#include <cstdio>
#include <string>

#include "tests/testing/gguf_writer.h"
#include "tests/testing/synthetic_model.h"

namespace {

using magicpig::GgmlType;
using magicpig::model::GgufValueType;
using magicpig::testing::GgufWriter;

bool Write(const std::string& dir, const std::string& name, const std::string& bytes) {
  absl::Status s = magicpig::testing::WriteBytesToFile(dir + "/" + name, bytes);
  if (!s.ok()) std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
  return s.ok();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <dir>\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  bool ok = true;
  {
    GgufWriter w;  // header only
    ok &= Write(dir, "empty.gguf", w.Build());
  }
  {
    GgufWriter w;  // every scalar type
    w.AddU8("a", 1);
    w.AddI8("b", -1);
    w.AddU16("c", 2);
    w.AddI16("d", -2);
    w.AddU32("e", 3);
    w.AddI32("f", -3);
    w.AddU64("g", 4);
    w.AddI64("h", -4);
    w.AddF32("i", 0.5f);
    w.AddF64("j", 0.25);
    w.AddBool("k", true);
    w.AddString("l", "str");
    ok &= Write(dir, "scalars.gguf", w.Build());
  }
  {
    GgufWriter w;  // arrays, including a nested one
    w.AddStringArray("s", {"a", "bc"});
    w.AddIntArray("i", GgufValueType::kI32, {1, -2});
    w.AddF32Array("f", {1.0f});
    w.AddBoolArray("b", {true, false});
    std::string nested;
    magicpig::testing::AppendU32(&nested, static_cast<uint32_t>(GgufValueType::kArray));
    magicpig::testing::AppendU64(&nested, 1);
    magicpig::testing::AppendU32(&nested, static_cast<uint32_t>(GgufValueType::kU8));
    magicpig::testing::AppendU64(&nested, 1);
    nested.push_back('\7');
    w.AddRaw("n", static_cast<uint32_t>(GgufValueType::kArray), nested);
    ok &= Write(dir, "arrays.gguf", w.Build());
  }
  {
    GgufWriter w;  // tensors of several types, custom alignment
    w.AddU32("general.alignment", 16);
    w.AddTensor("f32", {4, 2}, GgmlType::kF32, std::string(32, '\1'));
    w.AddTensor("q8", {32}, GgmlType::kQ8_0, std::string(34, '\2'));
    w.AddTensor("q41", {32, 1}, GgmlType::kQ4_1, std::string(20, '\3'));
    ok &= Write(dir, "tensors.gguf", w.Build());
  }
  {
    GgufWriter w;  // version 2
    w.options().version = 2;
    w.AddString("general.architecture", "llama");
    w.AddTensor("t", {8}, GgmlType::kF16, std::string(16, '\0'));
    ok &= Write(dir, "v2.gguf", w.Build());
  }
  {
    GgufWriter w;  // the hyper-parameters ReadModelConfig reads, no tensors
    w.AddString("general.architecture", "llama");
    w.AddU32("llama.block_count", 1);
    w.AddU32("llama.embedding_length", 8);
    w.AddU32("llama.feed_forward_length", 16);
    w.AddU32("llama.attention.head_count", 2);
    w.AddU32("llama.attention.head_count_kv", 1);
    w.AddF32("llama.rope.freq_base", 10000.0f);
    w.AddStringArray("tokenizer.ggml.tokens", {"a", "b"});
    ok &= Write(dir, "config.gguf", w.Build());
  }
  {
    GgufWriter w;  // qwen2 config with a u64 and an f64 where u32/f32 are usual
    w.AddString("general.architecture", "qwen2");
    w.AddU64("qwen2.block_count", 1);
    w.AddI32("qwen2.embedding_length", 8);
    w.AddU16("qwen2.feed_forward_length", 8);
    w.AddU8("qwen2.attention.head_count", 2);
    w.AddF64("qwen2.attention.layer_norm_rms_epsilon", 1e-6);
    w.AddU32("qwen2.vocab_size", 4);
    ok &= Write(dir, "config_qwen2.gguf", w.Build());
  }
  return ok ? 0 : 1;
}
