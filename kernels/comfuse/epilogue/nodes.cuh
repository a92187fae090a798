// comfuse/epilogue/nodes.cuh: the node templates of a Stage (elementwise + broadcast).
//
// A node is a descriptor type; its device implementation is `Node::Impl<Geo>` (Geo: the
// warp group's tile geometry, see stage.cuh). An Impl provides
//   struct SharedStorage;                         per consumer warp group (may be empty)
//   static void init(SharedStorage&);             once per CTA, by one thread, before the
//                                                 kernel's first cluster barrier (mbarriers)
//   static void prefetch_descriptors(Params const&);  the same, for the TMA descriptors the node
//                                                 uses (Store's output)
//   void load(EpiCtx const&, SharedStorage&);     once per tile, by one thread: starts the
//                                                 tile's inputs on their way (TileInput: an L2
//                                                 prefetch); the root stage's run before the
//                                                 tile's mainloop
//   void fetch(EpiCtx const&);                    a warp group's first job, ahead of its
//                                                 mainloop (KernelConfig::begin_early): its
//                                                 begin()'s global loads issued into registers,
//                                                 so that they land while the tensor cores work;
//                                                 begin() then finds them there (EpiCtx::fetched)
//   void begin(EpiCtx const&, SharedStorage&);    once per tile, before any fragment
//   void acquire(EpiCtx const&, SharedStorage&);  once per tile, when its stage starts
//                                                 streaming: wait for what load() started
//                                                 where the fragments read it
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
  int col0;     // tile-local column of the fragment's 16-column block (col less the lane's offset):
                // the same for every thread, so what depends on it alone folds at compile time
  int sub_col;  // column of element 0 inside its 64-column store subtile
  int mi;       // 64-row block of the tile (0 or 1)
};

struct EpiCtx {
  Params const* p;
  int m0, n0;       // tile origin (elements)
  int N;            // columns of the epilogue's values: N (a B2B kernel's F: N1; its Epi2: N2)
  int t;            // thread index inside the consumer warp group (0..127)
  int warp, lane;   // warp inside the warp group, lane
  int tile = 0;     // Stash (NTiles > 1): which of the job's N-tiles (n0 is that tile's origin)
  int batch = 0;    // batched kernels (Geometry::kBatched): the job's batch
  int job = 0;      // the warp group's job count (trace stamps only)
  // Set by the stage for begin(): this warp group's previous begin of the stage was at the same
  // columns and batch (a row group's CTA keeps its N-tile from job to job), so per-column
  // vectors already in its SMEM need not be loaded again.
  bool same_columns = false;
  // Set by the stage for begin(): this tile's fetch() ran (its loads are in the node's registers).
  bool fetched = false;
  // KernelConfig::ring_input_bytes: the mainloop ring slot that holds this tile's inputs (shared
  // addresses of its A part and its B part; mainloop_sm90.cuh slot_box).
  uint32_t ring_a = 0, ring_b = 0;
  // The root stage's store staging buffers by output slot (Store::kOut), lent to the PostStage
  // stores that borrow them (Store's Borrow; Stage::Exec::lend_staging fills it).
  unsigned char* root_staging[Sm90::kMaxOutputs] = {};
  float const* gate = nullptr;  // B2B's gated GEMM1: the current fragment of X W3^T (GateEntry)
  RowGroupSlot xs{};  // row reductions across clusters (Aggregation::L2Exchange): exchange slot, rank
};

COMFUSE_DEVICE int frag_row(int e) { return 8 * ((e >> 1) & 1); }
COMFUSE_DEVICE int frag_col(int e) { return 8 * (e >> 2) + (e & 1); }
// A row's running partials in a reduction (Reduction, the pair's second statistic): one per
// column position of the fragment, element e's is row_slot(e), so a thread's values of a row
// form kRowSlots dependency chains, not one (bench/NOTES.md, "Reduction chains").
inline constexpr int kRowSlots = 4;
COMFUSE_DEVICE constexpr int row_slot(int e) { return (e & 1) + 2 * (e >> 2); }

struct NoStorage {};

// The defaults take any storage type: a node that overrides only some of the hooks keeps the
// others for its own SharedStorage.
template <class Geo> struct NodeBase {
  using SharedStorage = NoStorage;
  static constexpr bool kLoads = false;  // whether load() starts anything (TileInput)
  template <class S> static COMFUSE_DEVICE void init(S&) {}
  static COMFUSE_DEVICE void prefetch_descriptors(Params const&) {}
  template <class S> COMFUSE_DEVICE void load(EpiCtx const&, S&) {}
  COMFUSE_DEVICE void fetch(EpiCtx const&) {}
  template <class S> COMFUSE_DEVICE void begin(EpiCtx const&, S&) {}
  template <class S> COMFUSE_DEVICE void acquire(EpiCtx const&, S&) {}
  template <class S> COMFUSE_DEVICE void subtile_end(EpiCtx const&, S&, int) {}
};

// The 128-byte-swizzled staging layout of a BM x 64-column subtile of 16- or 32-bit elements,
// in boxes of 128 bytes of columns (1 box for 16-bit T, 2 for fp32): what a TMA box {128 bytes,
// BM rows} with 128-byte swizzle reads. Bank-conflict free for stmatrix (16-bit: lane l
// addresses row l % 8 of 8x8 matrix l / 8) and for st.shared.v2 (fp32).
template <class T, int BM> struct SwizzledSubtile {
  static constexpr int kBoxCols = 128 / int(sizeof(T));
  static constexpr int kBoxes = 64 / kBoxCols;
  static constexpr int kBoxBytes = BM * 128;
  static constexpr int kBytes = kBoxes * kBoxBytes;
  // 16-bit: the address lane `lane` gives stmatrix .x4 for the fragment at (fc.mi,
  // fc.sub_col) of warp `warp`.
  static COMFUSE_DEVICE uint32_t matrix_addr(uint32_t base, int warp, int lane, FragCoord const& fc) {
    int const q = lane / 8;
    int const row = fc.mi * 64 + warp * 16 + (lane % 8) + 8 * (q & 1);
    int const col = (fc.sub_col & ~15) + 8 * (q >> 1);
    return base + row * 128 + (((col >> 3) ^ (row & 7)) << 4);
  }
  // fp32: the address of pair p (elements 2p, 2p + 1) of the fragment.
  static COMFUSE_DEVICE uint32_t pair_addr(uint32_t base, FragCoord const& fc, int p) {
    int const row = fc.row + 8 * (p & 1);
    int const col = fc.sub_col + 8 * (p >> 1);
    int const cb = col % kBoxCols;
    return base + (col / kBoxCols) * kBoxBytes + row * 128 + ((((cb * 4) >> 4) ^ (row & 7)) << 4) + (cb * 4 & 15);
  }
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

// The gated GEMM1's accumulator fragment (X W3^T beside AccEntry's X W1^T; B2B kernels set
// EpiCtx::gate per fragment).
struct GateEntry {
  template <class Geo> struct Impl : NodeBase<Geo> {
    template <int I, class V> COMFUSE_DEVICE void visit(EpiCtx const& c, FragCoord const&, Frag const&, V& v) {
      CUTE_UNROLL
      for (int e = 0; e < kFrag; ++e) v[I][e] = c.gate[e];
    }
  };
};

// The value that becomes the next GEMM's A operand (the B2B kernel's S): it stays in registers.
template <int Src> struct ToOperand {
  static constexpr bool kIsOperand = true;
  template <class Geo> struct Impl : NodeBase<Geo> {
    template <int I, class V> COMFUSE_DEVICE void visit(EpiCtx const&, FragCoord const&, Frag const&, V& v) {
      static_assert(Src < I);
      CUTE_UNROLL
      for (int e = 0; e < kFrag; ++e) v[I][e] = v[Src][e];
    }
  };
};

// -inf where the element's key (column) lies past its query (row): the causal mask of
// attention, top-left aligned (row r attends to columns 0..r), as torch's is_causal.
template <int Src> struct CausalMask {
  template <class Geo> struct Impl : NodeBase<Geo> {
    template <int I, class V> COMFUSE_DEVICE void visit(EpiCtx const& c, FragCoord const& fc, Frag const&, V& v) {
      static_assert(Src < I);
      CUTE_UNROLL
      for (int e = 0; e < kFrag; ++e) {
        int const row = c.m0 + fc.row + frag_row(e), col = c.n0 + fc.col + frag_col(e);
        v[I][e] = col > row ? -__int_as_float(0x7f800000) : v[Src][e];
      }
    }
  };
};

// rotate_half within runs of Segment columns (ops.h RotateHalfOp: rotary position embeddings):
// column j takes -x[j + S/2] in its run's first half and x[j - S/2] in its second. In the wgmma
// accumulator layout a thread holds the same columns of every 16-column block of its rows, so
// each element's partner is the thread's own element S/2 columns away, in another fragment: the
// stage executor (stage.cuh, visit_nodes) evaluates Src at the partner fragment from the
// accumulator registers there and negates the first half. No shuffles, no SMEM; Src's elementwise
// cone is computed twice (a bias add: a few instructions a value), unless InPlace. The tile
// spans whole runs (the planner's segment plans: tile_n a multiple of Segment).
// InPlace (spec.h rotate_in_place: a PostStage; Src computed; nothing up to it has an effect or
// is read past it but Src; the stage carries nothing on): a run's first-half fragment computes
// Src there and at its partner and writes both into the accumulator registers; the second-half
// fragment reads them back and computes nothing up to Src. Src's cone then runs once a value,
// and the raw accumulator dies as it is consumed (a norm's scaling before RoPE on 128-row tiles:
// its recomputation kept both alive, and ptxas spilled ~600 B).
template <int Src, int Segment, bool InPlace = false> struct RotateHalf {
  static constexpr int kRotateSrc = Src;
  static constexpr int kSegment = Segment;
  static constexpr bool kInPlace = InPlace;
  static_assert(Segment % 32 == 0, "ComFuse: rotate_half's half runs are whole 16-column fragments");
  template <class Geo> struct Impl : NodeBase<Geo> {
    static_assert(Geo::BN % Segment == 0, "ComFuse: a tile spans whole rotate_half runs");
    static_assert(Geo::NTiles == 1, "ComFuse: rotate_half reads its partner from the registers of a job's one tile");
  };
};

// The interleaved rotation (ops.h RotatePairsOp: GPT-J's and Cohere's rotary embeddings): column
// 2i takes -x[2i + 1], column 2i + 1 takes x[2i]. A fragment's elements e and e ^ 1 are columns c
// and c + 1 (c even) of one row: the partner is already in the fragment.
template <int Src> struct RotatePairs {
  template <class Geo> struct Impl : NodeBase<Geo> {
    template <int I, class V> COMFUSE_DEVICE void visit(EpiCtx const&, FragCoord const&, Frag const&, V& v) {
      static_assert(Src < I);
      CUTE_UNROLL
      for (int e = 0; e < kFrag; ++e) v[I][e] = (e & 1) ? v[Src][e ^ 1] : -v[Src][e ^ 1];
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

// A vector of length N (one value per column), params.vectors[Arg] of type T. Loaded into the
// warp group's SMEM as fp32 when a tile's columns differ from the warp group's previous tile's
// (EpiCtx::same_columns: a load from L2 is ~1 us a job on the epilogue's critical path); a
// fragment reads two float2 (all rows of a warp read the same words: broadcast, no bank
// conflict). Columns >= N read 0. A first job's loads may be fetched into registers ahead of
// its mainloop (fetch(); kPerThread a thread), begin() then writing them to SMEM.
// Period > 0: a vector of Period elements, column j reading element j mod Period (a per-head
// norm's gamma, FusionSpec::segment).
template <int Arg, class T, int Period = 0> struct RowBroadcast {
  static_assert(Arg < Sm90::kMaxVectors);
  template <class Geo> struct Impl : NodeBase<Geo> {
    struct SharedStorage { alignas(16) float v[Geo::BN]; };
    static constexpr int kPerThread = (Geo::BN + kWarpGroupThreads - 1) / kWarpGroupThreads;
    using Bits = typename DType<T>::Bits;
    uint32_t v_;  // shared-space address: ld.shared, not a generic load
    Bits fetched_[kPerThread];  // as loaded: a conversion here would wait for the load
    COMFUSE_DEVICE Bits element(EpiCtx const& c, int i) const {
      return i < c.N - c.n0 ? DType<T>::load_bits(c.p->vectors[Arg], Period > 0 ? (c.n0 + i) % Period : c.n0 + i) : Bits(0);
    }
    COMFUSE_DEVICE void fetch(EpiCtx const& c) {
      CUTE_UNROLL
      for (int j = 0; j < kPerThread; ++j)
        if (int const i = c.t + j * kWarpGroupThreads; i < Geo::BN) fetched_[j] = element(c, i);
    }
    COMFUSE_DEVICE void begin(EpiCtx const& c, SharedStorage& s) {
      v_ = smem_u32(s.v);
      if (c.same_columns) return;
      CUTE_UNROLL
      for (int j = 0; j < kPerThread; ++j)
        if (int const i = c.t + j * kWarpGroupThreads; i < Geo::BN)
          s.v[i] = DType<T>::from_bits(c.fetched ? fetched_[j] : element(c, i));
    }
    // Several N-tiles a job: the base made opaque once per tile, so that the 32 per-fragment
    // addresses (64 columns a thread on a 256-column tile) are formed in the body that reads them
    // and not hoisted out of the job loop into registers held across the mainloop, where ptxas
    // spilled them (LayerNorm at 1152 x 32768 x 1024: 896 B of spill, 168 B with this).
    // One N-tile keeps the plain base: its kernels spill nothing either way.
    COMFUSE_DEVICE void acquire(EpiCtx const&, SharedStorage& s) {
      if constexpr (Geo::NTiles > 1) v_ = opaque(smem_u32(s.v));
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
// 2 rows per 64-row block: loaded once per tile into registers (by fetch() where the tile's
// loads were fetched ahead of its mainloop). Rows >= M read 0.
template <int Arg, class T> struct ColBroadcast {
  static_assert(Arg < Sm90::kMaxVectors);
  template <class Geo> struct Impl : PerRowNode<Geo> {
    using PerRowNode<Geo>::r;
    using Bits = typename DType<T>::Bits;
    Bits fetched_[Geo::MBlocks][2];  // as loaded: a conversion here would wait for the load
    COMFUSE_DEVICE void fetch(EpiCtx const& c) {
      CUTE_UNROLL
      for (int mi = 0; mi < Geo::MBlocks; ++mi)
        CUTE_UNROLL
        for (int h = 0; h < 2; ++h) fetched_[mi][h] = element(c, mi, h);
    }
    COMFUSE_DEVICE Bits element(EpiCtx const& c, int mi, int h) const {
      int const m = c.m0 + accum_row(c.t, mi, h);
      return m < c.p->M ? DType<T>::load_bits(c.p->vectors[Arg], m) : Bits(0);
    }
    COMFUSE_DEVICE void begin(EpiCtx const& c, NoStorage&) {
      CUTE_UNROLL
      for (int mi = 0; mi < Geo::MBlocks; ++mi)
        CUTE_UNROLL
        for (int h = 0; h < 2; ++h) r[mi][h] = DType<T>::from_bits(c.fetched ? fetched_[mi][h] : element(c, mi, h));
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
// Staging: Geo::StoreStages BM x 64 subtiles per warp group (SwizzledSubtile), subtile s in
// buffer s mod StoreStages, what the TMA store un-swizzles: its own, or with Borrow >= 0 (a
// PostStage's store, FusionSpec::staging_borrows) the staging of the root stage's store to output
// slot Borrow (same element size), free once the root's TMA stores have read it (the borrowing
// stage's body waits for that: Stage::Exec::kBorrows).
template <int Out, class T, int Src, int Borrow = -1> struct Store {
  static_assert(Out < Sm90::kMaxOutputs && Borrow < Sm90::kMaxOutputs);
  static constexpr bool kIsStore = true;
  static constexpr bool kBorrows = Borrow >= 0;
  template <class Geo> struct Impl : NodeBase<Geo> {
    using Layout = SwizzledSubtile<T, Geo::BM>;
    struct OwnStorage { alignas(1024) unsigned char buf[Geo::StoreStages * Layout::kBytes]; };
    // The buffer of the subtile holding column `col` of the tile.
    static COMFUSE_DEVICE constexpr int buffer_offset(int col) { return (col / 64) % Geo::StoreStages * Layout::kBytes; }
    using SharedStorage = cute::conditional_t<kBorrows, NoStorage, OwnStorage>;
    static constexpr int kOut = Out;
    uint32_t base_;
    unsigned char* borrowed_;  // Borrow: the lender's staging (generic address, for the TMA store)
    static COMFUSE_DEVICE void prefetch_descriptors(Params const& p) { prefetch_tma_descriptor(&p.tma_out[Out]); }
    static COMFUSE_DEVICE unsigned char* staging(OwnStorage& s) { return s.buf; }
    COMFUSE_DEVICE unsigned char* buf(SharedStorage& s) const {
      if constexpr (kBorrows) return borrowed_;
      else return s.buf;
    }
    COMFUSE_DEVICE void begin(EpiCtx const& c, SharedStorage& s) {
      if constexpr (kBorrows) borrowed_ = c.root_staging[Borrow];
      base_ = smem_u32(buf(s));
    }
    template <int I, class V> COMFUSE_DEVICE void visit(EpiCtx const& c, FragCoord const& fc, Frag const&, V& v) {
      static_assert(Src < I);
      if constexpr (sizeof(T) == 2) {
        stmatrix_x4(Layout::matrix_addr(base_ + buffer_offset(fc.col), c.warp, c.lane, fc), DType<T>::pack2(v[Src][0], v[Src][1]),
                    DType<T>::pack2(v[Src][2], v[Src][3]), DType<T>::pack2(v[Src][4], v[Src][5]),
                    DType<T>::pack2(v[Src][6], v[Src][7]));
      } else {
        CUTE_UNROLL
        for (int p = 0; p < 4; ++p)
          st_shared_v2(Layout::pair_addr(base_ + buffer_offset(fc.col), fc, p), v[Src][2 * p], v[Src][2 * p + 1]);
      }
      CUTE_UNROLL
      for (int e = 0; e < kFrag; ++e) v[I][e] = v[Src][e];
    }
    COMFUSE_DEVICE void subtile_end(EpiCtx const& c, SharedStorage& s, int sub) {
      unsigned char* const staged = buf(s) + buffer_offset(sub * 64);
      CUTE_UNROLL
      for (int b = 0; b < Layout::kBoxes; ++b) {
        if constexpr (Geo::kBatched) {
          BatchCoord const bc = batch_coord(*c.p, c.batch);
          cute::SM90_TMA_STORE_4D::copy(&c.p->tma_out[Out], staged + b * Layout::kBoxBytes,
                                        c.n0 + sub * 64 + b * Layout::kBoxCols, c.m0, bc.head, bc.outer);
        } else
          cute::SM90_TMA_STORE_2D::copy(&c.p->tma_out[Out], staged + b * Layout::kBoxBytes,
                                        c.n0 + sub * 64 + b * Layout::kBoxCols, c.m0);
      }
    }
  };
};

// An [M, N] input of the epilogue (a residual, a gate, a mask), type T, row-major at
// params.tile_in[In]. load() (one thread; for the root stage before the tile's mainloop, for a
// later stage at its begin()) prefetches the tile into L2 through the TMA descriptor
// params.tma_in[In], one box of 128 bytes of columns x BM rows at a time. Then either
//  * Box0 < 0: each fragment reads its 8 values straight from global memory (L2), one load per
//    adjacent column pair (4 bytes of 16-bit T, 8 of fp32: the descriptor's 16-byte aligned
//    base and row stride align every pair); latency-bound, on the epilogue's critical path; or
//  * Box0 >= 0 (root stage, KernelConfig::ring_input_bytes): the producer loads the tile by TMA
//    into the ring slot after the tile's k-blocks, its boxes at Box0, Box0 + 1, .. of the slot
//    (load_ring), so it lands under the mainloop; each fragment reads SMEM (EpiCtx::ring_a/b),
//    the same 128-byte swizzle the stores use, bank-conflict free.
// Rows >= M and columns >= N read 0 (the TMA's zero fill, or the loads' predicates).
// Period > 0: an [M, Period] input read periodically along N (column j reads column j mod
// Period: rotary embeddings' cos and sin, one row per row of the GEMM), from global memory; the
// tile spans whole periods (tile origins are multiples of BN, BN of Period).
template <int In, class T, int Box0 = -1, int Period = 0> struct TileInput {
  static_assert(In < Sm90::kMaxTileInputs);
  static constexpr bool kInRing = Box0 >= 0;
  static_assert(!kInRing || Period == 0, "ComFuse: a periodic tile input is read from global memory");
  template <class Geo> struct Impl : NodeBase<Geo> {
    static_assert(Period == 0 || (Geo::BN % Period == 0 && Period % 16 == 0),
                  "ComFuse: a periodic tile input's tile spans whole periods of 16-column fragments");
    static constexpr bool kLoads = true;
    static constexpr int kBoxCols = 128 / int(sizeof(T));
    static constexpr int kRingBytes = kInRing ? Geo::BM * Geo::BN * int(sizeof(T)) : 0;
    T const* tile_;       // element (m0, n0) of the tile, in the job's batch
    long long ld_;        // row stride (elements)
    int rows_, cols_;     // rows and columns of the tile that lie inside [M, N]
    COMFUSE_DEVICE void load(EpiCtx const& c, NoStorage&) {
      if (c.t != 0 || c.m0 >= c.p->M) return;  // a cooperative tile's second half may lie past M
      int const n0 = Period ? 0 : c.n0, cols = Period ? Period : c.N;  // periodic: the columns of one period
      CUTE_UNROLL
      for (int col = 0; col < Geo::BN; col += kBoxCols) {
        if (n0 + col >= cols) break;
        if constexpr (Geo::kBatched) {
          BatchCoord const bc = batch_coord(*c.p, c.batch);
          cute::SM90_TMA_LOAD_4D::PREFETCH::copy(&c.p->tma_in[In], n0 + col, c.m0, bc.head, bc.outer);
        } else
          cute::SM90_TMA_LOAD_2D::PREFETCH::copy(&c.p->tma_in[In], n0 + col, c.m0);
      }
    }
    // The producer thread, into the ring slot whose box b is at box(b) (mainloop_sm90.cuh).
    template <class BoxAt>
    static COMFUSE_DEVICE void load_ring(Params const& p, uint64_t* bar, BoxAt const& box, int m0, int n0) {
      if constexpr (kInRing) {
        static_assert(!Geo::kBatched, "tile inputs in the ring: the single-GEMM kernel (not batched)");
        constexpr auto kEvictFirst = uint64_t(cute::TMA::CacheHintSm90::EVICT_FIRST);  // read once, by this tile
        CUTE_UNROLL
        for (int b = 0; b < Geo::BN / kBoxCols; ++b)
          cute::SM90_TMA_LOAD_2D::copy(&p.tma_in[In], bar, kEvictFirst, box(Box0 + b), n0 + b * kBoxCols, m0);
      }
    }
    COMFUSE_DEVICE void begin(EpiCtx const& c, NoStorage&) {
      if constexpr (!kInRing) {  // the ring's reads need no pointer: TMA zero-filled past M and N
        MatrixRef const& in = c.p->tile_in[In];
        ld_ = in.ld;
        long long batch_offset = 0;
        if constexpr (Geo::kBatched) {
          BatchCoord const bc = batch_coord(*c.p, c.batch);
          batch_offset = bc.head * in.head_stride + bc.outer * in.batch_stride;
        }
        tile_ = static_cast<T const*>(in.data) + batch_offset + c.m0 * ld_ + (Period ? 0 : c.n0);
        rows_ = c.p->M - c.m0;
        cols_ = Period ? Period : c.N - c.n0;
      }
    }
    // Global: predicated loads of the raw words (zero bits read 0.f in every T), converted
    // after: no branches and no dependence between the pairs, so ptxas can issue a subtile's
    // loads ahead of their use. A pair whose first column is inside N loads whole: its aligned
    // word holds that valid element, so it cannot fault even where an odd N puts the second
    // past the row.
    using Word = cute::conditional_t<sizeof(T) == 2, uint32_t, float2>;
    template <int I, class V> COMFUSE_DEVICE void visit(EpiCtx const& c, FragCoord const& fc, Frag const&, V& v) {
      CUTE_UNROLL
      for (int e = 0; e < kFrag; e += 2) {
        // element e + 1: col + 1. Periodic: the period's column (fc.col0 % Period folds: whole
        // 16-column fragments, tiles of whole periods).
        int const row = fc.row + frag_row(e);
        int col = fc.col + frag_col(e);
        if constexpr (Period > 0) col = fc.col0 % Period + (fc.col - fc.col0) + frag_col(e);
        Word w{};
        if constexpr (kInRing) {
          int const b = Box0 + col / kBoxCols, byte = (col % kBoxCols) * int(sizeof(T));
          uint32_t const addr = (b == 0 ? c.ring_a : c.ring_b + (b - 1) * Geo::BM * 128) + row * 128 +
                                ((((byte >> 4) ^ (row & 7)) << 4) | (byte & 15));
          if constexpr (sizeof(T) == 2) w = ld_shared_u32(addr);
          else w = ld_shared_v2(addr);
        } else {
          if (row < rows_ && col < cols_) w = *reinterpret_cast<Word const*>(tile_ + row * ld_ + col);
        }
        if constexpr (sizeof(T) == 2) v[I][e] = DType<T>::unpack_lo(w), v[I][e + 1] = DType<T>::unpack_hi(w);
        else v[I][e] = w.x, v[I][e + 1] = w.y;
        if constexpr (!kInRing)
          if (col + 1 >= cols_) v[I][e + 1] = 0.f;
      }
    }
  };
};

// Store a per-row (Col-class) node Src to output Out, an [M, 1] vector of T
// (params.col_outputs[Out], contiguous): one plain store per row, by the quad leader that holds
// it, from the CTA whose tile starts at column 0 (every CTA of the row holds the same value
// after a reduction; one writes), on the fragment at column 0 (the value is the same along the row).
template <int Out, class T, int Src> struct StoreCol {
  static_assert(Out < Sm90::kMaxColOutputs);
  static constexpr bool kIsColStore = true;
  template <class Geo> struct Impl : NodeBase<Geo> {
    template <int I, class V> COMFUSE_DEVICE void visit(EpiCtx const& c, FragCoord const& fc, Frag const&, V& v) {
      static_assert(Src < I);
      if (fc.col == 0 && c.n0 == 0 && c.lane % 4 == 0) {
        T* out = static_cast<T*>(c.p->col_outputs[Out]) + (Geo::kBatched ? size_t(c.batch) * c.p->M : 0);
        CUTE_UNROLL
        for (int h = 0; h < 2; ++h) {
          int const m = c.m0 + fc.row + 8 * h;
          if (m < c.p->M) out[m] = T(v[Src][2 * h]);
        }
      }
      CUTE_UNROLL
      for (int e = 0; e < kFrag; ++e) v[I][e] = v[Src][e];
    }
  };
};

}  // namespace comfuse::epi
