// zinf/device_memory.h — the CUDA device's memory arithmetic in plain C++, so that its allocator,
// the offload engine's fit check and `zinf plan` count device memory the same way, and the CPU tests
// check it without a GPU:
//   - the block the caching allocator takes for a request (it rounds, so exact bytes undercount);
//   - the scratch the model's ops allocate for themselves on first use (cuBLASLt's workspace, the
//     attention backward's scratch, the fast kernels' column partials and token sort), which no
//     layer above the ops would otherwise see;
//   - the automatic budget (device.memory_budget: auto), which keeps a reserve of the GPU's free
//     memory for what the allocator never sees (cuBLAS/cuBLASLt handles and their internal
//     workspaces, NCCL's communicators and buffers, the CUDA module images loaded lazily).
// The CPU device allocates exact bytes and needs none of this.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace zinf {

// The caching allocator's block for a request of `bytes`: 512-byte granules below 1 MiB, 2 MiB
// granules from 1 MiB on; an empty request takes one granule. Freed blocks are cached by this size.
constexpr std::uint64_t cuda_block_bytes(std::uint64_t bytes) {
  constexpr std::uint64_t small = 512, large = std::uint64_t{2} << 20, split = std::uint64_t{1} << 20;
  if (bytes == 0) bytes = 1;
  return bytes < split ? (bytes + small - 1) / small * small : (bytes + large - 1) / large * large;
}

// The reserve `device.memory_budget: auto` leaves out of the GPU's free memory: max(1 GiB, 3% of
// its total memory). The allocator's budget cannot see cuBLAS/cuBLASLt (a few MiB per handle plus
// their internal workspaces), NCCL (its channel buffers: tens to hundreds of MiB per communicator,
// several communicators per rank) or the kernels' module images, which are loaded on first launch;
// 1 GiB covers those on a small GPU, and 3% scales with the larger GPUs' larger NCCL and cuBLAS
// footprints (about 4 GiB of an 80 GB H100, 4.2 GiB of a 141 GB H200) and leaves room for
// fragmentation. A budget set in the config is used as given.
constexpr std::uint64_t cuda_budget_reserve(std::uint64_t total_bytes) {
  return std::max<std::uint64_t>(std::uint64_t{1} << 30, total_bytes / 100 * 3);
}
// The automatic budget: the free memory less the reserve (0 when the reserve is not free).
constexpr std::uint64_t cuda_auto_budget(std::uint64_t free_bytes, std::uint64_t total_bytes) {
  const std::uint64_t reserve = cuda_budget_reserve(total_bytes);
  return free_bytes > reserve ? free_bytes - reserve : 0;
}

// cuBLASLt's workspace: one per ops backend, allocated with it; every GEMM of that kernel set runs
// within it. The reference kernels' fp32 and split-K GEMMs fit 8 MiB; the fast kernels' Hopper
// tensor-core GEMMs (stream-K, fused epilogues) ask for up to 32 MiB. The ops backends allocate
// exactly these, so the plan counts what a run takes.
constexpr std::uint64_t kGemmWorkspaceBytesReference = std::uint64_t{8} << 20;
constexpr std::uint64_t kGemmWorkspaceBytesFast = std::uint64_t{32} << 20;
constexpr std::uint64_t gemm_workspace_bytes(bool fast) {
  return fast ? kGemmWorkspaceBytesFast : kGemmWorkspaceBytesReference;
}

// cuDNN's fused attention (device.attention cudnn): one workspace per ops backend, taken on the first
// shape cuDNN accepts (grown for a larger one), of 64 MiB plus two fp32 copies of the query rows
// (B·T·C elements each) plus the deterministic Hopper backward's dP workspace, B·H rows of 16-bit
// scores with both sequence dimensions padded to 64. This is the ceiling: only engines whose
// workspace fits are chosen, and the workspace taken is the chosen plans' own need (at most this), so
// zinf plan's count is an upper bound.
constexpr std::uint64_t kCudnnWorkspaceBaseBytes = std::uint64_t{64} << 20;
constexpr std::uint64_t cudnn_workspace_bytes(std::uint64_t batch_heads, std::uint64_t seq, std::uint64_t query_elems) {
  const std::uint64_t padded = (seq + 63) / 64 * 64;
  return kCudnnWorkspaceBaseBytes + 2 * query_elems * 4 + batch_heads * padded * padded * 2;
}
// The backward's softmax sums Δ = Σ_d dO ∘ O, one float per (batch, head, position): a graph output
// in the ops' own scratch.
constexpr std::uint64_t cudnn_backward_scratch_bytes(std::uint64_t batch_heads_seq) { return batch_heads_seq * 4; }

// What the ops' own scratch depends on: the model family and shape, the micro batch and the kernels.
struct OpsScratchShape {
  bool llama = false;  // GPT: packed qkv attention; llama: separate q/k/v (GQA)
  std::uint64_t batch = 1, seq = 1, heads = 1, width = 1;
  std::uint64_t kv_heads = 0;  // 0: as many as heads
  bool fast = false;  // device.kernels: fast (the tensor-core kernels); else the reference kernels
  bool cudnn = false;  // fast with cuDNN's attention
};

// Bounds the fast kernels must stay within (the plan counts exactly these):
//   the flash attention backward's scratch  <= kFlashScratchFloatsPerRow floats per (b, h, t) row
//   column_partials_floats(R, C)            <= 2 * C * min(R, kPartialRowsMax) floats
//   token_sort_ints(R)                      <= 2 * R + kTokenSortSlackInts ints
constexpr std::uint64_t kFlashScratchFloatsPerRow = 4;
constexpr std::uint64_t kPartialRowsMax = 1024;
constexpr std::uint64_t kTokenSortSlackInts = std::uint64_t{1} << 16;

// The device blocks the ops allocate for themselves, each as the ops ask for it (before the
// allocator's rounding), for one micro batch of `batch` sequences:
//   reference, both families: the cuBLASLt workspace (kGemmWorkspaceBytesReference);
//   reference GPT:   the attention backward's scores gradient, B*H*T*T floats;
//   reference llama: the attention backward's per-row sums, B*H*T floats;
//   fast:            the workspace (kGemmWorkspaceBytesFast); the flash backward's scratch, 4*B*H*T floats; the column
//                    partials of the norms' and biases' backward, 2*C*min(B*T, 1024) floats; the
//                    embedding backward's token sort, (2*B*T + 65536) ints;
//   fast with cuDNN: also cuDNN's workspace (cudnn_workspace_bytes(B*H, T, B*T*C)) and the backward's
//                    softmax sums, B*H*T floats.
// The reference kernels' norms and column sums use no scratch.
inline std::vector<std::uint64_t> ops_scratch_blocks(const OpsScratchShape& s) {
  const std::uint64_t rows = s.batch * s.seq, bht = s.batch * s.heads * s.seq;
  std::vector<std::uint64_t> blocks{gemm_workspace_bytes(s.fast)};
  if (!s.fast) {
    blocks.push_back((s.llama ? bht : bht * s.seq) * 4);
    return blocks;
  }
  blocks.push_back(kFlashScratchFloatsPerRow * bht * 4);
  blocks.push_back(2 * s.width * std::min(rows, kPartialRowsMax) * 4);
  blocks.push_back((2 * rows + kTokenSortSlackInts) * 4);
  if (s.cudnn) {
    blocks.push_back(cudnn_workspace_bytes(s.batch * s.heads, s.seq, rows * s.width));
    blocks.push_back(cudnn_backward_scratch_bytes(bht));
  }
  return blocks;
}

}  // namespace zinf
