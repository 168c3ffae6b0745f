// The engine's command-line flags (the model, threads, context, decode attention and attention
// nodes), declared once in a flags::FlagTable for every program that loads an Engine: `magicpig
// run`, `magicpig bench` and the compute node server (`magicpig serve`, magicpig_gpu_node). The
// attention flags come from the estimator registry and the parameters' declarations
// (common/attention/estimator_registry.h, estimator_params.h).
//
// Thread-safety: call from the thread that parses.
#ifndef MAGICPIG_GPU_NODE_ENGINE_ENGINE_FLAGS_H_
#define MAGICPIG_GPU_NODE_ENGINE_ENGINE_FLAGS_H_

#include "common/flags/flag_table.h"
#include "gpu_node/engine/engine.h"

namespace magicpig::engine {

// Declares --model (required), --threads and --ctx, writing into `*options`, whose current values
// are the defaults.
void DeclareModelFlags(flags::FlagTable& table, EngineOptions* options);

// Declares --va-epsilon, --va-delta, --va-heavy and --va-base-rate (vattention's parameters).
void DeclareVAttentionFlags(flags::FlagTable& table, attention::VAttentionParams* va);

// Declares --attention, --lsh-k, --lsh-l, --lsh-seed, --budget, vattention's parameters and
// --shard-block.
void DeclareAttentionFlags(flags::FlagTable& table, SparseAttentionOptions* attention);

// Declares --attention-nodes, --ping-pong, --coalesce-attend, --attend-timeout-ms, --placement.
void DeclareAttentionNodeFlags(flags::FlagTable& table, EngineOptions* options);

// All three.
void DeclareEngineFlags(flags::FlagTable& table, EngineOptions* options);

}  // namespace magicpig::engine

#endif  // MAGICPIG_GPU_NODE_ENGINE_ENGINE_FLAGS_H_
