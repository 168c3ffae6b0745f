// libFuzzer target for the GGUF reader: parses arbitrary bytes and, when they parse, walks every
// value and tensor through the public getters so sanitizers see every code path that reads them.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "gpu_node/model/gguf_file.h"
#include "gpu_node/model/model_config.h"

namespace {

using magicpig::model::GgufFile;
using magicpig::model::GgufTensor;
using magicpig::model::GgufValue;
using magicpig::model::GgufValueType;

// Touches every nested element so a dangling or uninitialised value would be reported.
uint64_t Walk(const GgufValue& v) {
  uint64_t h = static_cast<uint64_t>(v.type) + v.uint_value + v.string_value.size() +
               (v.bool_value ? 1 : 0) + static_cast<uint64_t>(v.int_value);
  for (const GgufValue& e : v.array) h += Walk(e);
  return h;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = GgufFile::FromBytes(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!f.ok()) return 0;
  const GgufFile& file = **f;
  volatile uint64_t sink = file.version() + file.alignment() + file.file_size();
  for (const auto& key : file.keys()) {
    const GgufValue* v = file.FindValue(key);
    if (v == nullptr) __builtin_trap();  // every listed key must be findable
    sink = sink + Walk(*v);
    // Every getter on every key: each must return a value or a status, never crash.
    (void)file.GetInt(key);
    (void)file.GetFloat(key);
    (void)file.GetBool(key);
    (void)file.GetString(key);
    (void)file.GetStringArray(key);
    (void)file.GetIntArray(key);
    (void)file.GetFloatArray(key);
  }
  for (const GgufTensor& t : file.tensors()) {
    if (file.FindTensor(t.name) != &t) __builtin_trap();
    sink = sink + static_cast<uint64_t>(t.num_elements());
    // Read the first and last byte of the data: ASan reports it if the range check is wrong.
    if (t.size_bytes > 0) sink = sink + t.data[0] + t.data[t.size_bytes - 1];
  }
  (void)magicpig::model::ReadModelConfig(file);
  return 0;
}
