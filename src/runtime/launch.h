#pragma once
// Launching a fused kernel from its KernelConfig (kernels/comfuse/config.cuh): the TMA
// descriptors of Params (cuTensorMapEncodeTiled, reached through the runtime's driver entry
// point so that nothing links libcuda), the dynamic SMEM and cluster attributes, and a cluster
// launch with the scheduler's grid (kernels/comfuse/scheduler/grid.cuh). Private to src/runtime.
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "comfuse/config.cuh"
#include "comfuse/dtype.h"
#include "comfuse/params.cuh"
#include "comfuse/runtime.h"

namespace comfuse::runtime_detail {

// A: M x K (K contiguous, row stride lda). B: N x K (b_kmajor, stride ldb >= K) or K x N
// (stride ldb >= N). A and B are 16-bit (bf16 or f16), both the same type.
// A gated kernel (KernelConfig::gated) takes the gate's B3 beside B: the same shape and layout.
void set_operands(Params& p, const KernelConfig& k, DType ab, const void* A, int64_t lda, const void* B, int64_t ldb,
                  int M, int N, int K, const void* B3 = nullptr, int64_t ldb3 = 0);
// A batched kernel's matrices (B2bConfig::batched): outer x heads of them, matrix (o, h) at
// o x outer_stride + h x head_stride elements from the base; the kernel's flat batch index is
// o x heads + h (params.cuh batch_coord). outer == 0: not batched (2-D descriptors).
struct BatchLayout {
  uint64_t outer = 0, heads = 1;
  uint64_t outer_stride = 0, head_stride = 0;
};
// A matrix as a kernel's plain loads read it (params.cuh MatrixRef): base, row stride and batch
// strides in elements.
inline MatrixRef matrix_ref(const void* data, int64_t ld, const BatchLayout& batch) {
  return MatrixRef{data, static_cast<long long>(ld), static_cast<long long>(batch.head_stride),
                   static_cast<long long>(batch.outer_stride)};
}

// Output `slot` (the Store node's Out): M x N row-major, row stride ldd; the TMA box is
// `epi_rows` rows (one consumer warp group's tile) of 128 bytes of columns; a batched kernel's
// outputs as `batch` lays them out. Errors name `what`.
void set_output(Params& p, int epi_rows, int slot, DType t, void* D, int64_t ldd, const BatchLayout& batch = {},
                const char* what = "output");
// Epilogue input `slot` (the TileInput node's In): M x cols row-major, row stride ld (the
// epilogue's columns: N, or a B2B kernel's N1 for its F); the TMA box (its L2 prefetch) as an
// output's; a batched kernel's as `batch` lays them out. Errors name `what`.
void set_tile_input(Params& p, int epi_rows, int slot, DType t, const void* X, int64_t cols, int64_t ld,
                    const BatchLayout& batch = {}, const char* what = "epilogue input");

// Once per loaded kernel: raise its dynamic SMEM limit to k.smem_bytes(), allow clusters of
// more than 8 CTAs, and return how many clusters fit on the GPU at once (the persistent
// grid's bound), counted in the scheduler's clusters of cluster_m x cluster_n CTAs (a hardware
// cluster of K-splits holds k_splits of them: KernelConfig::hw_cluster_x).
int prepare(cudaKernel_t kernel, const KernelConfig& k);

// Launches on `stream` with the grid of launch_grid(k, M, N, max_active_clusters). Checks the
// workspaces the configuration needs (Params::stash, Params::exchange and epoch).
void launch(cudaKernel_t kernel, const KernelConfig& k, const Params& p, cudaStream_t stream, int max_active_clusters);

// A 2-D row-major tensor `rows` x `cols` (row stride ld elements) as a TMA descriptor with box
// {box_cols, box_rows} and 128-byte swizzle; errors name `what`. Batched (batch.outer > 0): 4-D,
// dims {cols, rows, heads, outer}, box {box_cols, box_rows, 1, 1} (SM90_TMA_LOAD_4D's (c0, c1,
// head, outer)); rows past `rows` stay out of bounds (zero-filled, not stored) instead of reaching
// into the next matrix. The matrices may interleave (q, k and v sliced from one [B, S, 3, H, D]
// projection) but no two elements may share an address.
void encode_tensor(TmaDesc* out, const char* what, DType t, const void* ptr, uint64_t rows, uint64_t cols, uint64_t ld,
                   uint32_t box_cols, uint32_t box_rows, const BatchLayout& batch = {});

// Whether a kernel may load its B (and B3) before griddepcontrol.wait (Params::b_before_wait):
// the caller knows the kernel before it on the stream (a pair's previous part), and none of
// `written` (that kernel's outputs) shares a byte with any of `read` (this kernel's B and B3).
// A tensor of more than two dims counts as sharing (its span is not worked out). False under
// COMFUSE_EARLY_B=0 (an A/B switch for measurements).
bool b_before_wait_allowed(const std::vector<const DeviceTensor*>& read, const std::vector<const DeviceTensor*>& written);

// B2B kernels (kernels/comfuse/b2b/): the same for a B2bConfig (its threads: the wgmma pipeline's 384
// or the decode kernel's 128; clusters where N1 is split).
int prepare(cudaKernel_t kernel, const B2bConfig& k);  // CTAs resident at once
void launch(cudaKernel_t kernel, const B2bConfig& k, const Params& p, cudaStream_t stream, int max_active_ctas);

}  // namespace comfuse::runtime_detail
