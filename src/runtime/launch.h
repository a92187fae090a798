#pragma once
// Launching a fused kernel from its KernelConfig (kernels/comfuse/config.cuh): the TMA
// descriptors of Params (cuTensorMapEncodeTiled, reached through the runtime's driver entry
// point so that nothing links libcuda), the dynamic SMEM and cluster attributes, and a cluster
// launch with the scheduler's grid (kernels/comfuse/scheduler/grid.cuh). Private to src/runtime.
#include <cuda_runtime.h>

#include <cstdint>

#include "comfuse/config.cuh"
#include "comfuse/dtype.h"
#include "comfuse/params.cuh"

namespace comfuse::runtime_detail {

// A: M x K (K contiguous, row stride lda). B: N x K (b_kmajor, stride ldb >= K) or K x N
// (stride ldb >= N). A and B are 16-bit (bf16 or f16), both the same type.
// A gated kernel (KernelConfig::gated) takes the gate's B3 beside B: the same shape and layout.
void set_operands(Params& p, const KernelConfig& k, DType ab, const void* A, int64_t lda, const void* B, int64_t ldb,
                  int M, int N, int K, const void* B3 = nullptr, int64_t ldb3 = 0);
// Output `slot` (the Store node's Out): M x N row-major, row stride ldd; the TMA box is
// `epi_rows` rows (one consumer warp group's tile) of 128 bytes of columns. batches > 0: a
// batched kernel's [batches, M, N] output (3-D descriptor), batch_stride elements apart.
void set_output(Params& p, int epi_rows, int slot, DType t, void* D, int64_t ldd, int64_t batches = 0,
                int64_t batch_stride = 0);
// Epilogue input `slot` (the TileInput node's In): M x cols row-major, row stride ld (the
// epilogue's columns: N, or a B2B kernel's N1 for its F); the TMA box (its L2 prefetch) as an
// output's. batches > 0: a batched kernel's [batches, M, cols] input, batch_stride elements apart
// (0: M rows apart).
void set_tile_input(Params& p, int epi_rows, int slot, DType t, const void* X, int64_t cols, int64_t ld,
                    int64_t batches = 0, int64_t batch_stride = 0);

// Once per loaded kernel: raise its dynamic SMEM limit to k.smem_bytes(), allow clusters of
// more than 8 CTAs, and return how many clusters fit on the GPU at once (the persistent
// grid's bound), counted in the scheduler's clusters of cluster_m x cluster_n CTAs (a hardware
// cluster of K-splits holds k_splits of them: KernelConfig::hw_cluster_x).
int prepare(cudaKernel_t kernel, const KernelConfig& k);

// Launches on `stream` with the grid of launch_grid(k, M, N, max_active_clusters). Checks the
// workspaces the configuration needs (Params::stash, Params::exchange and epoch).
void launch(cudaKernel_t kernel, const KernelConfig& k, const Params& p, cudaStream_t stream, int max_active_clusters);

// A 2-D row-major tensor `rows` x `cols` (row stride ld elements) as a TMA descriptor with box
// {box_cols, box_rows} and 128-byte swizzle; errors name `what`. batches > 0: 3-D, `batches`
// such matrices batch_stride elements apart (0: rows x ld), box {box_cols, box_rows, 1}, the
// batch the outermost coordinate (SM90_TMA_LOAD_3D's (c0, c1, batch)).
void encode_tensor(TmaDesc* out, const char* what, DType t, const void* ptr, uint64_t rows, uint64_t cols, uint64_t ld,
                   uint32_t box_cols, uint32_t box_rows, uint64_t batches = 0, uint64_t batch_stride = 0);

// B2B kernels (kernels/comfuse/b2b/): the same for a B2bConfig; no clusters, one CTA per SM.
int prepare(cudaKernel_t kernel, const B2bConfig& k);  // CTAs resident at once
void launch(cudaKernel_t kernel, const B2bConfig& k, const Params& p, cudaStream_t stream, int max_active_ctas);

}  // namespace comfuse::runtime_detail
