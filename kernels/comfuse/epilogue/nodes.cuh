// comfuse/epilogue/nodes.cuh: the node templates of a Stage (elementwise + broadcast).
//
// A node is a descriptor type; its device implementation is `Node::Impl<Geo>` (Geo: the
// warp group's tile geometry, see stage.cuh). An Impl provides
//   struct SharedStorage;                         per consumer warp group (may be empty)
//   void begin(EpiCtx const&, SharedStorage&);    once per tile, before any fragment
//   template <int I, class V> void visit(EpiCtx const&, FragCoord const&, Frag const& acc, V& vals);
//                                                 per fragment: writes vals[I] from vals[operands]
//   void subtile_end(EpiCtx const&, SharedStorage&, int s);   once per 64-column subtile,
//                                                 by one thread, after the SMEM fence+barrier
// Operands are node indices (< I: the list is topologically ordered). All math is fp32.
#pragma once
#include "../common.cuh"
#include "../params.cuh"
#include "ops.cuh"

namespace comfuse::epi {

// A fragment: the 8 accumulator values of one thread that one stmatrix.x4 stores. In a
// warp's 16 x 16 block, element e sits at row fc.row + 8*((e>>1)&1) and column
// fc.col + 8*(e>>2) + (e&1).
inline constexpr int kFrag = 8;
using Frag = float[kFrag];

struct FragCoord {
  int row;      // tile-local row of elements 0, 1, 4, 5
  int col;      // tile-local column of element 0
  int sub_col;  // column of element 0 inside its 64-column store subtile
  int mi;       // 64-row block of the tile (0 or 1)
};

struct EpiCtx {
  Params const* p;
  int m0, n0;       // tile origin (elements)
  int t;            // thread index inside the consumer warp group (0..127)
  int warp, lane;   // warp inside the warp group, lane
  int tile = 0;     // Stash (NTiles > 1): which of the job's N-tiles (n0 is that tile's origin)
  RowGroupSlot xs{};  // row reductions across clusters (Aggregation::L2Exchange): exchange slot, rank
};

COMFUSE_DEVICE int frag_row(int e) { return 8 * ((e >> 1) & 1); }
COMFUSE_DEVICE int frag_col(int e) { return 8 * (e >> 2) + (e & 1); }

struct NoStorage {};

template <class Geo> struct NodeBase {
  using SharedStorage = NoStorage;
  COMFUSE_DEVICE void begin(EpiCtx const&, SharedStorage&) {}
  COMFUSE_DEVICE void subtile_end(EpiCtx const&, SharedStorage&, int) {}
};

// A node with one value per row (a column vector, a reduction's statistic, a per-row bypass):
// r[mi][h] for the thread's rows accum_row(t, mi, h), broadcast along the fragment's columns.
template <class Geo> struct PerRowNode : NodeBase<Geo> {
  float r[Geo::MBlocks][2];
  template <int I, class V> COMFUSE_DEVICE void visit(EpiCtx const&, FragCoord const& fc, Frag const&, V& v) {
    CUTE_UNROLL
    for (int e = 0; e < kFrag; ++e) v[I][e] = r[fc.mi][(e >> 1) & 1];
  }
};

// The fp32 accumulator fragment.
struct AccEntry {
  template <class Geo> struct Impl : NodeBase<Geo> {
    template <int I, class V> COMFUSE_DEVICE void visit(EpiCtx const&, FragCoord const&, Frag const& acc, V& v) {
      CUTE_UNROLL
      for (int e = 0; e < kFrag; ++e) v[I][e] = acc[e];
    }
  };
};

// A runtime scalar: params.scalars[Arg].
template <int Arg> struct ScalarArg {
  static_assert(Arg < Sm90::kMaxScalars);
  template <class Geo> struct Impl : NodeBase<Geo> {
    float s;
    COMFUSE_DEVICE void begin(EpiCtx const& c, NoStorage&) { s = c.p->scalars[Arg]; }
    template <int I, class V> COMFUSE_DEVICE void visit(EpiCtx const&, FragCoord const&, Frag const&, V& v) {
      CUTE_UNROLL
      for (int e = 0; e < kFrag; ++e) v[I][e] = s;
    }
  };
};

// A compile-time constant: L::value (struct L { static constexpr float value = ...; }).
template <class L> struct ScalarLiteral {
  template <class Geo> struct Impl : NodeBase<Geo> {
    template <int I, class V> COMFUSE_DEVICE void visit(EpiCtx const&, FragCoord const&, Frag const&, V& v) {
      CUTE_UNROLL
      for (int e = 0; e < kFrag; ++e) v[I][e] = float(L::value);
    }
  };
};

// A vector of length N (one value per column), params.vectors[Arg] of type T. Loaded once
// per tile into the warp group's SMEM as fp32; a fragment reads two float2 (all rows of a
// warp read the same words: broadcast, no bank conflict). Columns >= N read 0.
template <int Arg, class T> struct RowBroadcast {
  static_assert(Arg < Sm90::kMaxVectors);
  template <class Geo> struct Impl : NodeBase<Geo> {
    struct SharedStorage { alignas(16) float v[Geo::BN]; };
    uint32_t v_;  // shared-space address: ld.shared, not a generic load
    COMFUSE_DEVICE void begin(EpiCtx const& c, SharedStorage& s) {
      v_ = smem_u32(s.v);
      void const* src = c.p->vectors[Arg];
      int const n_valid = c.p->N - c.n0;
      for (int i = c.t; i < Geo::BN; i += kWarpGroupThreads)
        s.v[i] = i < n_valid ? DType<T>::load(src, c.n0 + i) : 0.f;
    }
    COMFUSE_DEVICE void subtile_end(EpiCtx const&, SharedStorage&, int) {}
    template <int I, class V> COMFUSE_DEVICE void visit(EpiCtx const&, FragCoord const& fc, Frag const&, V& v) {
      float2 lo = ld_shared_v2(v_ + 4 * fc.col);
      float2 hi = ld_shared_v2(v_ + 4 * (fc.col + 8));
      v[I][0] = lo.x; v[I][1] = lo.y; v[I][2] = lo.x; v[I][3] = lo.y;
      v[I][4] = hi.x; v[I][5] = hi.y; v[I][6] = hi.x; v[I][7] = hi.y;
    }
  };
};

// A vector of length M (one value per row), params.vectors[Arg] of type T. A thread holds
// 2 rows per 64-row block: loaded once per tile into registers. Rows >= M read 0.
template <int Arg, class T> struct ColBroadcast {
  static_assert(Arg < Sm90::kMaxVectors);
  template <class Geo> struct Impl : PerRowNode<Geo> {
    using PerRowNode<Geo>::r;
    COMFUSE_DEVICE void begin(EpiCtx const& c, NoStorage&) {
      void const* src = c.p->vectors[Arg];
      CUTE_UNROLL
      for (int mi = 0; mi < Geo::MBlocks; ++mi)
        CUTE_UNROLL
        for (int h = 0; h < 2; ++h) {
          int m = c.m0 + accum_row(c.t, mi, h);
          r[mi][h] = m < c.p->M ? DType<T>::load(src, m) : 0.f;
        }
    }
  };
};

// Elementwise compute: Op::apply on the fragments of nodes A (and B).
template <class Op, int A, int B = -1> struct Compute {
  template <class Geo> struct Impl : NodeBase<Geo> {
    template <int I, class V> COMFUSE_DEVICE void visit(EpiCtx const&, FragCoord const&, Frag const&, V& v) {
      static_assert(A < I && B < I, "operands must precede the node");
      CUTE_UNROLL
      for (int e = 0; e < kFrag; ++e) {
        if constexpr (B < 0) v[I][e] = Op::apply(v[A][e]);
        else v[I][e] = Op::apply(v[A][e], v[B][e]);
      }
    }
  };
};

// Round to T and continue in fp32 (models a cast in the user's graph).
template <class T, int Src> struct Cast {
  template <class Geo> struct Impl : NodeBase<Geo> {
    template <int I, class V> COMFUSE_DEVICE void visit(EpiCtx const&, FragCoord const&, Frag const&, V& v) {
      static_assert(Src < I);
      CUTE_UNROLL
      for (int e = 0; e < kFrag; ++e) v[I][e] = DType<T>::round(v[Src][e]);
    }
  };
};

// Store node Src to output Out (type T, M x N row-major) through SMEM and TMA.
// Staging: one BM x 64 subtile per warp group, as 128-byte-swizzled boxes of 128 bytes of
// columns (1 box for 16-bit T, 2 for fp32): the swizzle makes both stmatrix (16-bit) and
// st.shared.v2 (fp32) writes bank-conflict free, and is what the TMA store un-swizzles.
template <int Out, class T, int Src> struct Store {
  static_assert(Out < Sm90::kMaxOutputs);
  static constexpr bool kIsStore = true;
  template <class Geo> struct Impl {
    static constexpr int kBoxCols = 128 / int(sizeof(T));
    static constexpr int kBoxes = 64 / kBoxCols;
    static constexpr int kBoxBytes = Geo::BM * 128;
    struct SharedStorage { alignas(1024) unsigned char buf[kBoxes * kBoxBytes]; };
    uint32_t base_;
    COMFUSE_DEVICE void begin(EpiCtx const&, SharedStorage& s) { base_ = smem_u32(s.buf); }
    template <int I, class V> COMFUSE_DEVICE void visit(EpiCtx const& c, FragCoord const& fc, Frag const&, V& v) {
      static_assert(Src < I);
      if constexpr (sizeof(T) == 2) {
        int q = c.lane / 8;
        int row = fc.mi * 64 + c.warp * 16 + (c.lane % 8) + 8 * (q & 1);
        int col = (fc.sub_col & ~15) + 8 * (q >> 1);
        uint32_t addr = base_ + row * 128 + (((col >> 3) ^ (row & 7)) << 4);
        stmatrix_x4(addr, DType<T>::pack2(v[Src][0], v[Src][1]), DType<T>::pack2(v[Src][2], v[Src][3]),
                    DType<T>::pack2(v[Src][4], v[Src][5]), DType<T>::pack2(v[Src][6], v[Src][7]));
      } else {
        CUTE_UNROLL
        for (int p = 0; p < 4; ++p) {
          int row = fc.row + 8 * (p & 1);
          int col = fc.sub_col + 8 * (p >> 1);
          int cb = col % kBoxCols;
          uint32_t addr = base_ + (col / kBoxCols) * kBoxBytes + row * 128 + ((((cb * 4) >> 4) ^ (row & 7)) << 4) +
                          (cb * 4 & 15);
          st_shared_v2(addr, v[Src][2 * p], v[Src][2 * p + 1]);
        }
      }
      CUTE_UNROLL
      for (int e = 0; e < kFrag; ++e) v[I][e] = v[Src][e];
    }
    COMFUSE_DEVICE void subtile_end(EpiCtx const& c, SharedStorage& s, int sub) {
      CUTE_UNROLL
      for (int b = 0; b < kBoxes; ++b)
        cute::SM90_TMA_STORE_2D::copy(&c.p->tma_out[Out], s.buf + b * kBoxBytes, c.n0 + sub * 64 + b * kBoxCols, c.m0);
    }
  };
};

}  // namespace comfuse::epi
