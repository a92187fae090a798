// The gated (SwiGLU) B2B pair on the CPU: Φ merges two matmuls sharing X whose values meet in an
// elementwise F into one gated region (the second a gated AccEntry on OperandGate W3) where it
// starts a B2B pair, and says why not elsewhere (different A, B layout or dtype, X W3^T or S
// stored, no second matmul); the fp64 executors agree; the B2B plan of the gated pair; the spec's
// text form; Ψ's GateEntry and an NVRTC compile; the unfused kernels (one gated GEMM1 and GEMM2,
// or X W3^T stored, GEMM1 reading it, GEMM2); the single-GEMM planner's gated kernel; and
// choose_b2b, the rule between one B2B kernel and those.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <tuple>

#include "comfuse/emit.h"
#include "comfuse/interp.h"
#include "comfuse/lower.h"
#include "comfuse/plan.h"
#include "comfuse/runtime.h"
#include "comfuse/text.h"

namespace comfuse {
namespace {

const std::filesystem::path kRoot = COMFUSE_SOURCE_DIR;

// Llama's MLP with the parts a test varies: X W3^T's A operand, W3's declaration, F, and what
// follows S.
struct Mlp {
  std::string up_a = "x";
  std::string w3 = "input w3: bf16[N, K]";
  std::string up = "matmul({}, w3)";
  std::string f = "mul(silu(gate), up)";
  std::string tail = "y = matmul(s, w2)\noutput y: bf16\n";
  std::string text() const {
    return "input x: bf16[M, K]\ninput z: bf16[M, K]\ninput w1: bf16[N, K]\n" + w3 +
           "\ninput w2: bf16[D, N]\ngate = matmul(x, w1)\nup = " + fmt::format(fmt::runtime(up), up_a) +
           "\ns = cast(" + f + ", bf16)\n" + tail;
  }
};

struct Lowered {
  Graph g;
  LoweringResult r;
  explicit Lowered(const std::string& text) : g(parse_graph(text)), r(lower(g)) {}
  std::string said() const { return describe(g, r); }
};

TEST(B2bGated, SwiGluIsOneGatedPair) {
  Lowered l(Mlp{}.text());
  const B2BCandidate* b = one_b2b_kernel(l.r);
  ASSERT_NE(b, nullptr) << l.said();
  ASSERT_EQ(l.r.gate_pairs.size(), 1u);
  const GatePair& gp = l.r.gate_pairs[0];
  EXPECT_TRUE(gp.blocker.empty()) << gp.blocker;
  EXPECT_EQ(gp.region, b->first_region);
  EXPECT_EQ(l.g.node(b->gate_matmul).name, "up");
  EXPECT_EQ(l.g.node(gp.first_matmul).name, "gate");
  const FusionSpec& f = l.r.regions[static_cast<size_t>(b->first_region)].spec;
  const int gate = f.arg_index(ArgRole::OperandGate);
  ASSERT_GE(gate, 0);
  EXPECT_EQ(f.args[static_cast<size_t>(gate)].name, "w3");
  int gated_entries = 0;
  for (const SpecNode& n : f.root.nodes)
    gated_entries += n.category == NodeCategory::AccEntry && n.arg == gate;
  EXPECT_EQ(gated_entries, 1);
  EXPECT_TRUE(l.r.fallbacks.empty()) << l.said();
  EXPECT_NE(l.said().find("one gated GEMM1 (region 0, two accumulators)"), std::string::npos) << l.said();
  EXPECT_NE(l.said().find("('gate' gated with 'up')"), std::string::npos) << l.said();
  verify(f);
  // The text form round-trips the gated entry (`acc a2`).
  EXPECT_EQ(parse_spec(print(f)), f);
  EXPECT_NE(print(f).find("tile = acc a2 origin=up"), std::string::npos) << print(f);
}

// GeGLU, F written the other way round, and any elementwise F of the two accumulators.
TEST(B2bGated, AnyElementwiseFOfBothAccumulators) {
  for (const char* f : {"mul(gelu(gate), up)", "mul(up, silu(gate))", "add(mul(sigmoid(gate), 2), tanh(up))",
                        "mul(cast(gelu(gate), bf16), up)"}) {
    SCOPED_TRACE(f);
    Mlp m;
    m.f = f;
    Lowered l(m.text());
    const B2BCandidate* b = one_b2b_kernel(l.r);
    ASSERT_NE(b, nullptr) << l.said();
    EXPECT_GE(b->gate_matmul, 0);
  }
}

// The fp64 executors: the graph as written against the lowered graph, whose gated region runs
// through its spec (X W1^T and X W3^T), exactly.
TEST(B2bGated, LoweredExecutorMatchesTheGraph) {
  Lowered l(Mlp{}.text());
  const Bindings dims{{"M", 37}, {"K", 24}, {"N", 40}, {"D", 16}};
  std::mt19937_64 rng(7);
  const TensorMap in = random_inputs(l.g, dims, rng);
  const TensorMap want = run_graph(l.g, dims, in), got = run_lowered(l.g, l.r, dims, in);
  const Comparison c = compare(got.at("y"), want.at("y"));
  EXPECT_EQ(c.nonfinite, 0);
  EXPECT_EQ(c.max_abs, 0.0);
}

// The gated pair's unfused kernels (plan.h unfused_pair). By default two: the gated GEMM1 as it
// is (W1 and W3 in one gated single-GEMM kernel, KernelConfig::gated) and GEMM2, computing the
// graph as the lowered executor does. With gated_gemm false three: X W3^T stored as the graph's
// `up` in bf16, GEMM1 reading it as a tile input where its gated entry was, GEMM2, computing the
// graph up to that one bf16 rounding. Every spec verifies and runs through the fp64 spec executor.
TEST(B2bGated, UnfusedKernelsComputeTheGraph) {
  Lowered l(Mlp{}.text());
  const B2BCandidate* b = one_b2b_kernel(l.r);
  ASSERT_NE(b, nullptr) << l.said();
  const FusionSpec &first = l.r.regions[static_cast<size_t>(b->first_region)].spec,
                   &second = l.r.regions[static_cast<size_t>(b->second_region)].spec;
  const Bindings dims{{"M", 37}, {"K", 24}, {"N", 40}, {"D", 16}};
  std::mt19937_64 rng(7);
  const TensorMap in = random_inputs(l.g, dims, rng);
  const Tensor want = run_graph(l.g, dims, in).at("y");
  auto run_kernels = [&](const UnfusedPair& u) {
    TensorMap args = in;
    for (const FusionSpec& k : u.kernels)
      for (auto& [name, t] : run_spec(k, dims, args)) args[name] = t;
    return compare(args.at("y"), want);
  };

  const UnfusedPair two = unfused_pair(first, second);
  ASSERT_EQ(two.kernels.size(), 2u);
  ASSERT_EQ(two.intermediates.size(), 1u);
  EXPECT_EQ(two.intermediates[0].name, "s");
  EXPECT_TRUE(two.kernels[0].gated());
  EXPECT_EQ(two.kernels[0], first);
  const Comparison c2 = run_kernels(two);
  EXPECT_EQ(c2.nonfinite, 0);
  EXPECT_LT(c2.rel_l2, 1e-12);  // the graph's own roundings only (S to bf16)

  PlanOptions split;
  split.gated_gemm = false;
  const UnfusedPair u = unfused_pair(first, second, split);
  ASSERT_EQ(u.kernels.size(), 3u);
  ASSERT_EQ(u.intermediates.size(), 2u);
  EXPECT_EQ(u.intermediates[0].name, "up");
  EXPECT_EQ(u.intermediates[0].dtype, DType::BF16);
  EXPECT_EQ(u.intermediates[1].name, "s");
  const FusionSpec &up = u.kernels[0], &gate = u.kernels[1];
  EXPECT_EQ(up.args.at(static_cast<size_t>(up.arg_index(ArgRole::OperandB))).name, "w3");
  EXPECT_EQ(up.args.at(static_cast<size_t>(up.arg_index(ArgRole::Output))).name, "up");
  EXPECT_LT(gate.arg_index(ArgRole::OperandGate), 0);
  ASSERT_GE(gate.arg_index(ArgRole::TileInput), 0);
  EXPECT_EQ(gate.args.at(static_cast<size_t>(gate.arg_index(ArgRole::TileInput))).name, "up");
  const Comparison c3 = run_kernels(u);
  EXPECT_EQ(c3.nonfinite, 0);
  EXPECT_GT(c3.max_abs, 0.0);  // X W3^T was rounded to bf16
  EXPECT_LT(c3.rel_l2, 1e-2);
}

// What keeps the two GEMMs apart, in the user's names; the graph then lowers as without the
// merge (two regions, the meeting node falls back saying why), nothing dropped.
TEST(B2bGated, RefusalsSayWhy) {
  struct Case {
    const char* what;
    Mlp m;
    const char* why;
  };
  Mlp other_a, kn, f16, reduces;
  other_a.up_a = "z";
  kn.w3 = "input w3: bf16[K, N]";
  kn.up = "matmul({}, w3, layout=kn)";
  f16.w3 = "input w3: f16[N, K]";
  reduces.f = "mul(softmax(gate), up)";
  for (const Case& c : {Case{"different A", other_a, "'up' reads A 'z': the two GEMMs of a gated pair share their A"},
                        Case{"layouts", kn, "a gated pair's W1 and W3 share one layout"},
                        Case{"dtypes", f16, "B operands 'w1' bf16[N, K] and 'w3' f16[N, K] differ"},
                        Case{"F reduces", reduces, "a gated GEMM's epilogue is elementwise"}}) {
    SCOPED_TRACE(c.what);
    Lowered l(c.m.text());
    EXPECT_EQ(one_b2b_kernel(l.r), nullptr) << l.said();
    ASSERT_EQ(l.r.gate_pairs.size(), 1u) << l.said();
    const GatePair& gp = l.r.gate_pairs[0];
    EXPECT_NE(gp.blocker.find(c.why), std::string::npos) << gp.blocker;
    EXPECT_EQ(gp.region, -1);
    EXPECT_NE(l.said().find("not merged: "), std::string::npos) << l.said();
    // Every GEMM is its own region again; the product of the two falls back with the reason.
    EXPECT_GE(l.r.regions.size(), 2u);
    bool reported = false;
    for (const Fallback& fb : l.r.fallbacks)
      reported = reported || (fb.node == gp.meet_node && fb.reason.find(c.why) != std::string::npos);
    EXPECT_TRUE(reported) << l.said();
    for (const FusedRegion& reg : l.r.regions) EXPECT_LT(reg.spec.arg_index(ArgRole::OperandGate), 0);
  }
}

// A gated region that starts no B2B pair is a gated GEMM of its own (KernelConfig::gated): with
// no second matmul, with S also stored, with X W3^T also stored (its GateEntry feeds a store).
// The fp64 lowered executor computes the graph exactly.
TEST(B2bGated, StandaloneGatedRegions) {
  Mlp up_out, s_out, single;
  up_out.tail = "y = matmul(s, w2)\noutput y: bf16\noutput up: bf16 as u\n";
  s_out.tail = "y = matmul(s, w2)\noutput y: bf16\noutput s: bf16\n";
  single.tail = "output s: bf16\n";
  for (const auto& [what, m, pair_blocker] :
       {std::tuple{"X W3^T stored", up_out, "the first GEMM's epilogue also stores 'u"},
        std::tuple{"S stored", s_out, "'s' is a graph output: it must be stored"},
        std::tuple{"no second matmul", single, ""}}) {
    SCOPED_TRACE(what);
    Lowered l(m.text());
    EXPECT_EQ(one_b2b_kernel(l.r), nullptr) << l.said();
    ASSERT_EQ(l.r.gate_pairs.size(), 1u) << l.said();
    const GatePair& gp = l.r.gate_pairs[0];
    EXPECT_TRUE(gp.blocker.empty()) << gp.blocker;
    ASSERT_GE(gp.region, 0);
    EXPECT_TRUE(l.r.regions.at(static_cast<size_t>(gp.region)).spec.gated());
    EXPECT_NE(l.said().find(fmt::format("one gated GEMM (region {}, two accumulators)", gp.region)), std::string::npos)
        << l.said();
    if (*pair_blocker) {
      ASSERT_EQ(l.r.b2b_candidates.size(), 1u);
      EXPECT_NE(l.r.b2b_candidates[0].blocker.find(pair_blocker), std::string::npos) << l.r.b2b_candidates[0].blocker;
    }
    EXPECT_TRUE(l.r.fallbacks.empty()) << l.said();
    const Bindings dims{{"M", 37}, {"K", 24}, {"N", 40}, {"D", 16}};
    std::mt19937_64 rng(11);
    const TensorMap in = random_inputs(l.g, dims, rng);
    const TensorMap want = run_graph(l.g, dims, in), got = run_lowered(l.g, l.r, dims, in);
    for (const auto& [name, t] : want) {
      const Comparison c = compare(got.at(name), t);
      EXPECT_EQ(c.nonfinite, 0) << name;
      EXPECT_EQ(c.max_abs, 0.0) << name;
    }
  }
}

// Two matmuls on one X that never meet (independent outputs) or that chain are no gated pair.
TEST(B2bGated, OnlyMeetingGemmsPair) {
  Lowered apart(
      "input x: bf16[M, K]\ninput w1: bf16[N, K]\ninput w3: bf16[N, K]\na = matmul(x, w1)\nb = matmul(x, w3)\n"
      "output a: bf16\noutput b: bf16\n");
  EXPECT_TRUE(apart.r.gate_pairs.empty()) << apart.said();
  Lowered ffn(std::string("input x: bf16[M, K]\ninput w1: bf16[N, K]\ninput w2: bf16[D, N]\nh = matmul(x, w1)\n"
                          "s = cast(gelu(h), bf16)\ny = matmul(s, w2)\noutput y: bf16\n"));
  EXPECT_TRUE(ffn.r.gate_pairs.empty()) << ffn.said();
}

// The single-GEMM planner's gated kernel (KernelConfig::gated): one wgmma over W1's and W3's
// columns, 64 rows a warp group, tile_n <= 128; what it cannot take is refused by name.
TEST(B2bGated, SingleGemmPlansTheGatedKernel) {
  Lowered l(Mlp{}.text());
  const FusionSpec& f = l.r.regions.at(0).spec;
  for (const Bindings& dims : {Bindings{{"M", 8192}, {"K", 1024}, {"N", 4096}}, Bindings{{"M", 128}, {"K", 4096}, {"N", 11008}},
                               Bindings{{"M", 1}, {"K", 2048}, {"N", 5632}}, Bindings{{"M", 700}, {"K", 200}, {"N", 328}}}) {
    const Plan p = make_plan(f, problem_of(f, dims));
    SCOPED_TRACE(explain(f, p));
    EXPECT_TRUE(p.kernel.gated);
    EXPECT_EQ(check(p.kernel), nullptr);
    EXPECT_EQ(p.kernel.epi_rows(), 64);
    EXPECT_LE(p.kernel.tile_n, 128);
    EXPECT_EQ(p.kernel.mma_n(), 2 * p.kernel.tile_n);
    EXPECT_EQ(p.kernel.ring_stage_bytes(), (p.kernel.tile_m + 2 * p.kernel.tile_n) * Sm90::kTileK * 2);
    EXPECT_NE(explain(f, p).find("columns of 'w1' then the same of 'w3'"), std::string::npos);
    const EmittedKernel k = emit(f, p);
    EXPECT_NE(k.source.find("comfuse::epi::GateEntry"), std::string::npos) << k.source;
    EXPECT_NE(k.source.find("tma_b3       w3 bf16"), std::string::npos) << k.source;
    EXPECT_NE(k.source.find(".gated = true"), std::string::npos) << k.source;
  }
  const Problem big = problem_of(f, {{"M", 8192}, {"K", 1024}, {"N", 4096}});
  auto refused = [&](PlanOptions o, const char* why) {
    try {
      make_plan(f, big, o);
      ADD_FAILURE() << "expected an Error: " << why;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  PlanOptions wide, split;
  wide.tile_n = 256;
  split.k_splits = 2;
  refused(wide, "a gated GEMM's tile holds B's and the gate's columns in one wgmma of at most 256");
  // Split-K sums the whole accumulator (both products) before the epilogue: forced, it plans.
  const Plan sp = make_plan(f, problem_of(f, {{"M", 1}, {"K", 4096}, {"N", 14336}}), split);
  EXPECT_TRUE(sp.kernel.gated);
  EXPECT_EQ(sp.kernel.k_splits, 2);
  EXPECT_EQ(check(sp.kernel), nullptr);
  EXPECT_EQ(sp.kernel.split_partial_bytes(), sp.kernel.a_box_rows * 2 * sp.kernel.tile_n * sp.kernel.split_value_bytes());
  FusionSpec f16_gate = f;  // a hand-made spec: Φ never pairs weights of two types
  f16_gate.args.at(static_cast<size_t>(f16_gate.arg_index(ArgRole::OperandGate))).dtype = DType::F16;
  try {
    make_plan(f16_gate, big);
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the gate 'w3' is f16, A is bf16"), std::string::npos) << e.what();
  }
  // A plan of another spec cannot render the gated one, nor the gated plan a plain spec.
  Lowered plain(std::string("input x: bf16[M, K]\ninput w1: bf16[N, K]\nh = matmul(x, w1)\noutput h: bf16\n"));
  const FusionSpec& ps = plain.r.regions.at(0).spec;
  EXPECT_THROW(emit(ps, make_plan(f, big)), Error);
  EXPECT_THROW(emit(f, make_plan(ps, big)), Error);
}

TEST(B2bGated, PlanHoldsBothAccumulators) {
  Lowered gated(Mlp{}.text());
  Lowered plain(std::string("input x: bf16[M, K]\ninput w1: bf16[N, K]\ninput w2: bf16[D, N]\nh = matmul(x, w1)\n"
                            "s = cast(silu(h), bf16)\ny = matmul(s, w2)\noutput y: bf16\n"));
  auto plan = [](const Lowered& l, B2bProblem p) {
    const B2BCandidate* b = one_b2b_kernel(l.r);
    EXPECT_NE(b, nullptr) << l.said();
    return make_b2b_plan(l.r.regions[0].spec, l.r.regions[1].spec, p);
  };
  const B2bProblem llama{1, 128, 4096, 11008, 4096, DType::BF16};
  const B2bPlan g = plan(gated, llama), p = plan(plain, llama);
  EXPECT_TRUE(g.kernel.gated);
  EXPECT_FALSE(p.kernel.gated);
  EXPECT_EQ(check(g.kernel), nullptr);
  EXPECT_LE(g.kernel.live_values(), B2bConfig::kMaxLiveValues);
  EXPECT_EQ(g.kernel.tile_n2, 192);  // two accumulators leave O 192 columns
  EXPECT_EQ(g.kernel.gemm1_b_rows(), 2 * g.kernel.chunk_n1);
  EXPECT_GT(g.fused_us, p.fused_us);      // GEMM1 twice
  EXPECT_GT(g.unfused_us, p.unfused_us);
  const std::string why = explain(gated.r.regions[0].spec, gated.r.regions[1].spec, g);
  EXPECT_NE(why.find("(gated: X W1^T and X W3^T)"), std::string::npos) << why;
  EXPECT_NE(why.find("P 32 (x2)"), std::string::npos) << why;
  // A row reduction after GEMM2 needs the whole row in one job: 192 columns here, not 256.
  Mlp norm;
  norm.tail = "input gamma: bf16[D]\ny = matmul(s, w2)\nn = rms_norm(y, gamma)\noutput n: bf16\n";
  Lowered ln(norm.text());
  EXPECT_NO_THROW(plan(ln, B2bProblem{1, 512, 256, 512, 192, DType::BF16}));
  try {
    plan(ln, B2bProblem{1, 512, 256, 512, 256, DType::BF16});
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("reduces rows of N2 = 256 columns; one job of this pair holds 192"),
              std::string::npos)
        << e.what();
  }
}

// choose_b2b: the one rule between one B2B kernel and the unfused kernels.
TEST(B2bGated, ChooseOneKernelOrTwo) {
  auto load = [](const std::string& ex) {
    Graph g = parse_graph_file((kRoot / "examples" / ex).string());
    LoweringResult r = lower(g);
    EXPECT_NE(one_b2b_kernel(r), nullptr) << ex;
    return r;
  };
  using Mode = PlanOptions::B2b;
  auto choose = [](const LoweringResult& r, B2bProblem p, Mode m) {
    PlanOptions o;
    o.b2b = m;
    return choose_b2b(r.regions[0].spec, r.regions[1].spec, p, o);
  };
  const LoweringResult ffn = load("ffn.cf"), att = load("attention.cf"), swiglu = load("ffn_swiglu.cf");
  const B2bProblem ffn_big{1, 8192, 1024, 4096, 256, DType::BF16};
  const B2bChoice a = choose(ffn, ffn_big, Mode::Auto);
  EXPECT_FALSE(a.one_kernel);
  ASSERT_TRUE(a.plan.has_value());
  EXPECT_GT(a.plan->fused_us, a.plan->unfused_us);
  EXPECT_NE(a.reason.find("two kernels: the B2B kernel is not expected to pay"), std::string::npos) << a.reason;
  EXPECT_TRUE(choose(ffn, ffn_big, Mode::Force).one_kernel);
  const B2bChoice off = choose(ffn, ffn_big, Mode::Off);
  EXPECT_FALSE(off.one_kernel);
  EXPECT_FALSE(off.plan.has_value());
  // Attention over a long sequence pays as one kernel (the estimate saves S's round trip).
  const B2bChoice at = choose(att, B2bProblem{1, 16384, 128, 16384, 128, DType::BF16}, Mode::Auto);
  EXPECT_TRUE(at.one_kernel) << at.reason;
  EXPECT_NE(at.reason.find("one B2B kernel: estimate"), std::string::npos) << at.reason;
  // The gated pair: two kernels (the gated GEMM1, GEMM2) where one does not pay (unfused_pair),
  // and under Off; three (X W3^T stored first) with gated_gemm off.
  const B2bChoice g = choose(swiglu, ffn_big, Mode::Auto);
  EXPECT_FALSE(g.one_kernel);
  EXPECT_NE(g.reason.find("two kernels: the B2B kernel is not expected to pay"), std::string::npos) << g.reason;
  EXPECT_NE(g.reason.find("the gated GEMM1 (W1 and W3 share X's tiles)"), std::string::npos) << g.reason;
  ASSERT_TRUE(g.plan.has_value());
  EXPECT_NE(g.plan->unfused_from.find("the planner's two kernels: GEMM1 + F storing S"), std::string::npos)
      << g.plan->unfused_from;
  EXPECT_NE(choose(swiglu, ffn_big, Mode::Off).reason.find("two kernels (b2b off)"), std::string::npos);
  PlanOptions split;
  split.gated_gemm = false;
  const B2bChoice g3 = choose_b2b(swiglu.regions[0].spec, swiglu.regions[1].spec, ffn_big, split);
  EXPECT_NE(g3.reason.find("three kernels: the B2B kernel is not expected to pay"), std::string::npos) << g3.reason;
  EXPECT_NE(g3.plan->unfused_from.find("the planner's three kernels: up stored"), std::string::npos)
      << g3.plan->unfused_from;
  // A batched pair has no unfused path: one kernel under Auto, and Off refuses it.
  const LoweringResult batched = load("attention_batched.cf");
  const B2bProblem heads{16, 1024, 64, 1024, 64, DType::BF16};
  EXPECT_TRUE(choose(batched, heads, Mode::Auto).one_kernel);
  EXPECT_THROW(choose(batched, heads, Mode::Off), Error);
  // A pair the B2B kernel cannot hold (a LayerNorm over N1 in F) is two kernels under Auto, an
  // Error when forced.
  Lowered ln(std::string("input x: bf16[M, K]\ninput w1: bf16[N, K]\ninput w2: bf16[D, N]\nh = matmul(x, w1)\n"
                         "s = cast(layer_norm(h), bf16)\ny = matmul(s, w2)\noutput y: bf16\n"));
  const B2bProblem small{1, 512, 64, 512, 64, DType::BF16};
  const B2bChoice lc = choose(ln.r, small, Mode::Auto);
  EXPECT_FALSE(lc.one_kernel);
  EXPECT_NE(lc.reason.find("two kernels: the pair cannot be one B2B kernel (b2b: F reduces over N1"), std::string::npos)
      << lc.reason;
  EXPECT_THROW(choose(ln.r, small, Mode::Force), Error);
}

class B2bGatedCompile : public ::testing::Test {
 protected:
  void SetUp() override {
    cache_ = std::filesystem::temp_directory_path() / ("comfuse-b2b-gated-test-" + std::to_string(::getpid()));
    opt_.jit.cache_dir = cache_;
  }
  void TearDown() override { std::filesystem::remove_all(cache_); }
  std::filesystem::path cache_;
  CompileOptions opt_;
};

// Ψ renders the second accumulator as GateEntry and W3's TMA slot; NVRTC compiles the kernel with
// both GEMM1s and the RS wgmma of GEMM2 unserialized.
TEST_F(B2bGatedCompile, EmitsGateEntryAndCompiles) {
  Graph g = parse_graph_file((kRoot / "examples" / "ffn_swiglu.cf").string());
  const LoweringResult r = lower(g);
  ASSERT_NE(one_b2b_kernel(r), nullptr);
  const FusionSpec &f = r.regions[0].spec, &e = r.regions[1].spec;
  const B2bProblem p{1, 1000, 136, 1096, 264, DType::BF16};
  const EmittedKernel k = emit_b2b(f, e, make_b2b_plan(f, e, p));
  EXPECT_NE(k.source.find("/* n1 */ comfuse::epi::GateEntry,"), std::string::npos) << k.source;
  EXPECT_NE(k.source.find("tma_b3       w3 bf16"), std::string::npos) << k.source;
  EXPECT_NE(k.source.find(".gated = true"), std::string::npos) << k.source;
  const CompiledKernel c = compile_only_b2b(f, e, p, opt_);
  EXPECT_TRUE(is_cubin_elf(c.cubin));
  EXPECT_FALSE(c.wgmma_serialized) << c.log;
}

// The single-GEMM gated kernel compiles at each configuration class (cooperative 128x128 in
// clusters of 2, PingPong 64x64 pairs, 64x128 in clusters along N; K x N weights too), its
// wgmmas unserialized.
TEST_F(B2bGatedCompile, GatedSingleGemmCompiles) {
  Graph g = parse_graph_file((kRoot / "examples" / "ffn_swiglu.cf").string());
  const LoweringResult r = lower(g);
  const FusionSpec& f = r.regions.at(0).spec;
  ASSERT_TRUE(f.gated());
  for (const Bindings& dims : {Bindings{{"M", 8192}, {"K", 1024}, {"N", 4096}}, Bindings{{"M", 128}, {"K", 4096}, {"N", 11008}},
                               Bindings{{"M", 16}, {"K", 4096}, {"N", 11008}}}) {
    EmittedKernel k;
    const CompiledKernel c = compile_only(f, problem_of(f, dims), opt_, &k);
    EXPECT_TRUE(is_cubin_elf(c.cubin));
    EXPECT_FALSE(c.wgmma_serialized) << c.log;
    EXPECT_NE(k.source.find(".gated = true"), std::string::npos);
  }
}

}  // namespace
}  // namespace comfuse
