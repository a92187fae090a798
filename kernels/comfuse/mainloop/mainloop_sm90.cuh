// comfuse/mainloop/mainloop_sm90.cuh: the TMA + wgmma mainloop of one CTA tile.
//
// SMEM ring: Stages slots, each one BM x 64 tile of A and one BN x 64 tile of B (64 =
// one 128-byte swizzle atom of a 16-bit type), guarded by CUTLASS's PipelineTmaAsync
// (full barrier: TMA transaction bytes; empty barrier: one arrival per consumer warp
// group of every CTA whose TMA multicasts into the slot). With KernelConfig::ring_input_bytes a
// tile's k-blocks are followed by one slot of the epilogue's tile inputs (load_slot, slot_box).
//
// Producer (one thread): per k-block, waits for the slot to be empty, then loads
//   A: M x K, K-major. With ClusterN > 1 the BM rows are cut into ASlices slices of
//      >= 8 rows; the CTA of rank r < ASlices along N loads slice r and multicasts it to every
//      CTA of its cluster row (all of them need the same rows: the scheduler guarantees it).
//   B: N x K (K-major, one box {64, BN}) or K x N (N-major, BN/64 boxes {64, 64}).
//   Gated (KernelConfig::gated): the slot's B tile is BN = 2 x tile_n rows, the first tile_n
//      from B, the rest from B3 (Params::tma_b3) at the same columns n0.. (b_source); the
//      multicast slices and boxes of the whole tile each fall in one half.
// Consumers: WGsPerTile == 1 (PingPong): one warp group computes the whole BM x BN tile
//   (BM/64 wgmma m64nBNk16 per k16 step). WGsPerTile == 2 (Cooperative): BM == 128, both
//   consumer warp groups work on the same tile, 64 rows each. Either way a consumer waits for the slot, issues the wgmmas of the k-block,
//   keeps one k-block in flight, and releases the slot of the previous k-block.
// Cooperative with BM == 256 (2 x 128 rows, cuBLAS's favourite shape): each consumer WG runs
//   its one-warp-group wgmmas on its contiguous half of the A tile (rows 128*wg..), so a
//   WG's accumulators always cover BM/WGsPerTile contiguous rows.
// The wgmma operands (SMEM descriptors, accumulator fragment) come from wgmma.cuh, written out
// rather than derived by CuTe's TiledMMA partitioning: same SASS, half the JIT compile time.
// ClusterM (default 1): clusters of ClusterM CTAs along M share the B tile: CTA rank r <
//   BSlices loads slice r of B and multicasts it to the cluster (the TMA box of B is then
//   BN / BSlices rows when B is N x K; with K x N, rank r loads the 64-column boxes r, r +
//   ClusterM, ...). Both ClusterM and ClusterN > 1 (a 2-D cluster, for a row reduction over
//   DSMEM along N): CTA (rank_m, rank_n), cluster rank rank_m + ClusterM * rank_n, multicasts
//   its A slice to the CTAs of its rank_m and its B slice to those of its rank_n.
// MmaDepth (default 1): k-blocks of wgmma a consumer leaves in flight when it waits
//   (warpgroup_wait<MmaDepth>); the slot of k-block kt - MmaDepth is released then.
// SMEM traffic per k-block is what separates them: TMA writes (BM + BN) * 64 * 2 bytes per
// BM * BN * 64 MACs, so the 128 x 256 cooperative tile fills SMEM at 0.6x the rate of a
// 128 x 128 or 64 x 256 PingPong tile.
#pragma once
#include "../common.cuh"
#include "../params.cuh"
#include "wgmma.cuh"

namespace comfuse {

// The configuration is the kernel's (config.cuh); check() has validated it.
template <class Element_, KernelConfig C>
struct MainloopSm90 {
  using Element = Element_;
  static constexpr bool BKMajor = C.b_kmajor;  // B is N x K (PyTorch Linear weight)
  // BN: the B tile's and the accumulator's columns (C.mma_n(): both halves of a gated tile);
  // TileN: the output columns a tile covers (its column origin is n_block * TileN).
  static constexpr int BM = C.tile_m, BN = C.mma_n(), TileN = C.tile_n, BK = 128 / int(sizeof(Element)),
                       Stages = C.ring_stages;
  static constexpr int ClusterN = C.cluster_n;
  static constexpr int WGsPerTile = C.wgs_per_tile;
  static constexpr int ClusterM = C.cluster_m;
  static constexpr int MmaDepth = C.mma_depth;
  static constexpr int kConsumerThreads = WGsPerTile * 128;  // threads that consume one k-block
  static constexpr int WGRows = C.epi_rows();                // rows of one consumer WG's accumulators
  static_assert(sizeof(Element) == Sm90::kAbBytes && BK == Sm90::kTileK, "16-bit inputs (bf16, fp16)");

  // A slices for the multicast: each >= 8 rows (one swizzle atom), so slices start on
  // 1024-byte boundaries; B slices likewise along M.
  static constexpr int ASlices = C.a_slices();
  static constexpr int ASliceRows = BM / ASlices;
  static constexpr int BSlices = C.b_slices();  // K-major B multicast slices
  static constexpr int BSliceRows = BN / BSlices;
  static constexpr uint32_t kTxBytes = uint32_t((BM + BN) * BK * sizeof(Element));

  static constexpr auto MajorB = BKMajor ? wgmma::Major::K : wgmma::Major::MN;
  using MmaOp = decltype(cute::GMMA::ss_op_selector<Element, Element, float,
                         cute::Shape<cute::_64, cute::Int<BN>, cute::Int<BK>>,
                         cute::GMMA::Major::K, MajorB>());
  // One warp group's MMA; a cooperative WG applies it to its own WGRows rows of A.
  using MmaTraits = cute::MMA_Traits<MmaOp>;
  using Frags = wgmma::SsFragments<WGRows, BM, BN, Stages, MajorB>;

  // A tile's K-splits in one hardware cluster (KernelConfig::splits_in_cluster) share no slot, so
  // a consumer's release must stay in its CTA: CUTLASS's pipeline with a cluster shape of 1
  // arrives on cluster rank 0's empty barrier, right only where the hardware cluster is one CTA.
  struct CtaLocalPipeline : cutlass::PipelineTmaAsync<Stages> {
    using Base = cutlass::PipelineTmaAsync<Stages>;
    typename Base::EmptyBarrier* empty;
    template <class ClusterShape_>
    COMFUSE_DEVICE CtaLocalPipeline(typename Base::SharedStorage& s, typename Base::Params p, ClusterShape_ cs)
        : Base(s, p, cs), empty(&s.empty_barrier_[0]) {}
    COMFUSE_DEVICE void consumer_release(typename Base::PipelineState st) { empty[st.index()].arrive(); }
  };
  using Pipeline = cute::conditional_t<C.splits_in_cluster, CtaLocalPipeline, cutlass::PipelineTmaAsync<Stages>>;
  using PipelineState = typename cutlass::PipelineTmaAsync<Stages>::PipelineState;
  using ClusterShape = cute::Shape<cute::Int<ClusterM>, cute::Int<ClusterN>, cute::_1>;

  struct SharedStorage {
    alignas(1024) Element A[BM * BK * Stages];
    alignas(1024) Element B[BN * BK * Stages];
  };

  // Accumulator registers of one thread: WGRows*BN/128 floats; register i of m64-block mi
  // holds row 64*mi (+ WGRows*wg when cooperative) + 16*warp + lane/4 + 8*((i>>1)&1),
  // column 8*(i>>2) + 2*(lane%4) + (i&1).
  using FragC = typename Frags::FragC;

  static COMFUSE_DEVICE int k_tiles(Params const& p) { return (p.K + BK - 1) / BK; }

  // The CTAs that receive this CTA's A slice (its cluster row: the same rank_m, every rank_n)
  // and its B slice (its cluster column: the same rank_n, every rank_m).
  static constexpr COMFUSE_HOST_DEVICE uint16_t a_multicast_mask(int rank_m) {
    uint32_t mask = 0;
    for (int n = 0; n < ClusterN; ++n) mask |= 1u << (rank_m + ClusterM * n);
    return uint16_t(mask);
  }
  static constexpr COMFUSE_HOST_DEVICE uint16_t b_multicast_mask(int rank_n) {
    uint32_t mask = 0;
    for (int m = 0; m < ClusterM; ++m) mask |= 1u << (m + ClusterM * rank_n);
    return uint16_t(mask);
  }

  // ---- producer: one thread issues every TMA load of a tile -------------------------
  // B's rows [r0, r0 + rows) of the slot's tile (r0 a multiple of the box; a gated tile's rows
  // from tile_n on are B3's): which descriptor and which of its rows or columns.
  static COMFUSE_DEVICE TmaDesc const* b_source(Params const& p, int n0, int r0, int& row) {
    if constexpr (C.gated)
      if (r0 >= TileN) {
        row = n0 + r0 - TileN;
        return &p.tma_b3;
      }
    row = n0 + r0;
    return &p.tma_b;
  }
  // Every box of B's k-block at column k0 that this CTA issues (its multicast slice or boxes
  // with ClusterM > 1, else the whole tile): f(desc, crd0, crd1, r0), r0 the box's first row of
  // the slot's B tile. (An L2 prefetch of these boxes ahead of the ring measured slower at every
  // shape tried, M = 1 to 8192: bench/NOTES.md Stop 35.)
  template <class F>
  static COMFUSE_DEVICE void for_each_b_box(Params const& p, int n0, int rank_m, int k0, F&& f) {
    int row = 0;
    if constexpr (ClusterM > 1) {
      if constexpr (BKMajor) {
        if (rank_m < BSlices) f(b_source(p, n0, rank_m * BSliceRows, row), k0, row, rank_m * BSliceRows);
      } else {
        CUTE_UNROLL
        for (int nb = 0; nb < BN / 64; ++nb)
          if (nb % ClusterM == rank_m) f(b_source(p, n0, nb * 64, row), row, k0, nb * 64);
      }
    } else if constexpr (BKMajor) {
      f(&p.tma_b, k0, n0, 0);
      if constexpr (C.gated) f(&p.tma_b3, k0, n0, TileN);
    } else {
      CUTE_UNROLL
      for (int nb = 0; nb < BN / 64; ++nb) f(b_source(p, n0, nb * 64, row), row, k0, nb * 64);
    }
  }
  static constexpr uint64_t kEvictNormal = 0x1000000000000000ull;

  // Where this CTA's B boxes go: its rank along M (the slice of a multicast it issues) and the
  // multicast mask, worked out once a tile. The one producer thread's instructions a k-block
  // pace the mainloop of 64-row tiles (a 64x128x64 k-block is ~256 tensor-core cycles at peak):
  // block_id_in_cluster (a special-register read and a float division) a k-block measured M = 256
  // LayerNorm and softmax 10-16% slower in clusters of 2 along M (bench/NOTES.md Stop 58).
  struct BIssue {
    int rank_m;
    uint16_t mask;
  };
  static COMFUSE_DEVICE BIssue b_issue(int rank) {
    return {ClusterM > 1 ? int(cute::block_id_in_cluster().x) : 0, b_multicast_mask(ClusterN > 1 ? rank : 0)};
  }

  // B's boxes of k-block k0 into slot s (the slot acquired, its barrier `bar`).
  static COMFUSE_DEVICE void load_b(Params const& p, uint64_t* bar, SharedStorage& smem, int s, int n0,
                                    BIssue const& bi, int k0) {
    Element* dstb = smem.B + s * BN * BK;
    for_each_b_box(p, n0, bi.rank_m, k0, [&](TmaDesc const* d, int c0, int c1, int r0) {
      if constexpr (ClusterM > 1)
        cute::SM90_TMA_LOAD_MULTICAST_2D::copy(d, bar, bi.mask, kEvictNormal, dstb + r0 * BK, c0, c1);
      else
        cute::SM90_TMA_LOAD_2D::copy(d, bar, kEvictNormal, dstb + r0 * BK, c0, c1);
    });
  }

  // B ahead of the previous grid (Params::b_before_wait; the producer thread, before
  // griddepcontrol.wait): acquires the first min(Stages, kt_count) slots of a tile from `state`
  // (a fresh ring: no acquire waits) and loads B's k-blocks into them. Returns how many; `load`
  // then adds A to those slots without acquiring them again.
  static COMFUSE_DEVICE int load_b_ahead(Params const& p, Pipeline& pipeline, PipelineState state,
                                         SharedStorage& smem, int n_block, int rank, int k_begin, int kt_count) {
    int const ahead = kt_count < Stages ? kt_count : Stages;
    BIssue const bi = b_issue(rank);
    for (int kt = 0; kt < ahead; ++kt) {
      pipeline.producer_acquire(state);
      load_b(p, pipeline.producer_get_barrier(state), smem, state.index(), n_block * TileN, bi, (k_begin + kt) * BK);
      ++state;
    }
    return ahead;
  }

  // k-blocks k_begin .. k_begin + kt_count - 1 of K (all of them, or a split-K share); the first
  // b_ahead of them already hold their B (load_b_ahead from the same state).
  static COMFUSE_DEVICE void load(Params const& p, Pipeline& pipeline, PipelineState& state,
                                  SharedStorage& smem, int m_block, int n_block, int rank, int k_begin, int kt_count,
                                  int b_ahead = 0) {
    int const m0 = m_block * BM, n0 = n_block * TileN;
    BIssue const bi = b_issue(rank);
    uint32_t const cta_rank = C.a_box_rows > 0 ? cute::block_rank_in_cluster() : 0;  // a special-register read, once
    auto load_a = [&](uint64_t* bar, int s, int k0) {
      if (rank >= ASlices) return;
      Element* dst = smem.A + s * BM * BK + rank * ASliceRows * BK;
      if constexpr (ClusterN > 1) {
        cute::SM90_TMA_LOAD_MULTICAST_2D::copy(&p.tma_a, bar, a_multicast_mask(bi.rank_m), kEvictNormal, dst, k0,
                                               m0 + rank * ASliceRows);
      } else {
        cute::SM90_TMA_LOAD_2D::copy(&p.tma_a, bar, kEvictNormal, dst, k0, m0);
        // A short box (KernelConfig::a_box_rows) fills fewer bytes than kTxBytes counts on.
        if constexpr (C.a_box_rows > 0)
          cutlass::arch::ClusterTransactionBarrier::complete_transaction(
              bar, cta_rank, uint32_t((BM - C.a_box_rows) * BK * sizeof(Element)));
      }
    };
    // Two loops, so the steady one's body is the plain acquire, A, B of every k-block: a
    // `kt >= b_ahead` test on each measured the small FFN's 64x64 tiles (clusters of 1) 1.3 us
    // slower (bench/NOTES.md Stop 58).
    int const ahead = b_ahead < kt_count ? b_ahead : kt_count;
    for (int kt = 0; kt < ahead; ++kt) {  // acquired, B loaded (load_b_ahead)
      load_a(pipeline.producer_get_barrier(state), state.index(), (k_begin + kt) * BK);
      ++state;
    }
    for (int kt = ahead; kt < kt_count; ++kt) {
      pipeline.producer_acquire(state);
      uint64_t* bar = pipeline.producer_get_barrier(state);
      int const s = state.index(), k0 = (k_begin + kt) * BK;
      load_a(bar, s, k0);
      load_b(p, bar, smem, s, n0, bi, k0);
      ++state;
    }
  }

  // ---- the epilogue's tile inputs in the ring (KernelConfig::ring_input_bytes) ------------
  // A slot seen as TMA boxes of BM rows x 128 bytes (each 1024-byte aligned, so the 128-byte
  // swizzle of the tile input's descriptor lands as in any box): box 0 is the slot's A part,
  // box b > 0 rows (b - 1) * BM.. of its B part.
  static COMFUSE_DEVICE void* slot_box(SharedStorage& smem, int s, int box) {
    if (box == 0) return smem.A + s * BM * BK;
    return smem.B + s * BN * BK + (box - 1) * BM * BK;
  }
  // One more slot after a tile's k-blocks (producer thread): issue(bar, s) starts TMA loads of
  // `bytes` into slot s; the slot's full barrier expects a k-block's kTxBytes (the pipeline's
  // acquire), so the difference completes here. The consumer releases the slot like a k-block,
  // to every CTA whose multicast fills it; the peers of a cluster walk the same jobs, so each
  // holds its own tile inputs in the same slot, and none refills it before all released it.
  template <class Issue>
  static COMFUSE_DEVICE void load_slot(Pipeline& pipeline, PipelineState& state, uint32_t bytes, Issue&& issue) {
    pipeline.producer_acquire(state);
    uint64_t* bar = pipeline.producer_get_barrier(state);
    issue(bar, state.index());
    if (bytes < kTxBytes)
      cutlass::arch::ClusterTransactionBarrier::complete_transaction(bar, cute::block_rank_in_cluster(), kTxBytes - bytes);
    ++state;
  }

  // ---- consumer: one warp group ------------------------------------------------------
  // Issues the whole tile's wgmmas; returns with the last MmaDepth k-blocks still in flight
  // (the caller hands the tensor cores to the other warp group, then calls mma_tail).
  // mma_thread: 0..kConsumerThreads-1; a cooperative WG takes rows WGRows*(mma_thread/128).
  static COMFUSE_DEVICE void mma(Pipeline& pipeline, PipelineState& read_state, PipelineState& release_state,
                                 SharedStorage& smem, FragC& accum, int kt_count, int mma_thread) {
    using namespace cute;
    // This WG's rows of A: a multiple of 64 rows (8 KB) in, so the 128B swizzle pattern is
    // unchanged. (MMA, MMA_M, MMA_K, PIPE) and (MMA, MMA_N, MMA_K, PIPE) descriptor tensors.
    Element const* a0 = smem.A + (mma_thread / kWarpGroupThreads) * WGRows * BK;
    Tensor tCrA = make_tensor(GMMA::DescriptorIterator{wgmma::sw128_desc<GMMA::Major::K, WGRows>(a0)},
                              typename Frags::LayoutA{});
    Tensor tCrB = make_tensor(GMMA::DescriptorIterator{wgmma::sw128_desc<MajorB, BN>(smem.B)}, typename Frags::LayoutB{});
    MmaTraits tiled_mma;

    tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
    warpgroup_fence_operand(accum);
    for (int kt = 0; kt < kt_count; ++kt) {
      pipeline.consumer_wait(read_state);
      int const s = read_state.index();
      warpgroup_arrive();
      CUTE_UNROLL
      for (int kb = 0; kb < size<2>(tCrA); ++kb) {
        wgmma::gemm(tiled_mma, tCrA(_, _, kb, s), tCrB(_, _, kb, s), accum);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      ++read_state;
      if (kt >= MmaDepth) {
        warpgroup_wait<MmaDepth>();  // k-block kt - MmaDepth is done: free its slot
        pipeline.consumer_release(release_state);
        ++release_state;
      }
    }
    warpgroup_fence_operand(accum);
  }

  // kt_count: the tile's k-block count (k-blocks still to release: min(MmaDepth, kt_count)).
  static COMFUSE_DEVICE void mma_tail(Pipeline& pipeline, PipelineState& release_state, FragC& accum,
                                      int kt_count = 1) {
    cute::warpgroup_wait<0>();
    cute::warpgroup_fence_operand(accum);
    CUTE_UNROLL
    for (int i = 0; i < MmaDepth; ++i)
      if (i < kt_count) {
        pipeline.consumer_release(release_state);
        ++release_state;
      }
  }
};

}  // namespace comfuse
