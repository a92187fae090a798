// comfuse/b2b/mainloop_b2b.cuh: the two GEMMs of a B2B kernel, for one consumer warp group.
//
// The ring (b2b/ring.cuh) is unified: every slot holds the job's X k-block (job_rows x 64: paired,
// the two warp groups' tile_m-row halves side by side) in its A region and, in its B region,
// either W1's k-block of the chunk (chunk_n1 x 64; gated: W3's beside it) or one k-block of W2
// along N1 (tile_n2 x 64). Per chunk the producer loads K/64 slots of X/W1, then chunk_n1/64
// slots of W2; the consumer takes them in the same order:
//   GEMM1  P = X W1^T (SS wgmma: both operands in SMEM), m64 x chunk_n1, fp32 in registers;
//   F      S = F(P), bf16/f16 in registers, in the layout of GEMM2's register A operand (the
//          accumulator's values of 16 columns are, in order, one k16 A fragment: no shuffle);
//   GEMM2  O += S W2^T (RS wgmma: A from registers, W2 from SMEM), m64 x tile_n2.
// X is re-read per chunk (from L2): the slot holds both so that K is not bounded by SMEM. Where K
// is short (attention's head dim: B2bConfig::x_k_blocks), X instead stays resident for the job in
// a buffer of its own, and the slots carry W1 and W2 k-blocks only.
#pragma once
#include "../common.cuh"
#include "../mainloop/wgmma.cuh"
#include "../params.cuh"
#include "ring.cuh"

namespace comfuse::b2b {

template <class Element_, B2bConfig C>
struct MainloopB2b {
  using Element = Element_;
  static constexpr int BM = C.tile_m, BN1 = C.chunk_n1, BN2 = C.tile_n2, BK = Sm90::kTileK, Stages = C.ring_stages;
  static constexpr int kWgs = C.wgs_per_job();  // consumer warp groups reading each slot
  static constexpr int kBRows = C.b_region_rows();
  static constexpr bool kXResident = C.x_k_blocks > 0;
  static constexpr int kXBlock = kWgs * BM * BK, kSlotB = kBRows * BK;  // elements: X's k-block, a B region
  // A: X's k-block in every slot, or X's resident k-blocks (in each of its buffers).
  static constexpr int kAElems = kXResident ? C.x_buffers * C.x_k_blocks * kXBlock : Stages * kXBlock;
  static_assert(sizeof(Element) == Sm90::kAbBytes, "16-bit inputs (bf16, fp16)");
  using RingT = Ring<Stages, kWgs, C.x_buffers>;
  using State = typename RingT::State;
  using Taken = typename RingT::Taken;

  struct SharedStorage {
    alignas(1024) Element A[kAElems];
    alignas(1024) Element B[Stages * kSlotB];
  };

  template <bool KMajor> static constexpr auto kMajor = KMajor ? wgmma::Major::K : wgmma::Major::MN;
  // One slot's operand tiles (a k-block: Rows x 64): K-major, or MN-major as Rows / 64 blocks of
  // 64 rows x 64 k, each one TMA box {64, 64} (8 KiB, contiguous), swizzle atoms (64 x 8)
  // along k first (wgmma.cuh describes both).
  using Mma1 = cute::MMA_Traits<decltype(cute::GMMA::ss_op_selector<Element, Element, float,
      cute::Shape<cute::Int<BM>, cute::Int<BN1>, cute::Int<BK>>, cute::GMMA::Major::K, kMajor<C.w1_kmajor>>())>;
  using Mma2 = cute::MMA_Traits<decltype(cute::GMMA::rs_op_selector<Element, Element, float,
      cute::Shape<cute::Int<BM>, cute::Int<BN2>, cute::Int<BN1>>, cute::GMMA::Major::K, kMajor<C.w2_kmajor>>())>;
  static_assert(BM == 64, "one m64 wgmma per warp group");
  using FragP = wgmma::AccumM64<BN1>;
  using FragO = wgmma::AccumM64<BN2>;
  // S as GEMM2's register A operand: ((2,2,2), 1, BN1/16) values; flat index i is the P
  // accumulator's flat index i (same rows and columns), so S(i) = F(P(i)).
  using FragS = wgmma::RegsA64<Element, BN1>;

  static constexpr uint32_t kTxGemm1 = uint32_t(((kXResident ? 0 : kWgs * BM) + C.gemm1_b_rows()) * BK * sizeof(Element));
  static constexpr uint32_t kTxGemm2 = uint32_t(BN2 * BK * sizeof(Element));
  static constexpr uint32_t kTxX = uint32_t(C.x_k_blocks * kXBlock * sizeof(Element));
  static constexpr int kGemm2Blocks = BN1 / BK;  // W2 k-blocks of a chunk
  // body(kb) for each of GEMM1's k-blocks. F beside GEMM2: unrolled over X's resident k-blocks,
  // so that ptxas counts the commit groups in flight. Else a loop over K's: with F between the
  // GEMMs, a compile-time count (even not unrolled) makes ptxas serialize every wgmma (C7514).
  template <class Body>
  static COMFUSE_DEVICE void for_k_blocks(Params const& p, Body&& body) {
    if constexpr (C.f_beside_gemm2) {
      CUTE_UNROLL
      for (int kb = 0; kb < C.x_k_blocks; ++kb) body(kb);
    } else {
      int const kb_count = (p.K + BK - 1) / BK;
      for (int kb = 0; kb < kb_count; ++kb) body(kb);
    }
  }
  // X's k-block kb for the warp group's half of the job, in slot `index` or resident in buffer
  // `xbuf` (RingT::x_buffer of the job).
  static COMFUSE_DEVICE Element* x_block(SharedStorage& s, int index, int kb, int xbuf = 0) {
    return s.A + (kXResident ? xbuf * C.x_k_blocks + kb : index) * kXBlock;
  }

  // ---- producer: one thread per consumer warp group --------------------------------------
  // `batch`: the job's packed_batch_coord (params.cuh), both coordinates in one register.
  template <class Desc>
  static COMFUSE_DEVICE void tma(Desc const* d, uint64_t* bar, uint64_t hint, Element* dst, int c0, int c1, int batch) {
    if constexpr (C.batched) {
      BatchCoord const b = unpacked_batch_coord(batch);
      cute::SM90_TMA_LOAD_4D::copy(d, bar, hint, dst, c0, c1, b.head, b.outer);
    } else {
      cute::SM90_TMA_LOAD_2D::copy(d, bar, hint, dst, c0, c1);
    }
  }
  // The operand tile of `Rows` rows (output dim) x 64 (k) at (row0, k0) of a K-major (row0 along
  // the rows, k0 along the contiguous columns) or MN-major tensor (k0 along the rows).
  template <int Rows, bool KMajor>
  static COMFUSE_DEVICE void load_tile(TmaDesc const* d, uint64_t* bar, uint64_t hint, Element* dst, int row0, int k0,
                                       int batch) {
    if constexpr (KMajor) {
      tma(d, bar, hint, dst, k0, row0, batch);
    } else {
      CUTE_UNROLL
      for (int j = 0; j < Rows / 64; ++j) tma(d, bar, hint, dst + j * 64 * BK, row0 + j * 64, k0, batch);
    }
  }

  static constexpr uint64_t kEvictNormal = 0x1000000000000000ull;
  // X's k-blocks kb of the job's halves into `dst` (a slot's A region, or the resident buffer).
  // Rows past M (a ragged job, or a pair's second half past the end) arrive as zeros (TMA's fill).
  static COMFUSE_DEVICE void load_x_block(Params const& p, uint64_t* bar, Element* dst, int m0, int kb, int batch) {
    CUTE_UNROLL
    for (int h = 0; h < kWgs; ++h) tma(&p.tma_a, bar, kEvictNormal, dst + h * BM * BK, kb * BK, m0 + h * BM, batch);
  }
  // Resident X: the job's X, once (`job`: the ring's jobs with X so far).
  static COMFUSE_DEVICE void load_x(Params const& p, typename RingT::Storage& ring, SharedStorage& s, int m0, int batch,
                                    int job) {
    uint64_t* bar = RingT::acquire_x(ring, job, kTxX);
    CUTE_UNROLL
    for (int kb = 0; kb < C.x_k_blocks; ++kb) load_x_block(p, bar, x_block(s, 0, kb, RingT::x_buffer(job)), m0, kb, batch);
  }
  // GEMM1's slots of a chunk: K/64 W1 (/W3) k-blocks, each with X's beside it unless resident.
  static COMFUSE_DEVICE void load_gemm1(Params const& p, typename RingT::Storage& ring, State& st, SharedStorage& s,
                                        int m0, int n1_0, int batch) {
    for_k_blocks(p, [&](int kb) {
      uint64_t* bar = RingT::acquire(ring, st, kTxGemm1);
      Element* b = s.B + st.index * kSlotB;
      if constexpr (!kXResident) load_x_block(p, bar, x_block(s, st.index, kb), m0, kb, batch);
      load_tile<BN1, C.w1_kmajor>(&p.tma_b, bar, kEvictNormal, b, n1_0, kb * BK, batch);
      if constexpr (C.gated) load_tile<BN1, C.w1_kmajor>(&p.tma_b3, bar, kEvictNormal, b + BN1 * BK, n1_0, kb * BK, batch);
      st.advance();
    });
  }
  // GEMM2's slots of a chunk: BN1/64 W2 k-blocks.
  static COMFUSE_DEVICE void load_gemm2(Params const& p, typename RingT::Storage& ring, State& st, SharedStorage& s,
                                        int n1_0, int n2_0, int batch) {
    CUTE_UNROLL
    for (int kb = 0; kb < kGemm2Blocks; ++kb) {
      uint64_t* bar = RingT::acquire(ring, st, kTxGemm2);
      load_tile<BN2, C.w2_kmajor>(&p.tma_b2, bar, kEvictNormal, s.B + st.index * kSlotB, n2_0, n1_0 + kb * BK, batch);
      st.advance();
    }
  }
  // Chained jobs (B2bConfig::chain_jobs): the previous job's last chunk, whose W2 k-blocks follow
  // the next job's first GEMM1 k-blocks (or end the producer's work); before the first job, that
  // job's own first W2 k-blocks, for the consumer's GEMM2 of S = 0 in the same turn.
  struct PendingGemm2 {
    int n1_0 = -1, n2_0 = 0, batch = 0;  // n1_0 < 0: none
  };
  static COMFUSE_DEVICE void flush(Params const& p, typename RingT::Storage& ring, State& st, SharedStorage& s,
                                   PendingGemm2& q) {
    if (q.n1_0 >= 0) load_gemm2(p, ring, st, s, q.n1_0, q.n2_0, q.batch);
    q.n1_0 = -1;
  }
  // A job's chunks, in the order the consumer takes their slots: each chunk's GEMM1 then its
  // GEMM2, or (F beside GEMM2) GEMM1 of chunk c before GEMM2 of chunk c - 1, and chained, the
  // previous job's last GEMM2 after this job's first GEMM1 (`pending`). chunk_n1(i): the first N1
  // column of the CTA's i-th chunk.
  template <class ChunkN1>
  static COMFUSE_DEVICE void load_job(Params const& p, typename RingT::Storage& ring, State& st, SharedStorage& s,
                                      int m0, int n2_0, int batch, int chunks, int& x_jobs, PendingGemm2& pending,
                                      ChunkN1&& chunk_n1) {
    if (chunks == 0) return;
    if constexpr (kXResident) load_x(p, ring, s, m0, batch, x_jobs++);
    if constexpr (C.f_beside_gemm2) {
      load_gemm1(p, ring, st, s, m0, chunk_n1(0), batch);
      if constexpr (C.chain_jobs) {  // the first job's turn takes W2 k-blocks too (any: S = 0 there)
        if (pending.n1_0 < 0) pending = PendingGemm2{chunk_n1(0), n2_0, batch};
        flush(p, ring, st, s, pending);
      }
      for (int i = 1; i < chunks; ++i) {
        load_gemm1(p, ring, st, s, m0, chunk_n1(i), batch);
        load_gemm2(p, ring, st, s, chunk_n1(i - 1), n2_0, batch);
      }
      if constexpr (C.chain_jobs) pending = PendingGemm2{chunk_n1(chunks - 1), n2_0, batch};
      else load_gemm2(p, ring, st, s, chunk_n1(chunks - 1), n2_0, batch);
    } else {
      for (int i = 0; i < chunks; ++i) {
        load_gemm1(p, ring, st, s, m0, chunk_n1(i), batch);
        load_gemm2(p, ring, st, s, chunk_n1(i), n2_0, batch);
      }
    }
  }

  // ---- consumer: one warp group -----------------------------------------------------------
  // GEMM1 of a chunk: P (and P3) = X W1^T (W3^T) over K, for the warp group's half `half` of
  // the job's rows (0 unless paired), X resident in buffer `xbuf`. Returns with the last
  // k-block's wgmmas in flight; every
  // earlier slot (GEMM2's of the previous chunk too) is released. Deferred: nothing waited for or
  // released (the caller does, after GEMM2 of the previous chunk is issued behind it).
  template <bool Deferred = false, class FP>
  static COMFUSE_DEVICE void gemm1(Params const& p, typename RingT::Storage& ring, State& rd, Taken& taken,
                                   SharedStorage& s, FP& P, FP& P3, int half, int t, int xbuf = 0) {
    using namespace cute;
    Mma1 mma;
    mma.accumulate_ = GMMA::ScaleOut::Zero;
    warpgroup_fence_operand(P);
    if constexpr (C.gated) warpgroup_fence_operand(P3);
    for_k_blocks(p, [&](int kb) {
      RingT::wait(ring, rd);
      Tensor tX = wgmma::kblock_descs<wgmma::Major::K, BM>(x_block(s, rd.index, kb, xbuf) + half * BM * BK);
      Tensor tW = wgmma::kblock_descs<kMajor<C.w1_kmajor>, BN1>(s.B + rd.index * kSlotB);
      warpgroup_arrive();
      auto acc_flag = mma.accumulate_;
      CUTE_UNROLL
      for (int k = 0; k < size<2>(tX); ++k) {
        wgmma::gemm(mma, tX(_, _, k), tW(_, _, k), P);
        mma.accumulate_ = GMMA::ScaleOut::One;
      }
      if constexpr (C.gated) {
        Tensor tW3 = wgmma::kblock_descs<kMajor<C.w1_kmajor>, BN1>(s.B + rd.index * kSlotB + BN1 * BK);
        mma.accumulate_ = acc_flag;
        CUTE_UNROLL
        for (int k = 0; k < size<2>(tX); ++k) {
          wgmma::gemm(mma, tX(_, _, k), tW3(_, _, k), P3);
          mma.accumulate_ = GMMA::ScaleOut::One;
        }
      }
      warpgroup_commit_batch();
      rd.advance();
      if constexpr (Deferred) taken.issued();
      else taken.completed_but_one(ring, t);
    });
    warpgroup_fence_operand(P);
    if constexpr (C.gated) warpgroup_fence_operand(P3);
  }

  // GEMM2 of a chunk: O (+)= S W2^T over the chunk's N1 columns; `first`: O starts at 0.
  // Returns with the last k-block's wgmmas in flight, as gemm1 (Deferred: as gemm1's).
  template <bool Deferred = false, class FS, class FO>
  static COMFUSE_DEVICE void gemm2(typename RingT::Storage& ring, State& rd, Taken& taken, SharedStorage& s,
                                   FS const& S, FO& O, bool first, int t) {
    using namespace cute;
    Mma2 mma;
    mma.accumulate_ = first ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
    warpgroup_fence_operand(O);
    CUTE_UNROLL
    for (int kb = 0; kb < kGemm2Blocks; ++kb) {
      RingT::wait(ring, rd);
      Tensor tW = wgmma::kblock_descs<kMajor<C.w2_kmajor>, BN2>(s.B + rd.index * kSlotB);
      warpgroup_arrive();
      CUTE_UNROLL
      for (int k = 0; k < size<2>(tW); ++k) {
        wgmma::gemm(mma, S(_, _, kb * size<2>(tW) + k), tW(_, _, k), O);
        mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      rd.advance();
      if constexpr (Deferred) taken.issued();
      else taken.completed_but_one(ring, t);
    }
    warpgroup_fence_operand(O);
  }
};

}  // namespace comfuse::b2b
