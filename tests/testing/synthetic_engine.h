// An Engine over a small synthetic GGUF model on the CPU backend (1 thread), for unit tests of
// the engine, the scheduler and the server: no model file needed, deterministic weights.
#ifndef MAGICPIG_TESTS_TESTING_SYNTHETIC_ENGINE_H_
#define MAGICPIG_TESTS_TESTING_SYNTHETIC_ENGINE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/cpu_features.h"
#include "gpu_node/engine/engine.h"
#include "tests/testing/synthetic_model.h"

namespace magicpig::testing {

// level: the CPU backend's SIMD level (AVX2 and scalar products are batch-invariant: a row's
// result does not depend on how many rows are multiplied together).
absl::StatusOr<std::unique_ptr<engine::Engine>> MakeSyntheticEngine(
    const SyntheticModelOptions& model, const engine::EngineOptions& options,
    SimdLevel level = ActiveSimdLevel());
// The same on a backend of the caller's (a device backend, a fake one, another CPU setting).
absl::StatusOr<std::unique_ptr<engine::Engine>> MakeSyntheticEngine(
    const SyntheticModelOptions& model, const engine::EngineOptions& options,
    std::unique_ptr<backend::Backend> backend);

// Engine options with exact (full) attention for every decode step.
engine::EngineOptions FullAttentionOptions();

// `n_layer` layers (3: with dense_layers = {0} two are sparse) of width 64, 4 query heads over 2
// KV heads of dimension 16, context 256: the small model the engine, scheduler and server tests
// run.
SyntheticModelOptions SmallModel(int64_t n_layer = 3);

}  // namespace magicpig::testing

#endif  // MAGICPIG_TESTS_TESTING_SYNTHETIC_ENGINE_H_
