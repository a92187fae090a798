// comfuse/cluster/dsmem.cuh: cross-CTA row all-reduce over distributed shared memory (DSMEM)
// for the reduce phase of a Stage (epilogue/stage.cuh), one channel per consumer warp group.
//
// Unified reduction buffer (ONE per consumer warp group, shared by every reduction of the
// epilogue's stage chain: O(1) in the number of reductions):
//   float slot[2][ClusterN][Rows]   double-buffered by round parity; slot[b][r] holds the row's
//                                   CTA r's (its rank along N) per-row partials of a round
//                                   that used buffer b
//   uint64 full[2]                  one transaction mbarrier per buffer (arrival count 1)
// Rows = the warp group's tile rows (64 or 128), one fp32 per row: the thread that holds
// tile-local row `row` in one CTA holds the same row in every CTA (layout consistency: the
// wgmma accumulator layout is the same everywhere and all CTAs of a cluster row take the same
// M rows), so slot[b][r][row] is addressed with one rule in every CTA, and every peer's
// copy of the channel sits at the same SMEM offset (mapa of the local address).
//
// A round (per warp group; round counter `r` in registers, b = r & 1, parity = (r >> 1) & 1):
//   PeerToPeer: every CTA writes its partials to its own slot[b][rank] (quad leaders),
//     fence.proxy.async (the bulk copy engine reads them), warp-group barrier; thread 0 arms
//     full[b] for (ClusterN - 1) * Rows * 4 bytes and threads 0..ClusterN-2 issue one bulk copy each,
//     cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx into slot[b][rank] of
//     every peer, completing on THAT peer's full[b]. Everyone waits on its local full[b] and
//     combines the ClusterN slots in rank order (own value from registers): every CTA
//     computes bitwise the same statistic.
//   LeaderFollower (leader = rank 0 along N): followers push slot[b][rank] to the leader and arm
//     their full[b] for Rows * 4 bytes; the leader waits for (ClusterN - 1) slots, combines in
//     rank order, writes the result into its slot[b][0] (unused by partials: its own partial
//     stays in registers), fences, syncs, and pushes it into every follower's slot[b][0].
// A remote copy may land before the local thread armed the barrier: the transaction count
// goes transiently negative, the pending arrival keeps the phase open (PTX ISA, mbarrier
// tx-count), so arming order does not matter.
//
// Slot reuse without "empty" barriers: buffer b is rewritten in round r + 2. Causality
// through round r + 1 orders it after every read of round r: a CTA issues its round-(r+1)
// push only after a warp-group barrier that every thread passes after its round-r reads,
// and no CTA reaches round r + 2 before it received round r + 1's data from every CTA it
// depends on (PeerToPeer: all peers; LeaderFollower: followers <- leader <- followers).
// Completion of a bulk copy on the destination mbarrier also implies its source was read.
// The kernel initializes the barriers before its first cluster barrier, and runs a cluster
// barrier before exit so that no CTA leaves while a peer may still write into its SMEM.
#pragma once
#include "../common.cuh"
#include "../params.cuh"

namespace comfuse::cluster {

// ---- PTX wrappers CuTe does not provide in this form ---------------------------------------
COMFUSE_DEVICE uint32_t mapa(uint32_t smem_addr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(smem_addr), "r"(rank));
  return r;
}
COMFUSE_DEVICE void fence_mbar_init_cluster() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Bulk copy local SMEM -> a peer's SMEM (dst and bar: shared::cluster addresses from mapa),
// completing `bytes` transactions on the peer's mbarrier. bytes % 16 == 0, 16-byte aligned.
COMFUSE_DEVICE void bulk_copy_s2peer(uint32_t dst_cluster, uint32_t src_cta, uint32_t bytes, uint32_t bar_cluster) {
  asm volatile(
      "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
      ::"r"(dst_cluster), "r"(src_cta), "r"(bytes), "r"(bar_cluster) : "memory");
}
// The mbarrier hand-overs between a cluster's CTAs (split_hand_over.cuh, b2b/partial_sum.cuh):
// a wait that acquires what peers released to this barrier, one arrival on a peer's barrier
// (`bar_cluster` from mapa) releasing this thread's earlier stores, and 16-byte SMEM accesses.
COMFUSE_DEVICE void mbar_wait_cluster(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n"
      "}\n" ::"r"(bar), "r"(parity) : "memory");
}
COMFUSE_DEVICE void mbar_arrive_remote(uint32_t bar_cluster) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(bar_cluster) : "memory");
}
COMFUSE_DEVICE float4 ld_cluster_v4(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr) : "memory");
  return v;
}
COMFUSE_DEVICE float ld_cluster_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}
COMFUSE_DEVICE void st_shared_v4(uint32_t addr, float4 v) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
}
COMFUSE_DEVICE uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
COMFUSE_DEVICE float ld_shared_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}
COMFUSE_DEVICE void st_shared_f32(uint32_t addr, float v) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}

// ---- the channel --------------------------------------------------------------------------
// MBlocks x 2 rows per thread (the wgmma layout: tile-local row mi*64 + warp*16 + lane/4 + 8h),
// after the quad shuffles every lane of a quad holds its rows' CTA-partial.
// Mode: PeerToPeer or LeaderFollower (the planner picks; src/plan/calibration.h has the
// measured rounds of both).
// ClusterM > 1: a 2-D cluster (CTA rank rank_m + ClusterM * rank_n); the channel joins the
// ClusterN CTAs of this CTA's rank_m (the row's CTAs), indexed by rank_n.
template <int Rows, int ClusterN, Aggregation Mode_, int ClusterM = 1>
struct RowAllReduce {
  static constexpr Aggregation Mode = Mode_;
  static_assert(Mode == Aggregation::PeerToPeer || Mode == Aggregation::LeaderFollower, "a DSMEM mode");
  static constexpr int MBlocks = Rows / 64;
  static constexpr uint32_t kSlotBytes = Rows * 4;
  static_assert(Rows == 64 || Rows == 128, "a warp group holds 64 or 128 rows");
  static_assert(ClusterN >= 2 && ClusterN <= 16, "cluster channel: 2..16 CTAs");

  struct Storage {
    alignas(128) float slot[2][ClusterN][Rows];
    alignas(8) uint64_t full[2];
  };
  static_assert(sizeof(Storage) == dsmem_channel_bytes(Rows, ClusterN), "config.cuh's channel size");
  static constexpr bool kOnChip = true;

  // This CTA's index among the row's CTAs, and the cluster rank of the row's CTA `n`.
  static COMFUSE_DEVICE uint32_t rank_n() { return cluster_rank() / ClusterM; }
  static COMFUSE_DEVICE uint32_t row_cta(uint32_t n) { return cluster_rank() % ClusterM + ClusterM * n; }

  // One thread, before the kernel's first cluster barrier.
  static COMFUSE_DEVICE void init(Storage& s) {
    mbar_init(smem_u32(&s.full[0]), 1);
    mbar_init(smem_u32(&s.full[1]), 1);
    fence_mbar_init_cluster();
  }


  // Quad leaders (the four lanes of a quad hold the same rows) store their rows' values into
  // the slot at `slot`, fenced for the bulk copies (async proxy) that read it next.
  static COMFUSE_DEVICE void store_rows(uint32_t slot, int t, float const (&v)[MBlocks][2]) {
    if (t % 4 != 0) return;
    CUTE_UNROLL
    for (int mi = 0; mi < MBlocks; ++mi)
      CUTE_UNROLL
      for (int h = 0; h < 2; ++h) st_shared_f32(slot + 4 * accum_row(t, mi, h), v[mi][h]);
    fence_view_async_shared();
  }

  // Start round `round`: publish the partials (and, for PeerToPeer / followers, push them).
  // t: thread in the warp group; bar_id: the warp group's named barrier.
  static COMFUSE_DEVICE void start(Storage& s, uint32_t round, RowGroupSlot const&, Params const&, int t, int bar_id,
                                   float const (&v)[MBlocks][2]) {
    uint32_t const b = round & 1, rank = rank_n();
    uint32_t const full = smem_u32(&s.full[b]);
    if constexpr (Mode == Aggregation::LeaderFollower) {
      if (rank == 0) {  // the leader only arms its barrier; its partial stays in registers
        if (t == 0) mbar_arrive_expect_tx(full, (ClusterN - 1) * kSlotBytes);
        return;
      }
    }
    uint32_t const mine = smem_u32(&s.slot[b][rank][0]);
    store_rows(mine, t, v);
    named_sync(bar_id, kWarpGroupThreads);
    if constexpr (Mode == Aggregation::PeerToPeer) {
      if (t == 0) mbar_arrive_expect_tx(full, (ClusterN - 1) * kSlotBytes);
      if (t < ClusterN - 1) {  // one peer per thread: the copies issue in parallel, staggered
        uint32_t const peer = row_cta((rank + 1 + t) % ClusterN);
        bulk_copy_s2peer(mapa(mine, peer), mine, kSlotBytes, mapa(full, peer));
      }
    } else if (t == 0) {
      mbar_arrive_expect_tx(full, kSlotBytes);  // the leader's result
      bulk_copy_s2peer(mapa(mine, row_cta(0)), mine, kSlotBytes, mapa(full, row_cta(0)));
    }
  }

  // Finish round `round`: v becomes the cluster-wide combination (identical bits in every CTA).
  template <class Op>
  static COMFUSE_DEVICE void finish(Storage& s, uint32_t round, RowGroupSlot const&, Params const&, int t, int bar_id,
                                    float (&v)[MBlocks][2]) {
    uint32_t const b = round & 1, parity = (round >> 1) & 1, rank = rank_n();
    uint32_t const full = smem_u32(&s.full[b]);
    uint32_t const base = smem_u32(&s.slot[b][0][0]);
    mbar_wait(full, parity);
    if constexpr (Mode == Aggregation::LeaderFollower) {
      if (rank != 0) {
        CUTE_UNROLL
        for (int mi = 0; mi < MBlocks; ++mi)
          CUTE_UNROLL
          for (int h = 0; h < 2; ++h) v[mi][h] = ld_shared_f32(base + 4 * accum_row(t, mi, h));
        return;
      }
    }
    CUTE_UNROLL
    for (int mi = 0; mi < MBlocks; ++mi)
      CUTE_UNROLL
      for (int h = 0; h < 2; ++h) {
        uint32_t const a = base + 4 * accum_row(t, mi, h);
        float acc = rank == 0 ? v[mi][h] : ld_shared_f32(a);
        CUTE_UNROLL
        for (int j = 1; j < ClusterN; ++j) acc = Op::combine(acc, uint32_t(j) == rank ? v[mi][h] : ld_shared_f32(a + j * kSlotBytes));
        v[mi][h] = acc;
      }
    if constexpr (Mode == Aggregation::LeaderFollower) {  // the leader broadcasts
      store_rows(base, t, v);
      named_sync(bar_id, kWarpGroupThreads);
      if (t < ClusterN - 1) {  // one follower per thread: the copies issue in parallel
        uint32_t const peer = row_cta(t + 1);
        bulk_copy_s2peer(mapa(base, peer), base, kSlotBytes, mapa(full, peer));
      }
    }
  }
};

}  // namespace comfuse::cluster
