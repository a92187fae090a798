// comfuse/b2b/b2b_gemm_sm90.cuh: the back-to-back GEMM kernel (sm_90a), the second kernel
// family: O = F(X W1^T [, X W3^T]) W2^T, then GEMM2's epilogue, with S = F(P) never leaving
// the registers.
//
// 384 threads = 3 warp groups, one CTA per SM (persistent over jobs):
//   WG0  producer (setmaxnreg.dec 40): warp w's first lane feeds ring w (b2b/ring.cuh): per
//        chunk of N1, the X/W1 k-blocks, then the W2 k-blocks (b2b/mainloop_b2b.cuh), in exactly
//        the order the consumers take them. The W2 k-blocks of a chunk land while F runs on it.
//   WG1, WG2  consumers (setmaxnreg.inc 232). Unpaired, each on its own jobs with its own ring:
//        tile_m rows x tile_n2 columns of O in one batch (b2b job order: scheduler/grid.cuh; with
//        a causal mask a CTA's two warp groups take a row block and its mirror, so every SM walks
//        as much of N1). Paired (B2bConfig::paired), both on one job of 2 x tile_m rows, each its
//        half, reading one ring whose W1/W2 tiles they share; they take ordered turns on the
//        tensor cores where a turn's k-blocks fit the ring (below). Per chunk: ML1 (GEMM1, SS wgmma),
//        Epi1 (F: b2b/intermediate.cuh), ML2 (GEMM2, RS wgmma: S from registers). GEMM2 of
//        chunk c runs on the tensor cores while ML1 of chunk c + 1 is issued behind it; the two
//        consumer warp groups interleave on the tensor cores, one's F beside the other's GEMMs.
//        After the last chunk, Epi2: GEMM2's Stage-Stream epilogue on O (bias, residual,
//        activation, a norm over tile_n2 >= N2, stores by TMA).
// F beside GEMM2 (B2bConfig::f_beside_gemm2, attention with X = Q resident): a warp group's turn
// issues GEMM1 of chunk c and GEMM2 of chunk c - 1, and F of chunk c runs while that GEMM2 is
// still on the tensor cores.
// A slot is released once the wgmmas that read it completed (b2b/ring.cuh's Taken: each
// k-block as its commit group completes); before F (which reads P, rewrites S and, for the
// online softmax, rescales O) the consumer waits for all its wgmmas.
// N1 split over a cluster (C.cluster_n1 > 1): the cluster's CTAs take the same jobs, each walks
// its share of a job's chunks (b2b_rank_chunks), and the job's owner (the CTAs take turns) sums
// the partial O over DSMEM (b2b/partial_sum.cuh) and runs Epi2; the others go on to their next job.
#pragma once
#include "../common.cuh"
#include "../params.cuh"
#include "../scheduler/grid.cuh"
#include "../debug/trace.cuh"
#include "mainloop_b2b.cuh"
#include "intermediate.cuh"
#include "partial_sum.cuh"

namespace comfuse::b2b {

// C: the kernel's description (config.cuh's B2bConfig); F: ElementwiseF<Stage> or
// OnlineSoftmaxF<Stage> over a Stage ending in ToOperand; Epi2: a Stage on O.
template <B2bConfig C, class Element, template <class, class, B2bConfig> class FKind, class FStage, class Epi2Stage>
struct B2bGemmSm90 {
  static_assert(check(C) == nullptr, "ComFuse: B2bConfig refused by check() (config.cuh); the host planner names the reason");
  using Mainloop = MainloopB2b<Element, C>;
  using RingT = typename Mainloop::RingT;
  using State = typename Mainloop::State;
  using Geo1 = epi::Geometry<C.tile_m, C.chunk_n1, 1, Aggregation::None, 1, C.batched>;
  using Geo2 = epi::Geometry<C.tile_m, C.tile_n2, 1, Aggregation::None, 1, C.batched>;
  using F = FKind<FStage, Geo1, C>;
  using Epi2 = typename Epi2Stage::template Exec<Geo2>;
  static constexpr int kThreads = Sm90::kThreads;

  // The rings (one per consumer warp group, or one shared when paired), then each consumer warp
  // group's F and Epi2 storage (1024-aligned blocks, none when empty), as KernelConfig-style
  // arithmetic the host repeats (B2bConfig::smem_bytes).
  static constexpr int kRings = C.rings();
  static constexpr bool kPaired = C.paired;
  static constexpr int kFBytes = cute::is_same_v<typename F::SharedStorage, epi::detail::NoTree> ? 0
                                 : align_up(int(sizeof(typename F::SharedStorage)), 1024);
  static constexpr int kEpi2Bytes = cute::is_same_v<typename Epi2::SharedStorage, epi::detail::NoTree> ? 0
                                    : align_up(int(sizeof(typename Epi2::SharedStorage)), 1024);
  static_assert(kFBytes + kEpi2Bytes == C.epilogue_smem_bytes || C.epilogue_smem_bytes == 0,
                "ComFuse: F and GEMM2's epilogue differ from B2bConfig::epilogue_smem_bytes (the planner's model)");
  // With N1 split over a cluster: the partial-O hand-over's buffers and barriers after them.
  static constexpr bool kSplitN1 = C.cluster_n1 > 1;
  using Xfer = PartialSum<kSplitN1 ? C.cluster_n1 : 2, C.tile_n2 / 2, C.xfer_floats>;
  static constexpr int kXferBytes = kSplitN1 ? align_up(int(sizeof(typename Xfer::Storage)), 1024) : 0;
  static_assert(!kSplitN1 || int(sizeof(typename Xfer::Storage)) == C.xfer_bytes(),
                "ComFuse: the partial-O hand-over differs from B2bConfig::xfer_bytes() (the planner's model)");
  struct alignas(1024) PerWG {
    unsigned char epi[kFBytes + kEpi2Bytes + kXferBytes > 0 ? kFBytes + kEpi2Bytes + kXferBytes : 16];
  };
  struct SharedStorage {
    typename Mainloop::SharedStorage ring[kRings];
    PerWG wg[Sm90::kConsumerWGs];
    typename RingT::Storage bars[kRings];
  };
  // Chained jobs run the previous job's Epi2 after this job's start: a prefetch of this job's
  // tile inputs would overwrite the previous job's (the planner refuses the pair).
  static_assert(!C.chain_jobs || !Epi2::kRootLoads, "ComFuse: chain_jobs with tile inputs in GEMM2's epilogue");
  static_assert(int(sizeof(SharedStorage)) <= C.smem_bytes(),
                "ComFuse: the B2B kernel's SMEM exceeds B2bConfig::smem_bytes()");

  static COMFUSE_DEVICE typename F::SharedStorage& f_storage(PerWG& w) {
    return *reinterpret_cast<typename F::SharedStorage*>(w.epi);
  }
  static COMFUSE_DEVICE typename Epi2::SharedStorage& epi2_storage(PerWG& w) {
    return *reinterpret_cast<typename Epi2::SharedStorage*>(w.epi + kFBytes);
  }
  static COMFUSE_DEVICE typename Xfer::Storage& xfer_storage(PerWG& w) {
    return *reinterpret_cast<typename Xfer::Storage*>(w.epi + kFBytes + kEpi2Bytes);
  }

  static COMFUSE_DEVICE void run(Params const& p, char* smem_raw) {
    SharedStorage& ss = smem_base<SharedStorage>(smem_raw);
    int const wg = threadIdx.x / kWarpGroupThreads;
    int const t = threadIdx.x % kWarpGroupThreads;
    if (threadIdx.x == 0) {
      prefetch_tma_descriptor(&p.tma_a);   // X
      prefetch_tma_descriptor(&p.tma_b);   // W1
      prefetch_tma_descriptor(&p.tma_b2);  // W2
      if constexpr (C.gated) prefetch_tma_descriptor(&p.tma_b3);
      Epi2::prefetch_descriptors(p);
      for (int r = 0; r < kRings; ++r) RingT::init(ss.bars[r]);
      for (int w = 0; w < Sm90::kConsumerWGs; ++w) {
        F::init(f_storage(ss.wg[w]));
        Epi2::init_shared(epi2_storage(ss.wg[w]));
        if constexpr (kSplitN1) Xfer::init(xfer_storage(ss.wg[w]));
      }
      cutlass::arch::fence_barrier_init();
    }
    // A follower's first arrival on its owner's barrier must find it initialized.
    if constexpr (kSplitN1) cute::cluster_sync();
    else __syncthreads();
    wait_for_previous_grid();  // nothing global before this (common.cuh)
    allow_next_grid();

    // Scheduling units: CTAs, or clusters that take each job together (scheduler/grid.cuh).
    int const rank = kSplitN1 ? int(cute::block_rank_in_cluster()) : 0;
    int const units = int(gridDim.x) / C.cluster_n1, unit = int(blockIdx.x) / C.cluster_n1;
    int const stride = units * C.jobs_per_unit();
    if (wg == 0) {
      warpgroup_reg_dealloc<Sm90::kProducerRegs>();
      int const w = t / 32;  // the ring this warp feeds
      if (w < kRings && t % 32 == 0) {
        State st = RingT::producer_start();
        int x_jobs = 0;  // jobs whose X this ring loaded (resident X)
        typename Mainloop::PendingGemm2 pending;  // chained jobs: the last job's last GEMM2
        for (int j = unit * C.jobs_per_unit() + w;; j += stride) {
          B2bJob const job = b2b_job(C, j, p.batches, p.M, p.N, units);
          if (job.done) break;
          if (!job.valid) continue;  // as the consumer: an empty half of a causal pair
          int const my_chunks = b2b_rank_chunks(C, b2b_chunks(C, job.m_block, p.M, p.N1), rank);
          Mainloop::load_job(p, ss.bars[w], st, ss.ring[w], job.m_block * C.job_rows(), job.n2_block * C.tile_n2,
                             packed_batch_coord(p, job.batch), my_chunks, x_jobs, pending,
                             [&](int i) { return (rank + i * C.cluster_n1) * C.chunk_n1; });
        }
        Mainloop::flush(p, ss.bars[w], st, ss.ring[w], pending);
      }
    } else {
      warpgroup_reg_alloc<Sm90::kConsumerRegs>();
      int const cw = wg - 1;
      int const half = kPaired ? cw : 0;  // the warp group's rows of its jobs
      PerWG& mine = ss.wg[cw];
      typename Mainloop::SharedStorage& slots = ss.ring[kPaired ? 0 : cw];
      typename RingT::Storage& ring = ss.bars[kPaired ? 0 : cw];
      int const bar_id = barrier_id(NamedBarrier::EpilogueWG0, cw);
      // Ordered turns (paired): a turn issues GEMM2 of a chunk and GEMM1 of the next, then hands
      // the tensor cores to the other warp group, which ran F meanwhile (the paper's stagger;
      // NamedBarrier::MmaTurnWG0/1 as the single-GEMM PingPong), where B2bConfig::ordered_turns.
      bool const ordered = C.ordered_turns(p.K);
      auto wait_mma_turn = [&] {
        if (ordered) named_sync(barrier_id(NamedBarrier::MmaTurnWG0, cw), 2 * kWarpGroupThreads);
      };
      auto pass_mma_turn = [&] {
        if (ordered) named_arrive(barrier_id(NamedBarrier::MmaTurnWG0, 1 - cw), 2 * kWarpGroupThreads);
      };
      if (cw == 1) pass_mma_turn();  // consumer 0 goes first
      State rd = RingT::consumer_start();
      typename RingT::Taken taken;
      F f;
      Epi2 epi2;
      Xfer xfer;
      typename Mainloop::FragP P, P3;
      typename Mainloop::FragS S;
      typename Mainloop::FragO O;
      int traced = 0;  // this warp group's jobs so far (the trace's job index)
      trace::reset_sums(t, cw);
      int x_jobs = 0;  // jobs whose resident X it read
      // Chained jobs (B2bConfig::chain_jobs): the previous job whose last GEMM2 is not issued yet,
      // its epilogue's view, whether that GEMM2 starts O (a job of one chunk), its row sums'
      // inverses (taken before this job's first chunk replaces them) and its trace index.
      bool pending = false, pending_first = false;
      epi::EpiCtx pending_c2{&p, 0, 0, p.N, t, t / 32, t % 32};
      typename F::RowFactors pending_inv{};
      int pending_job = 0;
      if constexpr (C.chain_jobs) {  // the first job's turn multiplies S = 0 (first_chunk_chained)
        CUTE_UNROLL
        for (int k = 0; k < cute::size(S); ++k) S(k) = typename decltype(S)::value_type(0.f);
      }
      // turn: the warp group's slots so far, alike in every CTA of a cluster (whose owner turns).
      for (int j = unit * C.jobs_per_unit() + (kPaired ? 0 : cw), turn = 0;; j += stride, ++turn) {
        B2bJob const job = b2b_job(C, j, p.batches, p.M, p.N, units);
        if (job.done) break;
        if (!job.valid) continue;  // an empty half of a causal pair (scheduler/grid.cuh)
        trace::mark(t, cw, traced, trace::kTurn);
        int const m0 = job.m_block * C.job_rows() + half * C.tile_m;
        int const my_chunks = b2b_rank_chunks(C, b2b_chunks(C, job.m_block, p.M, p.N1), rank);
        uint32_t const owner_rank = uint32_t(turn % C.cluster_n1);  // 0 unless N1 is split
        bool const owner = owner_rank == uint32_t(rank);
        epi::EpiCtx c2{&p, m0, job.n2_block * C.tile_n2, p.N, t, t / 32, t % 32};
        c2.batch = job.batch;
        c2.job = traced;
        // Epi2's tile inputs (a residual) go to L2 while the chunks run.
        if constexpr (Epi2::kRootLoads)
          if (owner) epi2.prefetch(c2, epi2_storage(mine));
        if constexpr (C.chain_jobs)
          if (pending) pending_inv = f.inverse_sums();
        f.start_job();
        // The wgmma register operands (O, the accumulator GEMM2 reads back; S, its A operand)
        // get their last definition before a wgmma here, in warp-group-uniform code: written
        // last inside F's or Epi2's branches, ptxas puts its warpgroup arrive there and
        // serializes every wgmma of the kernel (C7520).
        if constexpr (kSplitN1) {  // a CTA of the cluster may have no chunk of this job
          CUTE_UNROLL
          for (int i = 0; i < cute::size(O); ++i) O(i) = 0.f;
        }
        cute::warpgroup_fence_operand(O);
        // F's view of chunk i: its N1 columns.
        auto chunk_ctx = [&](int i) {
          epi::EpiCtx c1{&p, m0, (rank + i * C.cluster_n1) * C.chunk_n1, p.N1, t, t / 32, t % 32};
          c1.batch = job.batch;
          return c1;
        };
        // Resident X: wait for the job's, free it once the job's last GEMM1 completed.
        int const xbuf = RingT::x_buffer(x_jobs);
        if constexpr (Mainloop::kXResident)
          if (my_chunks > 0) RingT::wait_x(ring, x_jobs);
        auto gemm1_done = [&](int i) {
          if constexpr (Mainloop::kXResident)
            if (i == my_chunks - 1) RingT::release_x(ring, x_jobs, t), ++x_jobs;
        };
        if constexpr (C.f_beside_gemm2) {
          // GEMM1 of chunk i and GEMM2 of chunk i - 1 in one turn on the tensor cores; F of chunk
          // i between GEMM1's completion and GEMM2's (B2bConfig::f_beside_gemm2): the chunk's
          // exponentials in place in P (GEMM1's, complete), S rewritten only once GEMM2, which
          // reads it, completed. Chunk 0 is peeled: a straight-line loop body whose commit groups
          // ptxas counts (else it serializes every wgmma).
          // gemm2_done(): once the GEMM2 in flight completed, before S is rewritten (chained: the
          // previous job's O finished and stored there).
          auto f_chunk = [&](int i, auto&& gemm2_done) {
            unsigned long long const since = trace::now();
            f.scores(chunk_ctx(i), f_storage(mine), bar_id, P, P3, i == 0);
            f.exps(P, [&](int k, float e) { P(k) = e; });  // (exps reads P(k) before it writes it)
            // GEMM2 of chunk i - 1 done before O's rescale and S's rewrite. The waits sit in the
            // branch and after it, blocks that start after the exponentials (ptxas moves a wait
            // to the start of its block: ahead of them, were it before the branch).
            if (f.rescales_o()) {
              taken.all_completed(ring, t);
              f.rescale(O);
            }
            taken.all_completed(ring, t);
            gemm2_done();
            CUTE_UNROLL
            for (int k = 0; k < cute::size(P); ++k) S(k) = typename decltype(S)::value_type(P(k));
            cute::warpgroup_fence_operand(S);
            cute::warpgroup_fence_operand(O);
            trace::add_stage(t, cw, trace::kF, since);
          };
          auto nothing = [] {};
          // Chunk 0 alone in its turn on the tensor cores.
          auto first_chunk = [&] {
            unsigned long long const since = trace::now();
            wait_mma_turn();
            Mainloop::template gemm1<true>(p, ring, rd, taken, slots, P, P3, half, t, xbuf);
            pass_mma_turn();
            taken.all_completed(ring, t);
            gemm1_done(0);
            trace::add_stage(t, cw, trace::kGemm1, since);
            f_chunk(0, nothing);
          };
          // Chained: chunk 0 in one turn with the previous job's last GEMM2, and F of chunk 0
          // beside it; that job's O is finished and stored once the GEMM2 completed. A warp
          // group's first job has no previous one: its turn issues a GEMM2 of S = 0 all the same
          // (O = 0, the W2 k-blocks the producer loads for it), one straight-line turn for every
          // job, as ptxas needs to count the commit groups (a GEMM2 issued under a runtime
          // condition serializes every wgmma, C7514; two copies of the turn let it hoist
          // GEMM2's wait ahead of the exponentials).
          auto first_chunk_chained = [&] {
            unsigned long long const since = trace::now();
            wait_mma_turn();
            Mainloop::template gemm1<true>(p, ring, rd, taken, slots, P, P3, half, t, xbuf);
            Mainloop::template gemm2<true>(ring, rd, taken, slots, S, O, pending ? pending_first : true, t);
            pass_mma_turn();
            if (pending) trace::mark(t, cw, pending_job, trace::kIssued);
            taken.template completed_but<Mainloop::kGemm2Blocks>(ring, t);  // GEMM1's groups
            gemm1_done(0);
            trace::add_stage(t, cw, trace::kGemm1, since);
            // Chunk 0 by an index neither compiler can fold (common.cuh's opaque_zero): F's
            // rescale branch (never taken at a job's first chunk) then stays, and with it the
            // block boundary that keeps GEMM2's wait after the exponentials (folded, ptxas
            // hoists the wait ahead of them, into the row maxima). Trace: this turn's kGemm1
            // holds the previous job's GEMM2 issue, this chunk's kF that job's Epi2.
            f_chunk(opaque_zero(), [&] {
              if (!pending) return;
              trace::mark(t, cw, pending_job, trace::kAccReady);
              F::divide(O, pending_inv);
              epi2.run(pending_c2, epi2_storage(mine), O, bar_id);
              trace::mark(t, cw, pending_job, trace::kEpiDone);
            });
            pending = false;
          };
          if (my_chunks > 0) {
            unsigned long long since;
            if constexpr (C.chain_jobs) first_chunk_chained();
            else first_chunk();
            for (int i = 1; i < my_chunks; ++i) {
              since = trace::now();
              wait_mma_turn();
              Mainloop::template gemm1<true>(p, ring, rd, taken, slots, P, P3, half, t, xbuf);
              Mainloop::template gemm2<true>(ring, rd, taken, slots, S, O, i == 1, t);
              pass_mma_turn();
              taken.template completed_but<Mainloop::kGemm2Blocks>(ring, t);  // GEMM1's groups
              gemm1_done(i);
              trace::add_stage(t, cw, trace::kGemm1, since);
              f_chunk(i, nothing);
            }
            // Chained, its last GEMM2 goes with the next job's first GEMM1. (A job of no chunk
            // cannot come here: one CTA per job walks every chunk, and N1 > 0.)
            if constexpr (C.chain_jobs) {
              pending = true, pending_first = my_chunks == 1, pending_c2 = c2, pending_job = traced++;
              continue;
            }
            since = trace::now();
            wait_mma_turn();
            Mainloop::template gemm2<true>(ring, rd, taken, slots, S, O, my_chunks == 1, t);
            pass_mma_turn();
            trace::add_stage(t, cw, trace::kGemm2Issue, since);
          }
        } else {
          for (int i = 0; i < my_chunks; ++i) {
            unsigned long long since = trace::now();
            if (i == 0) wait_mma_turn();
            Mainloop::gemm1(p, ring, rd, taken, slots, P, P3, half, t, xbuf);  // behind GEMM2 of chunk i - 1
            pass_mma_turn();
            taken.all_completed(ring, t);  // F reads P and rewrites S (and rescales O)
            gemm1_done(i);
            trace::add_stage(t, cw, trace::kGemm1, since);
            since = trace::now();
            f.apply(chunk_ctx(i), f_storage(mine), bar_id, P, P3, S, O, i == 0);
            trace::add_stage(t, cw, trace::kF, since);
            since = trace::now();
            cute::warpgroup_fence_operand(S);
            cute::warpgroup_fence_operand(O);
            wait_mma_turn();
            Mainloop::gemm2(ring, rd, taken, slots, S, O, i == 0, t);
            if (i == my_chunks - 1) pass_mma_turn();
            trace::add_stage(t, cw, trace::kGemm2Issue, since);
          }
        }
        trace::mark(t, cw, traced, trace::kIssued);
        taken.all_completed(ring, t);
        trace::mark(t, cw, traced, trace::kAccReady);
        if constexpr (kSplitN1) {
          if (!owner) {
            xfer.send(xfer_storage(mine), O, f.stats(), owner_rank, t);
            trace::mark(t, cw, traced++, trace::kEpiDone);
            continue;
          }
          xfer.receive(xfer_storage(mine), O, f.stats(), owner_rank, t,
                       [&](float4 const (&st)[C.cluster_n1], float (&alpha)[C.cluster_n1][2]) { f.merge(st, alpha); });
        }
        f.finish(O);
        epi2.run(c2, epi2_storage(mine), O, bar_id);
        trace::mark(t, cw, traced++, trace::kEpiDone);
      }
      if constexpr (C.chain_jobs) {  // the warp group's last job: its last GEMM2 alone
        if (pending) {
          unsigned long long const since = trace::now();
          wait_mma_turn();
          Mainloop::template gemm2<true>(ring, rd, taken, slots, S, O, pending_first, t);
          pass_mma_turn();
          trace::add_stage(t, cw, trace::kGemm2Issue, since);
          trace::mark(t, cw, pending_job, trace::kIssued);
          taken.all_completed(ring, t);
          trace::mark(t, cw, pending_job, trace::kAccReady);
          f.finish(O);
          epi2.run(pending_c2, epi2_storage(mine), O, bar_id);
          trace::mark(t, cw, pending_job, trace::kEpiDone);
        }
      }
      if (t == 0) tma_store_wait_all<0>();
    }
    // No CTA leaves while a peer may still read its partial O or arrive on its barriers.
    if constexpr (kSplitN1) cute::cluster_sync();
  }
};

}  // namespace comfuse::b2b
