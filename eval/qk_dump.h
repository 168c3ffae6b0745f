// Real post-RoPE keys, values and queries of SmolLM2 (or any GGUF llama/qwen2 model), captured
// during an exact prefill, for the attention accuracy test and the LSH budget measurement
// (issue #3). Not production code: it lives with the tests.
//
// CaptureQk tokenizes text (the files concatenated, separated by a blank line, then repeated at
// the token level until `n_tokens` ids), prefills them with the engine's Transformer, and keeps
//   - the post-RoPE keys of every position and kv head of the chosen layers, as float32 straight
//     from ForwardOptions::on_qk (before the fp16 KV-cache rounding);
//   - optionally the values of those layers, read back from the fp16 KV cache (on_qk does not see
//     values; the exact attention reads these same fp16 values);
//   - the post-RoPE queries of all query heads at the last `n_queries` positions.
//
// Dump file format (all little-endian, as written on x86-64):
//   char    magic[8] = "MPQKDMP1"
//   int64   n_tokens, n_queries, n_head, n_head_kv, head_dim, n_layer_model, n_layers, has_values
//   int64   layers[n_layers]                       (model layer index of each dumped layer)
//   int32   tokens[n_tokens]                       (the token ids that were prefilled)
//   then for each dumped layer, in order:
//     float32 keys[n_tokens][n_head_kv][head_dim]
//     float32 values[n_tokens][n_head_kv][head_dim]   (only if has_values != 0)
//     float32 queries[n_queries][n_head][head_dim]    (positions n_tokens - n_queries ...)
//
// Thread-safety: plain data and free functions.
#ifndef MAGICPIG_EVAL_QK_DUMP_H_
#define MAGICPIG_EVAL_QK_DUMP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace magicpig::accuracy {

struct QkDump {
  int64_t n_tokens = 0;
  int64_t n_queries = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  int64_t n_layer_model = 0;
  std::vector<int64_t> layers;  // model layer index of each captured layer
  std::vector<int32_t> tokens;
  // Tokens in one pass over the text, before repetition (CaptureQk only; not stored in the file).
  int64_t text_tokens = 0;
  // Indexed by captured-layer slot (same order as `layers`).
  std::vector<std::vector<float>> keys;     // [n_tokens][n_head_kv][head_dim]
  std::vector<std::vector<float>> values;   // same shape, or empty when not captured
  std::vector<std::vector<float>> queries;  // [n_queries][n_head][head_dim]

  bool has_values() const { return !values.empty() && !values[0].empty(); }
  const float* Key(size_t slot, int64_t pos, int64_t kv_head) const {
    return keys[slot].data() + (pos * n_head_kv + kv_head) * head_dim;
  }
  const float* Value(size_t slot, int64_t pos, int64_t kv_head) const {
    return values[slot].data() + (pos * n_head_kv + kv_head) * head_dim;
  }
  // j-th captured query position (position n_tokens - n_queries + j).
  const float* Query(size_t slot, int64_t j, int64_t head) const {
    return queries[slot].data() + (j * n_head + head) * head_dim;
  }
  // One kv head's keys (or values) over positions [begin, end), contiguous [end - begin][head_dim].
  std::vector<float> HeadRows(const std::vector<float>& src, int64_t kv_head, int64_t begin,
                              int64_t end) const;
};

struct QkCaptureOptions {
  std::string model_path;
  std::vector<std::string> text_paths;
  int64_t n_tokens = 2048;
  int64_t n_queries = 16;
  std::vector<int64_t> layers;  // empty: every layer
  bool capture_values = true;
  int num_threads = 0;  // 0: all cores
};

// INVALID_ARGUMENT for bad sizes (n_tokens above the model's context, n_queries > n_tokens, layer
// out of range, empty text); NOT_FOUND / other errors from the model loader are passed through.
absl::StatusOr<QkDump> CaptureQk(const QkCaptureOptions& options);

absl::Status WriteQkDump(const QkDump& dump, const std::string& path);
// DATA_LOSS for a truncated or malformed file.
absl::StatusOr<QkDump> ReadQkDump(const std::string& path);

}  // namespace magicpig::accuracy

#endif  // MAGICPIG_EVAL_QK_DUMP_H_
