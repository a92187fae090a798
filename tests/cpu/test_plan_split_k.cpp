// The planner's split-K: where a wave of tiles leaves SMs idle (decode and one row block), its
// hand-over through L2 or over DSMEM, the owner's gather priced and staged in SMEM, the partial
// rows' tagged words and the workspace that holds them.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include "comfuse/emit.h"
#include "comfuse/lower.h"
#include "comfuse/plan.h"
#include "comfuse/scheduler/grid.cuh"
#include "cpu/plan_specs.h"
#include "expect_error.h"
#include "plan/calibration.h"
#include "plan/plan_internal.h"

namespace comfuse {
namespace {

using namespace plan_specs;

using test::expect_error;

// Split-K where one wave of tiles leaves each SM more bytes of B to pull than the DRAM needs
// for all of B (decode at N = 2048: 16 CTAs); at N = 4096 into the splits whose CTAs fill the
// SMs, 4 (calibration.cpp single_row_block_k_splits: RMSNorm 1 x 4096 x 4096 S = 2 19.2 us, S =
// 4 15.4; 8 splits of 64x128 would not fit the SMs), and not where the jobs fill the GPU.
TEST(Plan, SplitKAtDecodeOnly) {
  const FusionSpec s = rms_norm();
  for (int64_t m : {1, 7, 16}) {
    SCOPED_TRACE(m);
    const Plan p = make_plan(s, prob(m, 2048, 4096), full_device(), {}, {});
    EXPECT_GT(p.kernel.k_splits, 1);
    EXPECT_GE(p.grid_ctas, 64);
    EXPECT_EQ(check(p.kernel), nullptr);
    PlanOptions one;
    one.k_splits = 1;
    const Plan q = make_plan(s, prob(m, 2048, 4096), full_device(), {}, one);
    EXPECT_EQ(q.kernel.k_splits, 1);
    EXPECT_LT(p.estimate.total_us, q.estimate.total_us);
    EXPECT_NE(explain(s, p).find("split-K      "), std::string::npos);
  }
  EXPECT_EQ(make_plan(s, prob(8192, 4096, 4096), full_device(), {}, {}).kernel.k_splits, 1);
  EXPECT_EQ(make_plan(s, prob(16, 4096, 4096), full_device(), {}, {}).kernel.k_splits, 4);
  EXPECT_EQ(make_plan(s, prob(16, 2048, 128), full_device(), {}, {}).kernel.k_splits, 1);  // two k-blocks: nothing to split
  PlanOptions bad;
  bad.k_splits = 17;
  EXPECT_THROW(make_plan(s, prob(1, 2048, 4096), full_device(), {}, bad), Error);
  bad.k_splits = 4;
  EXPECT_THROW(make_plan(s, prob(1, 2048, 128), full_device(), {}, bad), Error);  // 2 k-blocks < 4 splits
}

// Split-K for an elementwise epilogue (GPT-2's decode c_fc + bias + GELU), forced only: the
// row-group division with nothing to exchange (a row block's N-tiles spread over a group of
// CTAs, no aggregation), each tile's K over the splits, the owner adding the partials before
// its epilogue. The planner alone keeps its measured configuration. Row groups and the L2
// aggregation stay refused by name where there is no row to reduce, and so is split-K with a
// forced cluster along N.
TEST(Plan, ForcedSplitKOnAnElementwiseEpilogue) {
  const FusionSpec s = bias_gelu();
  for (int64_t m : {1, 32}) {
    SCOPED_TRACE(m);
    PlanOptions o;
    o.k_splits = 4;
    const Plan p = make_plan(s, prob(m, 4096, 1024), full_device(), {}, o);
    EXPECT_EQ(p.kernel.k_splits, 4);
    EXPECT_FALSE(p.kernel.row_reduction);
    EXPECT_EQ(p.kernel.aggregation, Aggregation::None);
    EXPECT_EQ(p.kernel.n_tiles, 1);
    EXPECT_GE(int64_t{p.kernel.row_group} * p.kernel.tile_n, 4096);  // every column has a CTA
    EXPECT_EQ(check(p.kernel), nullptr);
    EXPECT_NE(explain(s, p).find("split-K"), std::string::npos);
    EXPECT_EQ(make_plan(s, prob(m, 4096, 1024), full_device(), {}, {}).kernel.k_splits, 1);
  }
  // More N-tiles than a row group holds (9000 columns: 71 tiles of 128): forced, the jobs walk N;
  // unforced, the measured split rows (one job a row block) do not apply and the plan stays unsplit.
  PlanOptions wide;
  wide.k_splits = 2;
  const Plan w = make_plan(s, prob(2, 9000, 2048), full_device(), {}, wide);
  EXPECT_EQ(w.kernel.k_splits, 2);
  EXPECT_GT(w.jobs, 1);
  EXPECT_EQ(check(w.kernel), nullptr);
  EXPECT_EQ(make_plan(s, prob(1, 8320, 8192), full_device(), {}, {}).kernel.k_splits, 1);
  PlanOptions bad;
  bad.k_splits = 4;
  bad.cluster_n = 2;
  expect_error([&] { make_plan(s, prob(1, 4096, 1024), full_device(), {}, bad); }, "k_splits");
  PlanOptions rg;
  rg.row_group = 4;
  expect_error([&] { make_plan(s, prob(1, 4096, 1024), full_device(), {}, rg); }, "row_group");
}

// GPT-2 medium's decode c_proj region (examples/gemm_residual_layernorm.cf: bias + residual ->
// LayerNorm, h, y, mean and rstd stored). The split-K owner adds the other splits' partials one
// dependent L2 round trip per split and row slot before its epilogue (calibration.h
// split_k_gather_*), and a one-wave launch pays its fixed cost: the estimates of the plans that
// were measured land within 20% of their times (MEASURED on the H200, fused per launch,
// bench/NOTES.md "Decode split-K owners"), the 16 splits that once looked free (est 10.1 us,
// measured 19.2) are no longer picked, and no pick is priced below the fastest variant measured.
FusionSpec c_proj_residual_layer_norm() {
  return lowered([](Graph& g, Value acc) {
    Value h = acc + row(g, "bias") + g.input("residual", DType::BF16, {Dim::of("M"), Dim::of("N")});
    g.output(h, "h", DType::BF16);
    Value mu = g.reduce(ReduceOp::Mean, h);
    Value d = h - mu;
    Value rstd = g.unary(UnaryOp::Rsqrt, g.reduce(ReduceOp::Mean, d * d) + 1e-5);
    g.output(mu, "mu", DType::F32);
    g.output(rstd, "rstd", DType::F32);
    return d * rstd * row(g, "gamma") + row(g, "beta");
  });
}

// The split-K owner's gather is priced in dependent L2 round trips of its loads (calibration.h
// split_k_gather_*, decide_row_groups.cpp gather_rounds): many splits cost the owner more than
// they save the mainloop, and rows beyond what the warp group sums in SMEM cost a round trip per
// row slot. The planner's own plans at these decode shapes are no dearer than the forced ones.
TEST(Plan, DecodeSplitKOwnersPayTheirGather) {
  const FusionSpec s = c_proj_residual_layer_norm();
  double forced_m1 = 0, forced_m32 = 0;
  for (int64_t m : {1, 32})
    for (int64_t k : {1024, 4096}) {
      SCOPED_TRACE(fmt::format("M={} N=1024 K={}", m, k));
      PlanOptions o;
      o.k_splits = 16, o.cluster_m = 1, o.row_group = 8, o.tile_m = 64, o.tile_n = 128;
      const Plan f = make_plan(s, prob(m, 1024, k), full_device(), {}, o);
      ASSERT_EQ(f.kernel.k_splits, 16);
      if (k == 4096) (m == 1 ? forced_m1 : forced_m32) = f.estimate.total_us;
      const Plan p = make_plan(s, prob(m, 1024, k), full_device(), {}, {});
      EXPECT_EQ(check(p.kernel), nullptr);
      EXPECT_EQ(p.kernel.aggregation, Aggregation::L2Exchange);
      EXPECT_LE(p.kernel.k_splits, 8);
      EXPECT_LE(p.estimate.total_us, f.estimate.total_us);
    }
  // M = 1: the warp group sums one row's 15 partials in SMEM, 2 round trips of loads; M = 32:
  // each thread loads its own a row slot at a time, as many (2).
  const PlannerTunables tun;
  EXPECT_GT(forced_m32 - forced_m1, 0.0);
  EXPECT_LT(forced_m32 - forced_m1, 15 * tun.split_k_gather_per_split_us);
}

// The workspace holds the exchange slots, the split tags and the partial tiles, laid out once
// for the most clusters a launch may have.
TEST(Plan, SplitKWorkspaceLayout) {
  KernelConfig c;
  c.tile_m = 64, c.tile_n = 128, c.row_group = 16, c.k_splits = 8, c.row_reduction = true;
  c.aggregation = Aggregation::L2Exchange;
  const ExchangeLayout l = exchange_layout(c, 132);
  const long long owners = (132 / 128) * 16 * 2;  // one split group of 16 x 8 clusters, 2 warp groups a CTA
  EXPECT_EQ(l.split_flags, kExchangeHeaderBytes + c.exchange_slot_bytes() * 1 * 2);
  EXPECT_EQ(l.split_partials, l.split_flags + (owners * 8 * 4 + 127) / 128 * 128);
  EXPECT_EQ(l.total_bytes, l.split_partials + owners * 7 * 64 * 128 * 4);
  EXPECT_EQ(l.tagged_bytes, l.split_partials - kExchangeHeaderBytes);
  const LaunchGrid g = launch_grid(c, 1, 2048, 132);
  EXPECT_EQ(g.clusters, 128);
  c.k_splits = 1, c.aggregation = Aggregation::None, c.row_group = 1, c.row_reduction = false;
  EXPECT_EQ(exchange_layout(c, 132).total_bytes, 0);
}

// Split-K over DSMEM (KernelConfig::splits_in_cluster), forced: a tile's K-splits are one
// hardware cluster (no multicast cluster), the grid's cluster dims say so, the runtime counts
// one-CTA clusters, the workspace holds no tags or partial tiles (only the row exchange's), and
// the hand-over's SMEM is in the launch's size. What it cannot be built with is refused by name.
TEST(Plan, SplitKPartialsOverDsmem) {
  const FusionSpec s = c_proj_residual_layer_norm();
  PlanOptions o;
  o.k_splits = 8;
  o.splits_in_cluster = true;
  const Plan p = make_plan(s, prob(1, 1024, 4096), full_device(), {}, o);
  EXPECT_TRUE(p.kernel.splits_in_cluster);
  EXPECT_EQ(p.kernel.k_splits, 8);
  EXPECT_EQ(p.kernel.cluster_size(), 1);
  EXPECT_EQ(p.kernel.hw_cluster_x(), 8);
  EXPECT_EQ(check(p.kernel), nullptr);
  EXPECT_EQ(p.kernel.split_partial_bytes(), 0);
  EXPECT_GE(p.kernel.smem_bytes(), p.kernel.ring_bytes() + 2 * p.kernel.split_hand_over_bytes());
  EXPECT_EQ(p.kernel.split_hand_over_bytes(), 64 * 128 / 128 * 32 * 4 + 128);  // one warp's partial, 2 mbarriers
  const int resident = full_device().resident(8) * 8;  // the runtime's count: one-CTA clusters
  const LaunchGrid g = launch_grid(p.kernel, 1, 1024, resident);
  EXPECT_EQ(g.cluster_x, 8);
  EXPECT_EQ(g.grid_x % 8, 0);
  EXPECT_EQ(exchange_layout(p.kernel, resident).split_partials, exchange_layout(p.kernel, resident).total_bytes);
  const std::string e = explain(s, p);
  EXPECT_NE(e.find("over DSMEM"), std::string::npos) << e;
  EXPECT_NE(e.find("cluster(s) of 8x1"), std::string::npos) << e;
  // The L2 path is what the planner proposes until the DSMEM one is measured to win.
  EXPECT_FALSE(make_plan(s, prob(1, 1024, 4096), full_device(), {}, {}).kernel.splits_in_cluster);

  KernelConfig c = p.kernel;
  c.cluster_m = 2;
  EXPECT_STREQ(check(c), "K-splits in one hardware cluster: no multicast cluster (cluster_m = cluster_n = 1)");
  c = p.kernel;
  c.k_splits = 1;
  EXPECT_STREQ(check(c), "splits_in_cluster: at least 2 K-splits");
  PlanOptions alone;
  alone.splits_in_cluster = true;
  alone.k_splits = 1;
  expect_error([&] { make_plan(s, prob(1, 1024, 4096), full_device(), {}, alone); }, "no split-K");
  PlanOptions pairs = o;
  pairs.cluster_m = 2;
  expect_error([&] { make_plan(s, prob(1, 1024, 4096), full_device(), {}, pairs); }, "no row-group plan");
}

// One row block (M <= 64) with long K takes 64 x 128 tiles with K split over the most CTAs that
// fit the SMs (calibration.cpp single_row_block_k_splits; bench/sweeps/decode_long_k_split.txt,
// decode_split_residual.txt): at K >= 8192 for any M <= 64, at K = 4096 only for M <= 16 (32 x
// 4096 x 4096 measured faster unsplit on 64 x 64 tiles), never at K = 1024; with a row reduction
// too, where the row-group model alone ties the splits and takes fewer.
TEST(Plan, DecodeLongKSplitsOverTheSms) {
  const FusionSpec ew = bias_gelu(), rms = rms_norm();
  struct Case {
    int64_t m, n, k;
    int tile_n, k_splits;
  };
  for (const Case& c : {Case{1, 4096, 4096, 128, 4}, Case{16, 4096, 4096, 128, 4}, Case{1, 4096, 11008, 128, 4},
                        Case{32, 4096, 14336, 128, 4}, Case{1, 2048, 4096, 128, 8}, Case{32, 4096, 4096, 64, 1},
                        Case{1, 4096, 1024, 64, 1}}) {
    const std::string at = fmt::format("{}x{}x{}", c.m, c.n, c.k);
    const Plan e = make_plan(ew, prob(c.m, c.n, c.k), full_device(), {}, {});
    EXPECT_EQ(e.kernel.tile_n, c.tile_n) << at;
    EXPECT_EQ(e.kernel.k_splits, c.k_splits) << at;
    if (c.k_splits > 1) {
      EXPECT_EQ(e.kernel.cluster_m, 1) << at;
      // A row of at most 32 64-column CTAs takes them instead: K split over 8 at N <= 1024, over 4
      // at N = 2048 (calibration.cpp narrow_row_group_k_splits).
      const int rms_splits = c.m > 16 || c.n > 2048 ? c.k_splits : c.n > 1024 ? 4 : 8;
      EXPECT_EQ(make_plan(rms, prob(c.m, c.n, c.k), full_device(), {}, {}).kernel.k_splits, rms_splits) << at;
    }
  }
  // Forced options keep the model's choice.
  PlanOptions forced;
  forced.k_splits = 2;
  EXPECT_EQ(make_plan(rms, prob(1, 4096, 14336), full_device(), {}, forced).kernel.k_splits, 2);
}

// One row block at mid K (K >= 3072) with an elementwise epilogue: 64x64 tiles with K split over
// up to 4 CTAs a tile, as many as take at most half the SMs, the owner summing the partials in
// SMEM (calibration.cpp narrow_tile_k_splits; bench/sweeps/narrow_tile_split_k.txt and
// decode_narrow_split_k.txt: the small FFN's GEMM2 64 x 1024 x 3072 9.4 -> 7.5 us, 1 x 768 x 3072
// 10.2 -> 6.2 on the H100). Not at K = 2048 (measured slower), not where 64x64 tiles already take
// half the SMs; decode rows at K >= 4096 keep their own rule (64x128, Plan.DecodeLongKSplitsOverTheSms).
// (A row reduction's split is the row-group model's.)
TEST(Plan, NarrowTilesSplitKAtMidK) {
  const FusionSpec ew = bias_gelu();
  struct Case {
    int64_t m, n, k;
    int k_splits, gather_rows;
  };
  for (const Case& c : {Case{64, 1024, 3072, 4, 64}, Case{32, 1024, 3072, 4, 32}, Case{64, 768, 3072, 4, 64},
                        Case{64, 2048, 4096, 2, 64}, Case{48, 2048, 2048, 1, 0}, Case{16, 1024, 3072, 4, 16},
                        Case{1, 768, 3072, 4, 8}, Case{16, 2048, 3072, 2, 16}, Case{64, 4096, 4096, 1, 0}}) {
    const std::string at = fmt::format("{}x{}x{}", c.m, c.n, c.k);
    const Plan e = make_plan(ew, prob(c.m, c.n, c.k), full_device(), {}, {});
    EXPECT_EQ(e.kernel.tile_m, 64) << at;
    EXPECT_EQ(e.kernel.tile_n, 64) << at;
    EXPECT_EQ(e.kernel.k_splits, c.k_splits) << at;
    EXPECT_EQ(e.kernel.split_gather_rows, c.gather_rows) << at;
    EXPECT_LE(e.kernel.smem_bytes(), Sm90::kSmemCapacity) << at;
  }
  PlanOptions n64;  // a row reduction's forced 64-column tiles stay the DSMEM plans'
  n64.tile_n = 64;
  EXPECT_NE(make_plan(layer_norm(), prob(256, 4096, 4096), full_device(), {}, n64).kernel.aggregation,
            Aggregation::L2Exchange);
  // ... unless the L2 exchange is forced too: decode rows in 64x64 row groups with K split (forced only).
  n64.tile_m = 64, n64.cluster_m = 1, n64.k_splits = 8;
  n64.aggregation = Aggregation::L2Exchange;
  const Plan narrow = make_plan(residual_norm(true, DType::BF16, true), prob(1, 1024, 4096), full_device(), {}, n64);
  EXPECT_EQ(narrow.kernel.aggregation, Aggregation::L2Exchange);
  EXPECT_EQ(narrow.kernel.tile_n, 64);
  EXPECT_EQ(narrow.kernel.row_group, 16);
  EXPECT_EQ(narrow.kernel.k_splits, 8);
  EXPECT_LE(narrow.kernel.smem_bytes(), Sm90::kSmemCapacity);
  // The planner's own at decode rows whose row stays within 32 such CTAs (N <= 2048, K >= 4096:
  // calibration.cpp narrow_row_group_k_splits, measured), 64x128 beyond.
  for (const int64_t m : {1, 16}) {
    const Plan d = make_plan(residual_norm(true, DType::BF16, true), prob(m, 1024, 4096));
    EXPECT_EQ(d.kernel.tile_n, 64) << m;
    EXPECT_EQ(d.kernel.row_group, 16) << m;
    EXPECT_EQ(d.kernel.k_splits, 8) << m;
    EXPECT_EQ(d.kernel.aggregation, Aggregation::L2Exchange) << m;
  }
  // 32 CTAs a row: K split over 4, 128 CTAs (RMSNorm, the pairs of LayerNorm and softmax, the
  // residual norms, a chain of rounds: measured).
  for (const FusionSpec& reduced : {rms_norm(), residual_norm(false, DType::BF16, true), layer_norm(), softmax(),
                                    residual_norm(true, DType::BF16, true), chain(4)})
    for (const int64_t m : {1, 16}) {
      const Plan p2048 = make_plan(reduced, prob(m, 2048, 4096));
      EXPECT_EQ(p2048.kernel.tile_n, 64) << m;
      EXPECT_EQ(p2048.kernel.row_group, 32) << m;
      EXPECT_EQ(p2048.kernel.k_splits, 4) << m;
      EXPECT_EQ(p2048.kernel.aggregation, Aggregation::L2Exchange) << m;
      EXPECT_EQ(p2048.grid_ctas, 128) << m;
    }
  EXPECT_EQ(make_plan(layer_norm(), prob(8, 4096, 4096)).kernel.tile_n, 128);  // 64 CTAs a row: lost
  EXPECT_EQ(make_plan(rms_norm(), prob(8, 4096, 4096)).kernel.tile_n, 128);             // 64 CTAs a row: lost
  EXPECT_EQ(make_plan(residual_norm(true, DType::BF16, true), prob(1, 1024, 3072)).kernel.tile_n, 128);  // K < 4096
  EXPECT_EQ(make_plan(residual_norm(true, DType::BF16, true), prob(32, 1024, 4096)).kernel.tile_n, 128); // M > 16
  PlanOptions own;  // each thread its own partials: the same split, nothing staged
  own.split_gather_in_smem = false;
  const Plan p = make_plan(ew, prob(64, 1024, 3072), full_device(), {}, own);
  EXPECT_EQ(p.kernel.k_splits, 4);
  EXPECT_EQ(p.kernel.split_gather_rows, 0);
}

// All of M in fewer rows than one tile: A's TMA boxes hold M rounded up to 8 rows
// (KernelConfig::a_box_rows), not where A is multicast in slices or M fills the tile.
TEST(Plan, DecodeRowsLoadShortABoxes) {
  const FusionSpec ew = bias_gelu(), rms = rms_norm();
  EXPECT_EQ(make_plan(ew, prob(1, 4096, 4096)).kernel.a_box_rows, 8);
  EXPECT_EQ(make_plan(ew, prob(13, 4096, 4096)).kernel.a_box_rows, 16);
  EXPECT_EQ(make_plan(ew, prob(32, 4096, 4096)).kernel.a_box_rows, 32);
  EXPECT_EQ(make_plan(rms, prob(7, 2048, 4096)).kernel.a_box_rows, 8);
  EXPECT_EQ(make_plan(ew, prob(64, 4096, 4096)).kernel.a_box_rows, 0);
  EXPECT_EQ(make_plan(ew, prob(8192, 4096, 4096)).kernel.a_box_rows, 0);
  PlanOptions pairs_n;
  pairs_n.cluster_n = 2;
  EXPECT_EQ(make_plan(ew, prob(3, 1000, 1032), full_device(), {}, pairs_n).kernel.a_box_rows, 0);
  KernelConfig k;
  k.tile_m = 64, k.tile_n = 128, k.cluster_n = 2, k.a_box_rows = 8;
  EXPECT_NE(check(k), nullptr);  // multicast slices keep full boxes
  k.cluster_n = 1, k.a_box_rows = 12;
  EXPECT_NE(check(k), nullptr);  // not a whole swizzle atom
  k.a_box_rows = 8;
  EXPECT_EQ(check(k), nullptr);
  EXPECT_NE(explain(ew, make_plan(ew, prob(1, 4096, 4096))).find("A boxes      8 rows"), std::string::npos);
}

// Split-K through L2: the owner's warp group sums the partial rows in SMEM
// (KernelConfig::split_gather_rows: decode rows, or the whole tile) where they fit beside the ring
// as planned (at most 16 rows of a 64x128 tile beside its 8 stages, a whole 64x64 tile beside its
// 8), not at a ring stage's cost; elsewhere each thread loads its own. Forced, the ring gives up
// the stages the staging needs, and the plan says so.
TEST(Plan, DecodeSplitSumsPartialRowsInSmem) {
  const FusionSpec ew = bias_gelu(), rms = rms_norm();
  for (int64_t m : {1, 13, 16}) {
    SCOPED_TRACE(m);
    for (const FusionSpec* s : {&ew, &rms}) {
      const Plan p = make_plan(*s, prob(m, 4096, 4096));
      ASSERT_GT(p.kernel.k_splits, 1);
      EXPECT_EQ(p.kernel.split_gather_rows, p.kernel.a_box_rows);
      EXPECT_EQ(p.kernel.ring_stages, 8);
      EXPECT_LE(p.kernel.smem_bytes(), Sm90::kSmemCapacity);
      EXPECT_EQ(p.smem.split_gather, 2 * p.kernel.split_gather_rows * p.kernel.tile_n * 4);
      EXPECT_EQ(p.smem.total(), p.kernel.smem_bytes());
    }
  }
  PlanOptions split;
  split.k_splits = 4;
  const Plan wide = make_plan(ew, prob(32, 4096, 14336), full_device(), {}, split);
  EXPECT_EQ(wide.kernel.a_box_rows, 32);
  EXPECT_EQ(wide.kernel.split_gather_rows, 0);  // 2 x 16 KiB would cost a ring stage
  EXPECT_EQ(make_plan(ew, prob(64, 4096, 14336)).kernel.split_gather_rows, 0);  // 64x128's 2 x 32 KiB: no room
  PlanOptions dsmem = split;
  dsmem.splits_in_cluster = true;
  EXPECT_EQ(make_plan(rms, prob(1, 2048, 4096), full_device(), {}, dsmem).kernel.split_gather_rows, 0);
  KernelConfig k;
  k.tile_m = 64, k.tile_n = 128, k.k_splits = 4, k.a_box_rows = 8, k.split_gather_rows = 8;
  EXPECT_EQ(check(k), nullptr);
  k.split_gather_rows = 16;
  EXPECT_NE(check(k), nullptr);  // not the box's rows
  k.a_box_rows = 0, k.split_gather_rows = 64;
  EXPECT_EQ(check(k), nullptr);  // a whole tile's
  k.split_gather_rows = 16;
  EXPECT_NE(check(k), nullptr);
  k.a_box_rows = 8;
  k.split_gather_rows = 8, k.k_splits = 1;
  EXPECT_NE(check(k), nullptr);  // no split-K
  EXPECT_NE(explain(ew, make_plan(ew, prob(1, 4096, 4096))).find("split gather"), std::string::npos);
  PlanOptions forced;
  forced.split_gather_in_smem = true;
  // Forced at whole tiles: the warp group's 64 rows, the ring giving up the stages they need.
  forced.k_splits = 4;
  const Plan whole = make_plan(ew, prob(64, 4096, 14336), full_device(), {}, forced);
  EXPECT_EQ(whole.kernel.a_box_rows, 0);
  EXPECT_EQ(whole.kernel.split_gather_rows, 64);
  EXPECT_LT(whole.kernel.ring_stages, 8);
  EXPECT_LE(whole.kernel.smem_bytes(), Sm90::kSmemCapacity);
  EXPECT_NE(explain(ew, whole).find(fmt::format("ring 8 -> {} stages", whole.kernel.ring_stages)), std::string::npos);
  EXPECT_EQ(whole.smem.split_gather, 2 * 64 * whole.kernel.tile_n * 4);
  // Unforced only beside the ring as planned: 2 x 32 KiB would cost 64x128's 8-stage ring stages.
  EXPECT_EQ(make_plan(ew, prob(64, 4096, 14336), full_device(), {}, split).kernel.split_gather_rows, 0);
  forced.tile_m = 128, forced.tile_n = 128;  // 2 x 64 KiB of staging beside LayerNorm's: no ring leaves room
  expect_error([&] { make_plan(layer_norm(), prob(256, 4096, 4096), full_device(), {}, forced); }, "exceed the SMEM");
  forced = {};
  forced.split_gather_in_smem = true;
  PlanOptions forced_dsmem = dsmem;
  forced_dsmem.split_gather_in_smem = true;
  expect_error([&] { make_plan(rms, prob(1, 2048, 4096), full_device(), {}, forced_dsmem); }, "no split-K through L2");
  PlanOptions off;
  off.split_gather_in_smem = false;
  EXPECT_EQ(make_plan(ew, prob(1, 4096, 4096), full_device(), {}, off).kernel.split_gather_rows, 0);
}

// The partial rows travel as tagged 8-byte words (no flag) only where twice the bytes take no
// more rounds of the owner's loads: a round more measured 0.6-1.1 us slower, the tags 0.1-0.5
// faster (bench/NOTES.md Stop 38). Their workspace is then zeroed with the tags.
TEST(Plan, DecodeSplitTagsItsWordsWhereTheRoundsStay) {
  KernelConfig k;
  k.tile_m = 64, k.tile_n = 128, k.k_splits = 4, k.a_box_rows = 8, k.split_gather_rows = 8;
  EXPECT_TRUE(k.split_words_tagged());  // 8 rows, S = 4: one round either way
  EXPECT_EQ(k.split_gather_rounds(), 1);
  EXPECT_EQ(k.split_partial_bytes(), 8 * 128 * 8);  // only the staged rows travel
  const ExchangeLayout l = exchange_layout(k, 132);
  EXPECT_EQ(kExchangeHeaderBytes + l.tagged_bytes, l.total_bytes);  // the words are tagged bytes
  k.k_splits = 8;  // two rounds of words against one of fp32
  EXPECT_FALSE(k.split_words_tagged());
  EXPECT_EQ(k.split_gather_rounds(), 1);
  EXPECT_EQ(k.split_partial_bytes(), 64 * 128 * 4);
  EXPECT_LT(kExchangeHeaderBytes + exchange_layout(k, 132).tagged_bytes, exchange_layout(k, 132).total_bytes);
  k.k_splits = 4, k.a_box_rows = 16, k.split_gather_rows = 16;  // 16 rows: two rounds against one
  EXPECT_FALSE(k.split_words_tagged());
  k.k_splits = 2;
  EXPECT_TRUE(k.split_words_tagged());
  k.split_gather_rows = 0, k.a_box_rows = 0;  // each thread loads its own partials: fp32
  EXPECT_FALSE(k.split_words_tagged());
  // A whole 64x64 tile summed in SMEM: 8 runs a thread, tagged only where the splits' loads fill
  // a round either way (12 or more splits).
  k.tile_n = 64, k.split_gather_rows = 64, k.k_splits = 2;
  EXPECT_EQ(k.split_gather_rounds(), 1);
  EXPECT_FALSE(k.split_words_tagged());
  k.k_splits = 16;
  EXPECT_EQ(k.split_gather_rounds(), 8);
  EXPECT_TRUE(k.split_words_tagged());
  EXPECT_EQ(k.split_partial_bytes(), 64 * 64 * 8);
  const FusionSpec ew = bias_gelu();
  EXPECT_NE(explain(ew, make_plan(ew, prob(1, 4096, 4096))).find("8-byte words"), std::string::npos);
  EXPECT_NE(explain(ew, make_plan(ew, prob(16, 4096, 4096))).find("behind a flag"), std::string::npos);
}

}  // namespace
}  // namespace comfuse
