#include "common/attention/spotlight_hash.h"

#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/attention/kernels/spotlight_mlp_kernel.h"
#include "common/status_macros.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"

namespace magicpig::attention {

static_assert(std::endian::native == std::endian::little,
              "spotlight files are little-endian and read with memcpy");

namespace {

constexpr int64_t kMaxHeadDim = 1024;
constexpr int kMaxBits = 256;

absl::Status DataLoss(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("spotlight hash file: ", what));
}

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("spotlight hash file: ", what));
}

// a * b, or UINT64_MAX when it overflows (sizes from a hostile header).
uint64_t MulSat(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_mul_overflow(a, b, &r) ? std::numeric_limits<uint64_t>::max() : r;
}

uint64_t AddSat(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_add_overflow(a, b, &r) ? std::numeric_limits<uint64_t>::max() : r;
}

// Sequential little-endian reads over the file's bytes; every read is checked by the caller
// against left() first.
class Reader {
 public:
  explicit Reader(absl::string_view bytes) : bytes_(bytes) {}
  uint64_t left() const { return bytes_.size() - pos_; }
  uint64_t pos() const { return pos_; }
  uint32_t U32() {
    uint32_t v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(v));
    pos_ += sizeof(v);
    return v;
  }
  float F32() {
    float v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(v));
    pos_ += sizeof(v);
    return v;
  }
  absl::string_view Take(uint64_t n) {
    absl::string_view s = bytes_.substr(pos_, n);
    pos_ += n;
    return s;
  }

 private:
  absl::string_view bytes_;
  uint64_t pos_ = 0;
};

// The header fields in file order, after the magic.
struct Header {
  uint32_t version = 0;
  uint32_t head_dim = 0;
  uint32_t bits = 0;
  uint32_t n_layer_model = 0;
  uint32_t n_head = 0;
  uint32_t n_head_kv = 0;
  uint32_t n_layers = 0;
};

absl::Status CheckShape(const Header& h, const std::string& name, const SpotlightShape& model) {
  struct Field {
    const char* name;
    int64_t file, model;
  };
  for (const Field& f :
       {Field{"n_layer_model", h.n_layer_model, model.n_layer_model},
        Field{"n_head", h.n_head, model.n_head}, Field{"n_head_kv", h.n_head_kv, model.n_head_kv},
        Field{"head_dim", h.head_dim, model.head_dim}}) {
    if (f.file != f.model) {
      return Invalid(absl::StrCat(f.name, " mismatch: the file has ", f.file, ", the model has ",
                                  f.model, " (the file was trained for another model)"));
    }
  }
  if (!name.empty() && !model.model_name.empty() && name != model.model_name) {
    return Invalid(absl::StrCat("model name mismatch: the file has \"", name,
                                "\", the model has \"", model.model_name, "\""));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status PackSpotlightCodes(const float* z, int64_t n, int bits, uint16_t* codes) {
  if (bits < 16 || bits > kMaxBits || bits % 16 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("PackSpotlightCodes: bits must be a multiple of 16 in [16, 256], got ", bits));
  }
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("PackSpotlightCodes: n < 0: ", n));
  if (n > 0 && (z == nullptr || codes == nullptr)) {
    return absl::InvalidArgumentError("PackSpotlightCodes: null z or codes");
  }
  const int words = bits / 16;
  for (int64_t r = 0; r < n; ++r) {
    for (int w = 0; w < words; ++w) {
      uint32_t word = 0;
      for (int b = 0; b < 16; ++b) {
        word |= static_cast<uint32_t>(z[r * bits + w * 16 + b] > 0.0f) << b;
      }
      codes[r * words + w] = static_cast<uint16_t>(word);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<SpotlightHashes> SpotlightHashes::Parse(absl::string_view bytes,
                                                       const SpotlightShape* expected) {
  // Structure first (every size against the bytes present), then the checksum, then the values.
  const size_t magic_bytes = std::min(bytes.size(), kMagic.size());
  if (bytes.substr(0, magic_bytes) != kMagic.substr(0, magic_bytes)) {
    return DataLoss(
        absl::StrCat("bad magic (expected \"", kMagic, "\"): not a spotlight hash file"));
  }
  if (bytes.size() < kMagic.size()) {
    return DataLoss(absl::StrCat("truncated in the magic (", bytes.size(), " bytes)"));
  }
  Reader r(bytes);
  r.Take(kMagic.size());
  Header h;
  if (r.left() < 4) return DataLoss("truncated in the header (version)");
  h.version = r.U32();
  if (h.version != kVersion) {
    return DataLoss(absl::StrCat("unsupported version ", h.version, " (this build reads version ",
                                 kVersion, ")"));
  }
  if (r.left() < 6 * 4) {
    return DataLoss(absl::StrCat("truncated in the header (", r.left(),
                                 " of 24 bytes of head_dim ... n_layers)"));
  }
  h.head_dim = r.U32();
  h.bits = r.U32();
  h.n_layer_model = r.U32();
  h.n_head = r.U32();
  h.n_head_kv = r.U32();
  h.n_layers = r.U32();
  if (r.left() < 4) return DataLoss("truncated in the header (name_len)");
  const uint32_t name_len = r.U32();
  if (r.left() < name_len) {
    return DataLoss(absl::StrCat("truncated in the model name (name_len ", name_len, ", ", r.left(),
                                 " bytes left)"));
  }
  std::string name(r.Take(name_len));
  const uint64_t layer_bytes = uint64_t{4} * h.n_layers;
  if (r.left() < layer_bytes) {
    return DataLoss(absl::StrCat("truncated in the layer list (n_layers ", h.n_layers, " needs ",
                                 layer_bytes, " bytes, ", r.left(), " left)"));
  }
  const uint64_t layers_at = r.pos();
  r.Take(layer_bytes);
  // Per MLP: in_scale, w1 [d][d], b1 [d], w2 [bits][d], b2 [bits] (float32).
  const uint64_t d = h.head_dim;
  const uint64_t mlp_floats =
      AddSat(AddSat(AddSat(1, MulSat(d, d)), d), AddSat(MulSat(h.bits, d), h.bits));
  const uint64_t mlps = uint64_t{h.n_head} + h.n_head_kv;
  const uint64_t weight_bytes = MulSat(MulSat(MulSat(mlp_floats, 4), mlps), h.n_layers);
  if (r.left() < weight_bytes) {
    return DataLoss(absl::StrCat("truncated in the MLP weights (", h.n_layers, " layers x ", mlps,
                                 " MLPs x ", mlp_floats, " floats need ", weight_bytes, " bytes, ",
                                 r.left(), " left)"));
  }
  const uint64_t weights_at = r.pos();
  r.Take(weight_bytes);
  if (r.left() < 4) {
    return DataLoss(absl::StrCat("truncated in the checksum (", r.left(), " of 4 bytes)"));
  }
  if (r.left() > 4) {
    return DataLoss(
        absl::StrCat(r.left() - 4, " trailing bytes after the checksum (a corrupt or mixed file)"));
  }
  const uint32_t stored_crc = r.U32();
  const uint32_t crc = static_cast<uint32_t>(crc32_z(
      crc32_z(0, nullptr, 0), reinterpret_cast<const Bytef*>(bytes.data()), bytes.size() - 4));
  if (crc != stored_crc) {
    return DataLoss(absl::StrCat("checksum mismatch (stored 0x", absl::Hex(stored_crc),
                                 ", computed 0x", absl::Hex(crc), "): the file is corrupt"));
  }

  // Values.
  if (h.bits < 16 || h.bits > kMaxBits || h.bits % 16 != 0) {
    return Invalid(absl::StrCat("bits must be a multiple of 16 in [16, 256], got ", h.bits));
  }
  if (h.head_dim < 1 || h.head_dim > kMaxHeadDim) {
    return Invalid(absl::StrCat("head_dim must be in [1, 1024], got ", h.head_dim));
  }
  if (h.n_head_kv < 1 || h.n_head < 1 || h.n_head % h.n_head_kv != 0) {
    return Invalid(absl::StrCat("n_head must be a positive multiple of n_head_kv >= 1, got n_head ",
                                h.n_head, ", n_head_kv ", h.n_head_kv));
  }
  if (h.n_layers < 1) return Invalid("n_layers must be >= 1, got 0");
  SpotlightHashes out;
  out.layers_.reserve(h.n_layers);
  Reader lr(bytes);
  lr.Take(layers_at);
  for (uint32_t i = 0; i < h.n_layers; ++i) {
    const uint32_t layer = lr.U32();
    if (layer >= h.n_layer_model) {
      return Invalid(absl::StrCat("layers[", i, "] = ", layer,
                                  " must be < n_layer_model = ", h.n_layer_model));
    }
    if (i > 0 && layer <= out.layers_.back()) {
      return Invalid(absl::StrCat("layers must be strictly increasing, got layers[", i - 1,
                                  "] = ", out.layers_.back(), ", layers[", i, "] = ", layer));
    }
    out.layers_.push_back(layer);
  }
  if (expected != nullptr) MAGICPIG_RETURN_IF_ERROR(CheckShape(h, name, *expected));

  // Weights, transposed and zero-padded for the kernel (sizes bounded by the bytes present).
  const int64_t di = h.head_dim;
  const int64_t dp = internal::SpotlightPadded(di);
  const int64_t bits = h.bits;
  const int64_t bp = internal::SpotlightPadded(bits);
  const int64_t stride = di * dp + dp + di * bp + bp;
  const int64_t n_mlps = static_cast<int64_t>(mlps) * h.n_layers;
  out.mlps_.resize(static_cast<size_t>(n_mlps));
  out.weights_.assign(static_cast<size_t>(n_mlps * stride), 0.0f);
  Reader wr(bytes);
  wr.Take(weights_at);
  for (int64_t m = 0; m < n_mlps; ++m) {
    const int64_t slot = m / static_cast<int64_t>(mlps);
    const int64_t k = m % static_cast<int64_t>(mlps);
    const bool is_query = k >= h.n_head_kv;
    const int64_t head = is_query ? k - h.n_head_kv : k;
    auto where = [&](absl::string_view tensor) {
      return absl::StrCat("layer ", out.layers_[slot], " ", is_query ? "query" : "key", " head ",
                          head, " ", tensor);
    };
    Mlp& mlp = out.mlps_[m];
    mlp.offset = m * stride;
    mlp.in_scale = wr.F32();
    if (!std::isfinite(mlp.in_scale)) {
      return Invalid(absl::StrCat("non-finite ", where("in_scale"), " = ", mlp.in_scale));
    }
    float* w1t = out.weights_.data() + mlp.offset;
    float* b1 = w1t + di * dp;
    float* w2t = b1 + dp;
    float* b2 = w2t + di * bp;
    // w1 [j][i] -> w1t [i][j]; w2 [j][i] -> w2t [i][j].
    struct Tensor {
      const char* name;
      int64_t rows, cols;  // in the file
      float* dst;
      int64_t dst_stride;  // 0: a vector
    };
    for (const Tensor& t : {Tensor{"w1", di, di, w1t, dp}, Tensor{"b1", 1, di, b1, 0},
                            Tensor{"w2", bits, di, w2t, bp}, Tensor{"b2", 1, bits, b2, 0}}) {
      for (int64_t j = 0; j < t.rows; ++j) {
        for (int64_t i = 0; i < t.cols; ++i) {
          const float v = wr.F32();
          if (!std::isfinite(v)) {
            const std::string index =
                t.dst_stride == 0 ? absl::StrCat("[", i, "]") : absl::StrCat("[", j, "][", i, "]");
            return Invalid(
                absl::StrCat("non-finite weight ", where(absl::StrCat(t.name, index)), " = ", v));
          }
          if (t.dst_stride == 0) {
            t.dst[i] = v;
          } else {
            t.dst[i * t.dst_stride + j] = v;
          }
        }
      }
    }
  }
  out.bits_ = static_cast<int>(h.bits);
  out.head_dim_ = h.head_dim;
  out.n_layer_model_ = h.n_layer_model;
  out.n_head_ = h.n_head;
  out.n_head_kv_ = h.n_head_kv;
  out.model_name_ = std::move(name);
  return out;
}

absl::StatusOr<SpotlightHashes> SpotlightHashes::Load(const std::string& path,
                                                      const SpotlightShape* expected) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(
          absl::StrCat("spotlight hash file ", path,
                       " not found: train it with eval/spotlight/train.py (see its --help)"));
    }
    return absl::ErrnoToStatus(err, absl::StrCat("cannot open spotlight hash file ", path));
  }
  std::string bytes;
  char buf[1 << 16];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof(buf), f)) > 0) bytes.append(buf, got);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) {
    return absl::DataLossError(absl::StrCat("error reading spotlight hash file ", path));
  }
  absl::StatusOr<SpotlightHashes> h = Parse(bytes, expected);
  if (!h.ok())
    return absl::Status(h.status().code(), absl::StrCat(path, ": ", h.status().message()));
  return h;
}

int64_t SpotlightHashes::bytes() const {
  return static_cast<int64_t>(weights_.capacity() * sizeof(float) + mlps_.capacity() * sizeof(Mlp) +
                              layers_.capacity() * sizeof(int64_t));
}

int64_t SpotlightHashes::Slot(int64_t layer) const {
  const auto it = std::lower_bound(layers_.begin(), layers_.end(), layer);
  return it != layers_.end() && *it == layer ? it - layers_.begin() : -1;
}

absl::Status SpotlightHashes::KeyCodes(int64_t layer, int64_t kv_head, const float* x, int64_t n,
                                       uint16_t* codes, SimdLevel level) const {
  if (n > 0 && codes == nullptr) {
    return absl::InvalidArgumentError("SpotlightHashes::KeyCodes: null codes");
  }
  return Forward("SpotlightHashes::KeyCodes", false, layer, kv_head, x, n, codes, nullptr, level);
}

absl::Status SpotlightHashes::QueryCodes(int64_t layer, int64_t head, const float* x, int64_t n,
                                         uint16_t* codes, SimdLevel level) const {
  if (n > 0 && codes == nullptr) {
    return absl::InvalidArgumentError("SpotlightHashes::QueryCodes: null codes");
  }
  return Forward("SpotlightHashes::QueryCodes", true, layer, head, x, n, codes, nullptr, level);
}

absl::Status SpotlightHashes::KeyOutputs(int64_t layer, int64_t kv_head, const float* x, int64_t n,
                                         float* z, SimdLevel level) const {
  if (n > 0 && z == nullptr) {
    return absl::InvalidArgumentError("SpotlightHashes::KeyOutputs: null z");
  }
  return Forward("SpotlightHashes::KeyOutputs", false, layer, kv_head, x, n, nullptr, z, level);
}

absl::Status SpotlightHashes::QueryOutputs(int64_t layer, int64_t head, const float* x, int64_t n,
                                           float* z, SimdLevel level) const {
  if (n > 0 && z == nullptr) {
    return absl::InvalidArgumentError("SpotlightHashes::QueryOutputs: null z");
  }
  return Forward("SpotlightHashes::QueryOutputs", true, layer, head, x, n, nullptr, z, level);
}

absl::Status SpotlightHashes::Forward(const char* what, bool is_query, int64_t layer, int64_t head,
                                      const float* x, int64_t n, uint16_t* codes, float* z,
                                      SimdLevel level) const {
  const int64_t slot = Slot(layer);
  if (slot < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": layer ", layer,
        " is not in the spotlight file (its layers: ", absl::StrJoin(layers_, ", "), ")"));
  }
  const int64_t heads = is_query ? n_head_ : n_head_kv_;
  if (head < 0 || head >= heads) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", is_query ? "head" : "kv_head", " ",
                                                   head, " out of range [0, ", heads, ")"));
  }
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat(what, ": n < 0: ", n));
  if (n == 0) return absl::OkStatus();
  if (x == nullptr) return absl::InvalidArgumentError(absl::StrCat(what, ": null x"));
  level = ClampToDetected(level);
  void (*kernel)(const internal::SpotlightMlpArgs&) =
      level == SimdLevel::kAvx512 ? internal::SpotlightMlpAvx512
      : level == SimdLevel::kAvx2 ? internal::SpotlightMlpAvx2
                                  : internal::SpotlightMlpScalar;

  const Mlp& mlp = mlps_[slot * (n_head_kv_ + n_head_) + (is_query ? n_head_kv_ : 0) + head];
  const int64_t d = head_dim_;
  const int64_t dp = internal::SpotlightPadded(d);
  const int64_t bp = internal::SpotlightPadded(bits_);
  const float* w1t = weights_.data() + mlp.offset;
  const float* b1 = w1t + d * dp;
  const float* w2t = b1 + dp;
  const float* b2 = w2t + d * bp;
  constexpr int64_t kRows = 64;
  const int64_t n_blocks = (n + kRows - 1) / kRows;
  auto run_blocks = [&](int64_t b0, int64_t b1_end) {
    std::vector<float> scratch(static_cast<size_t>(2 * kRows * dp));
    for (int64_t b = b0; b < b1_end; ++b) {
      const int64_t r0 = b * kRows;
      internal::SpotlightMlpArgs a;
      a.x = x + r0 * d;
      a.n = std::min(kRows, n - r0);
      a.d = d;
      a.bits = bits_;
      a.in_scale = mlp.in_scale;
      a.w1t = w1t;
      a.b1 = b1;
      a.w2t = w2t;
      a.b2 = b2;
      a.scaled = scratch.data();
      a.hidden = scratch.data() + kRows * dp;
      a.z = z == nullptr ? nullptr : z + r0 * bits_;
      a.codes = codes == nullptr ? nullptr : codes + r0 * words();
      kernel(a);
    }
  };
  if (n_blocks <= 1) {
    run_blocks(0, n_blocks);
  } else {
    tbb::parallel_for(
        tbb::blocked_range<int64_t>(0, n_blocks),
        [&](const tbb::blocked_range<int64_t>& r) { run_blocks(r.begin(), r.end()); });
  }
  return absl::OkStatus();
}

}  // namespace magicpig::attention
