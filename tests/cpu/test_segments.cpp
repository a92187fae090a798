// Per-segment reductions (graph.h Node::segment: per-head norms such as Qwen 3's and Gemma 3's
// q/k norms) through every layer the CPU sees: the graph builder and text format, the fp64
// executors, Φ (the spec's segment, classes and periodic row vectors; what it refuses and why),
// the planner (tiles of one segment, no exchange) and Ψ.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "comfuse/emit.h"
#include "comfuse/interp.h"
#include "comfuse/lower.h"
#include "comfuse/plan.h"
#include "comfuse/text.h"
#include "expect_error.h"

namespace comfuse {
namespace {

using test::expect_error;

// acc = x[M, K] x w[N, K]; N is heads x seg columns.
struct Heads {
  Graph g;
  Value acc;
  explicit Heads(BLayout layout = BLayout::NK) {
    Value x = g.input("x", DType::BF16, {Dim::of("M"), Dim::of("K")});
    Value w = g.input("w", DType::BF16,
                      layout == BLayout::NK ? Shape{Dim::of("N"), Dim::of("K")} : Shape{Dim::of("K"), Dim::of("N")});
    acc = g.matmul(x, w, layout);
  }
  Value vec(const std::string& name, int64_t n, DType dt = DType::BF16) { return g.input(name, dt, {Dim::of(n)}); }
};

Bindings dims(int64_t m, int64_t n, int64_t k) { return {{"M", m}, {"N", n}, {"K", k}}; }

// run_lowered (each region through its Fusion Spec) against run_graph on random inputs, every
// output within `rel` (what a region stores for a consumer outside it is rounded to f32).
void expect_lowered_matches(const Graph& g, const LoweringResult& r, const Bindings& d, uint64_t seed, double rel) {
  std::mt19937_64 rng(seed);
  const TensorMap in = random_inputs(g, d, rng);
  const TensorMap want = run_graph(g, d, in), got = run_lowered(g, r, d, in);
  for (const GraphOutput& o : g.outputs()) {
    const Tensor &a = got.at(o.name), &b = want.at(o.name);
    ASSERT_EQ(a.shape, b.shape) << o.name;
    for (size_t i = 0; i < b.data.size(); ++i)
      ASSERT_NEAR(a.data[i], b.data[i], rel * (1 + std::fabs(b.data[i]))) << o.name << "[" << i << "]";
  }
}

// y[r, c] by hand: RMSNorm of row r's segment holding column c, times gamma[c mod seg].
Tensor hand_head_rms_norm(const Tensor& acc, const Tensor& gamma, int64_t seg, double eps) {
  const int64_t M = acc.shape[0], N = acc.shape[1];
  Tensor y = acc;
  for (int64_t r = 0; r < M; ++r)
    for (int64_t s0 = 0; s0 < N; s0 += seg) {
      double ss = 0;
      for (int64_t c = s0; c < s0 + seg; ++c) ss += acc.data[r * N + c] * acc.data[r * N + c];
      const double rstd = 1.0 / std::sqrt(ss / double(seg) + eps);
      for (int64_t c = s0; c < s0 + seg; ++c) y.data[r * N + c] = acc.data[r * N + c] * rstd * gamma.data[c - s0];
    }
  return y;
}

TEST(Segments, GraphKeepsTheShapeAndReadsTheVectorPeriodically) {
  Heads t;
  Value y = t.g.rms_norm(t.acc, t.vec("gamma", 8), 1e-6, 8);
  t.g.output(y, "y", DType::F32);
  t.g.output(t.acc, "acc", DType::F32);
  EXPECT_EQ(y.node().shape, (Shape{Dim::of("M"), Dim::of("N")}));
  EXPECT_EQ(y.node().segment, 8);
  std::mt19937_64 rng(3);
  const Bindings d = dims(5, 24, 16);
  const TensorMap in = random_inputs(t.g, d, rng);
  const TensorMap out = run_graph(t.g, d, in);
  const Tensor want = hand_head_rms_norm(out.at("acc"), in.at("gamma"), 8, 1e-6);
  const Tensor& got = out.at("y");
  ASSERT_EQ(got.shape, want.shape);
  // N bound to no whole number of runs: refused in the user's names, before any arithmetic.
  expect_error([&] { run_graph(t.g, dims(5, 20, 16), in); }, "N = 20, is not a whole number of runs of 8 columns");
  // y is stored as f32: within its rounding.
  for (size_t i = 0; i < want.data.size(); ++i) ASSERT_NEAR(got.data[i], want.data[i], 1e-6 * (1 + std::fabs(want.data[i]))) << i;
}

TEST(Segments, GraphRefusesWhatHasNoMeaning) {
  Heads t;
  expect_error([&] { t.g.reduce(ReduceOp::Sum, t.acc, 0, 8); }, "last dim");
  expect_error([&] { t.g.reduce(ReduceOp::Sum, t.acc, -1, -4); }, "segment = -4");
  Value c = t.g.input("c", DType::BF16, {Dim::of("M"), Dim::of(100)});
  expect_error([&] { t.g.reduce(ReduceOp::Mean, c, -1, 64); }, "whole number of segments of 64");
  Value a = t.g.reduce(ReduceOp::Mean, t.acc, -1, 64), b = t.g.reduce(ReduceOp::Mean, t.acc, -1, 128);
  expect_error([&] { t.g.binary(BinaryOp::Add, a, b); }, "runs of 64 and of 128");
  // A vector of another length than the segment does not broadcast periodically.
  expect_error([&] { t.g.binary(BinaryOp::Mul, t.acc + a, t.vec("g32", 32)); }, "do not broadcast");
}

TEST(Segments, TextFormatRoundTrips) {
  const std::string src =
      "input a: bf16[M, K]\ninput w: bf16[N, K]\ninput gamma: bf16[128]\ninput beta: f32[128]\n"
      "x = matmul(a, w)\ny = layer_norm(x, gamma, beta, eps=1e-5, segment=128)\n"
      "z = sum(x, segment=128)\np = softmax(x, segment=128)\nq = l2_normalize(x, segment=128)\n"
      "output y: bf16\noutput z: f32\noutput p: bf16\noutput q: bf16\n";
  const Graph g = parse_graph(src);
  const Graph again = parse_graph(print_graph(g));
  EXPECT_EQ(print_graph(again), print_graph(g));
  EXPECT_NE(print_graph(g).find("segment=128"), std::string::npos);
  expect_error([&] { parse_graph("input a: bf16[M, K]\ninput w: bf16[N, K]\nx = matmul(a, w)\ny = rms_norm(x, segment=0)\n"
                                 "output y: bf16\n"); },
               "positive whole column count");
}

TEST(Segments, PhiBuildsOneSegmentedSpec) {
  Heads t;
  Value h = t.acc + t.g.input("bias", DType::BF16, {Dim::of("N")});
  t.g.output(h, "h", DType::BF16);
  t.g.output(t.g.rms_norm(h, t.vec("gamma", 128), 1e-6, 128), "y", DType::BF16);
  const LoweringResult r = lower(t.g);
  ASSERT_EQ(r.regions.size(), 1u) << describe(t.g, r);
  EXPECT_TRUE(r.fallbacks.empty()) << describe(t.g, r);
  const FusionSpec& fs = r.regions[0].spec;
  EXPECT_EQ(fs.segment, 128);
  EXPECT_EQ(fs.reduction_count(), 1);
  // The statistic's stage is per row; the bias is a row of N, gamma one of a segment, periodic.
  const Spec& post = fs.root.children.at(0);
  EXPECT_EQ(post.nodes.at(0).value_class, ValueClass::Col);
  int periodic = 0, plain = 0;
  for (const RuntimeArg& a : fs.args)
    if (a.role == ArgRole::RowVector) (periodic_arg(fs, a) ? periodic : plain)++;
  EXPECT_EQ(periodic, 1);
  EXPECT_EQ(plain, 1);
  verify(fs);
  EXPECT_EQ(parse_spec(print(fs)), fs);
  // verify() refuses what no per-segment kernel is: a per-row output, a batch.
  FusionSpec col_out = fs;
  col_out.args.back().value_class = ValueClass::Col;
  expect_error([&] { verify(col_out); }, "stores tiles only");
  FusionSpec batched = fs;
  batched.batch = Dim::of("B");
  expect_error([&] { verify(batched); }, "unbatched, ungated");

  // The kernel's reading of the spec against the graph's, on random inputs.
  expect_lowered_matches(t.g, r, dims(7, 384, 40), 11, 1e-9);
}

TEST(Segments, PhiRefusesMixturesAndKeepsStatisticsInside) {
  {  // a whole-row reduction after a per-head one: one kernel reduces either
    Heads t;
    Value y = t.g.rms_norm(t.acc, t.vec("gamma", 64), 1e-6, 64);
    t.g.output(t.g.softmax(y), "p", DType::BF16);
    const LoweringResult r = lower(t.g);
    ASSERT_EQ(r.regions.size(), 1u);
    EXPECT_EQ(r.regions[0].spec.segment, 64);
    EXPECT_NE(describe(t.g, r).find("one kernel reduces either"), std::string::npos) << describe(t.g, r);
  }
  {  // the per-head statistic as an output: it leaves the kernel, and the norm computed from it too
    Heads t;
    Value ms = t.g.reduce(ReduceOp::Mean, t.g.unary(UnaryOp::Square, t.acc), -1, 128);
    Value rstd = t.g.unary(UnaryOp::Rsqrt, ms + 1e-6);
    t.g.output(t.acc * rstd, "y", DType::BF16);
    t.g.output(rstd, "rstd", DType::F32);
    const LoweringResult r = lower(t.g);
    ASSERT_EQ(r.regions.size(), 1u);
    EXPECT_NE(describe(t.g, r).find("per-segment statistic"), std::string::npos) << describe(t.g, r);
    // The statistic and what it feeds leave; the square of the tile stays, stored for them.
    EXPECT_EQ(r.regions[0].spec.reduction_count(), 0) << describe(t.g, r);
    EXPECT_EQ(r.regions[0].spec.segment, 0) << describe(t.g, r);
    expect_lowered_matches(t.g, r, dims(3, 256, 24), 5, 1e-9);
  }
  {  // a vector periodic against a value segmented outside the GEMM (a reduction of an input),
     // admitted with the region's segment; the region's only segmented reduction then leaves
     // (its statistic an output): the vector's consumer leaves with it, not read as a scalar
    Heads t;
    Value s = t.g.reduce(ReduceOp::Sum, t.acc, -1, 4);
    Value l = t.g.reduce(ReduceOp::Sum, t.g.input("t", DType::BF16, {Dim::of("M"), Dim::of("N")}), -1, 4);
    Value y = t.acc * l * t.vec("v", 4);
    t.g.output(y, "y", DType::F32);
    t.g.output(s, "s", DType::F32);
    const LoweringResult r = lower(t.g);
    ASSERT_EQ(r.regions.size(), 1u);
    EXPECT_EQ(r.regions[0].spec.segment, 0) << describe(t.g, r);
    EXPECT_NE(describe(t.g, r).find("operand 'v' of shape [4] repeats every 4 columns"), std::string::npos)
        << describe(t.g, r);
    verify(r.regions[0].spec);
    // The region stores the GEMM's tile for the statistic (as f32): within its rounding.
    expect_lowered_matches(t.g, r, dims(3, 12, 5), 9, 1e-6);
  }
}

TEST(Segments, PlannerTakesTilesOfOneSegment) {
  for (const int64_t seg : {64, 128, 256})
    for (const Bindings& d : {dims(1, 4096, 4096), dims(8, 1024, 2048), dims(300, 2048, 512), dims(4096, 4096, 4096)}) {
      SCOPED_TRACE(fmt::format("segment {}, {} x {} x {}", seg, d.at("M"), d.at("N"), d.at("K")));
      Heads t;
      t.g.output(t.g.rms_norm(t.acc, t.vec("gamma", seg), 1e-6, seg), "y", DType::BF16);
      const FusionSpec fs = lower(t.g).regions.at(0).spec;
      const Plan p = make_plan(fs, problem_of(fs, d));
      EXPECT_EQ(p.kernel.tile_n, seg);
      EXPECT_EQ(p.kernel.row_segment, seg);
      EXPECT_TRUE(p.kernel.row_reduction);
      EXPECT_FALSE(p.kernel.cross_cta_reduction());
      EXPECT_EQ(p.kernel.n_tiles, 1);
      EXPECT_EQ(check(p.kernel), nullptr);
      const EmittedKernel k = emit(fs, p);
      EXPECT_NE(k.source.find(fmt::format(".row_segment = {}", seg)), std::string::npos);
      EXPECT_NE(k.source.find(fmt::format("RowBroadcast<0, cutlass::bfloat16_t, {}>", seg)), std::string::npos) << k.source;
      EXPECT_NE(k.source.find(fmt::format(", 0, {}>", seg)), std::string::npos);  // Reduction<..., Pair 0, Segment>
    }
}

TEST(Segments, PlannerRefusesWhatNoTileSpans) {
  auto spec = [](int64_t seg) {
    Heads t;
    t.g.output(t.g.rms_norm(t.acc, t.vec("gamma", seg), 1e-6, seg), "y", DType::BF16);
    return lower(t.g).regions.at(0).spec;
  };
  const FusionSpec s96 = spec(96), s128 = spec(128);
  expect_error([&] { make_plan(s96, problem_of(s96, dims(8, 960, 64))); }, "runs of 96 columns");
  expect_error([&] { make_plan(s128, problem_of(s128, dims(8, 1000, 64))); }, "N = 1000 is not a whole number");
  PlanOptions o;
  o.tile_n = 64;
  expect_error([&] { make_plan(s128, problem_of(s128, dims(8, 1024, 64)), o); }, "tile_n = 64");
  PlanOptions agg;
  agg.aggregation = Aggregation::L2Exchange;
  expect_error([&] { make_plan(s128, problem_of(s128, dims(8, 1024, 64)), agg); }, "inside each tile");
  // Row groups only schedule the tiles: forced, no exchange.
  PlanOptions rg;
  rg.row_group = 4;
  const Plan grouped = make_plan(s128, problem_of(s128, dims(300, 1024, 64)), rg);
  EXPECT_EQ(grouped.kernel.row_group, 4);
  EXPECT_FALSE(grouped.kernel.cross_cta_reduction());
  EXPECT_EQ(grouped.kernel.aggregation, Aggregation::None);
  // A forced split-K still spans one segment a tile.
  PlanOptions ks;
  ks.k_splits = 4;
  const Plan p = make_plan(s128, problem_of(s128, dims(8, 1024, 4096)), ks);
  EXPECT_EQ(p.kernel.k_splits, 4);
  EXPECT_EQ(p.kernel.row_segment, 128);
}

}  // namespace
}  // namespace comfuse
