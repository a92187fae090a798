// comfuse/scheduler/split_k.cuh: split-K's hand-over of partial tiles (KernelConfig::k_splits).
//
// Why: at decode sizes (M of 1..16 rows, a few thousand columns) a problem has tens of tiles,
// so tens of SMs stream all of B while the rest idle: the GEMM is bound by what one SM can
// pull from DRAM, not by the GPU's bandwidth. With S K-splits, S CTAs run the mainloop of each
// tile over a share of K each (scheduler/tile_scheduler.cuh), and S times as many SMs stream B.
//
// The tile's owner (split 0) keeps its partial sums in registers; each other split s writes its
// fp32 partial tile into the exchange workspace (grid.cuh's exchange_layout: one buffer per
// owner warp group and split), and the owner adds them in split order 1, 2, ..., S-1 (the same
// bits on every run: no atomics), then runs the epilogue, row exchanges included, as without
// splits. Only rows < M travel: at decode the partials are M x tile_n (a gated tile's twice
// that), a few KiB.
//
// Hand-over: 4-byte tags, the launch's epoch (ExchangeHeader, cluster/global_exchange.cuh) in
// the high 16 bits and the warp group's job number in the low 16, never 0:
//   flags[s]  (s >= 1): split s wrote its partial of job q      (written by split s)
//   flags[0]:           the owner has read every partial of job q (written by the owner)
// A split writes job q's partial only after flags[0] says job q - 1 was read (one buffer per
// split: the owner consumes each job right after its own mainloop, so the wait is short); the
// owner reads job q's after flags[s] says it was written. The owner's threads 1..S-1 poll one
// split's tag each (acquire loads, in flight together), a writer's thread 0 its owner's; the warp
// group's named barrier passes the order on to its other threads, and thread 0 publishes after
// a barrier with a release store, CUTLASS's stream-K barrier pattern (bar.sync, then one
// thread's release at GPU scope). The owner's last job frees nothing (no split writes again).
// Rows summed in SMEM (decode rows, or whole tiles) whose twice as many bytes take no more rounds
// of loads (KernelConfig::split_words_tagged) skip flags[s]: each value travels as one 8-byte word with
// the tag in its high half (cluster::tagged_word, the row exchange's format: NCCL's LL protocol),
// so the writer only stores and the owner polls the words themselves. The release's wait for the
// writer's stores to reach L2 and the owner's round trip on a flag before its loads are gone
// (0.1-0.5 us a decode launch, bench/NOTES.md Stop 38); the rows' bytes double (a few KiB at
// decode rows, 32-64 KiB a split at a whole 64x64 tile, where 12 or more splits tag their words).
// Tags of an earlier launch carry another epoch; where the epoch bits wrap, the last warp group
// of a launch zeroes the tags and the tagged words (retire_exchange; ExchangeHeader::slot_bytes
// covers them).
//
// Liveness: every split of a tile is resident (the grid holds whole split groups,
// grid.cuh), and a split waits only on its owner's previous job, which needs only partials
// that were already written: no cycle. A wait past cluster::kWaitTimeoutNs traps, as the row exchange does.
#pragma once
#include "../common.cuh"
#include "../params.cuh"
#include "grid.cuh"
#include "../cluster/global_exchange.cuh"

namespace comfuse::splitk {

COMFUSE_DEVICE uint32_t ld_acquire_gpu_u32(uint32_t const* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
COMFUSE_DEVICE void st_release_gpu_u32(uint32_t* p, uint32_t v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
// Two tagged words, each single-copy atomic (relaxed, GPU scope: the peer polls them).
COMFUSE_DEVICE ulonglong2 ld_relaxed_gpu_words(ulonglong2 const* p) {
  ulonglong2 v;
  asm volatile("ld.relaxed.gpu.global.v2.b64 {%0, %1}, [%2];\n" : "=l"(v.x), "=l"(v.y) : "l"(p) : "memory");
  return v;
}
COMFUSE_DEVICE void st_relaxed_gpu_words(ulonglong2* p, ulonglong2 v) {
  asm volatile("st.relaxed.gpu.global.v2.b64 [%0], {%1, %2};\n" ::"l"(p), "l"(v.x), "l"(v.y) : "memory");
}

template <KernelConfig C>
struct SplitK {
  // BN: the accumulator's columns (a gated tile's two products side by side, KernelConfig::mma_n):
  // the splits' partials are summed whole, before the epilogue combines the halves.
  static constexpr int Rows = C.epi_rows(), BN = C.mma_n(), Splits = C.k_splits;
  static constexpr int MBlocks = Rows / 64;
  static_assert(C.wgs_per_tile == 1, "split-K: one warp group per tile (config.cuh check())");

  static constexpr int GatherRows = C.split_gather_rows;  // > 0: the owner sums the partials in SMEM
  static constexpr bool Tagged = C.split_words_tagged();    // GatherRows rows of tagged words a split
  static constexpr int PartialRows = Tagged ? GatherRows : Rows;
  uint32_t* flags;  // Splits tags of this owner warp group's slot
  char* partials;   // Splits - 1 partial tiles, PartialRows x BN row-major each: fp32, or tagged words

  COMFUSE_DEVICE SplitK(Params const& p, int slot) {
    ExchangeLayout const l = exchange_layout(C, p.workspace_clusters);
    char* ws = static_cast<char*>(p.exchange);
    flags = reinterpret_cast<uint32_t*>(ws + l.split_flags) + size_t(slot) * Splits;
    partials = ws + l.split_partials + size_t(slot) * (Splits - 1) * C.split_partial_bytes();
  }

  static COMFUSE_DEVICE uint32_t tag(uint32_t epoch, int job) { return cluster::launch_tag(epoch, uint32_t(job)); }

  static COMFUSE_DEVICE void wait_tag(uint32_t const* f, uint32_t want) {
    uint64_t t0 = 0;
    while (ld_acquire_gpu_u32(f) != want) cluster::trap_on_timeout(t0);
  }

  // Visits the thread's accumulator pairs in rows < rows_left of a Rows x BN tile at `tile`:
  // f(register index, the pair's address). Register r of m64-block mi holds row
  // accum_row(t, mi, h), column 8 nb + 2 (lane % 4) + e (mainloop/wgmma.cuh's LayoutC:
  // r = mi BN/2 + 4 nb + 2 h + e). The row's address is made opaque to the compiler so that the
  // pairs' addresses stay one register plus immediate offsets: hoisted out of the job loop, the
  // BN / 8 addresses of every row would take registers the epilogue needs (spills).
  // T: float (a pair is a float2) or a tagged word (a pair is a ulonglong2).
  template <class T, class F>
  static COMFUSE_DEVICE void for_each_pair(T* tile, int t, int rows_left, F&& f) {
    using Pair = cute::conditional_t<sizeof(T) == 4, float2, ulonglong2>;
    CUTE_UNROLL
    for (int mi = 0; mi < MBlocks; ++mi)
      CUTE_UNROLL
      for (int h = 0; h < 2; ++h) {
        int const row = accum_row(t, mi, h);
        if (row >= rows_left) continue;
        T* rp = tile + row * BN + 2 * (t % 4);
        asm volatile("" : "+l"(rp));
        CUTE_UNROLL
        for (int nb = 0; nb < BN / 8; ++nb) f(mi * (BN / 2) + nb * 4 + h * 2, reinterpret_cast<Pair*>(rp + nb * 8));
      }
  }

  // Split `split` (>= 1): job `job`'s partial tile (rows m0.. of M) to the owner.
  template <class Frag>
  COMFUSE_DEVICE void publish(Frag const& accum, int split, int job, uint32_t epoch, int m0, int M, int t,
                              int bar_id) const {
    if (job > 0) {
      if (t == 0) wait_tag(flags, tag(epoch, job - 1));
      named_sync(bar_id, kWarpGroupThreads);
    }
    if constexpr (Tagged) {
      uint32_t const want = tag(epoch, job);
      for_each_pair(reinterpret_cast<unsigned long long*>(partials) + size_t(split - 1) * PartialRows * BN, t,
                    M - m0 < GatherRows ? M - m0 : GatherRows, [&](int r, ulonglong2* a) {
                      st_relaxed_gpu_words(a, make_ulonglong2(cluster::tagged_word(want, accum(r)), cluster::tagged_word(want, accum(r + 1))));
                    });
    } else {
      for_each_pair(reinterpret_cast<float*>(partials) + size_t(split - 1) * Rows * BN, t, M - m0,
                    [&](int r, float2* a) { __stcg(a, make_float2(accum(r), accum(r + 1))); });
      named_sync(bar_id, kWarpGroupThreads);
      if (t == 0) st_release_gpu_u32(flags + split, tag(epoch, job));
    }
  }

  // The owner: adds every other split's partial of job `job`, in a fixed order (the same bits
  // on every run), then frees the partials for the splits' next job, where there is one
  // (more_jobs). `stage`: the warp group's split_gather_bytes() of SMEM where split_gather_rows
  // > 0, else unused.
  template <class Frag>
  COMFUSE_DEVICE void gather(Frag& accum, int job, uint32_t epoch, int m0, int M, int t, int bar_id, float* stage,
                             bool more_jobs) const {
    if constexpr (Tagged) {
      add_staged(accum, stage, M - m0, t, bar_id, tag(epoch, job));
    } else {
      if (t >= 1 && t < Splits) wait_tag(flags + t, tag(epoch, job));
      named_sync(bar_id, kWarpGroupThreads);
      if constexpr (GatherRows > 0) add_staged(accum, stage, M - m0, t, bar_id, 0);
      else add_own(accum, M - m0, t);
    }
    if (more_jobs) {
      named_sync(bar_id, kWarpGroupThreads);  // every thread's reads are done before the release
      if (t == 0) st_release_gpu_u32(flags, tag(epoch, job));
    }
  }

 private:
  // Each thread loads its own accumulators' values of every split: every split's value of a pair
  // before the pair's first add, so the splits' loads are in flight together; the adds keep split
  // order. A warp holds one row slot's loads of every split in its registers, so a warp with rows
  // in both of its slots (9..16 rows of 64) waits two L2 round trips.
  template <class Frag>
  COMFUSE_DEVICE void add_own(Frag& accum, int rows_left, int t) const {
    constexpr int kSplitStride = Rows * BN / 2;  // float2s from a pair in split s to split s + 1
    for_each_pair(reinterpret_cast<float*>(partials), t, rows_left, [&](int r, float2* a) {
      float2 v[Splits - 1];
      CUTE_UNROLL
      for (int s = 0; s < Splits - 1; ++s) v[s] = __ldcg(a + s * kSplitStride);
      CUTE_UNROLL
      for (int s = 0; s < Splits - 1; ++s) {
        accum(r) += v[s].x;
        accum(r + 1) += v[s].y;
      }
    });
  }

  // Rows summed in SMEM (at most GatherRows: decode rows, or the whole tile): the warp group's 128
  // threads load the partial rows together, consecutive threads along a row (runs of four values:
  // one 16-byte load of fp32, or two of tagged words, which a chunk reloads, whole, its loads in
  // flight together, until every word carries this job's tag `want`); each thread sums its values
  // over the splits in split order and stages the sum in SMEM; then each thread adds its
  // accumulators' sums: acc + (p1 + ... + p_{S-1}). Rounds of L2 round trips spread over the warp
  // group (KernelConfig::split_gather_rounds: one at decode rows), where add_own leaves all the
  // loads of a row slot to the warp that holds it. The staged rows are swizzled (a row's 16-byte
  // chunks XOR 2 (row % 4)) so that a warp's accumulator reads, 8 rows x 32 bytes, take two
  // wavefronts.
  static constexpr int kRowVecs = BN / 4;  // runs of four values a row
  static COMFUSE_DEVICE int staged_vec(int row, int vec) { return row * kRowVecs + (vec ^ ((row & 3) << 1)); }

  template <class Frag>
  COMFUSE_DEVICE void add_staged(Frag& accum, float* stage, int rows_left, int t, int bar_id, uint32_t want) const {
    static_assert(GatherRows <= Rows && kRowVecs >= 8, "split_gather_rows: at most a warp group's rows, tile_n >= 32");
    static_assert(Splits >= 2, "split-K: at least two splits");
    constexpr int kPerThread = C.split_gather_vecs_per_thread();
    constexpr int kChunk = C.split_gather_chunk();   // a thread's runs of every split in flight at once
    constexpr int kLoads = Tagged ? 2 : 1;           // 16-byte loads a run
    constexpr int kSplitStride = kLoads * PartialRows * kRowVecs;  // loads from split s to split s + 1
    using Load = cute::conditional_t<Tagged, ulonglong2, float4>;
    Load const* src = reinterpret_cast<Load const*>(partials);
    float4* dst = reinterpret_cast<float4*>(stage);
    int const live = (rows_left < GatherRows ? rows_left : GatherRows) * kRowVecs;
    CUTE_UNROLL
    for (int j0 = 0; j0 < kPerThread; j0 += kChunk) {
      Load v[kChunk][Splits - 1][kLoads];
      // Every load of the chunk's live runs: f(its value, its address).
      auto const each_load = [&](auto&& f) {
        CUTE_UNROLL
        for (int j = 0; j < kChunk; ++j) {
          int const i = t + (j0 + j) * kWarpGroupThreads;
          if (j0 + j < kPerThread && i < live)
            CUTE_UNROLL
            for (int s = 0; s < Splits - 1; ++s)
              CUTE_UNROLL
              for (int q = 0; q < kLoads; ++q) f(v[j][s][q], src + s * kSplitStride + kLoads * i + q);
        }
      };
      auto const load = [&] {
        each_load([](Load& x, Load const* a) {
          if constexpr (Tagged) x = ld_relaxed_gpu_words(a);
          else x = __ldcg(a);
        });
      };
      load();
      if constexpr (Tagged) {
        auto const all_in = [&] {
          bool in = true;
          each_load([&](Load const& x, Load const*) { in = in && cluster::word_tagged(x.x, want) && cluster::word_tagged(x.y, want); });
          return in;
        };
        uint64_t t0 = 0;
        while (!all_in()) {
          cluster::trap_on_timeout(t0);
          load();
        }
      }
      CUTE_UNROLL
      for (int j = 0; j < kChunk; ++j) {
        int const i = t + (j0 + j) * kWarpGroupThreads;
        if (j0 + j < kPerThread && i < live) {
          float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
          CUTE_UNROLL
          for (int s = 0; s < Splits - 1; ++s) {
            float4 p;
            if constexpr (Tagged)
              p = make_float4(cluster::word_value(v[j][s][0].x), cluster::word_value(v[j][s][0].y),
                              cluster::word_value(v[j][s][1].x), cluster::word_value(v[j][s][1].y));
            else p = v[j][s][0];
            sum = s == 0 ? p : make_float4(sum.x + p.x, sum.y + p.y, sum.z + p.z, sum.w + p.w);
          }
          dst[staged_vec(i / kRowVecs, i % kRowVecs)] = sum;
        }
      }
    }
    named_sync(bar_id, kWarpGroupThreads);
    // Register r of m64-block mi holds row accum_row(t, mi, h), column 8 nb + 2 (lane % 4) + e
    // (for_each_pair above): the pair's float2 is half of the row's 16-byte chunk 2 nb + (lane % 4) / 2.
    float2 const* staged = reinterpret_cast<float2 const*>(stage);
    CUTE_UNROLL
    for (int mi = 0; mi < (GatherRows + 63) / 64; ++mi)
      CUTE_UNROLL
      for (int h = 0; h < 2; ++h) {
        int const row = accum_row(t, mi, h);
        if (row >= rows_left || row >= GatherRows) continue;
        CUTE_UNROLL
        for (int nb = 0; nb < BN / 8; ++nb) {
          float2 const v = staged[2 * staged_vec(row, 2 * nb + (t % 4) / 2) + (t % 2)];
          int const r = mi * (BN / 2) + nb * 4 + h * 2;
          accum(r) += v.x;
          accum(r + 1) += v.y;
        }
      }
  }
};

}  // namespace comfuse::splitk
