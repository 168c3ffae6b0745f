#include "tests/testing/spot_writer.h"

#include <zlib.h>

#include <cmath>
#include <fstream>
#include <random>
#include <utility>

namespace magicpig::testing {
namespace {

void AppendF32(std::string* out, const std::vector<float>& v) {
  out->append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

}  // namespace

uint32_t Crc(const std::string& bytes) {
  return static_cast<uint32_t>(
      crc32(0, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size())));
}

void FixCrc(std::string* bytes) {
  bytes->resize(bytes->size() - 4);
  AppendU32(bytes, Crc(*bytes));
}

std::string Serialize(const TestFile& f) {
  std::string out = "MPSPOT01";
  for (uint32_t v :
       {f.version, f.head_dim, f.bits, f.n_layer_model, f.n_head, f.n_head_kv,
        static_cast<uint32_t>(f.layers.size()), static_cast<uint32_t>(f.model_name.size())}) {
    AppendU32(&out, v);
  }
  out += f.model_name;
  for (uint32_t l : f.layers) AppendU32(&out, l);
  for (const TestMlp& m : f.mlps) {
    AppendF32(&out, {m.in_scale});
    AppendF32(&out, m.w1);
    AppendF32(&out, m.b1);
    AppendF32(&out, m.w2);
    AppendF32(&out, m.b2);
  }
  AppendU32(&out, Crc(out));
  return out;
}

TestFile RandomFile(uint32_t d, uint32_t bits, uint32_t n_layer_model, uint32_t n_head,
                    uint32_t n_head_kv, std::vector<uint32_t> layers, uint64_t seed,
                    std::string name) {
  TestFile f;
  f.head_dim = d;
  f.bits = bits;
  f.n_layer_model = n_layer_model;
  f.n_head = n_head;
  f.n_head_kv = n_head_kv;
  f.model_name = std::move(name);
  f.layers = std::move(layers);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  const float s = 1.0f / std::sqrt(static_cast<float>(d));
  auto fill = [&](size_t count, float scale) {
    std::vector<float> v(count);
    for (float& x : v) x = scale * normal(rng);
    return v;
  };
  for (size_t m = 0; m < f.layers.size() * (n_head + n_head_kv); ++m) {
    TestMlp mlp;
    mlp.in_scale = 0.5f + 0.1f * static_cast<float>(m % 7);
    mlp.w1 = fill(size_t{d} * d, 2.0f * s);
    mlp.b1 = fill(d, 0.5f);
    mlp.w2 = fill(size_t{bits} * d, s);
    mlp.b2 = fill(bits, 0.1f);
    f.mlps.push_back(std::move(mlp));
  }
  return f;
}

bool WriteSpotFile(const TestFile& f, const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const std::string bytes = Serialize(f);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return static_cast<bool>(out);
}

}  // namespace magicpig::testing
