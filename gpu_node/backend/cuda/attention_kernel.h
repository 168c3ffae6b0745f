// Which CUDA kernel computes exact (causal) attention. Plain C++ (no CUDA headers), so the flag
// table and the backend factory can name the choice in builds without the CUDA backend.
#ifndef MAGICPIG_GPU_NODE_BACKEND_CUDA_ATTENTION_KERNEL_H_
#define MAGICPIG_GPU_NODE_BACKEND_CUDA_ATTENTION_KERNEL_H_

#include <string>
#include <utility>
#include <vector>

namespace magicpig::backend {

enum class CudaAttentionKernel {
  // Tiled for chunks of several queries (prefill), split-K for one query per sequence (decode):
  // what an H200 measured fastest at 8246c35 (docs/gpu.md). Tiled prefill was 3.5x split-K at
  // 4K and 4.8x at 16K on the SmolLM2 shape; tiled decode was 10-20% slower up to 4K.
  kAuto,
  // Blocks of (query, head, key piece); a key's row is read once per query and head.
  kSplitK,
  // Up to 16 query-head rows of one GQA group share each tile of keys in shared memory
  // (head_dim <= 128; wider heads fall back to split-K).
  kTiled,
  // Prefill chunks of kTensorMinQueries queries or more as cuBLAS products on the tensor cores
  // (scores = q·Kᵀ, then the causal softmax, then p·V, over the fp16 cache with fp16 queries and
  // probabilities and fp32 accumulation: errors near 1e-3 of the output's scale, against ~1e-6
  // for the other two); decode and shorter chunks through split-K. Not yet checked on a GPU.
  kTensor,
};

// The fewest queries a chunk needs for kTensor's products.
inline constexpr int kTensorMinQueries = 16;

// Names for --cuda-attention-kernel.
inline std::vector<std::pair<std::string, CudaAttentionKernel>> CudaAttentionKernelChoices() {
  return {{"auto", CudaAttentionKernel::kAuto},
          {"split-k", CudaAttentionKernel::kSplitK},
          {"tiled", CudaAttentionKernel::kTiled},
          {"tensor", CudaAttentionKernel::kTensor}};
}

}  // namespace magicpig::backend

#endif  // MAGICPIG_GPU_NODE_BACKEND_CUDA_ATTENTION_KERNEL_H_
