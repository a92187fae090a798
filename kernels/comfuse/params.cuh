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

struct alignas(128) Params {
  // Mainloop operands. A: M x K, K contiguous, box {64, BM / a_slices}.
  // B K-major (N x K): box {64, BN}; B N-major (K x N): box {64, 64} (BN/64 boxes a stage).
  TmaDesc tma_a;
  TmaDesc tma_b;
  // Outputs, M x N row-major (N contiguous), box {128 bytes of columns, BM}, 128B swizzle.
  TmaDesc tma_out[Sm90::kMaxOutputs];
  // [M, N] inputs of the epilogue (TileInput), the same layout and box as the outputs.
  TmaDesc tma_in[Sm90::kMaxTileInputs];
  int M, N, K;
  // Tile scheduler: raster_group consecutive M-blocks (or N-cluster-blocks when
  // raster_along_n != 0) are walked together, to keep A (or B) panels hot in L2.
  int raster_group;
  int raster_along_n;
  int pad_;
  // Epilogue runtime operands.
  void const* vectors[Sm90::kMaxVectors];  // RowBroadcast: length N; ColBroadcast: length M
  float scalars[Sm90::kMaxScalars];        // ScalarArg
  void* col_outputs[Sm90::kMaxColOutputs];  // StoreCol: [M, 1] outputs, contiguous
  // Stash in a global workspace (StashSpace::Workspace): grid.cuh's stash_workspace_bytes,
  // 16-byte aligned; else unused.
  void* stash;
  // Row reductions across clusters (Aggregation::L2Exchange, cluster/global_exchange.cuh): a
  // zero-initialized workspace of exchange slots (grid.cuh's exchange_workspace_bytes), and a
  // launch counter that tags its rounds (the host bumps it every launch and re-zeroes the
  // workspace every 2^16 launches); else unused.
  void* exchange;
  unsigned epoch;
};

}  // namespace comfuse
