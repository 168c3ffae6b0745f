// Test-only GGUF writer (see gguf_writer.h): serialises header, metadata, tensor infos and
// aligned tensor data exactly as told, valid or not.
#include "tests/testing/gguf_writer.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace magicpig::testing {
namespace {

void AppendLe(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

uint32_t Code(GgufValueType t) { return static_cast<uint32_t>(t); }

// Encoding of one integer array element of `type`.
void AppendIntOfType(std::string* out, GgufValueType type, int64_t v) {
  switch (type) {
    case GgufValueType::kU8:
    case GgufValueType::kI8:
    case GgufValueType::kBool:
      AppendLe(out, static_cast<uint64_t>(v), 1);
      break;
    case GgufValueType::kU16:
    case GgufValueType::kI16:
      AppendLe(out, static_cast<uint64_t>(v), 2);
      break;
    case GgufValueType::kU32:
    case GgufValueType::kI32:
      AppendLe(out, static_cast<uint64_t>(v), 4);
      break;
    default:
      AppendLe(out, static_cast<uint64_t>(v), 8);
      break;
  }
}

bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace

void AppendU8(std::string* out, uint8_t v) { AppendLe(out, v, 1); }
void AppendU32(std::string* out, uint32_t v) { AppendLe(out, v, 4); }
void AppendU64(std::string* out, uint64_t v) { AppendLe(out, v, 8); }
void AppendF32(std::string* out, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  AppendLe(out, bits, 4);
}
void AppendF64(std::string* out, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  AppendLe(out, bits, 8);
}
void AppendGgufString(std::string* out, std::string_view s) {
  AppendU64(out, s.size());
  out->append(s);
}

void GgufWriter::AddRaw(std::string key, uint32_t type_code, std::string value_bytes) {
  entries_.push_back({std::move(key), type_code, std::move(value_bytes)});
}

void GgufWriter::AddU8(std::string key, uint8_t v) {
  std::string b;
  AppendLe(&b, v, 1);
  AddRaw(std::move(key), Code(GgufValueType::kU8), b);
}
void GgufWriter::AddI8(std::string key, int8_t v) {
  std::string b;
  AppendLe(&b, static_cast<uint8_t>(v), 1);
  AddRaw(std::move(key), Code(GgufValueType::kI8), b);
}
void GgufWriter::AddU16(std::string key, uint16_t v) {
  std::string b;
  AppendLe(&b, v, 2);
  AddRaw(std::move(key), Code(GgufValueType::kU16), b);
}
void GgufWriter::AddI16(std::string key, int16_t v) {
  std::string b;
  AppendLe(&b, static_cast<uint16_t>(v), 2);
  AddRaw(std::move(key), Code(GgufValueType::kI16), b);
}
void GgufWriter::AddU32(std::string key, uint32_t v) {
  std::string b;
  AppendLe(&b, v, 4);
  AddRaw(std::move(key), Code(GgufValueType::kU32), b);
}
void GgufWriter::AddI32(std::string key, int32_t v) {
  std::string b;
  AppendLe(&b, static_cast<uint32_t>(v), 4);
  AddRaw(std::move(key), Code(GgufValueType::kI32), b);
}
void GgufWriter::AddU64(std::string key, uint64_t v) {
  std::string b;
  AppendLe(&b, v, 8);
  AddRaw(std::move(key), Code(GgufValueType::kU64), b);
}
void GgufWriter::AddI64(std::string key, int64_t v) {
  std::string b;
  AppendLe(&b, static_cast<uint64_t>(v), 8);
  AddRaw(std::move(key), Code(GgufValueType::kI64), b);
}
void GgufWriter::AddF32(std::string key, float v) {
  std::string b;
  AppendF32(&b, v);
  AddRaw(std::move(key), Code(GgufValueType::kF32), b);
}
void GgufWriter::AddF64(std::string key, double v) {
  std::string b;
  AppendF64(&b, v);
  AddRaw(std::move(key), Code(GgufValueType::kF64), b);
}
void GgufWriter::AddBool(std::string key, bool v) {
  AddRaw(std::move(key), Code(GgufValueType::kBool), std::string(1, v ? '\1' : '\0'));
}
void GgufWriter::AddString(std::string key, std::string_view v) {
  std::string b;
  AppendGgufString(&b, v);
  AddRaw(std::move(key), Code(GgufValueType::kString), b);
}

void GgufWriter::AddStringArray(std::string key, const std::vector<std::string>& v) {
  std::string b;
  AppendU32(&b, Code(GgufValueType::kString));
  AppendU64(&b, v.size());
  for (const std::string& s : v) AppendGgufString(&b, s);
  AddRaw(std::move(key), Code(GgufValueType::kArray), b);
}
void GgufWriter::AddIntArray(std::string key, GgufValueType elem_type,
                             const std::vector<int64_t>& v) {
  std::string b;
  AppendU32(&b, Code(elem_type));
  AppendU64(&b, v.size());
  for (int64_t x : v) AppendIntOfType(&b, elem_type, x);
  AddRaw(std::move(key), Code(GgufValueType::kArray), b);
}
void GgufWriter::AddF32Array(std::string key, const std::vector<float>& v) {
  std::string b;
  AppendU32(&b, Code(GgufValueType::kF32));
  AppendU64(&b, v.size());
  for (float x : v) AppendF32(&b, x);
  AddRaw(std::move(key), Code(GgufValueType::kArray), b);
}
void GgufWriter::AddF64Array(std::string key, const std::vector<double>& v) {
  std::string b;
  AppendU32(&b, Code(GgufValueType::kF64));
  AppendU64(&b, v.size());
  for (double x : v) AppendF64(&b, x);
  AddRaw(std::move(key), Code(GgufValueType::kArray), b);
}
void GgufWriter::AddBoolArray(std::string key, const std::vector<bool>& v) {
  std::string b;
  AppendU32(&b, Code(GgufValueType::kBool));
  AppendU64(&b, v.size());
  for (bool x : v) AppendU8(&b, x ? 1 : 0);
  AddRaw(std::move(key), Code(GgufValueType::kArray), b);
}

void GgufWriter::AddTensor(std::string name, std::vector<int64_t> dims, GgmlType type,
                           std::string data, std::optional<uint64_t> offset) {
  AddRawTensor(std::move(name), std::move(dims), static_cast<uint32_t>(type), std::move(data),
               offset);
}

void GgufWriter::AddRawTensor(std::string name, std::vector<int64_t> dims, uint32_t type_code,
                              std::string data, std::optional<uint64_t> offset) {
  tensors_.push_back({std::move(name), std::move(dims), type_code, std::move(data), offset});
}

uint32_t GgufWriter::EffectiveAlignment() const {
  if (options_.padding_alignment.has_value()) return *options_.padding_alignment;
  for (const Entry& e : entries_) {
    if (e.key == "general.alignment" && e.type_code == Code(GgufValueType::kU32) &&
        e.value_bytes.size() == 4) {
      uint32_t a = 0;
      for (int i = 0; i < 4; ++i)
        a |= static_cast<uint32_t>(static_cast<uint8_t>(e.value_bytes[i])) << (8 * i);
      if (IsPowerOfTwo(a)) return a;
    }
  }
  return 32;
}

std::string GgufWriter::Build(GgufLayout* layout) const {
  const uint64_t align = EffectiveAlignment() == 0 ? 1 : EffectiveAlignment();
  auto pad_to = [align](std::string* out) {
    while (out->size() % align != 0) out->push_back('\0');
  };
  GgufLayout lay;
  std::string out;
  out.append(options_.magic);
  AppendU32(&out, options_.version);
  AppendU64(&out, options_.tensor_count.value_or(tensors_.size()));
  AppendU64(&out, options_.kv_count.value_or(entries_.size()));
  for (const Entry& e : entries_) {
    lay.kv_offsets.push_back(out.size());
    AppendGgufString(&out, e.key);
    AppendU32(&out, e.type_code);
    out.append(e.value_bytes);
  }
  // Automatic offsets: back to back, each tensor padded to the alignment.
  std::vector<uint64_t> offsets;
  uint64_t next = 0;
  for (const Tensor& t : tensors_) {
    offsets.push_back(t.offset.value_or(next));
    next += (t.data.size() + align - 1) / align * align;
  }
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Tensor& t = tensors_[i];
    lay.tensor_info_offsets.push_back(out.size());
    AppendGgufString(&out, t.name);
    AppendU32(&out, static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) AppendU64(&out, static_cast<uint64_t>(d));
    AppendU32(&out, t.type_code);
    AppendU64(&out, offsets[i]);
  }
  pad_to(&out);
  lay.data_start = out.size();
  // Data: each tensor at its automatic position (explicit offsets only change the info, so a
  // test can point a tensor anywhere, including past the end).
  for (const Tensor& t : tensors_) {
    lay.tensor_data_offsets.push_back(out.size());
    out.append(t.data);
    pad_to(&out);
  }
  if (truncate_to_.has_value() && *truncate_to_ < out.size()) out.resize(*truncate_to_);
  lay.size = out.size();
  if (layout != nullptr) *layout = std::move(lay);
  return out;
}

absl::Status GgufWriter::WriteToFile(const std::string& path) const {
  return WriteBytesToFile(path, Build());
}

absl::Status WriteBytesToFile(const std::string& path, std::string_view bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return absl::InternalError(absl::StrCat("cannot create ", path));
  const size_t n = bytes.empty() ? 0 : std::fwrite(bytes.data(), 1, bytes.size(), f);
  const bool ok = n == bytes.size() && std::fclose(f) == 0;
  if (!ok) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

std::string TempPath(std::string_view name) {
  static std::atomic<int> counter{0};
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr && *dir != '\0' ? dir : "/tmp", "/magicpig_", ::getpid(), "_",
                      counter.fetch_add(1), "_", std::string(name));
}

}  // namespace magicpig::testing
