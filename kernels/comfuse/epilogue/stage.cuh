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
// staging buffer; at the subtile's end every thread fences (generic -> async proxy), the
// warp group syncs, one thread issues the TMA stores; before the next subtile rewrites
// the buffers that thread waits until the previous stores have read SMEM.
//
// How reductions (issue 4) fit without rewriting this executor:
//  * A node gains an optional `kind`; Reduction<Op, Operand, PostStage, Bypass...> is the
//    terminal node of its Stage. Its visit() aggregates the fragment thread-locally into
//    per-row registers (2 rows per 64-row block: the same [MBlocks][2] shape ColBroadcast
//    uses); padded columns (>= N) contribute Op's identity (fc gives the column).
//  * stream() below is already the compute phase. run() becomes: stream(); if the last node
//    is a Reduction: reduce phase (quad shuffles xor 1, 2: a row's columns of a tile live in
//    one quad of one warp, so no cross-warp step for row reductions; then the cluster step
//    over DSMEM through ONE unified SMEM reduction buffer owned by the Stage executor, not
//    by the node: O(1) buffers in the number of reductions; each consumer WG has its own
//    cluster channel/phase); then PostStage::run() with the statistic bound.
//  * The PostStage is itself a Stage whose Placeholder<Stat> node reads the statistic
//    (like ColBroadcast from registers) and Placeholder<Slot> nodes read bypassed values:
//    Bypass<Slot, Node> marks, in the producing stage, values written back fragment by
//    fragment into the accumulator registers (dead after AccEntry read them, unless the
//    planner keeps AccEntry alive) that stream() hands to the next stage as its `acc`.
//  * Stores stay per stage: a stage without Store nodes skips the SMEM/TMA part
//    (kHasStores below).
#pragma once
#include "nodes.cuh"

namespace comfuse::epi {

// Tile geometry of one consumer warp group.
template <int BM_, int BN_> struct Geometry {
  static constexpr int BM = BM_, BN = BN_;
  static constexpr int MBlocks = BM / 64;   // m64 wgmma blocks
  static constexpr int SubTiles = BN / 64;  // 64-column store subtiles
};

namespace detail {
template <class N, class = void> struct is_store : cute::false_type {};
template <class N> struct is_store<N, cute::void_t<decltype(N::kIsStore)>> : cute::true_type {};

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

template <class... Nodes> struct Stage {
  static constexpr int kNumNodes = sizeof...(Nodes);
  static constexpr int kNumStores = (0 + ... + int(detail::is_store<Nodes>::value));
  static constexpr bool kHasStores = kNumStores > 0;

  template <class Geo> struct Exec {
    using Impls = cute::tuple<typename Nodes::template Impl<Geo>...>;
    using Layout = detail::StorageLayout<typename Nodes::template Impl<Geo>::SharedStorage...>;
    using StorageTypes = cute::tuple<typename Nodes::template Impl<Geo>::SharedStorage...>;
    struct SharedStorage : Layout::Storage {
      template <int I> static constexpr size_t offset_of() { return Layout::offset(I); }
    };
    Impls impls;

    // Once per tile, before any fragment (the caller syncs the warp group after it).
    COMFUSE_DEVICE void begin(EpiCtx const& c, SharedStorage& ss) {
      cute::for_each(cute::make_int_sequence<kNumNodes>{}, [&](auto i) {
        cute::get<decltype(i)::value>(impls).begin(c, detail::storage_get<decltype(i)::value, StorageTypes>(ss));
      });
    }

    // One fragment through every node.
    template <class V> COMFUSE_DEVICE void visit_all(EpiCtx const& c, FragCoord const& fc, Frag const& acc, V& vals) {
      cute::for_each(cute::make_int_sequence<kNumNodes>{}, [&](auto i) {
        cute::get<decltype(i)::value>(impls).template visit<decltype(i)::value>(c, fc, acc, vals);
      });
    }

    // The whole tile: accum is the warp group's accumulator fragment (FragC of the
    // mainloop). bar_id: the warp group's epilogue named barrier.
    template <class FragC> COMFUSE_DEVICE void run(EpiCtx const& c, SharedStorage& ss, FragC const& accum, int bar_id) {
      // Without stores no barrier ends the previous tile: its readers of begin()'s SMEM
      // must be done before begin() rewrites it.
      if constexpr (!kHasStores) named_sync(bar_id, kWarpGroupThreads);
      begin(c, ss);
      // Before the first subtile rewrites the staging buffers, the previous tile's stores
      // must have read them; the same barrier publishes the vectors begin() wrote.
      if constexpr (kHasStores) {
        if (c.t == 0) tma_store_wait_read<0>();
      }
      named_sync(bar_id, kWarpGroupThreads);
      CUTE_UNROLL
      for (int s = 0; s < Geo::SubTiles; ++s) {
        if constexpr (kHasStores) {
          if (s > 0) {
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
            fc.row = mi * 64 + c.warp * 16 + c.lane / 4;
            fc.mi = mi;
            Frag acc;
            CUTE_UNROLL
            for (int e = 0; e < kFrag; ++e) acc[e] = accum(mi * (Geo::BN / 2) + 8 * (4 * s + j) + e);
            float vals[kNumNodes][kFrag];
            visit_all(c, fc, acc, vals);
          }
        }
        if constexpr (kHasStores) {
          fence_view_async_shared();
          named_sync(bar_id, kWarpGroupThreads);
          if (c.t == 0) {
            cute::for_each(cute::make_int_sequence<kNumNodes>{}, [&](auto i) {
              cute::get<decltype(i)::value>(impls).subtile_end(c, detail::storage_get<decltype(i)::value, StorageTypes>(ss), s);
            });
            tma_store_commit();
          }
        }
      }
    }
  };
};

}  // namespace comfuse::epi
