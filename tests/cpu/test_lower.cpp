// Φ's structure on the patterns the paper names, and its closure (what falls back, why).
#include <gtest/gtest.h>

#include "comfuse/lower.h"

namespace comfuse {
namespace {

struct Gemm {
  Graph g;
  Value x, w, acc;
  explicit Gemm(BLayout layout = BLayout::NK) {
    x = g.input("x", DType::BF16, {Dim::of("M"), Dim::of("K")});
    w = g.input("w", DType::BF16, layout == BLayout::NK ? Shape{Dim::of("N"), Dim::of("K")} : Shape{Dim::of("K"), Dim::of("N")});
    acc = g.matmul(x, w, layout);
  }
  Value row(const std::string& name) { return g.input(name, DType::BF16, {Dim::of("N")}); }
};

int count(const Spec& s, NodeCategory c) {
  int n = 0;
  for (const SpecNode& node : s.nodes) n += node.category == c;
  return n;
}

const SpecNode& terminal(const Spec& s) { return s.nodes.at(static_cast<size_t>(s.terminal)); }

TEST(Lower, BiasGeluIsOneStage) {
  Gemm t;
  t.g.output(t.g.unary(UnaryOp::GeluTanh, t.acc + t.row("bias")), "y", DType::BF16);
  LoweringResult r = lower(t.g);
  ASSERT_EQ(r.regions.size(), 1u);
  EXPECT_TRUE(r.fallbacks.empty());
  const FusionSpec& fs = r.regions[0].spec;
  EXPECT_EQ(fs.reduction_count(), 0);
  EXPECT_TRUE(fs.root.children.empty());
  EXPECT_EQ(terminal(fs.root).category, NodeCategory::Store);
  // binary op -> broadcast + compute; 1-D tensor -> row broadcast registered as an arg.
  EXPECT_EQ(count(fs.root, NodeCategory::Broadcast), 1);
  ASSERT_EQ(fs.args.size(), 4u);  // A, B, bias, y
  EXPECT_EQ(fs.args[0].role, ArgRole::OperandA);
  EXPECT_EQ(fs.args[1].role, ArgRole::OperandB);
  EXPECT_EQ(fs.args[2].role, ArgRole::RowVector);
  EXPECT_EQ(fs.args[2].name, "bias");
  EXPECT_EQ(fs.args[3].role, ArgRole::Output);
  EXPECT_EQ(fs.args[3].dtype, DType::BF16);
}

// A region is named by what the user knows it as: the output it stores where the matmul has no
// name of its own; only letters, digits and '_' (the name reaches file names and a command line).
TEST(Lower, RegionsAreNamedByTheUsersNamesInSafeCharacters) {
  Gemm t;
  t.g.output(t.acc + t.row("bias"), "y", DType::BF16);
  EXPECT_EQ(lower(t.g).regions.at(0).spec.name, "region0_y");
  Gemm u;
  u.g.output(u.acc + u.row("bias"), "../o'ut y", DType::BF16);
  EXPECT_EQ(lower(u.g).regions.at(0).spec.name, "region0____o_ut_y");
}

TEST(Lower, LayerNormNestsTwoStagesWithBypass) {
  Gemm t;
  Value alpha = t.g.input("alpha", DType::F32, {});
  Value x = t.acc * alpha + t.row("bias");
  t.g.output(t.g.layer_norm(x, t.row("gamma"), t.row("beta")), "y", DType::BF16);
  LoweringResult r = lower(t.g);
  ASSERT_EQ(r.regions.size(), 1u);
  const FusionSpec& fs = r.regions[0].spec;
  EXPECT_EQ(fs.reduction_count(), 2);
  EXPECT_EQ(fs.stage_count(), 3);
  // Stage 0 ends in mean(x); stage 1 takes the mean and x (bypass), ends in the variance.
  const Spec& s0 = fs.root;
  ASSERT_EQ(terminal(s0).category, NodeCategory::Reduction);
  EXPECT_EQ(terminal(s0).reduce, ReduceOp::Mean);
  ASSERT_EQ(s0.children.size(), 1u);
  const Spec& s1 = s0.children[0];
  EXPECT_EQ(s1.nodes[0].category, NodeCategory::Placeholder);
  EXPECT_EQ(s1.nodes[0].placeholder, PlaceholderKind::Stat);
  ASSERT_EQ(s1.nodes[1].placeholder, PlaceholderKind::Bypass);
  EXPECT_EQ(s0.nodes[static_cast<size_t>(s1.nodes[1].source)].origin, x.node().name);  // x, not recomputed
  EXPECT_EQ(count(s1, NodeCategory::AccEntry), 0);
  EXPECT_EQ(terminal(s1).category, NodeCategory::Reduction);
  const Spec& s2 = s1.children.at(0);
  EXPECT_EQ(terminal(s2).category, NodeCategory::Store);
  // x - mean is computed once in stage 1 and carried into stage 2, not recomputed there.
  int subs = 0;
  for (const SpecNode& n : s2.nodes) subs += n.category == NodeCategory::Compute && n.binary == BinaryOp::Sub && n.compute == ComputeKind::Binary;
  EXPECT_EQ(subs, 0);
}

TEST(Lower, SoftmaxAndRmsNormHaveBoundedDepth) {
  for (int which = 0; which < 2; ++which) {
    Gemm t;
    Value y = which == 0 ? t.g.softmax(t.acc) : t.g.rms_norm(t.acc, t.row("gamma"));
    t.g.output(y, "y", DType::F16);
    LoweringResult r = lower(t.g);
    ASSERT_EQ(r.regions.size(), 1u);
    EXPECT_EQ(r.regions[0].spec.stage_count(), which == 0 ? 3 : 2);
  }
}

// The causal mask joins the GEMM's region as a compute node of the Stage-Stream spec, where its
// consumers need it: before the softmax's max (then bypassed), or in a later stage.
TEST(Lower, CausalMaskIsANodeOfTheSpec) {
  Gemm t;
  Value masked = t.g.causal_mask(t.acc * 0.125);
  t.g.rename(masked, "masked");
  t.g.output(t.g.softmax(masked), "p", DType::BF16);
  LoweringResult r = lower(t.g);
  ASSERT_EQ(r.regions.size(), 1u);
  EXPECT_TRUE(r.fallbacks.empty()) << describe(t.g, r);
  const FusionSpec& fs = r.regions[0].spec;
  EXPECT_NO_THROW(verify(fs));
  const Spec& s0 = fs.root;
  const SpecNode& max = terminal(s0);
  ASSERT_EQ(max.reduce, ReduceOp::Max);
  const SpecNode& mask = s0.nodes.at(static_cast<size_t>(max.operands.at(0)));
  EXPECT_EQ(mask.category, NodeCategory::Compute);
  EXPECT_EQ(mask.compute, ComputeKind::CausalMask);
  EXPECT_EQ(mask.value_class, ValueClass::Tile);
  EXPECT_EQ(mask.origin, "masked");
  EXPECT_EQ(s0.nodes.at(static_cast<size_t>(mask.operands.at(0))).binary, BinaryOp::Mul);
  EXPECT_EQ(pair_kind(s0, s0.terminal), PairKind::MaxExpSum);  // softmax's max and sum still pair
  EXPECT_NE(print(fs).find("tile = causal_mask n2 origin=masked"), std::string::npos) << print(fs);

  // Masking x - max(x): the mask runs in the max's PostOp.
  Gemm u;
  Value y = u.g.causal_mask(u.acc - u.g.reduce(ReduceOp::Max, u.acc));
  u.g.output(y, "y", DType::F32);
  LoweringResult ru = lower(u.g);
  ASSERT_EQ(ru.regions.size(), 1u);
  EXPECT_TRUE(ru.fallbacks.empty()) << describe(u.g, ru);
  const Spec& post = ru.regions[0].spec.root.children.at(0);
  bool in_post = false;
  for (const SpecNode& n : post.nodes)
    in_post = in_post || (n.category == NodeCategory::Compute && n.compute == ComputeKind::CausalMask);
  EXPECT_TRUE(in_post) << print(ru.regions[0].spec);
  EXPECT_NO_THROW(verify(ru.regions[0].spec));
}

// A softmax's pair keeps its exp in place (spec.h pair_keeps_exp) where the PostStage reads the
// logits, the max and their difference only through the exp: softmax, and a softmax whose
// probabilities go on into a LayerNorm; not log-softmax (its last stage takes x - max), nor a
// softmax whose result is scaled by the logits again (x carried on past the exp).
TEST(Lower, SoftmaxPairKeepsItsExpWhereNothingElseReadsTheLogits) {
  auto keeps = [](Gemm& t, Value y) {
    t.g.output(y, "y", DType::BF16);
    LoweringResult r = lower(t.g);
    EXPECT_EQ(r.regions.size(), 1u);
    const Spec& s0 = r.regions.at(0).spec.root;
    EXPECT_EQ(pair_kind(s0, s0.terminal), PairKind::MaxExpSum);
    return pair_keeps_exp(s0, s0.terminal);
  };
  Gemm a, b, c, d;
  EXPECT_TRUE(keeps(a, a.g.softmax(a.acc)));
  EXPECT_TRUE(keeps(b, b.g.layer_norm(b.g.softmax(b.acc), b.row("gamma"), b.row("beta"))));
  EXPECT_FALSE(keeps(c, c.g.log_softmax(c.acc)));
  EXPECT_FALSE(keeps(d, d.g.softmax(d.acc) * d.acc));
}

TEST(Lower, StatisticStoredAsColumnOutput) {
  Gemm t;
  Value m = t.g.reduce(ReduceOp::Max, t.acc);
  t.g.output(m, "rowmax", DType::F32);
  t.g.output(t.acc - m, "y", DType::BF16);
  LoweringResult r = lower(t.g);
  ASSERT_EQ(r.regions.size(), 1u);
  const FusionSpec& fs = r.regions[0].spec;
  int col_outputs = 0;
  for (const RuntimeArg& a : fs.args) col_outputs += a.role == ArgRole::Output && a.value_class == ValueClass::Col;
  EXPECT_EQ(col_outputs, 1);
}

TEST(Lower, ColumnVectorAndScalarLeaves) {
  Gemm t;
  Value col = t.g.input("rowscale", DType::F32, {Dim::of("M"), Dim::of(1)});
  Value s = t.g.input("s", DType::F32, {});
  t.g.output((t.acc * col + s) * 3.0, "y", DType::F32);
  LoweringResult r = lower(t.g);
  const FusionSpec& fs = r.regions.at(0).spec;
  std::vector<ArgRole> roles;
  for (const RuntimeArg& a : fs.args) roles.push_back(a.role);
  EXPECT_EQ(roles, (std::vector<ArgRole>{ArgRole::OperandA, ArgRole::OperandB, ArgRole::ColVector, ArgRole::Scalar, ArgRole::Output}));
  int literals = 0;
  for (const SpecNode& n : fs.root.nodes) literals += n.category == NodeCategory::Broadcast && n.arg < 0;
  EXPECT_EQ(literals, 1);
}

TEST(Lower, FfnYieldsTwoRegionsAndAB2BCandidate) {
  Gemm t;
  Value h = t.g.cast(t.g.unary(UnaryOp::GeluErf, t.acc), DType::BF16);
  Value w2 = t.g.input("w2", DType::BF16, {Dim::of("N2"), Dim::of("N")});
  t.g.output(t.g.matmul(h, w2), "out", DType::BF16);
  LoweringResult r = lower(t.g);
  ASSERT_EQ(r.regions.size(), 2u);
  ASSERT_EQ(r.b2b_candidates.size(), 1u);
  EXPECT_EQ(r.b2b_candidates[0].via_node, h.id);
  EXPECT_TRUE(r.fallbacks.empty());
  // h leaves region 0 as a stored bf16 tensor.
  const FusionSpec& first = r.regions[0].spec;
  EXPECT_EQ(first.args.back().role, ArgRole::Output);
  EXPECT_EQ(first.args.back().dtype, DType::BF16);
}

TEST(Lower, OutOfDomainOpsFallBackWithReasons) {
  Gemm t;
  Value y = t.g.unary(UnaryOp::Relu, t.acc);
  Value colsum = t.g.reduce(ReduceOp::Sum, y, /*dim=*/0);  // over M: not a row reduction
  Value tr = t.g.transpose(y);
  Value gamma2 = t.row("gamma") * 2.0;                      // prologue: no accumulator involved
  t.g.output(colsum, "colsum", DType::F32);
  t.g.output(tr, "yt", DType::F32);
  t.g.output(y * gamma2, "z", DType::F32);
  LoweringResult r = lower(t.g);
  ASSERT_EQ(r.regions.size(), 1u);
  std::map<int, std::string> why;
  for (const Fallback& f : r.fallbacks) why[f.node] = f.reason;
  ASSERT_TRUE(why.count(colsum.id));
  EXPECT_NE(why[colsum.id].find("not the last"), std::string::npos);
  ASSERT_TRUE(why.count(tr.id));
  EXPECT_NE(why[tr.id].find("outside the fusion domain"), std::string::npos);
  ASSERT_TRUE(why.count(gamma2.id));
  EXPECT_NE(why[gamma2.id].find("before the kernel"), std::string::npos);
  // y escapes to the unfused consumers, so it is stored.
  int stores = 0;
  for (const SpecNode& n : r.regions[0].spec.root.nodes) stores += n.category == NodeCategory::Store;
  EXPECT_EQ(stores, 2);  // y (for the fallbacks) and z
  EXPECT_NE(describe(t.g, r).find("fallback"), std::string::npos);
}

// An [M, N] side input (a residual) joins the epilogue as a tile input.
TEST(Lower, FullTileSideInputIsATileInput) {
  Gemm t;
  Value resid = t.g.input("resid", DType::BF16, {Dim::of("M"), Dim::of("N")});
  t.g.output(t.acc + resid, "y", DType::BF16);
  LoweringResult r = lower(t.g);
  ASSERT_TRUE(r.fallbacks.empty());
  const FusionSpec& s = r.regions.at(0).spec;
  const int a = s.arg_index(ArgRole::TileInput);
  ASSERT_GE(a, 0);
  EXPECT_EQ(s.args[static_cast<size_t>(a)].name, "resid");
  EXPECT_EQ(s.root.nodes.at(1).broadcast, BroadcastKind::Tile);
  EXPECT_EQ(parse_spec(print(s)), s);
}

TEST(Lower, DeadNodesAreReportedNotFused) {
  Gemm t;
  Value unused = t.g.unary(UnaryOp::Exp, t.acc);
  t.g.output(t.acc, "y", DType::F32);
  LoweringResult r = lower(t.g);
  ASSERT_EQ(r.dead_nodes.size(), 1u);
  EXPECT_EQ(r.dead_nodes[0], unused.id);
}

TEST(Lower, ChainOfFourReductionsNestsFourDeep) {
  Gemm t;
  Value v = t.acc;
  for (int i = 0; i < 4; ++i) v = v - t.g.reduce(i % 2 ? ReduceOp::Max : ReduceOp::Mean, v);
  t.g.output(v, "y", DType::BF16);
  LoweringResult r = lower(t.g);
  EXPECT_EQ(r.regions.at(0).spec.reduction_count(), 4);
  EXPECT_EQ(r.regions.at(0).spec.stage_count(), 5);
}


int tile_bypasses(const Spec& s) {
  int n = 0;
  for (const SpecNode& node : s.nodes)
    n += node.category == NodeCategory::Placeholder && node.placeholder == PlaceholderKind::Bypass &&
         node.value_class == ValueClass::Tile;
  return n;
}

TEST(Lower, RecomputesInsteadOfCarryingASecondTileValue) {
  Gemm t;
  t.g.output(t.g.log_softmax(t.acc), "logp", DType::F32);
  t.g.output(t.g.l2_normalize(t.acc), "unit", DType::BF16);
  LoweringResult r = lower(t.g);
  const FusionSpec& fs = r.regions.at(0).spec;
  int stages = 0;
  for (const Spec* s = &fs.root; !s->children.empty(); s = &s->children[0]) {
    EXPECT_LE(tile_bypasses(s->children[0]), 1) << "stage " << stages + 1;
    ++stages;
  }
  EXPECT_EQ(stages, fs.stage_count() - 1);
  // acc - max is computed in stage 1 for exp() and again in stage 2 for the output.
  struct CountSubs : SpecVisitor {
    int n = 0;
    void visit(const Spec&, int, const SpecNode& node, int) override {
      n += node.category == NodeCategory::Compute && node.compute == ComputeKind::Binary && node.binary == BinaryOp::Sub;
    }
  } counter;
  counter.walk(fs.root);
  EXPECT_GE(counter.n, 3);  // x - max twice, then shifted - log(sum)
}

// X x X^T (a Gram matrix, attention with shared Q and K): one graph input, two arguments.
TEST(Lower, OneInputBindsBothOperands) {
  Graph g;
  Value x = g.input("x", DType::BF16, {Dim::of("M"), Dim::of("K")});
  g.output(g.matmul(x, x), "gram", DType::F32);
  LoweringResult r = lower(g);
  ASSERT_EQ(r.regions.size(), 1u);
  const FusionSpec& fs = r.regions[0].spec;
  ASSERT_EQ(fs.args.size(), 3u);
  EXPECT_EQ(fs.args[0].role, ArgRole::OperandA);
  EXPECT_EQ(fs.args[1].role, ArgRole::OperandB);
  EXPECT_EQ(fs.args[0].name, "x");
  EXPECT_EQ(fs.args[1].name, "x");
  EXPECT_EQ(fs.args[0].graph_node, fs.args[1].graph_node);
  EXPECT_EQ(fs.n, Dim::of("M"));
  EXPECT_NO_THROW(verify(fs));
  EXPECT_EQ(parse_spec(print(fs)), fs);
}

TEST(Lower, NothingToFuseIsAnError) {
  auto says = [](const Graph& g, const std::string& needle) {
    try {
      lower(g);
      ADD_FAILURE() << "expected an Error mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  Gemm none;
  says(none.g, "nothing to fuse: the graph has no outputs");
  Graph no_mm;
  no_mm.output(no_mm.unary(UnaryOp::Relu, no_mm.input("x", DType::BF16, {Dim::of("M"), Dim::of("N")})), "y",
               DType::BF16);
  says(no_mm, "nothing to fuse: the graph has no matmul");
  Gemm dead;
  dead.g.output(dead.row("bias") * 2.0, "b2", DType::BF16);
  says(dead.g, "nothing to fuse: no output depends on a matmul (matmul");
  Gemm input_out;
  input_out.g.output(input_out.x, "x_again", DType::BF16);
  says(input_out.g, "output 'x_again' is the graph input 'x' itself");
  Gemm const_out;
  const_out.g.output(const_out.g.constant(2), "two", DType::F32);
  says(const_out.g, "output 'two' is the constant 2");
}

// Outputs bind by name at run time, as inputs do: one name, one tensor.
TEST(Lower, OutputNamesMustNotAliasOtherValues) {
  Gemm t;
  Value y = t.g.unary(UnaryOp::Relu, t.acc);
  try {
    t.g.output(y, "x", DType::BF16);
    FAIL() << "an output named like input x";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("output name 'x' is already the name of the input 'x'"), std::string::npos)
        << e.what();
  }
  t.g.output(y, "y_out", DType::BF16);
  EXPECT_THROW(t.g.input("y_out", DType::BF16, {Dim::of("N")}), Error);  // a later value may not take it either
  EXPECT_NO_THROW(t.g.output(t.acc, "acc_out", DType::F32));
}

// Names the graph made up ("%reduce3") reach messages in the user's terms.
TEST(Lower, AutoNamedValuesAreDescribedInTheUsersTerms) {
  Gemm t;
  Value inner = t.g.reduce(ReduceOp::Sum, t.acc);
  Value s = t.g.reduce(ReduceOp::Sum, inner);
  t.g.rename(s, "s");
  t.g.output(s, "s", DType::F32);
  LoweringResult r = lower(t.g);
  const FusionSpec& fs = r.regions.at(0).spec;
  ASSERT_EQ(inner.node().name[0], '%');
  EXPECT_EQ(fs.describe(inner.node().name), "sum(matmul(x, w)) feeding 's'");
  EXPECT_EQ(fs.describe("x"), "'x'");
}

// describe() lists a made-up value as the expression computing it, in the user's names, with
// the named value it feeds (an API graph has no lines to point at), and a value stored as an
// output by that output's name; the fused list names temporaries one call deep.
TEST(Lower, DescribeListsMadeUpValuesAsExpressions) {
  Gemm t;
  Value h = t.row("h");
  Value centered = h - t.g.reduce(ReduceOp::Mean, h);  // no accumulator: a fallback
  t.g.output(t.acc * centered, "y", DType::BF16);
  t.g.output(t.g.reduce(ReduceOp::Sum, centered), "s", DType::F32);
  LoweringResult r = lower(t.g);
  const std::string text = describe(t.g, r);
  const std::string why = ": does not depend on a GEMM accumulator: computed before the kernel and passed as a runtime "
                          "argument\n";
  EXPECT_NE(text.find("fallback: mean(h) feeding 'y'" + why), std::string::npos) << text;
  EXPECT_NE(text.find("fallback: sub(h, mean(h)) feeding 'y'" + why), std::string::npos) << text;
  EXPECT_NE(text.find("fallback: 's' (reduce)" + why), std::string::npos) << text;
  EXPECT_NE(text.find("GEMM matmul(x, w) feeding 'y' + 1 epilogue node(s)"), std::string::npos) << text;
  EXPECT_NE(text.find("  fused: matmul(x, w); y\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("fallback: '%"), std::string::npos) << text;
  // A per-segment reduction says so (it would read as the whole row's).
  Gemm s;
  Value hs = s.row("h");
  s.g.output(s.acc * (hs - s.g.reduce(ReduceOp::Mean, hs, -1, 64)), "y", DType::BF16);
  const std::string seg = describe(s.g, lower(s.g));
  EXPECT_NE(seg.find("fallback: mean(h, segment=64)"), std::string::npos) << seg;
}

TEST(Lower, WarnsWhereALiteralLeavesF32sRange) {
  Gemm t;
  t.g.output((t.acc + 1e300) * 1e-50 + 0.5, "y", DType::BF16);
  LoweringResult r = lower(t.g);
  ASSERT_EQ(r.warnings.size(), 2u);
  EXPECT_NE(r.warnings[0].find("the constant 1e+300 feeding 'y' rounds to inf in f32"), std::string::npos)
      << r.warnings[0];
  EXPECT_NE(r.warnings[1].find("the constant 1e-50 feeding 'y' rounds to 0 in f32"), std::string::npos)
      << r.warnings[1];
}

TEST(Lower, TransposeKeepsItsOperandsDtype) {
  Graph g;
  Value x = g.input("x", DType::F16, {Dim::of("K"), Dim::of("M")});
  Value w = g.input("w", DType::F16, {Dim::of("N"), Dim::of("K")});
  g.output(g.matmul(g.transpose(x), w), "y", DType::F16);
  LoweringResult r = lower(g);
  const FusionSpec& fs = r.regions.at(0).spec;
  EXPECT_EQ(fs.args.at(static_cast<size_t>(fs.arg_index(ArgRole::OperandA))).dtype, DType::F16);
  ASSERT_EQ(r.fallbacks.size(), 1u);
  EXPECT_NE(r.fallbacks[0].reason.find("already transposed"), std::string::npos) << r.fallbacks[0].reason;
}

}  // namespace
}  // namespace comfuse
