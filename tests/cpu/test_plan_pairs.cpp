// The planner's paired reductions and stash plans: a mean and its variance, a max and its sum of
// exp, in one round where the row's CTAs meet in L2; over several N-tiles a CTA the root pair
// online, the stash's type (bf16 about each tile's row centers) and the tiles such plans take.
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

FusionSpec log_softmax() {
  return lowered([](Graph& g, Value acc) { return g.log_softmax(acc); }, DType::F32);
}

// Paired reductions (LayerNorm's mean and variance, softmax's and log-softmax's max and sum of
// exp) share one exchange round wherever the row's CTAs meet in L2 (not over DSMEM, not in one CTA
// unless forced); over several N-tiles a CTA the root stage's pair (its second statistic online
// across the tiles), in row groups of up to 32 CTAs unless forced.
// A GPU's model with rows over several N-tiles a CTA allowed (DeviceModel::multi_tile_rows).
DeviceModel multi_tile_model(Gpu gpu) {
  DeviceModel dev = device_model(gpu);
  dev.multi_tile_rows = true;
  return dev;
}

TEST(Plan, PairedReductionsInOneRoundWhereARoundIsSaved) {
  FusionSpec ln = layer_norm(), sm = softmax(), lsm = log_softmax(), rms = rms_norm();
  EXPECT_EQ(ln.pair_count(PairKind::MeanVariance), 1);
  EXPECT_EQ(ln.pair_count(PairKind::MaxExpSum), 0);
  EXPECT_EQ(sm.pair_count(PairKind::MaxExpSum), 1);
  EXPECT_EQ(lsm.pair_count(PairKind::MaxExpSum), 1);
  EXPECT_EQ(rms.pair_count(PairKind::MeanVariance) + rms.pair_count(PairKind::MaxExpSum), 0);
  // Every pair in one round by default where the row's CTAs meet in L2 (measured faster or a
  // tie, with several jobs a CTA and with one); two where a row has one CTA.
  EXPECT_TRUE(make_plan(ln, prob(8192, 4096, 4096)).fused_pairs.mean_variance);
  EXPECT_TRUE(make_plan(ln, prob(256, 4096, 4096)).fused_pairs.mean_variance);  // one job per CTA
  EXPECT_TRUE(make_plan(ln, prob(1, 1024, 4096)).fused_pairs.mean_variance);     // decode, split-K
  EXPECT_FALSE(make_plan(ln, prob(8192, 128, 4096)).fused_pairs.any());  // one CTA per row: no round to save
  EXPECT_TRUE(make_plan(sm, prob(8192, 4096, 4096)).fused_pairs.max_exp_sum);
  EXPECT_FALSE(make_plan(sm, prob(8192, 4096, 4096)).fused_pairs.mean_variance);
  EXPECT_FALSE(make_plan(rms, prob(8192, 4096, 4096)).fused_pairs.any());
  EXPECT_TRUE(make_plan(lsm, prob(8192, 4096, 4096)).fused_pairs.max_exp_sum);
  EXPECT_TRUE(make_plan(lsm, prob(256, 4096, 4096)).fused_pairs.max_exp_sum);  // one job per CTA
  EXPECT_TRUE(make_plan(sm, prob(16, 4096, 4096)).fused_pairs.max_exp_sum);
  // Vocabulary rows with several jobs a CTA: the row group that runs the pair in one round, not a
  // larger one in two (decide_row_groups.cpp two_round_pair_group, measured at 256 and 1024 x
  // 128256 x 4096); decode rows (one job a CTA) keep the model's larger group.
  for (const FusionSpec& s : {sm, lsm}) {
    for (int64_t m : {256, 1024}) {
      SCOPED_TRACE(m);
      const Plan vocab = make_plan(s, prob(m, 128256, 4096));
      EXPECT_EQ(vocab.kernel.row_peers(), 32);
      EXPECT_TRUE(vocab.fused_pairs.max_exp_sum);
    }
    EXPECT_GT(make_plan(s, prob(1, 128256, 4096)).kernel.row_peers(), 32);
  }
  PlanOptions opt;
  opt.fuse_pairs = false;
  EXPECT_FALSE(make_plan(ln, prob(8192, 4096, 4096), full_device(), {}, opt).fused_pairs.any());
  EXPECT_FALSE(make_plan(ln, prob(256, 4096, 4096), full_device(), {}, opt).fused_pairs.any());
  opt.fuse_pairs = true;
  EXPECT_TRUE(make_plan(ln, prob(256, 4096, 4096), full_device(), {}, opt).fused_pairs.mean_variance);
  const Plan forced = make_plan(sm, prob(8192, 4096, 4096), full_device(), {}, opt);  // pairs forced to one round
  EXPECT_TRUE(forced.fused_pairs.max_exp_sum);
  EXPECT_FALSE(forced.fused_pairs.mean_variance);  // softmax has no mean-and-variance pair
  EXPECT_TRUE(make_plan(sm, prob(8192, 128, 4096), full_device(), {}, opt).fused_pairs.max_exp_sum);  // one CTA works
  opt = {};
  opt.aggregation = Aggregation::PeerToPeer;
  EXPECT_FALSE(make_plan(ln, prob(8192, 4096, 4096), full_device(), {}, opt).fused_pairs.any());
  opt = {};
  opt.row_group = 2;  // 8 N-tiles per CTA: both kinds, the root stage's pair (Chan's merge per tile, online softmax)
  EXPECT_TRUE(make_plan(sm, prob(8192, 4096, 4096), full_device(), {}, opt).fused_pairs.max_exp_sum);
  const Plan ln_tiles = make_plan(ln, prob(8192, 4096, 4096), full_device(), {}, opt);
  EXPECT_GT(ln_tiles.kernel.n_tiles, 1);
  EXPECT_TRUE(ln_tiles.fused_pairs.mean_variance);
  const std::string lt = explain(ln, ln_tiles);
  EXPECT_NE(lt.find("each tile's squares about its own mean merged online by Chan's formula"), std::string::npos) << lt;
  opt.fuse_pairs = true;
  EXPECT_TRUE(make_plan(sm, prob(8192, 4096, 4096), full_device(), {}, opt).fused_pairs.max_exp_sum);
  EXPECT_TRUE(make_plan(ln, prob(8192, 4096, 4096), full_device(), {}, opt).fused_pairs.mean_variance);
  const std::string e = explain(sm, forced);
  EXPECT_NE(e.find("max and sum of exp in one round"), std::string::npos) << e;
  EXPECT_NE(e.find("1 max-and-sum-of-exp pair(s)"), std::string::npos) << e;
  // Softmax's exp is made once a value (the pair keeps it in the registers); log-softmax's last
  // stage takes x - max, so it cannot.
  EXPECT_EQ(plan_detail::analyze_chain(sm).max_exp_sum_pairs_keeping_exp, 1);
  EXPECT_EQ(plan_detail::analyze_chain(lsm).max_exp_sum_pairs_keeping_exp, 0);
  ASSERT_EQ(forced.kernel.n_tiles, 1);
  EXPECT_TRUE(forced.fused_pairs.kept_exp);  // the default (measured faster or a tie)
  EXPECT_NE(e.find("1 keep(s) the exp summed before the round"), std::string::npos) << e;
  PlanOptions again;
  again.fuse_pairs = true;
  again.keep_pair_exp = false;
  const Plan made_again = make_plan(sm, prob(8192, 4096, 4096), full_device(), {}, again);
  EXPECT_FALSE(made_again.fused_pairs.kept_exp);
  EXPECT_NE(explain(sm, made_again).find("could keep the exp summed before the round in the registers"),
            std::string::npos)
      << explain(sm, made_again);
  EXPECT_NE(emit(sm, forced).source.find(", 4>>, 3>"), std::string::npos);
  EXPECT_EQ(emit(sm, made_again).source.find(", 4>>, 3>"), std::string::npos);
  EXPECT_NE(emit(sm, made_again).source.find(", 2>>, 3>"), std::string::npos);  // the pair, its exp made again
  PlanOptions keep;
  keep.keep_pair_exp = true;
  const Plan lsm_keep = make_plan(lsm, prob(8192, 4096, 4096), full_device(), {}, keep);
  EXPECT_FALSE(lsm_keep.fused_pairs.kept_exp);  // its last stage takes x - max
  EXPECT_EQ(explain(lsm, lsm_keep).find("keep the exp"), std::string::npos) << explain(lsm, lsm_keep);
  keep.row_group = 2;  // several N-tiles a CTA: nothing to keep in the registers
  EXPECT_FALSE(make_plan(sm, prob(8192, 4096, 4096), full_device(), {}, keep).fused_pairs.kept_exp);
  const std::string d = explain(sm, make_plan(sm, prob(8192, 128, 4096)));
  EXPECT_NE(d.find("two rounds; one CTA per row has no round to save"), std::string::npos) << d;
  opt = {};
  opt.fuse_pairs = false;
  const std::string f = explain(sm, make_plan(sm, prob(8192, 4096, 4096), full_device(), {}, opt));
  EXPECT_NE(f.find("1 max-and-sum-of-exp pair(s) (one round: each CTA sends its row max and the sum of exp about its "
                   "own max, merged as online softmax does, S = sum_j S_j exp(max_j - max)): two rounds, forced by "
                   "option"),
            std::string::npos)
      << f;
  const std::string l = explain(ln, make_plan(ln, prob(8192, 4096, 4096)));
  EXPECT_NE(l.find("mean and variance in one round"), std::string::npos) << l;
}

// The root stage's max-and-sum-of-exp pair over several N-tiles a CTA (the vocabulary rows' stash
// plans) takes one round, its sum online across the tiles, in row groups of up to 32 CTAs unless
// forced (a row group of 64's kernel spilled). The pair's second stage then streams the stash with
// the stage after it: one read after the round and no write-back, where two rounds read it twice
// and write it back once; the estimate drops by those. A chain whose stage after the sum ends in a
// reduction of its own (softmax into a LayerNorm) keeps the two reads; a pair below the root stage
// keeps two rounds, even forced.
TEST(Plan, MaxExpSumPairsOverSeveralNTilesInOneRound) {
  FusionSpec sm = softmax(), lsm = log_softmax(), ln = layer_norm();
  FusionSpec sm_ln = lowered([](Graph& g, Value acc) {
    return g.layer_norm(g.softmax(acc), row(g, "gamma"), row(g, "beta"));
  });
  EXPECT_EQ(plan_detail::analyze_chain(sm).max_exp_sum_pairs_streamed_together, 1);
  EXPECT_EQ(plan_detail::analyze_chain(lsm).max_exp_sum_pairs_streamed_together, 1);
  EXPECT_EQ(plan_detail::analyze_chain(sm_ln).max_exp_sum_pairs, 1);
  EXPECT_EQ(plan_detail::analyze_chain(sm_ln).max_exp_sum_pairs_streamed_together, 0);
  // A softmax after an RMSNorm: its pair sits below the root stage, where the sum cannot run
  // online (only the root's body sees each tile's values in registers): two rounds, even forced.
  FusionSpec rms_sm = lowered([](Graph& g, Value acc) { return g.softmax(g.rms_norm(acc, row(g, "gamma"))); });
  EXPECT_EQ(plan_detail::analyze_chain(rms_sm).max_exp_sum_pairs_below_root, 1);
  EXPECT_EQ(plan_detail::analyze_chain(rms_sm).max_exp_sum_pairs_streamed_together, 0);
  EXPECT_EQ(plan_detail::analyze_chain(sm).max_exp_sum_pairs_below_root, 0);
  const Problem vocab{1024, 32768, 4096, DType::BF16};
  PlanOptions opt;
  opt.row_group = 32;
  opt.tile_m = 128, opt.tile_n = 128, opt.cluster_m = 2;
  const Plan one = make_plan(lsm, vocab, full_device(), {}, opt);
  ASSERT_GT(one.kernel.n_tiles, 1);
  EXPECT_TRUE(one.fused_pairs.max_exp_sum);
  PlanOptions two_rounds = opt;
  two_rounds.fuse_pairs = false;
  const Plan two = make_plan(lsm, vocab, full_device(), {}, two_rounds);
  EXPECT_EQ(one.kernel.n_tiles, two.kernel.n_tiles);
  EXPECT_FALSE(two.fused_pairs.any());
  // One round saves a round, the write-back of the sum's stage and a read of the stash.
  EXPECT_LT(one.estimate.total_us, two.estimate.total_us);
  const std::string e = explain(lsm, one);
  EXPECT_NE(e.find("(the sum of exp online across the CTA's N-tiles)"), std::string::npos) << e;
  EXPECT_NE(e.find("re-read 1 time(s) by the 2 later stage(s)"), std::string::npos) << e;
  EXPECT_EQ(e.find("written back"), std::string::npos) << e;
  const std::string e2 = explain(lsm, two);
  EXPECT_NE(e2.find("re-read 2 time(s) by the 2 later stage(s), and written back 1 time(s)"), std::string::npos) << e2;
  EXPECT_EQ(plan_detail::analyze_chain(lsm).stash_write_backs, 1);
  EXPECT_EQ(plan_detail::analyze_chain(rms_sm).stash_write_backs, 2);
  // Row groups of 64: two rounds unless forced, and explain says why.
  PlanOptions wide = opt;
  wide.row_group = 64;
  const Plan wide_two = make_plan(lsm, vocab, full_device(), {}, wide);
  ASSERT_GT(wide_two.kernel.n_tiles, 1);
  EXPECT_FALSE(wide_two.fused_pairs.any());
  EXPECT_NE(explain(lsm, wide_two).find("one round unforced only in row groups of up to 32 CTAs"), std::string::npos)
      << explain(lsm, wide_two);
  wide.fuse_pairs = true;
  EXPECT_TRUE(make_plan(lsm, vocab, full_device(), {}, wide).fused_pairs.max_exp_sum);
  opt.fuse_pairs = true;
  const Plan rms_sm_forced = make_plan(rms_sm, vocab, full_device(), {}, opt);
  EXPECT_FALSE(rms_sm_forced.fused_pairs.any());
  EXPECT_NE(explain(rms_sm, rms_sm_forced).find("a pair below the root stage keeps every such pair at two"),
            std::string::npos)
      << explain(rms_sm, rms_sm_forced);
  PlanOptions one_tile = opt;
  one_tile.row_group = std::nullopt, one_tile.tile_m = std::nullopt, one_tile.tile_n = std::nullopt;
  one_tile.cluster_m = std::nullopt;
  const Plan rms_sm_one = make_plan(rms_sm, Problem{1024, 4096, 4096, DType::BF16}, full_device(), {}, one_tile);
  EXPECT_EQ(rms_sm_one.kernel.n_tiles, 1);
  EXPECT_TRUE(rms_sm_one.fused_pairs.max_exp_sum);  // one N-tile: below the root is fine
  // LayerNorm's pair over several N-tiles: one round (each tile's squares about its own mean, merged
  // by Chan's formula), its two stages after the round streaming the stash together; below the root
  // (a softmax into a LayerNorm) it keeps two rounds, even forced, and says why.
  EXPECT_EQ(plan_detail::analyze_chain(ln).mean_variance_pairs_streamed_together, 1);
  EXPECT_EQ(plan_detail::analyze_chain(ln).mean_variance_pairs_below_root, 0);
  EXPECT_EQ(plan_detail::analyze_chain(sm_ln).mean_variance_pairs_below_root, 1);
  const Plan ln_one = make_plan(ln, vocab, full_device(), {}, opt);
  ASSERT_GT(ln_one.kernel.n_tiles, 1);
  EXPECT_TRUE(ln_one.fused_pairs.mean_variance);
  const std::string l1 = explain(ln, ln_one);
  EXPECT_NE(l1.find("re-read 1 time(s) by the 2 later stage(s)"), std::string::npos) << l1;
  EXPECT_EQ(l1.find("written back"), std::string::npos) << l1;
  PlanOptions ln_two_rounds = opt;
  ln_two_rounds.fuse_pairs = false;
  const Plan ln_two = make_plan(ln, vocab, full_device(), {}, ln_two_rounds);
  EXPECT_FALSE(ln_two.fused_pairs.any());
  EXPECT_LT(ln_one.estimate.total_us, ln_two.estimate.total_us);
  const Plan sm_ln_forced = make_plan(sm_ln, vocab, full_device(), {}, opt);
  EXPECT_TRUE(sm_ln_forced.fused_pairs.max_exp_sum);
  EXPECT_FALSE(sm_ln_forced.fused_pairs.mean_variance);
  EXPECT_NE(explain(sm_ln, sm_ln_forced).find("a pair below the root stage keeps every such pair at two"),
            std::string::npos)
      << explain(sm_ln, sm_ln_forced);
}

// LayerNorm's pair over several N-tiles a CTA by default takes one round where a thread's
// registers hold it (calibration.h online_mean_variance_fits: 64 accumulators a thread, or row
// groups of up to 16), two elsewhere unless forced, and explain says which and why.
TEST(Plan, MeanVariancePairsOverSeveralNTilesWhereRegistersHoldThem) {
  FusionSpec ln = layer_norm();
  const Plan long_rows = make_plan(ln, prob(1152, 32768, 1024));  // 64x128 in row groups of 32
  ASSERT_GT(long_rows.kernel.n_tiles, 1);
  ASSERT_EQ(long_rows.kernel.accumulators(), 64);
  EXPECT_TRUE(long_rows.fused_pairs.mean_variance);
  const Plan wide = make_plan(ln, prob(1024, 32768, 4096));  // 128x128 in row groups of 32
  ASSERT_GT(wide.kernel.n_tiles, 1);
  ASSERT_EQ(wide.kernel.accumulators(), 128);
  ASSERT_GT(wide.kernel.row_peers(), 16);
  EXPECT_FALSE(wide.fused_pairs.any());
  const std::string e = explain(ln, wide);
  EXPECT_NE(e.find("online_mean_variance_fits"), std::string::npos) << e;
  PlanOptions opt;
  opt.fuse_pairs = true;
  EXPECT_TRUE(make_plan(ln, prob(1024, 32768, 4096), full_device(), {}, opt).fused_pairs.mean_variance);
  opt = {};
  opt.tile_m = 128, opt.tile_n = 128, opt.row_group = 16;  // 4 N-tiles, 16 peers
  const Plan sixteen = make_plan(ln, prob(4096, 8192, 4096), full_device(), {}, opt);
  ASSERT_EQ(sixteen.kernel.n_tiles, 4);
  EXPECT_TRUE(sixteen.fused_pairs.mean_variance);
}

// The stash is bf16 about each tile's row centers (KernelConfig::stash_centers) exactly where the
// root stage's pair runs online over several N-tiles and every output read from the stash is
// bf16 (the pair's own statistics are not); fp32 otherwise (two rounds, an f32 [M, N] output, a
// later reduction's f32 statistic, a later stage writing a tile value back); a
// forced bf16 stash takes the centers where they exist. The workspace is sized with the centers;
// a plan edited to centers the kernel cannot give is refused before the JIT.
TEST(Plan, StashBf16AboutRowCentersWhereTheRootPairRunsOnline) {
  FusionSpec ln = layer_norm(), sm = softmax(), lsm = log_softmax();
  const Plan p = make_plan(ln, prob(1152, 32768, 1024));  // 64x128, row groups of 32, 8 N-tiles
  ASSERT_EQ(p.strategy(), RowStrategy::WorkspaceStash);
  EXPECT_TRUE(p.fused_pairs.mean_variance);
  EXPECT_EQ(p.kernel.stash_elem_bytes, 2);
  EXPECT_TRUE(p.kernel.stash_centers);
  EXPECT_EQ(p.kernel.stash_bytes_per_wg(), (p.kernel.n_tiles - 1) * (64 * 128 * 2 + 64 * 16));
  EXPECT_EQ(p.workspace_bytes, p.grid_ctas * p.kernel.stash_workspace_bytes_per_cta());
  EXPECT_NE(explain(ln, p).find("bf16 about each tile's row centers"), std::string::npos) << explain(ln, p);
  const Plan s = make_plan(sm, prob(1024, 32768, 4096));
  EXPECT_TRUE(s.fused_pairs.max_exp_sum);
  EXPECT_TRUE(s.kernel.stash_centers);
  // An f32 output: fp32 (a bf16 stash would round more coarsely than the graph stores its output).
  const Plan l = make_plan(lsm, prob(1024, 32768, 4096));
  ASSERT_GT(l.kernel.n_tiles, 1);
  EXPECT_EQ(l.kernel.stash_elem_bytes, 4);
  EXPECT_FALSE(l.kernel.stash_centers);
  // Two rounds: no online statistic to center on; fp32, or plain bf16 where forced.
  PlanOptions two;
  two.fuse_pairs = false;
  const Plan t = make_plan(ln, prob(1152, 32768, 1024), full_device(), {}, two);
  EXPECT_EQ(t.kernel.stash_elem_bytes, 4);
  EXPECT_FALSE(t.kernel.stash_centers);
  two.stash_bytes = 2;
  const Plan tb = make_plan(ln, prob(1152, 32768, 1024), full_device(), {}, two);
  EXPECT_EQ(tb.kernel.stash_elem_bytes, 2);
  EXPECT_FALSE(tb.kernel.stash_centers);
  PlanOptions fp32;
  fp32.stash_bytes = 4;
  EXPECT_FALSE(make_plan(ln, prob(1152, 32768, 1024), full_device(), {}, fp32).kernel.stash_centers);
  PlanOptions bf16_one;
  bf16_one.stash_bytes = 2, bf16_one.fuse_pairs = true;
  const Plan fb = make_plan(lsm, prob(1024, 32768, 4096), full_device(), {}, bf16_one);  // f32 out, bf16 forced
  EXPECT_TRUE(fb.fused_pairs.max_exp_sum);
  EXPECT_TRUE(fb.kernel.stash_centers);
  // LayerNorm's statistics stored as f32 (rstd): the pair's statistics are taken from the values
  // unrounded, so bf16 about the centers. A later reduction's f32 statistic reads the stashed
  // values: fp32.
  const auto with_rstd = [](bool later_statistic) {
    Graph g;
    Value x = g.input("x", DType::BF16, {Dim::of("M"), Dim::of("K")});
    Value wt = g.input("w", DType::BF16, {Dim::of("N"), Dim::of("K")});
    Value h = g.matmul(x, wt) + row(g, "bias");
    Value mu = g.reduce(ReduceOp::Mean, h);
    Value d = h - mu;
    Value rstd = g.unary(UnaryOp::Rsqrt, g.reduce(ReduceOp::Mean, d * d) + 1e-5);
    Value y = d * rstd;
    g.output(y, "y", DType::BF16);
    g.output(rstd, "rstd", DType::F32);
    if (later_statistic) g.output(g.reduce(ReduceOp::Sum, y * y), "y_sq", DType::F32);
    return lower(g).regions.at(0).spec;
  };
  FusionSpec stats = with_rstd(false);
  const Plan st = make_plan(stats, prob(1152, 32768, 1024));
  ASSERT_GT(st.kernel.n_tiles, 1);
  EXPECT_TRUE(st.fused_pairs.mean_variance);
  EXPECT_EQ(st.kernel.stash_elem_bytes, 2);
  EXPECT_TRUE(st.kernel.stash_centers);
  FusionSpec later = with_rstd(true);
  const Plan lt = make_plan(later, prob(1152, 32768, 1024));
  ASSERT_GT(lt.kernel.n_tiles, 1);
  EXPECT_TRUE(lt.fused_pairs.mean_variance);
  EXPECT_EQ(lt.kernel.stash_elem_bytes, 4);
  // Centers the kernel cannot give (two rounds) are refused by name before the JIT.
  Plan edited = t;
  edited.kernel.stash_elem_bytes = 2, edited.kernel.stash_centers = true;
  edited.workspace_bytes = edited.grid_ctas * edited.kernel.stash_workspace_bytes_per_cta();
  ASSERT_NE(stash_centers_refused(ln, edited), nullptr);
  EXPECT_THROW(emit(ln, edited), Error);
  // Softmax into a LayerNorm: the LayerNorm's stage writes its input back into the stash.
  FusionSpec into_ln =
      lowered([](Graph& g, Value acc) { return g.layer_norm(g.softmax(acc) * 100.0, row(g, "gamma"), row(g, "beta")); });
  const Plan w = make_plan(into_ln, prob(1152, 32768, 1024));
  ASSERT_GT(w.kernel.n_tiles, 1);
  EXPECT_FALSE(w.kernel.stash_centers);
  EXPECT_EQ(w.kernel.stash_elem_bytes, 4);
  // The kernel's own check: centers only on a bf16 stash over several N-tiles.
  KernelConfig k = p.kernel;
  k.stash_elem_bytes = 4;
  EXPECT_NE(check(k), nullptr);
  k = p.kernel;
  k.n_tiles = 1, k.stash_space = StashSpace::None;
  EXPECT_NE(check(k), nullptr);
}

// PingPong jobs of 8 or more N-tiles take the tensor cores a pair at a time in TurnOrder
// (calibration.h turn_lead_wanted): the vocabulary rows; not jobs of a few tiles, nor plans of
// one N-tile a job. Forced either way (an A/B); a lead where it changes nothing is named.
TEST(Plan, LongJobsTakeTheTensorCoresAPairAtATime) {
  for (const Gpu gpu : {Gpu::H100, Gpu::H200}) {
    const DeviceModel dev = multi_tile_model(gpu);
    PlanOptions square;  // 128x128 tiles: 8 N-tiles a job in row groups of 32
    square.tile_m = 128, square.tile_n = 128;
    const Plan vocab = make_plan(softmax(), prob(1024, 32768, 4096), dev, {}, square);
    ASSERT_GE(vocab.kernel.n_tiles, kTileTurnsMinTiles) << explain(softmax(), vocab);
    EXPECT_EQ(vocab.kernel.turn_lead, kTurnLead);
    EXPECT_TRUE(vocab.kernel.tile_turns());
    EXPECT_NE(explain(softmax(), vocab).find("two jobs' tiles in turn"), std::string::npos);
    PlanOptions off = square, two = square;
    off.turn_lead = 0, two.turn_lead = 2;
    EXPECT_FALSE(make_plan(softmax(), prob(1024, 32768, 4096), dev, {}, off).kernel.tile_turns());
    EXPECT_EQ(make_plan(softmax(), prob(1024, 32768, 4096), dev, {}, two).kernel.turn_lead, 2);
    // Several pairs a CTA (4096 rows: 8 jobs a CTA): a job at a time.
    const Plan pairs = make_plan(softmax(), prob(4096, 32768, 4096), dev, {}, square);
    ASSERT_GE(pairs.kernel.n_tiles, kTileTurnsMinTiles);
    EXPECT_EQ(pairs.kernel.turn_lead, 0) << explain(softmax(), pairs);
    // Fewer N-tiles a job (64x256, forced: 4): a job at a time.
    PlanOptions wide;
    wide.tile_m = 64, wide.tile_n = 256;
    const Plan four = make_plan(softmax(), prob(1024, 32768, 4096), dev, {}, wide);
    ASSERT_LT(four.kernel.n_tiles, kTileTurnsMinTiles);
    EXPECT_EQ(four.kernel.turn_lead, 0);
    const Plan one_tile = make_plan(layer_norm(), prob(8192, 4096, 4096), dev);
    EXPECT_EQ(one_tile.kernel.turn_lead, 0);
    const Plan forced = make_plan(layer_norm(), prob(8192, 4096, 4096), dev, {}, two);
    EXPECT_EQ(forced.kernel.turn_lead, 0);
    EXPECT_NE(explain(layer_norm(), forced).find("--turn-lead 2"), std::string::npos) << explain(layer_norm(), forced);
  }
  PlanOptions bad;
  bad.turn_lead = -1;
  EXPECT_THROW(make_plan(softmax(), prob(1024, 32768, 4096), full_device(), {}, bad), Error);
}

// Stash plans of several jobs a CTA leave PingPong 64x256 tiles for the ones that measured faster
// (calibration.h stash_tile_refused): the vocabulary softmax takes 128-row tiles (cooperative
// 128x256 since calibration.h cooperative_stash_taken), LayerNorm at 1152 x 32768 x 1024 64x128.
// Forced, 64x256 stays; with one job a CTA the rule does not apply.
TEST(Plan, StashPlansOfSeveralJobsLeaveWidePingPongTiles) {
  for (const Gpu gpu : {Gpu::H100, Gpu::H200}) {
    const DeviceModel dev = multi_tile_model(gpu);
    const Plan vocab = make_plan(softmax(), prob(1024, 32768, 4096), dev);
    EXPECT_EQ(vocab.kernel.tile_m, 128) << explain(softmax(), vocab);
    const Plan ln = make_plan(layer_norm(), prob(1152, 32768, 1024), dev);
    EXPECT_GT(ln.kernel.n_tiles, 1);
    EXPECT_EQ(ln.kernel.tile_m, 64) << explain(layer_norm(), ln);
    EXPECT_EQ(ln.kernel.tile_n, 128);
    PlanOptions wide;
    wide.tile_m = 64, wide.tile_n = 256;
    const Plan forced = make_plan(layer_norm(), prob(1152, 32768, 1024), dev, {}, wide);
    EXPECT_EQ(forced.kernel.tile_n, 256);
    EXPECT_GT(forced.kernel.n_tiles, 1);
  }
  KernelConfig k;
  k.tile_m = 64, k.tile_n = 256, k.wgs_per_tile = 1, k.n_tiles = 4, k.stash_elem_bytes = 4;
  EXPECT_TRUE(stash_tile_refused(k, 2));
  EXPECT_FALSE(stash_tile_refused(k, 1));  // one job a CTA
  KernelConfig no_stash = k;               // one N-tile a job, or no tile value carried
  no_stash.stash_elem_bytes = 0;
  EXPECT_FALSE(stash_tile_refused(no_stash, 4));
  KernelConfig square = k;
  square.tile_m = 128, square.tile_n = 128, square.n_tiles = 8;
  EXPECT_FALSE(stash_tile_refused(square, 2));
}

// Cooperative 128x256 jobs of several N-tiles (both warp groups on each tile, each with its own
// stash of its 64 rows): the vocabulary rows take them (both GPUs' models), in row groups of at
// most 16 peers (calibration.h cooperative_stash_taken); forced ones over 32 peers are built as
// asked; the DSMEM channels refuse them.
TEST(Plan, CooperativeJobsOfSeveralNTilesWhereTheirKernelsFit) {
  for (const Gpu gpu : {Gpu::H100, Gpu::H200}) {
    const DeviceModel dev = multi_tile_model(gpu);
    const Plan vocab = make_plan(softmax(), prob(1024, 32768, 4096), dev);
    EXPECT_EQ(vocab.kernel.wgs_per_tile, 2) << explain(softmax(), vocab);
    EXPECT_GT(vocab.kernel.n_tiles, 1) << explain(softmax(), vocab);
    EXPECT_LE(vocab.kernel.row_peers(), 16) << explain(softmax(), vocab);
    PlanOptions wide;  // 32 peers: the search's own plans keep away (their kernels spill), forced it is built
    wide.tile_m = 128, wide.tile_n = 256, wide.cluster_m = 2, wide.row_group = 32;
    const Plan forced_wide = make_plan(softmax(), prob(1152, 32768, 1024), dev, {}, wide);
    EXPECT_EQ(forced_wide.kernel.n_tiles, 4);
    const Plan unforced = make_plan(softmax(), prob(1152, 32768, 1024), dev);
    EXPECT_FALSE(unforced.kernel.wgs_per_tile > 1 && unforced.kernel.n_tiles > 1 && unforced.kernel.row_peers() > 16)
        << explain(softmax(), unforced);
    PlanOptions coop;
    coop.tile_m = 128, coop.tile_n = 256, coop.cluster_m = 2, coop.row_group = 16;
    const Plan forced = make_plan(softmax(), prob(1024, 32768, 4096), dev, {}, coop);
    EXPECT_EQ(forced.kernel.wgs_per_tile, 2);
    EXPECT_EQ(forced.kernel.n_tiles, 8);
    EXPECT_TRUE(forced.kernel.stash_centers);
    EXPECT_EQ(forced.kernel.stash_bytes_per_wg(), 7 * (64 * 256 * 2 + 64 * 16));
    EXPECT_EQ(check(forced.kernel), nullptr);
    KernelConfig dsmem = forced.kernel;  // the DSMEM channels pair one warp group with one tile
    dsmem.aggregation = Aggregation::PeerToPeer;
    ASSERT_NE(check(dsmem), nullptr);
    EXPECT_NE(std::string(check(dsmem)).find("cooperative job"), std::string::npos) << check(dsmem);
  }
}

}  // namespace
}  // namespace comfuse
