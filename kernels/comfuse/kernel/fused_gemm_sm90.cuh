// comfuse/kernel/fused_gemm_sm90.cuh: the fused GEMM + epilogue kernel (sm_90a).
//
// 384 threads = 3 warp groups (KernelConfig::consumer_wgs W = 2; W = 3: 512):
//   WG0  producer: setmaxnreg.dec to 40 (W = 2); one thread issues every TMA load into the
//        Stages-deep SMEM ring (mainloop/mainloop_sm90.cuh), tile after tile.
//   WG1..WG W  consumers (setmaxnreg.inc to 232 at W = 2: KernelConfig::consumer_regs), in one
//     of two schedules
//     PingPong (KernelConfig::wgs_per_tile == 1): consumer c takes the CTA's tiles c, c+W, ...;
//        each owns a whole BM x BN tile (BM*BN/128 fp32 accumulators a thread). The tensor
//        cores serve one consumer at a time: a consumer waits for its MmaTurn barrier,
//        issues all wgmmas of its tile, hands the turn to the next consumer (c + 1 mod W),
//        then waits for its last wgmmas and runs the epilogue (epilogue/stage.cuh) while the
//        other consumers' mainloops run (with W > 2, beside other consumers' epilogues).
//     Cooperative (wgs_per_tile == 2): both consumers take every tile of the CTA, 64 rows
//        each, and run their halves' epilogues side by side; the producer meanwhile fills
//        the ring for the next tile. Bigger tiles (128 x 256) for less SMEM traffic per
//        MAC; the epilogue is not hidden behind a mainloop.
// Persistent over tiles (scheduler/tile_scheduler.cuh), clusters of 1 x cluster_n CTAs
// along N sharing the A tile through TMA multicast, cluster_m x 1 along M sharing B, or both
// (2 x cluster_n, for a row reduction over DSMEM: A along each cluster row, B along each column).
//
// Stash (NTiles = T > 1, epilogue/stash.cuh): a job of a CTA is T N-tiles of one row block
//   (column blocks n, n + C_N, ..., n + (T-1) C_N: every CTA of the cluster walks the same
//   jobs); a row reduction then covers N <= C_N * BN * T with small clusters. Per job: for each
//   tile, its mainloop, then the root stage's compute phase (partials accumulate over the
//   tiles; the tile-shaped bypass value of tiles 0..T-2 goes into the warp group's stash slots,
//   the last tile's stays in the accumulators); after the last tile the reduce phase and every
//   PostStage stream over the T tiles (stage.cuh). PingPong hands the tensor cores over per job
//   (a consumer keeps its MmaTurn for its T mainloops, with its root bodies in between, and
//   passes it on after its last tile's wgmmas, so that the long part, the rounds and the
//   PostStages over T tiles, runs under the other consumer's mainloops), or, with
//   KernelConfig::turn_lead, in TurnOrder (scheduler/turn_order.cuh): two jobs' tiles in
//   turn in the middle, so that most bodies run beside the other consumer's mainloop too.
//   StashT: float or bf16 (rounds the bypassed value).
//   Stash bytes per consumer WG: KernelConfig::stash_bytes_per_wg(); in SMEM beside the ring
//   (StashSpace::Smem) or in a global workspace (StashSpace::Workspace), which the L2 mostly
//   holds; the layout is thread-private either way (no barriers).
//
// Row groups (row_group = G > 1, Aggregation::L2Exchange): the CTAs that share a row are G clusters of the
//   persistent grid instead of one cluster along N, exchanging each reduction round through L2
//   (cluster/global_exchange.cuh), so that the hardware cluster can run along M and multicast
//   B (cluster_m = 2: the PingPong mainloops' L2 traffic at cuBLAS parity) with all 132 SMs busy.
//   Columns, jobs and Stash work as with a cluster of G CTAs along N (scheduler).
//
// Tile inputs in the ring (ring_input_bytes > 0): the producer follows each tile's k-blocks with
//   one more slot holding the epilogue's first-stage [M, N] inputs (a residual, by TMA); the
//   tile's consumer waits for it after its mainloop, reads it from SMEM in its first stage and
//   releases it like a k-block (mainloop_sm90.cuh load_slot, nodes.cuh TileInput).
//
// Gated (KernelConfig::gated: SwiGLU's gate and up projections, one GEMM): each B tile holds
//   tile_n rows of B and tile_n of B3 (mainloop_sm90.cuh), the accumulator both products, and
//   the epilogue's GateEntry reads A B3^T beside AccEntry's A B^T (stage.cuh).
//
// Split-K (k_splits = S > 1, scheduler/split_k.cuh): S clusters run the mainloops of the same
//   tiles over a share of K each; split 0 owns the tiles: each of its consumers adds the other
//   splits' partial tiles (passed through the exchange workspace, or with splits_in_cluster over
//   DSMEM from the other CTAs of its hardware cluster: cluster/split_hand_over.cuh) to its
//   accumulators and runs the epilogue; the other splits' consumers only hand their partials
//   over. For problems with fewer tiles than SMs (decode).
//
// Generated code writes `constexpr comfuse::KernelConfig kConfig{...}` once, instantiates
// FusedGemmSm90<kConfig, Element, Epilogue> and wraps it in an extern "C" entry
// (COMFUSE_DEFINE_KERNEL). The runtime launches it with kConfig's grid (scheduler/grid.cuh),
// kConfig.threads() threads and kConfig.smem_bytes() of dynamic SMEM.
#pragma once
#include "../common.cuh"
#include "../params.cuh"
#include "../mainloop/mainloop_sm90.cuh"
#include "../scheduler/tile_scheduler.cuh"
#include "../scheduler/split_k.cuh"
#include "../scheduler/turn_order.cuh"
#include "../cluster/split_hand_over.cuh"
#include "../epilogue/stage.cuh"
#include "../debug/trace.cuh"

namespace comfuse {

// C: the kernel's one description (config.cuh), written once by the generated source;
// Element: bf16 or f16 (A and B); Epi: the epilogue, a Stage (epilogue/stage.cuh).
template <KernelConfig C, class Element, class Epi_>
struct FusedGemmSm90 {
  static_assert(check(C) == nullptr, "ComFuse: KernelConfig refused by check() (config.cuh); the host "
                                     "planner calls check() and names the reason");
  static constexpr KernelConfig kConfig = C;
  using Mainloop = MainloopSm90<Element, C>;
  using Epi = Epi_;
  static constexpr int BM = C.tile_m, BN = C.tile_n, ClusterN = C.cluster_n, ClusterM = C.cluster_m;
  static constexpr bool kPingPong = C.wgs_per_tile == 1;
  static constexpr int kEpiRows = C.epi_rows();  // rows of a consumer's epilogue
  static constexpr int NTiles = C.n_tiles;
  static constexpr int kW = C.consumer_wgs;  // consumer warp groups
  // Two jobs' tiles in turn on the tensor cores (KernelConfig::turn_lead).
  static constexpr bool kTileTurns = C.tile_turns();
  using Order = TurnOrder<NTiles, kTileTurns ? C.turn_lead : 1>;
  static constexpr bool kGlobal = C.aggregation == Aggregation::L2Exchange;
  static constexpr bool kL2Exchange = C.exchange_slot_bytes() > 0;  // rows reduced through the L2 workspace
  static constexpr bool kSplitK = C.k_splits > 1;
  static constexpr bool kSplitsInCluster = C.splits_in_cluster;  // partials over DSMEM, else through L2
  // Named only: instantiated (and its SMEM laid out) where the splits are in a cluster.
  using HandOver = cluster::SplitHandOver<C>;
  struct NoHandOver {};
  static constexpr bool kWorkspace = C.uses_exchange_workspace();    // the launch counter (epoch) and its users
  static constexpr int RowPeers = C.reduce_peers();  // CTAs that hold the same rows and reduce them together
  using Geo = epi::Geometry<kEpiRows, BN, RowPeers, C.aggregation, NTiles, /*Batched=*/false, ClusterM,
                            /*RetireEarly=*/C.begin_early, kW, C.pair_hand_over, C.poll_backoff, C.store_stages>;
  using EpiExec = typename Epi::template Exec<Geo>;
  using Scheduler = TileScheduler<C>;
  static_assert(C.row_reduction == Epi::kEndsInReduction, "KernelConfig::row_reduction: does the epilogue reduce rows");
  static constexpr bool kDsmemReduce = EpiExec::kClusterReduce && !kGlobal;
  using Pipeline = typename Mainloop::Pipeline;
  using PipelineState = typename Mainloop::PipelineState;
  // The root stage's tile inputs ride the ring (KernelConfig::ring_input_bytes): one slot after
  // each tile's k-blocks, which the tile's consumer holds until its root stage's body is done.
  static constexpr int kRingSlots = C.ring_input_bytes > 0 ? 1 : 0;
  static_assert(EpiExec::kRingInputBytes == C.ring_input_bytes,
                "ComFuse: the epilogue's tile inputs in the ring differ from KernelConfig::ring_input_bytes");

  static constexpr int kThreads = C.threads();
  static constexpr int kProducerRegs = C.producer_regs();
  static constexpr int kConsumerRegs = C.consumer_regs();
  // Named barriers of consumer warp group w (common.cuh).
  static COMFUSE_DEVICE int turn_barrier(int w) { return barrier_id<kW>(NamedBarrier::MmaTurnWG0, w); }
  static COMFUSE_DEVICE int epilogue_barrier(int w) { return barrier_id<kW>(NamedBarrier::EpilogueWG0, w); }

  struct SharedBase {
    typename Mainloop::SharedStorage mainloop;              // the ring, 1024-aligned
    typename EpiExec::SharedStorage epi[kW];                // one per consumer WG
    typename Pipeline::SharedStorage pipe;                  // full/empty mbarriers
  };
  // Split-K over DSMEM (splits_in_cluster): each consumer WG's hand-over beside them.
  struct SharedSplit : SharedBase {
    typename HandOver::Storage hand_over[kW];
    static_assert(int(sizeof(typename HandOver::Storage)) == C.split_hand_over_bytes(),
                  "ComFuse: the split hand-over's SMEM differs from KernelConfig::split_hand_over_bytes()");
  };
  // Split-K through L2 with the partial rows summed in SMEM (split_gather_rows: decode rows or the
  // whole tile): each consumer WG's staging of the summed partial rows.
  struct SharedGather : SharedBase {
    alignas(16) float gather[kW][C.split_gather_rows > 0 ? C.split_gather_rows * C.mma_n() : 4];
  };
  static_assert(C.split_gather_rows == 0 || int(sizeof(float) * C.split_gather_rows * C.mma_n()) == C.split_gather_bytes(),
                "ComFuse: the split gather's SMEM differs from KernelConfig::split_gather_bytes()");
  using SharedCore = cute::conditional_t<kSplitsInCluster, SharedSplit,
                                         cute::conditional_t<(C.split_gather_rows > 0), SharedGather, SharedBase>>;
  // Exact, not just a bound: a model that over-counts costs the mainloop ring stages for nothing.
  static_assert(int(sizeof(typename EpiExec::SharedStorage)) == C.epilogue_smem_bytes || C.epilogue_smem_bytes == 0,
                "ComFuse: the epilogue's SMEM differs from KernelConfig::epilogue_smem_bytes (the planner's model)");
  // Stash (NTiles > 1): the job's earlier tiles' bypassed value, in SMEM beside the ring or in
  // the global workspace (Params::stash, C.stash_workspace_bytes_per_cta() a CTA, CTA index
  // blockIdx.x * gridDim.y + blockIdx.y), which the L2 mostly holds. fp32, or bf16: of x itself,
  // or (C.stash_centers) of x less each tile's row center, the root's online pair's statistic.
  using StashT = cute::conditional_t<C.stash_elem_bytes == 2, cutlass::bfloat16_t, float>;
  static constexpr bool kStashInSmem = C.stash_space == StashSpace::Smem;
  static constexpr int kStashBytesPerWG = C.stash_bytes_per_wg();
  static_assert(NTiles == 1 || C.stash_elem_bytes > 0 || !EpiExec::kCarriesTile,
                "ComFuse: a tile-shaped value crosses a reduction with several N-tiles per job: it needs a stash");
  struct SharedStash : SharedCore {
    alignas(128) unsigned char stash[kW][kStashBytesPerWG > 0 ? kStashBytesPerWG : 16];
  };
  using SharedStorage = cute::conditional_t<kStashInSmem, SharedStash, SharedCore>;
  using Stash = cute::conditional_t<(kStashBytesPerWG > 0),
                                    epi::Stash<StashT, kEpiRows, BN, NTiles - 1, kStashInSmem, C.stash_centers>, epi::NoStash>;
  static_assert(Stash::kBytes == kStashBytesPerWG, "ComFuse: the stash's layout and KernelConfig::stash_bytes_per_wg differ");
  static_assert(!C.stash_centers || EpiExec::kPairOnline,
                "ComFuse: stash_centers needs the root stage's pair online over several N-tiles (its centers)");
  // What the launch asks for (C.smem_bytes()) holds what the kernel uses.
  static_assert(int(sizeof(SharedStorage)) <= C.smem_bytes(),
                "ComFuse: the kernel's SMEM exceeds KernelConfig::smem_bytes()");

  static COMFUSE_DEVICE void run(Params const& p, char* smem_raw) {
    SharedStorage& ss = smem_base<SharedStorage>(smem_raw);

    int const wg = threadIdx.x / kWarpGroupThreads;
    int const t = threadIdx.x % kWarpGroupThreads;
    trace::mark_entry();

    typename Pipeline::Params pp;
    pp.transaction_bytes = Mainloop::kTxBytes;
    pp.role = wg == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
    pp.is_leader = threadIdx.x == 0;
    pp.num_consumers = Mainloop::kConsumerThreads;  // PingPong: one consumer WG per k-block
    Pipeline pipeline(ss.pipe, pp, typename Mainloop::ClusterShape{});
    if (threadIdx.x == 0) {  // the epilogue's cluster-reduction channels (mbarriers), one per consumer WG
      prefetch_tma_descriptor(&p.tma_a);
      prefetch_tma_descriptor(&p.tma_b);
      if constexpr (C.gated) prefetch_tma_descriptor(&p.tma_b3);
      EpiExec::prefetch_descriptors(p);
      CUTE_UNROLL
      for (int w = 0; w < kW; ++w) EpiExec::init_shared(ss.epi[w]);
      if constexpr (kSplitsInCluster) {
        CUTE_UNROLL
        for (int w = 0; w < kW; ++w) HandOver::init(ss.hand_over[w]);
      }
    }

    // Barrier init visible to every CTA of the cluster before any multicast or remote arrive.
    if constexpr (C.hw_cluster_size() > 1) {
      cute::cluster_arrive_relaxed();
      cute::cluster_wait();
    } else {
      __syncthreads();
    }
    Scheduler sched(p);            // the launch's parameters only: nothing global
    int const kt = sched.k_count;  // k-blocks of this CTA's mainloops (all of K, or its split's share)
    PipelineState producer_state = cutlass::make_producer_start_state<Pipeline>();
    // B ahead of the previous grid (Params::b_before_wait: the runtime knows that grid, the pair's
    // part before this one, writes no byte of B): the producer fills the first job's first slots
    // with B while that grid still runs, and adds A to them after the wait.
    int b_ahead = 0;
    if (p.b_before_wait && threadIdx.x == 0)
      if (TileCoord const tc = sched.tile(0); tc.valid)
        b_ahead = Mainloop::load_b_ahead(p, pipeline, producer_state, ss.mainloop, tc.n_block, sched.rank,
                                         sched.k_begin, kt);
    wait_for_previous_grid();  // nothing else global before this (common.cuh)
    trace::mark_released();
    allow_next_grid();

    if (wg == 0) {
      warpgroup_reg_dealloc<kProducerRegs>();
      if (threadIdx.x == 0) {
        PipelineState& state = producer_state;
        // kTileTurns: the CTA's jobs k, k + 1 (consumer 0's, consumer 1's) in TurnOrder, a last
        // job without a partner alone.
        for (int k = 0;; k += kTileTurns ? 2 : 1) {
          TileCoord const tc0 = sched.tile(k);
          if (!tc0.valid) break;
          bool const two_jobs = kTileTurns && sched.tile(k + 1).valid;
          for (int i = 0; i < (two_jobs ? Order::kTiles : NTiles); ++i) {
            int const w = two_jobs ? Order::consumer(i) : 0, nt = two_jobs ? Order::tile(i) : i;
            TileCoord const tc = w == 0 ? tc0 : sched.tile(k + 1);
            int const n_block = tc.n_block + nt * RowPeers;
            Mainloop::load(p, pipeline, state, ss.mainloop, tc.m_block, n_block, sched.rank, sched.k_begin, kt,
                           k + w == 0 && nt == 0 ? b_ahead : 0);
            if constexpr (kRingSlots > 0)
              Mainloop::load_slot(pipeline, state, C.ring_input_bytes, [&](uint64_t* bar, int s) {
                EpiExec::load_ring(p, bar, [&](int box) { return Mainloop::slot_box(ss.mainloop, s, box); },
                                   tc.m_block * BM, n_block * BN);
              });
          }
        }
        pipeline.producer_tail(state);  // no exit while peers may still signal our barriers
      }
    } else {
      warpgroup_reg_alloc<kConsumerRegs>();
      int const cw = wg - 1;
      trace::reset_sums(t, cw);
      PipelineState read_state, release_state;
      EpiExec epi;
      typename Mainloop::FragC accum;
      Stash stash;
      if constexpr (kStashInSmem) {
        stash.bind(reinterpret_cast<SharedStash&>(ss).stash[cw], t);
      } else if constexpr (kStashBytesPerWG > 0) {
        size_t const cta = size_t(blockIdx.x) * gridDim.y + blockIdx.y;
        stash.bind(static_cast<char*>(p.stash) + (cta * kW + cw) * size_t(kStashBytesPerWG), t);
      }
      int const slot_kt = kt + kRingSlots;  // ring slots of one tile
      int const job_kt = NTiles * slot_kt;  // of one job
      uint32_t const epoch = kWorkspace ? cluster::exchange_epoch<Geo::kRetireEarly>(p) : 0;  // tags this launch's rounds
      bool const owner = !kSplitK || sched.owns_tiles();  // runs the epilogue of its tiles
      cute::conditional_t<kSplitsInCluster, HandOver, NoHandOver> hand_over;  // its barriers' phases
      if constexpr (kPingPong) {
        if (kW == 2 ? cw == 1 : cw > 0) {
          if constexpr (!kTileTurns) {  // kTileTurns: each tile's position (below)
            read_state.advance(kW == 2 ? job_kt : cw * job_kt);  // the first k-blocks belong to the consumers before it
            release_state = read_state;
          }
          if (cw == kW - 1) named_arrive(turn_barrier(0), 2 * kWarpGroupThreads);  // consumer 0 goes first
        }
      }
      int const k_step = kPingPong ? kW : 1;  // PingPong: the consumers take jobs in turn
      for (int k = kPingPong ? cw : 0, job = 0;; k += k_step, ++job) {
        TileCoord tc = sched.tile(k);
        if (!tc.valid) break;
        int const m0 = tc.m_block * BM + (kPingPong ? 0 : cw * kEpiRows);
        epi::EpiCtx ctx{&p, m0, tc.n_block * BN, p.N, t, t / 32, t % 32};  // the job's tile 0
        ctx.job = job;
        ctx.xs = RowGroupSlot{sched.exchange_slot(cw), sched.rank_n, epoch, p.M - m0};
        // Its last job: done with the L2 exchange after the chain's last round (start_retire).
        if constexpr (Geo::kRetireEarly && kL2Exchange)
          epi.rounds.retire_after = cluster::retires_early(epoch) && !sched.tile(k + k_step).valid;
        // KernelConfig::begin_early: the first job's begin loads (its vectors) issued before its
        // mainloop, off the epilogue's critical path.
        if constexpr (C.begin_early)
          if (job == 0 && owner) epi.begin_early(ctx);
        // kTileTurns: both consumers' jobs of the two are valid, or consumer 0 runs its job alone;
        // i: the tile's ring position among the two jobs' tiles, pos: the next one this consumer reaches.
        bool const two_jobs = kTileTurns && sched.tile(k - cw + 1).valid;
        int pos = 0;
        for (int nt = 0; nt < NTiles; ++nt) {
          int const i = two_jobs ? Order::pos(cw, nt) : nt;
          if constexpr (kTileTurns) {  // past the other consumer's tiles before this one
            read_state.advance((i - pos) * slot_kt);
            release_state = read_state;
            pos = i + 1;
          }
          if constexpr (kPingPong)
            if (two_jobs ? Order::takes_turn(i) : nt == 0) named_sync(turn_barrier(cw), 2 * kWarpGroupThreads);
          if (nt == 0) trace::mark(t, cw, job, trace::kTurn);
          // The root stage's tile inputs (TileInput) go to L2 while the tile's mainloop runs.
          if constexpr (EpiExec::kRootLoads)
            if (owner) epi.prefetch(EpiExec::tile_ctx(ctx, nt), ss.epi[cw]);
          if constexpr (kPingPong) {
            Mainloop::mma(pipeline, read_state, release_state, ss.mainloop, accum, kt, t);
            // The turn goes to the next consumer once per job, after its last tile's wgmmas
            // (kTileTurns: where the next tile of the two jobs is the other consumer's).
            if (nt == NTiles - 1) trace::mark(t, cw, job, trace::kIssued);
            if (two_jobs ? Order::hands_turn(i) : nt == NTiles - 1)
              named_arrive(turn_barrier(kW == 2 ? 1 - cw : (cw + 1) % kW), 2 * kWarpGroupThreads);
            Mainloop::mma_tail(pipeline, release_state, accum, kt);
          } else {
            Mainloop::mma(pipeline, read_state, release_state, ss.mainloop, accum, kt, threadIdx.x - kWarpGroupThreads);
            if (nt == NTiles - 1) trace::mark(t, cw, job, trace::kIssued);
            Mainloop::mma_tail(pipeline, release_state, accum, kt);
          }
          if constexpr (kSplitsInCluster) {  // NTiles == 1 (check()); rank 0 owns the tile
            if (!owner) hand_over.send(ss.hand_over[cw], accum, p.M - m0, t);
            else hand_over.receive(ss.hand_over[cw], accum, p.M - m0, t);
          } else if constexpr (kSplitK) {
            splitk::SplitK<C> const xk(p, sched.split_slot(cw));
            int const bar = epilogue_barrier(cw);
            float* stage = nullptr;
            if constexpr (C.split_gather_rows > 0) stage = ss.gather[cw];
            if (!owner) xk.publish(accum, sched.split, job, epoch, m0, p.M, t, bar);
            else xk.gather(accum, job, epoch, m0, p.M, t, bar, stage, sched.tile(k + k_step).valid);
          }
          if (nt == NTiles - 1) trace::mark(t, cw, job, trace::kAccReady);
          if constexpr (kRingSlots > 0) {  // the tile's inputs, loaded after its k-blocks (no split-K:
                                           // every consumer owns its tiles, check())
            pipeline.consumer_wait(read_state);
            ctx.ring_a = smem_u32(Mainloop::slot_box(ss.mainloop, read_state.index(), 0));
            ctx.ring_b = smem_u32(Mainloop::slot_box(ss.mainloop, read_state.index(), 1));
            ++read_state;
            // Every thread has read the slot before it goes back to the producer.
            auto const free_slot = [&] {
              named_sync(epilogue_barrier(cw), kWarpGroupThreads);
              pipeline.consumer_release(release_state);
              ++release_state;
            };
            epi.run_tile(ctx, ss.epi[cw], accum, epilogue_barrier(cw), nt, stash, free_slot);
          } else if (owner) {
            epi.run_tile(ctx, ss.epi[cw], accum, epilogue_barrier(cw), nt, stash);
          }
        }
        trace::mark(t, cw, job, trace::kEpiDone);
        if constexpr (kTileTurns) {  // to the two jobs' end
          read_state.advance(((two_jobs ? Order::kTiles : NTiles) - pos) * slot_kt);
          release_state = read_state;
        } else if constexpr (kPingPong) {
          read_state.advance((kW - 1) * job_kt);  // skip the other consumers' jobs
          release_state = read_state;
        }
      }
      if (t == 0) tma_store_wait_all<0>();
      if constexpr (kWorkspace) {
        uint32_t const participants = cluster::retire_participants(kW);
        bool retired = false;  // counted out after its last round (every thread of the warp group alike)
        if constexpr (Geo::kRetireEarly) {
          retired = epi.rounds.retired;
          if (retired) cluster::finish_retire(p, epoch, t, epi.rounds.retire_before, participants);
        }
        if (!retired) cluster::retire_exchange(p, epoch, t, epilogue_barrier(cw), participants);
      }
      trace::mark_exit(t, cw);
    }
    // Row reductions push into peers' SMEM, and split-K's owner reads its followers' and arrives
    // on their barriers: no CTA leaves while a peer may still read or write its SMEM.
    if constexpr (kDsmemReduce || kSplitsInCluster) cute::cluster_sync();
  }
};

template <class Kernel>
__global__ void __launch_bounds__(Kernel::kThreads, 1) fused_gemm_sm90(__grid_constant__ Params const p) {
  extern __shared__ __align__(Sm90::kSmemAlign) char comfuse_smem[];
  Kernel::run(p, comfuse_smem);
}

}  // namespace comfuse

// A generated translation unit names its entry point with this (extern "C": a stable
// symbol for cuLibraryGetKernel, no mangled template name to reproduce). The launch's sizes
// come from the same KernelConfig on the host (config.cuh, scheduler/grid.cuh).
#define COMFUSE_DEFINE_KERNEL(NAME, KERNEL)                                \
  extern "C" __global__ void __launch_bounds__(KERNEL::kThreads, 1)        \
      NAME(__grid_constant__ comfuse::Params const p) {                    \
    extern __shared__ __align__(comfuse::Sm90::kSmemAlign) char comfuse_smem[]; \
    KERNEL::run(p, comfuse_smem);                                          \
  }
