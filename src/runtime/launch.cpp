// Launching a fused kernel from its KernelConfig (launch.h).
#include "launch.h"

#include <cuda.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comfuse/error.h"
#include "comfuse/runtime.h"
#include "comfuse/scheduler/grid.cuh"

namespace comfuse::runtime_detail {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(fmt::format("{}: {}", what, cudaGetErrorString(e)));
}

// cuTensorMapEncodeTiled's signature (driver API 12.0), declared here so that no link
// against libcuda and no cudaTypedefs.h is needed.
using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiledFn encode_tiled_fn() {
  static EncodeTiledFn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !p)
      throw Error("cannot resolve cuTensorMapEncodeTiled from the driver (needs driver >= 12.0)");
    return reinterpret_cast<EncodeTiledFn>(p);
  }();
  return fn;
}

}  // namespace

namespace {

// Whether no two elements of a strided layout ((extent, stride) per dim, strides in elements) share
// an address: sorted by stride, each dim must step past everything the smaller ones span.
bool elements_distinct(std::vector<std::pair<uint64_t, uint64_t>> dims) {
  std::erase_if(dims, [](const auto& d) { return d.first <= 1; });
  std::sort(dims.begin(), dims.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  uint64_t span = 1;  // elements the dims so far reach, from the first
  for (const auto& [extent, stride] : dims) {
    if (stride < span) return false;
    span = stride * (extent - 1) + span;
  }
  return true;
}

}  // namespace

void encode_tensor(TmaDesc* out, const char* what, DType t, const void* ptr, uint64_t rows, uint64_t cols, uint64_t ld,
                   uint32_t box_cols, uint32_t box_rows, const BatchLayout& batch) {
  const int eb = static_cast<int>(size_of(t));
  const bool batched = batch.outer > 0;
  auto fail = [&](const std::string& why) {
    const std::string shape =
        !batched ? fmt::format("{} x {}, ld {}", rows, cols, ld)
        : batch.heads > 1
            ? fmt::format("{} x {} x {} x {}, strides {}, {}, {}", batch.outer, batch.heads, rows, cols,
                          batch.outer_stride, batch.head_stride, ld)
            : fmt::format("{} x {} x {}, ld {}, batch stride {}", batch.outer, rows, cols, ld, batch.outer_stride);
    throw Error(fmt::format("operand {} ({}, {}): {}", what, name_of(t), shape, why));
  };
  if (!ptr) fail("null pointer");
  if (reinterpret_cast<uintptr_t>(ptr) % 16) fail("base address must be 16-byte aligned");
  if (rows == 0 || cols == 0 || (batched && batch.heads == 0)) fail("empty");
  if (ld < cols) fail("row stride smaller than the row");
  if ((ld * eb) % 16) fail(fmt::format("row stride must be a multiple of 16 bytes ({} elements)", 16 / eb));
  if (rows >= (1ull << 32) || cols >= (1ull << 32) || batch.outer >= (1ull << 32) || batch.heads >= (1ull << 32))
    fail("dimension >= 2^32");
  if (batched) {
    if ((batch.outer_stride * eb) % 16 || (batch.head_stride * eb) % 16)
      fail(fmt::format("batch and head strides must be multiples of 16 bytes ({} elements)", 16 / eb));
    if (!elements_distinct({{cols, 1}, {rows, ld}, {batch.heads, batch.head_stride}, {batch.outer, batch.outer_stride}}))
      fail("its matrices overlap (two elements at one address)");
  }
  const cuuint32_t rank = batched ? 4 : 2;
  // A stride of a dim of extent 1 is never stepped; TMA still wants it a nonzero multiple of 16.
  auto stride_bytes = [&](uint64_t s) { return std::max<uint64_t>(s, 1) * eb; };
  cuuint64_t dims[4] = {cols, rows, batch.heads, batch.outer};
  cuuint64_t strides[3] = {ld * eb, stride_bytes(batch.heads > 1 ? batch.head_stride : rows * ld),
                           stride_bytes(batch.outer > 1 ? batch.outer_stride : rows * ld * batch.heads)};
  cuuint32_t box[4] = {box_cols, box_rows, 1, 1};
  cuuint32_t estr[4] = {1, 1, 1, 1};
  const CUtensorMapDataType dt = t == DType::BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                 : t == DType::F16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                   : CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  static_assert(sizeof(CUtensorMap) == sizeof(TmaDesc) && alignof(CUtensorMap) <= alignof(TmaDesc));
  CUtensorMap map;
  const CUresult r = encode_tiled_fn()(&map, dt, rank, const_cast<void*>(ptr), dims, strides, box, estr,
                                       CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                       CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) fail(fmt::format("cuTensorMapEncodeTiled failed with CUresult {}", int(r)));
  std::memcpy(out, &map, sizeof(map));
}

namespace {

// A launch of `threads` threads a CTA with `smem` bytes of dynamic SMEM, in clusters of
// cluster_x x cluster_y (`attrs` must outlive the config). A kernel's launch (`overlap`, not an
// occupancy query) may overlap the previous kernel in the stream (programmatic dependent
// launch): its CTAs take SMs as the previous grid's CTAs exit and wait in the kernel for that
// grid to complete (common.cuh's wait_for_previous_grid) before touching global memory.
// COMFUSE_PDL=0 launches without the overlap (an A/B switch for measurements; the kernels'
// wait is then a no-op).
struct LaunchAttrs {
  cudaLaunchAttribute a[2];
};
// An A/B switch of the environment: on unless `name` is "0".
bool env_switch_on(const char* name) {
  const char* e = std::getenv(name);
  return !(e && std::string(e) == "0");
}
bool overlap_allowed() {
  static const bool on = env_switch_on("COMFUSE_PDL");
  return on;
}
cudaLaunchConfig_t launch_config(dim3 grid, int threads, int cluster_x, int cluster_y, int smem, cudaStream_t stream,
                                 LaunchAttrs& attrs, bool overlap) {
  attrs = {};
  attrs.a[0].id = cudaLaunchAttributeClusterDimension;
  attrs.a[0].val.clusterDim.x = cluster_x;
  attrs.a[0].val.clusterDim.y = cluster_y;
  attrs.a[0].val.clusterDim.z = 1;
  attrs.a[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs.a[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(threads, 1, 1);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attrs.a;
  cfg.numAttrs = overlap && overlap_allowed() ? 2 : 1;
  return cfg;
}

}  // namespace

void set_operands(Params& p, const KernelConfig& k, DType ab, const void* A, int64_t lda, const void* B, int64_t ldb,
                  int M, int N, int K, const void* B3, int64_t ldb3) {
  if (ab == DType::F32) throw Error("GEMM inputs must be bf16 or f16");
  if (k.gated != (B3 != nullptr))
    throw Error(k.gated ? "this kernel is a gated GEMM: it needs the gate's B operand (Params::tma_b3)"
                        : "a gate's B operand was given to a kernel that is not a gated GEMM");
  if (k.a_box_rows > 0 && M > k.a_box_rows)
    throw Error(fmt::format("this kernel loads A in boxes of {} rows (planned for M <= {}): M = {} needs a kernel "
                            "planned for it", k.a_box_rows, k.a_box_rows, M));
  encode_tensor(&p.tma_a, "A", ab, A, M, K, lda, Sm90::kTileK, k.a_box());
  // K x N: boxes of 64 columns; N x K: a multicast slice of the B tile (mma_n rows: a gated
  // tile's slices each fall in B's half or the gate's, mainloop_sm90.cuh).
  auto operand = [&](TmaDesc* d, const char* nk, const char* kn, const void* ptr, int64_t ld) {
    if (k.b_kmajor) encode_tensor(d, nk, ab, ptr, N, K, ld, Sm90::kTileK, std::min(k.tile_n, k.mma_n() / k.b_slices()));
    else encode_tensor(d, kn, ab, ptr, K, N, ld, 64, Sm90::kTileK);
  };
  operand(&p.tma_b, "B (N x K)", "B (K x N)", B, ldb);
  if (B3) operand(&p.tma_b3, "the gate's B (N x K)", "the gate's B (K x N)", B3, ldb3);
  p.M = M, p.N = N, p.K = K;
}

void set_output(Params& p, int epi_rows, int slot, DType t, void* D, int64_t ldd, const BatchLayout& batch,
                const char* what) {
  if (slot < 0 || slot >= Sm90::kMaxOutputs) throw Error(fmt::format("output slot {} out of range", slot));
  encode_tensor(&p.tma_out[slot], what, t, D, p.M, p.N, ldd, 128 / static_cast<uint32_t>(size_of(t)), epi_rows,
                batch);
}

void set_tile_input(Params& p, int epi_rows, int slot, DType t, const void* X, int64_t cols, int64_t ld,
                    const BatchLayout& batch, const char* what) {
  if (slot < 0 || slot >= Sm90::kMaxTileInputs) throw Error(fmt::format("tile input slot {} out of range", slot));
  encode_tensor(&p.tma_in[slot], what, t, X, p.M, cols, ld, 128 / static_cast<uint32_t>(size_of(t)), epi_rows,
                batch);
  p.tile_in[slot] = matrix_ref(X, ld, batch);
}

namespace {
// The bytes [first, last) a tensor's elements span, or nullopt past two dims.
std::optional<std::pair<uintptr_t, uintptr_t>> byte_span(const DeviceTensor& t) {
  if (t.shape.size() > 2) return std::nullopt;
  const int64_t rows = t.shape.size() == 2 ? t.shape[0] : 1;
  const int64_t cols = t.shape.empty() ? 1 : t.shape.back();
  if (rows <= 0 || cols <= 0) return std::pair<uintptr_t, uintptr_t>{0, 0};
  const int64_t ld = t.ld ? t.ld : cols;
  const auto first = reinterpret_cast<uintptr_t>(t.data);
  return std::pair<uintptr_t, uintptr_t>{first, first + uintptr_t(((rows - 1) * ld + cols) * size_of(t.dtype))};
}
}  // namespace

bool b_before_wait_allowed(const std::vector<const DeviceTensor*>& read, const std::vector<const DeviceTensor*>& written) {
  static const bool on = env_switch_on("COMFUSE_EARLY_B");
  if (!on) return false;
  for (const DeviceTensor* r : read)
    for (const DeviceTensor* w : written) {
      const auto a = byte_span(*r), b = byte_span(*w);
      if (!a || !b) return false;
      if (a->first < a->second && b->first < b->second && a->first < b->second && b->first < a->second) return false;
    }
  return true;
}

int prepare(cudaKernel_t kernel, const KernelConfig& k) {
  const void* func = reinterpret_cast<const void*>(kernel);
  check(cudaFuncSetAttribute(func, cudaFuncAttributeMaxDynamicSharedMemorySize, k.smem_bytes()),
        "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  if (k.hw_cluster_size() > 8)
    check(cudaFuncSetAttribute(func, cudaFuncAttributeNonPortableClusterSizeAllowed, 1),
          "cudaFuncSetAttribute(NonPortableClusterSizeAllowed)");
  LaunchAttrs attr;
  const cudaLaunchConfig_t cfg = launch_config(dim3(k.hw_cluster_x(), k.cluster_n, 1), k.threads(), k.hw_cluster_x(),
                                               k.cluster_n, k.smem_bytes(), nullptr, attr, false);
  int max_clusters = 0;
  check(cudaOccupancyMaxActiveClusters(&max_clusters, func, &cfg), "cudaOccupancyMaxActiveClusters");
  if (max_clusters < 1) throw Error("the kernel fits no cluster on this GPU (SMEM or cluster size)");
  // In the scheduler's clusters (cluster_m x cluster_n CTAs): a hardware cluster of K-splits holds
  // k_splits of them (KernelConfig::hw_cluster_x).
  return max_clusters * (k.hw_cluster_x() / k.cluster_m);
}

void launch(cudaKernel_t kernel, const KernelConfig& k, const Params& p, cudaStream_t stream, int max_active_clusters) {
  const LaunchGrid g = launch_grid(k, p.M, p.N, max_active_clusters);
  if (g.error) throw Error(fmt::format("{} ({} clusters resident at once)", g.error, max_active_clusters));
  if (k.stash_workspace_bytes_per_cta() > 0 && (!p.stash || reinterpret_cast<uintptr_t>(p.stash) % 16))
    throw Error("this kernel keeps its stash in a workspace: Params::stash must point to a 16-byte aligned workspace "
                "of stash_workspace_bytes() bytes");
  if (k.uses_exchange_workspace() && (!p.exchange || reinterpret_cast<uintptr_t>(p.exchange) % 16))
    throw Error("this kernel reduces rows across clusters or splits K: Params::exchange must point to a 16-byte "
                "aligned workspace of exchange_workspace_bytes() bytes, initialized once by init_exchange_workspace()");
  if (k.uses_exchange_workspace() && (p.workspace_clusters < max_active_clusters))
    throw Error("Params::workspace_clusters: the exchange workspace is laid out for fewer clusters than may run");
  if (k.k_splits > 1 && ceil_div(p.K, Sm90::kTileK) < k.k_splits)
    throw Error(fmt::format("K = {} has {} k-blocks of {}: fewer than this kernel's {} K-splits", p.K,
                            ceil_div(p.K, Sm90::kTileK), Sm90::kTileK, k.k_splits));
  LaunchAttrs attr;
  const cudaLaunchConfig_t cfg =
      launch_config(dim3(g.grid_x, g.grid_y, 1), k.threads(), g.cluster_x, g.cluster_y, k.smem_bytes(), stream, attr, true);
  void* args[1] = {const_cast<Params*>(&p)};
  check(cudaLaunchKernelExC(&cfg, reinterpret_cast<const void*>(kernel), args), "cudaLaunchKernelExC");
}

int prepare(cudaKernel_t kernel, const B2bConfig& k) {
  const void* func = reinterpret_cast<const void*>(kernel);
  check(cudaFuncSetAttribute(func, cudaFuncAttributeMaxDynamicSharedMemorySize, k.smem_bytes()),
        "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  if (k.cluster_n1 > 1) {  // N1 split over clusters: how many fit at once, in CTAs
    if (k.cluster_n1 > 8)
      check(cudaFuncSetAttribute(func, cudaFuncAttributeNonPortableClusterSizeAllowed, 1),
            "cudaFuncSetAttribute(NonPortableClusterSizeAllowed)");
    LaunchAttrs attr;
    const cudaLaunchConfig_t cfg =
        launch_config(dim3(k.cluster_n1, 1, 1), k.threads(), k.cluster_n1, 1, k.smem_bytes(), nullptr, attr, false);
    int max_clusters = 0;
    check(cudaOccupancyMaxActiveClusters(&max_clusters, func, &cfg), "cudaOccupancyMaxActiveClusters");
    if (max_clusters < 1)
      throw Error(fmt::format("the B2B kernel fits no cluster of {} CTAs on this GPU (SMEM or cluster size)", k.cluster_n1));
    return max_clusters * k.cluster_n1;
  }
  int per_sm = 0, sms = 0, dev = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, func, k.threads(), k.smem_bytes()),
        "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
  if (per_sm < 1) throw Error("the B2B kernel fits no CTA on this GPU (SMEM)");
  return per_sm * sms;
}

void launch(cudaKernel_t kernel, const B2bConfig& k, const Params& p, cudaStream_t stream, int max_active_ctas) {
  // The decode kernel is not persistent: one cluster a batch.
  const long long grid = k.decode() ? static_cast<long long>(p.batches) * k.cluster_n1
                                    : b2b_grid(k, p.batches, p.M, p.N, max_active_ctas);
  if (grid > 0x7fffffffLL) throw Error(fmt::format("{} batches split over {} CTAs exceed a grid's 2^31 - 1", p.batches, k.cluster_n1));
  LaunchAttrs attr;
  // N1 split over clusters: measured 12% slower with the overlap (0.436 vs 0.389 ms, FFN 8192 x 1024
  // -> 4096 -> 256 at C = 2; bench/NOTES.md), unsplit kernels alike either way: launched without it.
  const cudaLaunchConfig_t cfg = launch_config(dim3(static_cast<unsigned>(grid), 1, 1), k.threads(), k.cluster_n1, 1,
                                               k.smem_bytes(), stream, attr, k.cluster_n1 == 1);
  void* args[1] = {const_cast<Params*>(&p)};
  check(cudaLaunchKernelExC(&cfg, reinterpret_cast<const void*>(kernel), args), "cudaLaunchKernelExC");
}

}  // namespace comfuse::runtime_detail

namespace comfuse {

void init_exchange_workspace(void* workspace, size_t bytes, size_t tagged_bytes) {
  if (bytes < size_t(kExchangeHeaderBytes)) throw Error(fmt::format("an exchange workspace of {} bytes has no room for its header", bytes));
  tagged_bytes = std::min(tagged_bytes, bytes - kExchangeHeaderBytes);
  runtime_detail::check(cudaMemset(workspace, 0, kExchangeHeaderBytes + tagged_bytes), "zeroing the row exchange workspace");
  const ExchangeHeader h{0, 0, tagged_bytes};
  runtime_detail::check(cudaMemcpy(workspace, &h, sizeof h, cudaMemcpyHostToDevice), "writing the row exchange header");
}

}  // namespace comfuse
