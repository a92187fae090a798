// comfuse/params.cuh: the kernel's one runtime argument, a plain struct that the runtime
// (src/runtime/launch.cpp) fills and passes by value as a __grid_constant__ parameter.
// Host- and device-visible, NVRTC-compatible: it holds TMA descriptors as opaque 128-byte
// blobs (CUtensorMap's size and alignment), so this header needs neither <cuda.h> nor CuTe.
// Its slot counts are Sm90's (config.cuh).
#pragma once
#include "config.cuh"

namespace comfuse {

// Same size and alignment as CUtensorMap (CUDA 13: 128); host code copies an encoded map into it.
struct alignas(128) TmaDesc {
  unsigned char bytes[128];
};

// A matrix as a kernel reads it from global memory with plain loads: row-major, strides in
// elements (an [M, N] epilogue input as TileInput reads it; the decode kernel's operands). The
// base and row stride are those of its TMA descriptor (16-byte aligned, which aligns the column
// pairs or 16-byte pieces a thread loads); a batched kernel's (Geometry::kBatched) batch
// (head h, outer batch o) starts h x head_stride + o x batch_stride elements in (batch_coord).
struct MatrixRef {
  void const* data;
  long long ld;
  long long head_stride;
  long long batch_stride;
};

struct alignas(128) Params {
  // Mainloop operands. A: M x K, K contiguous, box {64, BM / a_slices}.
  // B K-major (N x K): box {64, BN}; B N-major (K x N): box {64, 64} (BN/64 boxes a stage).
  TmaDesc tma_a;
  TmaDesc tma_b;
  // Outputs, M x N row-major (N contiguous), box {128 bytes of columns, BM}, 128B swizzle.
  TmaDesc tma_out[Sm90::kMaxOutputs];
  // [M, N] inputs of the epilogue (TileInput), the same layout and box as the outputs: only
  // their L2 prefetch goes through these; the epilogue reads them at tile_in.
  TmaDesc tma_in[Sm90::kMaxTileInputs];
  // Back-to-back GEMMs (kernels/comfuse/b2b/): tma_a is X, tma_b is W1; W3 (gated) and W2 here.
  // Batched (B2bConfig::batched): every descriptor is 4-D (columns, rows, head, outer batch), so
  // that [B, H, rows, cols] views with any strides (q, k, v sliced out of one projection, O
  // written as [B, S, H, D]) load and store without copies; batch_coord splits the flat index.
  TmaDesc tma_b3;
  TmaDesc tma_b2;
  // The same B2B operands (X, W1, W2) and its output O as plain views, for the decode kernel
  // (b2b/decode_attention.cuh), which loads without TMA; O's is written through (const cast).
  MatrixRef b2b_x, b2b_w1, b2b_w2, b2b_out;
  int M, N, K;  // B2B: M rows of X and O, N = N2 (O's columns), K (X's columns)
  int N1;       // B2B: GEMM1's N = GEMM2's K
  int batches;  // B2B: batch count (1 when not batched), outer batches x heads
  int heads;    // B2B batched: the inner factor of the batch count (1 when the batch is one dim)
  // Tile scheduler: raster_group consecutive M-blocks (or N-cluster-blocks when
  // raster_along_n != 0) are walked together, to keep A (or B) panels hot in L2.
  int raster_group;
  int raster_along_n;
  // Nonzero: the previous grid on the stream writes no byte of B (nor B3), so the producer may
  // load the first job's B before griddepcontrol.wait (kernel/fused_gemm_sm90.cuh). Set by the
  // runtime only for the second and later kernels of a pair run as single-GEMM kernels
  // (fused_kernel.cpp run_parts), whose weights stream while the part before still runs; that
  // part writes the intermediate only, and the runtime checks the spans all the same
  // (launch.h b_before_wait_allowed).
  int b_before_wait;
  // The cluster count the exchange workspace was laid out for (grid.cuh's exchange_layout):
  // the most clusters a launch of this kernel may have.
  int workspace_clusters;
  // Epilogue runtime operands.
  void const* vectors[Sm90::kMaxVectors];  // RowBroadcast: length N; ColBroadcast: length M
  float scalars[Sm90::kMaxScalars];        // ScalarArg
  void* col_outputs[Sm90::kMaxColOutputs];  // StoreCol: [M, 1] outputs, contiguous
  MatrixRef tile_in[Sm90::kMaxTileInputs];  // TileInput: the tensors of tma_in
  // Stash in a global workspace (StashSpace::Workspace): grid.cuh's stash_workspace_bytes,
  // 16-byte aligned; else unused.
  void* stash;
  // Row reductions across clusters (Aggregation::L2Exchange, cluster/global_exchange.cuh) and
  // split-K partial tiles (scheduler/split_k.cuh): a workspace of grid.cuh's
  // exchange_workspace_bytes, initialized once when allocated (the kernel keeps its launch
  // counter in it); else unused.
  void* exchange;
};

// A batched kernel's flat batch index (outer x heads + head, as torch flattens [B, H]) as the
// head and outer coordinates of its 4-D descriptors.
struct BatchCoord {
  int head, outer;
};
COMFUSE_HOST_DEVICE inline BatchCoord batch_coord(Params const& p, int batch) {
  return {batch % p.heads, batch / p.heads};
}
// The same in one register, head in the low 16 bits and outer batch in the high 16 (the launch
// holds both below 2^16: kMaxBatchDim): the B2B producer keeps it across a job on its 40
// registers, where two coordinates, or the division at each load, spilled. Unsigned: an outer
// batch of 2^15 or more sets the register's top bit, which a signed shift would carry down.
constexpr int kMaxBatchDim = 1 << 16;
COMFUSE_HOST_DEVICE inline int packed_batch_coord(Params const& p, int batch) {
  BatchCoord const c = batch_coord(p, batch);
  return static_cast<int>(uint32_t(c.head) | (uint32_t(c.outer) << 16));
}
COMFUSE_HOST_DEVICE inline BatchCoord unpacked_batch_coord(int packed) {
  return {static_cast<int>(uint32_t(packed) & 0xffffu), static_cast<int>(uint32_t(packed) >> 16)};
}

}  // namespace comfuse

// A generated B2B translation unit's entry point (extern "C", as COMFUSE_DEFINE_KERNEL), for the
// wgmma kernel (b2b/b2b_gemm_sm90.cuh) and the decode kernel (b2b/decode_attention.cuh) alike.
#define COMFUSE_DEFINE_B2B_KERNEL(NAME, KERNEL)                            \
  extern "C" __global__ void __launch_bounds__(KERNEL::kThreads, 1)        \
      NAME(__grid_constant__ comfuse::Params const p) {                    \
    extern __shared__ __align__(comfuse::Sm90::kSmemAlign) char comfuse_smem[]; \
    KERNEL::run(p, comfuse_smem);                                          \
  }
