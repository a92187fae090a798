// comfuse/b2b/partial_sum.cuh: the sum of a job's partial O over the CTAs of a cluster that split
// N1 (B2bConfig::cluster_n1 = C > 1: the paper's partition along N1, O = sum over c of S^(c) W2^(c)),
// over DSMEM, into the job's owner, which then runs GEMM2's epilogue.
//
// Every CTA of the cluster walked its share of the job's chunks (scheduler/grid.cuh's
// b2b_rank_chunks) into O in registers; thread t of consumer warp group w holds the same elements
// of O in every CTA (the wgmma accumulator layout, and the cluster's CTAs take the same jobs). The
// owner (the cluster's CTAs take turns: every C-th job of a warp group) adds each element's C
// partials in rank order, its own from registers, with the online softmax's rescale where F has
// one: the same bits whichever CTA owns the job, and no atomics.
//
// The hand-over, per consumer warp group, in pieces of xfer_floats fp32 per thread through two
// buffers in each follower's OWN SMEM (a follower fills one while the owner reads the other):
//   follower  waits free[b] (its previous fill of buffer b was read), stores the piece as float4s
//             laid out [vector][thread] (conflict-free), and every thread arrives on the owner's
//             full[b] (release.cluster: its own stores before its arrival);
//   owner     waits its full[b] (128 threads of each of the C - 1 followers), reads every
//             follower's buffer b with ld.shared::cluster, adds in rank order, and every thread
//             arrives on every follower's free[b] (its reads before the follower's next fill).
// Thread t reads only what thread t of each follower wrote, so per-thread arrivals are all the
// ordering there is (no warp-level aggregation whose cumulativity a checker could miss).
// Each CTA counts its own waits on each barrier (as owner on full, as follower on free), so the
// roles may rotate from job to job; a follower's n-th fill of buffer b waits for the (n-1)-th
// release (parity ((n & 1) ^ 1): the first passes at once). The online softmax's row statistics
// (max and partial sums) travel with piece 0. The kernel initializes the barriers before its first
// cluster barrier and runs one before exit, so no CTA leaves while a peer may still read its SMEM.
#pragma once
#include "../cluster/dsmem.cuh"
#include "../common.cuh"
#include "../config.cuh"

namespace comfuse::b2b {

namespace xfer {
COMFUSE_DEVICE float lane_of(float4 v, int e) { return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w; }
}  // namespace xfer

// C: CTAs along N1; Floats: O's fp32 values per consumer thread (tile_n2 / 2); PieceFloats: of
// them per piece (B2bConfig::xfer_floats).
template <int C, int Floats, int PieceFloats>
struct PartialSum {
  static constexpr int kThreads = Sm90::kWarpGroupThreads;
  static constexpr int kPieceFloats = PieceFloats;
  static constexpr int kVecs = kPieceFloats / 4;
  static constexpr int kPieces = Floats / kPieceFloats;
  static_assert(Floats % kPieceFloats == 0, "O's values per thread come in whole pieces");
  static_assert(C >= 2 && C <= Sm90::kMaxClusterSize, "2..16 CTAs along N1");

  struct Storage {
    float4 buf[2][kVecs][kThreads];
    float4 stats[kThreads];  // the online softmax's (max r, max r + 8, sum r, sum r + 8)
    uint64_t full[2];        // owner side: (C - 1) followers x 128 threads per piece
    uint64_t free[2];        // follower side: the owner's 128 threads per piece
  };

  uint32_t full_waits[2] = {0, 0}, free_waits[2] = {0, 0};

  static COMFUSE_DEVICE void init(Storage& s) {
    for (int b = 0; b < 2; ++b) {
      mbar_init(smem_u32(&s.full[b]), kThreads * (C - 1));
      mbar_init(smem_u32(&s.free[b]), kThreads);
    }
    cluster::fence_mbar_init_cluster();
  }

  // Follower: hand O (and F's row statistics) to the job's owner, piece by piece.
  template <class FO>
  COMFUSE_DEVICE void send(Storage& s, FO const& O, float4 stats, uint32_t owner, int t) {
    CUTE_UNROLL
    for (int q = 0; q < kPieces; ++q) {
      int const b = q & 1;
      cluster::mbar_wait_cluster(smem_u32(&s.free[b]), (free_waits[b]++ & 1) ^ 1);
      CUTE_UNROLL
      for (int v = 0; v < kVecs; ++v) {
        int const i = q * kPieceFloats + 4 * v;
        cluster::st_shared_v4(smem_u32(&s.buf[b][v][t]), make_float4(O(i), O(i + 1), O(i + 2), O(i + 3)));
      }
      if (q == 0) cluster::st_shared_v4(smem_u32(&s.stats[t]), stats);
      cluster::mbar_arrive_remote(cluster::mapa(smem_u32(&s.full[b]), owner));
    }
  }

  // Owner: O becomes the sum over the cluster in rank order, each partial weighed by alpha (1 for
  // an elementwise F; the online softmax's exp(m_r - m) per row, from merge()).
  // merge(stats[C], alpha[C][2]): F combines the row statistics (stats[me] its own).
  template <class FO, class Merge>
  COMFUSE_DEVICE void receive(Storage& s, FO& O, float4 own_stats, uint32_t me, int t, Merge&& merge) {
    float alpha[C][2];
    CUTE_UNROLL
    for (int q = 0; q < kPieces; ++q) {
      int const b = q & 1;
      cluster::mbar_wait_cluster(smem_u32(&s.full[b]), full_waits[b]++ & 1);
      if (q == 0) {
        float4 st[C];
        CUTE_UNROLL
        for (int r = 0; r < C; ++r)
          st[r] = uint32_t(r) == me ? own_stats : cluster::ld_cluster_v4(cluster::mapa(smem_u32(&s.stats[t]), uint32_t(r)));
        merge(st, alpha);
      }
      CUTE_UNROLL
      for (int v = 0; v < kVecs; ++v) {
        float4 peer[C];
        CUTE_UNROLL
        for (int r = 0; r < C; ++r)
          peer[r] = uint32_t(r) == me ? make_float4(0.f, 0.f, 0.f, 0.f)
                                      : cluster::ld_cluster_v4(cluster::mapa(smem_u32(&s.buf[b][v][t]), uint32_t(r)));
        CUTE_UNROLL
        for (int e = 0; e < 4; ++e) {
          int const i = q * kPieceFloats + 4 * v + e;
          int const h = (i >> 1) & 1;  // the thread's row r or r + 8 (the accumulator layout)
          float acc = 0.f;
          CUTE_UNROLL
          for (int r = 0; r < C; ++r) acc = fmaf(alpha[r][h], uint32_t(r) == me ? O(i) : xfer::lane_of(peer[r], e), acc);
          O(i) = acc;
        }
      }
      CUTE_UNROLL
      for (int r = 0; r < C; ++r)
        if (uint32_t(r) != me) cluster::mbar_arrive_remote(cluster::mapa(smem_u32(&s.free[b]), uint32_t(r)));
    }
  }
};

}  // namespace comfuse::b2b
