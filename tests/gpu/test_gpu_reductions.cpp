// GPU correctness of row reductions across CTAs: multi-stage epilogues whose reductions span
// the CTAs of a cluster (over DSMEM) or of a row group (through L2), against the fp64 graph
// executor. Skips, saying why, on a machine without an sm_90 GPU.
#include <fmt/format.h>

#include <functional>
#include <limits>
#include <optional>

#include "comfuse/lower.h"
#include "comfuse/text.h"
#include "gpu/gpu_support.h"

namespace comfuse {
namespace {

using gpu_test::expect_outputs_match;
using Case = gpu_test::GemmCase;
using GpuReduce = gpu_test::GpuTest;

// Runs on random inputs (vectors shifted by `offset`: mean >> std for LayerNorm), checks
// every output, and returns the plan so tests can assert what ran.
Plan expect_matches(const Graph& g, const Bindings& dims, const CompileOptions& opt = {}, double offset = 0.0) {
  DeviceRunReport rep = run_and_check(g, dims, /*seed=*/11, opt, /*timing_reps=*/0, offset);
  expect_outputs_match(rep);
  EXPECT_GT(rep.plan.reductions, 0);
  return rep.plan;
}

Bindings dims(int64_t m, int64_t n, int64_t k) { return {{"M", m}, {"N", n}, {"K", k}}; }

// A forced stash plan: row groups of g clusters of cm CTAs along M, tm x tn tiles, paired
// reductions in one round or two, the stash's element size.
// stash_bytes: 0 the planner's stash (bf16 about each tile's row centers where the root's pair runs
// online and the outputs are bf16, else fp32), 4 or 2 forced.
CompileOptions row_group_plan(int g, int cm, int tm, int tn, bool one_round, int stash_bytes) {
  CompileOptions opt;
  opt.plan.row_group = g;
  opt.plan.cluster_m = cm;
  opt.plan.tile_m = tm;
  opt.plan.tile_n = tn;
  opt.plan.fuse_pairs = one_round;
  if (stash_bytes != 0) opt.plan.stash_bytes = stash_bytes;
  return opt;
}

// The paper's running example: x = alpha * acc + bias, LayerNorm with gamma, beta; the
// bias is offset by 1000 so the row mean dwarfs the spread (catches E[x^2] - E[x]^2).
Graph layer_norm_graph() {
  Case c;
  Value x = c.acc * c.g.input("alpha", DType::F32, {}) + c.row("bias");
  c.g.output(c.g.layer_norm(x, c.row("gamma"), c.row("beta")), "y", DType::BF16);
  return std::move(c.g);
}

// softmax (bf16 out) or log-softmax (f32 out) of acc * scale, as output "p".
Graph softmax_graph(bool log, double scale) {
  Case c;
  Value logits = c.acc * scale;
  c.g.output(log ? c.g.log_softmax(logits) : c.g.softmax(logits), "p", log ? DType::F32 : DType::BF16);
  return std::move(c.g);
}

TEST_F(GpuReduce, LayerNormBothAggregationsRaggedLargeOffset) {
  for (Aggregation mode : {Aggregation::PeerToPeer, Aggregation::LeaderFollower}) {
    SCOPED_TRACE(std::string(name_of(mode)));
    CompileOptions opt;
    opt.plan.aggregation = mode;
    Plan p = expect_matches(layer_norm_graph(), dims(1000, 1032, 72), opt, /*offset=*/1000.0);
    EXPECT_EQ(p.kernel.aggregation, mode);
    EXPECT_GT(p.kernel.cluster_n, 1);
  }
}

TEST_F(GpuReduce, RmsNormFp16NarrowRow) {
  Case c(DType::F16);
  c.g.output(c.g.rms_norm(c.acc, c.row("gamma")), "y", DType::F16);
  expect_matches(c.g, dims(77, 64, 40));
}

TEST_F(GpuReduce, SoftmaxFullClusterOf16) {
  Case c;
  c.g.output(c.g.softmax(c.acc * 0.125), "p", DType::BF16);
  CompileOptions opt;
  opt.plan.cluster_n = 16;
  Plan p = expect_matches(c.g, dims(300, 4096, 128), opt);
  EXPECT_EQ(p.kernel.cluster_n, 16);
}

TEST_F(GpuReduce, LogSoftmaxAndL2Normalize) {
  Case a;
  a.g.output(a.g.log_softmax(a.acc), "logp", DType::F32);
  expect_matches(a.g, dims(520, 1000, 64));
  Case b;
  b.g.output(b.g.l2_normalize(b.acc), "unit", DType::BF16);
  expect_matches(b.g, dims(520, 1000, 64));
}

// amax-then-scale (a quantization prologue) followed by a chain of four dependent
// reductions: five reductions through ONE unified buffer, each stage's result feeding the next.
TEST_F(GpuReduce, AmaxScaleAndAChainOfFourReductions) {
  Case c;
  Value amax = c.g.reduce(ReduceOp::Max, c.g.unary(UnaryOp::Abs, c.acc));
  c.g.output(c.acc * (c.g.unary(UnaryOp::Reciprocal, amax) * 127.0), "q", DType::BF16);
  Value v = c.acc;
  const ReduceOp chain[] = {ReduceOp::Mean, ReduceOp::Max, ReduceOp::Sum, ReduceOp::Min};
  for (ReduceOp op : chain) v = v - c.g.reduce(op, v) * 0.5;
  c.g.output(v, "chain", DType::F32);
  Plan p = expect_matches(c.g, dims(333, 2000, 96));
  EXPECT_EQ(p.reductions, 5);
}

// Rows longer than one cluster covers: each CTA walks several N-tiles, earlier tiles' bypass
// value kept in an fp32 stash (SMEM when it fits, else an L2-resident global workspace).
TEST_F(GpuReduce, StashManyRowBlocksClustersOfTwoGlobalWorkspace) {
  CompileOptions opt;
  opt.plan.cluster_n = 2;
  opt.plan.strategy = RowStrategy::WorkspaceStash;
  Plan p = expect_matches(layer_norm_graph(), dims(1100, 4096, 128), opt, /*offset=*/1000.0);
  EXPECT_EQ(p.kernel.cluster_n, 2);
  EXPECT_EQ(p.kernel.n_tiles, 8);
  EXPECT_EQ(p.strategy(), RowStrategy::WorkspaceStash);
}

// Two jobs' tiles in turn on the tensor cores (KernelConfig::turn_lead, scheduler/turn_order.cuh)
// at leads 1 and 3: CTAs of two jobs (a pair), of one (consumer 0 alone) and of three (a pair and
// a job without a partner), ragged in M and N, the stash in the workspace; and the planner's own
// lead on the vocabulary rows' shape (two jobs a CTA, ragged M).
TEST_F(GpuReduce, TileTurnsOverTwoJobsAndAJobWithoutAPartner) {
  for (const int lead : {1, 3}) {
    for (const int64_t m : {5000, 12000}) {
      SCOPED_TRACE(fmt::format("lead {}, M = {}", lead, m));
      Case c;
      c.g.output(c.g.softmax(c.acc * 0.125), "p", DType::F32);
      CompileOptions opt;
      opt.plan.tile_m = 128, opt.plan.tile_n = 128, opt.plan.row_group = 4, opt.plan.turn_lead = lead;
      const Plan p = expect_matches(c.g, dims(m, 4000, 64), opt);
      EXPECT_EQ(p.kernel.n_tiles, 8);
      EXPECT_EQ(p.kernel.turn_lead, lead);
      EXPECT_TRUE(p.kernel.tile_turns());
    }
  }
  Case v;
  v.g.output(v.g.log_softmax(v.acc), "logp", DType::F32);
  CompileOptions square;
  square.plan.tile_m = 128, square.plan.tile_n = 128;
  const Plan q = expect_matches(v.g, dims(1000, 32768, 64), square);
  EXPECT_EQ(q.kernel.n_tiles, 8);
  EXPECT_EQ(q.kernel.turn_lead, 1);  // two jobs a CTA: the planner's lead
}

TEST_F(GpuReduce, StashInSharedMemoryBothModes) {
  for (Aggregation mode : {Aggregation::PeerToPeer, Aggregation::LeaderFollower}) {
    SCOPED_TRACE(std::string(name_of(mode)));
    Case c;
    c.g.output(c.g.softmax(c.acc), "p", DType::BF16);
    CompileOptions opt;
    opt.plan.cluster_n = 8;
    opt.plan.strategy = RowStrategy::SmemStash;
    opt.plan.aggregation = mode;
    opt.plan.stash_bytes = 2;  // bf16: fp32 for 2 tiles does not fit beside the ring (softmax: no cancellation)
    Plan p = expect_matches(c.g, dims(700, 4096, 64), opt);
    EXPECT_EQ(p.kernel.n_tiles, 2);
    EXPECT_EQ(p.strategy(), RowStrategy::SmemStash);
  }
}

// 2-D clusters (forced: cluster_m 2 with cluster_n): B multicast along M beside A along N, the
// row reduced over DSMEM among the CTAs of one cluster row (the channel's peers are cluster ranks
// rank_m + 2 rank_n). Both aggregations; on-chip (2 x 8), an SMEM stash (N = 520 over 4 CTAs of
// 128 columns) and a workspace stash (5 N-tiles per CTA); a ragged M whose last
// cluster's second row block lies past M (its B slice still feeds its column), ragged N; the
// large-offset LayerNorm and a softmax; clusters of 16 (2 x 8). Launched again after two timed
// launches.
TEST_F(GpuReduce, TwoDimensionalClusters) {
  struct V {
    Aggregation mode;
    int cluster_n, tile_n;
    std::optional<RowStrategy> strategy;
    Bindings d;
  };
  for (const V& v : {V{Aggregation::PeerToPeer, 4, 128, std::nullopt, dims(1000, 520, 72)},
                     V{Aggregation::LeaderFollower, 4, 128, std::nullopt, dims(1000, 520, 72)},
                     V{Aggregation::PeerToPeer, 8, 256, std::nullopt, dims(700, 2048, 128)},
                     V{Aggregation::PeerToPeer, 2, 128, RowStrategy::WorkspaceStash, dims(330, 1032, 64)},
                     V{Aggregation::LeaderFollower, 2, 128, RowStrategy::WorkspaceStash, dims(330, 1032, 64)}}) {
    SCOPED_TRACE(fmt::format("{} 2x{} tile_n {} M={} N={}", name_of(v.mode), v.cluster_n, v.tile_n, v.d.at("M"),
                             v.d.at("N")));
    CompileOptions opt;
    opt.plan.cluster_m = 2;
    opt.plan.cluster_n = v.cluster_n;
    opt.plan.tile_n = v.tile_n;
    opt.plan.aggregation = v.mode;
    opt.plan.strategy = v.strategy;
    const DeviceRunReport rep = run_and_check(layer_norm_graph(), v.d, /*seed=*/21, opt, /*timing_reps=*/2,
                                              /*offset=*/1000.0);
    expect_outputs_match(rep);
    EXPECT_FALSE(rep.outputs_after_timing.empty());
    EXPECT_EQ(rep.plan.kernel.cluster_m, 2);
    EXPECT_EQ(rep.plan.kernel.cluster_n, v.cluster_n);
    Case c;
    c.g.output(c.g.softmax(c.acc * 0.125), "p", DType::BF16);
    expect_outputs_match(run_and_check(c.g, v.d, /*seed=*/22, opt, /*timing_reps=*/0));
  }
}

TEST_F(GpuReduce, RowOf32768AndARaggedChainOverThreeTiles) {
  Case a;
  a.g.output(a.g.rms_norm(a.acc, a.row("gamma")), "y", DType::BF16);
  CompileOptions c16;
  c16.plan.cluster_n = 16;
  Plan p = expect_matches(a.g, dims(100, 32768, 64), c16);
  EXPECT_EQ(p.kernel.n_tiles, 8);
  Case b;
  Value v = b.acc;
  for (ReduceOp op : {ReduceOp::Mean, ReduceOp::Max, ReduceOp::Sum, ReduceOp::Min}) v = v - b.g.reduce(op, v) * 0.5;
  b.g.output(v, "chain", DType::F32);
  CompileOptions c2;
  c2.plan.cluster_n = 2;
  Plan q = expect_matches(b.g, dims(1100, 1480, 96), c2);
  EXPECT_EQ(q.kernel.n_tiles, 3);
}

// The stash matrix (several N-tiles per CTA over a DSMEM cluster): cluster sizes, both modes,
// fp32 and bf16, SMEM and workspace, LayerNorm with a large offset, softmax and a ragged chain
// of four reductions.
TEST_F(GpuReduce, StashMatrixClusterSizesModesTypesAndSpaces) {
  struct V {
    int cn, tn;
    Aggregation mode;
    RowStrategy where;
    int elem;
    int expect_tiles;
  };
  const V ln[] = {{2, 256, Aggregation::PeerToPeer, RowStrategy::WorkspaceStash, 2, 8},
                  {4, 256, Aggregation::LeaderFollower, RowStrategy::WorkspaceStash, 4, 4},
                  {8, 128, Aggregation::LeaderFollower, RowStrategy::SmemStash, 2, 4}};
  for (const V& v : ln) {
    SCOPED_TRACE(fmt::format("LayerNorm C_N={} tile_n={} {} {} {} B", v.cn, v.tn, name_of(v.mode), name_of(v.where),
                             v.elem));
    CompileOptions opt;
    opt.plan.cluster_n = v.cn, opt.plan.tile_n = v.tn, opt.plan.aggregation = v.mode;
    opt.plan.strategy = v.where, opt.plan.stash_bytes = v.elem;
    // An fp32 stash keeps h exactly: a large offset tests the two-pass variance. A bf16 stash
    // rounds h as an unfused bf16 h would (opt-in, never the planner's choice): with an offset
    // of 2048 its step (16) swamps the row's spread, so it runs without one.
    const double offset = v.elem == 4 ? 2048.0 : 0.0;
    const Plan p = expect_matches(layer_norm_graph(), dims(1000, 4096, 256), opt, offset);
    EXPECT_EQ(p.kernel.n_tiles, v.expect_tiles);
    EXPECT_EQ(p.strategy(), v.where);
    EXPECT_EQ(p.kernel.stash_elem_bytes, v.elem);
  }
  Case sm;
  sm.g.output(sm.g.softmax(sm.acc), "p", DType::BF16);
  CompileOptions so;
  so.plan.cluster_n = 4, so.plan.aggregation = Aggregation::LeaderFollower, so.plan.stash_bytes = 2;
  EXPECT_GT(expect_matches(sm.g, dims(700, 4096, 64), so).kernel.n_tiles, 1);
  Case ch;
  Value v = ch.acc + ch.row("bias");
  for (ReduceOp op : {ReduceOp::Max, ReduceOp::Mean, ReduceOp::Min, ReduceOp::Sum}) v = v - ch.g.reduce(op, v) * 0.25;
  ch.g.output(v, "chain", DType::BF16);
  CompileOptions co;
  co.plan.cluster_n = 4, co.plan.tile_n = 128, co.plan.aggregation = Aggregation::LeaderFollower;
  const Plan q = expect_matches(ch.g, dims(130, 1480, 64), co, /*offset=*/100.0);
  EXPECT_EQ(q.kernel.n_tiles, 3);
}

// Row groups (Aggregation::L2Exchange): the CTAs that share a row are clusters of the
// persistent grid (clusters along M multicast B) and exchange partials through L2.
Plan expect_row_group(const Graph& g, const Bindings& d, int row_group, int cluster_m, std::optional<int> tile_m = {},
                      double offset = 0.0, std::optional<int> stash_bytes = {}) {
  CompileOptions opt;
  opt.plan.row_group = row_group;
  opt.plan.cluster_m = cluster_m;
  opt.plan.tile_m = tile_m;
  opt.plan.stash_bytes = stash_bytes;
  Plan p = expect_matches(g, d, opt, offset);
  EXPECT_EQ(p.kernel.row_group, row_group);
  EXPECT_EQ(p.kernel.cluster_m, cluster_m);
  EXPECT_EQ(p.kernel.aggregation, row_group > 1 ? Aggregation::L2Exchange : Aggregation::None);
  return p;
}

TEST_F(GpuReduce, RowGroupsLayerNormLargeOffsetEveryShape) {
  // Ragged M and N, several N-tiles per CTA (global stash), with and without B multicast,
  // 64- and 128-row warp groups, one CTA covering the whole row (G = 1).
  struct V { int g, cm; std::optional<int> tm; };
  for (V v : {V{2, 2, {}}, V{4, 1, {}}, V{8, 2, 128}, V{16, 2, {}}, V{1, 2, {}}}) {
    SCOPED_TRACE(fmt::format("row group {} cluster_m {}", v.g, v.cm));
    Plan p = expect_row_group(layer_norm_graph(), dims(1000, 1032, 72), v.g, v.cm, v.tm, /*offset=*/1000.0);
    if (v.g <= 4) {
      EXPECT_GT(p.kernel.n_tiles, 1);
    }
  }
}

// LayerNorm with one N-tile per CTA: the mean and the variance share ONE exchange round
// (sum and M2 about each CTA's own mean, Chan's merge). A 1000 offset makes E[x^2] - E[x]^2
// useless, so only a sound merge passes. Ragged N leaves the last CTAs of a row partial/empty.
TEST_F(GpuReduce, RowGroupsLayerNormMeanAndVarianceInOneRound) {
  struct V { int g, cm, tm, tn; int64_t n; };
  for (V v : {V{8, 2, 64, 256, 1032}, V{16, 1, 64, 128, 1032}, V{4, 2, 128, 128, 392}, V{1, 2, 64, 256, 200}}) {
    SCOPED_TRACE(fmt::format("G={} cluster_m={} {}x{} N={}", v.g, v.cm, v.tm, v.tn, v.n));
    CompileOptions opt;
    opt.plan.row_group = v.g;
    opt.plan.cluster_m = v.cm;
    opt.plan.tile_m = v.tm;
    opt.plan.tile_n = v.tn;
    opt.plan.fuse_pairs = true;  // forced: the planner alone keeps two rounds where a row has one CTA (G = 1)
    const Graph g = layer_norm_graph();
    Plan p = expect_matches(g, dims(1000, v.n, 72), opt, /*offset=*/1000.0);
    EXPECT_EQ(p.kernel.n_tiles, 1);
    const LoweringResult r = lower(g);
    EXPECT_NE(emit(r.regions.at(0).spec, p).source.find(", 2>>, 1>"), std::string::npos) << "pair not fused";
  }
}

// Softmax and log-softmax with one N-tile per CTA: the max and the sum of exp share ONE
// exchange round (each CTA's max and sum of exp about it, the online-softmax merge). Logits
// scaled up to a spread of ~10 make exp(max_j - max) span many orders across a row's CTAs;
// ragged N leaves the last CTAs of a row partial or empty (max -inf, sum 0). Softmax's pair
// both ways: its exp made again after the round, and kept in the registers (kPairGivenKept: one
// exp a value, the default); log-softmax's cannot keep it.
TEST_F(GpuReduce, RowGroupsSoftmaxMaxAndExpSumInOneRound) {
  struct V { int g, cm, tm, tn; int64_t n; double scale; };
  for (V v : {V{8, 2, 64, 256, 1032, 0.125}, V{16, 1, 64, 128, 1032, 4.0}, V{4, 2, 128, 128, 392, 1.0},
              V{1, 2, 64, 256, 200, 4.0}}) {
    for (int variant = 0; variant < 3; ++variant) {
      const bool log = variant == 2, keep = variant == 1;
      SCOPED_TRACE(fmt::format("{}{} G={} cluster_m={} {}x{} N={} scale {}", log ? "log-softmax" : "softmax",
                               keep ? " (exp kept)" : "", v.g, v.cm, v.tm, v.tn, v.n, v.scale));
      CompileOptions opt;
      opt.plan.keep_pair_exp = keep;
      opt.plan.row_group = v.g;
      opt.plan.cluster_m = v.cm;
      opt.plan.tile_m = v.tm;
      opt.plan.tile_n = v.tn;
      opt.plan.fuse_pairs = true;  // where the row group is one CTA, the planner alone keeps two rounds
      const Graph g = softmax_graph(log, v.scale);
      Plan p = expect_matches(g, dims(1000, v.n, 72), opt);
      EXPECT_EQ(p.kernel.n_tiles, 1);
      EXPECT_TRUE(p.fused_pairs.max_exp_sum);
      const LoweringResult r = lower(g);
      EXPECT_EQ(p.fused_pairs.kept_exp, keep);
      EXPECT_NE(emit(r.regions.at(0).spec, p).source.find(keep ? ", 4>>, 3>" : ", 2>>, 3>"), std::string::npos)
          << "pair not fused, or its exp kept where not asked";
    }
  }
}

// The max-and-sum-of-exp pair in one round over several N-tiles a CTA (the planner's choice in
// row groups of up to 32): each thread's sum of exp online across its tiles (the max moving from tile
// to tile: sharp logits), the pair's second stage streaming the stash with the stage after it,
// last tile first (stage.cuh kFusedStream). Workspace and SMEM stashes (bf16 too: the sum is
// made of the values as stashed, so it normalizes what the later stages read back), a row of one
// CTA (no exchange), a causal mask (rows whose tiles in a CTA are all -inf), ragged M and N (a
// last tile of 8 columns), and softmax into a LayerNorm (the stage after the sum ends in a
// reduction: the stages stream one after the other, the LayerNorm's from tile 0), and the
// vocabulary rows' default shape class (64x256 tiles in row groups of 32, whose last row block of
// 26 rows hands its pair rounds over between warps: KernelConfig::pair_hand_over).
TEST_F(GpuReduce, RowGroupsSoftmaxPairOverSeveralNTiles) {
  struct V {
    const char* what;
    int g, cm, tm, tn;
    int64_t m, n, k;
    double scale;
    bool causal = false, then_layer_norm = false;
    int stash_bytes = 0;
  };
  for (const V& v : {V{"fp32 workspace stash, 9 N-tiles", 8, 2, 128, 128, 200, 8200, 264, 4.0, false, false, 4},
                     V{"4 N-tiles", 4, 1, 64, 128, 1000, 2000, 72, 0.125},
                     V{"4 N-tiles, bf16 SMEM stash", 4, 1, 64, 128, 1000, 2000, 72, 0.125, false, false, 2},
                     V{"one CTA a row, 8 N-tiles", 1, 1, 64, 128, 300, 1000, 64, 4.0},
                     V{"causal", 8, 2, 128, 128, 1000, 4104, 64, 1.0, true},
                     V{"into a LayerNorm", 4, 1, 64, 128, 500, 1032, 72, 1.0, false, true},
                     V{"row groups of 32, 64x256, 4 N-tiles", 32, 2, 64, 256, 1050, 32760, 136, 4.0},
                     V{"cooperative 128x256, 4 N-tiles a job", 4, 2, 128, 256, 300, 4000, 136, 4.0}}) {
    for (bool log : {false, true}) {
      if (log && (v.causal || v.then_layer_norm)) continue;
      SCOPED_TRACE(fmt::format("{} {}: G={} cluster_m={} {}x{} M={} N={} K={} scale {}", log ? "log-softmax" : "softmax",
                               v.what, v.g, v.cm, v.tm, v.tn, v.m, v.n, v.k, v.scale));
      const CompileOptions opt = row_group_plan(v.g, v.cm, v.tm, v.tn, /*one_round=*/true, v.stash_bytes);
      Case c;
      Value logits = c.acc * v.scale;
      if (v.causal) logits = c.g.causal_mask(logits);
      Value y = log ? c.g.log_softmax(logits) : c.g.softmax(logits);
      if (v.then_layer_norm) y = c.g.layer_norm(y * 100.0, c.row("gamma"), c.row("beta"));
      c.g.output(y, "p", log ? DType::F32 : DType::BF16);
      Plan p = expect_matches(c.g, dims(v.m, v.n, v.k), opt);
      EXPECT_GT(p.kernel.n_tiles, 1);
      EXPECT_TRUE(p.fused_pairs.max_exp_sum);
    }
  }
}

// LayerNorm's mean and variance in one round over several N-tiles a CTA (each tile's squares about
// its own mean merged online by Chan's formula, then across the row's CTAs with each one's column
// count), and in two rounds: a short last tile, CTAs whose last tiles lie past N, a row a CTA,
// 64- and 128-row warp groups, row groups of 4 to 32, fp32 and bf16 stash in the workspace and in
// SMEM (in one round bf16 about each tile's running mean, the planner's stash with bf16 outputs),
// fp16 with a residual (fp32: its outputs are not bf16). Under a 1000 offset (mean >> spread) but
// for the bf16 stash in two rounds (it rounds x before x - mean, to 4 at 1000), the row statistics
// stored as f32 and checked at f32's tolerance (a wrong count or merge moves them far more than
// y's bf16 tolerance would show).
TEST_F(GpuReduce, RowGroupsLayerNormPairOverSeveralNTiles) {
  struct V {
    const char* what;
    int g, cm, tm, tn;
    int64_t m, n, k;
    int stash_bytes = 0;
    DType t = DType::BF16;
    bool residual = false;
  };
  for (const V& v : {V{"9 N-tiles, a short last one, fp32 workspace stash", 8, 2, 128, 128, 200, 8200, 264, 4},
                     V{"4 N-tiles", 4, 1, 64, 128, 1000, 2000, 72},
                     V{"tiles past N", 4, 1, 64, 128, 500, 1032, 72},
                     V{"bf16 SMEM stash", 4, 1, 64, 128, 1000, 2000, 72, 2},
                     V{"one CTA a row, 8 N-tiles", 1, 1, 64, 128, 300, 1000, 64},
                     V{"row groups of 32, 128x128", 32, 2, 128, 128, 264, 32760, 136},
                     V{"row groups of 16, 128x128, f16, a residual", 16, 2, 128, 128, 300, 8152, 128, 0, DType::F16, true},
                     V{"cooperative 128x256, 2 N-tiles a job, a residual from L2 (several jobs a CTA)", 4, 2, 128, 256, 4400, 2000, 136, 0,
                       DType::BF16, true}}) {
    for (bool one_round : {true, false}) {
      SCOPED_TRACE(fmt::format("{} ({} round(s)): G={} cluster_m={} {}x{} M={} N={} K={}", v.what, one_round ? 1 : 2, v.g,
                               v.cm, v.tm, v.tn, v.m, v.n, v.k));
      const CompileOptions opt = row_group_plan(v.g, v.cm, v.tm, v.tn, one_round, v.stash_bytes);
      Case c(v.t);
      Value h = c.acc + c.g.input("bias", v.t, {Dim::of("N")});
      if (v.residual) h = h + c.g.input("residual", v.t, {Dim::of("M"), Dim::of("N")});
      Value mu = c.g.reduce(ReduceOp::Mean, h);
      Value d = h - mu;
      Value rstd = c.g.unary(UnaryOp::Rsqrt, c.g.reduce(ReduceOp::Mean, d * d) + 1e-5);
      c.g.output(d * rstd * c.g.input("gamma", v.t, {Dim::of("N")}) + c.g.input("beta", v.t, {Dim::of("N")}), "y", v.t);
      c.g.output(mu, "mu", DType::F32);
      c.g.output(rstd, "rstd", DType::F32);
      const bool rounds_x = v.stash_bytes == 2 && !one_round;  // bf16 without centers
      Plan p = expect_matches(c.g, dims(v.m, v.n, v.k), opt, /*offset=*/rounds_x ? 0.0 : 1000.0);
      EXPECT_GT(p.kernel.n_tiles, 1);
      EXPECT_EQ(p.fused_pairs.mean_variance, one_round);
      EXPECT_EQ(p.kernel.stash_centers, one_round && v.stash_bytes != 4 && v.t == DType::BF16);
      EXPECT_EQ(p.kernel.stash_elem_bytes, p.kernel.stash_centers || v.stash_bytes == 2 ? 2 : 4);
    }
  }
}

// Row groups on cooperative 128x256 tiles (both consumer warp groups on one tile, 64 rows each,
// each exchanging its rows with the same warp group of the row's other CTAs): LayerNorm with
// its mean and variance in one round under a 1000 offset, softmax's pair, and the residual
// RMSNorm storing h, on ragged M and N with K off 128-byte rows (where the planner takes these
// tiles on the H200) and on aligned rows (where it takes them on the H100: calibration.cpp
// device_model); in fp16 too.
TEST_F(GpuReduce, RowGroupsOnCooperativeTiles) {
  for (DType t : {DType::BF16, DType::F16}) {
    for (int g : {8, 16}) {  // one N-tile a CTA (check(): a cooperative job is one tile)
      SCOPED_TRACE(fmt::format("{} row group {}", t == DType::BF16 ? "bf16" : "f16", g));
      CompileOptions opt;
      opt.plan.row_group = g;
      opt.plan.cluster_m = 2;
      opt.plan.tile_m = 128;
      opt.plan.tile_n = 256;
      Case n(t);
      Value x = n.acc + n.g.input("bias", t, {Dim::of("N")});
      n.g.output(n.g.layer_norm(x, n.g.input("gamma", t, {Dim::of("N")}), n.g.input("beta", t, {Dim::of("N")})), "y", t);
      Plan p = expect_matches(n.g, dims(1000, 1032, 1000), opt, /*offset=*/1000.0);
      EXPECT_EQ(p.kernel.wgs_per_tile, 2);
      EXPECT_EQ(p.kernel.aggregation, Aggregation::L2Exchange);
      Case c(t);
      c.g.output(c.g.softmax(c.acc * 4.0), "p", t);
      expect_matches(c.g, dims(1000, 1032, 1000), opt);
      Case r(t);
      Value h = r.acc + r.g.input("residual", t, {Dim::of("M"), Dim::of("N")});
      r.g.output(h, "h", t);
      r.g.output(r.g.rms_norm(h, r.g.input("gamma", t, {Dim::of("N")})), "y", t);
      expect_matches(r.g, dims(1000, 1032, 1000), opt);
      expect_matches(r.g, dims(1000, 1032, 1024), opt);
      EXPECT_EQ(expect_matches(n.g, dims(1000, 1032, 1024), opt, /*offset=*/1000.0).kernel.wgs_per_tile, 2);
    }
  }
  Case a;  // the planner's own choice where A's rows miss 128-byte lines
  a.g.output(a.g.rms_norm(a.acc, a.row("gamma")), "y", DType::BF16);
  Plan p = expect_matches(a.g, dims(2000, 4096, 1000));
  EXPECT_EQ(p.kernel.wgs_per_tile, 2);
}

// Three consumer warp groups (KernelConfig::consumer_wgs, forced): each takes every 3rd job of its
// CTA, so M gives each CTA more jobs than warp groups (the turn wraps round); LayerNorm over an
// offset, softmax, residual LayerNorm storing h (its residual through the ring and from L2), and
// bias + GELU (the elementwise path); ragged M, N and K, bf16 and f16; relaunched (the exchange's
// launch counter counts every warp group out).
CompileOptions three_consumers() {
  CompileOptions opt;
  opt.plan.consumer_wgs = 3;
  return opt;
}
TEST_F(GpuReduce, ThreeConsumerWarpGroupsLayerNorm) {
  for (DType t : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(t == DType::BF16 ? "bf16" : "f16");
    Case n(t);
    Value x = n.acc + n.g.input("bias", t, {Dim::of("N")});
    n.g.output(n.g.layer_norm(x, n.g.input("gamma", t, {Dim::of("N")}), n.g.input("beta", t, {Dim::of("N")})), "y", t);
    Plan p = expect_matches(n.g, dims(4000, 1032, 200), three_consumers(), /*offset=*/1000.0);
    EXPECT_EQ(p.kernel.consumer_wgs, 3);
    EXPECT_EQ(p.kernel.aggregation, Aggregation::L2Exchange);
    EXPECT_GT(p.jobs, int64_t{p.clusters_resident} / p.kernel.row_group * 3) << "every warp group takes jobs";
  }
}
TEST_F(GpuReduce, ThreeConsumerWarpGroupsSoftmax) {
  for (DType t : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(t == DType::BF16 ? "bf16" : "f16");
    Case c(t);
    c.g.output(c.g.softmax(c.acc * 4.0), "p", t);
    EXPECT_EQ(expect_matches(c.g, dims(3001, 1000, 256), three_consumers()).kernel.consumer_wgs, 3);
  }
}
TEST_F(GpuReduce, ThreeConsumerWarpGroupsResidualLayerNorm) {
  for (DType t : {DType::BF16, DType::F16})
    for (bool ring : {true, false}) {
      SCOPED_TRACE(fmt::format("{}, the residual {}", t == DType::BF16 ? "bf16" : "f16", ring ? "through the ring" : "from L2"));
      Case r(t);
      Value h = r.acc + r.g.input("bias", t, {Dim::of("N")}) + r.g.input("residual", t, {Dim::of("M"), Dim::of("N")});
      r.g.output(h, "h", t);
      r.g.output(r.g.layer_norm(h, r.g.input("gamma", t, {Dim::of("N")}), r.g.input("beta", t, {Dim::of("N")})), "y", t);
      CompileOptions ro = three_consumers();
      ro.plan.ring_inputs = ring;
      const DeviceRunReport rep = run_and_check(r.g, dims(4000, 1024, 520), /*seed=*/11, ro, /*timing_reps=*/3);
      expect_outputs_match(rep);
      EXPECT_EQ(rep.plan.kernel.consumer_wgs, 3);
      EXPECT_EQ(rep.plan.kernel.ring_input_bytes > 0, ring);
    }
}
TEST_F(GpuReduce, ThreeConsumerWarpGroupsElementwise) {
  for (DType t : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(t == DType::BF16 ? "bf16" : "f16");
    Case e(t);
    e.g.output(e.g.unary(UnaryOp::GeluTanh, e.acc + e.g.input("bias", t, {Dim::of("N")})), "y", t);
    const DeviceRunReport rep = run_and_check(e.g, dims(3000, 2056, 264), /*seed=*/11, three_consumers(), /*timing_reps=*/2);
    expect_outputs_match(rep);
    EXPECT_EQ(rep.plan.kernel.consumer_wgs, 3);
  }
}

TEST_F(GpuReduce, RowGroupsPlannerDefaultsSoftmaxAndRmsNorm) {
  // What the planner picks by itself: 16-32 clusters per row at M = 300 (one tile per CTA),
  // 64 clusters per row at N = 32768 (two tiles per CTA).
  Case a;
  a.g.output(a.g.softmax(a.acc * 0.125), "p", DType::BF16);
  Plan p = expect_matches(a.g, dims(300, 4096, 256));
  EXPECT_EQ(p.kernel.aggregation, Aggregation::L2Exchange);
  EXPECT_GE(p.kernel.row_group, 16);
  Case b;
  b.g.output(b.g.rms_norm(b.acc, b.row("gamma")), "y", DType::BF16);
  Plan q = expect_matches(b.g, dims(100, 32768, 64));
  EXPECT_EQ(q.kernel.aggregation, Aggregation::L2Exchange);
  EXPECT_GT(q.kernel.row_group * q.kernel.tile_n * q.kernel.n_tiles, 32768 - 1);
}

// The causal mask before a softmax (attention scores at one GEMM): -inf where the column lies
// past the row, so the CTAs whose columns all lie past a row hold no finite value of it (max
// -inf, sum 0). Every way a row's CTAs meet: the planner's choice, a row group in one round,
// DSMEM clusters (both modes), stashes in SMEM and in the workspace (the mask of earlier N-tiles
// stashed); M < N, M > N, ragged, bf16 and f16.
TEST_F(GpuReduce, CausalSoftmaxEveryRowStrategy) {
  struct V {
    const char* what;
    DType dt;
    int64_t m, n, k;
    std::function<void(PlanOptions&)> force;
  };
  const V cases[] = {
      {"planner", DType::BF16, 1000, 1032, 72, [](PlanOptions&) {}},
      {"planner f16, M < N", DType::F16, 333, 4096, 64, [](PlanOptions&) {}},
      {"row group of 8, one round, the exp made again", DType::BF16, 1000, 1032, 72,
       [](PlanOptions& o) {
         o.row_group = 8, o.cluster_m = 2, o.tile_m = 64, o.tile_n = 256, o.fuse_pairs = true, o.keep_pair_exp = false;
       }},
      {"row group of 8, one round, the exp kept (CTAs whose columns all lie past a row: factor 0)", DType::BF16, 1000,
       1032, 72,
       [](PlanOptions& o) {
         o.row_group = 8, o.cluster_m = 2, o.tile_m = 64, o.tile_n = 256, o.fuse_pairs = true, o.keep_pair_exp = true;
       }},
      {"DSMEM peer-to-peer", DType::BF16, 300, 1000, 64,
       [](PlanOptions& o) { o.cluster_n = 8, o.aggregation = Aggregation::PeerToPeer; }},
      {"DSMEM leader-follower, M > N", DType::F16, 1000, 520, 64,
       [](PlanOptions& o) { o.cluster_n = 4, o.aggregation = Aggregation::LeaderFollower; }},
      {"SMEM stash", DType::BF16, 700, 4096, 64,
       [](PlanOptions& o) {
         o.cluster_n = 8, o.strategy = RowStrategy::SmemStash, o.aggregation = Aggregation::PeerToPeer;
         o.stash_bytes = 2;
       }},
      {"workspace stash", DType::BF16, 1100, 4096, 128,
       [](PlanOptions& o) { o.cluster_n = 2, o.strategy = RowStrategy::WorkspaceStash; }},
  };
  for (const V& v : cases) {
    SCOPED_TRACE(fmt::format("{}: M={} N={} K={}", v.what, v.m, v.n, v.k));
    Case c(v.dt);
    c.g.output(c.g.softmax(c.g.causal_mask(c.acc * 0.125)), "p", v.dt);
    CompileOptions opt;
    v.force(opt.plan);
    const Plan p = expect_matches(c.g, dims(v.m, v.n, v.k), opt);
    const LoweringResult r = lower(c.g);
    EXPECT_NE(emit(r.regions.at(0).spec, p).source.find("comfuse::epi::CausalMask<2>"), std::string::npos);
  }
}

// Four reductions, each feeding the next through elementwise work: four exchange rounds.
Value chain_of_four_rounds(Case& c) {
  Value v = c.acc;
  for (ReduceOp op : {ReduceOp::Mean, ReduceOp::Max, ReduceOp::Sum, ReduceOp::Min}) v = v - c.g.reduce(op, v) * 0.5;
  return v;
}

TEST_F(GpuReduce, RowGroupsChainOfFiveAndBf16Stash) {
  Case c;
  Value amax = c.g.reduce(ReduceOp::Max, c.g.unary(UnaryOp::Abs, c.acc));
  c.g.output(c.acc * (c.g.unary(UnaryOp::Reciprocal, amax) * 127.0), "q", DType::BF16);
  c.g.output(chain_of_four_rounds(c), "chain", DType::F32);
  Plan p = expect_row_group(c.g, dims(1100, 1480, 96), 2, 2);
  EXPECT_EQ(p.reductions, 5);
  EXPECT_GT(p.kernel.n_tiles, 1);
  Case r;  // a bf16 stash: no cancellation in RMSNorm, so bf16 rounding of x stays in tolerance
  r.g.output(r.g.rms_norm(r.acc, r.row("gamma")), "y", DType::BF16);
  Plan q = expect_row_group(r.g, dims(700, 4096, 64), 2, 2, {}, 0.0, 2);
  EXPECT_EQ(q.kernel.stash_elem_bytes, 2);
}

// Split-K (KernelConfig::k_splits, kernels/comfuse/scheduler/split_k.cuh): S clusters share each
// tile's K and the owner adds the partial tiles before the epilogue. Each case is timed for a
// few launches (no cuBLAS) and checked again after them: the hand-over's tags carry the launch's
// epoch, so a stale tag of an earlier launch must never pass for this one's.
DeviceRunReport expect_split(const Graph& g, const Bindings& d, const CompileOptions& opt, double offset = 0.0) {
  DeviceRunReport rep = run_and_check(g, d, /*seed=*/13, opt, /*timing_reps=*/2, offset);
  expect_outputs_match(rep);
  EXPECT_FALSE(rep.outputs_after_timing.empty());
  return rep;
}

Graph rms_norm_graph(DType t = DType::BF16) {
  Case c(t);
  c.g.output(c.g.rms_norm(c.acc, c.g.input("gamma", t, {Dim::of("N")})), "y", t);
  return std::move(c.g);
}

// The split-K tests' epilogues by name: "layernorm", "rmsnorm", "rmsnorm-f16", "gelu" (bias + tanh
// GELU), "softmax" (of acc / 8); expect_split_named checks LayerNorm with a 1000 offset.
Graph split_graph(const std::string& what) {
  if (what == "layernorm") return layer_norm_graph();
  if (what == "rmsnorm") return rms_norm_graph();
  if (what == "rmsnorm-f16") return rms_norm_graph(DType::F16);
  if (what != "gelu") {
    EXPECT_EQ(what, "softmax");
    return softmax_graph(false, 0.125);
  }
  Case c;
  c.g.output(c.g.unary(UnaryOp::GeluTanh, c.acc + c.row("bias")), "y", DType::BF16);
  return std::move(c.g);
}
Plan expect_split_named(const std::string& what, const Bindings& d, const CompileOptions& opt) {
  return expect_split(split_graph(what), d, opt, what == "layernorm" ? 1000.0 : 0.0).plan;
}

TEST_F(GpuReduce, SplitKDecodeShapesEverySplitCount) {
  // Decode rows (1..16; only rows < M travel), a ragged M past one row block, ragged N and K
  // (K % S != 0: unequal shares), splits 2..16, 64- and 128-row warp groups, with and without
  // row groups; LayerNorm with a 1000 offset, RMSNorm in f16, softmax.
  struct V {
    const char* what;
    int64_t m, n, k;
    int splits, row_group;
    std::optional<int> tile_m;
  };
  for (const V& v : {V{"layernorm", 1, 2048, 4096, 8, 16, {}}, V{"layernorm", 7, 1032, 1000, 5, 16, {}},
                     V{"rmsnorm-f16", 16, 4096, 4096, 4, 16, {}}, V{"softmax", 3, 2000, 2112, 16, 8, {}},
                     V{"layernorm", 100, 1032, 520, 3, 16, 128}, V{"rmsnorm-f16", 5, 200, 256, 2, 1, {}},
                     V{"softmax", 130, 520, 4096, 6, 8, {}}}) {
    SCOPED_TRACE(fmt::format("{} M={} N={} K={} split-K {} row group {}", v.what, v.m, v.n, v.k, v.splits, v.row_group));
    CompileOptions opt;
    opt.plan.k_splits = v.splits;
    opt.plan.row_group = v.row_group;
    opt.plan.cluster_m = 1;
    opt.plan.tile_m = v.tile_m;
    const Plan p = expect_split_named(v.what, dims(v.m, v.n, v.k), opt);
    EXPECT_EQ(p.kernel.k_splits, v.splits);
  }
}

TEST_F(GpuReduce, SplitKSeveralJobsPerWarpGroup) {
  // More jobs than split groups: every warp group walks several jobs, so each split waits for
  // the owner to have read its previous partial before writing the next (one buffer a split).
  for (int cm : {1, 2}) {
    SCOPED_TRACE(fmt::format("cluster_m {}", cm));
    CompileOptions opt;
    opt.plan.k_splits = 4;
    opt.plan.row_group = 8;
    opt.plan.cluster_m = cm;
    const Plan p = expect_split(layer_norm_graph(), dims(2000, 1032, 1000), opt, 1000.0).plan;
    EXPECT_GT(p.jobs, p.grid_ctas / (p.kernel.cluster_size() * p.kernel.row_group * p.kernel.k_splits));
  }
}

TEST_F(GpuReduce, SplitKElementwiseEpilogue) {
  // Split-K without a row reduction (forced: GPT-2's decode c_fc, bias + tanh GELU): the row
  // block's N-tiles over a group of CTAs with nothing to exchange, the owner adding the other
  // splits' partials before the elementwise epilogue. Decode rows, a ragged M past a row block,
  // ragged N and K (unequal shares), clusters of 1 and 2 along M, bf16 and f16, and more N-tiles
  // than a row group holds (the jobs walk N: 71 tiles of 128).
  struct V {
    int64_t m, n, k;
    int splits, cluster_m;
    DType t;
  };
  for (const V& v : {V{1, 4096, 1024, 4, 1, DType::BF16}, V{32, 4000, 1000, 3, 2, DType::BF16},
                     V{7, 1032, 4096, 8, 1, DType::F16}, V{130, 520, 2112, 2, 1, DType::BF16},
                     V{2, 9000, 2048, 2, 1, DType::BF16}}) {
    SCOPED_TRACE(fmt::format("M={} N={} K={} split-K {} cluster_m {}", v.m, v.n, v.k, v.splits, v.cluster_m));
    Case c(v.t);
    c.g.output(c.g.unary(UnaryOp::GeluTanh, c.acc + c.g.input("bias", v.t, {Dim::of("N")})), "y", v.t);
    CompileOptions opt;
    opt.plan.k_splits = v.splits;
    opt.plan.cluster_m = v.cluster_m;
    const Plan p = expect_split(c.g, dims(v.m, v.n, v.k), opt).plan;
    EXPECT_EQ(p.kernel.k_splits, v.splits);
    EXPECT_FALSE(p.kernel.row_reduction);
  }
}

// Row reductions on 64x64 tiles in L2 row groups with K split (forced: --tile-n 64 with the L2
// exchange; decode rows spread over twice the SMs of 64x128 tiles): row groups of 16 to 64 (some
// CTAs past N), decode rows and a ragged row block, ragged N (a last tile of 8, 16 or 40
// columns) and K; LayerNorm with a 1000 offset, RMSNorm, softmax (its pair in one round, handed
// over between warps), and the residual LayerNorm storing h. NVRTC alone builds them (no nvcc
// fallback).
TEST_F(GpuReduce, RowGroupsOnNarrowTilesWithKSplit) {
  struct V {
    const char* what;
    int64_t m, n, k;
    int splits, row_group;
  };
  for (const V& v : {V{"layernorm", 1, 1024, 4096, 8, 16}, V{"rmsnorm", 3, 2000, 3112, 4, 32},
                     V{"softmax", 16, 1032, 2048, 4, 32}, V{"layernorm", 40, 2056, 1000, 2, 64},
                     V{"residual layernorm", 1, 1000, 4096, 8, 16}}) {
    SCOPED_TRACE(fmt::format("{} M={} N={} K={} split-K {}", v.what, v.m, v.n, v.k, v.splits));
    CompileOptions opt;
    opt.plan.tile_m = 64, opt.plan.tile_n = 64, opt.plan.cluster_m = 1;
    opt.plan.k_splits = v.splits;
    opt.plan.aggregation = Aggregation::L2Exchange;
    opt.jit.nvcc_fallback = false;
    Graph g;
    if (std::string(v.what) == "residual layernorm") {
      Case c;
      Value h = c.acc + c.row("bias") + c.g.input("residual", DType::BF16, {Dim::of("M"), Dim::of("N")});
      c.g.output(h, "h", DType::BF16);
      c.g.output(c.g.layer_norm(h, c.row("gamma"), c.row("beta")), "y", DType::BF16);
      g = std::move(c.g);
    } else {
      g = split_graph(v.what);
    }
    const Plan p = expect_split(g, dims(v.m, v.n, v.k), opt, std::string(v.what) == "layernorm" ? 1000.0 : 0.0).plan;
    EXPECT_EQ(p.kernel.tile_n, 64);
    EXPECT_EQ(p.kernel.aggregation, Aggregation::L2Exchange);
    EXPECT_EQ(p.kernel.k_splits, v.splits);
    EXPECT_EQ(p.kernel.row_group, v.row_group);
    EXPECT_EQ(p.kernel.n_tiles, 1);
  }
}

TEST_F(GpuReduce, SplitKPartialsOverDsmem) {
  // The K-splits of a tile in one hardware cluster, the owner (rank 0) adding the others'
  // partials over DSMEM (KernelConfig::splits_in_cluster, cluster/split_hand_over.cuh): decode
  // rows (one piece: warp 0's rows), a ragged M of one to four pieces with 64- and 128-row warp
  // groups, ragged N and K (unequal shares), clusters of 2 to 16 CTAs, several jobs a warp group
  // (the hand-over's barrier phases carried from job to job), and an elementwise epilogue.
  struct V {
    const char* what;
    int64_t m, n, k;
    int splits;
    std::optional<int> row_group, tile_m;
  };
  for (const V& v : {V{"layernorm", 1, 2048, 4096, 4, 16, {}}, V{"rmsnorm-f16", 16, 4096, 1000, 2, 16, {}},
                     V{"softmax", 3, 2000, 2112, 8, 8, {}}, V{"layernorm", 1, 512, 4096, 16, 4, {}},
                     V{"layernorm", 100, 1032, 520, 4, 16, 128}, V{"rmsnorm-f16", 40, 200, 256, 2, 1, {}},
                     V{"layernorm", 2000, 1032, 1000, 4, 8, {}}, V{"gelu", 7, 1032, 4096, 8, {}, {}},
                     V{"gelu", 130, 520, 2112, 2, {}, {}}}) {
    SCOPED_TRACE(fmt::format("{} M={} N={} K={} split-K {} in a cluster, row group {}", v.what, v.m, v.n, v.k, v.splits,
                             v.row_group.value_or(0)));
    CompileOptions opt;
    opt.plan.k_splits = v.splits;
    opt.plan.splits_in_cluster = true;
    opt.plan.row_group = v.row_group;
    opt.plan.cluster_m = 1;
    opt.plan.tile_m = v.tile_m;
    const Plan p = expect_split_named(v.what, dims(v.m, v.n, v.k), opt);
    EXPECT_EQ(p.kernel.k_splits, v.splits);
    EXPECT_TRUE(p.kernel.splits_in_cluster);
    EXPECT_EQ(p.kernel.hw_cluster_x(), v.splits);
  }
}

TEST_F(GpuReduce, SplitKSumsDecodeRowsInSmem) {
  // Decode rows with the owner's whole warp group summing the partial rows in SMEM
  // (KernelConfig::split_gather_rows), their values in tagged words (one job a warp group: a row
  // block's tiles never outnumber its row group): M of 1, 9, 13 and 16 (warp 0's one and both row slots),
  // splits 2 to 16 (one and several rounds of loads a thread), ragged N and K (unequal shares);
  // RMSNorm and LayerNorm (row groups) and bias + GELU (elementwise).
  struct V {
    const char* what;
    int64_t m, n, k;
    int splits;
    std::optional<int> tile_n;
  };
  for (const V& v : {V{"rmsnorm", 1, 2048, 4096, 8, {}}, V{"layernorm", 1, 2048, 4104, 8, {}},
                     V{"rmsnorm", 9, 1000, 4104, 3, {}}, V{"gelu", 16, 4096 - 8, 4096, 4, {}},
                     V{"gelu", 13, 520, 2112, 16, 128}, V{"rmsnorm", 16, 520, 1000, 2, {}},
                     V{"gelu", 1, 4096, 11008, 4, {}}}) {
    SCOPED_TRACE(fmt::format("{} M={} N={} K={} split-K {}", v.what, v.m, v.n, v.k, v.splits));
    CompileOptions opt;
    opt.plan.k_splits = v.splits;
    opt.plan.cluster_m = 1;
    opt.plan.tile_n = v.tile_n;
    const Plan p = expect_split_named(v.what, dims(v.m, v.n, v.k), opt);
    EXPECT_EQ(p.kernel.k_splits, v.splits);
    EXPECT_GT(p.kernel.split_gather_rows, 0);
  }
}

TEST_F(GpuReduce, SplitKSumsWholeTilesInSmem) {
  // Whole 64- and 128-row tiles with the owner's warp group summing the partials in SMEM (forced:
  // KernelConfig::split_gather_rows = epi_rows, the ring giving up stages for the staging): the
  // small FFN's GEMM2 shape (bias + GELU), a ragged last row block (rows_left < the tile's rows),
  // splits 2 to 16 (one round of loads a thread at 64x64 with S = 2, several elsewhere; tagged
  // words at S = 16), row groups with RMSNorm and LayerNorm, softmax, and several jobs a warp
  // group (each split waits for the owner's read of its previous partial).
  struct V {
    const char* what;
    int64_t m, n, k;
    int splits;
    std::optional<int> tile_m, tile_n, row_group;
  };
  for (const V& v : {V{"gelu", 64, 1024, 3072, 8, {}, 64, {}}, V{"gelu", 130, 520, 2112, 2, {}, {}, {}},
                     V{"gelu", 100, 1000, 2112, 2, 64, 64, {}}, V{"gelu", 64, 512, 16384, 16, 64, 64, {}},
                     V{"rmsnorm", 256, 1000, 4104, 3, {}, {}, 8}, V{"rmsnorm", 200, 1032, 1000, 4, 128, 128, 16},
                     V{"softmax", 96, 2000, 4096, 4, {}, {}, 16}, V{"layernorm", 2000, 1032, 1000, 2, 64, 128, 16}}) {
    SCOPED_TRACE(fmt::format("{} M={} N={} K={} split-K {}", v.what, v.m, v.n, v.k, v.splits));
    CompileOptions opt;
    opt.plan.k_splits = v.splits;
    opt.plan.split_gather_in_smem = true;
    opt.plan.cluster_m = 1;
    opt.plan.tile_m = v.tile_m;
    opt.plan.tile_n = v.tile_n;
    opt.plan.row_group = v.row_group;
    const Plan p = expect_split_named(v.what, dims(v.m, v.n, v.k), opt);
    EXPECT_EQ(p.kernel.k_splits, v.splits);
    EXPECT_EQ(p.kernel.a_box_rows, 0);
    EXPECT_EQ(p.kernel.split_gather_rows, p.kernel.epi_rows());
  }
}

TEST_F(GpuReduce, SplitKGatedGemm) {
  // A gated GEMM (KernelConfig::gated: SwiGLU's gate and up in one accumulator) with K split: the
  // splits' partials are the whole accumulator, both products, summed before the epilogue
  // multiplies them. Decode rows (summed in SMEM, tagged words) and rows past a row block's 16
  // (each thread its own), 64- and 128-column tiles (a 128- and a 256-column accumulator), through
  // L2 and over DSMEM, several jobs a warp group (N-tiles past the split groups), ragged N and K
  // (unequal shares), bf16 and f16, K x N weights.
  struct V {
    int64_t m, n, k;
    int splits, tile_n;
    bool in_cluster;
    const char* dtype;
    const char* act;
    bool kn;
  };
  for (const V& v : {V{1, 14336 - 64, 4096, 4, 64, false, "bf16", "silu", false},
                     V{7, 1032, 4104, 3, 64, false, "f16", "gelu", false},
                     V{16, 520, 2112, 8, 128, false, "bf16", "silu", false},
                     V{100, 1000, 1000, 2, 64, false, "bf16", "silu", false},
                     V{5, 1032, 4096, 4, 64, true, "bf16", "silu", false},
                     V{3, 600, 2048, 2, 128, true, "f16", "silu", true},
                     V{9, 2000, 3072, 6, 64, false, "bf16", "silu", true}}) {
    SCOPED_TRACE(fmt::format("{} {}{} M={} N={} K={} split-K {}{} tile_n {}", v.dtype, v.act, v.kn ? " kn" : "", v.m,
                             v.n, v.k, v.splits, v.in_cluster ? " in a cluster" : "", v.tile_n));
    const Graph g = parse_graph(fmt::format(R"(
input x: {0}[M, K]
input w1: {0}[{2}]
input w3: {0}[{2}]
gate = matmul(x, w1{3})
up = matmul(x, w3{3})
s = cast(mul({1}(gate), up), {0})
output s: {0}
)",
                                            v.dtype, v.act, v.kn ? "K, N" : "N, K", v.kn ? ", layout=kn" : ""));
    CompileOptions opt;
    opt.plan.k_splits = v.splits;
    opt.plan.tile_n = v.tile_n;
    opt.plan.splits_in_cluster = v.in_cluster;
    const Plan p = expect_split(g, dims(v.m, v.n, v.k), opt).plan;
    EXPECT_TRUE(p.kernel.gated);
    EXPECT_EQ(p.kernel.k_splits, v.splits);
    EXPECT_EQ(p.kernel.splits_in_cluster, v.in_cluster);
  }
}

TEST_F(GpuReduce, SplitKPlannerDefaultAtDecode) {
  // The planner's own choice at decode sizes splits K; a residual (TileInput) and the pre-norm
  // sum as a second output ride along.
  for (int64_t m : {1, 4, 16}) {
    SCOPED_TRACE(fmt::format("M={}", m));
    const Plan p = expect_split(rms_norm_graph(), dims(m, 2048, 4096), {}).plan;
    EXPECT_GT(p.kernel.k_splits, 1);
    Case c;
    Value h = c.acc + c.g.input("residual", DType::BF16, {Dim::of("M"), Dim::of("N")});
    c.g.output(h, "h", DType::BF16);
    c.g.output(c.g.rms_norm(h, c.row("gamma")), "y", DType::BF16);
    const Plan q = expect_split(c.g, dims(m, 2048, 4096), {}).plan;
    EXPECT_GT(q.kernel.k_splits, 1);
  }
  // Rows of several reductions (LayerNorm over a 1000 offset, softmax and log-softmax, each pair in
  // one round; a chain of four rounds) on the planner's 64x64 tiles in row groups of 32 with K split
  // (calibration.cpp narrow_row_group_k_splits), ragged N included; 9 to 16 rows hand a pair's
  // second row slots over in SMEM (GlobalRowAllReduce::kHelpedPairs).
  for (const int64_t m : {1, 13}) {
    for (const int64_t n : {2048, 2000}) {
      for (const std::string what : {"layernorm", "softmax", "log-softmax"}) {
        SCOPED_TRACE(fmt::format("{} M={} N={}", what, m, n));
        Graph g = what == "layernorm" ? layer_norm_graph() : softmax_graph(what == "log-softmax", 4.0);
        const Plan p = expect_split(g, dims(m, n, 4096), {}, what == "layernorm" ? 1000.0 : 0.0).plan;
        EXPECT_EQ(p.kernel.tile_n, 64);
        EXPECT_EQ(p.kernel.row_peers(), 32);
        EXPECT_GT(p.kernel.k_splits, 1);
      }
      // A chain of four rounds (mean, max, sum, min) on the same plan.
      SCOPED_TRACE(fmt::format("chain M={} N={}", m, n));
      Case c;
      c.g.output(chain_of_four_rounds(c), "chain", DType::F32);
      const Plan p = expect_split(c.g, dims(m, n, 4096), {}).plan;
      EXPECT_EQ(p.kernel.tile_n, 64);
      EXPECT_EQ(p.kernel.row_peers(), 32);
      EXPECT_GT(p.kernel.k_splits, 1);
    }
  }
}

// Pair rounds at decode rows over more than 16 peers (GlobalRowAllReduce::kHelpedPairs): where a
// 64-row warp group's rows all sit in warps 0 and 1 (9 to 32 rows in the job), warps 2 and 3 merge
// their second row slots and hand them over in SMEM. LayerNorm (1000 offset), softmax and
// log-softmax, each pair in one round; row groups of 32 and 64 with ragged and empty peers (N =
// 3000: 24 tiles of 128), M of 9 to 32, a last row block of 26 rows after a full one (M = 90) and
// of 20 after nine (M = 596: warp groups whose helped job follows a job of 64 rows), with and
// without split-K; each kernel runs again after the check (the words' tags across launches).
TEST_F(GpuReduce, PairRoundsHelpedAtDecodeRows) {
  struct V {
    int64_t m, n, k;
    int row_group, splits;
  };
  for (const V& v : {V{9, 3000, 1000, 32, 1}, V{16, 4096 - 8, 4096 + 40, 32, 4}, V{27, 3000, 520, 64, 2},
                     V{32, 4096, 1000, 32, 1}, V{90, 3000, 1000, 32, 1}, V{596, 3000, 1000, 32, 1}}) {
    for (const std::string what : {"layernorm", "softmax", "log-softmax"}) {
      SCOPED_TRACE(fmt::format("{} M={} N={} K={} row group {} split-K {}", what, v.m, v.n, v.k, v.row_group, v.splits));
      CompileOptions opt;
      opt.plan.row_group = v.row_group;
      opt.plan.cluster_m = 1;
      opt.plan.tile_m = 64;
      opt.plan.tile_n = 128;
      opt.plan.k_splits = v.splits;
      opt.plan.fuse_pairs = true;
      Graph g = what == "layernorm" ? layer_norm_graph() : softmax_graph(what == "log-softmax", 4.0);
      const Plan p = expect_split(g, dims(v.m, v.n, v.k), opt, what == "layernorm" ? 1000.0 : 0.0).plan;
      EXPECT_EQ(p.kernel.row_peers(), v.row_group);
      EXPECT_EQ(p.kernel.epi_rows(), 64);
      EXPECT_TRUE(what == "layernorm" ? p.fused_pairs.mean_variance : p.fused_pairs.max_exp_sum);
    }
  }
}

// The planner's pairs at two row blocks (M = 65-128, decide_row_groups.cpp): clusters of 2 along
// M with K split in two, the second CTA of each pair holding 1 to 64 rows; ragged N and K, a
// residual riding along, LayerNorm in two rounds and softmax.
TEST_F(GpuReduce, RowGroupPairsAtTwoRowBlocks) {
  for (int64_t m : {65, 100, 128}) {
    SCOPED_TRACE(fmt::format("M={}", m));
    Case a;
    a.g.output(a.g.layer_norm(a.acc + a.row("bias"), a.row("gamma"), a.row("beta")), "y", DType::BF16);
    const Plan p = expect_matches(a.g, dims(m, 4096 - 8, 4096 + 40));
    EXPECT_EQ(p.kernel.cluster_m, 2);
    EXPECT_EQ(p.kernel.k_splits, 2);
    Case b;
    Value h = b.acc + b.g.input("residual", DType::BF16, {Dim::of("M"), Dim::of("N")});
    b.g.output(h, "h", DType::BF16);
    b.g.output(b.g.softmax(h), "p", DType::BF16);
    const Plan q = expect_matches(b.g, dims(m, 4096 - 8, 4096 + 40));
    EXPECT_EQ(q.kernel.cluster_m, 2);
  }
}

// A NaN logit poisons its row and only its row, as in the fp64 reference (and torch): every
// output element of the row is NaN, the other rows are right, on every way a row's CTAs meet.
// A NaN in w's rows 7 and N - 1 (at k = 0 and K - 1: the first and last K-splits, the first and
// last N-tiles) makes two logits of every row NaN, each held by one CTA of the row, so the row's
// other CTAs must take it from the exchange (fmaxf alone would drop it from a max) and a split
// that is not the owner hands it over. A NaN in x makes a whole row of logits NaN (rows 5 and
// M - 2: the first and the last row blocks). The outputs are poisoned with a finite value
// (run_and_check's edit_inputs), so a row left unwritten cannot pass for a NaN one.
TEST_F(GpuReduce, NaNLogitsPoisonTheirRowsOnly) {
  struct V {
    const char* what;  // "softmax", "softmax-two-rounds", "log-softmax", "layernorm", "rmsnorm"
    int64_t m, n, k;
    std::function<void(PlanOptions&)> force;  // the plan it stands for; nothing: the planner's
    std::function<void(const Plan&)> expect;  // that plan, asserted
  };
  auto none = [](PlanOptions&) {};
  auto row_groups = [](bool one_round) {
    return [one_round](const Plan& p) {
      EXPECT_GT(p.kernel.row_peers(), 1);
      EXPECT_EQ(p.kernel.aggregation, Aggregation::L2Exchange);
      EXPECT_EQ(p.fused_pairs.any(), one_round);
    };
  };
  const std::vector<V> cases = {
      {"softmax", 256, 4096, 1000, none, row_groups(true)},
      {"softmax-two-rounds", 256, 4096 - 8, 1000, [](PlanOptions& o) { o.fuse_pairs = false; }, row_groups(false)},
      {"layernorm", 200, 4000, 1000, none, row_groups(true)},
      {"rmsnorm", 8, 2048, 4096, none,  // decode: K split, the owner finishes the row
       [](const Plan& p) {
         EXPECT_GT(p.kernel.k_splits, 1);
         EXPECT_GT(p.kernel.row_peers(), 1);
       }},
      {"log-softmax", 20, 3000, 520,
       [](PlanOptions& o) {  // pair rounds handed between warps
         o.row_group = 64, o.cluster_m = 1, o.tile_m = 64, o.tile_n = 128, o.k_splits = 2, o.fuse_pairs = true;
       },
       [](const Plan& p) { EXPECT_TRUE(p.kernel.pair_hand_over); }},
      {"softmax", 300, 1024, 128, [](PlanOptions& o) { o.cluster_n = 8; },  // DSMEM in a cluster
       [](const Plan& p) { EXPECT_EQ(p.kernel.cluster_n, 8); }},
      {"layernorm", 300, 4096, 128,
       [](PlanOptions& o) {  // a stash in the global workspace
         o.cluster_n = 2, o.strategy = RowStrategy::WorkspaceStash;
       },
       [](const Plan& p) { EXPECT_EQ(p.strategy(), RowStrategy::WorkspaceStash); }},
  };
  for (const V& v : cases) {
    const std::string what = v.what;
    Graph g = what == "layernorm" ? layer_norm_graph()
              : what == "rmsnorm"  ? rms_norm_graph()
                                   : softmax_graph(what == "log-softmax", 0.125);
    CompileOptions opt;
    v.force(opt.plan);
    const double nan = std::numeric_limits<double>::quiet_NaN();
    for (const bool in_w : {false, true}) {
      SCOPED_TRACE(fmt::format("{} M={} N={} K={}: NaN in {}", v.what, v.m, v.n, v.k,
                               in_w ? "w rows 7, N - 1" : "x rows 5, M - 2"));
      auto edit = [&](TensorMap& in) {
        if (in_w) {
          in.at("w").data[static_cast<size_t>(7 * v.k)] = nan;
          in.at("w").data[static_cast<size_t>((v.n - 1) * v.k + v.k - 1)] = nan;
        } else {
          in.at("x").data[static_cast<size_t>(5 * v.k + 3)] = nan;
          in.at("x").data[static_cast<size_t>((v.m - 2) * v.k + v.k - 1)] = nan;
        }
      };
      const DeviceRunReport rep = run_and_check(g, dims(v.m, v.n, v.k), /*seed=*/17, opt, /*timing_reps=*/0,
                                                what == "layernorm" ? 1000.0 : 0.0, false, {}, edit);
      v.expect(rep.plan);
      ASSERT_FALSE(rep.outputs.empty());
      for (const OutputCheck& o : rep.outputs) {
        EXPECT_EQ(o.unwritten, 0) << o.name;
        EXPECT_EQ(o.cmp.nonfinite_differ, 0) << o.name << ": NaN on one side only";
        EXPECT_EQ(o.cmp.nonfinite, (in_w ? v.m : 2) * v.n) << o.name << ": the NaN rows";
        EXPECT_EQ(o.nonfinite_anywhere, o.cmp.nonfinite) << o.name << ": every row is referenced";
        EXPECT_LE(o.cmp.rel_l2, gpu_result_tolerance(o.dtype)) << o.name << " (the other rows)";
      }
    }
  }
}

}  // namespace
}  // namespace comfuse
