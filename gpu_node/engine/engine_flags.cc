#include "gpu_node/engine/engine_flags.h"

#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/attention/estimator_params.h"
#include "common/attention/estimator_registry.h"

namespace magicpig::engine {
namespace {

template <typename S, typename T>
void DeclareParam(flags::FlagTable& table, const attention::ParamSpecOf<S>& spec, T* target) {
  table.Number(std::string(spec.flag), target, std::string(spec.help), static_cast<T>(spec.min),
               static_cast<T>(spec.max));
}

}  // namespace

void DeclareModelFlags(flags::FlagTable& table, EngineOptions* options) {
  table.Section("model");
  table.Text("model", &options->model_path, "FILE.gguf", "the model");
  table.Require("model");
  table.Number("threads", &options->num_threads, "CPU threads; 0 = all cores", 0, 4096);
  table.Choice("backend", &options->backend,
               "the compute backend for the dense layers: cuda (a GPU), cpu, or auto (cuda when "
               "this build has it and a device is visible, else cpu)",
               backend::BackendKindChoices());
  table.Number("gpu", &options->gpu, "the CUDA device index, with --backend cuda", 0, 1023);
  table.Switch("cuda-graphs", &options->cuda_graphs,
               "with --backend cuda, record each decode step as a CUDA graph and replay it instead "
               "of launching its operations one by one (steps with sparse attention are never "
               "recorded: they hand work to the host between layers); measured no faster yet "
               "(docs/gpu.md)");
  table.Choice("cuda-attention-kernel", &options->cuda_attention_kernel,
               "with --backend cuda, the exact attention kernel: tiled (up to 16 query-head rows "
               "of one GQA group share each tile of keys in shared memory; head_dim <= 128), "
               "split-k (blocks of query, head and key piece), auto (tiled for prefill chunks, "
               "split-k for decode: the faster of the two for each on an H200), or tensor "
               "(prefill chunks of 16 queries or more as fp16 cuBLAS products on the tensor "
               "cores, errors near 1e-3; decode split-k; not yet checked on a GPU) (docs/gpu.md)",
               backend::CudaAttentionKernelChoices());
  table.Switch("cuda-wide-merge", &options->cuda_wide_merge,
               "with --backend cuda, merge the attention kernels' partial outputs with one block "
               "of 16 warps per (query, head) row instead of one thread per dimension walking the "
               "key pieces (a decode step at 32K has hundreds of pieces per row); not yet checked "
               "on a GPU, so off by default (docs/gpu.md)");
  table.Bytes("gpu-kv-budget", &options->gpu_kv_budget,
              "cap on the GPU memory the sequences' KV caches may take (0: none; e.g. 24G to "
              "behave like a 24 GB card on a larger one); a request that does not fit waits for "
              "running ones to finish. No effect on the cpu backend");
  table.Bytes("host-kv-budget", &options->host_kv_budget,
              "cap on the host memory the sequences may take in this process (0: none): the cpu "
              "backend's KV caches, a GPU cache's host mirror and embedded attention shards, each "
              "request charged at its capacity as an attention node reserves; a request that "
              "does not fit waits for running ones to finish, one that never can is refused");
  table.Number("ctx", &options->context_length, "context length in tokens; 0 = the model's",
               int64_t{0}, std::numeric_limits<int64_t>::max());
  table.Choice("mmap", &options->map_weights,
               "on: map the model file (instant start, pages shared with the page cache); off: "
               "read it into process memory on transparent huge pages (reads the whole file at "
               "start and adds its size to the RSS; CPU decoding ~7% faster from fewer TLB "
               "misses; on AVX-512 the Q4_K, Q6_K, Q4_1 and Q8_0 matrices are also put in the "
               "interleaved layout of their faster kernels); auto: off for the cpu backend, on "
               "for cuda (which copies the weights to the device)",
               {{"auto", MapWeights::kAuto}, {"on", MapWeights::kOn}, {"off", MapWeights::kOff}});
}

void DeclareVAttentionFlags(flags::FlagTable& table, attention::VAttentionParams* va) {
  DeclareParam(table, attention::kVaEpsilon, &va->epsilon);
  DeclareParam(table, attention::kVaDelta, &va->delta);
  DeclareParam(table, attention::kVaHeavy, &va->heavy);
  DeclareParam(table, attention::kVaBaseRate, &va->base_rate);
}

void DeclareAttentionFlags(flags::FlagTable& table, SparseAttentionOptions* attention) {
  table.Section("decode attention");
  std::vector<std::pair<std::string, attention::EstimatorKind>> modes;
  std::string help = "the decode attention estimator:";
  for (const attention::EstimatorSpec& spec : attention::AllEstimators()) {
    modes.emplace_back(std::string(spec.name), spec.kind);
    absl::StrAppend(&help, modes.size() > 1 ? ";" : "", " ", std::string(spec.name), " = ",
                    std::string(spec.help));
  }
  table.Choice("attention", &attention->mode, help, std::move(modes));
  DeclareParam(table, attention::kLshK, &attention->lsh_k);
  DeclareParam(table, attention::kLshL, &attention->lsh_l);
  DeclareParam(table, attention::kLshSeed, &attention->lsh_seed);
  DeclareParam(table, attention::kBudget, &attention->budget);
  DeclareVAttentionFlags(table, &attention->vattention);
  DeclareParam(table, attention::kSpotFraction, &attention->spotlight_fraction);
  DeclareParam(table, attention::kSpotRerank, &attention->spotlight_rerank);
  DeclareParam(table, attention::kSketchDims, &attention->sketch_dims);
  table.Text(
      "spotlight-file", &attention->spotlight_file, "FILE.spot",
      "trained spotlight hashes for this model (eval/spotlight/train.py; docs/spotlight.md), "
      "read at start; needed by --attention spotlight and by requests that choose it");
  table.Number("sparse-min-keys", &attention->min_offload_keys,
               "a sparse layer attends exactly until its offloaded region (the prompt minus the "
               "sinks and the local window, then the tokens that leave the window) holds this "
               "many keys; below about 3K keys the sampled path costs more than exact attention "
               "(docs/sparse-decode.md). 1: sample as soon as there is anything to sample",
               int64_t{1}, int64_t{1} << 40);
  table.Switch("no-device-key-codes", &attention->device_key_codes,
               "with a GPU backend, hash the prefill's offloaded keys on the host instead of on "
               "the GPU (the same codes but where a projection is within rounding of zero; for "
               "comparison and as a fallback)",
               /*present_value=*/false);
  table.Number("shard-block", &attention->shard_block,
               "tokens per block of the offloaded prompt region; each block has its own KV shard "
               "and LSH tables, attended separately and merged in order (embedded and on attention "
               "nodes alike)",
               int64_t{64}, int64_t{1} << 24);
}

void DeclareAttentionNodeFlags(flags::FlagTable& table, EngineOptions* options) {
  table.Section("attention nodes");
  table.List("attention-nodes", &options->attention_nodes, "HOST:PORT,...",
             "attention nodes holding the offloaded keys; none: in this process (embedded)");
  table.Choice("ping-pong", &options->ping_pong,
               "with attention nodes, decode a batch as two micro-batches whose remote attention "
               "overlaps the other's dense work (on), as one batch (off), or as whichever of the "
               "two ran faster recently (auto)",
               {{"on", PingPong::kOn}, {"off", PingPong::kOff}, {"auto", PingPong::kAuto}});
  table.Choice("coalesce-attend", &options->coalesce_attend,
               "with attention nodes, send a micro-batch's queries to a node as one message "
               "instead of one per sequence",
               {{"on", true}, {"off", false}});
  table.Custom("attend-timeout-ms", "N",
               "an attention node that does not answer a step within N ms counts as failed and "
               "its sequences are placed again (>= 1)",
               absl::StrCat(options->attend_timeout.count()),
               [options](absl::string_view text) -> absl::Status {
                 int64_t ms = 0;
                 if (!absl::SimpleAtoi(text, &ms) || ms < 1) {
                   return absl::InvalidArgumentError(
                       absl::StrCat("expected an integer >= 1, got '", text, "'"));
                 }
                 options->attend_timeout = std::chrono::milliseconds(ms);
                 return absl::OkStatus();
               });
  table.Choice("placement", &options->placement,
               "with attention nodes, put a sequence's blocks all on the node with the most free "
               "memory (pack) or over every node in proportion to its free memory (spread)",
               {{"pack", remote::Placement::kPack}, {"spread", remote::Placement::kSpread}});
  // Metadata values: printable ASCII, no spaces at the ends (gRPC's rule for ASCII metadata).
  auto metadata_value = [](std::string* target, size_t max) {
    return [target, max](absl::string_view text) -> absl::Status {
      if (text.size() > max) {
        return absl::InvalidArgumentError(absl::StrCat("at most ", max, " bytes"));
      }
      for (char c : text) {
        if (c < 0x21 || c > 0x7e) {
          return absl::InvalidArgumentError("printable ASCII without spaces only");
        }
      }
      *target = std::string(text);
      return absl::OkStatus();
    };
  };
  table.Custom("owner-token", "TOKEN",
               "with --insecure: the secret that names this process's sequences on the attention "
               "nodes (give every restart the same one so it can drop what the last run left)",
               "", metadata_value(&options->owner_token, 256));
  table.ShowDefault("owner-token", "random per start");
  table.Custom("instance-name", "NAME",
               "this compute node's name, stable across restarts: at start it drops the "
               "sequences a previous run under this name and owner left on the attention nodes; "
               "give two compute nodes on one host that share a certificate different names",
               "", metadata_value(&options->instance_name, 256));
  table.ShowDefault("instance-name", "the host name");
  fabric::DeclareTransportSecurityFlags(table, &options->node_security, /*client=*/true);
}

void DeclareEngineFlags(flags::FlagTable& table, EngineOptions* options) {
  DeclareModelFlags(table, options);
  DeclareAttentionFlags(table, &options->attention);
  DeclareAttentionNodeFlags(table, options);
}

}  // namespace magicpig::engine
