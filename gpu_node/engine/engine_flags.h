// Command-line flags shared by every program that loads an Engine (`magicpig run`, the compute
// node server): the model, threads, context, decode attention and attention nodes.
//
// Thread-safety: pure functions.
#ifndef MAGICPIG_GPU_NODE_ENGINE_ENGINE_FLAGS_H_
#define MAGICPIG_GPU_NODE_ENGINE_ENGINE_FLAGS_H_

#include <set>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/cli_args.h"
#include "gpu_node/engine/engine.h"

namespace magicpig::engine {

// The flags (all take a value) EngineOptionsFromArgs reads.
std::set<std::string> EngineValueFlags();

// Their usage lines.
std::string EngineFlagsUsage();

// EngineOptions from --model, --threads, --ctx, --attention, --lsh-k, --lsh-l, --lsh-seed,
// --budget, --attention-nodes. INVALID_ARGUMENT naming the flag for bad values (checked before
// any slow model load).
absl::StatusOr<EngineOptions> EngineOptionsFromArgs(const CliArgs& args);

}  // namespace magicpig::engine

#endif  // MAGICPIG_GPU_NODE_ENGINE_ENGINE_FLAGS_H_
