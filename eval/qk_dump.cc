#include "eval/qk_dump.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cpu_features.h"
#include "common/half.h"
#include "common/status_macros.h"
#include "gpu_node/backend/cpu/cpu_backend.h"
#include "gpu_node/engine/kv_cache.h"
#include "gpu_node/engine/transformer.h"
#include "gpu_node/model/gguf_file.h"
#include "gpu_node/model/model_weights.h"
#include "gpu_node/model/tokenizer.h"

namespace magicpig::accuracy {
namespace {

constexpr char kMagic[8] = {'M', 'P', 'Q', 'K', 'D', 'M', 'P', '1'};

absl::StatusOr<std::vector<int32_t>> BuildTokens(const model::Tokenizer& tok,
                                                 const std::vector<std::string>& paths,
                                                 int64_t n_tokens, int64_t* text_tokens) {
  std::string text;
  for (const std::string& path : paths) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
    std::stringstream ss;
    ss << in.rdbuf();
    text += ss.str();
    text += "\n\n";  // also separates one repetition from the next
  }
  // parse_special = false: the text is data, not a chat template.
  const std::vector<int32_t> once = tok.Encode(text, /*parse_special=*/false);
  if (once.empty()) return absl::InvalidArgumentError("the text encodes to no tokens");
  *text_tokens = static_cast<int64_t>(once.size());
  std::vector<int32_t> ids;
  ids.reserve(static_cast<size_t>(n_tokens));
  while (static_cast<int64_t>(ids.size()) < n_tokens) {
    const size_t take = std::min(once.size(), static_cast<size_t>(n_tokens) - ids.size());
    ids.insert(ids.end(), once.begin(), once.begin() + static_cast<std::ptrdiff_t>(take));
  }
  return ids;
}

template <typename T>
void Put(std::ofstream& out, const T* p, size_t count) {
  out.write(reinterpret_cast<const char*>(p), static_cast<std::streamsize>(count * sizeof(T)));
}

template <typename T>
bool Get(std::ifstream& in, T* p, size_t count) {
  in.read(reinterpret_cast<char*>(p), static_cast<std::streamsize>(count * sizeof(T)));
  return static_cast<bool>(in);
}

}  // namespace

std::vector<float> QkDump::HeadRows(const std::vector<float>& src, int64_t kv_head, int64_t begin,
                                    int64_t end) const {
  std::vector<float> out(static_cast<size_t>((end - begin) * head_dim));
  for (int64_t p = begin; p < end; ++p) {
    std::memcpy(out.data() + (p - begin) * head_dim,
                src.data() + (p * n_head_kv + kv_head) * head_dim, head_dim * sizeof(float));
  }
  return out;
}

absl::StatusOr<QkDump> CaptureQk(const QkCaptureOptions& options) {
  MAGICPIG_ASSIGN_OR_RETURN(std::unique_ptr<model::GgufFile> file,
                            model::GgufFile::Open(options.model_path));
  std::shared_ptr<const model::GgufFile> shared(std::move(file));
  MAGICPIG_ASSIGN_OR_RETURN(std::unique_ptr<model::ModelWeights> weights,
                            model::ModelWeights::Load(shared));
  MAGICPIG_ASSIGN_OR_RETURN(std::unique_ptr<model::Tokenizer> tok,
                            model::Tokenizer::FromGguf(*shared));
  const model::ModelConfig& c = weights->config();
  if (options.n_tokens < 1 || options.n_tokens > c.context_length) {
    return absl::InvalidArgumentError(
        absl::StrCat("n_tokens must be in [1, ", c.context_length, "], got ", options.n_tokens));
  }
  if (options.n_queries < 0 || options.n_queries > options.n_tokens) {
    return absl::InvalidArgumentError("n_queries must be in [0, n_tokens]");
  }
  QkDump dump;
  dump.n_tokens = options.n_tokens;
  dump.n_queries = options.n_queries;
  dump.n_head = c.n_head;
  dump.n_head_kv = c.n_head_kv;
  dump.head_dim = c.head_dim;
  dump.n_layer_model = c.n_layer;
  dump.layers = options.layers;
  if (dump.layers.empty()) {
    for (int64_t l = 0; l < c.n_layer; ++l) dump.layers.push_back(l);
  }
  std::vector<int> slot_of(static_cast<size_t>(c.n_layer), -1);
  for (size_t s = 0; s < dump.layers.size(); ++s) {
    const int64_t l = dump.layers[s];
    if (l < 0 || l >= c.n_layer || slot_of[static_cast<size_t>(l)] >= 0) {
      return absl::InvalidArgumentError(absl::StrCat("bad or repeated layer ", l));
    }
    slot_of[static_cast<size_t>(l)] = static_cast<int>(s);
  }
  MAGICPIG_ASSIGN_OR_RETURN(
      dump.tokens, BuildTokens(*tok, options.text_paths, options.n_tokens, &dump.text_tokens));

  const int64_t kv_dim = c.kv_dim(), q_dim = c.q_dim();
  dump.keys.assign(dump.layers.size(), std::vector<float>(options.n_tokens * kv_dim));
  dump.queries.assign(dump.layers.size(), std::vector<float>(options.n_queries * q_dim));
  const int64_t first_query = options.n_tokens - options.n_queries;

  backend::CpuBackend backend(options.num_threads, ActiveSimdLevel());
  engine::Transformer transformer(weights.get(), &backend);
  MAGICPIG_ASSIGN_OR_RETURN(
      std::unique_ptr<engine::KvCache> kv,
      engine::KvCache::Create(c.n_layer, c.n_head_kv, c.head_dim, options.n_tokens));
  engine::ForwardOptions fwd;
  fwd.logits = engine::LogitsMode::kNone;
  fwd.on_qk = [&](int64_t layer, int64_t first_pos, int64_t n, const float* q, const float* k) {
    const int slot = slot_of[static_cast<size_t>(layer)];
    if (slot < 0) return;
    std::memcpy(dump.keys[slot].data() + first_pos * kv_dim, k, n * kv_dim * sizeof(float));
    for (int64_t t = std::max<int64_t>(0, first_query - first_pos); t < n; ++t) {
      std::memcpy(dump.queries[slot].data() + (first_pos + t - first_query) * q_dim, q + t * q_dim,
                  q_dim * sizeof(float));
    }
  };
  MAGICPIG_RETURN_IF_ERROR(transformer.Forward(dump.tokens, *kv, fwd, nullptr));

  if (options.capture_values) {
    dump.values.assign(dump.layers.size(), std::vector<float>(options.n_tokens * kv_dim));
    for (size_t s = 0; s < dump.layers.size(); ++s) {
      const backend::KvLayerView view = kv->layer(dump.layers[s]);
      // The cache rows are [position][n_head_kv][head_dim], the same layout as the dump.
      for (int64_t i = 0; i < options.n_tokens * kv_dim; ++i) {
        dump.values[s][static_cast<size_t>(i)] = Fp16ToFloat(view.v[i]);
      }
    }
  }
  return dump;
}

absl::Status WriteQkDump(const QkDump& dump, const std::string& path) {
  std::ofstream out(path, std::ios::binary);
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  out.write(kMagic, sizeof(kMagic));
  const int64_t header[8] = {dump.n_tokens,
                             dump.n_queries,
                             dump.n_head,
                             dump.n_head_kv,
                             dump.head_dim,
                             dump.n_layer_model,
                             static_cast<int64_t>(dump.layers.size()),
                             dump.has_values() ? 1 : 0};
  Put(out, header, 8);
  Put(out, dump.layers.data(), dump.layers.size());
  Put(out, dump.tokens.data(), dump.tokens.size());
  for (size_t s = 0; s < dump.layers.size(); ++s) {
    Put(out, dump.keys[s].data(), dump.keys[s].size());
    if (dump.has_values()) Put(out, dump.values[s].data(), dump.values[s].size());
    Put(out, dump.queries[s].data(), dump.queries[s].size());
  }
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("short write to ", path));
  return absl::OkStatus();
}

absl::StatusOr<QkDump> ReadQkDump(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  char magic[8];
  int64_t h[8];
  if (!Get(in, magic, 8) || std::memcmp(magic, kMagic, 8) != 0 || !Get(in, h, 8)) {
    return absl::DataLossError(absl::StrCat(path, ": not a qk dump"));
  }
  QkDump d;
  d.n_tokens = h[0];
  d.n_queries = h[1];
  d.n_head = h[2];
  d.n_head_kv = h[3];
  d.head_dim = h[4];
  d.n_layer_model = h[5];
  const int64_t n_layers = h[6];
  const bool has_values = h[7] != 0;
  constexpr int64_t kMax = int64_t{1} << 24;  // sanity bound against garbage headers
  for (int64_t v : {d.n_tokens, d.n_queries, d.n_head, d.n_head_kv, d.head_dim, n_layers}) {
    if (v < 0 || v > kMax) return absl::DataLossError(absl::StrCat(path, ": bad header"));
  }
  if (d.n_head_kv == 0 || d.n_head % d.n_head_kv != 0 || d.n_queries > d.n_tokens) {
    return absl::DataLossError(absl::StrCat(path, ": inconsistent header"));
  }
  d.layers.resize(static_cast<size_t>(n_layers));
  d.tokens.resize(static_cast<size_t>(d.n_tokens));
  if (!Get(in, d.layers.data(), d.layers.size()) || !Get(in, d.tokens.data(), d.tokens.size())) {
    return absl::DataLossError(absl::StrCat(path, ": truncated"));
  }
  const size_t kv_elems = static_cast<size_t>(d.n_tokens * d.n_head_kv * d.head_dim);
  const size_t q_elems = static_cast<size_t>(d.n_queries * d.n_head * d.head_dim);
  for (int64_t s = 0; s < n_layers; ++s) {
    d.keys.emplace_back(kv_elems);
    if (!Get(in, d.keys.back().data(), kv_elems)) {
      return absl::DataLossError(absl::StrCat(path, ": truncated"));
    }
    if (has_values) {
      d.values.emplace_back(kv_elems);
      if (!Get(in, d.values.back().data(), kv_elems)) {
        return absl::DataLossError(absl::StrCat(path, ": truncated"));
      }
    }
    d.queries.emplace_back(q_elems);
    if (!Get(in, d.queries.back().data(), q_elems)) {
      return absl::DataLossError(absl::StrCat(path, ": truncated"));
    }
  }
  return d;
}

}  // namespace magicpig::accuracy
