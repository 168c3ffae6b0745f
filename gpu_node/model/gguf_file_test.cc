// Tests of the GGUF reader: round trips through the test writer, every rejection path, every
// truncation of a valid file, the synthetic model with ReadModelConfig, and the real SmolLM2 file
// when it is present.
#include "gpu_node/model/gguf_file.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "common/half.h"
#include "gmock/gmock.h"
#include "gpu_node/model/model_config.h"
#include "gtest/gtest.h"
#include "tests/testing/gguf_writer.h"
#include "tests/testing/synthetic_model.h"

namespace magicpig::model {
namespace {

using ::magicpig::testing::AppendGgufString;
using ::magicpig::testing::AppendU32;
using ::magicpig::testing::AppendU64;
using ::magicpig::testing::GgufLayout;
using ::magicpig::testing::GgufWriter;
using ::testing::HasSubstr;

std::string Bytes(size_t n, uint8_t seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + 7 * i);
  return s;
}

std::unique_ptr<GgufFile> ParseOk(const std::string& image) {
  absl::StatusOr<std::unique_ptr<GgufFile>> f = GgufFile::FromBytes(image);
  EXPECT_TRUE(f.ok()) << f.status();
  return f.ok() ? *std::move(f) : nullptr;
}

TEST(GgufFileTest, RoundTripsEveryMetadataType) {
  GgufWriter w;
  w.AddU8("t.u8", 200);
  w.AddI8("t.i8", -100);
  w.AddU16("t.u16", 60000);
  w.AddI16("t.i16", -30000);
  w.AddU32("t.u32", 4000000000u);
  w.AddI32("t.i32", -2000000000);
  w.AddU64("t.u64", uint64_t{1} << 40);
  w.AddI64("t.i64", -(int64_t{1} << 50));
  w.AddF32("t.f32", 0.25f);
  w.AddF64("t.f64", -1.0e-300);
  w.AddBool("t.bool_true", true);
  w.AddBool("t.bool_false", false);
  w.AddString("t.string", "h\xC3\xA9llo");
  w.AddString("t.empty", "");
  w.AddStringArray("t.strings", {"a", "", "Ġ t"});
  w.AddIntArray("t.i32s", GgufValueType::kI32, {1, -2, 3});
  w.AddIntArray("t.u8s", GgufValueType::kU8, {0, 255});
  w.AddIntArray("t.u64s", GgufValueType::kU64, {7, 1 << 30});
  w.AddF32Array("t.f32s", {1.5f, -2.0f});
  w.AddF64Array("t.f64s", {3.25});
  w.AddBoolArray("t.bools", {true, false});
  // A nested array: array of 2 arrays of u16.
  std::string nested;
  AppendU32(&nested, static_cast<uint32_t>(GgufValueType::kArray));
  AppendU64(&nested, 2);
  for (int i = 0; i < 2; ++i) {
    AppendU32(&nested, static_cast<uint32_t>(GgufValueType::kU16));
    AppendU64(&nested, 1);
    nested.push_back(static_cast<char>(10 + i));
    nested.push_back('\0');
  }
  w.AddRaw("t.nested", static_cast<uint32_t>(GgufValueType::kArray), nested);

  auto f = ParseOk(w.Build());
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->keys().size(), 22u);
  EXPECT_EQ(f->keys().front(), "t.u8");
  EXPECT_EQ(f->keys().back(), "t.nested");

  EXPECT_EQ(*f->GetInt("t.u8"), 200);
  EXPECT_EQ(*f->GetInt("t.i8"), -100);
  EXPECT_EQ(*f->GetInt("t.u16"), 60000);
  EXPECT_EQ(*f->GetInt("t.i16"), -30000);
  EXPECT_EQ(*f->GetInt("t.u32"), 4000000000);
  EXPECT_EQ(*f->GetInt("t.i32"), -2000000000);
  EXPECT_EQ(*f->GetInt("t.u64"), int64_t{1} << 40);
  EXPECT_EQ(*f->GetInt("t.i64"), -(int64_t{1} << 50));
  EXPECT_EQ(f->FindValue("t.u8")->type, GgufValueType::kU8);
  EXPECT_EQ(f->FindValue("t.i64")->type, GgufValueType::kI64);
  EXPECT_EQ(*f->GetFloat("t.f32"), 0.25);
  EXPECT_EQ(*f->GetFloat("t.f64"), -1.0e-300);
  EXPECT_EQ(*f->GetFloat("t.i32"), -2000000000.0);  // integers are accepted as numbers
  EXPECT_TRUE(*f->GetBool("t.bool_true"));
  EXPECT_FALSE(*f->GetBool("t.bool_false"));
  EXPECT_EQ(*f->GetString("t.string"), "h\xC3\xA9llo");
  EXPECT_EQ(*f->GetString("t.empty"), "");
  EXPECT_THAT(*f->GetStringArray("t.strings"), ::testing::ElementsAre("a", "", "Ġ t"));
  EXPECT_THAT(*f->GetIntArray("t.i32s"), ::testing::ElementsAre(1, -2, 3));
  EXPECT_THAT(*f->GetIntArray("t.u8s"), ::testing::ElementsAre(0, 255));
  EXPECT_THAT(*f->GetIntArray("t.u64s"), ::testing::ElementsAre(7, 1 << 30));
  EXPECT_THAT(*f->GetFloatArray("t.f32s"), ::testing::ElementsAre(1.5f, -2.0f));
  EXPECT_THAT(*f->GetFloatArray("t.f64s"), ::testing::ElementsAre(3.25f));
  const GgufValue* bools = f->FindValue("t.bools");
  ASSERT_NE(bools, nullptr);
  EXPECT_EQ(bools->array_type, GgufValueType::kBool);
  ASSERT_EQ(bools->array.size(), 2u);
  EXPECT_TRUE(bools->array[0].bool_value);
  EXPECT_FALSE(bools->array[1].bool_value);
  const GgufValue* n = f->FindValue("t.nested");
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(n->array_type, GgufValueType::kArray);
  ASSERT_EQ(n->array.size(), 2u);
  EXPECT_EQ(n->array[1].array_type, GgufValueType::kU16);
  ASSERT_EQ(n->array[1].array.size(), 1u);
  EXPECT_EQ(n->array[1].array[0].int_value, 11);
  EXPECT_TRUE(f->tensors().empty());
}

TEST(GgufFileTest, GettersReportAbsentKeysAndTypeMismatches) {
  GgufWriter w;
  w.AddString("s", "x");
  w.AddU64("big", std::numeric_limits<uint64_t>::max());
  w.AddF32("f", 1.0f);
  w.AddIntArray("ints", GgufValueType::kU64, {1, static_cast<int64_t>(uint64_t{1} << 63)});
  auto f = ParseOk(w.Build());
  ASSERT_NE(f, nullptr);

  EXPECT_EQ(f->GetInt("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(f->GetString("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(f->GetStringArray("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(f->HasKey("nope"));
  EXPECT_EQ(f->FindValue("nope"), nullptr);

  for (const absl::Status& s : {f->GetInt("s").status(), f->GetFloat("s").status(),
                                f->GetBool("s").status(), f->GetStringArray("s").status(),
                                f->GetIntArray("s").status(), f->GetFloatArray("s").status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("'s'"));
  }
  EXPECT_EQ(f->GetString("f").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f->GetInt("f").status().code(), absl::StatusCode::kInvalidArgument);
  // A u64 above INT64_MAX parses but does not fit GetInt.
  absl::Status big = f->GetInt("big").status();
  EXPECT_EQ(big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(big.message(), HasSubstr("big"));
  EXPECT_EQ(f->FindValue("big")->uint_value, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(*f->GetFloat("big"), 18446744073709551615.0);
  EXPECT_EQ(f->GetIntArray("ints").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GgufFileTest, RoundTripsTensorsWithDefaultAlignment) {
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  const std::string a = Bytes(4 * 4 * 3, 1);   // F32 [4, 3]
  const std::string b = Bytes(34 * 2 * 2, 2);  // Q8_0 [64, 2]
  const std::string c = Bytes(2 * 5, 3);       // F16 [5]: 10 bytes, padded
  const std::string d = Bytes(20 * 3, 4);      // Q4_1 [32, 3]
  w.AddTensor("a", {4, 3}, GgmlType::kF32, a);
  w.AddTensor("b", {64, 2}, GgmlType::kQ8_0, b);
  w.AddTensor("c", {5}, GgmlType::kF16, c);
  w.AddTensor("d", {32, 1, 3, 1}, GgmlType::kQ4_1, d);
  GgufLayout layout;
  const std::string image = w.Build(&layout);
  auto f = ParseOk(image);
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(f->tensors().size(), 4u);
  EXPECT_EQ(f->file_size(), image.size());

  const std::vector<std::string> data = {a, b, c, d};
  for (size_t i = 0; i < 4; ++i) {
    const GgufTensor& t = f->tensors()[i];
    EXPECT_EQ(f->FindTensor(t.name), &t);
    EXPECT_EQ(t.offset % 32, 0u) << t.name;
    EXPECT_EQ(t.offset, layout.tensor_data_offsets[i] - layout.data_start);
    EXPECT_EQ(t.size_bytes, data[i].size()) << t.name;
    ASSERT_NE(t.data, nullptr);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(t.data), t.size_bytes), data[i]);
    // The copy is aligned, so data is aligned in memory as in the file.
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 32, 0u) << t.name;
  }
  const GgufTensor* tb = f->FindTensor("b");
  ASSERT_NE(tb, nullptr);
  EXPECT_EQ(tb->type, GgmlType::kQ8_0);
  EXPECT_THAT(tb->dims, ::testing::ElementsAre(64, 2));
  EXPECT_EQ(tb->num_elements(), 128);
  EXPECT_THAT(f->FindTensor("d")->dims, ::testing::ElementsAre(32, 1, 3, 1));
  EXPECT_EQ(f->FindTensor("d")->num_elements(), 96);
  EXPECT_EQ(f->FindTensor("c")->type, GgmlType::kF16);
  // Consecutive tensors: c (10 bytes) is padded to 32 before d.
  EXPECT_EQ(f->FindTensor("d")->offset - f->FindTensor("c")->offset, 32u);
  EXPECT_EQ(f->FindTensor("zzz"), nullptr);
}

TEST(GgufFileTest, HonoursCustomAlignment) {
  for (uint32_t align : {1u, 8u, 64u, 256u}) {
    GgufWriter w;
    w.AddU32("general.alignment", align);
    w.AddTensor("x", {3}, GgmlType::kF32, Bytes(12, 5));
    w.AddTensor("y", {5}, GgmlType::kF32, Bytes(20, 6));
    GgufLayout layout;
    const std::string image = w.Build(&layout);
    EXPECT_EQ(layout.data_start % align, 0u);
    auto f = ParseOk(image);
    ASSERT_NE(f, nullptr);
    EXPECT_EQ(f->alignment(), align);
    const GgufTensor* y = f->FindTensor("y");
    ASSERT_NE(y, nullptr);
    EXPECT_EQ(y->offset, (12 + align - 1) / align * align);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(y->data), 20), Bytes(20, 6));
  }
}

TEST(GgufFileTest, AcceptsVersion2) {
  GgufWriter w;
  w.options().version = 2;
  w.AddU32("k", 1);
  auto f = ParseOk(w.Build());
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->version(), 2u);
}

TEST(GgufFileTest, AcceptsZeroSizedTensorAtTheEnd) {
  GgufWriter w;
  w.AddTensor("empty", {0, 4}, GgmlType::kQ8_0, "");
  auto f = ParseOk(w.Build());
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->tensors()[0].size_bytes, 0u);
  EXPECT_EQ(f->tensors()[0].num_elements(), 0);
}

TEST(GgufFileTest, OpenMapsAFile) {
  GgufWriter w;
  w.AddString("general.name", "mapped");
  w.AddTensor("t", {8}, GgmlType::kF32, Bytes(32, 9));
  const std::string path = testing::TempPath("open.gguf");
  ASSERT_TRUE(w.WriteToFile(path).ok());
  absl::StatusOr<std::unique_ptr<GgufFile>> f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(*(*f)->GetString("general.name"), "mapped");
  const GgufTensor* t = (*f)->FindTensor("t");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(t->data), 32), Bytes(32, 9));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data) % 32, 0u);  // the mapping is page-aligned
  std::filesystem::remove(path);
}

TEST(GgufFileTest, ReadInterleavedConvertsExactlyTheMatricesThatCan) {
  // Arbitrary bytes: the conversion is a lossless permutation of any Q4_K / Q6_K / Q4_1 / Q8_0
  // block.
  struct T {
    std::string name;
    std::vector<int64_t> dims;
    GgmlType type;
    std::string bytes;
    bool converted;
  };
  const std::vector<T> tensors = {
      {"q4k_32", {256, 32}, GgmlType::kQ4_K, Bytes(32 * 144, 3), true},
      {"q6k_16", {512, 16}, GgmlType::kQ6_K, Bytes(16 * 420, 5), true},
      {"q41_32", {64, 32}, GgmlType::kQ4_1, Bytes(32 * 40, 8), true},
      {"q80_16", {32, 16}, GgmlType::kQ8_0, Bytes(16 * 34, 10), true},
      {"q40_16", {64, 16}, GgmlType::kQ4_0, Bytes(16 * 36, 9), false},    // no such kernel
      {"q4k_15", {256, 15}, GgmlType::kQ4_K, Bytes(15 * 144, 4), false},  // not whole groups
      {"q5k_16", {256, 16}, GgmlType::kQ5_K, Bytes(16 * 176, 7), false},  // no such kernel
      {"vec", {256}, GgmlType::kQ4_K, Bytes(144, 6), false},              // not a matrix
  };
  GgufWriter w;
  for (const T& t : tensors) w.AddTensor(t.name, t.dims, t.type, t.bytes);
  const std::string path = testing::TempPath("interleave.gguf");
  ASSERT_TRUE(w.WriteToFile(path).ok());
  for (GgufLoad load : {GgufLoad::kMap, GgufLoad::kRead, GgufLoad::kReadInterleaved}) {
    absl::StatusOr<std::unique_ptr<GgufFile>> f = GgufFile::Open(path, load);
    ASSERT_TRUE(f.ok()) << f.status();
    for (const T& want : tensors) {
      const GgufTensor* t = (*f)->FindTensor(want.name);
      ASSERT_NE(t, nullptr);
      const std::string stored(reinterpret_cast<const char*>(t->data), want.bytes.size());
      if (load == GgufLoad::kReadInterleaved && want.converted) {
        ASSERT_EQ(t->layout, WeightLayout::kRows16) << want.name;
        EXPECT_NE(stored, want.bytes) << want.name;
        const size_t row_bytes = want.bytes.size() / static_cast<size_t>(want.dims[1]);
        std::string row(row_bytes, '\0');
        for (int64_t r = 0; r < want.dims[1]; ++r) {
          DeinterleaveRow(want.type, t->data, want.dims[0], r,
                          reinterpret_cast<uint8_t*>(row.data()));
          ASSERT_EQ(row, want.bytes.substr(static_cast<size_t>(r) * row_bytes, row_bytes))
              << want.name << " row " << r;
        }
      } else {
        EXPECT_EQ(t->layout, WeightLayout::kRowMajor) << want.name;
        EXPECT_EQ(stored, want.bytes) << want.name;
      }
    }
  }
  std::filesystem::remove(path);
}

TEST(GgufFileTest, OpenReportsMissingAndMalformedFiles) {
  absl::StatusOr<std::unique_ptr<GgufFile>> missing = GgufFile::Open("/nonexistent/x.gguf");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("/nonexistent/x.gguf"));

  const std::string path = testing::TempPath("bad.gguf");
  ASSERT_TRUE(testing::WriteBytesToFile(path, "GGML\3\0\0\0").ok());
  absl::StatusOr<std::unique_ptr<GgufFile>> bad = GgufFile::Open(path);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("magic"));
  EXPECT_THAT(bad.status().message(), HasSubstr(path));
  ASSERT_TRUE(testing::WriteBytesToFile(path, "").ok());
  EXPECT_EQ(GgufFile::Open(path).status().code(), absl::StatusCode::kInvalidArgument);
  std::filesystem::remove(path);
}

// One malformed image and the words its error must contain.
struct BadCase {
  std::string name;
  std::string image;
  std::vector<std::string> words;
};

std::vector<BadCase> BadCases() {
  std::vector<BadCase> cases;
  auto add = [&](std::string name, const GgufWriter& w, std::vector<std::string> words) {
    cases.push_back({std::move(name), w.Build(), std::move(words)});
  };
  const uint32_t kArray = static_cast<uint32_t>(GgufValueType::kArray);
  {
    GgufWriter w;
    w.options().magic = "GGUX";
    add("magic", w, {"magic", "offset 0"});
  }
  for (uint32_t v : {0u, 1u, 4u}) {
    GgufWriter w;
    w.options().version = v;
    add("version" + std::to_string(v), w, {"version " + std::to_string(v)});
  }
  {
    GgufWriter w;
    w.options().version = 0x03000000;  // a big-endian version 3
    add("big_endian", w, {"version", "big-endian"});
  }
  {
    GgufWriter w;
    w.AddU32("a.b", 1);
    w.AddString("a.b", "again");
    add("duplicate_key", w, {"duplicate", "'a.b'", "offset 43"});
  }
  {
    GgufWriter w;
    w.AddTensor("w", {8}, GgmlType::kF32, Bytes(32, 1));
    w.AddTensor("w", {8}, GgmlType::kF32, Bytes(32, 1));
    add("duplicate_tensor", w, {"duplicate tensor name", "'w'"});
  }
  for (uint32_t a : {0u, 3u, 48u}) {
    GgufWriter w;
    w.AddU32("general.alignment", a);
    w.options().padding_alignment = 32;
    add("alignment" + std::to_string(a), w, {"alignment", "power of two"});
  }
  {
    GgufWriter w;
    w.AddU64("general.alignment", 32);
    add("alignment_type", w, {"general.alignment", "u32"});
  }
  {
    GgufWriter w;
    w.AddTensor("five_dims", {1, 1, 1, 1, 8}, GgmlType::kF32, Bytes(32, 1));
    add("n_dims", w, {"five_dims", "n_dims 5"});
  }
  {
    GgufWriter w;
    w.AddTensor("neg", {8, -1}, GgmlType::kF32, Bytes(32, 1));
    add("negative_dim", w, {"neg", "negative"});
  }
  {
    GgufWriter w;
    w.AddTensor("huge", {int64_t{1} << 32, int64_t{1} << 32}, GgmlType::kF32, "");
    add("element_overflow", w, {"huge", "overflows int64"});
  }
  {
    GgufWriter w;
    w.AddTensor("bytes", {int64_t{1} << 61, 2}, GgmlType::kF32, "");
    add("byte_overflow", w, {"bytes", "byte size overflows"});
  }
  for (uint32_t code : {4u, 31u, 1000u}) {
    GgufWriter w;
    w.AddRawTensor("odd", {8}, code, Bytes(32, 1));
    add("type" + std::to_string(code), w,
        {"odd", "unknown ggml type code " + std::to_string(code)});
  }
  {
    GgufWriter w;
    w.AddTensor("q", {33, 2}, GgmlType::kQ8_0, Bytes(68, 1));
    add("block_size", w, {"'q'", "dims[0] = 33", "Q8_0 block size 32"});
  }
  {
    GgufWriter w;
    w.AddTensor("misaligned", {8}, GgmlType::kF32, Bytes(32, 1), /*offset=*/4);
    add("offset_alignment", w, {"misaligned", "offset 4", "alignment 32"});
  }
  {
    GgufWriter w;
    w.AddTensor("far", {8}, GgmlType::kF32, Bytes(32, 1), /*offset=*/4096);
    add("data_past_end", w, {"far", "past the end"});
  }
  {
    GgufWriter w;
    w.AddTensor("short", {16}, GgmlType::kF32, Bytes(32, 1));  // needs 64 bytes, has 32
    add("data_short", w, {"short", "past the end"});
  }
  {
    GgufWriter w;
    std::string v;
    AppendU64(&v, uint64_t{1} << 60);
    w.AddRaw("long.string", static_cast<uint32_t>(GgufValueType::kString), v);
    add("string_length", w, {"long.string", "past the end"});
  }
  {
    GgufWriter w;
    std::string v;
    AppendU32(&v, static_cast<uint32_t>(GgufValueType::kU32));
    AppendU64(&v, uint64_t{1} << 61);
    w.AddRaw("long.array", kArray, v);
    add("array_length", w, {"long.array", "past the end"});
  }
  {
    GgufWriter w;
    std::string v;
    AppendU32(&v, static_cast<uint32_t>(GgufValueType::kString));
    AppendU64(&v, 1);
    AppendU64(&v, 1000);  // the only string claims 1000 bytes
    w.AddRaw("array.of.long.string", kArray, v);
    add("array_string_length", w, {"array.of.long.string", "past the end"});
  }
  {
    GgufWriter w;
    std::string v;
    for (int i = 0; i < 20; ++i) {
      AppendU32(&v, kArray);
      AppendU64(&v, 1);
    }
    AppendU32(&v, static_cast<uint32_t>(GgufValueType::kU8));
    AppendU64(&v, 0);
    w.AddRaw("deep", kArray, v);
    add("nesting", w, {"deep", "nested"});
  }
  {
    GgufWriter w;
    w.AddTensor(std::string(65, 'n'), {8}, GgmlType::kF32, Bytes(32, 1));
    add("long_name", w, {"65 bytes", "64"});
  }
  {
    GgufWriter w;
    w.AddRaw("flag", static_cast<uint32_t>(GgufValueType::kBool), std::string(1, '\2'));
    add("bool", w, {"flag", "bool value 2"});
  }
  {
    GgufWriter w;
    w.AddRaw("what", 13, "x");
    add("value_type", w, {"what", "unknown value type 13"});
  }
  {
    GgufWriter w;
    std::string v;
    AppendU32(&v, 99);
    AppendU64(&v, 0);
    w.AddRaw("arr", kArray, v);
    add("array_type", w, {"arr", "unknown array element type 99"});
  }
  {
    GgufWriter w;
    w.options().kv_count = uint64_t{1} << 62;
    add("kv_count", w, {"metadata count"});
  }
  {
    GgufWriter w;
    w.options().tensor_count = uint64_t{1} << 62;
    add("tensor_count", w, {"tensor count"});
  }
  {
    GgufWriter w;
    w.options().kv_count = 2;           // one entry present
    w.options().padding_alignment = 1;  // no zero padding that would read as an entry
    w.AddU32("only", 1);
    add("kv_missing", w, {"metadata count 2"});
  }
  return cases;
}

TEST(GgufFileTest, RejectsEveryMalformation) {
  for (const BadCase& c : BadCases()) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<std::unique_ptr<GgufFile>> f = GgufFile::FromBytes(c.image);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
    for (const std::string& word : c.words) {
      EXPECT_THAT(f.status().message(), HasSubstr(word));
    }
  }
}

TEST(GgufFileTest, RejectsMetadataArraysTooLargeToDecode) {
  // 3 x 1.5M one-byte elements: each array fits in the file, together they exceed the 4M cap on
  // decoded elements (each costs ~100 bytes of memory once decoded).
  GgufWriter w;
  const std::vector<int64_t> big(1500000, 7);
  w.AddIntArray("a", GgufValueType::kU8, big);
  w.AddIntArray("b", GgufValueType::kU8, big);
  w.AddIntArray("c", GgufValueType::kU8, big);
  auto f = GgufFile::FromBytes(w.Build());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(f.status().message(), HasSubstr("metadata arrays hold more than"));
  // Two of them are fine.
  GgufWriter ok;
  ok.AddIntArray("a", GgufValueType::kU8, big);
  ok.AddIntArray("b", GgufValueType::kU8, big);
  EXPECT_TRUE(GgufFile::FromBytes(ok.Build()).ok());
}

TEST(GgufFileTest, TensorNameOf64BytesIsAccepted) {
  GgufWriter w;
  w.AddTensor(std::string(64, 'n'), {8}, GgmlType::kF32, Bytes(32, 1));
  EXPECT_NE(ParseOk(w.Build()), nullptr);
}

TEST(GgufFileTest, RejectsEveryTruncation) {
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddStringArray("tokens", {"a", "bc"});
  w.AddIntArray("types", GgufValueType::kI32, {1, 3});
  w.AddF32("eps", 1e-5f);
  w.AddTensor("q", {32, 2}, GgmlType::kQ4_1, Bytes(40, 1));
  w.AddTensor("n", {8}, GgmlType::kF32, Bytes(32, 2));  // exactly 32 bytes: no trailing padding
  const std::string image = w.Build();
  ASSERT_NE(ParseOk(image), nullptr);
  for (size_t len = 0; len < image.size(); ++len) {
    absl::StatusOr<std::unique_ptr<GgufFile>> f =
        GgufFile::FromBytes(std::string_view(image).substr(0, len));
    ASSERT_FALSE(f.ok()) << "prefix of " << len << " bytes parsed";
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << len;
  }
}

TEST(GgufFileTest, SyntheticLlamaModelParsesAndConfigures) {
  testing::SyntheticModelOptions o;
  o.n_layer = 3;
  o.n_embd = 64;
  o.n_ff = 96;
  o.n_head = 4;
  o.n_head_kv = 2;
  o.n_vocab = 320;
  o.context_length = 512;
  o.rope_freq_base = 100000.0f;
  o.weight_type = GgmlType::kQ4_1;
  o.embd_type = GgmlType::kQ8_0;
  const std::string path = testing::TempPath("synthetic.gguf");
  absl::StatusOr<std::string> written = testing::WriteSyntheticModel(o, path);
  ASSERT_TRUE(written.ok()) << written.status();
  absl::StatusOr<std::unique_ptr<GgufFile>> f = GgufFile::Open(*written);
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufFile& file = **f;

  absl::StatusOr<ModelConfig> c = ReadModelConfig(file);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "llama");
  EXPECT_EQ(c->name, "synthetic");
  EXPECT_EQ(c->n_layer, 3);
  EXPECT_EQ(c->n_embd, 64);
  EXPECT_EQ(c->n_ff, 96);
  EXPECT_EQ(c->n_head, 4);
  EXPECT_EQ(c->n_head_kv, 2);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->n_rot, 16);
  EXPECT_EQ(c->n_vocab, 320);
  EXPECT_EQ(c->context_length, 512);
  EXPECT_EQ(c->rope_freq_base, 100000.0);
  EXPECT_FLOAT_EQ(c->rms_eps, 1e-5);
  EXPECT_EQ(c->rope_style, RopeStyle::kNorm);
  EXPECT_FALSE(c->qkv_bias);

  EXPECT_EQ(file.tensors().size(), 1u + 9u * 3u + 1u);
  EXPECT_EQ(file.FindTensor("output.weight"), nullptr);  // tied
  const GgufTensor* embd = file.FindTensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->type, GgmlType::kQ8_0);
  EXPECT_THAT(embd->dims, ::testing::ElementsAre(64, 320));
  const GgufTensor* k = file.FindTensor("blk.2.attn_k.weight");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->type, GgmlType::kQ4_1);
  EXPECT_THAT(k->dims, ::testing::ElementsAre(64, 32));
  EXPECT_THAT(file.FindTensor("blk.0.ffn_down.weight")->dims, ::testing::ElementsAre(96, 64));
  const GgufTensor* norm = file.FindTensor("blk.1.ffn_norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->type, GgmlType::kF32);
  for (int64_t i = 0; i < norm->num_elements(); ++i) {
    float v;
    std::memcpy(&v, norm->data + 4 * i, 4);
    EXPECT_NEAR(v, 1.0f, 0.06f);
  }
  // Every Q4_1 block has finite, small fp16 scale and min.
  for (const GgufTensor& t : file.tensors()) {
    if (t.type != GgmlType::kQ4_1) continue;
    for (uint64_t at = 0; at < t.size_bytes; at += 20) {
      const float d = Fp16ToFloat(static_cast<uint16_t>(t.data[at] | t.data[at + 1] << 8));
      const float m = Fp16ToFloat(static_cast<uint16_t>(t.data[at + 2] | t.data[at + 3] << 8));
      ASSERT_TRUE(std::isfinite(d) && std::isfinite(m)) << t.name;
      ASSERT_LT(std::fabs(d), 0.01f);
      ASSERT_LT(std::fabs(m), 0.1f);
    }
  }

  // Tokenizer metadata.
  EXPECT_EQ(*file.GetString("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(*file.GetString("tokenizer.ggml.pre"), "smollm");
  absl::StatusOr<std::vector<std::string>> tokens = file.GetStringArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok());
  ASSERT_EQ(tokens->size(), 320u);
  EXPECT_EQ((*tokens)[0], "<|endoftext|>");
  EXPECT_EQ((*tokens)[1], "<|im_start|>");
  EXPECT_EQ((*tokens)[2], "<|im_end|>");
  EXPECT_EQ((*tokens)[3 + 'A'], "A");
  EXPECT_EQ((*tokens)[3 + ' '], "\xC4\xA0");   // U+0120 'Ġ'
  EXPECT_EQ((*tokens)[3 + '\n'], "\xC4\x8A");  // U+010A
  EXPECT_EQ((*tokens)[3 + 0xAD], "\xC5\x83");  // the last remapped byte: U+0143
  EXPECT_EQ(absl::flat_hash_set<std::string>(tokens->begin(), tokens->end()).size(), 320u);
  absl::StatusOr<std::vector<int64_t>> types = file.GetIntArray("tokenizer.ggml.token_type");
  ASSERT_TRUE(types.ok());
  EXPECT_THAT(std::vector<int64_t>(types->begin(), types->begin() + 4),
              ::testing::ElementsAre(3, 3, 3, 1));
  absl::StatusOr<std::vector<std::string>> merges = file.GetStringArray("tokenizer.ggml.merges");
  ASSERT_TRUE(merges.ok());
  EXPECT_EQ(merges->size(), 320u - 259u);
  EXPECT_EQ((*merges)[0], "\xC4\xA0 t");
  EXPECT_EQ((*merges)[1], "h e");
  EXPECT_EQ(*file.GetInt("tokenizer.ggml.bos_token_id"), 1);
  EXPECT_EQ(*file.GetInt("tokenizer.ggml.eos_token_id"), 2);
  EXPECT_THAT(*file.GetString("tokenizer.chat_template"), HasSubstr("<|im_start|>"));
  std::filesystem::remove(path);
}

TEST(GgufFileTest, SyntheticQwen2ModelHasBiasesAndNeoxRope) {
  testing::SyntheticModelOptions o;
  o.architecture = "qwen2";
  o.n_layer = 1;
  o.weight_type = GgmlType::kQ8_0;
  o.tied_embeddings = false;
  absl::StatusOr<std::string> image = testing::BuildSyntheticModel(o);
  ASSERT_TRUE(image.ok()) << image.status();
  auto f = ParseOk(*image);
  ASSERT_NE(f, nullptr);
  absl::StatusOr<ModelConfig> c = ReadModelConfig(*f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_style, RopeStyle::kNeox);
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_EQ(f->tensors().size(), 1u + 12u + 1u + 1u);
  ASSERT_NE(f->FindTensor("blk.0.attn_k.bias"), nullptr);
  EXPECT_THAT(f->FindTensor("blk.0.attn_k.bias")->dims, ::testing::ElementsAre(32));
  ASSERT_NE(f->FindTensor("output.weight"), nullptr);
  EXPECT_EQ(f->FindTensor("output.weight")->type, GgmlType::kQ8_0);
}

TEST(GgufFileTest, SyntheticModelSupportsEveryWeightTypeAndLargeVocab) {
  for (GgmlType t : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ4_0,
                     GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0,
                     GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    testing::SyntheticModelOptions o;
    o.n_layer = 1;
    o.n_embd = 256;
    o.n_ff = 256;
    o.n_vocab = 1200;
    o.weight_type = t;
    o.embd_type = t;
    absl::StatusOr<std::string> image = testing::BuildSyntheticModel(o);
    ASSERT_TRUE(image.ok()) << GgmlTypeName(t) << ": " << image.status();
    auto f = ParseOk(*image);
    ASSERT_NE(f, nullptr);
    EXPECT_EQ(f->FindTensor("blk.0.ffn_up.weight")->type, t);
    EXPECT_EQ(f->GetStringArray("tokenizer.ggml.tokens")->size(), 1200u);
  }
  testing::SyntheticModelOptions small;
  small.n_vocab = 10;
  EXPECT_EQ(testing::BuildSyntheticModel(small).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GgufFileTest, ModelConfigRejectsUnknownArchitectureAndMissingKeys) {
  testing::SyntheticModelOptions o;
  o.architecture = "mamba";
  auto f = ParseOk(*testing::BuildSyntheticModel(o));
  ASSERT_NE(f, nullptr);
  absl::StatusOr<ModelConfig> c = ReadModelConfig(*f);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(c.status().message(), HasSubstr("mamba"));

  testing::SyntheticModelOptions m;
  m.omit_keys = {"llama.embedding_length"};
  auto g = ParseOk(*testing::BuildSyntheticModel(m));
  ASSERT_NE(g, nullptr);
  c = ReadModelConfig(*g);
  EXPECT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("llama.embedding_length"));
}

TEST(GgufFileTest, RealSmolLm2File) {
  const char* src = std::getenv("MAGICPIG_SOURCE_DIR");
  const std::string path =
      std::string(src != nullptr ? src : ".") + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) {
    GTEST_SKIP() << "real model not found at " << path
                 << " (see docs: scripts download it into models/)";
  }
  absl::StatusOr<std::unique_ptr<GgufFile>> f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufFile& file = **f;
  EXPECT_EQ(file.version(), 3u);
  EXPECT_EQ(file.tensors().size(), 272u);
  EXPECT_EQ(file.keys().size(), 33u);
  EXPECT_EQ(*file.GetString("general.architecture"), "llama");
  EXPECT_EQ(*file.GetInt("llama.block_count"), 30);
  EXPECT_EQ(file.FindTensor("token_embd.weight")->type, GgmlType::kQ8_0);
  EXPECT_THAT(file.FindTensor("token_embd.weight")->dims, ::testing::ElementsAre(576, 49152));
  EXPECT_EQ(file.FindTensor("output.weight"), nullptr);
  for (const GgufTensor& t : file.tensors()) {
    if (t.name == "token_embd.weight") continue;
    const GgmlType want = t.dims.size() == 1 ? GgmlType::kF32 : GgmlType::kQ4_1;
    EXPECT_EQ(t.type, want) << t.name;
  }
  EXPECT_EQ(file.GetStringArray("tokenizer.ggml.tokens")->size(), 49152u);
  absl::StatusOr<ModelConfig> c = ReadModelConfig(file);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->n_embd, 576);
  EXPECT_EQ(c->n_head, 9);
  EXPECT_EQ(c->n_head_kv, 3);
  EXPECT_EQ(c->n_ff, 1536);
  EXPECT_EQ(c->rope_freq_base, 100000.0);
}

}  // namespace
}  // namespace magicpig::model
