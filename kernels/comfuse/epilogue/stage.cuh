// comfuse/epilogue/stage.cuh: the Stage-Stream epilogue executor (elementwise + broadcast).
//
//   using Epi = comfuse::epi::Stage<AccEntry, RowBroadcast<0, bf16>, Compute<Add, 0, 1>, ...,
//                                   Store<0, bf16, k>>;
//
// Nodes are topologically ordered and name their operands by index. Per tile, one
// consumer warp group: begin() of every node (vectors -> SMEM/registers, scalars ->
// registers), then the tile streams subtile by subtile (64 columns): for every fragment
// (8 accumulator values, one stmatrix worth) vals[I] = node I (vals[operands]), in
// registers (the index loops unroll completely, so vals never leaves them and nodes whose
// value nobody reads are dead code). Store nodes write their fragment into their SMEM
// staging buffer (a PostStage's may borrow a root store's: lend_staging, Store's Borrow); at the subtile's end every thread fences (generic -> async proxy), the
// warp group syncs, one thread issues the TMA stores; before the next subtile rewrites
// the buffers that thread waits until the previous stores have read SMEM.
//
// Reductions (epilogue/reduce.cuh, cluster/dsmem.cuh, cluster/global_exchange.cuh):
//  * Reduction<Op, Operand, PostStage> is the terminal node of its Stage. In the compute
//    phase it aggregates its operand thread-locally per row ([MBlocks][2] registers; columns
//    >= N enter as Op's identity). Reduce phase (run by this executor):
//      (1) quad butterfly (shfl.xor 1, 2): in the wgmma accumulator layout all columns of a
//          row that a warp group holds live in the 4 threads of one quad of one warp;
//      (2) across the warps of the warp group: a no-op for row reductions, since warp w holds
//          rows 16w..16w+15 of each 64-row block exclusively (no two warps share a row), so
//          no SMEM step is needed (it would be for column reductions);
//      (3) across the cluster's CTAs over DSMEM: cluster/dsmem.cuh (PeerToPeer or
//          LeaderFollower, TMA bulk copies completing on mbarriers) through ONE unified
//          reduction buffer per consumer warp group (SharedStorage::chan), reused by every
//          reduction of the chain (a round counter gives buffer and parity); or, for a row
//          group of clusters (Aggregation::L2Exchange), across clusters through one L2 exchange
//          slot per warp group (cluster/global_exchange.cuh), reused the same way.
//    Op::finalize (mean: / true N), then the PostStage runs with the statistic bound to its
//    Stat node. Its begin() (vector loads) ran with the root stage's at the start of the job
//    (one N-tile a job: every stage's, under one barrier, begin_phase<true>), or overlaps the
//    round (several N-tiles: that of the tile it streams first, kFirstTile).
//    Paired statistics (Reduction kPair*, set by Ψ, reduce.cuh): mean then variance
//    (LayerNorm) or max then sum of exp (softmax): the first reduction's reduce phase also makes
//    its CTA's second statistic from the registers (squares about the CTA's own mean; exp about
//    its own max; over several N-tiles, the root stage's pair only, either accumulates online,
//    tile by tile: online_second) and exchanges both in ONE round, merged exactly (Chan; online
//    softmax); the second reduction takes the merged value without a round.
//    One group-wide synchronization a job instead of two.
//  * Bypass<K> in a PostStage reads node K of the parent stage. A Tile-class K is written
//    back, fragment by fragment, into the accumulator registers (dead after AccEntry read
//    them; every fragment is read before it is overwritten), and the PostStage streams those
//    registers as its `acc`: at most ONE tile-shaped value per stage boundary (static_assert).
//    Col-class (per-row) or scalar K are captured into the Bypass node's [MBlocks][2]
//    registers from the first fragment.
//  * Geometry carries RowPeers (the CTAs that share a row: the cluster along N over DSMEM, or
//    a row group of clusters exchanging through L2 with Aggregation::L2Exchange) and the mode.
//  * Stash (Geometry::NTiles = T > 1, epilogue/stash.cuh): a job is T N-tiles of one row block
//    (tile t at n0 + t * RowPeers * BN). The root stage runs its compute phase once per tile
//    (run_tile, right after that tile's mainloop), its reduction partials accumulating across
//    the tiles (Reduction::begin resets them on tile 0 only), and puts its kTileBypass value of
//    tile t < T-1 into stash slot t (tile T-1: the accumulator registers, as with T == 1). After
//    the last tile the reduce phase runs once (one cluster round per reduction, as with T == 1);
//    every PostStage then streams over the T tiles (begin_phase per tile: its vectors are the
//    tile's columns; tile 0's begin overlaps the DSMEM round), reading its bypassed tile value
//    from slot t (or the registers) and writing its own kTileBypass value back in place. Where a
//    pair's round gave a PostStage its statistic and the stage after it is the chain's last, the
//    two stream together instead (kFusedStream): last tile first, nothing written back.
#pragma once
#include "nodes.cuh"
#include "reduce.cuh"
#include "stash.cuh"
#include "../cluster/dsmem.cuh"
#include "../cluster/global_exchange.cuh"

namespace comfuse::epi {

// Tile geometry of one consumer warp group.
// RowPeers: CTAs that hold the same rows at the same time (tile t of a job sits at
// n0 + t * RowPeers * BN); they are one cluster along N unless Agg == Global.
// ClusterM: CTAs of a 2-D cluster along M (the DSMEM channel then joins the row's CTAs only).
// RetireEarly: a warp group counts itself out of the L2 exchange after its last job's last round
// (Rounds): one-wave kernels, whose epilogue is the launch's tail; elsewhere the count's register
// would stay live through every epilogue for ~0.7 us a launch.
// ConsumerWGs: the kernel's consumer warp groups (KernelConfig::consumer_wgs), all counted out.
template <int BM_, int BN_, int RowPeers_ = 1, Aggregation Agg_ = Aggregation::None, int NTiles_ = 1,
          bool Batched_ = false, int ClusterM_ = 1, bool RetireEarly_ = false, int ConsumerWGs_ = Sm90::kConsumerWGs,
          bool PairHandOver_ = false, bool PollBackoff_ = false, int StoreStages_ = 1>
struct Geometry {
  static constexpr int ConsumerWGs = ConsumerWGs_;
  // KernelConfig::pair_hand_over: the L2 channel hands decode jobs' pair rounds between warps.
  static constexpr bool kPairHandOver = PairHandOver_;
  // KernelConfig::poll_backoff: the L2 channel's polls pause between tries.
  static constexpr bool kPollBackoff = PollBackoff_;
  static constexpr bool kRetireEarly = RetireEarly_ && Agg_ == Aggregation::L2Exchange;
  static constexpr int BM = BM_, BN = BN_, RowPeers = RowPeers_, ClusterM = ClusterM_;
  static constexpr bool kBatched = Batched_;  // tensors carry a leading batch dim (EpiCtx::batch)
  static constexpr int NTiles = NTiles_;  // N-tiles of a job (Stash); 1: one tile, no stash
  static constexpr Aggregation Agg = Agg_;
  static constexpr int MBlocks = BM / 64;   // m64 wgmma blocks
  static constexpr int SubTiles = BN / 64;  // 64-column store subtiles
  // KernelConfig::store_stages: staging buffers of each tile output, subtile s in buffer
  // s mod StoreStages.
  static constexpr int StoreStages = StoreStages_;
  static_assert(StoreStages == 1 || StoreStages == 2);
};

namespace detail {
template <class N, class = void> struct is_store : cute::false_type {};
template <class N> struct is_store<N, cute::void_t<decltype(N::kIsStore)>> : cute::true_type {};
template <class N, class = void> struct is_col_store : cute::false_type {};
template <class N> struct is_col_store<N, cute::void_t<decltype(N::kIsColStore)>> : cute::true_type {};
template <class N, class = void> struct is_rotate : cute::false_type {};
template <class N> struct is_rotate<N, cute::void_t<decltype(N::kRotateSrc)>> : cute::true_type {};
// Nodes whose visit does more than compute its value (writes SMEM or global memory, accumulates).
template <class N> inline constexpr bool has_effect_v = is_store<N>::value || is_col_store<N>::value || is_reduction<N>::value;

// SharedStorage of a node list: one byte array, each node's storage at a constexpr offset.
// 1024-aligned storages (TMA staging) come first, the rest after; empty ones take no bytes.
template <class... S> struct StorageLayout {
  static constexpr int kN = sizeof...(S);
  static constexpr size_t size_of(size_t i) {
    constexpr size_t sz[] = {(cute::is_empty<S>::value ? 0 : sizeof(S))..., 0};
    return sz[i];
  }
  static constexpr size_t align_of(size_t i) {
    constexpr size_t al[] = {alignof(S)..., 1};
    return al[i];
  }
  static constexpr size_t offset(size_t want) {
    size_t off = 0;
    for (int pass = 0; pass < 2; ++pass)
      for (size_t i = 0; i < size_t(kN); ++i) {
        if ((align_of(i) >= 1024) != (pass == 0)) continue;
        off = (off + align_of(i) - 1) / align_of(i) * align_of(i);
        if (i == want) return off;
        off += size_of(i);
      }
    return off;  // want == kN: the total
  }
  static constexpr size_t kBytes = (offset(kN) + 1023) / 1024 * 1024;
  struct alignas(1024) Storage {
    unsigned char bytes[kBytes > 0 ? kBytes : 1];
  };
};
template <int I, class Types, class L> COMFUSE_DEVICE auto& storage_get(L& l) {
  using S = cute::tuple_element_t<I, Types>;
  return *reinterpret_cast<S*>(l.bytes + L::template offset_of<I>());
}
}  // namespace detail


namespace detail {
template <class S, class = void> struct post_of { using type = void; };
template <class S> struct post_of<S, cute::void_t<typename S::Post>> { using type = typename S::Post; };
struct NoTree {};
// Compute<Div, A, B>: its operands (the executor divides by a per-row divisor with a reciprocal).
template <class N> struct divisor_of { static constexpr int value = -1; };
template <int A, int B> struct divisor_of<Compute<Div, A, B>> { static constexpr int value = B; };
template <class N> struct dividend_of { static constexpr int value = -1; };
template <int A, int B> struct dividend_of<Compute<Div, A, B>> { static constexpr int value = A; };
// Compute<Exp, S>: its operand (the executor folds exp(a - b) of a per-row b into one FFMA).
template <class N> struct exp_operand_of { static constexpr int value = -1; };
template <int S> struct exp_operand_of<Compute<Exp, S>> { static constexpr int value = S; };
// Compute<Sub, A, B>'s operands (-1: another node).
template <class N> struct sub_of { static constexpr int a = -1, b = -1; };
template <int A, int B> struct sub_of<Compute<Sub, A, B>> { static constexpr int a = A, b = B; };
template <class N, class = void> struct pair_of { static constexpr int value = 0; };
template <class N> struct pair_of<N, cute::void_t<decltype(N::kPair)>> { static constexpr int value = N::kPair; };
struct NoTreeHolder {
  using TreeStorage = NoTree;
};
// A Store writing through the root stage's staging (Store's Borrow).
template <class N, class = void> struct borrows_staging : cute::false_type {};
template <class N> struct borrows_staging<N, cute::void_t<decltype(N::kBorrows)>> {
  static constexpr bool value = N::kBorrows;
};
// A node Impl's bytes in the mainloop's ring slot (TileInput::Impl::kRingBytes; others none).
template <class I, class = void> struct ring_bytes_of { static constexpr int value = 0; };
template <class I> struct ring_bytes_of<I, cute::void_t<decltype(I::kRingBytes)>> {
  static constexpr int value = I::kRingBytes;
};
// run_tile's hook after the root stage's body: nothing by default.
struct NoHook {
  COMFUSE_DEVICE void operator()() const {}
};
// RowPeers == 1: the reduce phase ends after the quad shuffles.
struct NoChannel {
  struct Storage {};
  static constexpr bool kOnChip = false;
};
}  // namespace detail

// A warp group's cluster rounds, the root stage's, passed down the chain: their count (the next
// round's buffer and parity). With Geometry::kRetireEarly also: whether the job is its last (set
// by the kernel), then the chain's last round counts it out of the L2 exchange, and the count's
// result, which the kernel reads at exit (cluster/global_exchange.cuh start_retire /
// finish_retire).
// pairs: the pair rounds among them (the L2 channel's hand-over buffer, global_exchange.cuh).
template <bool RetireEarly> struct Rounds {
  uint32_t n = 0, pairs = 0;
};
template <> struct Rounds<true> {
  uint32_t n = 0, pairs = 0;
  bool retire_after = false;
  bool retired = false;
  uint32_t retire_before = 0;
};

template <class... Nodes> struct Stage {
  static constexpr int kNumNodes = sizeof...(Nodes);
  static constexpr int kNumStores = (0 + ... + int(detail::is_store<Nodes>::value));
  static constexpr bool kHasStores = kNumStores > 0;
  using Last = cute::tuple_element_t<kNumNodes - 1, cute::tuple<Nodes...>>;
  static constexpr bool kEndsInReduction = detail::is_reduction<Last>::value;
  static constexpr bool kUsesGate = (false || ... || cute::is_same_v<Nodes, GateEntry>);  // reads EpiCtx::gate
  static_assert((0 + ... + int(detail::is_reduction<Nodes>::value)) == int(kEndsInReduction),
                "ComFuse: a Reduction must be the last (terminal) node of its Stage, one per Stage");
  static_assert((0 + ... + int(detail::is_stat<Nodes>::value)) <= 1, "ComFuse: at most one Stat node per Stage");
  using PostStage = typename detail::post_of<Last>::type;  // void: none
  static constexpr bool kHasPostStage = !cute::is_void_v<PostStage>;

  // The one parent node whose tile-shaped value this stage bypasses (-1: none, -2: several).
  template <class P> static constexpr int tile_bypass_source() {
    int src = -1;
    int const srcs[] = {detail::bypass_source<Nodes>::value...};
    for (int k : srcs)
      if (k >= 0 && P::cls(k) == kClassTile) src = (src < 0 || src == k) ? k : -2;
    return src;
  }

  template <class Geo, class Parent = NoParent> struct Exec {
    using Classes = detail::StageClasses<Parent, Nodes...>;
    using Impls = cute::tuple<typename Nodes::template Impl<Geo>...>;
    using Layout = detail::StorageLayout<typename Nodes::template Impl<Geo>::SharedStorage...>;
    using StorageTypes = cute::tuple<typename Nodes::template Impl<Geo>::SharedStorage...>;
    static constexpr bool kHasPost = kHasPostStage;
    using PostS = cute::conditional_t<kHasPost, PostStage, Stage<AccEntry>>;  // dummy when none
    using PostExec = typename PostS::template Exec<Geo, cute::conditional_t<kHasPost, Classes, NoParent>>;
    static constexpr bool kClusterReduce = kEndsInReduction && Geo::RowPeers > 1;
    static constexpr int kPeers = cute::max(Geo::RowPeers, 2);
    using Chan = cute::conditional_t<
        !kClusterReduce, detail::NoChannel,
        cute::conditional_t<Geo::Agg == Aggregation::L2Exchange,
                            cluster::GlobalRowAllReduce<Geo::BM, kPeers, Geo::kPairHandOver, Geo::kPollBackoff>,
                            cluster::RowAllReduce<Geo::BM, cute::min(kPeers, 16), Geo::Agg, Geo::ClusterM>>>;
    using ChanStorage = typename Chan::Storage;
    static_assert(cute::is_same_v<Parent, NoParent> || (0 + ... + int(cute::is_same_v<Nodes, AccEntry>)) == 0,
                  "ComFuse: AccEntry only in the root stage; a PostOp stage reads the accumulator through Bypass");
    static_assert(!kHasPost || PostS::template tile_bypass_source<Classes>() != -2,
                  "ComFuse: a PostOp stage may bypass at most ONE tile-shaped value of its parent (it travels in the "
                  "accumulator registers); recompute the others or chain them through one value");
    static constexpr int kTileBypass = kHasPost ? PostS::template tile_bypass_source<Classes>() : -1;
    // rotate_half reads its partner fragments from the accumulator registers (visit_nodes); the
    // tile value carried to the PostStage is written back into them fragment by fragment, so it
    // must be what they hold already: the accumulator or the tile this stage bypassed in (Φ,
    // lower.cpp evict_rotate_hazards, keeps other rotate_halfs out).
    static constexpr bool kHasRotate = (false || ... || detail::is_rotate<Nodes>::value);
    template <int K> static constexpr bool holds_input_tile() {
      using N = cute::tuple_element_t<K, cute::tuple<Nodes...>>;
      constexpr int src = detail::bypass_source<N>::value;
      if constexpr (cute::is_same_v<N, AccEntry>) return true;
      else if constexpr (src >= 0) return Parent::cls(src) == kClassTile;
      else return false;
    }
    static_assert(!kHasRotate || kTileBypass < 0 || holds_input_tile<cute::max(kTileBypass, 0)>(),
                  "ComFuse: rotate_half's stage writes another tile value back into the registers it reads");
    // The partner evaluation moves the accumulator, not EpiCtx::gate (Φ keeps rotations out of gated kernels).
    static_assert(!(kHasRotate && kUsesGate), "ComFuse: rotate_half in a gated kernel's epilogue");
    // A rotate_half whose operand is kept in place (nodes.cuh RotateHalf, InPlace): that operand's
    // index and the run length (-1, 0: none).
    template <class N> static constexpr int in_place_src() {
      if constexpr (detail::is_rotate<N>::value) return N::kInPlace ? N::kRotateSrc : -1;
      else return -1;
    }
    template <class N> static constexpr int in_place_segment() {
      if constexpr (detail::is_rotate<N>::value) return N::kInPlace ? N::kSegment : 0;
      else return 0;
    }
    static constexpr int kInPlaceSrc = cute::max(-1, in_place_src<Nodes>()...);
    static constexpr int kInPlaceSegment = cute::max(0, in_place_segment<Nodes>()...);
    template <int... I> static constexpr bool effect_free_up_to(cute::integer_sequence<int, I...>, int last) {
      return (true && ... && (I > last || !detail::has_effect_v<cute::tuple_element_t<I, cute::tuple<Nodes...>>>));
    }
    // What spec.h rotate_in_place guarantees and the read-back relies on.
    static_assert(kInPlaceSrc < 0 || !kHasPost,
                  "ComFuse: rotate_half's operand in place overwrites registers a PostStage would read");
    static_assert(kInPlaceSrc < 0 || (0 + ... + int(detail::is_rotate<Nodes>::value)) == 1,
                  "ComFuse: rotate_half's operand in place beside another rotate_half, which reads the registers");
    static_assert(kInPlaceSrc < 0 || effect_free_up_to(cute::make_int_sequence<kNumNodes>{}, kInPlaceSrc),
                  "ComFuse: a store or reduction up to rotate_half's operand in place, skipped where it is read back");
    // Whether any stage boundary from here on carries a tile-shaped value (a job of several
    // N-tiles then needs a stash for it).
    static constexpr bool carries_tile() {
      if constexpr (kHasPost) return kTileBypass >= 0 || PostExec::kCarriesTile;
      else return false;
    }
    static constexpr bool kCarriesTile = carries_tile();
    // Cluster rounds from this stage on (a pair's second statistic comes with its parent's round).
    static constexpr int chain_rounds() {
      int const here = kClusterReduce && !pair_given(detail::pair_of<Last>::value) ? 1 : 0;
      if constexpr (kHasPost) return here + PostExec::kChainRounds;
      else return here;
    }
    static constexpr int kChainRounds = chain_rounds();
    // No round after this stage's. (Under if constexpr: the last stage must not instantiate the
    // dummy PostExec, whose static_asserts NVRTC then evaluates against this kernel's Geometry.)
    static constexpr bool last_round() {
      if constexpr (kHasPost) return PostExec::kChainRounds == 0;
      else return true;
    }
    static constexpr bool kLastRound = last_round();
    // Whether a pair of reductions merges in one round from this stage on.
    static constexpr bool chain_pairs() {
      constexpr int pair = detail::pair_of<Last>::value;
      constexpr bool here = pair == kPairMeanM2 || pair == kPairMaxExpSum;
      if constexpr (kHasPost) return here || PostExec::kChainPairs;
      else return here;
    }
    static constexpr bool kChainPairs = chain_pairs();
    static_assert(!cute::is_same_v<Parent, NoParent> || !Geo::kPairHandOver || kChainPairs,
                  "ComFuse: KernelConfig::pair_hand_over without a pair round in the epilogue");

    struct alignas(1024) NodesFull : Layout::Storage {
      template <int I> static constexpr size_t offset_of() { return Layout::offset(I); }
    };
    struct NodesEmpty {
      unsigned char bytes[1];
      template <int I> static constexpr size_t offset_of() { return 0; }
    };
    using NodesStorage = cute::conditional_t<(Layout::offset(Layout::kN) > 0), NodesFull, NodesEmpty>;
    // No empty members: an empty struct next to a 1024-aligned one would cost 1 KB. So per
    // warp group: the sum over stages of align_up(node bytes, 1024) (0 for a stage without),
    // plus the channel (when it exists): the planner's epilogue model (src/plan/storage.cpp)
    // and KernelConfig::epilogue_smem_bytes.
    static constexpr bool kNodeBytes = Layout::offset(Layout::kN) > 0;
    using PostTree = typename cute::conditional_t<kHasPost, PostExec, detail::NoTreeHolder>::TreeStorage;
    // Whether this stage or a later one keeps anything in SMEM (a tree without storage takes none).
    static constexpr bool tree_has_storage() {
      if constexpr (kHasPost) return kNodeBytes || PostExec::kTreeHasStorage;
      else return kNodeBytes;
    }
    static constexpr bool kTreeHasStorage = tree_has_storage();
    static constexpr bool tree_has_post_storage() {
      if constexpr (kHasPost) return PostExec::kTreeHasStorage;
      else return false;
    }
    struct TreeNodesPost {
      NodesStorage nodes;
      PostTree post;
    };
    struct TreePost {
      PostTree post;
    };
    struct TreeNodes {
      NodesStorage nodes;
    };
    using TreeStorage = cute::conditional_t<
        tree_has_post_storage(), cute::conditional_t<kNodeBytes, TreeNodesPost, TreePost>,
        cute::conditional_t<kNodeBytes, TreeNodes, detail::NoTree>>;
    // A stage without node storage hands its nodes a dummy (their SharedStorage is empty); a
    // chain whose later stages keep nothing hands them a dummy tree likewise.
    static COMFUSE_DEVICE NodesStorage& nodes_of(TreeStorage& ts) {
      if constexpr (kNodeBytes) return ts.nodes;
      else return *reinterpret_cast<NodesStorage*>(&ts);
    }
    static COMFUSE_DEVICE PostTree& post_tree(TreeStorage& ts) {
      if constexpr (tree_has_post_storage()) return ts.post;
      else return *reinterpret_cast<PostTree*>(&ts);
    }
    struct SharedTreeChan {  // per consumer warp group: every stage's node storage + ONE channel
      TreeStorage tree;
      ChanStorage chan;
    };
    struct SharedTree {
      TreeStorage tree;
    };
    struct SharedChan {
      ChanStorage chan;
    };
    // A channel that keeps nothing on chip (the L2 exchange but for its hand-over) gets no (empty,
    // 1 KiB-padded) member.
    static constexpr bool kChanInSmem = kClusterReduce && Chan::kOnChip;
    using SharedStorage = cute::conditional_t<
        kChanInSmem, cute::conditional_t<kTreeHasStorage, SharedTreeChan, SharedChan>,
        cute::conditional_t<kTreeHasStorage, SharedTree, detail::NoTree>>;
    static COMFUSE_DEVICE TreeStorage& tree_of(SharedStorage& ss) {
      if constexpr (kTreeHasStorage) return ss.tree;
      else return *reinterpret_cast<TreeStorage*>(&ss);
    }

    Impls impls;
    cute::conditional_t<kHasPost, PostExec, detail::NoTree> post;
    Rounds<Geo::kRetireEarly> rounds;  // this warp group's channel's rounds (root stage only)
    // The columns and batch of this stage's last begin (EpiCtx::same_columns); none yet.
    int begun_n0 = -1, begun_batch = -1;
    // The next begin's loads were fetched (begin_early; EpiCtx::fetched).
    bool fetched = false;
    // Reduction kPair*: a pair here (kPairMeanM2, kPairMaxExpSum) makes the PostStage's
    // reduction kPairGiven (it takes `given`, the row's merged second statistic, from this
    // stage's one round).
    static constexpr int kPair = detail::pair_of<Last>::value;
    static constexpr bool kPairFirst = kPair == kPairMeanM2 || kPair == kPairMaxExpSum;
    // Several N-tiles a job: the second statistic accumulates online across them (online_second),
    // each tile's values still in registers after its body: the sum of exp about a running max
    // (online softmax), or the squares about a running mean (Chan's merge of each tile's).
    static constexpr bool kPairOnline = kPairFirst && Geo::NTiles > 1;
    static constexpr bool kGiven = pair_given(kPair);
    // The PostStage takes its pair's exp from this stage's registers (kPairGivenKept).
    static constexpr bool keeps_exp() {
      if constexpr (kHasPost) return kPair == kPairMaxExpSum && PostExec::kPair == kPairGivenKept;
      else return false;
    }
    static constexpr bool kKeepsExp = keeps_exp();
    static_assert(!kKeepsExp || Geo::NTiles == 1, "kPairGivenKept: one N-tile a job (the tile in the registers)");
    // kPairGivenKept: the node of the pair's exp (this stage's sum's operand); -1: none.
    static constexpr int kept_exp_node() {
      if constexpr (kPair == kPairGivenKept) return Last::kOperandIndex;
      else return -1;
    }
    static constexpr int kKeptExpNode = kept_exp_node();
    static_assert(!kPairOnline || cute::is_same_v<Parent, NoParent>,
                  "Pair: over several N-tiles, only the root stage's (run_tile sums it online, tile by tile)");
    static_assert(!kPairFirst || !kClusterReduce || Geo::Agg == Aggregation::L2Exchange,
                  "Pair: the L2 exchange (row groups) or no exchange; the DSMEM channel has no pair round");
    float given[Geo::MBlocks][2];
    // kPairOnline: this thread's running second statistic a row over its values of the job's tiles
    // so far, about `online_center`: kPairMaxExpSum the sum of exp(x - center), center its running
    // max (0 while that is -inf); kPairMeanM2 the sum of squares about its running mean (the
    // Reduction's partial over `online_n`, its values so far: the same count for every row of the
    // thread), no center kept.
    float online_sum[Geo::MBlocks][2], online_center[Geo::MBlocks][2];
    float online_n;
    // kKeepsExp: the CTA's own row max, which centred the exps left in the registers.
    float kept_max[Geo::MBlocks][2];

    static constexpr bool kRoot = cute::is_same_v<Parent, NoParent>;
    // Whether a node of the root stage starts its tile's inputs early (TileInput's L2
    // prefetch): the kernel then calls prefetch() before each tile's mainloop.
    static constexpr bool kRootLoads = (false || ... || Nodes::template Impl<Geo>::kLoads);
    // A store of this stage writes through a root store's staging: its body first waits for the
    // root's TMA stores to have read it.
    static constexpr bool kBorrows = (false || ... || detail::borrows_staging<Nodes>::value);
    static_assert(!kBorrows || !kRoot, "ComFuse: the root stage's stores keep their own staging");
    // The bytes of a ring slot that this stage's tile inputs take (TileInput with Box0 >= 0:
    // the root stage's, KernelConfig::ring_input_bytes), and their TMA loads into one slot (the
    // producer thread; box(b): the slot's box b).
    static constexpr int kRingInputBytes = (0 + ... + detail::ring_bytes_of<typename Nodes::template Impl<Geo>>::value);
    template <class BoxAt>
    static COMFUSE_DEVICE void load_ring(Params const& p, uint64_t* bar, BoxAt const& box, int m0, int n0) {
      cute::for_each(cute::make_int_sequence<kNumNodes>{}, [&](auto i) {
        using Impl = cute::tuple_element_t<decltype(i)::value, Impls>;
        if constexpr (detail::ring_bytes_of<Impl>::value > 0) Impl::load_ring(p, bar, box, m0, n0);
      });
    }

    // One thread per CTA, before the kernel's first cluster barrier.
    static COMFUSE_DEVICE void init_shared(SharedStorage& ss) {
      if constexpr (kChanInSmem) Chan::init(ss.chan);
      init_nodes(tree_of(ss));
    }
    static COMFUSE_DEVICE void init_nodes(TreeStorage& ts) {
      cute::for_each(cute::make_int_sequence<kNumNodes>{}, [&](auto i) {
        using Impl = cute::tuple_element_t<decltype(i)::value, Impls>;
        Impl::init(detail::storage_get<decltype(i)::value, StorageTypes>(nodes_of(ts)));
      });
      if constexpr (kHasPost) PostExec::init_nodes(post_tree(ts));
    }
    // One thread per CTA at the kernel's start: every stage's output descriptors (Store) fetched
    // ahead of their first TMA store (common.cuh's prefetch_tma_descriptor).
    static COMFUSE_DEVICE void prefetch_descriptors(Params const& p) {
      cute::for_each(cute::make_int_sequence<kNumNodes>{}, [&](auto i) {
        cute::tuple_element_t<decltype(i)::value, Impls>::prefetch_descriptors(p);
      });
      if constexpr (kHasPost) PostExec::prefetch_descriptors(p);
    }

    // The root stage's input prefetches of tile c (TileInput: into L2), started before the
    // tile's mainloop so that they land while the tensor cores work. Later stages start theirs
    // at their begin(). They write no SMEM: no barrier orders them after the previous tile.
    COMFUSE_DEVICE void prefetch(EpiCtx const& c, SharedStorage& ss) {
      if constexpr (kRootLoads) load_nodes(c, tree_of(ss));
    }
    COMFUSE_DEVICE void load_nodes(EpiCtx const& c, TreeStorage& ts) {
      cute::for_each(cute::make_int_sequence<kNumNodes>{}, [&](auto i) {
        cute::get<decltype(i)::value>(impls).load(c, detail::storage_get<decltype(i)::value, StorageTypes>(nodes_of(ts)));
      });
    }

    // Once per tile: every node's begin() (vectors -> SMEM), published by a barrier.
    // WithChain (the root stage, run_tile) with one N-tile a job: every later stage begins here
    // too (its vectors are the same tile's columns and its SMEM its own: TreeStorage nests every
    // stage's node storage), all loads in flight at once under ONE barrier, instead of a
    // begin_phase with its barriers inside each cluster round (measured: the pair rounds of
    // softmax / log-softmax went from 616k to 587k ncu cycles at 8192x4096x4096 with it).
    template <bool WithChain = false>
    COMFUSE_DEVICE void begin_phase(EpiCtx const& c, TreeStorage& ts, int bar_id) {
      constexpr bool kChain = WithChain && kHasPost && Geo::NTiles == 1;
      // The previous job's readers of this SMEM must be done before begin() rewrites it: a
      // stage with stores ends on a barrier after its last read, one without does not (nor,
      // in general, does the last stage of a chain).
      if constexpr (!kHasStores || kChain) named_sync(bar_id, kWarpGroupThreads);
      begin_nodes(c, ts);
      if constexpr (kChain) post.begin_nodes_chain(c, post_tree(ts));
      // Before the first subtile rewrites the staging buffers, the previous tile's stores
      // must have read them; the same barrier publishes the vectors begin() wrote.
      if constexpr (kHasStores || kChain) {
        if (c.t == 0) tma_store_wait_read<0>();
      }
      named_sync(bar_id, kWarpGroupThreads);
    }
    COMFUSE_DEVICE void begin_nodes(EpiCtx const& c0, TreeStorage& ts) {
      if constexpr (!kRoot) load_nodes(c0, ts);  // the root's were prefetched
      EpiCtx c = c0;
      c.same_columns = c.n0 == begun_n0 && c.batch == begun_batch;
      c.fetched = fetched;
      begun_n0 = c.n0, begun_batch = c.batch, fetched = false;
      cute::for_each(cute::make_int_sequence<kNumNodes>{}, [&](auto i) {
        cute::get<decltype(i)::value>(impls).begin(c, detail::storage_get<decltype(i)::value, StorageTypes>(nodes_of(ts)));
      });
    }
    // This stage's begin() and every later stage's; no barrier (the root's publishes them).
    COMFUSE_DEVICE void begin_nodes_chain(EpiCtx const& c, TreeStorage& ts) {
      begin_nodes(c, ts);
      if constexpr (kHasPost) post.begin_nodes_chain(c, post_tree(ts));
    }

    // One fragment through nodes 0..Last (Tile-class Bypass nodes read `acc`). acc_at(off, f)
    // loads the accumulator fragment `off` columns from this one (rotate_half's partner).
    // kPartner: evaluating a rotate_half's operand at its partner fragment, where nodes with
    // effects (stores, the reduction) are left out: their own fragment runs them.
    // acc_put(off, f) writes f into the accumulator registers of the fragment `off` columns on
    // (a rotate_half's operand in place, kInPlaceSrc): only where kPartner is false.
    template <int Last = kNumNodes - 1, bool kPartner = false, class V, class AccAt, class AccPut>
    COMFUSE_DEVICE void visit_nodes(EpiCtx const& c, FragCoord const& fc, Frag const& acc, V& vals, AccAt const& acc_at,
                                    AccPut const& acc_put) {
      // A run's second half with the operand in place: `acc` holds it, computed by the first half.
      bool const read_back = !kPartner && kInPlaceSrc >= 0 && fc.col0 % cute::max(kInPlaceSegment, 1) >= kInPlaceSegment / 2;
      cute::for_each(cute::make_int_sequence<Last + 1>{}, [&](auto i) {
        constexpr int I = decltype(i)::value;
        using N = cute::tuple_element_t<I, cute::tuple<Nodes...>>;
        constexpr int src = detail::bypass_source<N>::value;
        if (I <= kInPlaceSrc && read_back) {
          if constexpr (I == kInPlaceSrc) {
            CUTE_UNROLL
            for (int e = 0; e < kFrag; ++e) vals[I][e] = acc[e];
          }
          return;
        }
        if constexpr (kPartner && detail::has_effect_v<N>) {
        } else if constexpr (src >= 0 && Parent::cls(src) == kClassTile) {
          CUTE_UNROLL
          for (int e = 0; e < kFrag; ++e) vals[I][e] = acc[e];
        } else if constexpr (detail::divisor_of<N>::value >= 0 &&
                             Classes::cls(cute::max(detail::divisor_of<N>::value, 0)) != kClassTile) {
          // a / b with one b per row (softmax's e / sum) or a scalar: one IEEE reciprocal per
          // row (identical operands, so it is computed once), then a multiply per element,
          // instead of an IEEE division (slow-path branch) per element: <= 1.5 ulp from a / b for
          // |b| >= 2^-126 (below 2^-128 the reciprocal overflows to inf where a / b may be finite).
          constexpr int a = detail::dividend_of<N>::value, b = detail::divisor_of<N>::value;
          CUTE_UNROLL
          for (int e = 0; e < kFrag; ++e) vals[I][e] = vals[a][e] * (1.f / vals[b][e]);
        } else if constexpr (I == kKeptExpNode) {
          // The pair's exp(x - max): the parent left exp(x - its CTA's max) in x's registers and
          // handed over exp(its CTA's max - max) as the max (reduce.cuh kPairGivenKept).
          constexpr int s = detail::exp_operand_of<N>::value;
          static_assert(s >= 0, "kPairGivenKept: the sum's operand is exp(x - max)");
          constexpr int a = detail::sub_of<cute::tuple_element_t<s, cute::tuple<Nodes...>>>::a;
          constexpr int b = detail::sub_of<cute::tuple_element_t<s, cute::tuple<Nodes...>>>::b;
          static_assert(a >= 0 && b >= 0, "kPairGivenKept: the sum's operand is exp(x - max)");
          CUTE_UNROLL
          for (int e = 0; e < kFrag; ++e) vals[I][e] = vals[a][e] * vals[b][e];
        } else if constexpr (exp_row_shift<N>()) {
          // exp(a - b) with one b per row (softmax's exp(x - max)): ops.cuh fast_exp_shifted.
          constexpr int s = detail::exp_operand_of<N>::value;
          constexpr int a = detail::sub_of<cute::tuple_element_t<s, cute::tuple<Nodes...>>>::a;
          constexpr int b = detail::sub_of<cute::tuple_element_t<s, cute::tuple<Nodes...>>>::b;
          CUTE_UNROLL
          for (int e = 0; e < kFrag; ++e) vals[I][e] = fast_exp_shifted(vals[a][e], vals[b][e]);
        } else if constexpr (detail::is_rotate<N>::value) {
          // The partner fragment S/2 columns on (a run's first half, negated) or back; fc.col0
          // is the same in every thread, so `lower` and the registers read fold per fragment.
          constexpr int x = N::kRotateSrc, half = N::kSegment / 2;
          static_assert(x < I);
          bool const lower = fc.col0 % N::kSegment < half;
          int const off = lower ? half : -half;
          FragCoord pc = fc;
          pc.col += off;
          pc.col0 += off;
          pc.sub_col = pc.col % 64;
          Frag pacc;
          acc_at(off, pacc);
          float pv[x + 1][kFrag];
          if (N::kInPlace && !lower) {  // the partner's operand, in place since the first half
            CUTE_UNROLL
            for (int e = 0; e < kFrag; ++e) pv[x][e] = pacc[e];
          } else {
            visit_nodes<x, true>(c, pc, pacc, pv, [&](int o, Frag& f) { acc_at(off + o, f); }, [](int, Frag const&) {});
          }
          if (N::kInPlace && lower) {  // both operands in place for the second half
            acc_put(0, vals[x]);
            acc_put(off, pv[x]);
          }
          CUTE_UNROLL
          for (int e = 0; e < kFrag; ++e) vals[I][e] = lower ? -pv[x][e] : pv[x][e];
        } else {
          cute::get<I>(impls).template visit<I>(c, fc, acc, vals);
        }
      });
    }
    // Whether node N is exp(a - b) with b one value per row (or a scalar), and a - b does not
    // travel on to the PostStage (log-softmax's x - max does: both values then stay live, and
    // ptxas spilled the vocabulary kernel's 64x256 tiles).
    // Nor where a - b is a rotate_half's operand in place: read back there, a and b are not computed.
    template <class N> static constexpr bool exp_row_shift() {
      constexpr int s = detail::exp_operand_of<N>::value;
      if constexpr (s < 0 || s == kTileBypass || s == kInPlaceSrc) {
        return false;
      } else {
        constexpr int b = detail::sub_of<cute::tuple_element_t<s, cute::tuple<Nodes...>>>::b;
        if constexpr (b < 0) return false;
        else return Classes::cls(b) != kClassTile;
      }
    }

    // Tile t of a job: the context of tile 0 moved by t * RowPeers * BN columns.
    static COMFUSE_DEVICE EpiCtx tile_ctx(EpiCtx c, int t) {
      c.n0 += t * Geo::RowPeers * Geo::BN;
      c.tile = t;
      return c;
    }

    // Compute phase over one tile c.tile (accum: the warp group's accumulator registers; the
    // tile's input tile value comes from accum (root stage, or kInRegs: the job's last tile) or
    // stash slot c.tile, and its kTileBypass value goes to the same place for the PostStage).
    // kInRegs is a template argument, not a runtime test: a runtime choice per fragment made
    // ptxas spill (~1.2 KB: both paths' values live at once).
    // kOutRegs: where the kTileBypass value goes (default: where the input came from); a fused
    // stream (kFusedStream) reads a stashed tile and leaves its bypass in the registers. The
    // root with kPairOnline puts a stashed tile's bypass in both (online_second reads it), or,
    // with a centered stash, in the registers only (online_second stashes it about its centers).
    template <bool kInRegs, bool kOutRegs = kInRegs, class FragC, class St>
    COMFUSE_DEVICE void body(EpiCtx const& c, TreeStorage& ts, FragC& accum, int bar_id, St const& st) {
      constexpr bool in_regs = kInRegs;
      if constexpr (kBorrows) {  // the lender's last stores must have read the staging
        if (c.t == 0) tma_store_wait_read<0>();
        named_sync(bar_id, kWarpGroupThreads);
      }
      cute::for_each(cute::make_int_sequence<kNumNodes>{}, [&](auto i) {
        cute::get<decltype(i)::value>(impls).acquire(c, detail::storage_get<decltype(i)::value, StorageTypes>(nodes_of(ts)));
      });
      auto const centers = st.template centers_of<!(kRoot || in_regs)>(c.tile);  // a stashed tile's, once
      CUTE_UNROLL
      for (int s = 0; s < Geo::SubTiles; ++s) {
        if constexpr (kHasStores && Geo::StoreStages == 1) {
          if (s > 0) {  // one buffer: the previous subtile's stores must have read it
            if (c.t == 0) tma_store_wait_read<0>();
            named_sync(bar_id, kWarpGroupThreads);
          }
        }
        CUTE_UNROLL
        for (int mi = 0; mi < Geo::MBlocks; ++mi) {
          CUTE_UNROLL
          for (int j = 0; j < 4; ++j) {
            FragCoord fc;
            fc.sub_col = j * 16 + 2 * (c.lane % 4);
            fc.col = s * 64 + fc.sub_col;
            fc.col0 = s * 64 + j * 16;
            fc.row = accum_row(c.t, mi, 0);
            fc.mi = mi;
            Frag acc;
            int const base = mi * (Geo::BN / 2) + 8 * (4 * s + j);
            int const f = base / kFrag;  // the fragment's index in the stash
            if constexpr (kRoot || in_regs) {
              CUTE_UNROLL
              for (int e = 0; e < kFrag; ++e) acc[e] = accum(base + e);
            } else {
              st.load(c.tile, f, acc, centers);
            }
            float vals[kNumNodes][kFrag];
            // rotate_half's partner: 8 registers a 16-column fragment.
            auto const acc_at = [&](int off, Frag& f) {
              int const pbase = base + off / 2;
              if constexpr (kRoot || in_regs) {
                CUTE_UNROLL
                for (int e = 0; e < kFrag; ++e) f[e] = accum(pbase + e);
              } else {
                st.load(c.tile, pbase / kFrag, f, centers);
              }
            };
            auto const acc_put = [&](int off, Frag const& f) {
              if constexpr (kInPlaceSrc >= 0) {
                CUTE_UNROLL
                for (int e = 0; e < kFrag; ++e) accum(base + off / 2 + e) = f[e];
              }
            };
            if constexpr (kUsesGate) {
              // A gated kernel's accumulator (KernelConfig::gated): A B3^T in its second half,
              // the same element Geo::BN / 2 registers on (one m64 block: check()).
              static_assert(kRoot && Geo::MBlocks == 1, "ComFuse: GateEntry reads a gated root stage's accumulator");
              Frag gate;
              CUTE_UNROLL
              for (int e = 0; e < kFrag; ++e) gate[e] = accum(Geo::BN / 2 + base + e);
              EpiCtx cg = c;
              cg.gate = gate;
              visit_nodes(cg, fc, acc, vals, acc_at, acc_put);
            } else {
              visit_nodes(c, fc, acc, vals, acc_at, acc_put);
            }
            if constexpr (kTileBypass >= 0) {
              if constexpr (kOutRegs || (kRoot && St::kCentered)) {
                // A centered stash: online_second stashes the tile about its row centers, known
                // once the tile is done.
                static_assert(kOutRegs || kPairOnline, "a centered stash takes its centers from the root's online pair");
                CUTE_UNROLL
                for (int e = 0; e < kFrag; ++e) accum(base + e) = vals[kTileBypass][e];
              } else {
                static_assert(!St::kCentered, "a centered stash takes no write-back from a later stage (the planner "
                                              "keeps fp32 there: plan_detail::stash_type)");
                st.store(c.tile, f, vals[kTileBypass]);
                if constexpr (kPairOnline) {  // online_second reads the operand here, as stashed
                  CUTE_UNROLL
                  for (int e = 0; e < kFrag; ++e) accum(base + e) = st.stored(vals[kTileBypass][e]);
                }
              }
            }
            if constexpr (kHasPost) {
              if (s == 0 && j == 0) capture_col_bypass(mi, vals);
            }
          }
        }
        if constexpr (kHasStores) {
          fence_view_async_shared();
          // Two buffers: subtile s + 1 writes the one subtile s - 1's stores read; they were
          // issued a subtile ago, and the barrier below tells every thread they are done.
          if constexpr (Geo::StoreStages == 2)
            if (c.t == 0) tma_store_wait_read<0>();
          named_sync(bar_id, kWarpGroupThreads);
          if (c.t == 0) {
            cute::for_each(cute::make_int_sequence<kNumNodes>{}, [&](auto i) {
              cute::get<decltype(i)::value>(impls).subtile_end(c, detail::storage_get<decltype(i)::value, StorageTypes>(nodes_of(ts)), s);
            });
            tma_store_commit();
          }
        }
      }
    }

    // A PostStage whose statistic came with its parent's pair round (kPairGiven), over several
    // N-tiles a job, before the chain's last stage (no reduction: its partials would restart at
    // tile 0, which the fused order does not stream first; nothing after it reads a tile): the
    // two stream together, tile by tile (stream_fused), and this stage's tile value never goes
    // back to the stash. (Under if constexpr: a stage with no PostStage must not instantiate the
    // dummy PostExec.)
    static constexpr bool fused_stream() {
      if constexpr (kGiven && Geo::NTiles > 1 && kHasPost && kTileBypass >= 0)
        return !PostS::kEndsInReduction;
      else return false;
    }
    static constexpr bool kFusedStream = fused_stream();
    // The tile a PostStage streams first (its parent begins it during the round): the last one,
    // in the registers, where the stream is fused.
    static constexpr int kFirstTile = kFusedStream ? Geo::NTiles - 1 : 0;

    // As a PostStage: stream over the job's tiles (c: tile 0; the parent ran the begin_phase of
    // tile kFirstTile during its round), then this stage's reduce phase.
    template <class FragC, class CS, class St>
    COMFUSE_DEVICE void stream(EpiCtx const& c, TreeStorage& ts, FragC& accum, int bar_id, CS& chan,
                               Rounds<Geo::kRetireEarly>& rnd, St const& st) {
      if constexpr (kFusedStream) {
        stream_fused(c, ts, accum, bar_id, st);
      } else {
        for (int t = 0; t < Geo::NTiles - 1; ++t) {  // tiles 0..T-2: stash slot t
          EpiCtx const ct = tile_ctx(c, t);
          if (t > 0) begin_phase(ct, ts, bar_id);
          body<false>(ct, ts, accum, bar_id, st);
        }
        {  // the last tile: the accumulator registers
          EpiCtx const ct = tile_ctx(c, Geo::NTiles - 1);
          if constexpr (Geo::NTiles > 1) begin_phase(ct, ts, bar_id);
          body<true>(ct, ts, accum, bar_id, st);
        }
        if constexpr (kEndsInReduction) reduce_phase(c, ts, accum, bar_id, chan, rnd, st);
      }
    }

    // kFusedStream: the statistic is known (given), so the PostStage takes it first; then each
    // tile runs this stage and the PostStage back to back: the last tile first (its values in
    // the registers), then tiles 0..T-2, each read from its stash slot into the registers as
    // this stage's bypass, where the PostStage reads it. One read of the stash after the round,
    // where streaming the stages one after the other writes this stage's bypass back to the
    // stash and reads it again.
    template <class FragC, class St>
    COMFUSE_DEVICE void stream_fused(EpiCtx const& c, TreeStorage& ts, FragC& accum, int bar_id, St const& st) {
      float v[Geo::MBlocks][2];
      int const n = Last::kSegment > 0 ? Last::kSegment : c.N;
      CUTE_UNROLL
      for (int mi = 0; mi < Geo::MBlocks; ++mi)
        CUTE_UNROLL
        for (int h = 0; h < 2; ++h) v[mi][h] = Last::ReduceOp::finalize(given[mi][h], n);
      post.take_stat(v);
      PostTree& pts = post_tree(ts);
      {  // the last tile, begun by the parent during its round
        EpiCtx const ct = tile_ctx(c, Geo::NTiles - 1);
        body<true>(ct, ts, accum, bar_id, st);
        post.begin_phase(ct, pts, bar_id);
        post.template body<true>(ct, pts, accum, bar_id, st);
      }
      for (int t = 0; t < Geo::NTiles - 1; ++t) {
        EpiCtx const ct = tile_ctx(c, t);
        begin_phase(ct, ts, bar_id);
        body<false, true>(ct, ts, accum, bar_id, st);
        post.begin_phase(ct, pts, bar_id);
        post.template body<true>(ct, pts, accum, bar_id, st);
      }
    }

    // The root's stores' staging, lent to the PostStage stores that borrow it (EpiCtx::root_staging).
    static COMFUSE_DEVICE EpiCtx lend_staging(EpiCtx c, TreeStorage& ts) {
      cute::for_each(cute::make_int_sequence<kNumNodes>{}, [&](auto i) {
        using N = cute::tuple_element_t<decltype(i)::value, cute::tuple<Nodes...>>;
        using Impl = cute::tuple_element_t<decltype(i)::value, Impls>;
        if constexpr (detail::is_store<N>::value && !detail::borrows_staging<N>::value)  // its own staging
          c.root_staging[Impl::kOut] = Impl::staging(detail::storage_get<decltype(i)::value, StorageTypes>(nodes_of(ts)));
      });
      return c;
    }

    // A job's begin, its global loads (every stage's with one N-tile a job) issued into the nodes'
    // registers ahead of its mainloop (Node::fetch), so that they land while the tensor cores
    // work; run_tile's begin then only writes them to SMEM. The warp group's first job only,
    // where KernelConfig::begin_early asks (one job a CTA). MEASURED (bench/NOTES.md Stop 70):
    // the whole begin here, loads, SMEM writes and barriers, held a LayerNorm warp group 2.1 us
    // before its first k-block (2048 x 2048 x 1024, cooperative 128x256).
    COMFUSE_DEVICE void begin_early(EpiCtx const& c) {
      static_assert(Geo::NTiles == 1, "begin_early: one N-tile a job (later tiles begin after the first's body)");
      unsigned long long const since = trace::now();
      fetch_nodes_chain(c);
      trace::add_epi(trace::kEpiBegin, since);
    }
    COMFUSE_DEVICE void fetch_nodes_chain(EpiCtx const& c) {
      cute::for_each(cute::make_int_sequence<kNumNodes>{}, [&](auto i) { cute::get<decltype(i)::value>(impls).fetch(c); });
      fetched = true;
      if constexpr (kHasPost) post.fetch_nodes_chain(c);
    }

    // The root's entry, once per tile of a job (c: the job's tile 0, t: the tile), right after
    // that tile's mainloop; after the last tile the reduce phase and the PostStages.
    // after_body: called by every thread once the root stage's body is done with the tile (the
    // kernel frees the ring slot of its tile inputs).
    template <class FragC, class St = NoStash, class AfterBody = detail::NoHook>
    COMFUSE_DEVICE void run_tile(EpiCtx const& c0, SharedStorage& ss, FragC& accum, int bar_id, int t, St const& st = St{},
                                 AfterBody const& after_body = AfterBody{}) {
      TreeStorage& tree = tree_of(ss);
      EpiCtx const c = lend_staging(c0, tree);
      EpiCtx const ct = tile_ctx(c, t);
      unsigned long long since = trace::now();
      begin_phase<true>(ct, tree, bar_id);
      trace::add_epi(trace::kEpiBegin, since);
      since = trace::now();
      if (Geo::NTiles == 1 || t == Geo::NTiles - 1) body<true>(ct, tree, accum, bar_id, st);
      else body<false>(ct, tree, accum, bar_id, st);
      if constexpr (kPairOnline) online_second(ct, accum, st);
      after_body();
      trace::add_epi(trace::kEpiRootBody, since);
      if constexpr (kEndsInReduction) {
        if (t == Geo::NTiles - 1) {
          if constexpr (kChanInSmem) {
            reduce_phase(c, tree, accum, bar_id, ss.chan, rounds, st);
          } else {  // a channel with no storage on chip, or none
            ChanStorage none;
            reduce_phase(c, tree, accum, bar_id, none, rounds, st);
          }
        }
      }
    }
    // One tile, no stash (NTiles == 1): today's entry.
    template <class FragC> COMFUSE_DEVICE void run(EpiCtx const& c, SharedStorage& ss, FragC& accum, int bar_id) {
      run_tile(c, ss, accum, bar_id, 0);
    }

   private:
    template <class V> COMFUSE_DEVICE void capture_col_bypass(int mi, V const& vals) {
      post.template take_col_bypass<Classes>(mi, vals);
    }

   public:
    // As a PostStage: fill the Col-class Bypass registers from the parent's fragment values.
    template <class P, class V> COMFUSE_DEVICE void take_col_bypass(int mi, V const& pvals) {
      cute::for_each(cute::make_int_sequence<kNumNodes>{}, [&](auto i) {
        constexpr int I = decltype(i)::value;
        using N = cute::tuple_element_t<I, cute::tuple<Nodes...>>;
        constexpr int src = detail::bypass_source<N>::value;
        if constexpr (src >= 0 && P::cls(src) != kClassTile) {
          cute::get<I>(impls).r[mi][0] = pvals[src][0];
          cute::get<I>(impls).r[mi][1] = pvals[src][2];
        }
      });
    }
    template <class Arr> COMFUSE_DEVICE void take_given(Arr const& v) {
      CUTE_UNROLL
      for (int mi = 0; mi < Geo::MBlocks; ++mi) given[mi][0] = v[mi][0], given[mi][1] = v[mi][1];
    }
    template <class Arr> COMFUSE_DEVICE void take_stat(Arr const& v) {
      cute::for_each(cute::make_int_sequence<kNumNodes>{}, [&](auto i) {
        constexpr int I = decltype(i)::value;
        if constexpr (detail::is_stat<cute::tuple_element_t<I, cute::tuple<Nodes...>>>::value) {
          CUTE_UNROLL
          for (int mi = 0; mi < Geo::MBlocks; ++mi) {
            cute::get<I>(impls).r[mi][0] = v[mi][0];
            cute::get<I>(impls).r[mi][1] = v[mi][1];
          }
        }
      });
    }

   private:
    // The CTA's second statistic per row, from the reduction's operand, which the compute
    // phase left in the accumulator registers as the tile bypass: kPairMeanM2 the sum of
    // squares about the CTA's own mean (first / n_local), kPairMaxExpSum the sum of
    // exp(x - the CTA's own max) (0 where that max is -inf: no finite value, no NaN). Quad-reduced.
    // The term is computed for every element and only the add is predicated: expf under the
    // column test compiled to a branch per element around a serial chain, ~3 us per 128x128
    // tile on the H200 (bench/NOTES.md). ex2.approx (fast_exp): this sum only normalizes.
    template <class FragC>
    COMFUSE_DEVICE void local_second(EpiCtx const& c, FragC& accum, float const (&first)[Geo::MBlocks][2],
                                     float (&second)[Geo::MBlocks][2]) const {
      int const n_local = max(0, min(Geo::BN, c.N - c.n0));
      float const inv = n_local > 0 ? __fdiv_rn(1.f, float(n_local)) : 0.f;
      float center[Geo::MBlocks][2];
      CUTE_UNROLL
      for (int mi = 0; mi < Geo::MBlocks; ++mi)
        CUTE_UNROLL
        for (int h = 0; h < 2; ++h) {
          if constexpr (kPair == kPairMeanM2) center[mi][h] = first[mi][h] * inv;
          else center[mi][h] = max_center(first[mi][h]);
        }
      thread_second(c, accum, center, second);
      CUTE_UNROLL
      for (int mi = 0; mi < Geo::MBlocks; ++mi)
        CUTE_UNROLL
        for (int h = 0; h < 2; ++h) second[mi][h] = quad_sum(second[mi][h]);
    }

    // kKeepsExp: exp(x - max) = exp(x - center) * this, center = max_center(local), local the
    // CTA's max and max the row's (>= local). The row's max -inf (no finite value): NaN, as
    // exp(-inf - -inf); the CTA's -inf (its x below N all -inf, their exps 0; its columns past N
    // are never stored) but not the row's: 0, not exp(0 - max), which overflows below max = -88.
    static COMFUSE_DEVICE float kept_factor(float local, float max) {
      if (max == ReduceMax::identity()) return __int_as_float(0x7fc00000);
      return local == ReduceMax::identity() ? 0.f : fast_exp(max_center(local) - max);
    }
    // A row max as the center of exp(x - center): 0 where it is -inf (no finite value: no NaN).
    static COMFUSE_DEVICE float max_center(float m) { return m == ReduceMax::identity() ? 0.f : m; }
    static COMFUSE_DEVICE float quad_sum(float x) {
      x += __shfl_xor_sync(0xffffffffu, x, 1);
      return x + __shfl_xor_sync(0xffffffffu, x, 2);
    }

    // kPairOnline, after tile c.tile's body, the tile's values (the operand: as an uncentered
    // 16-bit stash rounds it, as the later stages read it back; unrounded with a centered
    // stash) into the thread's running second
    // statistic a row, thread by thread (reduce_phase merges the quad's):
    //  - kPairMaxExpSum: the tile's exp(x - m) added, m the thread's running max over the job's
    //    tiles so far (the Reduction's partial), the earlier tiles' sum moved to it by
    //    exp(m_before - m) <= 1 (online softmax). A sum of 0 stays 0, so a -inf max before never
    //    meets an overflowing factor. A NaN sum stays NaN (the row's result is NaN, as in two rounds).
    //  - kPairMeanM2: the tile's squares about its own mean merged into the running ones by Chan's
    //    formula (M2 += M2_t + d^2 n n_t / (n + n_t), d the difference of the means), so no value is
    //    ever squared about a distant center (the mean >> the spread is safe, as in one tile).
    // A centered stash (St::kCentered) takes a stashed tile here, about the same centers (the
    // running max, or the running mean), and leaves the registers unrounded: both of the pair's
    // statistics come from the values as computed, so a row statistic stored in f32 carries none
    // of the stash's rounding; only the later stages' reads of the earlier tiles do.
    template <class FragC, class St>
    COMFUSE_DEVICE void online_second(EpiCtx const& c, FragC& accum, St const& st) {
      auto const& red = cute::get<kNumNodes - 1>(impls);
      auto const stash_tile = [&](float const (&center)[Geo::MBlocks][2]) {
        if constexpr (St::kCentered)
          if (c.tile < Geo::NTiles - 1) st.store_centered(c.tile, accum, center);
      };
      if constexpr (kPair == kPairMaxExpSum) {
        float center[Geo::MBlocks][2], tile_sum[Geo::MBlocks][2];
        CUTE_UNROLL
        for (int mi = 0; mi < Geo::MBlocks; ++mi)
          CUTE_UNROLL
          for (int h = 0; h < 2; ++h) center[mi][h] = max_center(red.partial(mi, h));
        stash_tile(center);
        thread_second(c, accum, center, tile_sum);
        CUTE_UNROLL
        for (int mi = 0; mi < Geo::MBlocks; ++mi)
          CUTE_UNROLL
          for (int h = 0; h < 2; ++h) {
            float const before = c.tile == 0 || online_sum[mi][h] == 0.f
                                     ? 0.f
                                     : online_sum[mi][h] * fast_exp(online_center[mi][h] - center[mi][h]);
            online_sum[mi][h] = before + tile_sum[mi][h];
            online_center[mi][h] = center[mi][h];
          }
      } else {
        // Selects, no branch on the counts (a tile past N, a short row's CTA, has n_t = 0 and
        // merges nothing; tile 0 starts the running count): branches here made ptxas spill.
        float const n_t = float(thread_columns(c, accum));  // the thread's columns of this tile below N
        float const n_run = c.tile == 0 ? 0.f : online_n, n_new = n_run + n_t;
        float const inv_t = n_t > 0.f ? __fdividef(1.f, n_t) : 0.f;
        float const inv_new = n_new > 0.f ? __fdividef(1.f, n_new) : 0.f;
        float const inv_run = n_run > 0.f ? __fdividef(1.f, n_run) : 0.f;
        float const weight = n_run * n_t * inv_new;
        // The squares' center: the running mean of every value so far, this tile's included (the
        // Reduction's partial over the count), near the tile's own mean and held in no register
        // across tiles; the moments about it are exact (M2_t = sq - dev^2 / n_t).
        float center[Geo::MBlocks][2], dev[Geo::MBlocks][2], sq[Geo::MBlocks][2];
        CUTE_UNROLL
        for (int mi = 0; mi < Geo::MBlocks; ++mi)
          CUTE_UNROLL
          for (int h = 0; h < 2; ++h) center[mi][h] = red.partial(mi, h) * inv_new;
        stash_tile(center);
        thread_moments(c, accum, center, dev, sq);
        CUTE_UNROLL
        for (int mi = 0; mi < Geo::MBlocks; ++mi)
          CUTE_UNROLL
          for (int h = 0; h < 2; ++h) {
            float const m2_t = sq[mi][h] - dev[mi][h] * (dev[mi][h] * inv_t);
            // The tile's sum, and the earlier values' mean from the partial less it.
            float const s_t = fmaf(center[mi][h], n_t, dev[mi][h]);
            float const d = s_t * inv_t - (red.partial(mi, h) - s_t) * inv_run;
            float const before = n_run > 0.f ? online_sum[mi][h] : 0.f;
            online_sum[mi][h] = before + m2_t + d * d * weight;
          }
        online_n = n_new;
      }
    }

    // Every value of the thread's tile in the accumulator registers, in register order:
    // f(mi, h, k, x, below_n), x the register, h its row slot, k its row partial (nodes.cuh
    // row_slot), below_n whether its column is below N.
    template <class FragC, class F>
    static COMFUSE_DEVICE void for_each_value(EpiCtx const& c, FragC& accum, F&& f) {
      CUTE_UNROLL
      for (int s = 0; s < Geo::SubTiles; ++s)
        CUTE_UNROLL
        for (int mi = 0; mi < Geo::MBlocks; ++mi)
          CUTE_UNROLL
          for (int j = 0; j < 4; ++j) {
            int const col = c.n0 + s * 64 + j * 16 + 2 * (c.lane % 4);
            int const base = mi * (Geo::BN / 2) + 8 * (4 * s + j);
            CUTE_UNROLL
            for (int e = 0; e < kFrag; ++e) f(mi, (e >> 1) & 1, row_slot(e), accum(base + e), col + frag_col(e) < c.N);
          }
    }

    // The thread's columns of tile c (c.n0) below N, those of its first row: BN / 4 where the
    // tile is whole.
    template <class FragC>
    static COMFUSE_DEVICE int thread_columns(EpiCtx const& c, FragC& accum) {
      if (c.N - c.n0 >= Geo::BN) return Geo::BN / 4;
      int n = 0;
      for_each_value(c, accum, [&](int mi, int h, int, float&, bool below_n) { n += mi == 0 && h == 0 && below_n; });
      return n;
    }

    // The thread's moments a row about `center` over its values of the tile in the accumulator
    // registers (the reduction's operand, left there as the tile bypass), columns past N left out:
    // dev the sum of x - center, sq the sum of (x - center)^2. Not quad-reduced. One partial a
    // row each (not kRowSlots: beside the accumulators of several N-tiles' kernels, more spilled).
    template <class FragC>
    COMFUSE_DEVICE void thread_moments(EpiCtx const& c, FragC& accum, float const (&center)[Geo::MBlocks][2],
                                       float (&dev)[Geo::MBlocks][2], float (&sq)[Geo::MBlocks][2]) const {
      static_assert(kTileBypass == Last::kOperandIndex, "Pair: the PostStage must bypass the first reduction's operand");
      CUTE_UNROLL
      for (int mi = 0; mi < Geo::MBlocks; ++mi)
        CUTE_UNROLL
        for (int h = 0; h < 2; ++h) dev[mi][h] = 0.f, sq[mi][h] = 0.f;
      for_each_value(c, accum, [&](int mi, int h, int, float& x, bool below_n) {
        float const d = x - center[mi][h];
        if (below_n) {
          dev[mi][h] += d;
          sq[mi][h] = fmaf(d, d, sq[mi][h]);
        }
      });
    }

    // kPairOnline with kPairMeanM2, at the round: the quad's running (count, mean, M2) merged by
    // Chan's formula, lane with lane (xor 1, then xor 2), written so that both lanes of a swap
    // compute the same bits (sums of products in either order): the CTA's sum of squares about its
    // own mean, the same in the quad's four lanes, as the round needs (global_exchange.cuh fold).
    COMFUSE_DEVICE void quad_m2(float (&second)[Geo::MBlocks][2]) const {
      auto const& red = cute::get<kNumNodes - 1>(impls);
      float n = online_n;
      float const inv_n = __fdividef(1.f, n);
      float mean[Geo::MBlocks][2];
      auto& m2 = second;  // merged in place
      CUTE_UNROLL
      for (int mi = 0; mi < Geo::MBlocks; ++mi)
        CUTE_UNROLL
        for (int h = 0; h < 2; ++h) {
          bool const some = n > 0.f;  // a thread with no column below N: count 0, its state unset
          mean[mi][h] = some ? red.partial(mi, h) * inv_n : 0.f;
          m2[mi][h] = some ? online_sum[mi][h] : 0.f;
        }
      CUTE_UNROLL
      for (int lane_mask = 1; lane_mask <= 2; lane_mask *= 2) {
        float const n_o = __shfl_xor_sync(0xffffffffu, n, lane_mask);
        float const n_ab = n + n_o;
        // MUFU's reciprocal, not an IEEE division: that one's slow path is a call, whose saved
        // registers made the several-N-tile kernels spill.
        float const inv = n_ab > 0.f ? __fdividef(1.f, n_ab) : 0.f;
        float const f = __fmul_rn(__fmul_rn(n, n_o), inv);
        CUTE_UNROLL
        for (int mi = 0; mi < Geo::MBlocks; ++mi)
          CUTE_UNROLL
          for (int h = 0; h < 2; ++h) {
            float const mean_o = __shfl_xor_sync(0xffffffffu, mean[mi][h], lane_mask);
            float const m2_o = __shfl_xor_sync(0xffffffffu, m2[mi][h], lane_mask);
            float const d = __fsub_rn(mean[mi][h], mean_o);  // _rn: no contraction into an FMA,
            m2[mi][h] = __fadd_rn(__fadd_rn(m2[mi][h], m2_o), __fmul_rn(__fmul_rn(d, d), f));  // whose
            mean[mi][h] = __fmul_rn(__fadd_rn(__fmul_rn(n, mean[mi][h]), __fmul_rn(n_o, mean_o)), inv);  // order differs
          }
        n = n_ab;
      }
    }

    // The thread's sums a row over its values of the tile in the accumulator registers (the
    // reduction's operand, which the compute phase left there as the tile bypass): (x - center)^2
    // (kPairMeanM2) or exp(x - center), columns past N left out. Not quad-reduced.
    // kKeepsExp: each exp(x - center) also replaces x in the registers (the PostStage reads it).
    template <class FragC>
    COMFUSE_DEVICE void thread_second(EpiCtx const& c, FragC& accum, float const (&center)[Geo::MBlocks][2],
                                      float (&out)[Geo::MBlocks][2]) const {
      static_assert(kTileBypass == Last::kOperandIndex, "Pair: the PostStage must bypass the first reduction's operand");
      float part[Geo::MBlocks][2][kRowSlots];  // running sums a row, as Reduction::visit's partials
      CUTE_UNROLL
      for (int mi = 0; mi < Geo::MBlocks; ++mi)
        CUTE_UNROLL
        for (int h = 0; h < 2; ++h)
          CUTE_UNROLL
          for (int k = 0; k < kRowSlots; ++k) part[mi][h][k] = 0.f;
      for_each_value(c, accum, [&](int mi, int h, int k, float& x, bool below_n) {
        float const ctr = center[mi][h];
        float term = x;
        if constexpr (kKeepsExp) {
          fast_exp_shifted_in_place(term, ctr);
          x = term;
        } else {
          term = kPair == kPairMeanM2 ? (term - ctr) * (term - ctr) : fast_exp_shifted(term, ctr);
        }
        if (below_n) part[mi][h][k] += term;
      });
      CUTE_UNROLL
      for (int mi = 0; mi < Geo::MBlocks; ++mi)
        CUTE_UNROLL
        for (int h = 0; h < 2; ++h) out[mi][h] = fold_pairwise<ReduceSum>(part[mi][h]);
    }

    // The exact merge of peer j's second statistic (v_j: its first statistic, s_j: its second)
    // into the row's, about the row's center (pair_center of the merged first statistic).
    COMFUSE_DEVICE static float pair_center(EpiCtx const& c, float first) {
      // The row mean. Over several N-tiles MUFU's reciprocal: the IEEE division's slow path is a
      // call, whose saved registers made the 128-row kernels spill in row groups of 32.
      if constexpr (kPair == kPairMeanM2 && Geo::NTiles > 1) return __fdividef(first, float(c.N));
      else if constexpr (kPair == kPairMeanM2) return __fdiv_rn(first, float(c.N));
      else return first;                                                           // the row max
    }
    // 1 / n_j of the row's ragged last peer (its columns: N - its first column, below BN; the
    // value is unused where N is a multiple of BN). A division under a branch in every peer's
    // term lengthened each warp's merge: 3-7% of LayerNorm's launch at 128 to 1024 rows
    // (bench/NOTES.md Stop 47).
    COMFUSE_DEVICE static float pair_inv_ragged(EpiCtx const& c) {
      if constexpr (kPair == kPairMeanM2 && Geo::NTiles == 1) {
        int const ragged = (c.N - (c.n0 - c.xs.rank * Geo::BN)) % Geo::BN;
        return ragged > 0 ? __fdiv_rn(1.f, float(ragged)) : 1.f / float(Geo::BN);
      } else {
        return 0.f;
      }
    }
    COMFUSE_DEVICE static float pair_term(EpiCtx const& c, int j, float vj, float sj, float center, float inv_ragged) {
      if constexpr (kPair == kPairMeanM2 && Geo::NTiles > 1) {  // Chan, n_j over the peer's tiles
        // Peer j holds the row's tile positions j, j + RowPeers, ... (tile_ctx): whole ones below
        // len / BN, and the ragged last one (len / BN) where BN does not divide len. n_j is 0 for
        // a peer whose tiles all lie past N (a short row).
        // With whole = q P + r: peers below r hold q + 1 whole tiles, the rest q, and peer r the
        // ragged one too.
        constexpr unsigned P = Geo::RowPeers;
        unsigned const len = unsigned(c.N - (c.n0 - c.xs.rank * Geo::BN));  // the row's columns from peer 0's first
        unsigned const whole = len / Geo::BN, rem = len % Geo::BN, q = whole / P, r = whole % P;
        unsigned const uj = unsigned(j);
        float const nj = float((q + (uj < r ? 1u : 0u)) * Geo::BN + (uj == r ? rem : 0u));
        float const d = __fdividef(vj, nj) - center;  // not read where nj is 0
        return nj > 0.f ? sj + nj * d * d : 0.f;
      } else if constexpr (kPair == kPairMeanM2) {  // Chan: M2_j + n_j (S_j / n_j - mean)^2
        int const n0 = c.n0 - c.xs.rank * Geo::BN;  // peer j holds columns n0 + j * BN ..
        int const left = c.N - (n0 + j * Geo::BN);   // .. up to N: its columns, unclamped
        // Selects, no branch: 1/BN for a full peer (exact: BN is a power of two), the ragged
        // peer's reciprocal, 0 for a peer past N. "Full" tests the unclamped count: tested as
        // min(left, BN) == BN, LayerNorm over a ragged N came out wrong on the H200 (NVRTC 13.0,
        // bench/NOTES.md Stop 47).
        bool const full = left >= Geo::BN;
        float const inv_nj = full ? 1.f / float(Geo::BN) : inv_ragged;
        float const nj = float(full ? Geo::BN : max(left, 0));
        float const d = vj * inv_nj - center;
        return left > 0 ? sj + nj * d * d : 0.f;
      } else {  // online softmax: S_j exp(max_j - max); a peer with no finite value (S_j 0) adds 0
        float const scale = fast_exp(fminf(vj - center, 0.f));  // fminf: NaN (-inf - -inf) -> 0
        return sj != 0.f ? sj * scale : 0.f;  // != 0: a NaN sum stays NaN
      }
    }

    template <class FragC, class CS, class St>
    COMFUSE_DEVICE void reduce_phase(EpiCtx const& c, TreeStorage& ts, FragC& accum, int bar_id, CS& chan,
                                     Rounds<Geo::kRetireEarly>& rnd, St const& st) {
      using Op = typename Last::ReduceOp;
      auto& red = cute::get<kNumNodes - 1>(impls);
      float v[Geo::MBlocks][2];
      [[maybe_unused]] unsigned long long const since = trace::now();
      if constexpr (kGiven) {  // the parent's round brought this statistic
        CUTE_UNROLL
        for (int mi = 0; mi < Geo::MBlocks; ++mi) v[mi][0] = given[mi][0], v[mi][1] = given[mi][1];
        // One N-tile a job: the PostStage's begin() ran with the root's; several: tile 0's here.
        if constexpr (kHasPost && Geo::NTiles > 1) post.begin_phase(c, post_tree(ts), bar_id);
      } else {
        // (1) the quad that holds a row: butterfly, every lane ends with the same bits.
        CUTE_UNROLL
        for (int mi = 0; mi < Geo::MBlocks; ++mi)
          CUTE_UNROLL
          for (int h = 0; h < 2; ++h) {
            float x = red.partial(mi, h);
            x = Op::combine(x, __shfl_xor_sync(0xffffffffu, x, 1));
            x = Op::combine(x, __shfl_xor_sync(0xffffffffu, x, 2));
            v[mi][h] = x;
          }
        // (2) across warps: nothing to do (see the header comment: no row spans two warps).
        // (3) across the cluster; the PostStage's begin() overlaps the round.
        if constexpr (kPairFirst) {
          float second[Geo::MBlocks][2];
          if constexpr (kPairOnline && kPair == kPairMeanM2) {
            quad_m2(second);
          } else if constexpr (kPairOnline) {  // the thread's running sums, moved to the quad's max
            CUTE_UNROLL
            for (int mi = 0; mi < Geo::MBlocks; ++mi)
              CUTE_UNROLL
              for (int h = 0; h < 2; ++h) {
                float const s = online_sum[mi][h];
                second[mi][h] = quad_sum(s == 0.f ? 0.f : s * fast_exp(online_center[mi][h] - max_center(v[mi][h])));
              }
          } else {
            local_second(c, accum, v, second);
          }
          if constexpr (kKeepsExp) {
            CUTE_UNROLL
            for (int mi = 0; mi < Geo::MBlocks; ++mi) kept_max[mi][0] = v[mi][0], kept_max[mi][1] = v[mi][1];
          }
          if constexpr (kClusterReduce) Chan::start_pair(chan, rnd.n, c.xs, *c.p, c.t, v, second);
          if constexpr (kRoot) trace::add_epi(trace::kEpiPublish, since);
          if constexpr (kRoot && kClusterReduce) trace::mark_here(c.job, trace::kPublished);
          // One N-tile a job: the PostStage's begin() ran with the root's (begin_phase<true>);
          // several: that of the tile it streams first overlaps the round.
          if constexpr (kHasPost && Geo::NTiles > 1)
            post.begin_phase(tile_ctx(c, PostExec::kFirstTile), post_tree(ts), bar_id);
          if constexpr (kClusterReduce) {
            // The first statistic folds as a sum (the mean's finalize divides later) or a max.
            using First = cute::conditional_t<kPair == kPairMeanM2, ReduceSum, ReduceMax>;
            // A row's merge constants, computed once its words are in: the same for every row, but
            // held through the round's loads the reciprocal made NVRTC spill (LayerNorm's 128-row kernel).
            struct PairRow {
              float center, inv_ragged;
            };
            auto center = [&](float first) { return PairRow{pair_center(c, first), pair_inv_ragged(c)}; };
            auto term = [&](int j, float vj, float sj, PairRow const& r) {
              return pair_term(c, j, vj, sj, r.center, r.inv_ragged);
            };
            Chan::template finish_pair<First>(chan, rnd.n, rnd.pairs, c.xs, *c.p, c.t, bar_id, v, second, center, term);
            ++rnd.n;
            if constexpr (Geo::kPairHandOver) ++rnd.pairs;  // else nothing reads it: no register held
            if constexpr (kRoot) trace::mark_here(c.job, trace::kRoundDone);
          }
          if constexpr (kHasPost) post.take_given(second);
        } else {
          if constexpr (kClusterReduce) Chan::start(chan, rnd.n, c.xs, *c.p, c.t, bar_id, v);
          if constexpr (kRoot) trace::add_epi(trace::kEpiPublish, since);
          if constexpr (kRoot && kClusterReduce) trace::mark_here(c.job, trace::kPublished);
          // Several N-tiles a job: tile 0's begin overlaps the round (one: it ran with the root's).
          if constexpr (kHasPost && Geo::NTiles > 1) post.begin_phase(c, post_tree(ts), bar_id);
          if constexpr (kClusterReduce) {
            Chan::template finish<Op>(chan, rnd.n, c.xs, *c.p, c.t, bar_id, v);
            ++rnd.n;
            if constexpr (kRoot) trace::mark_here(c.job, trace::kRoundDone);
          }
        }
      }
      // The chain's last L2 round is behind the warp group: on its last job it counts itself out of
      // the exchange now, the count's round trip under the stages left (start_retire).
      if constexpr (kClusterReduce && !kGiven && Geo::kRetireEarly && kLastRound)
        if (rnd.retire_after) {
          rnd.retire_before = cluster::start_retire(*c.p, c.t, cluster::retire_participants(Geo::ConsumerWGs));
          rnd.retired = true;
        }
      if constexpr (kHasPost) {
        int const n = Last::kSegment > 0 ? Last::kSegment : c.N;
        CUTE_UNROLL
        for (int mi = 0; mi < Geo::MBlocks; ++mi)
          CUTE_UNROLL
          for (int h = 0; h < 2; ++h) v[mi][h] = Op::finalize(v[mi][h], n);
        if constexpr (kKeepsExp) {
          CUTE_UNROLL
          for (int mi = 0; mi < Geo::MBlocks; ++mi)
            CUTE_UNROLL
            for (int h = 0; h < 2; ++h) v[mi][h] = kept_factor(kept_max[mi][h], v[mi][h]);
        }
        post.take_stat(v);
        if constexpr (kRoot) trace::add_epi(trace::kEpiRound, since);
        [[maybe_unused]] unsigned long long const post_since = trace::now();
        post.stream(c, post_tree(ts), accum, bar_id, chan, rnd, st);
        if constexpr (kRoot) trace::add_epi(trace::kEpiPost, post_since);
      } else if constexpr (kRoot) {
        trace::add_epi(trace::kEpiRound, since);
      }
    }
  };
};

}  // namespace comfuse::epi
