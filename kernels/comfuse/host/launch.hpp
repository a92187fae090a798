// comfuse/host/launch.hpp: host-only helpers for the fused GEMM kernel: encode the TMA
// descriptors of Params (cuTensorMapEncodeTiled, reached through
// cudaGetDriverEntryPointByVersion so nothing links libcuda), validate shapes and
// alignment with clear errors, and launch with cluster dims and the dynamic SMEM limit.
// Never included by JIT sources (needs <cuda.h> types and the CUDA runtime).
#pragma once
#ifdef __CUDACC_RTC__
#error "comfuse/host/launch.hpp is host-only"
#endif
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "../params.cuh"

namespace comfuse::host {

enum class DType { BF16, F16, F32 };
inline int dtype_bytes(DType t) { return t == DType::F32 ? 4 : 2; }
inline char const* dtype_name(DType t) { return t == DType::BF16 ? "bf16" : t == DType::F16 ? "f16" : "f32"; }

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The compile-time configuration of an instantiated kernel, mirrored for the host.
struct KernelShape {
  int BM = 128, BN = 128, cluster_n = 1;
  bool b_kmajor = true;  // B is N x K (K contiguous); else K x N (N contiguous)
  int wgs_per_tile = 1;  // 1: PingPong, 2: Cooperative (Mainloop::WGsPerTile)
  int smem_bytes = 0;    // Kernel::kSmemBytes (or the JIT module's <name>_smem_bytes)
  int cluster_m = 1;     // Mainloop::ClusterM: clusters along M sharing B (only with cluster_n == 1)
  int n_tiles = 1;       // Kernel::NTiles: N-tiles per job (Stash)
  int stash_bytes_per_cta = 0;  // Kernel::kStashGlobalBytesPerCta: global stash workspace per CTA
  int row_group = 1;            // FusedGemmSm90's RowGroup: clusters whose CTAs share rows (Aggregation::Global)
  int exchange_bytes_per_slot = 0;  // Kernel::kExchangeBytesPerSlot: cross-cluster exchange workspace
  int a_slices() const { return cluster_n < BM / 8 ? cluster_n : BM / 8; }
  int b_slices() const { return cluster_m < BN / 8 ? cluster_m : BN / 8; }
  int epi_rows() const { return BM / wgs_per_tile; }  // rows of one output TMA box
};

// cuTensorMapEncodeTiled's signature (driver API 12.0), declared here so that no link
// against libcuda and no cudaTypedefs.h is needed.
using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, cuuint64_t const*,
                                   cuuint64_t const*, cuuint32_t const*, cuuint32_t const*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

inline EncodeTiledFn encode_tiled_fn() {
  static EncodeTiledFn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !p)
      throw Error("comfuse: cannot resolve cuTensorMapEncodeTiled from the driver (needs driver >= 12.0)");
    return reinterpret_cast<EncodeTiledFn>(p);
  }();
  return fn;
}

// A 2-D row-major tensor: `rows` x `cols`, row stride `ld` elements, box {box_cols, box_rows},
// 128-byte swizzle (box_cols * elem == 128).
inline void encode_2d(TmaDesc* out, char const* what, DType t, void const* ptr, uint64_t rows, uint64_t cols,
                      uint64_t ld, uint32_t box_cols, uint32_t box_rows) {
  int const eb = dtype_bytes(t);
  auto fail = [&](std::string const& why) {
    throw Error(std::string("comfuse: operand ") + what + " (" + dtype_name(t) + ", " + std::to_string(rows) + " x " +
                std::to_string(cols) + ", ld " + std::to_string(ld) + "): " + why);
  };
  if (!ptr) fail("null pointer");
  if (reinterpret_cast<uintptr_t>(ptr) % 16) fail("base address must be 16-byte aligned");
  if (rows == 0 || cols == 0) fail("empty");
  if (ld < cols) fail("row stride smaller than the row");
  if ((ld * eb) % 16) fail("row stride must be a multiple of 16 bytes (" + std::to_string(16 / eb) + " elements)");
  if (rows >= (1ull << 32) || cols >= (1ull << 32)) fail("dimension >= 2^32");
  cuuint64_t dims[2] = {cols, rows};
  cuuint64_t strides[1] = {ld * eb};
  cuuint32_t box[2] = {box_cols, box_rows};
  cuuint32_t estr[2] = {1, 1};
  CUtensorMapDataType dt = t == DType::BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                         : t == DType::F16  ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                            : CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  static_assert(sizeof(CUtensorMap) == sizeof(TmaDesc) && alignof(CUtensorMap) <= alignof(TmaDesc));
  CUtensorMap map;
  CUresult r = encode_tiled_fn()(&map, dt, 2, const_cast<void*>(ptr), dims, strides, box, estr,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) fail("cuTensorMapEncodeTiled failed with CUresult " + std::to_string(int(r)));
  std::memcpy(out, &map, sizeof(map));
}

// A: M x K (K contiguous, row stride lda). B: N x K (b_kmajor, stride ldb >= K) or
// K x N (stride ldb >= N). Inputs are 16-bit (bf16 or f16), both the same type.
inline void set_operands(Params& p, KernelShape const& ks, DType in, void const* A, int64_t lda, void const* B,
                         int64_t ldb, int M, int N, int K) {
  if (in == DType::F32) throw Error("comfuse: GEMM inputs must be bf16 or f16");
  if (M <= 0 || N <= 0 || K <= 0) throw Error("comfuse: M, N, K must be positive");
  if (K % 8) throw Error("comfuse: K = " + std::to_string(K) + " must be a multiple of 8 (16-byte TMA row stride)");
  if (!ks.b_kmajor && N % 8) throw Error("comfuse: N-major B needs N % 8 == 0 (16-byte TMA row stride)");
  encode_2d(&p.tma_a, "A", in, A, M, K, lda, 64, ks.BM / ks.a_slices());
  if (ks.cluster_m > 1 && ks.cluster_n > 1) throw Error("comfuse: clusters along M and N at once are not supported");
  if (ks.row_group > 1 && ks.cluster_n > 1) throw Error("comfuse: a row group of clusters needs clusters of 1 along N");
  if (ks.b_kmajor) encode_2d(&p.tma_b, "B (N x K)", in, B, N, K, ldb, 64, ks.BN / ks.b_slices());
  else encode_2d(&p.tma_b, "B (K x N)", in, B, K, N, ldb, 64, 64);
  p.M = M; p.N = N; p.K = K;
  if (p.raster_group <= 0) p.raster_group = 8;
}

// Output `index` (the Store node's Out): M x N row-major, row stride ldd.
inline void set_output(Params& p, KernelShape const& ks, int index, DType t, void* D, int64_t ldd) {
  if (index < 0 || index >= kMaxOutputs) throw Error("comfuse: output index out of range");
  encode_2d(&p.tma_out[index], "output", t, D, p.M, p.N, ldd, 128 / dtype_bytes(t), ks.epi_rows());
}

struct LaunchShape {
  dim3 grid, block, cluster;
  int smem_bytes;
};

// Grid: one cluster per resident cluster slot (persistent), at most one per cluster tile.
// Clusters along N: grid (clusters, cluster_n), cluster (1, cluster_n); along M: grid
// (clusters * cluster_m, 1), cluster (cluster_m, 1). Row groups (row_group = G > 1): whole
// groups of G clusters, every one resident at once (the L2 exchange waits on all of them).
inline LaunchShape launch_shape(KernelShape const& ks, Params const& p, int max_active_clusters) {
  auto cdiv = [](int a, int b) { return (a + b - 1) / b; };
  int const g = ks.row_group < 1 ? 1 : ks.row_group;
  int tiles = cdiv(cdiv(p.M, ks.BM), ks.cluster_m) * cdiv(cdiv(p.N, ks.BN), ks.cluster_n * g * ks.n_tiles);
  int const groups_max = max_active_clusters / g;
  if (groups_max < 1)
    throw Error("comfuse: a row group of " + std::to_string(g) + " clusters does not fit on the GPU at once (" +
                std::to_string(max_active_clusters) + " clusters resident): plan a smaller row group");
  int groups = tiles < groups_max ? tiles : groups_max;
  if (groups < 1) groups = 1;
  int const clusters = groups * g;
  return {dim3(clusters * ks.cluster_m, ks.cluster_n, 1), dim3(384, 1, 1), dim3(ks.cluster_m, ks.cluster_n, 1),
          ks.smem_bytes};
}

// Bytes of the global stash workspace (Params::stash) a launch needs (0: none): at most
// max_active_clusters * cluster size CTAs.
inline size_t stash_workspace_bytes(KernelShape const& ks, int max_active_clusters) {
  return size_t(ks.stash_bytes_per_cta) * size_t(max_active_clusters) * size_t(ks.cluster_m * ks.cluster_n);
}

// Bytes of the cross-cluster exchange workspace (Params::exchange; 0: none): one slot per row
// group, rank along M and consumer warp group. Zero it once after allocating it; then bump
// Params::epoch on every launch (its words are tagged with it, never cleared), re-zeroing it
// whenever epoch reaches a multiple of 65536 (the tag keeps 16 bits of it).
inline size_t exchange_workspace_bytes(KernelShape const& ks, int max_active_clusters) {
  int const g = ks.row_group < 1 ? 1 : ks.row_group;
  return size_t(ks.exchange_bytes_per_slot) * size_t(max_active_clusters / g) * size_t(ks.cluster_m) * 2;
}

inline void check(cudaError_t e, char const* what) {
  if (e != cudaSuccess) throw Error(std::string("comfuse: ") + what + ": " + cudaGetErrorString(e));
}

// Runtime-API path (nvcc-built code, e.g. the bench); the JIT runtime does the same with
// cuFuncSetAttribute / cuOccupancyMaxActiveClusters / cuLaunchKernelEx on its CUfunction,
// with launch_shape() for the numbers.
//
// prepare(): once per kernel: raise the dynamic SMEM limit, allow 16-CTA clusters, and
// return how many clusters fit at once (the persistent grid's size).
inline int prepare(void const* func, KernelShape const& ks) {
  check(cudaFuncSetAttribute(func, cudaFuncAttributeMaxDynamicSharedMemorySize, ks.smem_bytes),
        "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  if (ks.cluster_n * ks.cluster_m > 8)
    check(cudaFuncSetAttribute(func, cudaFuncAttributeNonPortableClusterSizeAllowed, 1),
          "cudaFuncSetAttribute(NonPortableClusterSizeAllowed)");
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = ks.cluster_m;
  attr[0].val.clusterDim.y = ks.cluster_n;
  attr[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(ks.cluster_m, ks.cluster_n, 1);
  cfg.blockDim = dim3(384, 1, 1);
  cfg.dynamicSmemBytes = ks.smem_bytes;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int max_clusters = 0;
  check(cudaOccupancyMaxActiveClusters(&max_clusters, func, &cfg), "cudaOccupancyMaxActiveClusters");
  if (max_clusters < 1) throw Error("comfuse: the kernel fits no cluster on this GPU (SMEM or cluster size)");
  return max_clusters;
}

inline void launch(void const* func, KernelShape const& ks, Params const& p, cudaStream_t stream, int max_clusters) {
  LaunchShape ls = launch_shape(ks, p, max_clusters);
  if (ks.stash_bytes_per_cta > 0 && (!p.stash || reinterpret_cast<uintptr_t>(p.stash) % 16))
    throw Error("comfuse: this kernel keeps its Stash in global memory: Params::stash must point to a 16-byte aligned "
                "workspace of stash_workspace_bytes() bytes");
  if (ks.exchange_bytes_per_slot > 0 &&
      (!p.exchange || reinterpret_cast<uintptr_t>(p.exchange) % 16 || (p.epoch & 0xffffu) == 0))
    throw Error("comfuse: this kernel reduces rows across clusters: Params::exchange must point to a zeroed, 16-byte "
                "aligned workspace of exchange_workspace_bytes() bytes, and Params::epoch must count launches from 1, "
                "skipping multiples of 65536 (re-zero the workspace there; cluster/global_exchange.cuh)");
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = ls.cluster.x;
  attr[0].val.clusterDim.y = ls.cluster.y;
  attr[0].val.clusterDim.z = ls.cluster.z;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = ls.grid;
  cfg.blockDim = ls.block;
  cfg.dynamicSmemBytes = ls.smem_bytes;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  void* args[1] = {const_cast<Params*>(&p)};
  check(cudaLaunchKernelExC(&cfg, func, args), "cudaLaunchKernelExC");
}

}  // namespace comfuse::host
