// Test-only GGUF writer: builds GGUF images in memory (or on disk) for unit tests and fuzz seeds.
//
// It writes exactly what it is told, including invalid things, so tests can produce a malformed
// file for each rejection path of the reader: raw value type codes and value bytes, raw tensor
// type codes, negative or huge dims, explicit (misaligned or out-of-range) offsets, overridden
// magic, version and counts, and truncation.
//
//   GgufWriter w;
//   w.AddString("general.architecture", "llama");
//   w.AddU32("llama.block_count", 2);
//   w.AddTensor("token_embd.weight", {64, 300}, GgmlType::kF32, bytes);
//   std::string image = w.Build();
#ifndef MAGICPIG_TESTS_TESTING_GGUF_WRITER_H_
#define MAGICPIG_TESTS_TESTING_GGUF_WRITER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/quant/ggml_type.h"
#include "gpu_node/model/gguf_file.h"

namespace magicpig::testing {

using model::GgufValueType;

// Little-endian encoders of GGUF primitives (also useful for hand-made byte images).
void AppendU8(std::string* out, uint8_t v);
void AppendU32(std::string* out, uint32_t v);
void AppendU64(std::string* out, uint64_t v);
void AppendF32(std::string* out, float v);
void AppendF64(std::string* out, double v);
void AppendGgufString(std::string* out, std::string_view s);

// Header fields and counts a test may override to make a malformed file.
struct GgufWriterOptions {
  std::string magic = "GGUF";  // written as given (any length)
  uint32_t version = 3;
  std::optional<uint64_t> tensor_count;  // default: the number of tensors added
  std::optional<uint64_t> kv_count;      // default: the number of entries added
  // Alignment used for padding and automatic offsets. Default: the value of an added u32
  // general.alignment if it is a power of two, else 32. Does not add the key by itself.
  std::optional<uint32_t> padding_alignment;
};

// Byte offsets of the parts of a built image, to corrupt specific fields by hand.
struct GgufLayout {
  std::vector<uint64_t> kv_offsets;           // start of each metadata entry (its key)
  std::vector<uint64_t> tensor_info_offsets;  // start of each tensor info (its name)
  uint64_t data_start = 0;                    // start of the tensor data section
  std::vector<uint64_t> tensor_data_offsets;  // absolute file offset of each tensor's data
  uint64_t size = 0;
};

class GgufWriter {
 public:
  explicit GgufWriter(GgufWriterOptions options = {}) : options_(std::move(options)) {}

  GgufWriterOptions& options() { return options_; }

  // Scalars.
  void AddU8(std::string key, uint8_t v);
  void AddI8(std::string key, int8_t v);
  void AddU16(std::string key, uint16_t v);
  void AddI16(std::string key, int16_t v);
  void AddU32(std::string key, uint32_t v);
  void AddI32(std::string key, int32_t v);
  void AddU64(std::string key, uint64_t v);
  void AddI64(std::string key, int64_t v);
  void AddF32(std::string key, float v);
  void AddF64(std::string key, double v);
  void AddBool(std::string key, bool v);
  void AddString(std::string key, std::string_view v);
  // Arrays. Integer arrays are written with the given element type (values truncated to it).
  void AddStringArray(std::string key, const std::vector<std::string>& v);
  void AddIntArray(std::string key, GgufValueType elem_type, const std::vector<int64_t>& v);
  void AddF32Array(std::string key, const std::vector<float>& v);
  void AddF64Array(std::string key, const std::vector<double>& v);
  void AddBoolArray(std::string key, const std::vector<bool>& v);
  // Escape hatch: a key followed by an arbitrary u32 type code and arbitrary value bytes (for
  // nested arrays, unknown type codes, bool 2, lying lengths...).
  void AddRaw(std::string key, uint32_t type_code, std::string value_bytes);

  // A tensor of a known type; `data` is written as given (its size is not checked, so a test can
  // write a short tensor). With no explicit offset, tensors are placed back to back, each padded
  // to the alignment.
  void AddTensor(std::string name, std::vector<int64_t> dims, GgmlType type, std::string data,
                 std::optional<uint64_t> offset = std::nullopt);
  // Any type code (unknown ones included); dims written as u64 bit patterns of the int64s.
  void AddRawTensor(std::string name, std::vector<int64_t> dims, uint32_t type_code,
                    std::string data, std::optional<uint64_t> offset = std::nullopt);

  // Truncates the built image to this many bytes (if smaller).
  void TruncateTo(uint64_t size) { truncate_to_ = size; }

  std::string Build(GgufLayout* layout = nullptr) const;
  absl::Status WriteToFile(const std::string& path) const;

 private:
  struct Entry {
    std::string key;
    uint32_t type_code;
    std::string value_bytes;
  };
  struct Tensor {
    std::string name;
    std::vector<int64_t> dims;
    uint32_t type_code;
    std::string data;
    std::optional<uint64_t> offset;
  };
  uint32_t EffectiveAlignment() const;

  GgufWriterOptions options_;
  std::vector<Entry> entries_;
  std::vector<Tensor> tensors_;
  std::optional<uint64_t> truncate_to_;
};

// Writes bytes to a file (for tests that need a path).
absl::Status WriteBytesToFile(const std::string& path, std::string_view bytes);

// A unique path under the test temp directory ($TEST_TMPDIR or /tmp).
std::string TempPath(std::string_view name);

}  // namespace magicpig::testing

#endif  // MAGICPIG_TESTS_TESTING_GGUF_WRITER_H_
