// comfuse/cluster/split_hand_over.cuh: split-K's partial tiles over DSMEM
// (KernelConfig::splits_in_cluster): a tile's S K-splits are the S CTAs of one hardware cluster,
// and the owner (rank 0) adds the others' fp32 partials in rank order, then runs the epilogue.
//
// Why: through L2 (scheduler/split_k.cuh) each split's partial costs the owner dependent L2 round
// trips (a tag, then the rows: calibration.h split_k_gather_*), on the critical path of a decode
// launch whose whole epilogue is exposed. Over DSMEM a hand-over is one remote arrival and one
// round of remote loads, and the loads of every split are in flight together.
//
// What travels: only rows below M (decode: 1..16 rows of a 64-row tile). Warp w of a consumer warp
// group holds rows 16w..16w+15 of each m64 block (the wgmma accumulator layout), so a job's
// hand-over takes one PIECE per warp whose rows start below M (config.cuh split_hand_over_pieces:
// one at M <= 16), and
// piece q carries warp q's accumulators. Per consumer warp group, in each follower's OWN SMEM, one
// buffer of one warp's share ([accumulators / 4][32 lanes] float4, conflict-free), and:
//   full  (in the owner): 128 x (S - 1) arrivals a piece, every thread of every follower;
//   free  (in each follower): 128 arrivals a piece, every thread of the owner.
//   follower  waits free (its previous piece was read), warp q stores its accumulators, and every
//             thread arrives on the owner's full (release.cluster: its own stores first);
//   owner     waits full, warp q loads each follower's buffer (ld.shared::cluster) and adds them
//             in rank order, and every thread arrives on every follower's free.
// Thread t reads only what thread t of each follower wrote, so per-thread arrivals are all the
// ordering there is (b2b/partial_sum.cuh's hand-over, with rows instead of pieces of columns).
// Both sides count their pieces (`uses`: the barriers' phases) over the warp group's jobs; the
// splits walk the same jobs, each job the same pieces. The kernel initializes the barriers before
// its first cluster barrier and runs one before exit: no CTA leaves while a peer may still read
// its buffer or arrive on its barriers.
#pragma once
#include "../common.cuh"
#include "../config.cuh"
#include "dsmem.cuh"

namespace comfuse::cluster {

// C: the kernel's configuration, with the splits in a cluster (its K-splits are the cluster's
// CTAs; a thread's accumulators travel, StepVecs float4s of every follower loaded together).
template <KernelConfig C>
struct SplitHandOver {
  static constexpr int Splits = C.k_splits;
  static_assert(C.splits_in_cluster && Splits >= 2 && Splits <= Sm90::kMaxClusterSize, "2..16 K-splits in a cluster");
  static_assert(C.accumulators() % 4 == 0, "whole float4s a thread");
  static constexpr int kVecs = C.accumulators() / 4;
  static constexpr int kLanes = 32;
  static constexpr int kThreads = Sm90::kWarpGroupThreads;
  static constexpr int kStepVecs = C.split_hand_over_step_vecs();
  static_assert(kVecs % kStepVecs == 0, "whole steps");

  struct alignas(128) Storage {  // KernelConfig::split_hand_over_bytes()
    float4 buf[kVecs][kLanes];
    uint64_t full;
    uint64_t free;
  };

  uint32_t uses = 0;  // pieces handed over by this warp group so far

  static COMFUSE_DEVICE void init(Storage& s) {
    mbar_init(smem_u32(&s.full), kThreads * (Splits - 1));
    mbar_init(smem_u32(&s.free), kThreads);
    fence_mbar_init_cluster();
  }

  // Follower: hands its partial accumulators of the job's rows < rows_left to the owner (rank 0).
  template <class Frag>
  COMFUSE_DEVICE void send(Storage& s, Frag const& acc, int rows_left, int t) {
    int const n = split_hand_over_pieces(rows_left), warp = t / kLanes, lane = t % kLanes;
    uint32_t const owner_full = mapa(smem_u32(&s.full), 0);
    for (int q = 0; q < n; ++q, ++uses) {
      mbar_wait_cluster(smem_u32(&s.free), (uses & 1) ^ 1);
      if (warp == q) {
        CUTE_UNROLL
        for (int v = 0; v < kVecs; ++v)
          st_shared_v4(smem_u32(&s.buf[v][lane]), make_float4(acc(4 * v), acc(4 * v + 1), acc(4 * v + 2), acc(4 * v + 3)));
      }
      mbar_arrive_remote(owner_full);
    }
  }

  // Owner: acc becomes its own partial plus every follower's, added in rank order (the same bits
  // as the L2 gather's split order), for the job's rows < rows_left.
  template <class Frag>
  COMFUSE_DEVICE void receive(Storage& s, Frag& acc, int rows_left, int t) {
    int const n = split_hand_over_pieces(rows_left), warp = t / kLanes, lane = t % kLanes;
    for (int q = 0; q < n; ++q, ++uses) {
      mbar_wait_cluster(smem_u32(&s.full), uses & 1);
      if (warp == q) {
        CUTE_UNROLL
        for (int v0 = 0; v0 < kVecs; v0 += kStepVecs) {
          float4 peer[Splits - 1][kStepVecs];
          CUTE_UNROLL
          for (int r = 1; r < Splits; ++r)
            CUTE_UNROLL
            for (int v = 0; v < kStepVecs; ++v)
              peer[r - 1][v] = ld_cluster_v4(mapa(smem_u32(&s.buf[v0 + v][lane]), uint32_t(r)));
          CUTE_UNROLL
          for (int r = 0; r < Splits - 1; ++r)
            CUTE_UNROLL
            for (int v = 0; v < kStepVecs; ++v) {
              int const i = 4 * (v0 + v);
              acc(i) += peer[r][v].x;
              acc(i + 1) += peer[r][v].y;
              acc(i + 2) += peer[r][v].z;
              acc(i + 3) += peer[r][v].w;
            }
        }
      }
      CUTE_UNROLL
      for (int r = 1; r < Splits; ++r) mbar_arrive_remote(mapa(smem_u32(&s.free), uint32_t(r)));
    }
  }
};

}  // namespace comfuse::cluster
