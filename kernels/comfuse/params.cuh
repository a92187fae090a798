// comfuse/params.cuh: the kernel's one runtime argument, a plain struct that host code
// (the runtime, kernels/comfuse/host/launch.hpp) fills and passes by value as a
// __grid_constant__ parameter. Host- and device-visible, NVRTC-compatible: it holds TMA
// descriptors as opaque 128-byte blobs (CUtensorMap's size and alignment), so this header
// needs neither <cuda.h> nor CuTe.
#pragma once

namespace comfuse {

inline constexpr int kMaxOutputs = 4;   // Store nodes (output tensors) per epilogue
inline constexpr int kMaxVectors = 8;   // RowBroadcast / ColBroadcast operands
inline constexpr int kMaxScalars = 8;   // ScalarArg operands

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
  TmaDesc tma_out[kMaxOutputs];
  int M, N, K;
  // Tile scheduler: raster_group consecutive M-blocks (or N-cluster-blocks when
  // raster_along_n != 0) are walked together, to keep A (or B) panels hot in L2.
  int raster_group;
  int raster_along_n;
  int pad_;
  // Epilogue runtime operands.
  void const* vectors[kMaxVectors];  // RowBroadcast: length N; ColBroadcast: length M
  float scalars[kMaxScalars];        // ScalarArg
  // Stash in global memory (FusedGemmSm90::kStashGlobalBytesPerCta > 0): a workspace of
  // grid CTAs x kStashGlobalBytesPerCta bytes, 16-byte aligned; else unused.
  void* stash;
  // Row reductions across clusters (cluster::Aggregation::Global, cluster/global_exchange.cuh):
  // a zero-initialized workspace of exchange slots, and a launch counter that tags its rounds
  // (the host bumps it every launch and re-zeroes the workspace every 2^16 launches); else unused.
  void* exchange;
  unsigned epoch;
};

}  // namespace comfuse
