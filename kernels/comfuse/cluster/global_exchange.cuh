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
// Workspace (Params::exchange, zeroed once at allocation; scheduler/grid.cuh sizes it): the
// ExchangeHeader (config.cuh: the launch counter), then one slot per (row group, rank along M in
// the cluster, consumer warp group):
//   uint64 word[2][Peers][2][Rows]  double-buffered by round parity, like the DSMEM channel;
//                                   [0]: the round's values, [1]: second statistics (pair rounds)
// Each word carries its own flag (NCCL's "LL" protocol): high 32 bits a tag, low 32 bits the
// fp32 partial, written and read as ONE 8-byte relaxed gpu-scope access (single-copy atomic),
// so a reader that sees the round's tag sees that round's value: no fence, no separate flag,
// no barrier, and every thread polls only the words it needs, all in flight at once. (Pair
// rounds at decode rows hand rows between a warp group's warps in SMEM: PairHandOver below.)
//   tag = (epoch mod 65535 + 1) << 16 | (round mod 2^16), never 0 (zeroed memory).
// A word is rewritten every second round of its writer, so the stale value a reader can find
// is that writer's round r - 2 (tag differs) or, on a word's first use in a launch, a value of
// an earlier launch (epoch bits differ for 65535 launches; then the slots are zeroed again).
// A row slot past M (live() below) writes and reads nothing; a slot's jobs go down the rows
// (scheduler/tile_scheduler.cuh: one column of tiles a slot for row reductions), so only its
// last job has rows past M, and no later round of the slot needs the ones it skipped.
//
// The launch counter lives in the workspace, not in Params: a CUDA graph replays a launch
// with the same Params, and a counter fixed at capture would let a replay read the words of
// the launch before it. Every consumer warp group reads the counter before its first round
// (exchange_epoch) and counts itself out after its last (retire_exchange); the last one of the
// launch advances the counter (and zeroes the slots where the tag's epoch bits wrap). Every
// warp group read the counter before any could be last, and the next launch on the stream
// starts after this one ends, so a launch sees one value throughout. Launches of one kernel
// on several streams at once would share the counter and the slots: a FusedKernel runs on one
// stream at a time (include/comfuse/runtime.h).
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
// is not guaranteed: a wait that exceeds kWaitTimeoutNs traps (the launch fails with an error)
// instead of hanging.
#pragma once
#include "../common.cuh"
#include "../params.cuh"
#include "../debug/trace.cuh"

namespace comfuse::cluster {

COMFUSE_DEVICE uint64_t ld_relaxed_gpu_u64(uint64_t const* p) {
  uint64_t v;
  asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];\n" : "=l"(v) : "l"(p) : "memory");
  return v;
}
COMFUSE_DEVICE void st_relaxed_gpu_u64(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;\n" ::"l"(p), "l"(v) : "memory");
}

// Launches whose tags differ (the epoch bits of a tag take 65535 values, never 0).
inline constexpr uint32_t kTagEpochs = 65535;
// A word's tag: the launch's epoch in the high 16 bits, a per-launch counter (a round, a job) in
// the low 16; never 0 (zeroed memory). Shared with split-K's hand-over (scheduler/split_k.cuh).
COMFUSE_DEVICE uint32_t launch_tag(uint32_t epoch, uint32_t counter) {
  return ((epoch % kTagEpochs + 1) << 16) | (counter & 0xffffu);
}
// A tagged word: a value in the low 32 bits, its tag in the high 32, so that one aligned 8-byte
// access (single-copy atomic) carries both or neither (NCCL's LL protocol): a reader polls the
// word itself, no flag. The row exchange's words and split-K's decode hand-over (split_k.cuh).
COMFUSE_DEVICE uint64_t tagged_word(uint32_t tag, float v) { return (uint64_t(tag) << 32) | __float_as_uint(v); }
COMFUSE_DEVICE bool word_tagged(uint64_t w, uint32_t tag) { return uint32_t(w >> 32) == tag; }
COMFUSE_DEVICE float word_value(uint64_t w) { return __uint_as_float(uint32_t(w)); }

// A wait on another CTA longer than this means it is not resident: trap, do not hang.
inline constexpr uint64_t kWaitTimeoutNs = 10ull * 1000 * 1000 * 1000;
// Called after each poll that found the wait not over (t0: 0 before the first): traps once the
// wait has lasted kWaitTimeoutNs.
COMFUSE_DEVICE void trap_on_timeout(uint64_t& t0) {
  uint64_t const now = global_timer_ns();
  if (t0 == 0) t0 = now;
  else if (now - t0 > kWaitTimeoutNs) __trap();  // the peer CTA is not resident: fail, do not hang
}

COMFUSE_DEVICE ExchangeHeader* exchange_header(Params const& p) { return static_cast<ExchangeHeader*>(p.exchange); }

// This launch's epoch (read by every thread of a consumer warp group before its first round).
// Acquire where the warp group retires early (start_retire's count is relaxed): nothing after the
// read is performed before it, so no warp group is counted out while another has yet to read it
// (retire_exchange's acquire-release count orders it otherwise).
template <bool Acquire = false>
COMFUSE_DEVICE uint32_t exchange_epoch(Params const& p) {
  uint32_t v;
  if constexpr (Acquire)
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(&exchange_header(p)->epoch) : "memory");
  else
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(&exchange_header(p)->epoch) : "memory");
  return v;
}

// A consumer warp group is done with the channel (all of its threads call this after their last
// round; bar_id: a named barrier of the warp group's 128 threads). `participants`: the warp
// groups of the launch that call it. The last one advances the counter; where the tags' epoch
// bits wrap, its first warp first zeroes every slot (ExchangeHeader::slot_bytes), so no word of
// 65535 launches ago can carry the next launch's tag.
COMFUSE_DEVICE void retire_exchange(Params const& p, uint32_t epoch, int t, int bar_id, uint32_t participants) {
  named_sync(bar_id, kWarpGroupThreads);  // the warp group's last reads are done
  if (t >= 32) return;
  ExchangeHeader* h = exchange_header(p);
  uint32_t last = 0;
  if (t == 0) {
    uint32_t before;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;\n" : "=r"(before) : "l"(&h->retired) : "memory");
    last = before == participants - 1;
  }
  if (!__shfl_sync(0xffffffffu, last, 0)) return;
  uint32_t const next = epoch + 1;
  if (next % kTagEpochs == 0) {
    uint4* s = reinterpret_cast<uint4*>(reinterpret_cast<char*>(p.exchange) + kExchangeHeaderBytes);
    for (size_t i = t; i < h->slot_bytes / sizeof(uint4); i += 32) s[i] = make_uint4(0, 0, 0, 0);
    __syncwarp();
  }
  if (t == 0) {
    h->retired = 0;
    asm volatile("st.relaxed.gpu.global.u32 [%0], %1;\n" ::"l"(&h->epoch), "r"(next) : "memory");
  }
}

// retire_exchange in two halves, the first issued early: where a warp group's last round is
// behind it (its last job's last round), thread 0 counts it out right then with a relaxed RMW
// whose result it reads only at exit (finish_retire), so the round trip runs under the job's
// last stage instead of after it (MEASURED: 0.86 us from a norm kernel's last epilogue to its
// exit against 0.13 without an exchange, bench/NOTES.md Stop 31). The counter only says which
// warp group advances the epoch, which the next launch reads after this one ends: no order is
// owed to this launch's rounds, except where the tags' epoch bits wrap (every 65535th launch),
// whose slots the last warp group zeroes after every other's last reads: there retires_early is
// false and every warp group retires at exit (retire_exchange's acquire-release count).
COMFUSE_DEVICE bool retires_early(uint32_t epoch) { return (epoch + 1) % kTagEpochs != 0; }
// The warp groups a single-GEMM launch counts out: every consumer warp group of its grid.
COMFUSE_DEVICE uint32_t retire_participants(int consumer_wgs) { return gridDim.x * gridDim.y * consumer_wgs; }
// The count is an atom.inc wrapping at `participants` (the last one's increment leaves 0 for the
// next launch): unlike an add, ptxas cannot aggregate it across the warp, which would read its
// result (a shuffle) right away and stall the warp for the round trip.
COMFUSE_DEVICE uint32_t start_retire(Params const& p, int t, uint32_t participants) {
  uint32_t before = 0;
  if (t == 0)
    asm volatile("atom.relaxed.gpu.global.inc.u32 %0, [%1], %2;\n"
                 : "=r"(before) : "l"(&exchange_header(p)->retired), "r"(participants - 1) : "memory");
  return before;
}
// At exit, after start_retire (`before`: its result, thread 0's): the last warp group of the
// launch advances the epoch (its count already reset the counter).
COMFUSE_DEVICE void finish_retire(Params const& p, uint32_t epoch, int t, uint32_t before, uint32_t participants) {
  if (t != 0 || before != participants - 1) return;
  asm volatile("st.relaxed.gpu.global.u32 [%0], %1;\n" ::"l"(&exchange_header(p)->epoch), "r"(epoch + 1) : "memory");
}

// HandsOverPairs: KernelConfig::pair_hand_over (a pair round, and jobs of 9 to 32 rows may run).
// PollBackoff: KernelConfig::poll_backoff (kPollBackoffNs below).
template <int Rows, int Peers, bool HandsOverPairs = false, bool PollBackoff = false>
struct GlobalRowAllReduce {
  static constexpr int MBlocks = Rows / 64;
  static_assert(Rows == 64 || Rows == 128, "a warp group holds 64 or 128 rows");
  static_assert(Peers >= 2 && Peers <= 64, "global row group: 2..64 CTAs");
  // One warp group's slot: parity x peers x (value rows, second-moment rows) words.
  static constexpr int kSlotBytes = 2 * Peers * 2 * Rows * 8;

  // The four lanes of a quad hold the same rows: lane q polls peers q, q + 4, ... (Peers / 4
  // words a row, fewer loads and registers), folds them in rank order, and a quad butterfly
  // finishes; every CTA runs the identical sequence, so all compute the same bits.
  static constexpr int kPerLane = (Peers + 3) / 4;

  // A lane's words of one poll, all in flight at once: rows polled together up to this many
  // (16 words = 32 registers). Polled one row at a time, a round ended one L2 round trip per row
  // after its last peer published (`comfuse run --trace`, 256x4096x4096, two rows a thread:
  // 1.6 us from the last publish to every value seen; together 1.0-1.3). Pair rounds at 32
  // peers (32 words) stay per row: together they measured no faster (LayerNorm 256x4096x4096
  // in one round, 23.5 us either way) and an earlier epilogue spilled with them.
  static constexpr int kMaxPolledWords = 16;
  template <int W>
  static constexpr bool kRowsTogether = MBlocks * 2 * W * kPerLane <= kMaxPolledWords;

  // Pair rounds whose two row slots a thread holds do not fit one poll (kRowsTogether<2>: a 64-row
  // warp group at more than 16 peers) poll the slots one after the other, two L2 round trips.
  // Where warps 2 and 3 hold no row (helped: a job of 9 to 32 rows, config.cuh
  // pair_hand_over_rows), warp w + 2 polls warp w's second slot instead (help_pair) and hands the
  // row's two statistics over in SMEM: one round trip and a barrier of the warp group
  // (bench/NOTES.md Stop 48: 0.1-1.6 us a launch at 12-32 rows). HandsOverPairs: the kernel has a
  // pair round and may run such jobs (KernelConfig::pair_hand_over).
  // The buffer of a pair round is its count among the warp group's pair rounds mod 2 (pair_round):
  // buffer b is rewritten two pair rounds later by a helper that has passed the barrier of the
  // pair round between, which each reader reaches after reading it. That round is a helped one
  // too: a job of 32 rows or fewer is the problem's last row block, a slot's last job (a slot's
  // jobs go down the rows), and every pair round of a job is helped or none is.
  static_assert((MBlocks == 1 && !kRowsTogether<2>) == (l2_exchange_smem_bytes(Rows, Peers) > 0),
                "config.cuh's l2_exchange_smem_bytes: the warp groups whose pair rounds do not fit one poll");
  static_assert(!HandsOverPairs || l2_exchange_smem_bytes(Rows, Peers) > 0,
                "KernelConfig::pair_hand_over only where the warp groups hand pair rounds over");
  static constexpr bool kHelpedPairs = HandsOverPairs;
  struct PairHandOver {  // [pair round parity][warp 0, 1][row of its second slot][statistic, second statistic]
    float row[2][2][8][2];
  };
  struct NoPairHandOver {};
  using Storage = cute::conditional_t<kHelpedPairs, PairHandOver, NoPairHandOver>;
  static constexpr bool kOnChip = kHelpedPairs;
  static_assert(!kHelpedPairs || sizeof(Storage) == l2_exchange_smem_bytes(Rows, Peers), "config.cuh's hand-over size");
  static COMFUSE_DEVICE void init(Storage&) {}
  static COMFUSE_DEVICE bool helped(RowGroupSlot const& x) { return kHelpedPairs && pair_hand_over_rows(x.rows); }

  static COMFUSE_DEVICE uint32_t tag(RowGroupSlot const& x, uint32_t round) {
    return launch_tag(x.epoch, round);
  }
  static COMFUSE_DEVICE uint64_t* words(RowGroupSlot const& x, Params const& p, uint32_t round, int rank) {
    return reinterpret_cast<uint64_t*>(static_cast<char*>(p.exchange) + kExchangeHeaderBytes +
                                       size_t(x.slot) * kSlotBytes) +
           ((round & 1) * Peers + rank) * 2 * Rows;
  }

  static COMFUSE_DEVICE void start(Storage&, uint32_t round, RowGroupSlot const& x, Params const& p, int t, int,
                                   float const (&v)[MBlocks][2]) {
    publish(round, x, p, t, 0, v);
  }
  // A round of (statistic, second statistic) pairs (Reduction kPair*, epilogue/reduce.cuh).
  static COMFUSE_DEVICE void start_pair(Storage&, uint32_t round, RowGroupSlot const& x, Params const& p, int t,
                                        float const (&v)[MBlocks][2], float const (&second)[MBlocks][2]) {
    publish(round, x, p, t, 0, v);
    publish(round, x, p, t, Rows, second);
  }

  // Whether a warp's (mi, h) row slot holds a row below M (x.rows: the tile's rows that exist,
  // M - m0): a slot past M is neither published nor polled. A decode job's 64-row tile holds
  // M <= 16 rows; its other warps' polls only loaded L2, and at M <= 8 warp 0's second slot cost
  // a paired round a second poll (bench/NOTES.md Stop 47). A whole slot at a time (its first row
  // decides), so every lane of a warp takes part in the shuffles. 64-row warp groups only: decode
  // plans take them, and the check's registers made NVRTC spill in a 128-row one (LayerNorm
  // 8192 x 4096 x 4096), where only a problem's last row block has rows past M.
  static COMFUSE_DEVICE bool live(RowGroupSlot const& x, int t, int mi, int h) {
    if constexpr (MBlocks > 1) return true;
    else return accum_row(t & ~31, mi, h) < x.rows;
  }

  // Quad leaders write their rows' words of this round at rows off + row of their own slot part.
  static COMFUSE_DEVICE void publish(uint32_t round, RowGroupSlot const& x, Params const& p, int t, int off,
                                     float const (&v)[MBlocks][2]) {
    if (t % 4 != 0) return;
    uint64_t* mine = words(x, p, round, x.rank);
    CUTE_UNROLL
    for (int mi = 0; mi < MBlocks; ++mi)
      CUTE_UNROLL
      for (int h = 0; h < 2; ++h)
        if (live(x, t, mi, h)) st_relaxed_gpu_u64(mine + off + accum_row(t, mi, h), tagged_word(tag(x, round), v[mi][h]));
  }

  // For each of the thread's live rows (mi, h): lane q's words at rows k * Rows + row (k < W) of
  // its peers, once all carry this round's tag, go to f(mi, h, w). All of the thread's rows in
  // one poll where their words fit kMaxPolledWords, else one row at a time. skip_second: the
  // second row slots (h = 1) are another warp's (helped pair rounds).
  template <int W, class F>
  static COMFUSE_DEVICE void for_each_row(uint32_t round, RowGroupSlot const& x, Params const& p, int t, F&& f,
                                          bool skip_second = false) {
    constexpr int kRows = MBlocks * 2;                     // (mi, h) rows a thread holds
    constexpr int kPerPoll = kRowsTogether<W> ? kRows : 1;  // of them in one poll
    uint32_t const want = tag(x, round);
    uint64_t const* base = words(x, p, round, 0);
    uint64_t t0 = 0;
    CUTE_UNROLL
    for (int r0 = 0; r0 < kRows; r0 += kPerPoll) {
      int off[kPerPoll][W];
      bool on[kPerPoll];
      bool any = false;
      CUTE_UNROLL
      for (int r = 0; r < kPerPoll; ++r) {
        on[r] = live(x, t, (r0 + r) / 2, (r0 + r) % 2) && !(skip_second && (r0 + r) % 2 == 1);
        any |= on[r];
        CUTE_UNROLL
        for (int k = 0; k < W; ++k) off[r][k] = k * Rows + accum_row(t, (r0 + r) / 2, (r0 + r) % 2);
      }
      if (!any) continue;  // warp-uniform: every row of the poll past M
      uint64_t w[kPerPoll][W][kPerLane];
      poll(base, off, on, want, t % 4, x.rank, t0, w);
      CUTE_UNROLL
      for (int r = 0; r < kPerPoll; ++r)
        if (on[r]) f((r0 + r) / 2, (r0 + r) % 2, w[r]);
    }
  }

  // Between polls a thread sleeps about this long (__nanosleep takes it as a hint). Every thread
  // of the row group's other CTAs re-polls the last peer's words, which sit on a few L2 lines:
  // polled back to back they likely flood those lines' slice, so that the last peer's stores and
  // the polls that would see them wait behind the flood (`comfuse run --trace`, 256 x 4096 x 4096
  // LayerNorm: even the last peer, its peers' words all in, took 2.4-2.7 us to see them;
  // RMSNorm, half the words, 1.0). Measured (H100, bench/NOTES.md "the poll's backoff"): 100 ns
  // took the round's end after the last publish 3.3 -> 2.0 us, LayerNorm 24.5-24.7 -> 24.0 us,
  // softmax 23.2 -> 22.5-22.7; RMSNorm and LayerNorm at 8 rows moved within the spread (0.2 us);
  // 40 ns measured the same, 400 ns less. The planner asks for it (PollBackoff) only where every
  // CTA is in its round at once and a row's peers are many (calibration.h poll_backoff_wanted):
  // with fewer peers a row's words are few and the flood small, and where CTAs walk several jobs
  // their rounds do not all fall at once (PingPong: beside the other warp group's mainloop), so the
  // pause only delays the round's end (residual LayerNorm 8192 x 1024 x 1024 in row groups of 4:
  // 47.7 us with it against 47.2-47.3 without, H200; LayerNorm 8192 x 4096 x 4096, cooperative,
  // 16 peers: 1.130-1.131x cuBLAS with it against 1.099-1.103x without, H100, two alternated pairs).
  static constexpr unsigned kPollBackoffNs = PollBackoff ? 100 : 0;

  // Lane q's words at rows off[r][0..W) from peers q, q + 4, ...: all loads issued at once,
  // then, after kPollBackoffNs (if any), only the ones not yet tagged with this round are loaded again.
  // Its own words, and the rows not `on`, are not read (set to `want`).
  template <int R, int W>
  static COMFUSE_DEVICE void poll(uint64_t const* base, int const (&off)[R][W], bool const (&on)[R], uint32_t want,
                                  int q, int rank, uint64_t& t0, uint64_t (&w)[R][W][kPerLane]) {
    uint64_t const traced = trace::now();
    CUTE_UNROLL
    for (int r = 0; r < R; ++r)
      CUTE_UNROLL
      for (int k = 0; k < W; ++k)
        CUTE_UNROLL
        for (int i = 0; i < kPerLane; ++i) {
          int const j = q + 4 * i;
          w[r][k][i] = on[r] && j < Peers && j != rank ? ld_relaxed_gpu_u64(base + j * 2 * Rows + off[r][k])
                                                       : uint64_t(want) << 32;
        }
    for (;;) {
      bool done = true;
      CUTE_UNROLL
      for (int r = 0; r < R; ++r)
        CUTE_UNROLL
        for (int k = 0; k < W; ++k)
          CUTE_UNROLL
          for (int i = 0; i < kPerLane; ++i) done &= word_tagged(w[r][k][i], want);
      if (done) {
        trace::add_poll(traced);
        return;
      }
      if constexpr (kPollBackoffNs > 0) __nanosleep(kPollBackoffNs);
      CUTE_UNROLL
      for (int r = 0; r < R; ++r)
        CUTE_UNROLL
        for (int k = 0; k < W; ++k)
          CUTE_UNROLL
          for (int i = 0; i < kPerLane; ++i)
            if (!word_tagged(w[r][k][i], want))
              w[r][k][i] = ld_relaxed_gpu_u64(base + (q + 4 * i) * 2 * Rows + off[r][k]);
      trap_on_timeout(t0);
    }
  }

  struct Plus {
    static COMFUSE_DEVICE float combine(float a, float b) { return a + b; }
  };

  // Lane q folds its peers' values (its own from `own`; Op's identity past the last peer) as a
  // tree (common.cuh fold_pairwise: the round's critical path), then the quad butterfly folds the
  // four lanes: the same sequence, so the same bits, in every lane and every CTA.
  template <class Op>
  static COMFUSE_DEVICE float fold(uint64_t const (&w)[kPerLane], float own, int q, int rank) {
    float x[kPerLane];
    CUTE_UNROLL
    for (int i = 0; i < kPerLane; ++i) {
      int const j = q + 4 * i;
      x[i] = j < Peers ? (j == rank ? own : word_value(w[i])) : Op::identity();
    }
    float const acc = fold_pairwise<Op>(x);
    float const acc2 = Op::combine(acc, __shfl_xor_sync(0xffffffffu, acc, 1));
    return Op::combine(acc2, __shfl_xor_sync(0xffffffffu, acc2, 2));
  }

  template <class Op>
  static COMFUSE_DEVICE void finish(Storage&, uint32_t round, RowGroupSlot const& x, Params const& p, int t, int,
                                    float (&v)[MBlocks][2]) {
    for_each_row<1>(round, x, p, t, [&](int mi, int h, uint64_t const (&w)[1][kPerLane]) {
      v[mi][h] = fold<Op>(w[0], v[mi][h], t % 4, x.rank);
    });
  }

  // One row of a pair round, lane q's words in: v becomes the row's statistic folded with First
  // (the same bits in every CTA), s the sum over peers j (lane q: j = q, q + 4, ..., then the quad
  // butterfly) of term(j, v_j, s_j, center(statistic)). rank: the peer whose values are v and s,
  // not in w; -1 where every peer's words were polled.
  template <class First, class Center, class Term>
  static COMFUSE_DEVICE void merge_pair_row(uint64_t const (&w)[2][kPerLane], float& v, float& s, int q, int rank,
                                            Center const& center, Term const& term) {
    float const first = fold<First>(w[0], v, q, rank);
    auto const c = center(first);
    float terms[kPerLane];
    CUTE_UNROLL
    for (int i = 0; i < kPerLane; ++i) {
      int const j = q + 4 * i;
      bool const own = j == rank;  // select the inputs, then ONE inlined term
      terms[i] = j < Peers ? term(j, own ? v : word_value(w[0][i]), own ? s : word_value(w[1][i]), c) : 0.f;
    }
    float acc = fold_pairwise<Plus>(terms);
    acc += __shfl_xor_sync(0xffffffffu, acc, 1);
    acc += __shfl_xor_sync(0xffffffffu, acc, 2);
    v = first;
    s = acc;
  }

  // Finish a pair round: each row as merge_pair_row, the exact merge of the second statistics
  // (the caller's pair rule, epilogue/stage.cuh; center: the row's constants for its terms,
  // computed once a row after its words are in, e.g. the mean). Helped (kHelpedPairs), warps 2
  // and 3 take warps 0 and 1's second row slots (help_pair) into PairHandOver's buffer
  // pair_round % 2, and every thread of the warp group meets at bar_id before the owners read them.
  template <class First, class Center, class Term>
  static COMFUSE_DEVICE void finish_pair(Storage& st, uint32_t round, uint32_t pair_round, RowGroupSlot const& x,
                                         Params const& p, int t, int bar_id, float (&v)[MBlocks][2],
                                         float (&second)[MBlocks][2], Center const& center, Term const& term) {
    int const q = t % 4;
    bool const helped_round = helped(x);
    if (helped_round && t >= 64) {
      help_pair<First>(st, round, pair_round, x, p, t, center, term);
    } else {
      // w[0]: the peers' statistics, w[1]: their second statistics, polled together.
      for_each_row<2>(round, x, p, t, [&](int mi, int h, uint64_t const (&w)[2][kPerLane]) {
        merge_pair_row<First>(w, v[mi][h], second[mi][h], q, x.rank, center, term);
      }, helped_round);
    }
    if constexpr (kHelpedPairs) {
      if (helped_round) {
        named_sync(bar_id, kWarpGroupThreads);
        int const warp = t / 32;
        if (warp < 2 && live(x, t, 0, 1)) {
          v[0][1] = st.row[pair_round & 1][warp][(t % 32) / 4][0];
          second[0][1] = st.row[pair_round & 1][warp][(t % 32) / 4][1];
        }
      }
    }
  }

 private:
  // Lane t of warp 2 or 3 merges the second row slot of lane t - 64 (its owner in warp 0 or 1): it
  // polls every peer's words of the row, its own CTA's included (rank -1; they carry the owner's
  // registers' bits, so every CTA still folds the same values), and a quad's leader writes the
  // row's statistics to PairHandOver.
  template <class First, class Center, class Term>
  static COMFUSE_DEVICE void help_pair(Storage& st, uint32_t round, uint32_t pair_round, RowGroupSlot const& x,
                                       Params const& p, int t, Center const& center, Term const& term) {
    if constexpr (kHelpedPairs) {
      int const owner_t = t - 64, q = t % 4;
      if (!live(x, owner_t, 0, 1)) return;  // warp-uniform
      int const row = accum_row(owner_t, 0, 1);
      int const off[1][2] = {{row, Rows + row}};
      bool const on[1] = {true};
      uint64_t w[1][2][kPerLane];
      uint64_t t0 = 0;
      poll(words(x, p, round, 0), off, on, tag(x, round), q, -1, t0, w);
      float a = 0.f, s = 0.f;  // not read: rank -1
      merge_pair_row<First>(w[0], a, s, q, -1, center, term);
      if (q == 0) {
        st.row[pair_round & 1][t / 32 - 2][(t % 32) / 4][0] = a;
        st.row[pair_round & 1][t / 32 - 2][(t % 32) / 4][1] = s;
      }
    }
  }
};

}  // namespace comfuse::cluster
