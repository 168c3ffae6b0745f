// GGUF v3 model files: a validating, memory-mapped reader.
//
// GgufFile::Open maps the file read-only and parses header, metadata and tensor infos, applying
// every check of the reference reader (magic, version 2..3, duplicate keys and tensor names,
// alignment a power of two, n_dims <= 4, dims >= 0, element counts without overflow, known type
// codes, dims[0] divisible by the block size, byte sizes without overflow, tensor data inside the
// file, string/array lengths bounded by the bytes left). Any violation is INVALID_ARGUMENT with a
// message naming what is wrong and where (key or tensor name, byte offset); never a crash.
//
//   MAGICPIG_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> f, GgufFile::Open(path));
//   MAGICPIG_ASSIGN_OR_RETURN(int64_t n_layer, f->GetInt("llama.block_count"));
//   const GgufTensor* t = f->FindTensor("token_embd.weight");
//
// Thread-safety: immutable after Open; all const methods may be called concurrently.
#ifndef MAGICPIG_GPU_NODE_MODEL_GGUF_FILE_H_
#define MAGICPIG_GPU_NODE_MODEL_GGUF_FILE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/quant/ggml_type.h"
#include "common/quant/interleave.h"

namespace magicpig::model {

enum class GgufValueType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

// One metadata value. Scalars are held decoded; arrays hold their element type and decoded
// elements (nested arrays are accepted by the parser and kept as nested values).
struct GgufValue {
  GgufValueType type = GgufValueType::kU8;
  // Exactly one of these is meaningful, by `type`:
  int64_t int_value = 0;     // integer types; 0 for a u64 above INT64_MAX (GetInt rejects it)
  uint64_t uint_value = 0;   // u64 (and copies of non-negative ints)
  double float_value = 0.0;  // f32, f64
  bool bool_value = false;   // bool
  std::string string_value;  // string
  GgufValueType array_type = GgufValueType::kU8;  // for arrays
  std::vector<GgufValue> array;                   // for arrays
};

struct GgufTensor {
  std::string name;
  std::vector<int64_t> dims;  // innermost (contiguous) first, as in the file
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;  // relative to the data section
  uint64_t size_bytes = 0;
  const uint8_t* data = nullptr;  // inside the mapping; valid while the GgufFile lives
  // kRows16 only where Open was asked for it (GgufLoad::kReadInterleaved).
  WeightLayout layout = WeightLayout::kRowMajor;
  int64_t num_elements() const;
};

// How Open brings the file into memory.
enum class GgufLoad {
  // A read-only mapping: instant, pages load on first use and are shared with the page cache.
  kMap,
  // Read into anonymous memory advised for transparent huge pages: the whole file is read at open
  // and counts toward the process's RSS, but a pass over the weights takes ~500x fewer TLB misses
  // (2 MiB pages instead of 4 KiB), which made CPU decoding of a 1 GB model ~7% faster.
  kRead,
  // kRead, then every matrix that can be (Q4_K or Q6_K, rows a multiple of 16) converted in place
  // to the 16-row interleaved layout of the AVX-512 kernels (common/quant/interleave.h; 2.3x the
  // prefill products of a row-major Q4_K matrix). Only for a reader whose every use of those
  // tensors goes through QuantMatrix with the tensor's `layout`.
  kReadInterleaved,
};

class GgufFile {
 public:
  // Maps (or reads) and validates the file. NOT_FOUND if it cannot be opened, INVALID_ARGUMENT if
  // malformed, INTERNAL if it cannot be mapped or read.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path,
                                                        GgufLoad load = GgufLoad::kMap);
  // Parses an in-memory image (copied); for tests and fuzzing.
  static absl::StatusOr<std::unique_ptr<GgufFile>> FromBytes(std::string_view bytes);

  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t file_size() const { return size_; }

  // nullptr if absent.
  const GgufValue* FindValue(std::string_view key) const;
  bool HasKey(std::string_view key) const { return FindValue(key) != nullptr; }
  const std::vector<std::string>& keys() const { return key_order_; }

  // Typed getters: NOT_FOUND if the key is absent, INVALID_ARGUMENT (naming the key) if the type
  // does not fit. GetInt accepts every integer type (and range-checks u64); GetFloat accepts f32,
  // f64 and integers.
  absl::StatusOr<int64_t> GetInt(std::string_view key) const;
  absl::StatusOr<double> GetFloat(std::string_view key) const;
  absl::StatusOr<bool> GetBool(std::string_view key) const;
  absl::StatusOr<std::string> GetString(std::string_view key) const;
  absl::StatusOr<std::vector<std::string>> GetStringArray(std::string_view key) const;
  absl::StatusOr<std::vector<int64_t>> GetIntArray(std::string_view key) const;
  absl::StatusOr<std::vector<float>> GetFloatArray(std::string_view key) const;

  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  // nullptr if absent.
  const GgufTensor* FindTensor(std::string_view name) const;

 private:
  GgufFile() = default;
  absl::Status Parse();

  // Either a read-only mapping (Open) or an owned, 64-byte aligned exact-size copy (FromBytes).
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  void* mapping_ = nullptr;  // file mapping (kMap) or anonymous memory (kRead)
  size_t mapping_bytes_ = 0;
  uint8_t* owned_ = nullptr;

  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  absl::flat_hash_map<std::string, GgufValue> values_;
  std::vector<std::string> key_order_;
  std::vector<GgufTensor> tensors_;
  absl::flat_hash_map<std::string, size_t> tensor_index_;
};

}  // namespace magicpig::model

#endif  // MAGICPIG_GPU_NODE_MODEL_GGUF_FILE_H_
