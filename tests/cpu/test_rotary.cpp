// Rotary position embeddings after a projection (rotate_half within each head's columns, cos and
// sin [M, head] read periodically; graph.h Graph::rope) through every layer the CPU sees: the
// graph builder and text format, the fp64 executors against a hand-written RoPE, Φ (one
// segmented spec; what it refuses and why), the planner (tiles of whole heads) and Ψ (the device
// nodes, and NVRTC's compile without spills).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "comfuse/emit.h"
#include "comfuse/interp.h"
#include "comfuse/jit.h"
#include "comfuse/runtime.h"
#include "comfuse/lower.h"
#include "comfuse/plan.h"
#include "comfuse/text.h"
#include "expect_error.h"

namespace comfuse {
namespace {

using test::expect_error;

// acc = x[M, K] x w[N, K]; N is heads of `head` columns; cos and sin [M, head].
struct Rope {
  Graph g;
  Value x, acc, cos, sin;
  explicit Rope(int64_t head) {
    x = g.input("x", DType::BF16, {Dim::of("M"), Dim::of("K")});
    Value w = g.input("w", DType::BF16, {Dim::of("N"), Dim::of("K")});
    acc = g.matmul(x, w);
    cos = g.input("cos", DType::BF16, {Dim::of("M"), Dim::of(head)});
    sin = g.input("sin", DType::BF16, {Dim::of("M"), Dim::of(head)});
  }
};

Bindings dims(int64_t m, int64_t n, int64_t k) { return {{"M", m}, {"N", n}, {"K", k}}; }

// transformers' apply_rotary_pos_emb on each head of `head` columns, by hand; `interleaved`:
// GPT-J's and Cohere's rotation of (even, odd) pairs.
Tensor hand_rope(const Tensor& q, const Tensor& cos, const Tensor& sin, int64_t head, bool interleaved = false) {
  const int64_t M = q.shape[0], N = q.shape[1], h = head / 2;
  Tensor y = q;
  for (int64_t r = 0; r < M; ++r)
    for (int64_t c = 0; c < N; ++c) {
      const int64_t j = c % head, base = r * N + c - j;
      const double rot = interleaved ? (j % 2 == 0 ? -q.data[base + j + 1] : q.data[base + j - 1])
                         : j < h     ? -q.data[base + j + h]
                                     : q.data[base + j - h];
      y.data[r * N + c] = q.data[r * N + c] * cos.data[r * head + j] + rot * sin.data[r * head + j];
    }
  return y;
}

TensorMap random_map(const Graph& g, const Bindings& d, uint64_t seed) {
  std::mt19937_64 rng(seed);
  return random_inputs(g, d, rng);
}

void expect_near(const Tensor& a, const Tensor& b, double rel, const std::string& what) {
  ASSERT_EQ(a.shape, b.shape) << what;
  for (size_t i = 0; i < b.data.size(); ++i)
    ASSERT_NEAR(a.data[i], b.data[i], rel * (1 + std::fabs(b.data[i]))) << what << "[" << i << "]";
}

TEST(Rotary, GraphMatchesTheHandWrittenRope) {
  for (const bool interleaved : {false, true})
    for (const int64_t head : {64, 128}) {
      SCOPED_TRACE(fmt::format("head {}{}", head, interleaved ? ", interleaved" : ""));
      Rope t(head);
      t.g.output(t.g.rope(t.acc, t.cos, t.sin, head, interleaved), "y", DType::F32);
      t.g.output(t.acc, "q", DType::F32);
      const Bindings d = dims(5, 3 * head, 16);
      const TensorMap in = random_map(t.g, d, 3);
      const TensorMap out = run_graph(t.g, d, in);
      // q is stored as f32: the hand-written RoPE reads it rounded.
      expect_near(out.at("y"), hand_rope(out.at("q"), in.at("cos"), in.at("sin"), head, interleaved), 1e-6, "y");
      // Either rotation twice negates.
      Rope u(head);
      Value twice = interleaved ? u.g.rotate_pairs(u.g.rotate_pairs(u.acc, head), head)
                                : u.g.rotate_half(u.g.rotate_half(u.acc, head), head);
      u.g.output(twice + u.acc, "z", DType::F32);
      for (double v : run_graph(u.g, d, random_map(u.g, d, 4)).at("z").data) ASSERT_NEAR(v, 0.0, 1e-12);
    }
}

TEST(Rotary, GraphRefusesWhatHasNoMeaning) {
  Rope t(128);
  expect_error([&] { t.g.rotate_half(t.acc, 127); }, "positive even column count");
  expect_error([&] { t.g.rotate_half(t.acc, 0); }, "positive even column count");
  expect_error([&] { t.g.rotate_half(t.g.rms_norm(t.acc, Value{}, 1e-6, 64), 128); }, "segments of 128 columns over");
  Graph g;
  Value x = g.input("x", DType::BF16, {Dim::of(4), Dim::of(200)});
  expect_error([&] { g.rotate_half(x, 128); }, "not a whole number of segments of 128");
  // cos of another width than the segment does not broadcast.
  expect_error([&] { t.g.binary(BinaryOp::Mul, t.acc, t.cos, 64); }, "the one read periodically has a last dim of the segment (64)");
  // Bound sizes: N a whole number of heads.
  Rope u(128);
  u.g.output(u.g.rope(u.acc, u.cos, u.sin, 128), "y", DType::BF16);
  std::mt19937_64 rng(1);
  expect_error([&] { run_graph(u.g, dims(4, 200, 8), random_inputs(u.g, dims(4, 256, 8), rng)); },
               "not a whole number of runs of 128");
}

TEST(Rotary, TextFormatRoundTrips) {
  const std::string src =
      "input a: bf16[M, K]\ninput w: bf16[N, K]\ninput c: bf16[M, 64]\ninput s: bf16[M, 64]\n"
      "x = matmul(a, w)\ny = rope(x, c, s, segment=64)\nr = rotate_half(x, segment=64)\nz = mul(x, c, segment=64)\n"
      "p = rope(x, c, s, segment=64, interleaved=1)\n"
      "output y: bf16\noutput r: bf16\noutput z: f32\noutput p: bf16\n";
  const Graph g = parse_graph(src);
  const std::string printed = print_graph(g);
  EXPECT_EQ(print_graph(parse_graph(printed)), printed);
  EXPECT_NE(printed.find("rotate_half(x, segment=64)"), std::string::npos) << printed;
  EXPECT_NE(printed.find(", segment=64)"), std::string::npos) << printed;
  EXPECT_NE(printed.find("rotate_pairs(x, segment=64)"), std::string::npos) << printed;
  expect_error([&] { parse_graph("input a: bf16[M, K]\ninput w: bf16[N, K]\nx = matmul(a, w)\ny = rotate_half(x)\n"
                                 "output y: bf16\n"); },
               "needs `segment=`");
}

TEST(Rotary, PhiBuildsOneSegmentedSpec) {
  Rope t(128);
  Value q = t.acc + t.g.input("bias", DType::BF16, {Dim::of("N")});  // Qwen 2's q_proj bias
  t.g.output(t.g.rope(q, t.cos, t.sin, 128), "y", DType::BF16);
  const LoweringResult r = lower(t.g);
  ASSERT_EQ(r.regions.size(), 1u) << describe(t.g, r);
  EXPECT_TRUE(r.fallbacks.empty()) << describe(t.g, r);
  const FusionSpec& fs = r.regions[0].spec;
  EXPECT_EQ(fs.segment, 128);
  EXPECT_EQ(fs.reduction_count(), 0);
  int periodic = 0;
  for (const RuntimeArg& a : fs.args)
    if (a.role == ArgRole::TileInput) {
      EXPECT_TRUE(periodic_arg(fs, a)) << a.name;
      ++periodic;
    }
  EXPECT_EQ(periodic, 2);
  EXPECT_TRUE(fs.root_tile_inputs().empty());  // read from global memory, never the ring
  verify(fs);
  EXPECT_EQ(parse_spec(print(fs)), fs);
  // The spec's reading against the graph's, ragged rows, three heads.
  const Bindings d = dims(37, 384, 40);
  const TensorMap in = random_map(t.g, d, 7);
  expect_near(run_lowered(t.g, r, d, in).at("y"), run_graph(t.g, d, in).at("y"), 1e-9, "y");
}

TEST(Rotary, PhiTakesTheNormBeforeIt) {  // Qwen 3: per-head RMSNorm, then RoPE, one kernel (Cohere: interleaved)
  for (const bool interleaved : {false, true}) {
    Rope t(128);
    Value n = t.g.rms_norm(t.acc, t.g.input("gamma", DType::BF16, {Dim::of(128)}), 1e-6, 128);
    t.g.output(t.g.rope(n, t.cos, t.sin, 128, interleaved), "y", DType::BF16);
    const LoweringResult r = lower(t.g);
    ASSERT_EQ(r.regions.size(), 1u);
    EXPECT_TRUE(r.fallbacks.empty()) << describe(t.g, r);
    EXPECT_EQ(r.regions[0].spec.reduction_count(), 1);
    EXPECT_EQ(r.regions[0].spec.segment, 128);
    EXPECT_EQ(parse_spec(print(r.regions[0].spec)), r.regions[0].spec);
    const Bindings d = dims(9, 256, 24);
    const TensorMap in = random_map(t.g, d, 9);
    expect_near(run_lowered(t.g, r, d, in).at("y"), run_graph(t.g, d, in).at("y"), 1e-9, "y");
  }
}

TEST(Rotary, PhiRefusesWhatNoKernelTakes) {
  {  // a whole-row norm after RoPE: one kernel works on whole rows or runs
    Rope t(128);
    t.g.output(t.g.layer_norm(t.g.rope(t.acc, t.cos, t.sin, 128), Value{}, Value{}), "y", DType::BF16);
    const LoweringResult r = lower(t.g);
    EXPECT_NE(describe(t.g, r).find("one kernel reduces either"), std::string::npos) << describe(t.g, r);
  }
  {  // rotate_half whose stage writes another tile value back into the registers it reads
    Rope t(128);
    Value sum = t.acc + t.g.rotate_half(t.acc, 128);
    Value ms = t.g.reduce(ReduceOp::Mean, t.g.unary(UnaryOp::Square, sum), -1, 128);
    t.g.output(sum * ms, "y", DType::BF16);
    const LoweringResult r = lower(t.g);
    ASSERT_EQ(r.regions.size(), 1u);
    EXPECT_NE(describe(t.g, r).find("reads its partner columns"), std::string::npos) << describe(t.g, r);
    const Bindings d = dims(3, 256, 8);
    const TensorMap in = random_map(t.g, d, 2);
    expect_near(run_lowered(t.g, r, d, in).at("y"), run_graph(t.g, d, in).at("y"), 1e-6, "y");
  }
  {  // a gated GEMM (silu(x W1) * x W3) then RoPE: per-segment epilogues run in ungated kernels
    Rope t(64);
    Value up = t.g.matmul(t.x, t.g.input("w3", DType::BF16, {Dim::of("N"), Dim::of("K")}));
    t.g.output(t.g.rope(t.g.unary(UnaryOp::Silu, t.acc) * up, t.cos, t.sin, 64), "y", DType::BF16);
    const LoweringResult r = lower(t.g);
    EXPECT_NE(describe(t.g, r).find("per-segment epilogues run in ungated kernels"), std::string::npos)
        << describe(t.g, r);
    for (const FusedRegion& reg : r.regions) {
      EXPECT_FALSE(reg.spec.gated() && reg.spec.segment > 0) << print(reg.spec);
      verify(reg.spec);
    }
    const Bindings d = dims(5, 128, 16);
    const TensorMap in = random_map(t.g, d, 6);
    expect_near(run_lowered(t.g, r, d, in).at("y"), run_graph(t.g, d, in).at("y"), 1e-6, "y");
  }
  {  // a rotate_half Φ leaves out for the hazard strands a per-head statistic it read: that leaves
     // too (the two evictions run to a fixpoint), so no spec stores a per-segment statistic
    Rope t(64);
    Value s1 = t.g.reduce(ReduceOp::Mean, t.g.unary(UnaryOp::Square, t.acc), -1, 64);
    Value normed = t.acc * t.g.unary(UnaryOp::Rsqrt, s1 + 1e-6);
    Value y = t.g.rotate_half(normed, 64) * s1;
    t.g.output(y * t.g.reduce(ReduceOp::Mean, y, -1, 64), "z", DType::F32);
    const LoweringResult r = lower(t.g);
    for (const FusedRegion& reg : r.regions) verify(reg.spec);
    const Bindings d = dims(4, 128, 16);
    const TensorMap in = random_map(t.g, d, 8);
    expect_near(run_lowered(t.g, r, d, in).at("z"), run_graph(t.g, d, in).at("z"), 1e-6, "z");
  }
  {  // a periodic operand's consumer does not set the region's runs: a whole-row sum still joins
    Rope t(64);
    t.g.output(t.g.binary(BinaryOp::Mul, t.acc, t.g.input("v", DType::BF16, {Dim::of(64)}), 64), "y", DType::BF16);
    t.g.output(t.acc * t.g.reduce(ReduceOp::Sum, t.acc), "z", DType::BF16);
    const LoweringResult r = lower(t.g);
    ASSERT_EQ(r.regions.size(), 1u);
    EXPECT_EQ(r.regions[0].spec.reduction_count(), 1) << describe(t.g, r);
    EXPECT_NE(describe(t.g, r).find("repeats every 64 columns"), std::string::npos) << describe(t.g, r);
  }
  {  // a periodic operand with no rotate_half or segmented reduction in the kernel leaves it
    Rope t(128);
    Value outside = t.g.rotate_half(t.g.input("u", DType::BF16, {Dim::of("M"), Dim::of("N")}), 128);
    t.g.output(t.g.binary(BinaryOp::Mul, t.acc + outside, t.cos, 128), "y", DType::BF16);
    const LoweringResult r = lower(t.g);
    EXPECT_NE(describe(t.g, r).find("repeats every 128 columns"), std::string::npos) << describe(t.g, r);
  }
}

TEST(Rotary, PlannerTakesTilesOfWholeHeads) {
  for (const bool interleaved : {false, true})
  for (const int64_t head : {64, 128, 256})
    for (const Bindings& d : {dims(1, 4096, 4096), dims(8, 1024, 2048), dims(300, 2048, 512), dims(4096, 4096, 4096)}) {
      SCOPED_TRACE(fmt::format("head {}, {} x {} x {}{}", head, d.at("M"), d.at("N"), d.at("K"),
                               interleaved ? ", interleaved" : ""));
      Rope t(head);
      t.g.output(t.g.rope(t.acc, t.cos, t.sin, head, interleaved), "y", DType::BF16);
      const FusionSpec fs = lower(t.g).regions.at(0).spec;
      const Plan p = make_plan(fs, problem_of(fs, d));
      EXPECT_EQ(p.kernel.tile_n % head, 0);
      EXPECT_EQ(p.kernel.row_segment, 0);  // no reduction: an elementwise kernel
      EXPECT_EQ(check(p.kernel), nullptr);
      const EmittedKernel k = emit(fs, p);
      EXPECT_NE(k.source.find(interleaved ? std::string("RotatePairs<0>") : fmt::format("RotateHalf<0, {}>", head)),
                std::string::npos)
          << k.source;
      EXPECT_NE(k.source.find(fmt::format("cutlass::bfloat16_t, -1, {}>", head)), std::string::npos) << k.source;
    }
  Rope t(96);
  t.g.output(t.g.rope(t.acc, t.cos, t.sin, 96), "y", DType::BF16);
  const FusionSpec s96 = lower(t.g).regions.at(0).spec;
  EXPECT_EQ(make_plan(s96, problem_of(s96, dims(8, 960, 64))).kernel.tile_n, 192);  // two heads a tile
  PlanOptions o;
  o.tile_n = 128;
  expect_error([&] { make_plan(s96, problem_of(s96, dims(8, 960, 64)), o); }, "tile_n = 128");
  expect_error([&] { make_plan(s96, problem_of(s96, dims(8, 1000, 64))); }, "N = 1000 is not a whole number");
  Rope u(80);
  u.g.output(u.g.rope(u.acc, u.cos, u.sin, 80), "y", DType::BF16);
  const FusionSpec s80 = lower(u.g).regions.at(0).spec;
  expect_error([&] { make_plan(s80, problem_of(s80, dims(8, 960, 64))); }, "runs of 80 columns");
}

// The stage and index of the spec's rotate_half (searched through the PostStages).
std::pair<const Spec*, int> find_rotate_half(const Spec& st) {
  for (size_t i = 0; i < st.nodes.size(); ++i)
    if (st.nodes[i].category == NodeCategory::Compute && st.nodes[i].compute == ComputeKind::RotateHalf)
      return {&st, static_cast<int>(i)};
  for (const Spec& c : st.children)
    if (auto f = find_rotate_half(c); f.first) return f;
  return {nullptr, -1};
}

// rotate_half's operand in place (spec.h rotate_in_place): where its cone is computed and nothing
// but the operand is read past it; never the accumulator itself, nor beside a second rotate_half
// or a value of the cone read later.
TEST(Rotary, OperandInPlaceWhereNothingElseReadsItsCone) {
  const auto in_place = [](Rope& t, const std::string& what) {
    SCOPED_TRACE(what);
    const LoweringResult r = lower(t.g);
    EXPECT_EQ(r.regions.size(), 1u) << describe(t.g, r);
    const auto [st, i] = find_rotate_half(r.regions.at(0).spec.root);
    EXPECT_NE(st, nullptr) << print(r.regions.at(0).spec);
    return st && rotate_in_place(*st, i);
  };
  {
    Rope t(128);
    Value q = t.g.rms_norm(t.acc, t.g.input("gamma", DType::BF16, {Dim::of(128)}), 1e-6, 128);
    t.g.output(t.g.rope(q, t.cos, t.sin, 128), "y", DType::BF16);
    EXPECT_TRUE(in_place(t, "a per-head norm, then RoPE"));
  }
  {
    Rope t(128);
    Value q = t.g.rms_norm(t.acc, t.g.input("gamma", DType::BF16, {Dim::of(128)}), 1e-6, 128);
    t.g.output(q, "q", DType::BF16);  // stored: a read of the operand itself
    t.g.output(t.g.rope(q, t.cos, t.sin, 128), "y", DType::BF16);
    EXPECT_TRUE(in_place(t, "a per-head norm, stored, then RoPE"));
  }
  {
    Rope t(128);
    Value h = t.acc + t.g.input("b", DType::BF16, {Dim::of("N")});
    t.g.output(t.g.rope(h, t.cos, t.sin, 128), "y", DType::BF16);
    EXPECT_FALSE(in_place(t, "a bias then RoPE: the root stage recomputes"));
  }
  {
    Rope t(128);
    t.g.output(t.g.rope(t.acc, t.cos, t.sin, 128), "y", DType::BF16);
    EXPECT_FALSE(in_place(t, "RoPE of the accumulator itself"));
  }
  {
    Rope t(128);
    Value h = t.acc + t.g.input("b", DType::BF16, {Dim::of("N")});
    t.g.output(t.g.rotate_half(h, 128) + t.acc, "y", DType::BF16);
    EXPECT_FALSE(in_place(t, "the accumulator read again past the operand"));
  }
  {
    Rope t(128);
    Value h = t.acc + t.g.input("b", DType::BF16, {Dim::of("N")});
    t.g.output(t.g.rotate_half(h, 128) + t.g.rotate_half(t.acc * 2.0, 128), "y", DType::BF16);
    EXPECT_FALSE(in_place(t, "two rotate_halfs"));
  }
}

// NVRTC compiles the kernels (no GPU needed) without a stack: the partner fragments' registers
// are compile-time indices. Qwen 3's norm then RoPE takes 128-row tiles with the operand in place
// (recomputed at the partner, 128 rows spilled 632 B), beginning in the epilogue where a CTA
// runs one job (early, 272 B).
TEST(Rotary, KernelsCompileWithoutSpills) {
  const std::filesystem::path cache =
      std::filesystem::temp_directory_path() / ("comfuse-rotary-test-" + std::to_string(::getpid()));
  struct V {
    const char* what;
    Bindings d;
    int tile_m;  // 0: the planner's
    int epi_rows;
  };
  for (const V& v : {V{"rope", dims(1000, 4096, 1024), 0, 0}, V{"norm", dims(1000, 4096, 1024), 0, 128},
                     V{"norm", dims(300, 3072, 512), 0, 128}, V{"norm", dims(1000, 4096, 1024), 64, 64},
                     V{"norm-pairs", dims(1000, 4096, 1024), 0, 0}, V{"bias", dims(1000, 4096, 1024), 128, 128},
                     V{"bias-stored", dims(1000, 4096, 1024), 0, 0}, V{"exp", dims(1000, 4096, 1024), 0, 0}}) {
    const std::string what = v.what;
    SCOPED_TRACE(fmt::format("{}, {} x {} x {}, tile_m {}", what, v.d.at("M"), v.d.at("N"), v.d.at("K"), v.tile_m));
    Rope t(128);
    Value q = t.acc;
    if (what.rfind("bias", 0) == 0) q = q + t.g.input("b", DType::BF16, {Dim::of("N")});
    if (what == "bias-stored") t.g.output(q, "h", DType::BF16);
    if (what == "exp") q = q - t.g.reduce(ReduceOp::Max, q, -1, 128);
    if (what.rfind("norm", 0) == 0) q = t.g.rms_norm(q, t.g.input("gamma", DType::BF16, {Dim::of(128)}), 1e-6, 128);
    Value y = t.g.rope(q, t.cos, t.sin, 128, what == "norm-pairs");
    t.g.output(what == "exp" ? y + t.g.unary(UnaryOp::Exp, q) : y, "y", DType::BF16);
    const FusionSpec fs = lower(t.g).regions.at(0).spec;
    const Problem p = problem_of(fs, v.d);
    CompileOptions opt;
    opt.jit.cache_dir = cache;
    opt.plan.gpu = Gpu::H200;  // compile_only plans for the GPU it finds: the plan checked here
    if (v.tile_m) opt.plan.tile_m = v.tile_m;
    const Plan plan = make_plan(fs, p, opt.plan);
    if (v.epi_rows) {
      EXPECT_EQ(plan.kernel.epi_rows(), v.epi_rows);
    }
    const bool in_place = what == "norm" || what == "exp";  // PostStages (spec.h rotate_in_place)
    EXPECT_EQ(emit(fs, plan).source.find(", 128, true>") != std::string::npos, in_place) << emit(fs, plan).source;
    if (what == "norm" && plan.kernel.epi_rows() == 128) {
      EXPECT_FALSE(plan.kernel.begin_early);
    }
    const CompiledKernel k = compile_only(fs, p, opt);
    EXPECT_FALSE(k.wgmma_serialized) << k.log;
    EXPECT_EQ(k.stack_bytes, 0) << k.log;
    EXPECT_EQ(k.spill_bytes, 0) << k.log;
  }
  std::filesystem::remove_all(cache);
}

}  // namespace
}  // namespace comfuse
