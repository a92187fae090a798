// The planner: SMEM always within the limit, the O(1) reduction buffer, strategy and
// aggregation rules, forced options, honest errors, and the explain/DOT printers (split-K:
// test_plan_split_k.cpp; paired reductions and stash plans: test_plan_pairs.cpp).
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

struct Named {
  const char* name;
  FusionSpec spec;
};
std::vector<Named> all_specs() {
  return {{"bias_gelu", bias_gelu()}, {"layer_norm", layer_norm()}, {"rms_norm", rms_norm()},
          {"softmax", softmax()},     {"chain4", chain(4)},          {"residual_rms_norm", residual_norm(false, DType::F32, true)}};
}

TEST(Plan, ProblemOfResolvesDimsAndDtype) {
  FusionSpec s = layer_norm();
  Problem p = problem_of(s, {{"M", 300}, {"N", 520}, {"K", 64}});
  EXPECT_EQ(p.m, 300);
  EXPECT_EQ(p.n, 520);
  EXPECT_EQ(p.k, 64);
  EXPECT_EQ(p.ab_dtype, DType::BF16);
  EXPECT_THROW(problem_of(s, {{"M", 1}}), Error);
}

// Every plan of the sweep is internally consistent and fits the device.
TEST(Plan, SweepFitsSmemAndFollowsTheRules) {
  const DeviceModel dev = full_device();
  const PlannerTunables tun;
  int plans = 0;
  for (const Named& sp : all_specs()) {
    const int L = sp.spec.reduction_count();
    for (int64_t m : {1, 256, 4096, 8192})
      for (int64_t n : {64, 1000, 4096, 8192, 32768})
        for (int64_t k : {16, 4096}) {
          SCOPED_TRACE(fmt::format("{} M={} N={} K={}", sp.name, m, n, k));
          Plan p = make_plan(sp.spec, prob(m, n, k), dev, tun);
          ++plans;
          EXPECT_LE(p.smem.total(), dev.smem_per_cta_bytes);
          EXPECT_EQ(p.smem_limit, dev.smem_per_cta_bytes);
          EXPECT_GE(p.kernel.ring_stages, 2);
          // The planner's own cap; past it only M <= 256's 64x64 tiles, where SMEM holds more (kStreamRing).
          EXPECT_LE(p.kernel.ring_stages, p.kernel.tile_n == 64 && m <= 256 ? Sm90::kMaxRingStages : Sm90::kRingStagesDefault);
          EXPECT_TRUE(p.kernel.tile_m == 64 || p.kernel.tile_m == 128);
          EXPECT_TRUE(p.kernel.tile_n == 64 || p.kernel.tile_n == 128 || p.kernel.tile_n == 192 || p.kernel.tile_n == 256);
          EXPECT_EQ(Sm90::kTileK, 64);
          EXPECT_EQ(p.smem.mainloop_ring, p.kernel.ring_stages * (p.kernel.tile_m + p.kernel.tile_n) * Sm90::kTileK * 2);
          EXPECT_LE(p.smem.stash, tun.max_stash_bytes);
          EXPECT_EQ((p.kernel.cluster_n > 1), p.kernel.cluster_n > 1);
          EXPECT_EQ(p.reductions, L);
          EXPECT_GT(p.grid_ctas, 0);
          EXPECT_LE(p.grid_ctas, dev.sm_count);
          EXPECT_GT(p.estimate.total_us, 0);
          EXPECT_GE(p.reasons.size(), 8u);
          if (L == 0) {
            EXPECT_EQ(p.strategy(), RowStrategy::NoReduction);
            EXPECT_EQ(p.kernel.aggregation, Aggregation::None);
            EXPECT_EQ(p.smem.reduction_buffer, 0);
            continue;
          }
          const int64_t peers = int64_t{p.kernel.cluster_n} * p.kernel.row_group;  // the CTAs that share a row
          const bool covers = peers * p.kernel.tile_n >= n;
          EXPECT_GE(peers * p.kernel.tile_n * p.kernel.n_tiles, n);
          EXPECT_EQ(p.strategy() == RowStrategy::OnChip, covers);   // OnChip iff the row's CTAs cover N
          EXPECT_EQ(p.kernel.n_tiles == 1, covers);
          if (p.kernel.row_group > 1) {  // row groups: clusters along N are 1, the row meets in L2
            EXPECT_EQ(p.kernel.aggregation, Aggregation::L2Exchange);
            EXPECT_EQ(p.kernel.cluster_n, 1);
            // On chip only the pair rounds' hand-over between warps (64-row warp groups, > 16 peers).
            const int hand_over = l2_exchange_smem_bytes(p.kernel.epi_rows(), int(peers));
            EXPECT_EQ(p.kernel.pair_hand_over, p.fused_pairs.any() && m > 8 && hand_over > 0);
            EXPECT_EQ(p.smem.reduction_buffer, p.kernel.consumer_wgs * (p.kernel.pair_hand_over ? hand_over : 0));
            EXPECT_LE(p.grid_ctas / p.kernel.cluster_m, dev.clusters_resident.at(p.kernel.cluster_m));
            EXPECT_EQ(p.grid_ctas / p.kernel.cluster_m % p.kernel.row_group, 0) << "whole row groups";
          } else if (peers == 1) {
            EXPECT_TRUE(p.kernel.aggregation == Aggregation::None || p.kernel.aggregation == Aggregation::PeerToPeer);
          } else {
            EXPECT_EQ(p.kernel.aggregation, p.kernel.cluster_n <= tun.p2p_max_cluster ? Aggregation::PeerToPeer
                                                                        : Aggregation::LeaderFollower);
          }
          if (p.strategy() == RowStrategy::WorkspaceStash) {
            EXPECT_GT(p.workspace_bytes, 0);
          } else {
            EXPECT_EQ(p.workspace_bytes, 0);
          }
        }
  }
  EXPECT_EQ(plans, static_cast<int>(all_specs().size()) * 4 * 5 * 2);
}

// Mechanism 4: ONE reduction buffer, O(1) in the number of reductions.
TEST(Plan, ReductionBufferIsIndependentOfReductionCount) {
  FusionSpec one = chain(1), four = chain(4);
  ASSERT_EQ(one.reduction_count(), 1);
  ASSERT_EQ(four.reduction_count(), 4);
  for (int c : {2, 4, 8, 16}) {
    PlanOptions opt;
    opt.cluster_n = c;
    opt.tile_n = 128;
    opt.tile_m = 64;
    Plan p1 = make_plan(one, prob(4096, 8192, 4096), full_device(), {}, opt);
    Plan p4 = make_plan(four, prob(4096, 8192, 4096), full_device(), {}, opt);
    ASSERT_EQ(p1.kernel.tile_m, p4.kernel.tile_m);
    EXPECT_GT(p1.smem.reduction_buffer, 0);
    EXPECT_EQ(p1.smem.reduction_buffer, p4.smem.reduction_buffer) << "C_N=" << c;
  }
  // Unforced, same shape: whatever the planner picks, the buffer follows tile_m and C_N only.
  Plan a = make_plan(one, prob(256, 4096, 4096)), b = make_plan(four, prob(256, 4096, 4096));
  if (a.kernel.tile_m == b.kernel.tile_m && a.kernel.cluster_n == b.kernel.cluster_n) {
    EXPECT_EQ(a.smem.reduction_buffer, b.smem.reduction_buffer);
  }
}

TEST(Plan, AggregationSwitchesAtP2pMaxCluster) {
  FusionSpec s = layer_norm();
  for (int limit : {2, 4, 8}) {
    PlannerTunables tun;
    tun.p2p_max_cluster = limit;
    for (int c : {1, 2, 4, 8, 16}) {
      PlanOptions opt;
      opt.cluster_n = c;
      Plan p = make_plan(s, prob(4096, 16384, 4096), full_device(), tun, opt);  // C_N = 1: 64 N-tiles of 256
      EXPECT_EQ(p.kernel.cluster_n, c);
      EXPECT_EQ(p.kernel.aggregation, c <= limit ? Aggregation::PeerToPeer : Aggregation::LeaderFollower)
          << "C_N=" << c << " limit=" << limit;
    }
  }
}

TEST(Plan, ForcedOptionsAreHonored) {
  FusionSpec s = layer_norm();
  PlanOptions opt;
  opt.cluster_n = 16;
  opt.tile_n = 256;
  Plan p = make_plan(s, prob(8192, 4096, 4096), full_device(), {}, opt);
  EXPECT_EQ(p.kernel.cluster_n, 16);
  EXPECT_EQ(p.kernel.tile_n, 256);
  EXPECT_EQ(p.strategy(), RowStrategy::OnChip);
  EXPECT_EQ(p.ctas_busy, 112);  // measured residency of 16-CTA clusters

  opt = {};
  opt.cluster_n = 2;
  opt.aggregation = Aggregation::LeaderFollower;
  opt.strategy = RowStrategy::WorkspaceStash;
  p = make_plan(s, prob(8192, 8192, 4096), full_device(), {}, opt);
  EXPECT_EQ(p.kernel.cluster_n, 2);
  EXPECT_EQ(p.kernel.aggregation, Aggregation::LeaderFollower);
  EXPECT_EQ(p.strategy(), RowStrategy::WorkspaceStash);
  EXPECT_FALSE(p.stashed.empty());
  EXPECT_GT(p.workspace_bytes, 0);
  // A forced plan says what the model alone would have chosen.
  EXPECT_TRUE(std::any_of(p.reasons.begin(), p.reasons.end(),
                          [](const std::string& r) { return r.find("without the forced options") != std::string::npos; }));
}

TEST(Plan, StashKeepsStageOneBypassValues) {
  PlanOptions opt;
  opt.strategy = RowStrategy::SmemStash;
  Plan p = make_plan(layer_norm(), prob(8192, 4096, 4096), full_device(), {}, opt);
  EXPECT_EQ(p.strategy(), RowStrategy::SmemStash);
  EXPECT_GT(p.kernel.n_tiles, 1);
  ASSERT_FALSE(p.stashed.empty());
  EXPECT_TRUE(p.kernel.stash_elem_bytes == 2 || p.kernel.stash_elem_bytes == 4);
  EXPECT_EQ(p.smem.stash, 2 * (p.kernel.n_tiles - 1) * p.kernel.tile_m * p.kernel.tile_n *
                              static_cast<int>(p.stashed.size()) * p.kernel.stash_elem_bytes);
}

TEST(Plan, OccupancyVersusCoverage) {
  FusionSpec s = layer_norm();
  // Small M: few row blocks, latency bound: the cluster covers the row.
  Plan small = make_plan(s, prob(256, 4096, 4096));
  EXPECT_EQ(small.strategy(), RowStrategy::OnChip);
  // Large M, compute bound: 16-CTA clusters idle 20 SMs; the planner keeps every SM busy
  // (clusters of 2 along M sharing B, the row's CTAs in a row group).
  Plan large = make_plan(s, prob(8192, 4096, 4096), full_device());
  EXPECT_LT(large.kernel.cluster_n, 16);
  EXPECT_EQ(large.ctas_busy, 132);
  EXPECT_GE(large.grid_ctas, 128);
  // Long rows still plan, re-reading earlier tiles through L2.
  Plan wide = make_plan(s, prob(4096, 65536, 4096), full_device());
  EXPECT_EQ(wide.strategy(), RowStrategy::WorkspaceStash);
  // No reduction: no reason for a cluster.
  EXPECT_EQ(make_plan(bias_gelu(), prob(8192, 4096, 4096)).kernel.cluster_n, 1);
}

using test::expect_error;

TEST(Plan, RejectsImpossibleInput) {
  FusionSpec s = layer_norm(), g = bias_gelu();
  expect_error([&] { make_plan(s, prob(0, 4096, 4096)); }, "M = 0: a dimension must be at least 1");
  expect_error([&] { make_plan(s, prob(128, -1, 4096)); }, "N = -1: a dimension must be at least 1");
  expect_error([&] { make_plan(s, prob(128, 4096, 0)); }, "K = 0: a dimension must be at least 1");
  expect_error([&] { make_plan(s, prob(128, 4096, 100)); }, "K = 100");
  expect_error([&] { make_plan(s, prob(128, 4100, 64)); }, "N a multiple of 8");
  PlanOptions opt;
  opt.cluster_n = 3;
  expect_error([&] { make_plan(s, prob(128, 4096, 64), full_device(), {}, opt); }, "cluster_n = 3");
  opt = {};
  opt.tile_n = 100;
  expect_error([&] { make_plan(s, prob(128, 4096, 64), full_device(), {}, opt); }, "tile_n = 100");
  opt = {};
  opt.tile_m = 96;
  expect_error([&] { make_plan(s, prob(128, 4096, 64), full_device(), {}, opt); }, "tile_m = 96");
  opt = {};
  opt.strategy = RowStrategy::SmemStash;
  expect_error([&] { make_plan(g, prob(128, 4096, 64), full_device(), {}, opt); }, "no reduction");
  opt = {};
  opt.strategy = RowStrategy::OnChip;
  opt.cluster_n = 2;
  expect_error([&] { make_plan(s, prob(128, 8192, 64), full_device(), {}, opt); }, "nothing fits");
  // Rows so long that even 16 CTAs x 256 columns x 64 N-tiles per CTA cannot cover them.
  expect_error([&] { make_plan(s, prob(4096, int64_t{1} << 24, 4096), full_device()); }, "N-tiles per CTA");
  EXPECT_NO_THROW(make_plan(rms_norm(), prob(4096, 131072, 4096), full_device()));
  // A device without multi-N-tile rows refuses a row longer than one cluster covers, naming why.
  DeviceModel one_tile;
  one_tile.multi_tile_rows = false;
  expect_error([&] { make_plan(s, prob(4096, 8192, 4096), one_tile, {}); }, "do not walk several N-tiles");
  EXPECT_EQ(make_plan(s, prob(8192, 4096, 4096), one_tile, {}).strategy(), RowStrategy::OnChip);
  // Today's device: row groups of clusters along M, many row blocks or few.
  for (const Problem& pr : {prob(8192, 4096, 4096), prob(256, 4096, 4096), prob(64, 32768, 64)}) {
    const Plan rg = make_plan(s, pr);
    EXPECT_EQ(rg.kernel.aggregation, Aggregation::L2Exchange);
    EXPECT_EQ(rg.kernel.cluster_m, 2);
    EXPECT_GE(int64_t{rg.kernel.row_group} * rg.kernel.tile_n * rg.kernel.n_tiles, pr.n);
  }
  // Forcing a DSMEM option keeps the DSMEM search (clusters along N).
  PlanOptions p2p;
  p2p.aggregation = Aggregation::PeerToPeer;
  EXPECT_EQ(make_plan(s, prob(8192, 4096, 4096), full_device(), {}, p2p).kernel.row_group, 1);
  // Row-group options are checked and explained.
  PlanOptions bad;
  bad.row_group = 3;
  expect_error([&] { make_plan(s, prob(128, 4096, 64), full_device(), {}, bad); }, "row_group = 3");
  bad = {};
  bad.cluster_m = 4;
  expect_error([&] { make_plan(s, prob(128, 4096, 64), full_device(), {}, bad); }, "cluster_m = 4");
  bad = {};
  bad.stash_bytes = 8;
  expect_error([&] { make_plan(s, prob(128, 4096, 64), full_device(), {}, bad); }, "stash_bytes = 8");
  bad = {};
  bad.row_group = 2;
  expect_error([&] { make_plan(g, prob(128, 4096, 64), full_device(), {}, bad); }, "has none");
  bad.cluster_n = 2;
  expect_error([&] { make_plan(s, prob(128, 4096, 64), full_device(), {}, bad); }, "do not combine");
  bad = {};
  bad.row_group = 2;  // 2 x 256 x 64 tiles < 2^20 columns
  expect_error([&] { make_plan(s, prob(128, 1 << 20, 64), full_device(), {}, bad); }, "no row-group plan");
  // A device with too little SMEM for two stages.
  DeviceModel tiny;
  tiny.smem_per_cta_bytes = 32 * 1024;
  expect_error([&] { make_plan(s, prob(128, 4096, 64), tiny, {}); }, "pipeline stages");
}

TEST(Plan, ExplainShowsTheDecisions) {
  FusionSpec s = layer_norm();
  Plan p = make_plan(s, prob(8192, 4096, 4096));
  std::string e = explain(s, p);
  for (const char* needle : {"problem", "M=8192 N=4096 K=4096", "tiles", "grid", "cluster", "strategy",
                             "aggregation", "stage chain", "stage 1", "stage 2", "stage 3", "unified reduction buffer",
                             "mainloop ring", "total", "reasons", "mean("})
    EXPECT_NE(e.find(needle), std::string::npos) << needle << "\n" << e;
  EXPECT_NE(e.find(fmt::format("{}x{}", p.kernel.cluster_m, p.kernel.cluster_n)), std::string::npos);
  if (p.kernel.row_group > 1) {
    EXPECT_NE(e.find(fmt::format("row group    {} clusters share each row", p.kernel.row_group)), std::string::npos) << e;
  }
  EXPECT_NE(e.find(std::string(name_of(p.kernel.aggregation))), std::string::npos);
  EXPECT_EQ(explain(s, p), explain(s, make_plan(s, prob(8192, 4096, 4096))));  // deterministic
}

// Row groups: forced shapes are honored, the work division is exact, and the workspace of a
// multi-tile row is sized for the grid.
TEST(Plan, RowGroupsDivideTheWork) {
  FusionSpec s = layer_norm();
  for (int g : {1, 2, 4, 8, 16, 32})
    for (int cm : {1, 2}) {
      SCOPED_TRACE(fmt::format("G={} cluster_m={}", g, cm));
      PlanOptions opt;
      opt.row_group = g;
      opt.cluster_m = cm;
      opt.tile_m = 64;
      opt.tile_n = 256;
      const Plan p = make_plan(s, prob(8192, 4096, 4096), full_device(), {}, opt);
      EXPECT_EQ(p.kernel.row_group, g);
      EXPECT_EQ(p.kernel.cluster_m, cm);
      EXPECT_EQ(p.kernel.n_tiles, std::max(1, 16 / g));
      EXPECT_EQ(p.jobs, 128 / cm);
      const int64_t clusters = p.grid_ctas / cm;
      EXPECT_EQ(clusters % g, 0);
      EXPECT_LE(clusters, full_device().clusters_resident.at(cm));
      // Below 16 a stash: in the workspace, or in SMEM where a bf16 stash (its centers included) fits.
      if (g >= 16) EXPECT_EQ(p.strategy(), RowStrategy::OnChip);
      else if (p.strategy() == RowStrategy::SmemStash) EXPECT_EQ(p.kernel.stash_elem_bytes, 2);
      else EXPECT_EQ(p.strategy(), RowStrategy::WorkspaceStash);
      if (p.strategy() == RowStrategy::WorkspaceStash) {
        // bf16 about each tile's row centers (two floats a thread a slot) where the pair runs online.
        const int64_t slot = p.kernel.stash_centers ? 64 * 256 * 2 + 64 * 16 : 64 * 256 * 4;
        EXPECT_EQ(p.kernel.stash_centers, p.fused_pairs.mean_variance);
        EXPECT_EQ(p.workspace_bytes, p.grid_ctas * 2 * (p.kernel.n_tiles - 1) * slot);
      }
    }
}

// A long epilogue paces PingPong (each warp group runs mainloop + epilogue per job), and 64-row
// tiles, whose epilogues hold half the values a thread, win it among PingPong tiles; short
// epilogues keep hiding behind the mainloop, so LayerNorm keeps 128x128 (MEASURED, bench/NOTES.md:
// the chain 3.73x at 64x128 vs 4.51x at 128x128; LayerNorm 2048x2048x1024 1.59x at 128x128 vs
// 1.80x at 64x128). Cooperative 128x256, both warp groups' epilogues at once, beats both for the
// chain (2.40x against 64x128's 3.08x, H100, Stop 54): the PingPong comparison is made without it.
TEST(Plan, LongEpiloguesPaceThePingPong) {
  const FusionSpec chain = lowered([](Graph& g, Value acc) {
    Value p = g.softmax(acc);
    Value l = g.layer_norm(g.unary(UnaryOp::Silu, p * 1000.0), row(g, "gamma"), row(g, "beta"));
    return g.rms_norm(g.unary(UnaryOp::GeluErf, l), row(g, "gamma2"));
  });
  const Plan coop = make_plan(chain, prob(4096, 4096, 1024), full_device(), {}, {});
  EXPECT_EQ(coop.kernel.wgs_per_tile, 2);
  PlanOptions pingpong;  // PingPong's own best: clusters of 2 along M and 64-row tiles
  pingpong.cluster_m = 2, pingpong.row_group = 32;
  const Plan c = make_plan(chain, prob(4096, 4096, 1024), full_device(), {}, pingpong);
  ASSERT_EQ(c.kernel.aggregation, Aggregation::L2Exchange);
  EXPECT_EQ(c.kernel.wgs_per_tile, 1);
  EXPECT_EQ(c.kernel.tile_m, 64);
  EXPECT_EQ(c.kernel.tile_n, 128);
  EXPECT_GT(c.estimate.epilogue_us, c.estimate.mainloop_us) << "the epilogue sets the pace";
  EXPECT_LT(coop.estimate.total_us, c.estimate.total_us);
  const Plan l = make_plan(layer_norm(), prob(2048, 2048, 1024), full_device(), {}, pingpong);
  EXPECT_EQ(l.kernel.tile_m, 128);
  EXPECT_LT(l.estimate.epilogue_us, l.estimate.mainloop_us);
}

// One-wave row groups at M = 128 pair their two row blocks along M (B multicast, both CTAs
// holding rows) with K split in two, where single CTAs ran before: MEASURED on the H200
// (bench/sweeps/row_groups_pairs_m128.txt, row_groups_shared_b.txt). RMSNorm at M = 256 keeps
// 64x128 pairs unsplit (the shared-B rate on every tile moved it to a slower 64x256 split).
TEST(Plan, OneWaveRowGroupsPairRowBlocksAlongM) {
  struct Case {
    const char* name;
    FusionSpec s;
    int64_t k;
    double measured_us;
  };
  for (const Case& c : {Case{"layer_norm", layer_norm(), 4096, 18.6}, Case{"rms_norm", rms_norm(), 4096, 16.0},
                        Case{"softmax", softmax(), 4096, 18.2}, Case{"layer_norm", layer_norm(), 16384, 47.0}}) {
    SCOPED_TRACE(fmt::format("{} 128x4096x{}", c.name, c.k));
    const Plan p = make_plan(c.s, prob(128, 4096, c.k), full_device(), {}, {});
    EXPECT_EQ(p.kernel.tile_m, 64);
    EXPECT_EQ(p.kernel.tile_n, 128);
    EXPECT_EQ(p.kernel.cluster_m, 2);
    EXPECT_EQ(p.kernel.k_splits, 2);
    EXPECT_EQ(p.kernel.row_group, 32);
    EXPECT_NEAR(p.estimate.total_us, c.measured_us, 0.35 * c.measured_us);
  }
  const Plan rms256 = make_plan(rms_norm(), prob(256, 4096, 4096), full_device(), {}, {});
  EXPECT_EQ(rms256.kernel.tile_n, 128);
  EXPECT_EQ(rms256.kernel.cluster_m, 2);
  EXPECT_EQ(rms256.kernel.k_splits, 1);
}

// The DSMEM path forced (clusters along N, only A multicast) as measured on the H200
// (bench/NOTES.md Stop 27, `bench/sweeps/dsmem_vs_row_groups.txt`): the mainloop efficiency of
// clusters of 8 and 16 along N (calibration.h cluster_efficiency) keeps the estimates within
// 15% of the runs; with the guesses they were 1.3-1.6x short.
TEST(Plan, ForcedDsmemPlansPricedAsMeasured) {
  struct Case {
    FusionSpec s;
    int64_t m, n, k;
    int cluster_n;
    std::optional<int> tile_n;
    double measured_us;
  };
  const Case cases[] = {{layer_norm(), 8192, 4096, 4096, 8, {}, 627.3}, {layer_norm(), 8192, 4096, 4096, 16, {}, 694.3},
                        {layer_norm(), 256, 4096, 4096, 16, {}, 45.1}, {softmax(), 8192, 2048, 4096, 8, 256, 278.0}};
  for (const Case& c : cases) {
    SCOPED_TRACE(fmt::format("{}x{}x{} C_N {}", c.m, c.n, c.k, c.cluster_n));
    PlanOptions o;
    o.aggregation = Aggregation::PeerToPeer;
    o.cluster_n = c.cluster_n;
    o.tile_n = c.tile_n;
    const Plan p = make_plan(c.s, prob(c.m, c.n, c.k), full_device(), {}, o);
    EXPECT_EQ(p.kernel.cluster_n, c.cluster_n);
    EXPECT_NEAR(p.estimate.total_us, c.measured_us, 0.15 * c.measured_us);
  }
}

// Several waves of 64-row tiles read B's share from L2 twice as often a MAC as 128-row ones: the
// elementwise deciders' estimates price it (calibration.h row_tile_rate). Measured on the H100, a
// plain GEMM at 8192x4096x4096: 64x128 1.56x cuBLAS in pairs along M, 1.85x alone; 128x128
// 1.04-1.18x. One wave (B's stream from DRAM) keeps its price.
TEST(Plan, SixtyFourRowTilesPricedAtTheirL2Feed) {
  const auto est = [](int64_t m, int tile_m, int cluster_m) {
    PlanOptions o;
    o.tile_m = tile_m, o.tile_n = 128, o.cluster_m = cluster_m;
    return make_plan(bias_gelu(), prob(m, 4096, 4096), full_device(), {}, o).estimate.total_us;
  };
  const double rows128 = est(8192, 128, 2), pairs64 = est(8192, 64, 2), alone64 = est(8192, 64, 1);
  EXPECT_GT(pairs64, 1.35 * rows128);
  EXPECT_GT(alone64, 1.15 * pairs64);
  EXPECT_LT(alone64, 2.2 * rows128);
  PlannerTunables flat;  // no 64-row penalty anywhere: the one-wave plan must not move
  flat.row_group_mainloop_efficiency = {{64128, 1.0}, {128128, 1.0}};
  flat.row_group_no_multicast_efficiency = 1.0;
  PlanOptions o;
  o.tile_m = 64, o.tile_n = 128, o.cluster_m = 2;
  EXPECT_DOUBLE_EQ(make_plan(bias_gelu(), prob(256, 4096, 4096), full_device(), {}, o).estimate.total_us,
                   make_plan(bias_gelu(), prob(256, 4096, 4096), full_device(), flat, o).estimate.total_us);
}

// The planner plans for the GPU it is told (PlanOptions::gpu; the runtime tells it the one it runs
// on): on the H100, whose PingPong mainloops run behind cooperative 128x256 (calibration.cpp
// device_model has the measurements), the prefill norms at wide N and long K and a cast at 2048
// tiles of 128x128 take cooperative tiles; the H200's plans stay PingPong.
TEST(Plan, PlansForTheGpuItIsTold) {
  const FusionSpec cast = lowered([](Graph&, Value acc) { return acc; });
  PlanOptions h100, h200;
  h100.gpu = Gpu::H100, h200.gpu = Gpu::H200;
  struct Case {
    FusionSpec spec;
    Problem p;
  };
  for (const Case& c : {Case{layer_norm(), prob(4096, 8192, 4096)}, Case{rms_norm(), prob(4096, 8192, 4096)},
                        Case{softmax(), prob(4096, 8192, 4096)}, Case{residual_norm(false, DType::BF16, true), prob(8192, 4096, 12288)},
                        Case{cast, prob(8192, 4096, 4096)}, Case{cast, prob(8192, 4096, 12288)}}) {
    SCOPED_TRACE(fmt::format("{} at {}x{}x{}", c.spec.name, c.p.m, c.p.n, c.p.k));
    const Plan on_h100 = make_plan(c.spec, c.p, h100), on_h200 = make_plan(c.spec, c.p, h200);
    EXPECT_EQ(on_h100.gpu, Gpu::H100);
    EXPECT_EQ(on_h100.kernel.wgs_per_tile, 2);
    EXPECT_EQ(on_h100.kernel.tile_m, 128);
    EXPECT_EQ(on_h100.kernel.tile_n, 256);
    EXPECT_NE(explain(c.spec, on_h100).find("gpu          H100"), std::string::npos);
    EXPECT_EQ(on_h200.gpu, Gpu::H200);
    EXPECT_EQ(on_h200.kernel.wgs_per_tile, 1);  // PingPong, as measured on the H200
    // Unset is the H200.
    const Plan unset = make_plan(c.spec, c.p);
    EXPECT_EQ(unset.gpu, Gpu::H200);
    EXPECT_EQ(unset.kernel.tile_m, on_h200.kernel.tile_m);
    EXPECT_EQ(unset.kernel.tile_n, on_h200.kernel.tile_n);
  }
  // Where the H100's cooperative epilogue is not paid back (K = 4096 with a residual in and two
  // outputs: a tie measured, 457 against 459 us), and at decode rows, its plans stay PingPong.
  EXPECT_EQ(make_plan(residual_norm(false, DType::BF16, true), prob(8192, 4096, 4096), h100).kernel.wgs_per_tile, 1);
  EXPECT_EQ(make_plan(rms_norm(), prob(1, 4096, 4096), h100).kernel.wgs_per_tile, 1);
  // The chain of reductions on a cooperative tile begins in the epilogue (one job a CTA would
  // otherwise hold its vectors through the mainloop: ptxas spilled).
  const Plan chain1024 = make_plan(chain(5), prob(1024, 4096, 1024), h200);
  EXPECT_EQ(chain1024.kernel.wgs_per_tile, 2);
  EXPECT_FALSE(chain1024.kernel.begin_early);
  EXPECT_TRUE(make_plan(layer_norm(), prob(1024, 4096, 1024), h200).kernel.begin_early);
  // A cooperative tile's 4 ring stages cost nothing (they count as 8 of PingPong's).
  EXPECT_EQ(explain(layer_norm(), make_plan(layer_norm(), prob(4096, 8192, 4096), h100)).find("ring stages (as"),
            std::string::npos);
  EXPECT_LT(planned_dram_bytes_per_s(Gpu::H100), planned_dram_bytes_per_s(Gpu::H200));
  EXPECT_EQ(gpu_named("H100"), Gpu::H100);
  EXPECT_EQ(gpu_named("h200"), Gpu::H200);
  EXPECT_EQ(gpu_named("a100"), std::nullopt);
  EXPECT_EQ(name_of(Gpu::H100), "H100");
}

// One job a CTA (decode): the epilogue's vectors load before the mainloop (begin_early), off the
// critical path; never where a CTA walks several jobs (the other warp group's mainloop hides
// the begin there) or several N-tiles (later tiles begin after the first's body).
TEST(Plan, BeginEarlyWhereACtaRunsOneJob) {
  const FusionSpec s = rms_norm();
  EXPECT_TRUE(make_plan(s, prob(1, 2048, 4096), full_device(), {}, {}).kernel.begin_early);
  EXPECT_TRUE(make_plan(s, prob(16, 4096, 4096), full_device(), {}, {}).kernel.begin_early);
  const Plan big = make_plan(s, prob(8192, 4096, 4096), full_device(), {}, {});
  EXPECT_FALSE(big.kernel.begin_early);
  EXPECT_EQ(explain(s, big).find("begin        early"), std::string::npos);
  EXPECT_NE(explain(s, make_plan(s, prob(1, 2048, 4096), full_device(), {}, {})).find("begin        early"),
            std::string::npos);
  // The elementwise decider's measured configurations too: GPT-2's decode c_fc (one wave).
  EXPECT_TRUE(make_plan(bias_gelu(), prob(1, 4096, 1024), full_device(), {}, {}).kernel.begin_early);
  EXPECT_FALSE(make_plan(bias_gelu(), prob(8192, 4096, 1024), full_device(), {}, {}).kernel.begin_early);
  KernelConfig c;
  c.tile_m = 64, c.tile_n = 128, c.n_tiles = 2, c.begin_early = true;
  EXPECT_STREQ(check(c), "begin_early: one N-tile per job");
}

// A one-wave elementwise plan (decode) pays the launch and its CTAs' stream of B, as the row
// groups' one-wave model: GPT-2 medium's decode c_fc + bias + GELU (1 and 32 x 4096 x 1024, the
// measured configuration's 64 CTAs of 64 x 64) measured 6.5 and 5.8 us (`comfuse run`,
// bench/sweeps/one_wave_rule.txt). A long share of B per CTA (M = 128, K = 11008) is not priced
// at the short streams' measured rate.
TEST(Plan, OneWaveElementwisePaysItsLaunchAndStream) {
  const FusionSpec s = bias_gelu();
  for (int64_t m : {1, 32}) {
    const Plan p = make_plan(s, prob(m, 4096, 1024), full_device(), {}, {});
    EXPECT_NEAR(p.estimate.total_us, 6.2, 1.0) << "M=" << m;
  }
  const Plan wide = make_plan(s, prob(128, 4096, 11008), full_device(), {}, {});
  const double b_cta = 128.0 * 11008 * 2;  // a 64 x 128 tile's share of B over K
  EXPECT_LT(wide.estimate.mainloop_us, b_cta / PlannerTunables{}.sm_stream_bytes_per_s * 1e6);
}

// At M <= 256 an elementwise plan is bound by B's stream: it takes 64 x 64 tiles where 64 x 128
// ones would cover at most half the SMs (each CTA then streams half as much of B; 7-14% faster
// measured at 8 to 64 such tiles, 4-5% slower at 96 and 128), and with two or more row blocks of
// 64 it pairs them along M to share B (multicast: 128 x 16384 x 4096 52.1 -> 40.9 us, 256 x 4096 x
// 4096 24.4 -> 17.7 against pairs along N sharing A); one row block pairs along N (64 x 128) or
// runs alone (64 x 64), at K >= 3072 with K split (Plan.NarrowTilesSplitKAtMidK). Pairs take 64 x 192 tiles where 128 columns would leave a partial second
// round of clusters (128 x 11008 x 4096: 58 blocks of 192 in one round against 86 of 128 for 66
// clusters; the SwiGLU FFN of Llama-2-7B 99.5 -> 89.8 us, bench/NOTES.md Stop 33). The estimates
// follow the shared-B rate (bench/sweeps/one_wave_tiles.txt, one_wave_rule.txt,
// small_m_b_reuse.txt; bench/NOTES.md Stop 29).
TEST(Plan, SmallMElementwiseSpreadsAndSharesB) {
  const FusionSpec s = bias_gelu();
  struct Case {
    int64_t m, n, k;
    int tile_n, cluster_m, cluster_n, k_splits;
    double measured_us;  // `comfuse run` (two calls: their mean); 0: not measured with this plan
  };
  for (const Case& c :
       {Case{64, 3072, 1024, 64, 1, 1, 1, 5.3}, Case{64, 1024, 3072, 64, 1, 1, 4, 7.5},
        Case{1, 4096, 1024, 64, 1, 1, 1, 6.5}, Case{32, 4096, 1024, 64, 1, 1, 1, 5.8},
        Case{64, 16384, 4096, 128, 1, 2, 1, 0}, Case{128, 4096, 16384, 128, 2, 1, 2, 43.6},
        Case{256, 2048, 4096, 64, 2, 1, 1, 13.0}, Case{192, 4096, 4096, 128, 2, 1, 1, 22.5},
        Case{256, 4096, 4096, 128, 2, 1, 1, 17.7}, Case{128, 16384, 4096, 128, 2, 1, 1, 40.9},
        Case{128, 11008, 4096, 192, 2, 1, 1, 30.5}, Case{256, 5120, 4096, 192, 2, 1, 1, 0}}) {
    const Plan p = make_plan(s, prob(c.m, c.n, c.k), full_device(), {}, {});
    const std::string at = fmt::format("{}x{}x{}", c.m, c.n, c.k);
    EXPECT_EQ(p.kernel.tile_m, 64) << at;
    EXPECT_EQ(p.kernel.tile_n, c.tile_n) << at;
    EXPECT_EQ(p.kernel.cluster_m, c.cluster_m) << at;
    EXPECT_EQ(p.kernel.cluster_n, c.cluster_n) << at;
    EXPECT_EQ(p.kernel.k_splits, c.k_splits) << at;
    if (c.measured_us > 0) {
      EXPECT_NEAR(p.estimate.total_us, c.measured_us, 0.3 * c.measured_us) << at;
    }
  }
  // Two rounds of one row of clusters: the last, partial round's B stream bounds it (40.9 us
  // measured; the compute-bound waves alone priced it 34.9).
  EXPECT_NEAR(make_plan(s, prob(128, 16384, 4096), full_device(), {}, {}).estimate.total_us, 40.9, 0.1 * 40.9);
  // A forced cluster or tile keeps the unsplit measured path (the split row is the planner's own).
  PlanOptions forced;
  forced.cluster_m = 2, forced.tile_m = 64, forced.tile_n = 64;
  EXPECT_EQ(make_plan(s, prob(128, 4096, 16384), full_device(), {}, forced).kernel.k_splits, 1);
}

// A reduction-free epilogue takes forced clusters along M (B multicast) with forced PingPong
// tiles (e.g. to measure the row-group mainloop without its reductions); the combinations the
// kernel cannot build are refused by name.
TEST(Plan, ElementwiseClustersAlongMForced) {
  FusionSpec bg = bias_gelu();
  PlanOptions opt;
  opt.cluster_m = 2, opt.tile_m = 64, opt.tile_n = 256;
  const Plan p = make_plan(bg, prob(4096, 8192, 4096), full_device(), {}, opt);
  EXPECT_EQ(p.kernel.cluster_m, 2);
  EXPECT_EQ(p.kernel.cluster_n, 1);
  EXPECT_EQ(p.kernel.tile_m, 64);
  EXPECT_EQ(p.kernel.tile_n, 256);
  EXPECT_EQ(p.kernel.wgs_per_tile, 1);
  EXPECT_EQ(p.strategy(), RowStrategy::NoReduction);
  EXPECT_NE(explain(bg, p).find("forced: PingPong 64x256, clusters of 2 along M"), std::string::npos) << explain(bg, p);
  opt.cluster_n = 2;
  EXPECT_THROW(make_plan(bg, prob(4096, 8192, 4096), full_device(), {}, opt), Error);
  opt = {};
  opt.row_group = 2;
  EXPECT_THROW(make_plan(bg, prob(4096, 8192, 4096), full_device(), {}, opt), Error);
}

// Elementwise epilogues take cooperative 128x256 tiles where A's rows miss 128-byte lines (K not
// a multiple of 64: PingPong 128x128 measured ~1.5x cuBLAS there, at any epilogue length) and
// where a cast or a bias sits behind K >= 4096 at one to four waves; an activation at K = 1024
// or 4096 on aligned rows keeps PingPong 128x128, which hides it (calibration.cpp).
TEST(Plan, ElementwiseCooperativeWhereRowsMisalignOrTheEpilogueIsShort) {
  const FusionSpec cast = lowered([](Graph&, Value acc) { return acc; });
  const FusionSpec bias = lowered([](Graph& g, Value acc) { return acc + row(g, "bias"); });
  const FusionSpec bg = bias_gelu();
  const auto cooperative = [](const FusionSpec& s, Problem p) {
    const Plan plan = make_plan(s, p);
    return plan.kernel.wgs_per_tile == 2 && plan.kernel.tile_m == 128 && plan.kernel.tile_n == 256 &&
           plan.kernel.cluster_m == 2;
  };
  EXPECT_TRUE(cooperative(cast, prob(8192, 1024, 4096)));
  EXPECT_TRUE(cooperative(bias, prob(8192, 1024, 4096)));
  EXPECT_TRUE(cooperative(cast, prob(4096, 4096, 4096)));
  EXPECT_FALSE(cooperative(cast, prob(8192, 4096, 1024))) << "K = 1024: the exposed epilogue loses";
  EXPECT_FALSE(cooperative(bg, prob(8192, 1024, 4096))) << "an activation is not a short epilogue";
  EXPECT_FALSE(cooperative(cast, prob(2048, 2048, 4096))) << "under a wave of 128x256 tiles";
  EXPECT_TRUE(cooperative(bg, prob(8192, 4096, 4104))) << "rows off 128-byte lines";
  EXPECT_TRUE(cooperative(bg, prob(8192, 4096, 1000)));
  EXPECT_TRUE(cooperative(cast, prob(8000, 1496, 4104)));
  EXPECT_FALSE(cooperative(bg, prob(8192, 4096, 4160))) << "65 k-blocks on aligned rows";
  EXPECT_FALSE(cooperative(bg, prob(256, 4096, 4104))) << "M <= 256 keeps its stream-bound rows";
  const Plan p = make_plan(bg, prob(8192, 4096, 4104));
  EXPECT_NE(explain(bg, p).find("K = 4104 leaves A's rows"), std::string::npos) << explain(bg, p);
  const Plan q = make_plan(cast, prob(8192, 1024, 4096));
  EXPECT_NE(explain(cast, q).find("a short epilogue behind K = 4096"), std::string::npos) << explain(cast, q);
}

// Row reductions on rows off 128-byte lines: cooperative 128x256 tiles in row groups (its
// epilogue exposed, its mainloop the least slowed: calibration.h unaligned_rows_efficiency);
// on the H200's aligned rows at prefill PingPong, which hides the epilogue, and cooperative where
// the epilogue paces the job (medium shapes, the chain: the model's choice, measured on the H100,
// bench/NOTES.md Stop 54); a forced cooperative tile that needs several N-tiles a CTA walks them
// (each warp group stashing its 64 rows).
TEST(Plan, RowGroupsTakeCooperativeTilesWhereTheyPay) {
  for (const FusionSpec& s : {rms_norm(), layer_norm(), softmax(), residual_norm(false, DType::BF16, true)}) {
    const Plan off = make_plan(s, prob(8192, 4096, 4104));
    EXPECT_EQ(off.kernel.wgs_per_tile, 2);
    EXPECT_EQ(off.kernel.tile_m, 128);
    EXPECT_EQ(off.kernel.tile_n, 256);
    EXPECT_EQ(off.kernel.aggregation, Aggregation::L2Exchange);
    EXPECT_EQ(off.kernel.n_tiles, 1);
    EXPECT_EQ(off.kernel.ring_input_bytes, 0);
    EXPECT_NE(explain(s, off).find("row reduction over a row group (src/plan/decide_row_groups.cpp): cooperative 128x256"),
              std::string::npos)
        << explain(s, off);
    EXPECT_EQ(make_plan(s, prob(8192, 4096, 4096)).kernel.wgs_per_tile, 1);
  }
  const FusionSpec ln = layer_norm();
  EXPECT_EQ(make_plan(ln, prob(1024, 4096, 1000)).kernel.wgs_per_tile, 2);
  EXPECT_EQ(make_plan(ln, prob(1024, 4096, 1024)).kernel.wgs_per_tile, 2);
  EXPECT_EQ(make_plan(chain(5), prob(1024, 4096, 1024)).kernel.wgs_per_tile, 2);
  PlanOptions opt;
  opt.tile_m = 128, opt.tile_n = 256, opt.cluster_m = 2;
  const Plan forced = make_plan(ln, prob(8192, 4096, 4096), full_device(), {}, opt);
  EXPECT_EQ(forced.kernel.wgs_per_tile, 2);
  EXPECT_EQ(forced.kernel.row_group, 16);
  opt.row_group = 4;  // forced: a cooperative job of 2 N-tiles, each warp group stashing its 64 rows
  const Plan two = make_plan(ln, prob(1000, 1032, 1000), full_device(), {}, opt);
  EXPECT_EQ(two.kernel.wgs_per_tile, 2);
  EXPECT_EQ(two.kernel.n_tiles, 2);
}

// Three consumer warp groups (KernelConfig::consumer_wgs): forced only, on 64-row PingPong tiles of
// row groups and elementwise plans; each WG its own SMEM, exchange slot and named barriers, the
// registers split anew within the launch's pool; the model lets 2 epilogues run beside each
// mainloop, each stretched as measured (so it prices them above two consumers, as they ran).
// Refused with the reason where the kernel cannot carry them.
TEST(Plan, ThreeConsumerWarpGroupsWhereForced) {
  PlanOptions opt;
  opt.consumer_wgs = 3;
  const Plan three = make_plan(chain(5), prob(4096, 4096, 1024), full_device(), {}, opt);
  EXPECT_EQ(three.kernel.consumer_wgs, 3);
  EXPECT_EQ(three.kernel.tile_m, 64);
  EXPECT_EQ(three.kernel.threads(), 512);
  EXPECT_EQ(three.kernel.consumer_regs(), 160);
  EXPECT_LE(three.kernel.producer_regs() + 3 * three.kernel.consumer_regs(), 4 * three.kernel.launch_regs())
      << "setmaxnreg moves registers within what the launch gave the CTA";
  EXPECT_LE(three.kernel.smem_bytes(), Sm90::kSmemCapacity);
  EXPECT_EQ(three.smem.store_buffer % 3, 0) << "one epilogue storage a consumer WG";
  EXPECT_EQ(make_plan(chain(5), prob(4096, 4096, 1024)).kernel.consumer_wgs, 2) << "not proposed unforced";
  PlanOptions same_tiles = opt;  // the same 64x128 tiles with two: the epilogues beside one mainloop only
  same_tiles.consumer_wgs = 2, same_tiles.tile_m = 64, same_tiles.tile_n = 128;
  const Plan two = make_plan(chain(5), prob(4096, 4096, 1024), full_device(), {}, same_tiles);
  EXPECT_EQ(two.kernel.consumer_wgs, 2);
  EXPECT_GT(three.estimate.total_us, two.estimate.total_us)
      << "as measured: three epilogues at once each run ~1.7x as long (calibration.h three_consumer_epilogue_stretch)";
  EXPECT_NE(explain(chain(5), three).find("3 consumer warp groups"), std::string::npos) << explain(chain(5), three);
  KernelConfig four = three.kernel;
  four.consumer_wgs = 4;
  EXPECT_EQ(four.consumer_regs(), 112) << "what 5 x 96 launch registers leave: why 3 is the most";
  EXPECT_NE(check(four), nullptr);
  PlanOptions ew;  // an elementwise epilogue takes the forced PingPong path
  ew.consumer_wgs = 3;
  const Plan e = make_plan(bias_gelu(), prob(8192, 4096, 1024), full_device(), {}, ew);
  EXPECT_EQ(e.kernel.consumer_wgs, 3);
  EXPECT_EQ(e.kernel.tile_m, 64);
  // Refused where the kernel cannot carry them, in the planner's words.
  PlanOptions bad = opt;
  bad.tile_m = 128;
  expect_error([&] { make_plan(layer_norm(), prob(8192, 1024, 1024), full_device(), {}, bad); }, "hold 64-row tiles");
  bad = opt, bad.cluster_n = 4;
  expect_error([&] { make_plan(layer_norm(), prob(8192, 1024, 1024), full_device(), {}, bad); }, "not a DSMEM cluster");
  bad = opt, bad.k_splits = 2;
  expect_error([&] { make_plan(layer_norm(), prob(64, 1024, 4096), full_device(), {}, bad); }, "take no K-splits");
  bad = opt, bad.consumer_wgs = 4;
  expect_error([&] { make_plan(layer_norm(), prob(64, 1024, 4096), full_device(), {}, bad); }, "consumer_wgs = 4 is not in 2..3");
  KernelConfig k = three.kernel;
  k.tile_n = 256;
  EXPECT_NE(check(k), nullptr);
  k = three.kernel, k.cluster_n = 2, k.aggregation = Aggregation::PeerToPeer, k.row_group = 1;
  EXPECT_NE(check(k), nullptr);
}

// A look-alike that does not merge exactly is not a pair: exp(x - max) summed under a mean,
// or exp of the max minus x.
TEST(Plan, PairShapeIsExact) {
  FusionSpec mean_of_exp = lowered([](Graph& g, Value acc) {
    return acc / g.reduce(ReduceOp::Mean, g.unary(UnaryOp::Exp, acc - g.reduce(ReduceOp::Max, acc)));
  });
  EXPECT_EQ(mean_of_exp.pair_count(PairKind::MaxExpSum), 0);
  FusionSpec flipped = lowered([](Graph& g, Value acc) {
    return acc / g.reduce(ReduceOp::Sum, g.unary(UnaryOp::Exp, g.reduce(ReduceOp::Max, acc) - acc));
  });
  EXPECT_EQ(flipped.pair_count(PairKind::MaxExpSum), 0);
  FusionSpec manual = lowered([](Graph& g, Value acc) {
    return acc / g.reduce(ReduceOp::Sum, g.unary(UnaryOp::Exp, acc - g.reduce(ReduceOp::Max, acc)));
  });
  EXPECT_EQ(manual.pair_count(PairKind::MaxExpSum), 1);
  // Mean and variance: (x - mean)^2 as square or as d * d, averaged; not summed, not about the
  // mean of another value.
  auto variance_of = [](bool square, ReduceOp outer, bool other_mean) {
    return lowered([=](Graph& g, Value acc) {
      Value d = acc - g.reduce(ReduceOp::Mean, other_mean ? acc * 2.0 : acc);
      Value sq = square ? g.unary(UnaryOp::Square, d) : d * d;
      return d * g.unary(UnaryOp::Rsqrt, g.reduce(outer, sq) + 1e-5);
    });
  };
  EXPECT_EQ(variance_of(true, ReduceOp::Mean, false).pair_count(PairKind::MeanVariance), 1);
  EXPECT_EQ(variance_of(false, ReduceOp::Mean, false).pair_count(PairKind::MeanVariance), 1);
  EXPECT_EQ(variance_of(true, ReduceOp::Sum, false).pair_count(PairKind::MeanVariance), 0);
  EXPECT_EQ(variance_of(true, ReduceOp::Mean, true).pair_count(PairKind::MeanVariance), 0);
}

TEST(Plan, DotHasOneClusterPerStage) {
  for (const Named& sp : all_specs()) {
    SCOPED_TRACE(sp.name);
    Plan p = make_plan(sp.spec, prob(4096, 4096, 4096));
    std::string d = to_dot(sp.spec, p);
    EXPECT_EQ(d.rfind("digraph", 0), 0u);
    EXPECT_EQ(std::count(d.begin(), d.end(), '{'), std::count(d.begin(), d.end(), '}'));
    size_t clusters = 0;
    for (size_t at = d.find("subgraph cluster_"); at != std::string::npos; at = d.find("subgraph cluster_", at + 1))
      ++clusters;
    EXPECT_EQ(clusters, static_cast<size_t>(sp.spec.stage_count()));
    EXPECT_NE(d.find("->"), std::string::npos);
    EXPECT_NE(d.find("label="), std::string::npos);
    if (sp.spec.reduction_count() > 0) {
      EXPECT_NE(d.find("color=blue"), std::string::npos);  // reduction -> PostOp
    }
  }
  FusionSpec ln = layer_norm();
  EXPECT_NE(to_dot(ln, make_plan(ln, prob(256, 4096, 4096))).find("style=dashed, label=\"bypass\""), std::string::npos);
}

std::string plan_error(const FusionSpec& s, const Problem& p = {512, 1024, 64, DType::BF16}) {
  try {
    make_plan(s, p);
  } catch (const Error& e) {
    return e.what();
  }
  return "(planned)";
}

// What the device templates cannot express is refused before planning, naming the user's
// values (never %-names or spec node numbers) and what to do instead.
TEST(Plan, DeviceLimitsAreRefusedInTheUsersNames) {
  // A per-row value stored (the auto-named inner sum, which an op outside the kernel reads)
  // is a supported [M, 1] output, in f32 or 16 bits.
  EXPECT_EQ(plan_error(lowered([](Graph& g, Value acc) { return g.reduce(ReduceOp::Sum, g.reduce(ReduceOp::Sum, acc)); })),
            "(planned)");
  EXPECT_EQ(plan_error(lowered([](Graph& g, Value acc) { return g.reduce(ReduceOp::Max, acc); }, DType::F32)), "(planned)");
  // f32 and mixed operands.
  for (DType a : {DType::F32, DType::F16}) {
    Graph g;
    Value x = g.input("x", a, {Dim::of("M"), Dim::of("K")});
    Value w = g.input("w", DType::BF16, {Dim::of("N"), Dim::of("K")});
    g.output(g.matmul(x, w), "y", DType::BF16);
    const std::string e = plan_error(lower(g).regions.at(0).spec);
    EXPECT_NE(e.find(a == DType::F32 ? "plan: GEMM 'y' reads operand A 'x' in f32; the tensor cores take bf16 or f16"
                                     : "plan: GEMM 'y' reads A 'x' as f16 and B 'w' as bf16: both operands must be"),
              std::string::npos)
        << e;
  }
  // An operand computed outside the kernel in f32.
  Graph h;
  Value x = h.input("x", DType::BF16, {Dim::of("M"), Dim::of("K")});
  Value w = h.input("w", DType::BF16, {Dim::of("N"), Dim::of("K")});
  Value x2 = h.binary(BinaryOp::Mul, x, 2.0);
  h.rename(x2, "x2");
  h.output(h.matmul(x2, w), "y", DType::BF16);
  const std::string e = plan_error(lower(h).regions.at(0).spec);
  EXPECT_NE(e.find("reads operand A 'x2' (computed outside the kernel) in f32"), std::string::npos) << e;
  EXPECT_NE(e.find("cast(x2, bf16)"), std::string::npos) << e;
  // Two tile-shaped values across one reduction.
  const std::string two = plan_error(lowered([](Graph& g, Value acc) {
    Value ex = g.unary(UnaryOp::Exp, acc - g.reduce(ReduceOp::Max, acc));
    return ex / g.reduce(ReduceOp::Sum, ex) + acc;
  }));
  EXPECT_NE(two.find("2 tile-shaped values cross the reduction sum(exp(sub(..., ...))) feeding 'y': matmul(x, w) "
                     "feeding 'y'; exp(sub(matmul(x, w), max(...))) feeding 'y'; the device carries one"),
            std::string::npos)
      << two;
  // More row vectors than the kernel's argument slots.
  const std::string many = plan_error(lowered([](Graph& g, Value acc) {
    for (int i = 0; i < 9; ++i) acc = acc + row(g, "b" + std::to_string(i));
    return acc;
  }));
  EXPECT_NE(many.find("reads 9 row/column vectors ('b0'; 'b1'; 'b2'; 'b3'; 'b4'; 'b5'; 'b6'; 'b7'; 'b8'); the kernel "
                      "takes at most 8"),
            std::string::npos)
      << many;
  // TMA's 16-byte rows, in the graph's dims and names.
  Graph kn;
  Value p = kn.input("p", DType::BF16, {Dim::of("M"), Dim::of("S")});
  Value v = kn.input("v", DType::BF16, {Dim::of("S"), Dim::of("DV")});
  kn.output(kn.matmul(p, v, BLayout::KN), "o", DType::BF16);
  const FusionSpec kns = lower(kn).regions.at(0).spec;
  const std::string odd_n = plan_error(kns, {512, 60, 64, DType::BF16});
  EXPECT_NE(odd_n.find("N (DV) = 60 is not a multiple of 8: B 'v' is K x N"), std::string::npos) << odd_n;
  const std::string odd_k = plan_error(kns, {512, 64, 60, DType::BF16});
  EXPECT_NE(odd_k.find("K (S) = 60 is not a multiple of 8"), std::string::npos) << odd_k;
  // Epilogues past what the JIT compiles in bounded time (Sm90::kMaxReductions, kMaxStageNodes).
  auto chain_of = [&](int reductions) {
    return lowered([reductions](Graph& g, Value acc) {
      for (int i = 0; i < reductions; ++i) acc = acc - g.reduce(ReduceOp::Mean, acc);
      return acc;
    });
  };
  EXPECT_EQ(plan_error(chain_of(Sm90::kMaxReductions)), "(planned)");
  const std::string deep = plan_error(chain_of(Sm90::kMaxReductions + 1));
  EXPECT_NE(deep.find(fmt::format("holds {} row reductions; one kernel takes at most {}", Sm90::kMaxReductions + 1,
                                  Sm90::kMaxReductions)),
            std::string::npos)
      << deep;
  const std::string wide = plan_error(lowered([](Graph& g, Value acc) {
    for (int i = 0; i < Sm90::kMaxStageNodes; ++i) acc = g.binary(BinaryOp::Mul, acc, 1.001);
    return acc;
  }));
  EXPECT_NE(wide.find(fmt::format("one kernel's stage takes at most {}", Sm90::kMaxStageNodes)), std::string::npos)
      << wide;
}

// One size rule: dims in 1..2^31 - 256, at most 2^31 - 4096 tiles of 64 x 64 (the scheduler's
// look-ahead past the last job keeps its margin).
TEST(Plan, ProblemSizeRule) {
  EXPECT_NO_THROW(check_problem_size(kMaxDimSize, 64, kMaxDimSize));
  EXPECT_THROW(check_problem_size(kMaxDimSize + 1, 64, 64), Error);
  EXPECT_THROW(check_problem_size(64, 64, 0), Error);
  EXPECT_THROW(check_problem_size(64, -64, 64), Error);
  const int64_t side = 64 * 46340;  // 46340^2 < 2^31 - 4096 < 46341^2
  EXPECT_NO_THROW(check_problem_size(side, side, 64));
  // The limit exactly (4096 x 524287 tiles = 2^31 - 4096), and one row of tiles past it.
  EXPECT_NO_THROW(check_problem_size(64 * 4096, 64 * 524287, 64));
  EXPECT_THROW(check_problem_size(64 * 4096, 64 * 524287 + 1, 64), Error);
  try {
    check_problem_size(side + 64, side + 64, 64, "M", "N (D)");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "M x N (D) = 2965824 x 2965824 is 2147488281 tiles of 64 x 64; the kernel numbers tiles in 32-bit "
              "integers (at most 2147479552)");
  }
  EXPECT_EQ(plan_error(bias_gelu(), {int64_t{1} << 31, 4096, 4096, DType::BF16}),
            "plan: M = 2147483648 exceeds 2147483392 (2^31 - 256): the kernel holds M, N and K in 32-bit integers "
            "and rounds them up to whole tiles of up to 256");
}

// A 2-D cluster (forced only: cluster_m with cluster_n and a row reduction): B multicast along
// M beside A along N, the row reduced over DSMEM among the CTAs of one cluster row; the jobs
// are cluster_m row blocks. Without a reduction (no DSMEM channel to serve) it stays refused.
TEST(Plan, TwoDimensionalClusterForDsmemRows) {
  FusionSpec s = softmax();
  PlanOptions opt;
  opt.cluster_n = 8;
  opt.cluster_m = 2;
  opt.tile_n = 256;
  Plan p = make_plan(s, prob(8192, 2048, 4096), full_device(), {}, opt);
  EXPECT_EQ(p.kernel.cluster_m, 2);
  EXPECT_EQ(p.kernel.cluster_n, 8);
  EXPECT_EQ(p.kernel.row_group, 1);
  EXPECT_EQ(p.strategy(), RowStrategy::OnChip);
  EXPECT_TRUE(p.kernel.aggregation == Aggregation::PeerToPeer || p.kernel.aggregation == Aggregation::LeaderFollower);
  EXPECT_EQ(check(p.kernel), nullptr);
  EXPECT_EQ(p.ctas_busy, 112) << "clusters of 16: 7 resident";
  const LaunchGrid g = launch_grid(p.kernel, 8192, 2048, 7);
  EXPECT_EQ(g.error, nullptr);
  EXPECT_EQ(g.cluster_x, 2);
  EXPECT_EQ(g.cluster_y, 8);
  EXPECT_EQ(g.grid_x, 14);
  EXPECT_EQ(job_count(p.kernel, 8192, 2048), 8192 / 64 / 2) << "a job: two row blocks";
  EXPECT_NE(explain(s, p).find("cluster 2x8 (forced)"), std::string::npos);
  EXPECT_NE(explain(s, p).find("B multicast along M too"), std::string::npos);
  // Ragged M: a cluster's second row block past M still runs (its B slice feeds its column).
  EXPECT_EQ(make_plan(s, prob(8192 + 64, 2048, 4096), full_device(), {}, opt).kernel.cluster_m, 2);

  opt.cluster_m = 4;
  expect_error([&] { make_plan(s, prob(8192, 2048, 4096), full_device(), {}, opt); }, "cluster_m = 4");
  KernelConfig k = p.kernel;
  k.cluster_m = 4;
  EXPECT_NE(check(k), nullptr) << "a cluster of 32 CTAs";
  k = p.kernel;
  k.row_reduction = false;
  EXPECT_NE(check(k), nullptr) << "2-D without a row reduction over DSMEM";
  PlanOptions elementwise;
  elementwise.cluster_n = 2;
  elementwise.cluster_m = 2;
  expect_error([&] { make_plan(bias_gelu(), prob(8192, 2048, 4096), full_device(), {}, elementwise); }, "not both");
  // Only with cluster_n forced: cluster_m with a DSMEM aggregation alone is refused, not planned 2-D.
  PlanOptions no_cn;
  no_cn.cluster_m = 2;
  no_cn.aggregation = Aggregation::PeerToPeer;
  expect_error([&] { make_plan(s, prob(8192, 1024, 1024), full_device(), {}, no_cn); }, "takes cluster_n too");
  PlanOptions agg_only;
  agg_only.aggregation = Aggregation::PeerToPeer;
  EXPECT_EQ(make_plan(s, prob(8192, 1024, 1024), full_device(), {}, agg_only).kernel.cluster_m, 1);
}

// The L2 exchange's polls pause between tries only where every CTA is in its round at once (one
// job a CTA) and a row spans at least 16 CTAs (calibration.h poll_backoff_wanted): M = 256 and
// decode rows; not with several jobs a CTA (the rounds staggered over the jobs) nor below 16 peers.
TEST(Plan, PollsPauseWhereEveryCtaRoundsAtOnce) {
  for (const Gpu gpu : {Gpu::H100, Gpu::H200}) {
    DeviceModel dev = device_model(gpu);
    dev.multi_tile_rows = true;
    const auto plan = [&](const FusionSpec& s, int64_t m, int64_t n, int64_t k) {
      return make_plan(s, prob(m, n, k), dev);
    };
    for (const FusionSpec& s : {layer_norm(), softmax(), rms_norm()}) {
      const Plan small = plan(s, 256, 4096, 4096);
      EXPECT_GE(small.kernel.row_peers(), 16);
      EXPECT_TRUE(small.kernel.poll_backoff);
      EXPECT_TRUE(plan(s, 8, 4096, 4096).kernel.poll_backoff);
      const Plan large = plan(s, 8192, 4096, 4096);
      EXPECT_EQ(large.kernel.aggregation, Aggregation::L2Exchange);
      EXPECT_FALSE(large.kernel.poll_backoff);
    }
    const Plan few = plan(residual_norm(true, DType::BF16, true), 8192, 1024, 1024);
    EXPECT_LT(few.kernel.row_peers(), 16);
    EXPECT_FALSE(few.kernel.poll_backoff);
    EXPECT_FALSE(plan(bias_gelu(), 256, 4096, 4096).kernel.poll_backoff);  // no exchange
    // Forced either way where the rows meet in L2 (an A/B); no effect elsewhere.
    PlanOptions on, off;
    on.poll_backoff = true, off.poll_backoff = false;
    EXPECT_TRUE(make_plan(layer_norm(), prob(8192, 4096, 4096), dev, {}, on).kernel.poll_backoff);
    EXPECT_FALSE(make_plan(layer_norm(), prob(256, 4096, 4096), dev, {}, off).kernel.poll_backoff);
    EXPECT_FALSE(make_plan(bias_gelu(), prob(256, 4096, 4096), dev, {}, on).kernel.poll_backoff);
  }
}

// A forced option that changes nothing in a plan is said so among its reasons (not an error: one
// run's options reach every region of a graph).
TEST(Plan, ForcedOptionsThePlanDoesNotUseAreNamed) {
  PlanOptions idle;
  idle.poll_backoff = true, idle.split_gather_in_smem = false, idle.fuse_pairs = true, idle.keep_pair_exp = false;
  const Plan p = make_plan(bias_gelu(), prob(4096, 4096, 4096), full_device(), {}, idle);
  const std::string e = explain(bias_gelu(), p);
  EXPECT_NE(e.find("forced options this plan does not use: --poll-pause on (no row's CTAs meet in L2), "
                   "--split-k-gather registers (no split-K through L2), --pairs one-round (no pair of reductions "
                   "shares a round in this plan), --pair-exp again (no max-and-sum-of-exp pair in one round over one N-tile "
                   "keeps its exp)"),
            std::string::npos)
      << e;
  PlanOptions used;
  used.poll_backoff = true, used.fuse_pairs = true;
  const Plan ln = make_plan(layer_norm(), prob(8192, 4096, 4096), full_device(), {}, used);
  EXPECT_EQ(explain(layer_norm(), ln).find("forced options this plan does not use"), std::string::npos);
  // An aggregation or row group the plan does not take, in the CLI's words.
  PlanOptions none;
  none.aggregation = Aggregation::L2Exchange, none.row_group = 1;
  const Plan one = make_plan(layer_norm(), prob(256, 4096, 4096), full_device(), {}, none);
  EXPECT_NE(explain(layer_norm(), one).find("forced options this plan does not use: --aggregation l2 (the plan's: none, "
                                            "no reduction crosses a CTA)"),
            std::string::npos)
      << explain(layer_norm(), one);
  PlanOptions dsmem;
  dsmem.aggregation = Aggregation::PeerToPeer, dsmem.row_group = 4;
  const Plan cl = make_plan(layer_norm(), prob(256, 4096, 4096), full_device(), {}, dsmem);
  EXPECT_NE(explain(layer_norm(), cl).find("forced options this plan does not use: --row-group 4 (a row is one "
                                           "cluster, over DSMEM)"),
            std::string::npos)
      << explain(layer_norm(), cl);
}

}  // namespace
}  // namespace comfuse
