#include "tests/testing/synthetic_engine.h"

#include <utility>

#include "common/status_macros.h"
#include "gpu_node/backend/cpu/cpu_backend.h"

namespace magicpig::testing {

absl::StatusOr<std::unique_ptr<engine::Engine>> MakeSyntheticEngine(
    const SyntheticModelOptions& model, const engine::EngineOptions& options, SimdLevel level) {
  return MakeSyntheticEngine(model, options, std::make_unique<backend::CpuBackend>(1, level));
}

absl::StatusOr<std::unique_ptr<engine::Engine>> MakeSyntheticEngine(
    const SyntheticModelOptions& model, const engine::EngineOptions& options,
    std::unique_ptr<backend::Backend> backend) {
  MAGICPIG_ASSIGN_OR_RETURN(auto bytes, BuildSyntheticModel(model));
  MAGICPIG_ASSIGN_OR_RETURN(auto file, model::GgufFile::FromBytes(bytes));
  return engine::Engine::Create(std::shared_ptr<const model::GgufFile>(std::move(file)),
                                std::move(backend), options);
}

engine::EngineOptions FullAttentionOptions() {
  engine::EngineOptions options;
  options.attention.mode = attention::EstimatorKind::kFull;
  return options;
}

SyntheticModelOptions SmallModel(int64_t n_layer) {
  SyntheticModelOptions m;
  m.n_layer = n_layer;
  m.n_embd = 64;
  m.n_ff = 128;
  m.n_head = 4;
  m.n_head_kv = 2;  // head_dim 16
  m.context_length = 256;
  return m;
}

}  // namespace magicpig::testing
