// The planner's storage step: a consumer warp group's epilogue SMEM beside the mainloop ring,
// the ring's depth and its price, and where an epilogue's [M, N] inputs live (L2, or one ring
// slot after the tile's k-blocks) and its outputs' staging (a later stage's through the root's).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <regex>

#include "comfuse/emit.h"
#include "comfuse/lower.h"
#include "comfuse/plan.h"
#include "cpu/plan_specs.h"
#include "plan/calibration.h"

namespace comfuse {
namespace {

using namespace plan_specs;

// An [M, N] epilogue input keeps nothing in SMEM of its own (TileInput reads L2 after a
// prefetch, or one mainloop ring slot after the tile's k-blocks), so a residual costs the
// mainloop no ring stages: the residual norm plans exactly the plain norm's kernel, bf16 or f32
// residual; storing h as well costs nothing either (y writes through h's staging). The shapes
// are the measured ones.
TEST(Plan, TileInputsKeepNothingInSmem) {
  const DeviceModel dev;
  for (const bool layer : {false, true}) {
    const Problem pr = layer ? prob(8192, 1024, 4096) : prob(8192, 4096, 4096);
    const Plan plain = make_plan(layer ? layer_norm() : rms_norm(), pr, dev);
    for (const DType res : {DType::BF16, DType::F32}) {
      SCOPED_TRACE(fmt::format("{}, {} residual", layer ? "LayerNorm" : "RMSNorm", name_of(res)));
      const Plan p = make_plan(residual_norm(layer, res, false), pr, dev);
      EXPECT_EQ(p.kernel.tile_m, plain.kernel.tile_m);
      EXPECT_EQ(p.kernel.tile_n, plain.kernel.tile_n);
      EXPECT_EQ(p.kernel.epilogue_smem_bytes, plain.kernel.epilogue_smem_bytes);
      EXPECT_EQ(p.kernel.ring_stages, plain.kernel.ring_stages);
      EXPECT_EQ(p.smem.total(), plain.smem.total());

      const Plan ph = make_plan(residual_norm(layer, res, true), pr, dev);
      ASSERT_EQ(ph.kernel.tile_m, plain.kernel.tile_m);
      ASSERT_EQ(ph.kernel.tile_n, plain.kernel.tile_n);
      // h's bf16 staging subtile moves to the root stage's block, and y (bf16, a later stage)
      // writes through it (FusionSpec::staging_borrows): no more SMEM than the plain norm's.
      EXPECT_EQ(ph.kernel.epilogue_smem_bytes, plain.kernel.epilogue_smem_bytes);
      EXPECT_EQ(ph.kernel.ring_stages, plain.kernel.ring_stages);
      EXPECT_TRUE(std::regex_search(emit(residual_norm(layer, DType::BF16, true), ph).source,
                                    std::regex(R"(epi::Store<1, cutlass::bfloat16_t, \d+, 0>)")))
          << "y's Store borrows output slot 0's (h's) staging";
    }
  }
}

// A residual's reads cost the epilogue latency-bound passes (calibration.h
// row_group_tile_input_pass_us): at 8192 x 1024 x 1024 the job's epilogue is twice the
// mainloop, and the estimate meets the measured 47.8-48.4 us (128x128 row groups of 8, which
// measured faster than 64x128's 53.4 us and as fast as 64x256's 47.4), where it was 40.0 without.
// (Read from L2: the ring's SMEM reads are TileInputsRideTheRing's.) Among PingPong tiles (tile_n
// 128: the unforced plan is cooperative 128x256, both warp groups' epilogues at once, 40.8 us).
TEST(Plan, ResidualReadsArePricedInTheEpilogue) {
  const DeviceModel dev;
  const FusionSpec s = residual_norm(true, DType::BF16, true);
  PlanOptions from_l2;
  from_l2.ring_inputs = false;
  from_l2.tile_n = 128;
  const Plan p = make_plan(s, prob(8192, 1024, 1024), dev, PlannerTunables{}, from_l2);
  EXPECT_EQ(p.kernel.tile_m, 128);
  EXPECT_EQ(p.kernel.tile_n, 128);
  EXPECT_NEAR(p.estimate.total_us, 48.0, 4.0);
  EXPECT_NE(explain(s, p).find("reads its 1 tile input(s) in 3.3 us (2 pass(es)"), std::string::npos) << explain(s, p);
  PlanOptions pingpong;
  pingpong.tile_n = 128;
  const Plan plain = make_plan(layer_norm(), prob(8192, 1024, 1024), dev, PlannerTunables{}, pingpong);
  EXPECT_GT(p.estimate.total_us, plain.estimate.total_us + 8.0);
  const Plan unforced = make_plan(s, prob(8192, 1024, 1024), dev);
  EXPECT_EQ(unforced.kernel.wgs_per_tile, 2);
  EXPECT_LT(unforced.estimate.total_us, p.estimate.total_us);
}

// The root stage's 16-bit residual rides the mainloop's ring where one slot holds its tile (a
// tile_m x 128-byte box in the slot's A part, tile_n / tile_m more in its B part) and nothing else
// shares the slot's reads: PingPong, no split-K. The epilogue then reads SMEM, priced at
// row_group_ring_input_pass_us a pass (measured). Anything else reads L2 and says why when forced.
// Among PingPong tiles (tile_n 128; cooperative tiles read their inputs from L2).
TEST(Plan, TileInputsRideTheRing) {
  const DeviceModel dev;
  const FusionSpec s = residual_norm(true, DType::BF16, true);
  PlanOptions pingpong;
  pingpong.tile_n = 128;
  const Plan p = make_plan(s, prob(8192, 1024, 1024), dev, PlannerTunables{}, pingpong);
  EXPECT_EQ(p.kernel.tile_m, 128);  // measured the fastest with the ring too (64x128 49.2 us against 46.8)
  EXPECT_NEAR(p.estimate.total_us, 46.8, 2.0);
  EXPECT_EQ(p.kernel.ring_input_bytes, p.kernel.epi_rows() * p.kernel.tile_n * 2);
  EXPECT_EQ(check(p.kernel), nullptr);
  EXPECT_NE(explain(s, p).find("tile inputs  'residual' in the ring"), std::string::npos) << explain(s, p);
  EXPECT_NE(emit(s, p).source.find("comfuse::epi::TileInput<0, cutlass::bfloat16_t, 0>"), std::string::npos);
  PlanOptions l2 = pingpong;
  l2.ring_inputs = false;
  const Plan q = make_plan(s, prob(8192, 1024, 1024), dev, PlannerTunables{}, l2);
  EXPECT_EQ(q.kernel.ring_input_bytes, 0);
  EXPECT_NE(explain(s, q).find("tile inputs  'residual' from L2"), std::string::npos);
  EXPECT_NE(emit(s, q).source.find("comfuse::epi::TileInput<0, cutlass::bfloat16_t>"), std::string::npos);
  EXPECT_LT(p.estimate.total_us, q.estimate.total_us);
  // Every tile shape the row groups take holds one bf16 tile: 128x128 (16 + 16 KiB), 64x128, 64x256.
  for (const auto& [tm, tn] : {std::pair{128, 128}, std::pair{64, 128}, std::pair{64, 256}}) {
    PlanOptions o;
    o.tile_m = tm, o.tile_n = tn;
    EXPECT_EQ(make_plan(s, prob(8192, 1024, 1024), dev, PlannerTunables{}, o).kernel.ring_input_bytes, tm * tn * 2)
        << tm << "x" << tn;
  }
  // An f32 residual's 128x128 tile is twice a slot; split-K (decode) has no ring inputs.
  PlanOptions big;
  big.tile_m = 128, big.tile_n = 128;
  EXPECT_EQ(make_plan(residual_norm(true, DType::F32, true), prob(8192, 1024, 1024), dev, PlannerTunables{}, big)
                .kernel.ring_input_bytes, 0);
  const Plan decode = make_plan(s, prob(1, 1024, 4096), dev);
  ASSERT_GT(decode.kernel.k_splits, 1);
  EXPECT_EQ(decode.kernel.ring_input_bytes, 0);
  // Forced where it cannot be: an error that says why.
  big.ring_inputs = true;
  try {
    make_plan(residual_norm(true, DType::F32, true), prob(8192, 1024, 1024), dev, PlannerTunables{}, big);
    ADD_FAILURE() << "an f32 128x128 tile in one ring slot";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no more than one ring slot holds"), std::string::npos) << e.what();
  }
  PlanOptions none;
  none.ring_inputs = true;
  EXPECT_THROW(make_plan(layer_norm(), prob(8192, 1024, 1024), dev, PlannerTunables{}, none), Error);
  KernelConfig c;
  c.tile_m = 64, c.tile_n = 128, c.k_splits = 2, c.ring_input_bytes = 64 * 128 * 2;
  EXPECT_STREQ(check(c), "tile inputs in the ring: no split-K (only a tile's owner would read them)");
  c.k_splits = 1, c.ring_input_bytes = 4 * 64 * 128;
  EXPECT_STREQ(check(c), "tile inputs in the ring: whole TMA boxes, no more than one ring slot holds");
}

// The ring's slot is held from the tile's last MMA through its first stage's body, a FIFO stage
// the other consumer's mainloop cannot refill (calibration.h row_group_ring_input_hold_us): where
// the mainloop paces the jobs (K = 4096) that starves it and the residual is read from L2
// (MEASURED: residual RMSNorm 8192 x 4096 x 4096 0.4351 ms from L2 against 0.4606 in the ring);
// where the epilogue does (K = 1024) the ring keeps paying. explain says which and why.
TEST(Plan, TileInputsLeaveTheRingWhereItsHeldSlotStarvesTheMainloop) {
  const DeviceModel dev;
  const FusionSpec s = residual_norm(false, DType::BF16, true);
  const Plan long_k = make_plan(s, prob(8192, 4096, 4096), dev);
  EXPECT_EQ(long_k.kernel.ring_input_bytes, 0);
  EXPECT_NE(explain(s, long_k).find("not in the ring, which could carry them"), std::string::npos)
      << explain(s, long_k);
  const Plan short_k = make_plan(s, prob(4096, 4096, 1024), dev);
  EXPECT_GT(short_k.kernel.ring_input_bytes, 0);
  // Forcing the ring back prices its stall, and explain names it.
  PlanOptions ring;
  ring.ring_inputs = true;
  const Plan forced = make_plan(s, prob(8192, 4096, 4096), dev, PlannerTunables{}, ring);
  EXPECT_GT(forced.kernel.ring_input_bytes, 0);
  EXPECT_GT(forced.estimate.total_us, long_k.estimate.total_us + 16 * 1.0);
  EXPECT_NE(explain(s, forced).find("starves the other consumer's mainloop"), std::string::npos) << explain(s, forced);
}

// PlanOptions::ring_stages caps the ring (an A/B of its depth), and only where it is below what
// fits; the explain names the planner's own pick.
TEST(Plan, RingStagesOptionCapsTheRing) {
  const DeviceModel dev;
  const Problem pr = prob(8192, 1024, 1024);
  const Plan free = make_plan(residual_norm(true, DType::BF16, true), pr, dev);
  ASSERT_GT(free.kernel.ring_stages, 2);
  for (int cap : {2, free.kernel.ring_stages - 1, 8}) {
    PlanOptions opt;
    opt.ring_stages = cap;
    const Plan p = make_plan(residual_norm(true, DType::BF16, true), pr, dev, PlannerTunables{}, opt);
    EXPECT_EQ(p.kernel.ring_stages, std::min(cap, free.kernel.ring_stages)) << cap;
    EXPECT_LE(p.smem.total(), dev.smem_per_cta_bytes);
  }
  PlanOptions bad;
  bad.ring_stages = 1;
  EXPECT_THROW(make_plan(residual_norm(true, DType::BF16, true), pr, dev, PlannerTunables{}, bad), Error);
}

// A second output that cannot write through the first's staging (an f32 norm beside the bf16
// pre-norm sum: FusionSpec::staging_borrows takes the same element size only) takes its TMA
// staging from the ring; the row-group model prices the shallower ring (calibration.h: MEASURED
// 2.6x cuBLAS at two stages against 1.03x at five), so the frontend does not fuse where it loses.
TEST(Plan, ShallowRingIsPriced) {
  const FusionSpec plain = rms_norm();
  const FusionSpec residual = lowered(
      [](Graph& g, Value acc) {
        Value h = acc + g.input("residual", DType::BF16, {Dim::of("M"), Dim::of("N")});
        g.output(h, "h", DType::BF16);
        return g.rms_norm(h, row(g, "gamma"));
      },
      DType::F32);
  ASSERT_TRUE(residual.staging_borrows().empty());
  const Plan a = make_plan(plain, prob(8192, 4096, 4096), full_device(), {}, {});
  const Plan b = make_plan(residual, prob(8192, 4096, 4096), full_device(), {}, {});
  ASSERT_EQ(a.kernel.aggregation, Aggregation::L2Exchange);
  ASSERT_EQ(b.kernel.aggregation, Aggregation::L2Exchange);
  EXPECT_GE(a.kernel.ring_stages, 5);
  EXPECT_LT(b.kernel.ring_stages, a.kernel.ring_stages);
  EXPECT_GE(b.kernel.ring_stages, 4);  // the residual takes no ring stage, the f32 y's staging one
  EXPECT_GT(b.estimate.total_us, 1.1 * a.estimate.total_us) << b.estimate.total_us << " vs " << a.estimate.total_us;
  EXPECT_NE(explain(residual, b).find("ring stages: the mainloop runs at"), std::string::npos);
}

// The ring depth is known only once a candidate's epilogue buffers are: the cheapest candidate
// after that repricing wins, not the first of the order before it. Three stored tile values
// (the frontend's Llama o_proj + residual + RMSNorm stored the normed value once per view; here
// the second norm output f32, so only y writes through h's staging) leave 128x128 4 ring
// stages, as many as 64x256 (3 while the kernel budgeted 1 KiB to realign its SMEM base, when
// 64x256 won): every forced tile prices at least the chosen plan's estimate.
TEST(Plan, CheapestAfterTheRingDepthWins) {
  const FusionSpec s = lowered(
      [](Graph& g, Value acc) {
        Value h = acc + g.input("residual", DType::BF16, {Dim::of("M"), Dim::of("N")});
        g.output(h, "h", DType::BF16);
        Value y = g.rms_norm(h, row(g, "gamma"));
        g.output(y, "y2", DType::F32);
        return y;
      });
  ASSERT_EQ(s.staging_borrows().size(), 1u);  // y (bf16) through h's staging; y2 (f32) its own
  const Plan p = make_plan(s, prob(8192, 4096, 4096), full_device(), {}, {});
  ASSERT_EQ(p.kernel.aggregation, Aggregation::L2Exchange);
  for (auto [tm, tn] : {std::pair{64, 256}, std::pair{128, 128}, std::pair{64, 128}}) {
    PlanOptions opt;
    opt.tile_m = tm;
    opt.tile_n = tn;
    const Plan forced = make_plan(s, prob(8192, 4096, 4096), full_device(), {}, opt);
    EXPECT_LE(p.estimate.total_us, forced.estimate.total_us) << tm << "x" << tn;
  }
  EXPECT_EQ(p.kernel.tile_m, 128);
  EXPECT_EQ(p.kernel.tile_n, 128);
  EXPECT_EQ(p.kernel.ring_stages, 4);
}

// A second TMA-store staging buffer per output (KernelConfig::store_stages) where it fits beside
// the ring as planned, never at a ring stage's cost: bias + GELU at 2048 x 2048 x 1024 (PingPong
// 128x128, 5 stages) has the SMEM; LayerNorm's cooperative 128x256 plan there (4 stages, 12 KiB
// free against the 16 KiB two 64x64 subtiles need) keeps one, unless forced, when the ring gives up
// a stage and the plan says so. Anything but 1 or 2 is refused by name.
TEST(Plan, StoreStagingDoubledWhereItFitsBesideTheRing) {
  const DeviceModel dev;
  const Problem pr = prob(2048, 2048, 1024);
  PlanOptions one;
  one.store_stages = 1;
  const Plan gelu = make_plan(bias_gelu(), pr, dev);
  const Plan gelu_one = make_plan(bias_gelu(), pr, dev, PlannerTunables{}, one);
  EXPECT_EQ(gelu.kernel.store_stages, 2);
  EXPECT_EQ(gelu_one.kernel.store_stages, 1);
  EXPECT_EQ(gelu.kernel.ring_stages, gelu_one.kernel.ring_stages);
  EXPECT_GT(gelu.kernel.epilogue_smem_bytes, gelu_one.kernel.epilogue_smem_bytes);
  EXPECT_LE(gelu.smem.total(), dev.smem_per_cta_bytes);
  EXPECT_NE(emit(bias_gelu(), gelu).source.find(".store_stages = 2,"), std::string::npos);
  EXPECT_EQ(emit(bias_gelu(), gelu_one).source.find(".store_stages"), std::string::npos);

  const Plan ln = make_plan(layer_norm(), pr, dev);
  ASSERT_EQ(ln.kernel.wgs_per_tile, 2);
  EXPECT_EQ(ln.kernel.store_stages, 1);
  PlanOptions two;
  two.store_stages = 2;
  const Plan ln_two = make_plan(layer_norm(), pr, dev, PlannerTunables{}, two);
  EXPECT_EQ(ln_two.kernel.store_stages, 2);
  EXPECT_EQ(ln_two.kernel.ring_stages, ln.kernel.ring_stages - 1);
  EXPECT_TRUE(std::any_of(ln_two.reasons.begin(), ln_two.reasons.end(), [&](const std::string& r) {
    return r.find(fmt::format("ring {} -> {} stages", ln.kernel.ring_stages, ln.kernel.ring_stages - 1)) !=
           std::string::npos;
  }));

  PlanOptions three;
  three.store_stages = 3;
  try {
    make_plan(layer_norm(), pr, dev, PlannerTunables{}, three);
    ADD_FAILURE() << "store_stages = 3 was planned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("store_stages = 3 is not 1 or 2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace comfuse
