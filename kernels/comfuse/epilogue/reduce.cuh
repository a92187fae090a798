// comfuse/epilogue/reduce.cuh: reduction nodes of the Stage-Stream epilogue.
//
//   Reduction<Op, Operand, PostStage>  terminal node of a Stage: thread-local aggregation of
//                                      node Operand per row in the compute phase; the Stage
//                                      executor (stage.cuh) runs the reduce phase and then
//                                      PostStage (a Stage, or void) with the statistic bound.
//   Stat                               in a PostStage: the parent reduction's per-row result.
//   Bypass<K>                          in a PostStage: node K of the PARENT stage, not
//                                      recomputed. A tile-shaped (Tile-class) K travels in the
//                                      accumulator registers (at most ONE per stage boundary);
//                                      a per-row (Col-class) or scalar K travels in registers
//                                      [MBlocks][2] (any number).
// Reduce functors (include/comfuse/ops.def): identity, combine, finalize (mean: / true N).
#pragma once
#include "nodes.cuh"

namespace comfuse::epi {

struct ReduceSum {
  static COMFUSE_DEVICE float identity() { return 0.f; }
  static COMFUSE_DEVICE float combine(float a, float x) { return a + x; }
  static COMFUSE_DEVICE float finalize(float a, int) { return a; }
};
struct ReduceMean {
  static COMFUSE_DEVICE float identity() { return 0.f; }
  static COMFUSE_DEVICE float combine(float a, float x) { return a + x; }
  static COMFUSE_DEVICE float finalize(float a, int n) { return __fdiv_rn(a, float(n)); }
};
// Max and min as one FMNMX each. Like ops.def's (x > acc ? x : acc) from -inf, they drop NaN
// (fmaxf returns the other operand), in either operand: a combine tree may hold one in each.
struct ReduceMax {
  static COMFUSE_DEVICE float identity() { return -__int_as_float(0x7f800000); }
  static COMFUSE_DEVICE float combine(float a, float x) { return fmaxf(a, x); }
  static COMFUSE_DEVICE float finalize(float a, int) { return a; }
};
struct ReduceMin {
  static COMFUSE_DEVICE float identity() { return __int_as_float(0x7f800000); }
  static COMFUSE_DEVICE float combine(float a, float x) { return fminf(a, x); }
  static COMFUSE_DEVICE float finalize(float a, int) { return a; }
};

// Value classes: how a node's value varies over the tile.
enum : int { kClassScalar = 0, kClassCol = 1 /* one value per row */, kClassTile = 2 };

// The parent of a root stage: no bypass sources.
struct NoParent {
  static constexpr int cls(int) { return kClassTile; }
};

// The statistic of the parent reduction, per row (set by the parent before this stage runs).
struct Stat {
  static constexpr bool kIsStat = true;
  template <class Geo> struct Impl : PerRowNode<Geo> {};
};

// Node K of the parent stage. Tile-class: the fragment the executor passes as `acc` (the
// accumulator registers hold the bypassed tile value). Col/scalar-class: per-row registers
// the parent filled while streaming.
template <int K> struct Bypass {
  static constexpr int kSource = K;
  // Col/scalar class (the parent fills r); for a Tile-class source the executor writes `acc`.
  template <class Geo> struct Impl : PerRowNode<Geo> {};
};

// Terminal reduction of a stage: thread-local aggregation per row. Columns >= N enter as
// Op::identity() (whatever the operand computed there).
// Pair (Ψ sets it, L2 exchange or none; stage.cuh): two reductions of a chain whose statistics
// merge exactly from per-CTA partials share ONE exchange round.
//   kPairMeanM2      on a Mean whose PostStage reduces the mean of (operand - this mean)^2
//                    (LayerNorm's variance): the reduce phase also sums the squares about the
//                    CTA's own mean (several N-tiles: online, each tile's merged by Chan's formula)
//                    and exchanges (sum, M2); Chan's merge, exact when |mean| >> std.
//   kPairMaxExpSum   on a Max whose PostStage reduces the sum of exp(operand - this max)
//                    (softmax, log-softmax): the reduce phase also sums exp(x - the CTA's own
//                    max) (several N-tiles: online, tile by tile) and exchanges (max, sum); the
//                    online-softmax merge S = sum_j S_j exp(max_j - max).
//   kPairGiven       on that PostStage's reduction: it takes the merged second statistic from
//                    its parent instead of a round of its own.
//   kPairGivenKept   kPairGiven where the PostStage reads the max's operand x only through
//                    exp(x - max) (spec.h pair_keeps_exp; one N-tile a job): the parent leaves
//                    exp(x - its CTA's max) in x's registers from the sum it exchanged, and hands
//                    over exp(its CTA's max - the row's max) as the max; the PostStage's exp is
//                    then their product (stage.cuh visit_nodes). One exp a value, not two.
// Segment > 0 (FusionSpec::segment, KernelConfig::row_segment): the reduction spans each run of
// Segment columns, one tile's: finalize divides by it, and no round crosses a CTA.
enum : int { kPairNone = 0, kPairMeanM2 = 1, kPairGiven = 2, kPairMaxExpSum = 3, kPairGivenKept = 4 };
constexpr bool pair_given(int pair) { return pair == kPairGiven || pair == kPairGivenKept; }
template <class Op, int Operand, class PostStage, int Pair = kPairNone, int Segment = 0> struct Reduction {
  using ReduceOp = Op;
  using Post = PostStage;
  static constexpr int kPair = Pair;
  static constexpr int kSegment = Segment;
  static_assert(Segment == 0 || Pair == kPairNone, "a per-segment reduction has no exchange round to pair");
  static constexpr int kOperandIndex = Operand;
  static_assert(Pair != kPairMeanM2 || cute::is_same_v<Op, ReduceMean>, "kPairMeanM2: a mean reduction");
  static_assert(Pair != kPairMaxExpSum || cute::is_same_v<Op, ReduceMax>, "kPairMaxExpSum: a max reduction");
  static_assert(Pair != kPairGivenKept || cute::is_same_v<Op, ReduceSum>, "kPairGivenKept: a sum of exp");
  static constexpr bool kIsReduction = true;
  template <class Geo> struct Impl : NodeBase<Geo> {
    // Several N-tiles a job (Stash) keep the partials live through the next tiles' mainloops,
    // where 64x256 accumulators leave no registers for four a row (ptxas spilled): one there.
    static constexpr int kSlots = Geo::NTiles == 1 ? kRowSlots : 1;
    float a[Geo::MBlocks][2][kSlots];
    // Partials accumulate across the N-tiles of a job (Stash): reset on its first tile only.
    COMFUSE_DEVICE void begin(EpiCtx const& c, NoStorage&) {
      if (c.tile != 0) return;
      CUTE_UNROLL
      for (int mi = 0; mi < Geo::MBlocks; ++mi)
        CUTE_UNROLL
        for (int h = 0; h < 2; ++h)
          CUTE_UNROLL
          for (int k = 0; k < kSlots; ++k) a[mi][h][k] = Op::identity();
    }
    // kSlots running partials a row (nodes.cuh row_slot where there are kRowSlots: a dependency
    // chain a quarter as long; the chain, not the instruction count, paced these loops), each
    // value still one (predicated) combine.
    template <int I, class V> COMFUSE_DEVICE void visit(EpiCtx const& c, FragCoord const& fc, Frag const&, V& v) {
      static_assert(Operand < I, "operands must precede the node");
      int const n_valid = c.N - c.n0 - fc.col;  // columns of this fragment that exist: col < n_valid
      CUTE_UNROLL
      for (int e = 0; e < kFrag; ++e) {
        float& acc = a[fc.mi][(e >> 1) & 1][row_slot(e) % kSlots];
        // Four slots: a predicated combine (no select). One: the identity selected in, which
        // keeps the several-N-tile kernels' registers as they were (the predicated form spilled
        // one of them, a DSMEM 64x256 plan).
        if constexpr (kSlots == 1) acc = Op::combine(acc, frag_col(e) < n_valid ? v[Operand][e] : Op::identity());
        else if (frag_col(e) < n_valid) acc = Op::combine(acc, v[Operand][e]);
        v[I][e] = 0.f;
      }
    }
    // The row's partial of this thread (the reduce phase's start): the slots folded as a tree.
    COMFUSE_DEVICE float partial(int mi, int h) const {
      float x[kSlots];
      CUTE_UNROLL
      for (int k = 0; k < kSlots; ++k) x[k] = a[mi][h][k];
      return fold_pairwise<Op>(x);
    }
  };
};

namespace detail {
template <class N, class = void> struct is_reduction : cute::false_type {};
template <class N> struct is_reduction<N, cute::void_t<decltype(N::kIsReduction)>> : cute::true_type {};
template <class N, class = void> struct is_stat : cute::false_type {};
template <class N> struct is_stat<N, cute::void_t<decltype(N::kIsStat)>> : cute::true_type {};
template <class N, class = void> struct bypass_source { static constexpr int value = -1; };
template <class N> struct bypass_source<N, cute::void_t<decltype(N::kSource)>> { static constexpr int value = N::kSource; };

// Value class of a node from its operands' classes (cls) and the parent's (P::cls).
template <class N> struct NodeClass { template <class P> static constexpr int get(int const*) { return kClassTile; } };
template <int A> struct NodeClass<ScalarArg<A>> { template <class P> static constexpr int get(int const*) { return kClassScalar; } };
template <class L> struct NodeClass<ScalarLiteral<L>> { template <class P> static constexpr int get(int const*) { return kClassScalar; } };
template <int A, class T> struct NodeClass<ColBroadcast<A, T>> { template <class P> static constexpr int get(int const*) { return kClassCol; } };
template <> struct NodeClass<Stat> { template <class P> static constexpr int get(int const*) { return kClassCol; } };
template <int K> struct NodeClass<Bypass<K>> { template <class P> static constexpr int get(int const*) { return P::cls(K); } };
template <class Op, int A, int B> struct NodeClass<Compute<Op, A, B>> {
  template <class P> static constexpr int get(int const* c) { return B < 0 ? c[A] : (c[A] > c[B] ? c[A] : c[B]); }
};
template <class T, int S> struct NodeClass<Cast<T, S>> { template <class P> static constexpr int get(int const* c) { return c[S]; } };
template <int O, class T, int S> struct NodeClass<Store<O, T, S>> { template <class P> static constexpr int get(int const* c) { return c[S]; } };
template <int O, class T, int S> struct NodeClass<StoreCol<O, T, S>> { template <class P> static constexpr int get(int const* c) { return c[S]; } };
template <int S> struct NodeClass<ToOperand<S>> { template <class P> static constexpr int get(int const* c) { return c[S]; } };
template <int S> struct NodeClass<CausalMask<S>> { template <class P> static constexpr int get(int const*) { return kClassTile; } };
template <class Op, int A, class S, int Pr, int Sg> struct NodeClass<Reduction<Op, A, S, Pr, Sg>> { template <class P> static constexpr int get(int const*) { return kClassCol; } };

template <int N> struct IntArr { int v[N > 0 ? N : 1]; };
template <class P, class... Nodes> struct StageClasses {
  static constexpr IntArr<sizeof...(Nodes)> make() {
    IntArr<sizeof...(Nodes)> a{};
    int i = 0;
    ((a.v[i] = NodeClass<Nodes>::template get<P>(a.v), ++i), ...);
    return a;
  }
  static constexpr IntArr<sizeof...(Nodes)> value = make();
  static constexpr int cls(int k) { return value.v[k]; }
};
}  // namespace detail

}  // namespace comfuse::epi
