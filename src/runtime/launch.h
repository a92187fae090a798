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
void set_operands(Params& p, const KernelConfig& k, DType ab, const void* A, int64_t lda, const void* B, int64_t ldb,
                  int M, int N, int K);
// Output `slot` (the Store node's Out): M x N row-major, row stride ldd.
void set_output(Params& p, const KernelConfig& k, int slot, DType t, void* D, int64_t ldd);
// Epilogue input `slot` (the TileInput node's In): M x N row-major, row stride ld.
void set_tile_input(Params& p, const KernelConfig& k, int slot, DType t, const void* X, int64_t ld);

// Once per loaded kernel: raise its dynamic SMEM limit to k.smem_bytes(), allow clusters of
// more than 8 CTAs, and return how many clusters fit on the GPU at once (the persistent
// grid's bound).
int prepare(cudaKernel_t kernel, const KernelConfig& k);

// Launches on `stream` with the grid of launch_grid(k, M, N, max_active_clusters). Checks the
// workspaces the configuration needs (Params::stash, Params::exchange and epoch).
void launch(cudaKernel_t kernel, const KernelConfig& k, const Params& p, cudaStream_t stream, int max_active_clusters);

}  // namespace comfuse::runtime_detail
