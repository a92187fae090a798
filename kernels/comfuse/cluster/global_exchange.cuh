// comfuse/cluster/global_exchange.cuh: cross-CLUSTER row all-reduce through L2, for rows that
// one cluster should not span (DESIGN.md, "beyond the paper": exchange through L2 among the
// co-resident CTAs of a persistent grid).
//
// Why: a row reduction over DSMEM needs every CTA that holds a row in ONE cluster along N, and
// a cluster along N can only multicast A. The PingPong 64x256 / 128x128 mainloops reach cuBLAS
// only when B is multicast too (clusters along M; bench/NOTES.md: 1.53x cuBLAS with A shared
// along N, parity with B shared along M), and 2-D clusters of 4 leave 12 SMs idle. With this
// channel the hardware cluster runs along M (B multicast, 132 SMs busy) and the Peers CTAs
// that share a row sit in Peers different clusters of the persistent grid ("a row group",
// scheduler/tile_scheduler.cuh), exchanging one fp32 per row and round through global memory.
//
// Workspace (Params::exchange, zeroed once at allocation; host/launch.hpp sizes it): one slot
// per (row group, rank along M in the cluster, consumer warp group):
//   uint64 word[2][Peers][Rows]     double-buffered by round parity, like the DSMEM channel
// Each word carries its own flag (NCCL's "LL" protocol): high 32 bits a tag, low 32 bits the
// fp32 partial, written and read as ONE 8-byte relaxed gpu-scope access (single-copy atomic),
// so a reader that sees the round's tag sees that round's value: no fence, no separate flag,
// no barrier, and every thread polls only the words it needs, all in flight at once.
//   tag = (Params::epoch mod 2^16) << 16 | (round mod 2^16), never 0 (the host skips epochs
//   that are 0 mod 2^16 and re-zeroes the workspace there).
// A word is rewritten every second round of its writer, so the stale value a reader can find
// is that writer's round r - 2 (tag differs) or, on a word's first use in a launch, a value of
// an earlier launch (epoch bits differ for 2^16 launches; then the host re-zeroes).
//
// A round: quad leaders store their rows' words into word[b][rank]; lane q of each quad then
// polls word[b][j][row] of peers j = q, q + 4, ... until the tags match, folds them in rank
// order (own value from registers), and a quad butterfly combines the four lanes: every CTA
// runs the same sequence and computes bitwise the same statistic. Buffer b is
// rewritten in round r + 2 only after its writer saw round r + 1 from every peer, which each
// peer writes after its round-r reads (same argument as cluster/dsmem.cuh).
//
// Liveness: every CTA of a row group must be resident at once. The host launches at most
// cudaOccupancyMaxActiveClusters clusters (persistent grid) in whole row groups, and the
// scheduler gives the Peers CTAs of a group the same job sequence, so every wait is on a peer
// at the same job and round. If the GPU is shared with another long-running kernel, residency
// is not guaranteed: a wait that exceeds kTimeoutNs traps (the launch fails with an error)
// instead of hanging.
#pragma once
#include "../common.cuh"
#include "../params.cuh"

namespace comfuse::cluster {

COMFUSE_DEVICE uint64_t ld_relaxed_gpu_u64(uint64_t const* p) {
  uint64_t v;
  asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];\n" : "=l"(v) : "l"(p) : "memory");
  return v;
}
COMFUSE_DEVICE void st_relaxed_gpu_u64(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;\n" ::"l"(p), "l"(v) : "memory");
}
COMFUSE_DEVICE uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}

template <int Rows, int Peers>
struct GlobalRowAllReduce {
  static constexpr int MBlocks = Rows / 64;
  static_assert(Rows == 64 || Rows == 128, "a warp group holds 64 or 128 rows");
  static_assert(Peers >= 2 && Peers <= 64, "global row group: 2..64 CTAs");
  static constexpr int kSlotBytes = 2 * Peers * Rows * 8;  // one warp group's slot
  static constexpr uint64_t kTimeoutNs = 10ull * 1000 * 1000 * 1000;

  struct Storage {};  // nothing on chip
  static COMFUSE_DEVICE void init(Storage&) {}

  static COMFUSE_DEVICE int row_of(int t, int mi, int h) { return mi * 64 + (t / 32) * 16 + (t % 32) / 4 + 8 * h; }
  static COMFUSE_DEVICE uint32_t tag(Params const& p, uint32_t round) {
    return ((p.epoch & 0xffffu) << 16) | (round & 0xffffu);
  }
  static COMFUSE_DEVICE uint64_t* words(RowGroupSlot const& x, Params const& p, uint32_t round, int rank) {
    return reinterpret_cast<uint64_t*>(static_cast<char*>(p.exchange) + size_t(x.slot) * kSlotBytes) +
           ((round & 1) * Peers + rank) * Rows;
  }

  static COMFUSE_DEVICE void start(Storage&, uint32_t round, RowGroupSlot const& x, Params const& p, int t, int,
                                   float const (&v)[MBlocks][2]) {
    if (t % 4 != 0) return;
    uint64_t* mine = words(x, p, round, x.rank);
    uint64_t const hi = uint64_t(tag(p, round)) << 32;
    CUTE_UNROLL
    for (int mi = 0; mi < MBlocks; ++mi)
      CUTE_UNROLL
      for (int h = 0; h < 2; ++h) st_relaxed_gpu_u64(mine + row_of(t, mi, h), hi | __float_as_uint(v[mi][h]));
  }

  // The four lanes of a quad hold the same rows: lane q polls peers q, q + 4, ... (Peers / 4
  // words a row, fewer loads and registers), folds them in rank order, and a quad butterfly
  // finishes; every CTA runs the identical sequence, so all compute the same bits.
  static constexpr int kPerLane = (Peers + 3) / 4;

  template <class Op>
  static COMFUSE_DEVICE void finish(Storage&, uint32_t round, RowGroupSlot const& x, Params const& p, int t, int,
                                    float (&v)[MBlocks][2]) {
    uint32_t const want = tag(p, round);
    uint64_t const* base = words(x, p, round, 0);
    int const q = t % 4;
    uint64_t t0 = 0;
    CUTE_UNROLL
    for (int mi = 0; mi < MBlocks; ++mi)
      CUTE_UNROLL
      for (int h = 0; h < 2; ++h) {
        int const row = row_of(t, mi, h);
        uint64_t w[kPerLane];
        CUTE_UNROLL
        for (int i = 0; i < kPerLane; ++i) {
          int const j = q + 4 * i;
          w[i] = j < Peers && j != x.rank ? ld_relaxed_gpu_u64(base + j * Rows + row) : uint64_t(want) << 32;
        }
        for (;;) {  // re-poll the peers whose word is not this round's yet
          bool done = true;
          CUTE_UNROLL
          for (int i = 0; i < kPerLane; ++i)
            if (uint32_t(w[i] >> 32) != want) {
              done = false;
              w[i] = ld_relaxed_gpu_u64(base + (q + 4 * i) * Rows + row);
            }
          if (done) break;
          uint64_t const now = global_timer_ns();
          if (t0 == 0) t0 = now;
          else if (now - t0 > kTimeoutNs) __trap();  // a peer CTA is not resident: fail, do not hang
        }
        float acc = Op::identity();
        CUTE_UNROLL
        for (int i = 0; i < kPerLane; ++i) {
          int const j = q + 4 * i;
          if (j < Peers) acc = Op::combine(acc, j == x.rank ? v[mi][h] : __uint_as_float(uint32_t(w[i])));
        }
        acc = Op::combine(acc, __shfl_xor_sync(0xffffffffu, acc, 1));
        acc = Op::combine(acc, __shfl_xor_sync(0xffffffffu, acc, 2));
        v[mi][h] = acc;
      }
  }
};

}  // namespace comfuse::cluster
