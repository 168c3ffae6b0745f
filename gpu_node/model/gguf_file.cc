// GGUF v2/v3 reader: maps (or copies) a file and validates every structural field before use.
//
// The parser reads through a bounds-checked cursor; every length read from the file is compared
// with the bytes that remain before anything is allocated, so a hostile or truncated file yields
// INVALID_ARGUMENT and never an out-of-bounds read or a huge allocation.
#include "gpu_node/model/gguf_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <new>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace magicpig::model {
namespace {

constexpr uint32_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;
constexpr uint64_t kMaxTensorName = 64;
// Nested arrays are legal but no real file nests; a bound keeps recursion (and the stack) small.
constexpr int kMaxArrayDepth = 8;
// Decoded metadata elements cost ~100 bytes each (GgufValue), far more than their 1-8 bytes in the
// file, so a hostile file of huge u8 arrays could exhaust memory. Real vocabularies hold well under
// 1M elements in all (Gemma 3: 3 x 262K); 4M leaves room and caps decoding at ~0.4 GB.
constexpr uint64_t kMaxMetadataArrayElements = uint64_t{1} << 22;
// The copy made by FromBytes is aligned like this so tensor data can be read with aligned loads.
constexpr std::align_val_t kCopyAlignment{64};

// This absl build's StrCat takes absl::string_view, which is not std::string_view here.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Smallest encoding of one value of `type`, used to bound element counts by the bytes left.
uint64_t MinEncodedSize(GgufValueType type) {
  switch (type) {
    case GgufValueType::kU8:
    case GgufValueType::kI8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kU16:
    case GgufValueType::kI16:
      return 2;
    case GgufValueType::kU32:
    case GgufValueType::kI32:
    case GgufValueType::kF32:
      return 4;
    case GgufValueType::kU64:
    case GgufValueType::kI64:
    case GgufValueType::kF64:
    case GgufValueType::kString:  // u64 length
      return 8;
    case GgufValueType::kArray:  // u32 type + u64 count
      return 12;
  }
  return 1;
}

bool IsValidValueType(uint32_t code) { return code <= static_cast<uint32_t>(GgufValueType::kF64); }

bool IsIntegerType(GgufValueType t) {
  switch (t) {
    case GgufValueType::kU8:
    case GgufValueType::kI8:
    case GgufValueType::kU16:
    case GgufValueType::kI16:
    case GgufValueType::kU32:
    case GgufValueType::kI32:
    case GgufValueType::kU64:
    case GgufValueType::kI64:
      return true;
    default:
      return false;
  }
}

const char* ValueTypeName(GgufValueType t) {
  switch (t) {
    case GgufValueType::kU8:
      return "u8";
    case GgufValueType::kI8:
      return "i8";
    case GgufValueType::kU16:
      return "u16";
    case GgufValueType::kI16:
      return "i16";
    case GgufValueType::kU32:
      return "u32";
    case GgufValueType::kI32:
      return "i32";
    case GgufValueType::kF32:
      return "f32";
    case GgufValueType::kBool:
      return "bool";
    case GgufValueType::kString:
      return "string";
    case GgufValueType::kArray:
      return "array";
    case GgufValueType::kU64:
      return "u64";
    case GgufValueType::kI64:
      return "i64";
    case GgufValueType::kF64:
      return "f64";
  }
  return "?";
}

// Little-endian, bounds-checked reads over [base, base + size). Every failure names `what` and the
// byte offset where the read started.
class Cursor {
 public:
  Cursor(const uint8_t* base, uint64_t size) : base_(base), size_(size) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  // Counts decoded array elements against kMaxMetadataArrayElements.
  absl::Status CountArrayElements(uint64_t n, uint64_t offset) {
    array_elements_ += n;
    if (array_elements_ > kMaxMetadataArrayElements) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metadata arrays hold more than ", kMaxMetadataArrayElements,
          " elements in all (array at byte offset ", offset, "); refusing to decode them"));
    }
    return absl::OkStatus();
  }

  absl::Status Need(uint64_t n, std::string_view what) const {
    if (n > remaining()) {
      return absl::InvalidArgumentError(
          absl::StrCat("truncated: ", Sv(what), " at byte offset ", pos_, " needs ", n,
                       " bytes but only ", remaining(), " remain (file size ", size_, ")"));
    }
    return absl::OkStatus();
  }

  template <typename T>
  absl::StatusOr<T> Read(std::string_view what) {
    MAGICPIG_RETURN_IF_ERROR(Need(sizeof(T), what));
    // Byte-wise little-endian assembly: no alignment or host-endianness assumptions.
    uint64_t v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) {
      v |= static_cast<uint64_t>(base_[pos_ + i]) << (8 * i);
    }
    pos_ += sizeof(T);
    if constexpr (std::is_same_v<T, float>) {
      uint32_t bits = static_cast<uint32_t>(v);
      float f;
      std::memcpy(&f, &bits, sizeof(f));
      return f;
    } else if constexpr (std::is_same_v<T, double>) {
      double d;
      std::memcpy(&d, &v, sizeof(d));
      return d;
    } else {
      return static_cast<T>(v);
    }
  }

  // A GGUF string: u64 length, then that many bytes (checked against the remaining bytes before
  // the copy is made).
  absl::StatusOr<std::string> ReadString(std::string_view what) {
    const uint64_t start = pos_;
    MAGICPIG_ASSIGN_OR_RETURN(uint64_t len, Read<uint64_t>(what));
    if (len > remaining()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Sv(what), " at byte offset ", start, " has length ", len,
                       " which runs past the end of the file (", remaining(), " bytes remain)"));
    }
    std::string s(reinterpret_cast<const char*>(base_ + pos_), static_cast<size_t>(len));
    pos_ += len;
    return s;
  }

 private:
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
  uint64_t array_elements_ = 0;
};

absl::Status ReadValue(Cursor& cur, GgufValueType type, int depth, GgufValue* out);

absl::Status ReadArray(Cursor& cur, int depth, GgufValue* out) {
  const uint64_t start = cur.pos();
  if (depth >= kMaxArrayDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat("arrays nested deeper than ", kMaxArrayDepth, " at byte offset ", start));
  }
  MAGICPIG_ASSIGN_OR_RETURN(uint32_t elem_code, cur.Read<uint32_t>("array element type"));
  if (!IsValidValueType(elem_code)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown array element type ", elem_code, " at byte offset ", start));
  }
  const auto elem_type = static_cast<GgufValueType>(elem_code);
  MAGICPIG_ASSIGN_OR_RETURN(uint64_t count, cur.Read<uint64_t>("array length"));
  // Bound the count by the bytes left before reserving: each element needs at least this much.
  if (count > cur.remaining() / MinEncodedSize(elem_type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("array of ", count, " ", ValueTypeName(elem_type), " elements at byte offset ",
                     start, " runs past the end of the file (", cur.remaining(), " bytes remain)"));
  }
  MAGICPIG_RETURN_IF_ERROR(cur.CountArrayElements(count, start));
  out->array_type = elem_type;
  out->array.clear();
  out->array.reserve(static_cast<size_t>(count));
  for (uint64_t i = 0; i < count; ++i) {
    GgufValue& elem = out->array.emplace_back();
    MAGICPIG_RETURN_IF_ERROR(ReadValue(cur, elem_type, depth + 1, &elem));
  }
  return absl::OkStatus();
}

absl::Status ReadValue(Cursor& cur, GgufValueType type, int depth, GgufValue* out) {
  out->type = type;
  const uint64_t start = cur.pos();
  auto set_signed = [out](int64_t v) {
    out->int_value = v;
    out->uint_value = v >= 0 ? static_cast<uint64_t>(v) : 0;
  };
  switch (type) {
    case GgufValueType::kU8: {
      MAGICPIG_ASSIGN_OR_RETURN(uint8_t v, cur.Read<uint8_t>("u8 value"));
      set_signed(v);
      return absl::OkStatus();
    }
    case GgufValueType::kI8: {
      MAGICPIG_ASSIGN_OR_RETURN(int8_t v, cur.Read<int8_t>("i8 value"));
      set_signed(v);
      return absl::OkStatus();
    }
    case GgufValueType::kU16: {
      MAGICPIG_ASSIGN_OR_RETURN(uint16_t v, cur.Read<uint16_t>("u16 value"));
      set_signed(v);
      return absl::OkStatus();
    }
    case GgufValueType::kI16: {
      MAGICPIG_ASSIGN_OR_RETURN(int16_t v, cur.Read<int16_t>("i16 value"));
      set_signed(v);
      return absl::OkStatus();
    }
    case GgufValueType::kU32: {
      MAGICPIG_ASSIGN_OR_RETURN(uint32_t v, cur.Read<uint32_t>("u32 value"));
      set_signed(v);
      return absl::OkStatus();
    }
    case GgufValueType::kI32: {
      MAGICPIG_ASSIGN_OR_RETURN(int32_t v, cur.Read<int32_t>("i32 value"));
      set_signed(v);
      return absl::OkStatus();
    }
    case GgufValueType::kI64: {
      MAGICPIG_ASSIGN_OR_RETURN(int64_t v, cur.Read<int64_t>("i64 value"));
      set_signed(v);
      return absl::OkStatus();
    }
    case GgufValueType::kU64: {
      MAGICPIG_ASSIGN_OR_RETURN(uint64_t v, cur.Read<uint64_t>("u64 value"));
      out->uint_value = v;
      // Values above INT64_MAX keep int_value 0; GetInt range-checks via uint_value.
      out->int_value = v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
                           ? static_cast<int64_t>(v)
                           : 0;
      return absl::OkStatus();
    }
    case GgufValueType::kF32: {
      MAGICPIG_ASSIGN_OR_RETURN(float v, cur.Read<float>("f32 value"));
      out->float_value = v;
      return absl::OkStatus();
    }
    case GgufValueType::kF64: {
      MAGICPIG_ASSIGN_OR_RETURN(double v, cur.Read<double>("f64 value"));
      out->float_value = v;
      return absl::OkStatus();
    }
    case GgufValueType::kBool: {
      MAGICPIG_ASSIGN_OR_RETURN(uint8_t v, cur.Read<uint8_t>("bool value"));
      if (v > 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "bool value ", static_cast<int>(v), " is neither 0 nor 1 at byte offset ", start));
      }
      out->bool_value = v == 1;
      return absl::OkStatus();
    }
    case GgufValueType::kString: {
      MAGICPIG_ASSIGN_OR_RETURN(out->string_value, cur.ReadString("string value"));
      return absl::OkStatus();
    }
    case GgufValueType::kArray:
      return ReadArray(cur, depth, out);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown value type ", static_cast<uint32_t>(type), " at byte offset ", start));
}

absl::Status TypeMismatch(std::string_view key, const GgufValue& v, std::string_view wanted) {
  std::string got = ValueTypeName(v.type);
  if (v.type == GgufValueType::kArray) absl::StrAppend(&got, " of ", ValueTypeName(v.array_type));
  return absl::InvalidArgumentError(
      absl::StrCat("GGUF metadata key '", Sv(key), "' has type ", got, ", expected ", Sv(wanted)));
}

// The integer held by an integer-typed value, range-checked into int64.
absl::StatusOr<int64_t> IntOf(std::string_view key, const GgufValue& v) {
  if (!IsIntegerType(v.type)) return TypeMismatch(key, v, "an integer");
  if (v.type == GgufValueType::kU64 &&
      v.uint_value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF metadata key '", Sv(key), "' value ",
                                                   v.uint_value, " does not fit in int64"));
  }
  return v.int_value;
}

absl::StatusOr<double> FloatOf(std::string_view key, const GgufValue& v) {
  if (v.type == GgufValueType::kF32 || v.type == GgufValueType::kF64) return v.float_value;
  if (v.type == GgufValueType::kU64) return static_cast<double>(v.uint_value);
  if (IsIntegerType(v.type)) return static_cast<double>(v.int_value);
  return TypeMismatch(key, v, "a number");
}

// double -> float without the undefined behaviour of an out-of-range conversion.
float NarrowToFloat(double x) {
  constexpr double kMax = std::numeric_limits<float>::max();
  if (x > kMax) return std::numeric_limits<float>::infinity();
  if (x < -kMax) return -std::numeric_limits<float>::infinity();
  return static_cast<float>(x);  // in range, or NaN (which converts to NaN)
}

bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace

int64_t GgufTensor::num_elements() const {
  // Dims were checked at parse time: non-negative, product fits int64.
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

namespace {

// Reads the whole of fd into anonymous memory starting on a 2 MiB boundary, advised for
// transparent huge pages; *mapping/*mapping_bytes receive what to munmap. Left writable: Open
// makes it read-only once the tensors are parsed (and interleaved, if asked).
absl::StatusOr<const uint8_t*> ReadIntoMemory(int fd, const std::string& path, size_t size,
                                              void** mapping, size_t* mapping_bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t bytes = size + kHuge;
  void* m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("cannot allocate ", size, " bytes to read GGUF file '",
                                            path, "': ", std::strerror(errno)));
  }
  const uintptr_t aligned = (reinterpret_cast<uintptr_t>(m) + kHuge - 1) & ~(kHuge - 1);
  uint8_t* base = reinterpret_cast<uint8_t*>(aligned);
  (void)::madvise(base, (size + kHuge - 1) & ~(kHuge - 1), MADV_HUGEPAGE);  // advice only
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, base + done, std::min<size_t>(size - done, size_t{1} << 30),
                              static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::munmap(m, bytes);
      return absl::InternalError(
          absl::StrCat("cannot read GGUF file '", path, "': ", std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  *mapping = m;
  *mapping_bytes = bytes;
  return base;
}

}  // namespace

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path, GgufLoad load) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("cannot open GGUF file '", path, "': ", std::strerror(errno)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not a regular file"));
  }
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->size_ = static_cast<uint64_t>(st.st_size);
  const bool read = load == GgufLoad::kRead || load == GgufLoad::kReadInterleaved;
  if (f->size_ > 0 && read) {
    absl::StatusOr<const uint8_t*> base =
        ReadIntoMemory(fd, path, static_cast<size_t>(f->size_), &f->mapping_, &f->mapping_bytes_);
    ::close(fd);
    if (!base.ok()) return base.status();
    f->base_ = *base;
  } else if (f->size_ > 0) {
    void* m = ::mmap(nullptr, static_cast<size_t>(f->size_), PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::InternalError(
          absl::StrCat("cannot map GGUF file '", path, "': ", std::strerror(err)));
    }
    f->mapping_ = m;
    f->mapping_bytes_ = static_cast<size_t>(f->size_);
    f->base_ = static_cast<const uint8_t*>(m);
    ::close(fd);  // the mapping stays valid without the descriptor
  } else {
    ::close(fd);
  }
  absl::Status s = f->Parse();
  if (!s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF file '", path, "': ", s.message()));
  }
  if (f->size_ > 0 && load == GgufLoad::kReadInterleaved) {
    for (GgufTensor& t : f->tensors_) {
      if (t.dims.size() != 2 || !CanInterleave(t.type, t.dims[1], t.dims[0])) continue;
      // The data lies in our own writable copy (kRead); Parse checked it lies inside the file.
      MAGICPIG_RETURN_IF_ERROR(
          Interleave(t.type, const_cast<uint8_t*>(t.data), t.dims[1], t.dims[0]));
      t.layout = WeightLayout::kRows16;
    }
  }
  if (f->size_ > 0 && read) {
    (void)::mprotect(f->mapping_, f->mapping_bytes_, PROT_READ);  // immutable, as a mapping
  }
  return f;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::FromBytes(std::string_view bytes) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  // An exact-size aligned buffer (not a padded one) so sanitizers catch any read past the end.
  auto* buf = static_cast<uint8_t*>(::operator new(bytes.size(), kCopyAlignment));
  if (!bytes.empty()) std::memcpy(buf, bytes.data(), bytes.size());
  f->owned_ = buf;
  f->base_ = buf;
  f->size_ = bytes.size();
  absl::Status s = f->Parse();
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("GGUF: ", s.message()));
  return f;
}

GgufFile::~GgufFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_bytes_);
  if (owned_ != nullptr) ::operator delete(owned_, kCopyAlignment);
}

absl::Status GgufFile::Parse() {
  Cursor cur(base_, size_);

  // Header.
  MAGICPIG_RETURN_IF_ERROR(cur.Need(4, "magic"));
  if (std::memcmp(base_, "GGUF", 4) != 0) {
    return absl::InvalidArgumentError("bad magic at byte offset 0 (expected 'GGUF')");
  }
  (void)cur.Read<uint32_t>("magic");
  MAGICPIG_ASSIGN_OR_RETURN(version_, cur.Read<uint32_t>("version"));
  if (version_ != 2 && version_ != 3) {
    // A big-endian file reads as a version with its low 16 bits zero.
    const bool maybe_big_endian = version_ != 0 && (version_ & 0xFFFF) == 0;
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported version ", version_, " at byte offset 4 (2 and 3 accepted",
                     maybe_big_endian ? "; this looks like a big-endian file)" : ")"));
  }
  MAGICPIG_ASSIGN_OR_RETURN(uint64_t n_tensors, cur.Read<uint64_t>("tensor count"));
  MAGICPIG_ASSIGN_OR_RETURN(uint64_t n_kv, cur.Read<uint64_t>("metadata count"));
  // Minimal encodings: a key/value is >= 13 bytes (u64 key length, u32 type, 1-byte value); a
  // tensor info is >= 24 bytes (u64 name length, u32 n_dims, u32 type, u64 offset).
  if (n_kv > cur.remaining() / 13) {
    return absl::InvalidArgumentError(
        absl::StrCat("metadata count ", n_kv, " at byte offset 16 runs past the end of the file"));
  }
  if (n_tensors > cur.remaining() / 24) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor count ", n_tensors, " at byte offset 8 runs past the end of the file"));
  }

  // Metadata.
  key_order_.reserve(static_cast<size_t>(n_kv));
  for (uint64_t i = 0; i < n_kv; ++i) {
    const uint64_t entry_start = cur.pos();
    MAGICPIG_ASSIGN_OR_RETURN(std::string key, cur.ReadString("metadata key"));
    if (values_.contains(key)) {
      return absl::InvalidArgumentError(
          absl::StrCat("duplicate metadata key '", key, "' at byte offset ", entry_start));
    }
    const uint64_t type_pos = cur.pos();
    MAGICPIG_ASSIGN_OR_RETURN(uint32_t type_code, cur.Read<uint32_t>("metadata value type"));
    if (!IsValidValueType(type_code)) {
      return absl::InvalidArgumentError(absl::StrCat("metadata key '", key,
                                                     "': unknown value type ", type_code,
                                                     " at byte offset ", type_pos));
    }
    GgufValue value;
    absl::Status s = ReadValue(cur, static_cast<GgufValueType>(type_code), 0, &value);
    if (!s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("metadata key '", key, "': ", s.message()));
    }
    key_order_.push_back(key);
    values_.emplace(std::move(key), std::move(value));
  }

  // Alignment.
  alignment_ = kDefaultAlignment;
  if (const GgufValue* a = FindValue("general.alignment"); a != nullptr) {
    if (a->type != GgufValueType::kU32) {
      return absl::InvalidArgumentError(
          absl::StrCat("general.alignment has type ", ValueTypeName(a->type), ", expected u32"));
    }
    if (!IsPowerOfTwo(a->uint_value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("general.alignment ", a->uint_value, " is not a non-zero power of two"));
    }
    alignment_ = static_cast<uint32_t>(a->uint_value);
  }

  // Tensor infos.
  tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    const uint64_t info_start = cur.pos();
    GgufTensor t;
    MAGICPIG_ASSIGN_OR_RETURN(t.name, cur.ReadString("tensor name"));
    auto bad = [&](auto&&... parts) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name, "' (info at byte offset ", info_start, "): ", parts...));
    };
    if (t.name.size() > kMaxTensorName) {
      return bad("name is ", t.name.size(), " bytes long, more than ", kMaxTensorName);
    }
    if (tensor_index_.contains(t.name)) return bad("duplicate tensor name");
    MAGICPIG_ASSIGN_OR_RETURN(uint32_t n_dims, cur.Read<uint32_t>("tensor n_dims"));
    if (n_dims > kMaxDims) return bad("n_dims ", n_dims, " is more than ", kMaxDims);
    int64_t n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      MAGICPIG_ASSIGN_OR_RETURN(uint64_t raw, cur.Read<uint64_t>("tensor dim"));
      const auto dim = static_cast<int64_t>(raw);
      if (dim < 0) return bad("dim ", d, " is negative (", dim, ")");
      if (dim != 0 && n_elements > std::numeric_limits<int64_t>::max() / dim) {
        return bad("element count overflows int64 at dim ", d);
      }
      n_elements *= dim;
      t.dims.push_back(dim);
    }
    MAGICPIG_ASSIGN_OR_RETURN(uint32_t type_code, cur.Read<uint32_t>("tensor type"));
    const std::optional<GgmlTypeInfo> info = LookupGgmlType(type_code);
    if (!info.has_value() || info->block_size <= 0 || info->block_bytes <= 0) {
      return bad("unknown ggml type code ", type_code);
    }
    t.type = static_cast<GgmlType>(type_code);
    const int64_t ne0 = t.dims.empty() ? 1 : t.dims[0];
    if (ne0 % info->block_size != 0) {
      return bad("dims[0] = ", ne0, " is not a multiple of the ", Sv(info->name), " block size ",
                 info->block_size);
    }
    // Bytes = (elements / block_size) * block_bytes; elements is a multiple of the block size
    // because dims[0] is.
    uint64_t size_bytes = 0;
    if (__builtin_mul_overflow(static_cast<uint64_t>(n_elements / info->block_size),
                               static_cast<uint64_t>(info->block_bytes), &size_bytes) ||
        size_bytes > std::numeric_limits<size_t>::max()) {
      return bad("byte size overflows");
    }
    t.size_bytes = size_bytes;
    MAGICPIG_ASSIGN_OR_RETURN(t.offset, cur.Read<uint64_t>("tensor offset"));
    if (t.offset % alignment_ != 0) {
      return bad("offset ", t.offset, " is not a multiple of the alignment ", alignment_);
    }
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // Tensor data starts at the next multiple of the alignment.
  const uint64_t info_end = cur.pos();
  const uint64_t data_start = (info_end + alignment_ - 1) / alignment_ * alignment_;
  // info_end <= size_ < 2^63 on any real input and alignment_ <= 2^31, so no wrap-around above.
  for (GgufTensor& t : tensors_) {
    const uint64_t avail = data_start <= size_ ? size_ - data_start : 0;
    if (data_start > size_ || t.offset > avail || t.size_bytes > avail - t.offset) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name, "' data [", t.offset, ", +", t.size_bytes,
                       ") relative to the data section at byte offset ", data_start,
                       " runs past the end of the file (size ", size_, ")"));
    }
    t.data = base_ + data_start + t.offset;
  }
  return absl::OkStatus();
}

const GgufValue* GgufFile::FindValue(std::string_view key) const {
  auto it = values_.find(absl::string_view(key.data(), key.size()));
  return it == values_.end() ? nullptr : &it->second;
}

const GgufTensor* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(absl::string_view(name.data(), name.size()));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {
absl::Status Missing(std::string_view key) {
  return absl::NotFoundError(absl::StrCat("GGUF metadata key '", Sv(key), "' not found"));
}
}  // namespace

absl::StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  const GgufValue* v = FindValue(key);
  if (v == nullptr) return Missing(key);
  return IntOf(key, *v);
}

absl::StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  const GgufValue* v = FindValue(key);
  if (v == nullptr) return Missing(key);
  return FloatOf(key, *v);
}

absl::StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  const GgufValue* v = FindValue(key);
  if (v == nullptr) return Missing(key);
  if (v->type != GgufValueType::kBool) return TypeMismatch(key, *v, "bool");
  return v->bool_value;
}

absl::StatusOr<std::string> GgufFile::GetString(std::string_view key) const {
  const GgufValue* v = FindValue(key);
  if (v == nullptr) return Missing(key);
  if (v->type != GgufValueType::kString) return TypeMismatch(key, *v, "string");
  return v->string_value;
}

absl::StatusOr<std::vector<std::string>> GgufFile::GetStringArray(std::string_view key) const {
  const GgufValue* v = FindValue(key);
  if (v == nullptr) return Missing(key);
  if (v->type != GgufValueType::kArray || v->array_type != GgufValueType::kString) {
    return TypeMismatch(key, *v, "array of string");
  }
  std::vector<std::string> out;
  out.reserve(v->array.size());
  for (const GgufValue& e : v->array) out.push_back(e.string_value);
  return out;
}

absl::StatusOr<std::vector<int64_t>> GgufFile::GetIntArray(std::string_view key) const {
  const GgufValue* v = FindValue(key);
  if (v == nullptr) return Missing(key);
  if (v->type != GgufValueType::kArray || !IsIntegerType(v->array_type)) {
    return TypeMismatch(key, *v, "array of integers");
  }
  std::vector<int64_t> out;
  out.reserve(v->array.size());
  for (const GgufValue& e : v->array) {
    MAGICPIG_ASSIGN_OR_RETURN(int64_t x, IntOf(key, e));
    out.push_back(x);
  }
  return out;
}

absl::StatusOr<std::vector<float>> GgufFile::GetFloatArray(std::string_view key) const {
  const GgufValue* v = FindValue(key);
  if (v == nullptr) return Missing(key);
  if (v->type != GgufValueType::kArray ||
      !(v->array_type == GgufValueType::kF32 || v->array_type == GgufValueType::kF64 ||
        IsIntegerType(v->array_type))) {
    return TypeMismatch(key, *v, "array of numbers");
  }
  std::vector<float> out;
  out.reserve(v->array.size());
  for (const GgufValue& e : v->array) {
    MAGICPIG_ASSIGN_OR_RETURN(double x, FloatOf(key, e));
    out.push_back(NarrowToFloat(x));
  }
  return out;
}

}  // namespace magicpig::model
