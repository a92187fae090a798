// comfuse/common.cuh: what every device header of the library shares: the CuTe/CUTLASS
// includes (kept to the few the kernel needs, so that a JIT compile stays short), the
// named-barrier ids, and the handful of PTX wrappers that CuTe does not provide.
// Device code only; NVRTC-compatible (no host headers).
#pragma once

#include <cute/tensor_impl.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/arch/cluster_sm90.hpp>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "config.cuh"

#define COMFUSE_DEVICE __device__ __forceinline__

namespace comfuse {

inline constexpr int kWarpGroupThreads = Sm90::kWarpGroupThreads;

// The row, within a warp group's tile, of accumulator pair h (registers with (i >> 1) & 1 == h)
// of m64-block mi that thread t of the warp group holds (wgmma D layout: warp t / 32 owns rows
// 16 w .. 16 w + 15 of each block, the quad t % 32 / 4 one of them, h adds 8). The epilogue
// nodes and both reduction channels index per-row values by it.
COMFUSE_DEVICE int accum_row(int t, int mi, int h) { return mi * 64 + (t / 32) * 16 + (t % 32) / 4 + 8 * h; }

// Hardware named barriers (0 is __syncthreads). One id per purpose and warp group, so
// that the consumer warp groups never share a barrier they use at different times: ids 1-4 for
// consumer WGs 0 and 1, then two a consumer WG past them (KernelConfig::consumer_wgs <= 3: ids
// up to 6 of the 16).
enum class NamedBarrier : int {
  MmaTurnWG0 = 1,  // consumer WG0 may start its mainloop (arrived by the consumer before it in turn)
  MmaTurnWG1 = 2,  // consumer WG1 may start its mainloop (arrived by WG0)
  EpilogueWG0 = 3, // intra-WG sync of WG0's epilogue (SMEM staging, vectors)
  EpilogueWG1 = 4,
  // Row reductions need no barrier of their own: the cross-warp level is a no-op in the
  // wgmma layout and the cluster round syncs on the epilogue barrier above (stage.cuh).
};

COMFUSE_DEVICE int barrier_id(NamedBarrier b, int wg = 0) { return static_cast<int>(b) + wg; }
// The same for a kernel of ConsumerWGs consumer warp groups: WGs 0 and 1 as above, two ids a WG
// after them.
template <int ConsumerWGs> COMFUSE_DEVICE int barrier_id(NamedBarrier b, int wg) {
  if constexpr (ConsumerWGs <= 2) return barrier_id(b, wg);
  else return wg < 2 ? barrier_id(b, wg) : 5 + 2 * (wg - 2) + (b == NamedBarrier::EpilogueWG0 ? 1 : 0);
}

// x, which the compiler can no longer see through: a value derived from it is computed where it
// is used, not hoisted out of the loop around (and then kept, or spilled, across it).
COMFUSE_DEVICE uint32_t opaque(uint32_t x) {
  uint32_t y;
  asm volatile("mov.b32 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

COMFUSE_DEVICE void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
COMFUSE_DEVICE void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Generic-proxy SMEM writes that a TMA store (async proxy) reads next.
COMFUSE_DEVICE void fence_view_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
COMFUSE_DEVICE void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Wait until at most N committed TMA stores still READ shared memory.
template <int N> COMFUSE_DEVICE void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N> COMFUSE_DEVICE void tma_store_wait_all() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}
// x[0..N) folded pairwise with Op::combine (a tree: log2 N dependent combines instead of N), in
// the same order every time (the same bits in every lane and CTA). Overwrites x.
template <class Op, int N> COMFUSE_DEVICE float fold_pairwise(float (&x)[N]) {
  CUTE_UNROLL
  for (int w = 1; w < N; w *= 2)
    CUTE_UNROLL
    for (int i = 0; i + w < N; i += 2 * w) x[i] = Op::combine(x[i], x[i + w]);
  return x[0];
}

// Nanoseconds, comparable across SMs (the L2 exchange's timeout, debug/trace.cuh's stamps).
// 0, as neither NVVM nor ptxas can prove it (the launch's dynamic SMEM size is under 2 GiB): an
// index that keeps a branch ptxas would otherwise fold away (b2b/b2b_gemm_sm90.cuh).
COMFUSE_DEVICE int opaque_zero() {
  uint32_t bytes;
  asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
  return int(bytes >> 31);
}
COMFUSE_DEVICE uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}

template <int RegCount> COMFUSE_DEVICE void warpgroup_reg_alloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(RegCount));
}
template <int RegCount> COMFUSE_DEVICE void warpgroup_reg_dealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(RegCount));
}

COMFUSE_DEVICE uint32_t smem_u32(void const* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The kernel's SharedStorage at the dynamic SMEM's base, which is declared Sm90::kSmemAlign
// aligned (the launch budgets no bytes to realign it: KernelConfig::smem_bytes). A base that is
// not would corrupt every swizzled ring slot, so it stops the kernel instead.
template <class Storage> COMFUSE_DEVICE Storage& smem_base(char* smem) {
  if (smem_u32(smem) % Sm90::kSmemAlign != 0) __trap();
  return *reinterpret_cast<Storage*>(smem);
}

// stmatrix .x4: four 8x8 16-bit matrices; lane l gives the address of row (l % 8) of
// matrix (l / 8); register q of every lane holds that lane's pair of matrix q.
COMFUSE_DEVICE void stmatrix_x4(uint32_t smem_addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.x4.m8n8.shared.b16 [%0], {%1, %2, %3, %4};\n"
               ::"r"(smem_addr), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
}
COMFUSE_DEVICE void st_shared_v2(uint32_t smem_addr, float a, float b) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(smem_addr), "f"(a), "f"(b) : "memory");
}

COMFUSE_DEVICE uint32_t ld_shared_u32(uint32_t smem_addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(smem_addr));
  return v;
}

COMFUSE_DEVICE float2 ld_shared_v2(uint32_t smem_addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(smem_addr));
  return v;
}

// Element types the kernel moves. float for fp32 outputs.
template <class T> struct DType;
template <> struct DType<cutlass::bfloat16_t> {
  static COMFUSE_DEVICE uint32_t pack2(float a, float b) {
    __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static COMFUSE_DEVICE float load(void const* p, int i) {
    return __bfloat162float(reinterpret_cast<__nv_bfloat16 const*>(p)[i]);
  }
  // An element's bits, converted later (a load left in flight: nothing reads its register yet).
  using Bits = uint16_t;
  static COMFUSE_DEVICE Bits load_bits(void const* p, int i) { return reinterpret_cast<uint16_t const*>(p)[i]; }
  static COMFUSE_DEVICE float from_bits(Bits b) { return __uint_as_float(uint32_t(b) << 16); }
  static COMFUSE_DEVICE float round(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
  // The two halves of pack2's word (a: low 16 bits).
  static COMFUSE_DEVICE float unpack_lo(uint32_t w) { return __uint_as_float(w << 16); }
  static COMFUSE_DEVICE float unpack_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
};
template <> struct DType<cutlass::half_t> {
  static COMFUSE_DEVICE uint32_t pack2(float a, float b) {
    __half2 v = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static COMFUSE_DEVICE float load(void const* p, int i) {
    return __half2float(reinterpret_cast<__half const*>(p)[i]);
  }
  using Bits = uint16_t;
  static COMFUSE_DEVICE Bits load_bits(void const* p, int i) { return reinterpret_cast<uint16_t const*>(p)[i]; }
  static COMFUSE_DEVICE float from_bits(Bits b) { return __half2float(__ushort_as_half(b)); }
  static COMFUSE_DEVICE float round(float x) { return __half2float(__float2half_rn(x)); }
  static COMFUSE_DEVICE float unpack_lo(uint32_t w) { return __half2float(__ushort_as_half(uint16_t(w & 0xffffu))); }
  static COMFUSE_DEVICE float unpack_hi(uint32_t w) { return __half2float(__ushort_as_half(uint16_t(w >> 16))); }
};
template <> struct DType<float> {
  static COMFUSE_DEVICE float load(void const* p, int i) { return reinterpret_cast<float const*>(p)[i]; }
  using Bits = float;
  static COMFUSE_DEVICE Bits load_bits(void const* p, int i) { return load(p, i); }
  static COMFUSE_DEVICE float from_bits(Bits b) { return b; }
  static COMFUSE_DEVICE float round(float x) { return x; }
};

// Programmatic dependent launch: the runtime launches every kernel allowed to overlap the one
// before it in the stream (launch.cpp), so this grid's CTAs may be placed on SMs as the previous
// grid's CTAs exit, and run their prologue (SMEM barriers) meanwhile. Before its first global
// access a kernel waits for the previous grid to complete (its writes visible: the same
// semantics as a serialized launch), then lets the next launch place its CTAs, which can only
// happen once all of ours are resident (the trigger fires when every CTA has triggered or
// exited), so a persistent grid's co-residency is kept. Every ComFuse kernel (fused_gemm, b2b,
// decode) triggers only after its own wait, so where the previous grid is one of ours, the grid
// before it has completed (its writes visible by that grid's completion, not by this wait) by
// the time ours runs: what the previous grid does not write may be read before the wait
// (Params::b_before_wait, where the runtime knows the previous grid: fused_kernel.cpp run_parts).
COMFUSE_DEVICE void wait_for_previous_grid() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
COMFUSE_DEVICE void allow_next_grid() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

// A TMA descriptor's first use waits for the descriptor's fetch. One thread prefetches the
// kernel's descriptors (the mainloop's operands, the epilogue's outputs) at the kernel's start,
// before griddepcontrol.wait (a descriptor is a kernel parameter, not data the previous grid
// writes), so the fetch overlaps the prologue and, under PDL, the previous grid's tail
// (CUTLASS's collectives do the same).
COMFUSE_DEVICE void prefetch_tma_descriptor(void const* desc) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(desc)) : "memory");
}

// CTA-local mbarriers by shared-space address (the DSMEM channels): init with an arrival
// count, arm for a number of TMA / bulk-copy bytes, wait for a phase's parity.
COMFUSE_DEVICE void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
COMFUSE_DEVICE void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
COMFUSE_DEVICE void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n"
      "}\n" ::"r"(bar), "r"(parity) : "memory");
}

// Where a warp group's row-reduction partials meet those of the CTAs that share its rows:
// slot = its row group's exchange slot, rank = its place along N in that group, epoch = the
// launch's tag for the L2 exchange's words (cluster/global_exchange.cuh; unused by DSMEM),
// rows = M - m0, the rows of its tile that exist (GlobalRowAllReduce::live; every row by default).
struct RowGroupSlot {
  int slot = 0;
  int rank = 0;
  uint32_t epoch = 0;
  int rows = 1 << 30;
};

}  // namespace comfuse
