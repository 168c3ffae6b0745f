// Tests for SpotlightHashes: the .spot loader against malformed files (every truncation, every
// flipped byte, bad magic and version, out-of-range fields, non-finite weights, model mismatches,
// a missing file, trailing bytes, hostile sizes), the bit packing, and the forward at every SIMD
// level against a float64 reference computed here. Test files are written by
// tests/testing/spot_writer.h, which mirrors eval/spotlight/spotfile.py's layout.
#include "common/attention/spotlight_hash.h"

#include <zlib.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/cpu_features.h"
#include "gtest/gtest.h"
#include "tests/testing/spot_writer.h"

namespace magicpig::attention {
namespace {

using ::magicpig::testing::AppendU32;
using ::magicpig::testing::Crc;
using ::magicpig::testing::FixCrc;
using ::magicpig::testing::RandomFile;
using ::magicpig::testing::Serialize;
using ::magicpig::testing::TestFile;
using ::magicpig::testing::TestMlp;

TestFile TinyFile() { return RandomFile(4, 16, 4, 2, 1, {1, 3}, 7, "tiny"); }

// z [n][bits] in float64: x' = in_scale x; h = x' + silu(W1 x' + b1); z = W2 h + b2.
std::vector<double> Reference(const TestMlp& m, int64_t d, int64_t bits, const float* x,
                              int64_t n) {
  std::vector<double> z(static_cast<size_t>(n * bits));
  std::vector<double> xs(d), h(d);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t i = 0; i < d; ++i) xs[i] = static_cast<double>(m.in_scale) * x[r * d + i];
    for (int64_t j = 0; j < d; ++j) {
      double a = m.b1[j];
      for (int64_t i = 0; i < d; ++i) a += static_cast<double>(m.w1[j * d + i]) * xs[i];
      h[j] = xs[j] + a / (1.0 + std::exp(-a));
    }
    for (int64_t k = 0; k < bits; ++k) {
      double acc = m.b2[k];
      for (int64_t j = 0; j < d; ++j) acc += static_cast<double>(m.w2[k * d + j]) * h[j];
      z[r * bits + k] = acc;
    }
  }
  return z;
}

void ExpectError(const absl::StatusOr<SpotlightHashes>& h, absl::StatusCode code,
                 const std::string& needle) {
  ASSERT_FALSE(h.ok()) << "expected an error containing '" << needle << "'";
  EXPECT_EQ(h.status().code(), code) << h.status();
  EXPECT_NE(std::string(h.status().message()).find(needle), std::string::npos) << h.status();
}

TEST(SpotlightHashesTest, ParsesAValidFile) {
  const TestFile f = RandomFile(8, 32, 6, 4, 2, {0, 2, 5}, 1, "SmolLM2 135M");
  auto h = SpotlightHashes::Parse(Serialize(f), nullptr);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->bits(), 32);
  EXPECT_EQ(h->words(), 2);
  EXPECT_EQ(h->head_dim(), 8);
  EXPECT_EQ(h->n_layer_model(), 6);
  EXPECT_EQ(h->n_head(), 4);
  EXPECT_EQ(h->n_head_kv(), 2);
  EXPECT_EQ(h->model_name(), "SmolLM2 135M");
  EXPECT_EQ(h->layers(), (std::vector<int64_t>{0, 2, 5}));
  EXPECT_TRUE(h->HasLayer(0));
  EXPECT_TRUE(h->HasLayer(5));
  EXPECT_FALSE(h->HasLayer(1));
  EXPECT_FALSE(h->HasLayer(-1));
  EXPECT_FALSE(h->HasLayer(6));
  // At least the file's weights: 3 layers x 6 MLPs x (1 + 64 + 8 + 256 + 32) floats.
  EXPECT_GE(h->bytes(), 3 * 6 * 361 * 4);

  SpotlightShape model{6, 4, 2, 8, "SmolLM2 135M"};
  EXPECT_TRUE(SpotlightHashes::Parse(Serialize(f), &model).ok());
  model.model_name = "";  // an empty name is not checked
  EXPECT_TRUE(SpotlightHashes::Parse(Serialize(f), &model).ok());
  TestFile unnamed = f;
  unnamed.model_name = "";
  model.model_name = "SmolLM2 135M";
  EXPECT_TRUE(SpotlightHashes::Parse(Serialize(unnamed), &model).ok());
}

TEST(SpotlightHashesTest, EveryTruncationIsDataLoss) {
  const std::string bytes = Serialize(TinyFile());
  ASSERT_TRUE(SpotlightHashes::Parse(bytes, nullptr).ok());
  for (size_t len = 0; len < bytes.size(); ++len) {
    auto h = SpotlightHashes::Parse(bytes.substr(0, len), nullptr);
    ASSERT_FALSE(h.ok()) << len;
    EXPECT_EQ(h.status().code(), absl::StatusCode::kDataLoss) << len << ": " << h.status();
    EXPECT_NE(std::string(h.status().message()).find("truncated in"), std::string::npos)
        << len << ": " << h.status();
  }
  // Which part is named.
  ExpectError(SpotlightHashes::Parse(bytes.substr(0, 5), nullptr), absl::StatusCode::kDataLoss,
              "truncated in the magic");
  ExpectError(SpotlightHashes::Parse(bytes.substr(0, 20), nullptr), absl::StatusCode::kDataLoss,
              "truncated in the header");
  ExpectError(SpotlightHashes::Parse(bytes.substr(0, 8 + 32 + 2), nullptr),
              absl::StatusCode::kDataLoss, "truncated in the model name");
  ExpectError(SpotlightHashes::Parse(bytes.substr(0, 8 + 32 + 4 + 4), nullptr),
              absl::StatusCode::kDataLoss, "truncated in the layer list");
  ExpectError(SpotlightHashes::Parse(bytes.substr(0, 8 + 32 + 4 + 8 + 10), nullptr),
              absl::StatusCode::kDataLoss, "truncated in the MLP weights");
  ExpectError(SpotlightHashes::Parse(bytes.substr(0, bytes.size() - 1), nullptr),
              absl::StatusCode::kDataLoss, "truncated in the checksum");
}

TEST(SpotlightHashesTest, TrailingBytesAreDataLoss) {
  std::string bytes = Serialize(TinyFile());
  bytes += "x";
  ExpectError(SpotlightHashes::Parse(bytes, nullptr), absl::StatusCode::kDataLoss,
              "1 trailing bytes");
  FixCrc(&bytes);  // still trailing: the size is the header's, not the checksum's
  ExpectError(SpotlightHashes::Parse(bytes, nullptr), absl::StatusCode::kDataLoss, "trailing");
}

TEST(SpotlightHashesTest, EveryFlippedByteIsDataLoss) {
  const std::string bytes = Serialize(TinyFile());
  const size_t weights_at = 8 + 32 + 4 + 8;
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string bad = bytes;
    bad[i] = static_cast<char>(bad[i] ^ 0x5A);
    auto h = SpotlightHashes::Parse(bad, nullptr);
    ASSERT_FALSE(h.ok()) << i;
    EXPECT_EQ(h.status().code(), absl::StatusCode::kDataLoss) << i << ": " << h.status();
    if (i >= weights_at) {
      EXPECT_NE(std::string(h.status().message()).find("checksum mismatch"), std::string::npos)
          << i << ": " << h.status();
    }
  }
}

TEST(SpotlightHashesTest, BadMagicAndVersionAreDataLoss) {
  std::string bytes = Serialize(TinyFile());
  bytes[3] = 'X';
  FixCrc(&bytes);
  ExpectError(SpotlightHashes::Parse(bytes, nullptr), absl::StatusCode::kDataLoss, "bad magic");
  ExpectError(SpotlightHashes::Parse("GGUF", nullptr), absl::StatusCode::kDataLoss, "bad magic");
  TestFile f = TinyFile();
  f.version = 2;  // with a valid checksum
  ExpectError(SpotlightHashes::Parse(Serialize(f), nullptr), absl::StatusCode::kDataLoss,
              "unsupported version 2");
}

TEST(SpotlightHashesTest, OutOfRangeFieldsAreInvalidArgumentNamingTheField) {
  struct Case {
    const char* what;
    TestFile file;
    const char* needle;
  };
  std::vector<Case> cases;
  cases.push_back({"bits 24", RandomFile(4, 24, 4, 2, 1, {1}, 1), "bits must be"});
  cases.push_back({"bits 0", RandomFile(4, 0, 4, 2, 1, {1}, 1), "bits must be"});
  cases.push_back({"bits 272", RandomFile(2, 272, 4, 2, 1, {1}, 1), "bits must be"});
  cases.push_back({"head_dim 0", RandomFile(0, 16, 4, 2, 1, {1}, 1), "head_dim must be"});
  cases.push_back({"layers equal", RandomFile(4, 16, 4, 2, 1, {1, 1}, 1), "strictly increasing"});
  cases.push_back({"layers down", RandomFile(4, 16, 4, 2, 1, {2, 1}, 1), "strictly increasing"});
  cases.push_back(
      {"layer >= n_layer_model", RandomFile(4, 16, 4, 2, 1, {1, 4}, 1), "must be < n_layer_model"});
  cases.push_back({"no layers", RandomFile(4, 16, 4, 2, 1, {}, 1), "n_layers must be >= 1"});
  cases.push_back({"n_head % n_head_kv", RandomFile(4, 16, 4, 3, 2, {1}, 1), "n_head must be"});
  cases.push_back({"n_head_kv 0", RandomFile(4, 16, 4, 2, 0, {1}, 1), "n_head must be"});
  {
    TestFile f = TinyFile();
    // Layer slot 1 (layer 3), after its 1 key MLP: query head 1.
    f.mlps[1 * 3 + 1 + 1].w2[5] = std::numeric_limits<float>::quiet_NaN();
    cases.push_back({"NaN weight", f, "non-finite weight layer 3 query head 1 w2[1][1]"});
  }
  {
    TestFile f = TinyFile();
    f.mlps[0].b1[2] = std::numeric_limits<float>::infinity();
    cases.push_back({"inf bias", f, "non-finite weight layer 1 key head 0 b1[2]"});
  }
  {
    TestFile f = TinyFile();
    f.mlps[2].in_scale = -std::numeric_limits<float>::infinity();
    cases.push_back({"inf in_scale", f, "non-finite layer 1 query head 1 in_scale"});
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ExpectError(SpotlightHashes::Parse(Serialize(c.file), nullptr),
                absl::StatusCode::kInvalidArgument, c.needle);
  }
}

TEST(SpotlightHashesTest, ModelMismatchIsInvalidArgumentWithBothValues) {
  const std::string bytes = Serialize(TinyFile());  // n_layer_model 4, n_head 2, kv 1, d 4
  const SpotlightShape good{4, 2, 1, 4, "tiny"};
  ASSERT_TRUE(SpotlightHashes::Parse(bytes, &good).ok());
  struct Case {
    SpotlightShape model;
    const char* needle;
  };
  for (const Case& c : {Case{{30, 2, 1, 4, "tiny"},
                             "n_layer_model mismatch: the file has 4, "
                             "the model has 30"},
                        Case{{4, 9, 1, 4, "tiny"},
                             "n_head mismatch: the file has 2, the model "
                             "has 9"},
                        Case{{4, 2, 2, 4, "tiny"}, "n_head_kv mismatch"},
                        Case{{4, 2, 1, 64, "tiny"},
                             "head_dim mismatch: the file has 4, the model "
                             "has 64"},
                        Case{{4, 2, 1, 4, "other"},
                             "model name mismatch: the file has \"tiny\", "
                             "the model has \"other\""}}) {
    ExpectError(SpotlightHashes::Parse(bytes, &c.model), absl::StatusCode::kInvalidArgument,
                c.needle);
  }
}

TEST(SpotlightHashesTest, HostileSizesAreRejectedWithoutAllocating) {
  // 0xFFFFFFFF in each header field (after the version) of a small file, with a valid checksum:
  // every field that sizes the file makes it "truncated", judged from the sizes alone.
  // n_layer_model sizes nothing (no table of that size is allocated), so the file stays valid.
  const uint32_t big = 0xFFFFFFFFu;
  const char* names[] = {"version", "head_dim",  "bits",     "n_layer_model",
                         "n_head",  "n_head_kv", "n_layers", "name_len"};
  for (int field = 1; field < 8; ++field) {
    SCOPED_TRACE(names[field]);
    std::string bytes = Serialize(TinyFile());
    std::memcpy(&bytes[8 + 4 * field], &big, 4);
    FixCrc(&bytes);
    if (field == 3) {
      EXPECT_TRUE(SpotlightHashes::Parse(bytes, nullptr).ok());
    } else {
      ExpectError(SpotlightHashes::Parse(bytes, nullptr), absl::StatusCode::kDataLoss,
                  "truncated in");
    }
  }
  TestFile f = TinyFile();
  f.head_dim = 1024;
  f.bits = 256;
  f.n_head = 0x80000000u;
  f.n_head_kv = 0x80000000u;
  f.layers.assign(3, 0);
  ExpectError(SpotlightHashes::Parse(Serialize(f), nullptr), absl::StatusCode::kDataLoss,
              "truncated in the MLP weights");
}

TEST(SpotlightHashesTest, LoadReadsAFileAndNamesAMissingOne) {
  const std::string dir = ::testing::TempDir();
  const std::string path = dir + "/spotlight_hash_test.spot";
  {
    std::ofstream out(path, std::ios::binary);
    out << Serialize(TinyFile());
  }
  auto h = SpotlightHashes::Load(path, nullptr);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->model_name(), "tiny");
  const std::string missing = dir + "/no_such_file.spot";
  auto m = SpotlightHashes::Load(missing, nullptr);
  ExpectError(m, absl::StatusCode::kNotFound, missing);
  ExpectError(m, absl::StatusCode::kNotFound, "eval/spotlight/train.py");
  {
    std::ofstream out(path, std::ios::binary);
    out << Serialize(TinyFile()).substr(0, 30);
  }
  ExpectError(SpotlightHashes::Load(path, nullptr), absl::StatusCode::kDataLoss,
              path + ": spotlight hash file: truncated in the header");
}

TEST(SpotlightHashesTest, PackPutsBitIInWordIOver16AtPositionIMod16) {
  std::vector<float> z(2 * 32, -1.0f);
  // Row 0: bits 0, 3, 15, 16, 31 set; the rest non-positive (0, -0, NaN and negatives give 0).
  for (int i : {0, 3, 15, 16, 31}) z[i] = 0.5f;
  z[1] = 0.0f;
  z[2] = -0.0f;
  z[4] = std::numeric_limits<float>::quiet_NaN();
  z[5] = std::numeric_limits<float>::denorm_min();  // positive: bit 5 set
  // Row 1: all positive.
  for (int i = 32; i < 64; ++i) z[i] = 1e-30f;
  std::vector<uint16_t> codes(4, 0x5555);
  ASSERT_TRUE(PackSpotlightCodes(z.data(), 2, 32, codes.data()).ok());
  EXPECT_EQ(codes[0], (1u << 0) | (1u << 3) | (1u << 5) | (1u << 15));
  EXPECT_EQ(codes[1], (1u << 0) | (1u << 15));
  EXPECT_EQ(codes[2], 0xFFFF);
  EXPECT_EQ(codes[3], 0xFFFF);
  EXPECT_FALSE(PackSpotlightCodes(z.data(), 1, 24, codes.data()).ok());
  EXPECT_FALSE(PackSpotlightCodes(z.data(), -1, 32, codes.data()).ok());
}

TEST(SpotlightHashesTest, ForwardRejectsBadArguments) {
  auto h = SpotlightHashes::Parse(Serialize(TinyFile()), nullptr);  // layers {1, 3}, 2 q, 1 kv
  ASSERT_TRUE(h.ok());
  std::vector<float> x(4 * 3, 0.5f);
  std::vector<uint16_t> codes(3);
  std::vector<float> z(3 * 16);
  auto invalid = [](const absl::Status& s, const std::string& needle) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(std::string(s.message()).find(needle), std::string::npos) << s;
  };
  invalid(h->KeyCodes(2, 0, x.data(), 3, codes.data()), "layer 2 is not in the spotlight file");
  invalid(h->QueryCodes(0, 0, x.data(), 3, codes.data()), "(its layers: 1, 3)");
  invalid(h->KeyCodes(1, 1, x.data(), 3, codes.data()), "kv_head 1 out of range [0, 1)");
  invalid(h->KeyCodes(1, -1, x.data(), 3, codes.data()), "kv_head -1 out of range");
  invalid(h->QueryCodes(1, 2, x.data(), 3, codes.data()), "head 2 out of range [0, 2)");
  invalid(h->KeyCodes(1, 0, x.data(), -1, codes.data()), "n < 0");
  invalid(h->KeyCodes(1, 0, nullptr, 3, codes.data()), "null x");
  invalid(h->QueryCodes(1, 0, x.data(), 3, nullptr), "null codes");
  invalid(h->KeyOutputs(1, 0, x.data(), 3, nullptr), "null z");
  EXPECT_TRUE(h->KeyCodes(1, 0, nullptr, 0, nullptr).ok());
  EXPECT_TRUE(h->QueryOutputs(3, 1, x.data(), 3, z.data()).ok());
}

// The forward at every SIMD level against the float64 reference for every MLP of a file, over
// row counts that cover the kernel's row blocks, their tails and several 64-row blocks (the
// parallel path), with head_dim and bits that are not multiples of the 32-column padding.
TEST(SpotlightHashesTest, ForwardMatchesFloat64AtEveryLevel) {
  struct Shape {
    uint32_t d, bits;
  };
  for (const Shape shape : {Shape{64, 64}, Shape{24, 48}, Shape{5, 16}, Shape{40, 256}}) {
    SCOPED_TRACE(::testing::Message() << "d=" << shape.d << " bits=" << shape.bits);
    const TestFile f =
        RandomFile(shape.d, shape.bits, 5, 4, 2, {1, 4}, shape.d * 1000 + shape.bits);
    auto h = SpotlightHashes::Parse(Serialize(f), nullptr);
    ASSERT_TRUE(h.ok()) << h.status();
    const int64_t d = shape.d;
    const int64_t bits = shape.bits;
    std::mt19937 rng(shape.bits);
    std::normal_distribution<float> normal;
    for (int64_t n : {1, 2, 3, 5, 6, 7, 13, 64, 65, 200}) {
      std::vector<float> x(static_cast<size_t>(n * d));
      for (float& v : x) v = 2.0f * normal(rng);
      for (size_t slot = 0; slot < f.layers.size(); ++slot) {
        for (uint32_t k = 0; k < f.n_head_kv + f.n_head; ++k) {
          const bool is_query = k >= f.n_head_kv;
          const int64_t head = is_query ? k - f.n_head_kv : k;
          const TestMlp& mlp = is_query ? f.Query(slot, head) : f.Key(slot, head);
          const std::vector<double> ref = Reference(mlp, d, bits, x.data(), n);
          double scale = 0.0;
          for (double v : ref) scale = std::max(scale, std::fabs(v));
          for (SimdLevel level : SupportedSimdLevels()) {
            SCOPED_TRACE(::testing::Message()
                         << SimdLevelName(level) << " n=" << n << " layer " << f.layers[slot]
                         << (is_query ? " query " : " key ") << head);
            std::vector<float> z(static_cast<size_t>(n * bits), -7.0f);
            std::vector<uint16_t> codes(static_cast<size_t>(n * bits / 16), 0xAAAA);
            const int64_t layer = f.layers[slot];
            if (is_query) {
              ASSERT_TRUE(h->QueryOutputs(layer, head, x.data(), n, z.data(), level).ok());
              ASSERT_TRUE(h->QueryCodes(layer, head, x.data(), n, codes.data(), level).ok());
            } else {
              ASSERT_TRUE(h->KeyOutputs(layer, head, x.data(), n, z.data(), level).ok());
              ASSERT_TRUE(h->KeyCodes(layer, head, x.data(), n, codes.data(), level).ok());
            }
            // The codes are exactly the packed outputs.
            std::vector<uint16_t> packed(codes.size());
            ASSERT_TRUE(
                PackSpotlightCodes(z.data(), n, static_cast<int>(bits), packed.data()).ok());
            ASSERT_EQ(codes, packed);
            int64_t skipped = 0;
            for (int64_t i = 0; i < n * bits; ++i) {
              ASSERT_NEAR(z[i], ref[i], 1e-4 * (1.0 + scale)) << "output " << i;
              if (std::fabs(ref[i]) <= 1e-3 * (1.0 + scale)) {
                ++skipped;  // too close to 0 to call
                continue;
              }
              const int bit = (codes[i / 16] >> (i % 16)) & 1;
              ASSERT_EQ(bit, ref[i] > 0.0 ? 1 : 0) << "output " << i << " z64 " << ref[i];
            }
            EXPECT_LE(skipped, n * bits / 50 + 1);
          }
        }
      }
    }
  }
}

TEST(SpotlightHashesTest, ConcurrentCallsAgree) {
  const TestFile f = RandomFile(32, 64, 2, 4, 2, {0, 1}, 99);
  auto h = SpotlightHashes::Parse(Serialize(f), nullptr);
  ASSERT_TRUE(h.ok());
  const int64_t n = 300;
  std::vector<float> x(static_cast<size_t>(n * 32));
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (float& v : x) v = normal(rng);
  std::vector<uint16_t> expected(static_cast<size_t>(n * 4));
  ASSERT_TRUE(h->KeyCodes(1, 1, x.data(), n, expected.data()).ok());
  std::vector<std::vector<uint16_t>> got(4, std::vector<uint16_t>(expected.size()));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 5; ++rep) {
        ASSERT_TRUE(h->KeyCodes(1, 1, x.data(), n, got[t].data()).ok());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const auto& g : got) EXPECT_EQ(g, expected);
}

}  // namespace
}  // namespace magicpig::attention
