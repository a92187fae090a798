// comfuse/b2b/intermediate.cuh: F, the intermediate epilogue of a B2B kernel, which turns GEMM1's
// accumulator P (per chunk of N1) into GEMM2's register operand S.
//
//   ElementwiseF<Stage>   F is a Stage-Stream stage (epilogue/stage.cuh) without reductions,
//                         ending in ToOperand: FFN's gelu(P + b1), SwiGLU's silu(P) * P3
//                         (GateEntry reads P3). Its nodes' vectors are the chunk's columns.
//   OnlineSoftmaxF<Stage> F is softmax over all of N1 of a Stage-Stream prologue x (the scaled,
//                         maybe masked scores): no chunk sees the whole row, so the row max and
//                         sum run along the chunks (online softmax): per chunk m' = max(m, max x),
//                         O and l scaled by exp(m - m'), S = exp(x - m'), l += sum S; after the
//                         last chunk O /= l. Exactly softmax(x) W2^T, in one pass over N1.
#pragma once
#include "../epilogue/stage.cuh"

namespace comfuse::b2b {

// The prologue/F stage over one chunk: begin() (the chunk's vectors), then every fragment
// through visit_nodes; f(base, col, values of the ToOperand node) per fragment (base: its first
// flat index in P; col: the column of N1 its element 0 is in).
template <class Stage, class Geo>
struct ChunkStage {
  using Exec = typename Stage::template Exec<Geo>;
  // visit_nodes gets no partner below (Φ keeps per-segment epilogues out of B2B pairs).
  static_assert(!Exec::kHasRotate, "ComFuse: rotate_half in a B2B kernel's F");
  using SharedStorage = typename Exec::SharedStorage;
  static constexpr int kOut = Stage::kNumNodes - 1;
  Exec exec;

  static COMFUSE_DEVICE void init(SharedStorage& ss) { Exec::init_shared(ss); }

  template <class FP, class F>
  COMFUSE_DEVICE void stream(epi::EpiCtx c, SharedStorage& ss, int bar_id, FP const& P, FP const& P3, F&& f) {
    // A stage that keeps nothing in SMEM (attention's scale and mask) needs neither of
    // begin_phase's warp-group barriers: its begin() only fills registers.
    if constexpr (Exec::kTreeHasStorage) exec.begin_phase(c, Exec::tree_of(ss), bar_id);
    else exec.begin_nodes(c, Exec::tree_of(ss));
    CUTE_UNROLL
    for (int s = 0; s < Geo::SubTiles; ++s)
      CUTE_UNROLL
      for (int j = 0; j < 4; ++j) {
        epi::FragCoord fc;
        fc.sub_col = j * 16 + 2 * (c.lane % 4);
        fc.col = s * 64 + fc.sub_col;
        fc.col0 = s * 64 + j * 16;
        fc.row = accum_row(c.t, 0, 0);
        fc.mi = 0;
        int const base = 8 * (4 * s + j);
        epi::Frag acc, gate;
        CUTE_UNROLL
        for (int e = 0; e < epi::kFrag; ++e) acc[e] = P(base + e);
        if constexpr (Stage::kUsesGate) {
          CUTE_UNROLL
          for (int e = 0; e < epi::kFrag; ++e) gate[e] = P3(base + e);
          c.gate = gate;
        }
        float vals[Stage::kNumNodes][epi::kFrag];
        exec.visit_nodes(c, fc, acc, vals, [](int, epi::Frag&) {}, [](int, epi::Frag const&) {});
        f(base, c.n0 + fc.col, vals[kOut]);
      }
  }
};

template <class Stage, class Geo, B2bConfig C>
struct ElementwiseF {
  ChunkStage<Stage, Geo> stage;
  using SharedStorage = typename ChunkStage<Stage, Geo>::SharedStorage;
  static COMFUSE_DEVICE void init(SharedStorage& ss) { ChunkStage<Stage, Geo>::init(ss); }
  COMFUSE_DEVICE void start_job() {}
  template <class FP, class FS, class FO>
  COMFUSE_DEVICE void apply(epi::EpiCtx const& c, SharedStorage& ss, int bar_id, FP& P, FP const& P3, FS& S, FO&, bool) {
    // Columns past N1 are 0 in S whatever F gives there (F(0) may be 0.5 or inf; W2 past N1
    // reads 0 by TMA, and inf * 0 is NaN).
    stage.stream(c, ss, bar_id, P, P3, [&](int base, int col0, float const (&v)[epi::kFrag]) {
      CUTE_UNROLL
      for (int e = 0; e < epi::kFrag; ++e)
        S(base + e) = typename FS::value_type(col0 + epi::frag_col(e) < c.N ? v[e] : 0.f);
    });
  }
  template <class FO> COMFUSE_DEVICE void finish(FO&) {}
  // No row sums to divide by (B2bConfig::chain_jobs takes the online softmax only).
  struct RowFactors {};

  // N1 split over a cluster (b2b/partial_sum.cuh): no statistics; the partials simply add.
  COMFUSE_DEVICE float4 stats() const { return make_float4(0.f, 0.f, 0.f, 0.f); }
  template <int N>
  COMFUSE_DEVICE void merge(float4 const (&)[N], float (&alpha)[N][2]) {
    CUTE_UNROLL
    for (int r = 0; r < N; ++r) alpha[r][0] = alpha[r][1] = 1.f;
  }
};

template <class Stage, class Geo, B2bConfig C>
struct OnlineSoftmaxF {
  ChunkStage<Stage, Geo> stage;
  using SharedStorage = typename ChunkStage<Stage, Geo>::SharedStorage;
  static COMFUSE_DEVICE float neg_inf() { return -__int_as_float(0x7f800000); }
  // Attention's logits folded (B2bConfig::logit_scale > 0): the prologue gives the raw scores x,
  // the statistics run on them, and exp(s (x - m)) = ex2(kExpScale x - kExpScale m), one FFMA and
  // the MUFU; the causal mask (kMaskDiagonal) applies here, in the chunks that cross the diagonal.
  static constexpr bool kRawScores = C.logit_scale > 0.f;
  static constexpr float kExpScale = (kRawScores ? C.logit_scale : 1.f) * epi::kLog2e;
  static constexpr bool kMaskDiagonal = kRawScores && C.causal;
  // The reference a row's exponentials are taken against moves only when the chunk's max
  // exceeds it by more than 2^kStaleLog2 in exp terms (FlashAttention-4's conditional rescale):
  // softmax is exact for any reference the row's values do not overflow against, and an
  // exponential of at most 2^8 (in S's bf16, l's and O's fp32) is far from it. Once a row's
  // first chunks set the reference, later chunks rarely move it, so O's rescale (a multiply
  // per O register, after waiting for the previous GEMM2) is mostly skipped: with an exact
  // max, any new max in a warp's 16 rows rescales it, which is most chunks of random scores.
  static constexpr float kStaleLog2 = 8.f;
  // The reference (the running max, stale by up to kStaleLog2) of the thread's rows (r, r + 8),
  // and its partial row sums against it.
  float m[2], l[2];
  // The chunk's: O's factor per row, the exponent's offset per row, and whether a row max of the
  // warp moved (O to rescale).
  float scale[2], ref2[2];
  bool rescale_o;

  static COMFUSE_DEVICE void init(SharedStorage& ss) { ChunkStage<Stage, Geo>::init(ss); }
  COMFUSE_DEVICE void start_job() { m[0] = m[1] = neg_inf(), l[0] = l[1] = 0.f; }

  template <class FP, class FS, class FO>
  COMFUSE_DEVICE void apply(epi::EpiCtx const& c, SharedStorage& ss, int bar_id, FP& P, FP const& P3, FS& S, FO& O, bool first) {
    scores(c, ss, bar_id, P, P3, first);
    if (rescales_o()) rescale(O);
    exps(P, [&](int i, float e) { S(i) = typename FS::value_type(e); });
  }

  // The chunk's statistics: x (the prologue) in place of P, the row maxima, O's and l's factors.
  template <class FP>
  COMFUSE_DEVICE void scores(epi::EpiCtx const& c, SharedStorage& ss, int bar_id, FP& P, FP const& P3, bool first) {
    // x = the prologue, in place of P; columns past N1 do not exist, nor (kMaskDiagonal) columns
    // past the row. Only the chunks that cross N1 or the diagonal mask (a branch uniform over
    // the warp group): the others skip the compares and selects per element.
    // Each row's max in 4 partial chains (by fragment), folded after: 4x shorter dependences.
    constexpr int kChains = 4;
    float part[2][kChains];
    CUTE_UNROLL
    for (int h = 0; h < 2; ++h)
      CUTE_UNROLL
      for (int k = 0; k < kChains; ++k) part[h][k] = neg_inf();
    int const row0 = c.m0 + accum_row(c.t, 0, 0);  // the thread's first row (kMaskDiagonal)
    auto prologue = [&](auto masked) {
      stage.stream(c, ss, bar_id, P, P3, [&](int base, int col0, float const (&v)[epi::kFrag]) {
        CUTE_UNROLL
        for (int e = 0; e < epi::kFrag; ++e) {
          float x = v[e];
          if constexpr (decltype(masked)::value) {
            int const col = col0 + epi::frag_col(e);
            bool keep = col < c.N;
            if constexpr (kMaskDiagonal) keep = keep && col <= row0 + epi::frag_row(e);
            x = keep ? x : neg_inf();
          }
          P(base + e) = x;
          float& pm = part[(e >> 1) & 1][(base / epi::kFrag) % kChains];
          pm = fmaxf(pm, x);
        }
      });
    };
    bool const crosses_diagonal = kMaskDiagonal && c.n0 + Geo::BN - 1 > c.m0;  // a column past the tile's first row
    if (c.n0 + Geo::BN <= c.N && !crosses_diagonal) prologue(cute::false_type{});
    else prologue(cute::true_type{});
    float cmax[2], ref[2];
    CUTE_UNROLL
    for (int h = 0; h < 2; ++h) {
      cmax[h] = fmaxf(fmaxf(part[h][0], part[h][1]), fmaxf(part[h][2], part[h][3]));
      cmax[h] = fmaxf(cmax[h], __shfl_xor_sync(0xffffffffu, cmax[h], 1));
      cmax[h] = fmaxf(cmax[h], __shfl_xor_sync(0xffffffffu, cmax[h], 2));
      // From -inf (the job's first chunk) any finite max moves; -inf - -inf (a row masked so
      // far) is NaN, which does not.
      bool const moves = (cmax[h] - m[h]) * kExpScale > kStaleLog2;
      float const mn = moves ? cmax[h] : m[h];
      ref[h] = mn == neg_inf() ? 0.f : mn;  // a row masked so far: no NaN from -inf - -inf
      scale[h] = moves ? epi::fast_exp2((m[h] - ref[h]) * kExpScale) : 1.f;
      m[h] = mn;
      l[h] *= scale[h];
    }
    // O's rescale only where a reference of the warp's rows moved (scale 1 elsewhere).
    rescale_o = !first && __any_sync(0xffffffffu, scale[0] != 1.f || scale[1] != 1.f);
    ref2[0] = ref[0] * kExpScale, ref2[1] = ref[1] * kExpScale;
  }
  COMFUSE_DEVICE bool rescales_o() const { return rescale_o; }
  template <class FO> COMFUSE_DEVICE void rescale(FO& O) const {
    CUTE_UNROLL
    for (int i = 0; i < cute::size(O); ++i) O(i) *= scale[(i >> 1) & 1];
  }
  // The chunk's exponentials, out(i, e) for P's flat index i, summed into l.
  // exp(s (x - ref)) as ex2(x s log2(e) - ref s log2(e)): one FFMA and the MUFU per element.
  template <class FP, class Out>
  COMFUSE_DEVICE void exps(FP const& P, Out&& out) {
    CUTE_UNROLL
    for (int i = 0; i < cute::size(P); ++i) {
      float const arg = fmaf(P(i), kExpScale, -ref2[(i >> 1) & 1]);
      constexpr int kEvery = C.fma_exp_every > 0 ? C.fma_exp_every : 1;  // (no % 0 below)
      float const e = C.fma_exp_every > 0 && i % kEvery == kEvery - 1 ? epi::fma_exp2(arg) : epi::fast_exp2(arg);
      out(i, e);
      l[(i >> 1) & 1] += e;
    }
  }

  // N1 split over a cluster (b2b/partial_sum.cuh): each CTA's running max and partial sums of
  // its chunks; merged, the row's max m over the cluster, each CTA's O and sums weighed by
  // exp(m_r - m) (0 for a CTA that saw only masked columns or none), summed in rank order.
  COMFUSE_DEVICE float4 stats() const { return make_float4(m[0], m[1], l[0], l[1]); }
  template <int N>
  COMFUSE_DEVICE void merge(float4 const (&st)[N], float (&alpha)[N][2]) {
    CUTE_UNROLL
    for (int h = 0; h < 2; ++h) {
      float mx = neg_inf();
      CUTE_UNROLL
      for (int r = 0; r < N; ++r) mx = fmaxf(mx, h == 0 ? st[r].x : st[r].y);
      float const ref = mx == neg_inf() ? 0.f : mx;
      float sum = 0.f;
      CUTE_UNROLL
      for (int r = 0; r < N; ++r) {
        alpha[r][h] = epi::fast_exp2(((h == 0 ? st[r].x : st[r].y) - ref) * kExpScale);
        sum = fmaf(alpha[r][h], h == 0 ? st[r].z : st[r].w, sum);
      }
      m[h] = mx, l[h] = sum;
    }
  }

  // After the last chunk: O /= the row's sum (0 where a row had nothing: rows past M).
  template <class FO> COMFUSE_DEVICE void finish(FO& O) { divide(O, inverse_sums()); }
  // The same in two steps (B2bConfig::chain_jobs: the sums taken before the next job's first
  // chunk replaces them, O divided once its last GEMM2 completed).
  struct RowFactors {
    float v[2];
  };
  COMFUSE_DEVICE RowFactors inverse_sums() const {
    RowFactors inv;
    CUTE_UNROLL
    for (int h = 0; h < 2; ++h) {
      float s = l[h];
      s += __shfl_xor_sync(0xffffffffu, s, 1);
      s += __shfl_xor_sync(0xffffffffu, s, 2);
      inv.v[h] = s > 0.f ? __fdiv_rn(1.f, s) : 0.f;
    }
    return inv;
  }
  template <class FO> static COMFUSE_DEVICE void divide(FO& O, RowFactors const& inv) {
    CUTE_UNROLL
    for (int i = 0; i < cute::size(O); ++i) O(i) *= inv.v[(i >> 1) & 1];
  }
};

}  // namespace comfuse::b2b
