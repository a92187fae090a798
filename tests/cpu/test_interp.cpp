// CPU reference executors: closed-form checks of run_graph, run_spec and run_lowered.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>

#include "comfuse/interp.h"
#include "comfuse/lower.h"

namespace comfuse {
namespace {

Tensor T(std::vector<int64_t> shape, std::vector<double> data) { return Tensor{std::move(shape), std::move(data)}; }
double get(const Tensor& t, int64_t r, int64_t c) { return t.data.at(static_cast<size_t>(r * t.cols() + c)); }

// acc = x * w (w [N, K]) computed by hand.
Tensor hand_matmul_nk(const Tensor& x, const Tensor& w) {
  const int64_t M = x.shape[0], K = x.shape[1], N = w.shape[0];
  Tensor c{{M, N}, std::vector<double>(static_cast<size_t>(M * N), 0.0)};
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j)
      for (int64_t k = 0; k < K; ++k) c.data[i * N + j] += get(x, i, k) * get(w, j, k);
  return c;
}

struct Gemm {
  Graph g;
  Value x, w, acc;
  explicit Gemm(BLayout layout = BLayout::NK, DType dt = DType::BF16) {
    x = g.input("x", dt, {Dim::of("M"), Dim::of("K")});
    w = g.input("w", dt, layout == BLayout::NK ? Shape{Dim::of("N"), Dim::of("K")} : Shape{Dim::of("K"), Dim::of("N")});
    acc = g.matmul(x, w, layout);
  }
  Value row(const std::string& name, DType dt = DType::F32) { return g.input(name, dt, {Dim::of("N")}); }
  Value col(const std::string& name) { return g.input(name, DType::F32, {Dim::of("M"), Dim::of(1)}); }
  Value scalar(const std::string& name) { return g.input(name, DType::F32, {}); }
};

// One unit in the last place of `x` in storage type `t`.
double ulp(DType t, double x) {
  const int mant = t == DType::BF16 ? 7 : t == DType::F16 ? 10 : 23;
  const int emin = t == DType::BF16 ? -126 : t == DType::F16 ? -14 : -126;
  if (!std::isfinite(x) || x == 0) return std::ldexp(1.0, emin - mant);
  return std::ldexp(1.0, std::max(std::ilogb(x), emin) - mant);
}

// Runs the graph, its lowering (which must be one region without fallbacks) and checks
// both agree: equal up to fp64 reassociation, so at most one ulp of the output dtype.
// `abs_tol` admits the conditioning of inputs with a large common offset.
TensorMap run_both(const Graph& g, const Bindings& dims, const TensorMap& in, bool fallbacks_ok = false,
                   double abs_tol = 1e-12) {
  LoweringResult lr = lower(g);
  EXPECT_EQ(lr.regions.size(), 1u) << describe(g, lr);
  if (!fallbacks_ok) {
    EXPECT_TRUE(lr.fallbacks.empty()) << describe(g, lr);
  }
  TensorMap ref = run_graph(g, dims, in);
  TensorMap got = run_lowered(g, lr, dims, in);
  for (const GraphOutput& o : g.outputs()) {
    const Tensor &a = got.at(o.name), &b = ref.at(o.name);
    EXPECT_EQ(a.shape, b.shape);
    for (size_t i = 0; i < b.data.size(); ++i) {
      const double tol = std::max({1e-9 * std::fabs(b.data[i]), ulp(o.dtype, b.data[i]), abs_tol});
      EXPECT_LE(std::fabs(a.data[i] - b.data[i]), tol) << o.name << "[" << i << "]";
      if (std::fabs(a.data[i] - b.data[i]) > tol) break;
    }
  }
  return ref;
}

TEST(Tensor, BroadcastingReads) {
  Tensor s = T({}, {7});
  Tensor row = T({3}, {1, 2, 3});
  Tensor col = T({2, 1}, {10, 20});
  Tensor full = T({2, 3}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(s.at(1, 2), 7);
  EXPECT_EQ(row.at(1, 2), 3);
  EXPECT_EQ(col.at(1, 2), 20);
  EXPECT_EQ(full.at(1, 0), 4);
  EXPECT_EQ(full.numel(), 6);
  EXPECT_EQ(full.rows(), 2);
  EXPECT_EQ(row.rows(), 1);
  EXPECT_EQ(row.cols(), 3);
}

TEST(Compare, ReportsErrors) {
  Comparison c = compare(T({3}, {1, 2.5, 7}), T({3}, {1, 2, 7}));
  EXPECT_DOUBLE_EQ(c.max_abs, 0.5);
  EXPECT_DOUBLE_EQ(c.max_rel, 0.25);
  EXPECT_EQ(c.nonfinite, 0);
  EXPECT_EQ(compare(T({2}, {INFINITY, 1}), T({2}, {1, 1})).nonfinite, 1);
  EXPECT_THROW(compare(T({2}, {1, 1}), T({1, 2}, {1, 1})), Error);
}

// NaN or inf on both sides is not agreement: layer_norm with eps < 0 gives NaN in both
// executors, and such a check must fail.
TEST(Compare, NonFiniteOnEitherSideCounts) {
  Comparison c = compare(T({4}, {1, NAN, INFINITY, -INFINITY}), T({4}, {1, NAN, INFINITY, -INFINITY}));
  EXPECT_EQ(c.nonfinite, 3);
  EXPECT_EQ(c.rel_l2, 0.0);  // over the finite elements
  EXPECT_EQ(compare(T({2}, {1, 2}), T({2}, {NAN, 2})).nonfinite, 1);
  EXPECT_EQ(compare(T({2}, {1, NAN}), T({2}, {1, 2})).nonfinite, 1);
  // Of them, the ones that differ: a check that expects NaN (a NaN input propagated) asks this.
  EXPECT_EQ(c.nonfinite_differ, 0);
  EXPECT_EQ(compare(T({4}, {NAN, INFINITY, -INFINITY, 1}), T({4}, {INFINITY, -INFINITY, -INFINITY, NAN})).nonfinite_differ, 3);
}

TEST(Graph, MatMulBothLayoutsMatchHand) {
  Tensor x = T({3, 2}, {1, 2, 3, 4, 5, 6});
  Tensor w_nk = T({4, 2}, {1, 0, 0, 1, 1, 1, 2, -1});
  Tensor w_kn = T({2, 4}, {1, 0, 1, 2, 0, 1, 1, -1});
  const std::vector<double> want = {1, 2, 3, 0, 3, 4, 7, 2, 5, 6, 11, 4};
  for (BLayout layout : {BLayout::NK, BLayout::KN}) {
    Gemm t(layout, DType::F32);
    t.g.output(t.acc, "y", DType::F32);
    Bindings d{{"M", 3}, {"N", 4}, {"K", 2}};
    TensorMap in{{"x", x}, {"w", layout == BLayout::NK ? w_nk : w_kn}};
    TensorMap out = run_both(t.g, d, in);
    EXPECT_EQ(out.at("y").shape, (std::vector<int64_t>{3, 4}));
    EXPECT_EQ(out.at("y").data, want);
    // run_spec directly, fed by name.
    LoweringResult lr = lower(t.g);
    TensorMap s = run_spec(lr.regions.at(0).spec, d, in);
    EXPECT_EQ(s.at("y").data, want);
  }
}

TEST(Graph, BroadcastRowColScalar) {
  Graph g;
  Value x = g.input("x", DType::F32, {Dim::of("M"), Dim::of("N")});
  Value r = g.input("r", DType::F32, {Dim::of("N")});
  Value c = g.input("c", DType::F32, {Dim::of("M"), Dim::of(1)});
  Value s = g.input("s", DType::F32, {});
  g.output((x + r) * c - s, "y", DType::F32);
  g.output(c / s, "cs", DType::F32);
  g.output(r + g.constant(0.5), "rc", DType::F32);
  TensorMap out = run_graph(g, {{"M", 2}, {"N", 3}},
                            {{"x", T({2, 3}, {1, 2, 3, 4, 5, 6})}, {"r", T({3}, {10, 20, 30})},
                             {"c", T({2, 1}, {2, 3})}, {"s", T({}, {4})}});
  EXPECT_EQ(out.at("y").data, (std::vector<double>{18, 40, 62, 38, 71, 104}));
  EXPECT_EQ(out.at("cs").shape, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(out.at("cs").data, (std::vector<double>{0.5, 0.75}));
  EXPECT_EQ(out.at("rc").shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(out.at("rc").data, (std::vector<double>{10.5, 20.5, 30.5}));
}

TEST(Graph, CastsRoundAtKnownBoundaries) {
  Graph g;
  Value x = g.input("x", DType::F32, {Dim::of(6)});
  g.output(g.cast(x, DType::BF16), "b", DType::F32);
  g.output(g.cast(x, DType::F16), "h", DType::F32);
  g.output(g.cast(x, DType::F32), "f", DType::F32);
  g.output(x, "direct_bf16", DType::BF16);  // stored outputs round too
  const double e8 = std::ldexp(1.0, -8);
  TensorMap out = run_graph(g, {}, {{"x", T({6}, {1 + e8, 1 + 3 * e8, 65520, 65519, 1 + std::ldexp(1.0, -30), -0.0})}});
  const auto& b = out.at("b").data;
  EXPECT_EQ(b[0], 1.0);                        // tie -> even
  EXPECT_EQ(b[1], 1 + std::ldexp(1.0, -6));    // tie -> even (upward)
  const auto& h = out.at("h").data;
  EXPECT_EQ(h[1], 1 + 3 * e8);                 // representable in f16
  EXPECT_TRUE(std::isinf(h[2]) && h[2] > 0);   // 65520 overflows f16
  EXPECT_EQ(h[3], 65504);                      // largest finite f16
  EXPECT_EQ(out.at("f").data[4], 1.0);         // below f32 resolution
  EXPECT_TRUE(std::signbit(out.at("f").data[5]));
  EXPECT_EQ(out.at("direct_bf16").data, b);
}

TEST(Graph, PowWithScalarExponent) {
  Graph g;
  Value x = g.input("x", DType::F32, {Dim::of(1), Dim::of(3)});
  Value e = g.input("e", DType::F32, {});
  g.output(g.binary(BinaryOp::Pow, x, 2.0), "sq", DType::F32);
  g.output(g.binary(BinaryOp::Pow, x, e), "rt", DType::F32);
  TensorMap out = run_graph(g, {}, {{"x", T({1, 3}, {4, 9, 0.25})}, {"e", T({}, {0.5})}});
  EXPECT_EQ(out.at("sq").data, (std::vector<double>{16, 81, 0.0625}));
  EXPECT_EQ(out.at("rt").data, (std::vector<double>{2, 3, 0.5}));
}

TEST(Graph, ReductionsOverEitherDim) {
  Graph g;
  Value x = g.input("x", DType::F32, {Dim::of(2), Dim::of(3)});
  g.output(g.reduce(ReduceOp::Sum, x, 0), "sum0", DType::F32);
  g.output(g.reduce(ReduceOp::Mean, x, 0), "mean0", DType::F32);
  g.output(g.reduce(ReduceOp::Max, x, 0), "max0", DType::F32);
  g.output(g.reduce(ReduceOp::Min, x, -1), "min1", DType::F32);
  g.output(g.reduce(ReduceOp::Mean, x, 1), "mean1", DType::F32);
  g.output(g.reduce(ReduceOp::Sum, g.reduce(ReduceOp::Sum, x, 1), 0), "total", DType::F32);
  g.output(g.transpose(x), "xt", DType::F32);
  TensorMap out = run_graph(g, {}, {{"x", T({2, 3}, {1, -2, 3, 4, 5, -6})}});
  EXPECT_EQ(out.at("sum0").shape, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(out.at("sum0").data, (std::vector<double>{5, 3, -3}));
  EXPECT_EQ(out.at("mean0").data, (std::vector<double>{2.5, 1.5, -1.5}));
  EXPECT_EQ(out.at("max0").data, (std::vector<double>{4, 5, 3}));
  EXPECT_EQ(out.at("min1").shape, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(out.at("min1").data, (std::vector<double>{-2, -6}));
  EXPECT_EQ(out.at("mean1").data, (std::vector<double>{round_to(DType::F32, 2.0 / 3.0), 1.0}));  // stored f32
  EXPECT_EQ(out.at("total").shape, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(out.at("total").data, (std::vector<double>{5}));
  EXPECT_EQ(out.at("xt").shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(out.at("xt").data, (std::vector<double>{1, 4, -2, 5, 3, -6}));
}

// The causal mask against a hand-written loop: -inf where col > row of the [M, N] output, then a
// softmax over each row (row r weighs columns 0..r); M < N and M > N. run_lowered (the mask
// as a node of the Fusion Spec, run_spec) agrees.
TEST(Graph, CausalMaskMatchesHandLoop) {
  for (const auto& [M, N] : {std::pair<int64_t, int64_t>{5, 7}, {9, 4}}) {
    SCOPED_TRACE(testing::Message() << "M=" << M << " N=" << N);
    Gemm t;
    Value masked = t.g.causal_mask(t.acc * 0.5);
    t.g.output(masked, "masked", DType::F32);
    t.g.output(t.g.softmax(masked), "p", DType::F32);
    const Bindings d{{"M", M}, {"N", N}, {"K", 3}};
    std::mt19937_64 rng(3);
    const TensorMap in = random_inputs(t.g, d, rng);
    const TensorMap out = run_graph(t.g, d, in);
    const Tensor acc = hand_matmul_nk(in.at("x"), in.at("w"));
    for (int64_t r = 0; r < M; ++r) {
      double mx = -INFINITY, sum = 0;
      for (int64_t c = 0; c <= std::min(r, N - 1); ++c) mx = std::max(mx, 0.5 * get(acc, r, c));
      for (int64_t c = 0; c <= std::min(r, N - 1); ++c) sum += std::exp(0.5 * get(acc, r, c) - mx);
      for (int64_t c = 0; c < N; ++c) {
        const double want_masked = c > r ? -INFINITY : 0.5 * get(acc, r, c);
        const double want_p = c > r ? 0.0 : std::exp(0.5 * get(acc, r, c) - mx) / sum;
        EXPECT_EQ(get(out.at("masked"), r, c), want_masked) << r << ", " << c;
        EXPECT_NEAR(get(out.at("p"), r, c), want_p, ulp(DType::F32, want_p)) << r << ", " << c;  // stored as f32
      }
    }
    Gemm u;  // the softmax alone: -inf outputs compare as non-finite
    u.g.output(u.g.softmax(u.g.causal_mask(u.acc * 0.5)), "p", DType::F32);
    const TensorMap ref = run_both(u.g, d, in);
    EXPECT_EQ(compare(ref.at("p"), out.at("p")).max_abs, 0.0);
  }
}

// Checked on sampled rows (reference_rows), the mask reads each row's index in the whole
// problem from the RowSample: the rows come out as the full problem's.
TEST(Graph, CausalMaskOnSampledRows) {
  Gemm t;
  t.g.output(t.g.softmax(t.g.causal_mask(t.acc)), "p", DType::F32);
  EXPECT_TRUE(row_local(t.g, "M"));
  const Bindings d{{"M", 100}, {"N", 80}, {"K", 8}};
  std::mt19937_64 rng(4);
  const TensorMap in = random_inputs(t.g, d, rng);
  const Tensor full = run_graph(t.g, d, in).at("p");
  const std::vector<int64_t> rows = {0, 7, 50, 79, 80, 99};
  TensorMap some = in;
  Tensor& x = some.at("x");
  x.shape[0] = static_cast<int64_t>(rows.size());
  x.data.clear();
  for (int64_t r : rows)
    for (int64_t k = 0; k < 8; ++k) x.data.push_back(get(in.at("x"), r, k));
  const Tensor got = run_graph(t.g, {{"M", 6}, {"N", 80}, {"K", 8}}, some, RowSample{"M", rows}).at("p");
  for (size_t i = 0; i < rows.size(); ++i)
    for (int64_t c = 0; c < 80; ++c) EXPECT_EQ(get(got, static_cast<int64_t>(i), c), get(full, rows[i], c)) << rows[i];
  EXPECT_EQ(get(got, 1, 8), 0.0);  // row 7 weighs columns 0..7 only
  EXPECT_GT(get(got, 1, 7), 0.0);
}

TEST(Graph, MissingOrMisshapedInputIsNamed) {
  Gemm t;
  t.g.output(t.acc + t.row("bias"), "y", DType::BF16);
  Bindings d{{"M", 2}, {"N", 3}, {"K", 4}};
  std::mt19937_64 rng(1);
  TensorMap in = random_inputs(t.g, d, rng);
  TensorMap missing = in;
  missing.erase("bias");
  try {
    run_graph(t.g, d, missing);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'bias'"), std::string::npos) << e.what();
  }
  TensorMap bad = in;
  bad["w"] = T({3, 5}, std::vector<double>(15, 1.0));
  try {
    run_graph(t.g, d, bad);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(run_lowered(t.g, lower(t.g), d, missing), Error);
}

TEST(RandomInputs, ShapesDtypesNoZeros) {
  Gemm t(BLayout::KN);
  Value s = t.scalar("alpha");
  Value b = t.row("bias", DType::BF16);
  Value c = t.col("cv");
  Value res = t.g.input("res", DType::F16, {Dim::of("M"), Dim::of("N")});
  t.g.output(t.acc * s + b + c + res, "y", DType::BF16);
  Bindings d{{"M", 5}, {"N", 7}, {"K", 64}};
  std::mt19937_64 rng(3);
  TensorMap in = random_inputs(t.g, d, rng, 100.0);
  EXPECT_EQ(in.at("x").shape, (std::vector<int64_t>{5, 64}));
  EXPECT_EQ(in.at("w").shape, (std::vector<int64_t>{64, 7}));
  EXPECT_EQ(in.at("alpha").shape, (std::vector<int64_t>{}));
  EXPECT_EQ(in.at("cv").shape, (std::vector<int64_t>{5, 1}));
  for (const auto& [name, tensor] : in) {
    const DType dt = t.g.node(t.g.find(name)).dtype;
    for (double v : tensor.data) {
      EXPECT_NE(v, 0.0) << name;
      EXPECT_EQ(round_to(dt, v), v) << name;
    }
  }
  const double a = in.at("alpha").data[0];
  EXPECT_TRUE(a >= 0.5 && a <= 2.0);
  for (double v : in.at("bias").data) EXPECT_TRUE(std::fabs(v - 100) >= 0.49 && std::fabs(v - 100) <= 1.51) << v;
  double mean = 0;
  for (double v : in.at("res").data) mean += v / 35;
  EXPECT_NEAR(mean, 100, 1.0);
  // GEMM operands are scaled so that acc ~ N(0, 1).
  TensorMap out = run_graph(t.g, d, in);
  std::vector<Tensor> all = run_graph_all(t.g, d, in);
  double ss = 0;
  for (double v : all[t.acc.id].data) ss += v * v;
  EXPECT_GT(ss / 35, 0.2);
  EXPECT_LT(ss / 35, 5.0);
}

// --- tiled reductions --------------------------------------------------------------------

TEST(ReduceTiled, PaddedIdentityMatters) {
  // A ragged row of negative values: 300 columns = one full 256 tile + a 44-wide tail.
  std::vector<double> x(300);
  for (size_t i = 0; i < x.size(); ++i) x[i] = -1.0 - 0.01 * static_cast<double>(i % 17);
  const ReduceTiling tiling;  // 256 wide
  EXPECT_EQ(reduce_row_tiled(ReduceOp::Max, x.data(), 300, tiling), -1.0);
  EXPECT_EQ(reduce_row_tiled(ReduceOp::Min, x.data(), 300, tiling), -1.16);
  ReduceTiling zero_pad;
  zero_pad.pad = 0.0;  // what a kernel that forgets the identity would do
  EXPECT_EQ(reduce_row_tiled(ReduceOp::Max, x.data(), 300, zero_pad), 0.0);
  // Mean divides by the true length, not the padded 512.
  double sum = 0;
  for (double v : x) sum += v;
  EXPECT_NEAR(reduce_row_tiled(ReduceOp::Mean, x.data(), 300, tiling), sum / 300, 1e-14);
  // Every tiling gives the same answer up to reassociation.
  for (int64_t tile : {1, 3, 64, 128, 256, 1024})
    for (int lanes : {1, 4, 8}) {
      ReduceTiling t;
      t.tile_n = tile;
      t.lanes = lanes;
      EXPECT_NEAR(reduce_row_tiled(ReduceOp::Sum, x.data(), 300, t), sum, 1e-12);
      EXPECT_EQ(reduce_row_tiled(ReduceOp::Max, x.data(), 300, t), -1.0);
    }
}

TEST(ReduceTiled, RunSpecUsesIdentityForRaggedTail) {
  // softmax-like max over an all-negative ragged tile, through run_spec.
  Gemm t(BLayout::NK, DType::F32);
  Value neg = t.g.unary(UnaryOp::Neg, t.g.unary(UnaryOp::Abs, t.acc)) - 1.0;
  t.g.output(t.g.reduce(ReduceOp::Max, neg), "m", DType::F32);
  t.g.output(neg - t.g.reduce(ReduceOp::Max, neg), "shifted", DType::F32);
  Bindings d{{"M", 3}, {"N", 300}, {"K", 5}};
  std::mt19937_64 rng(11);
  TensorMap in = random_inputs(t.g, d, rng);
  TensorMap ref = run_both(t.g, d, in);
  for (double v : ref.at("m").data) EXPECT_LT(v, -1.0 + 1e-6);
  LoweringResult lr = lower(t.g);
  ReduceTiling zero_pad;
  zero_pad.pad = 0.0;
  TensorMap wrong = run_lowered(t.g, lr, d, in, zero_pad);
  for (double v : wrong.at("m").data) EXPECT_EQ(v, 0.0);  // the bug the identity prevents
  EXPECT_GT(compare(wrong.at("shifted"), ref.at("shifted")).max_abs, 0.5);
}

// --- composites, closed forms --------------------------------------------------------------

struct RowStats {
  double mean = 0, var = 0;
};
RowStats stats(const Tensor& t, int64_t r) {
  RowStats s;
  const int64_t n = t.cols();
  for (int64_t c = 0; c < n; ++c) s.mean += get(t, r, c) / n;
  for (int64_t c = 0; c < n; ++c) s.var += (get(t, r, c) - s.mean) * (get(t, r, c) - s.mean) / n;
  return s;
}

TEST(Composite, LayerNormClosedFormAndLargeOffset) {
  for (double offset : {0.0, 1e6}) {
    Gemm t;
    Value alpha = t.scalar("alpha");
    Value x = t.acc * alpha + t.row("bias");
    Value y = t.g.layer_norm(x, Value{}, Value{}, 0.0);  // eps 0: exact unit variance
    t.g.output(y, "y", DType::F32);
    Value gamma = t.row("gamma"), beta = t.row("beta");
    t.g.output(t.g.layer_norm(x, gamma, beta), "z", DType::F32);
    Bindings d{{"M", 9}, {"N", 333}, {"K", 24}};
    std::mt19937_64 rng(5);
    TensorMap in = random_inputs(t.g, d, rng, offset);
    std::mt19937_64 rng0(6);
    TensorMap in0 = random_inputs(t.g, d, rng0);
    in["gamma"] = in0["gamma"];  // the offset is meant for the bias; keep gamma, beta O(1)
    in["beta"] = in0["beta"];
    std::vector<Tensor> all = run_graph_all(t.g, d, in);
    const Tensor& xv = all[x.id];
    if (offset > 0) {
      RowStats s = stats(xv, 0);
      EXPECT_GT(std::fabs(s.mean), 1e3 * std::sqrt(s.var));  // mean >> std
    }
    const Tensor& yv = all[y.id];
    double naive_err = 0;
    for (int64_t r = 0; r < 9; ++r) {
      RowStats s = stats(yv, r);
      // The mean of x carries an fp64 error ~ offset * 1e-16, which the centered values inherit.
      EXPECT_NEAR(s.mean, 0.0, 1e-12 + 1e-15 * offset) << offset;
      EXPECT_NEAR(s.var, 1.0, 1e-9) << offset;  // two-stage variance: no cancellation
      double ex = 0, ex2 = 0;
      for (int64_t c = 0; c < 333; ++c) ex += get(xv, r, c) / 333, ex2 += get(xv, r, c) * get(xv, r, c) / 333;
      naive_err = std::max(naive_err, std::fabs((ex2 - ex * ex) / stats(xv, r).var - 1));
    }
    if (offset > 0) {
      EXPECT_GT(naive_err, 1e-6);  // what E[x^2] - E[x]^2 would have cost
    }
    // Against the direct formula (x computed by hand).
    Tensor acc = hand_matmul_nk(in.at("x"), in.at("w"));
    TensorMap ref = run_both(t.g, d, in, false, 1e-12 + 1e-15 * offset);
    const double a = in.at("alpha").data[0];
    for (int64_t r = 0; r < 9; ++r) {
      double mean = 0, var = 0;
      for (int64_t c = 0; c < 333; ++c) mean += (get(acc, r, c) * a + in.at("bias").data[c]) / 333;
      for (int64_t c = 0; c < 333; ++c) var += std::pow(get(acc, r, c) * a + in.at("bias").data[c] - mean, 2) / 333;
      for (int64_t c = 0; c < 333; ++c) {
        const double want = (get(acc, r, c) * a + in.at("bias").data[c] - mean) / std::sqrt(var + 1e-5) *
                                in.at("gamma").data[c] + in.at("beta").data[c];
        EXPECT_NEAR(get(ref.at("z"), r, c), want, 1e-6 * std::max(1.0, std::fabs(want)) + 1e-9 * std::fabs(offset));
      }
    }
  }
}

TEST(Composite, RmsNorm) {
  Gemm t;
  Value y = t.g.rms_norm(t.acc + t.col("cbias"), Value{}, 0.0);
  t.g.output(y, "y", DType::F32);
  Value gamma = t.row("gamma");
  t.g.output(t.g.rms_norm(t.acc, gamma), "z", DType::F32);
  Bindings d{{"M", 7}, {"N", 257}, {"K", 16}};
  std::mt19937_64 rng(8);
  TensorMap in = random_inputs(t.g, d, rng);
  std::vector<Tensor> all = run_graph_all(t.g, d, in);
  for (int64_t r = 0; r < 7; ++r) {
    double ms = 0;
    for (int64_t c = 0; c < 257; ++c) ms += std::pow(get(all[y.id], r, c), 2) / 257;
    EXPECT_NEAR(ms, 1.0, 1e-12);
  }
  TensorMap ref = run_both(t.g, d, in);
  Tensor acc = hand_matmul_nk(in.at("x"), in.at("w"));
  for (int64_t r = 0; r < 7; ++r) {
    double ms = 0;
    for (int64_t c = 0; c < 257; ++c) ms += get(acc, r, c) * get(acc, r, c) / 257;
    for (int64_t c = 0; c < 257; ++c) {
      const double want = get(acc, r, c) / std::sqrt(ms + 1e-6) * in.at("gamma").data[c];
      EXPECT_NEAR(get(ref.at("z"), r, c), want, 1e-6 * std::max(1.0, std::fabs(want)));
    }
  }
}

TEST(Composite, SoftmaxSumsToOneShiftInvariantDirect) {
  Gemm t;
  Value s = t.g.softmax(t.acc);
  t.g.output(s, "p", DType::F32);
  Value shifted = t.g.softmax(t.acc + t.col("shift") + t.scalar("k"));
  t.g.output(shifted, "q", DType::F32);
  Value ls = t.g.log_softmax(t.acc);
  t.g.output(ls, "lp", DType::F32);
  Bindings d{{"M", 6}, {"N", 300}, {"K", 33}};
  std::mt19937_64 rng(9);
  TensorMap in = random_inputs(t.g, d, rng, 50.0);  // shift ~ 50 +- 1.5 per row
  std::vector<Tensor> all = run_graph_all(t.g, d, in);
  Tensor acc = hand_matmul_nk(in.at("x"), in.at("w"));
  for (int64_t r = 0; r < 6; ++r) {
    double sum = 0, esum = 0, denom = 0;
    for (int64_t c = 0; c < 300; ++c) denom += std::exp(get(acc, r, c));
    for (int64_t c = 0; c < 300; ++c) {
      sum += get(all[s.id], r, c);
      esum += std::exp(get(all[ls.id], r, c));
      EXPECT_NEAR(get(all[s.id], r, c), get(all[shifted.id], r, c), 1e-15);
      EXPECT_NEAR(get(all[s.id], r, c), std::exp(get(acc, r, c)) / denom, 1e-15);
    }
    EXPECT_NEAR(sum, 1.0, 1e-13);
    EXPECT_NEAR(esum, 1.0, 1e-13);
  }
  run_both(t.g, d, in);
}

TEST(Composite, L2NormalizeUnitNorm) {
  Gemm t(BLayout::KN);
  Value y = t.g.l2_normalize(t.g.unary(UnaryOp::GeluErf, t.acc));
  t.g.output(y, "y", DType::F32);
  Bindings d{{"M", 4}, {"N", 513}, {"K", 8}};
  std::mt19937_64 rng(10);
  TensorMap in = random_inputs(t.g, d, rng);
  std::vector<Tensor> all = run_graph_all(t.g, d, in);
  for (int64_t r = 0; r < 4; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < 513; ++c) ss += std::pow(get(all[y.id], r, c), 2);
    EXPECT_NEAR(ss, 1.0, 1e-13);
  }
  run_both(t.g, d, in);
}

// --- run_spec on hand-built specs (independent of Φ) ----------------------------------------

SpecNode node(NodeCategory c, ValueClass v, std::vector<int> ops = {}) {
  SpecNode n;
  n.category = c;
  n.value_class = v;
  n.operands = std::move(ops);
  return n;
}

TEST(RunSpec, HandBuiltTwoStageCentering) {
  // y = (acc * alpha + bias) - mean(acc * alpha + bias); m = mean (a Col output).
  FusionSpec fs;
  fs.name = "hand";
  fs.m = Dim::of("M");
  fs.n = Dim::of("N");
  fs.k = Dim::of("K");
  fs.args = {RuntimeArg{"x", ArgRole::OperandA, DType::F32, {Dim::of("M"), Dim::of("K")}, ValueClass::Tile, -1},
             RuntimeArg{"w", ArgRole::OperandB, DType::F32, {Dim::of("N"), Dim::of("K")}, ValueClass::Tile, -1},
             RuntimeArg{"alpha", ArgRole::Scalar, DType::F32, {}, ValueClass::Tile, -1},
             RuntimeArg{"bias", ArgRole::RowVector, DType::F32, {Dim::of("N")}, ValueClass::Tile, -1},
             RuntimeArg{"y", ArgRole::Output, DType::F32, {Dim::of("M"), Dim::of("N")}, ValueClass::Tile, -1},
             RuntimeArg{"m", ArgRole::Output, DType::BF16, {Dim::of("M"), Dim::of(1)}, ValueClass::Col, -1}};
  Spec& s0 = fs.root;
  s0.nodes.push_back(node(NodeCategory::AccEntry, ValueClass::Tile));
  SpecNode alpha = node(NodeCategory::Broadcast, ValueClass::Scalar);
  alpha.arg = 2;
  s0.nodes.push_back(alpha);
  SpecNode mul = node(NodeCategory::Compute, ValueClass::Tile, {0, 1});
  mul.compute = ComputeKind::Binary;
  mul.binary = BinaryOp::Mul;
  s0.nodes.push_back(mul);
  SpecNode bias = node(NodeCategory::Broadcast, ValueClass::Row);
  bias.broadcast = BroadcastKind::Row;
  bias.arg = 3;
  s0.nodes.push_back(bias);
  SpecNode add = mul;
  add.operands = {2, 3};
  add.binary = BinaryOp::Add;
  s0.nodes.push_back(add);  // 4: x
  SpecNode red = node(NodeCategory::Reduction, ValueClass::Col, {4});
  red.reduce = ReduceOp::Mean;
  red.post = 0;
  s0.nodes.push_back(red);
  s0.terminal = 5;
  Spec s1;
  s1.nodes.push_back(node(NodeCategory::Placeholder, ValueClass::Col));  // stat
  SpecNode by = node(NodeCategory::Placeholder, ValueClass::Tile);
  by.placeholder = PlaceholderKind::Bypass;
  by.source = 4;
  s1.nodes.push_back(by);
  SpecNode sub = mul;
  sub.operands = {1, 0};
  sub.binary = BinaryOp::Sub;
  s1.nodes.push_back(sub);
  SpecNode st = node(NodeCategory::Store, ValueClass::Tile, {2});
  st.arg = 4;
  s1.nodes.push_back(st);
  SpecNode st2 = node(NodeCategory::Store, ValueClass::Col, {0});
  st2.arg = 5;
  s1.nodes.push_back(st2);
  s1.terminal = 4;
  s0.children.push_back(s1);

  const int64_t M = 3, N = 5, K = 2;
  TensorMap args{{"x", T({M, K}, {1, 2, 3, 4, 5, 6})},
                 {"w", T({N, K}, {1, 0, 0, 1, 1, 1, 2, -1, 0.5, 0.5})},
                 {"alpha", T({}, {2})},
                 {"bias", T({N}, {1, 2, 3, 4, 5})}};
  TensorMap out = run_spec(fs, {}, args);
  ASSERT_EQ(out.at("y").shape, (std::vector<int64_t>{M, N}));
  ASSERT_EQ(out.at("m").shape, (std::vector<int64_t>{M, 1}));
  // Row 0: acc = [1, 2, 3, 0, 1.5]; x = 2 acc + bias = [3, 6, 9, 4, 8]; mean 6.
  EXPECT_EQ(out.at("m").data[0], 6.0);
  EXPECT_EQ(std::vector<double>(out.at("y").data.begin(), out.at("y").data.begin() + 5),
            (std::vector<double>{-3, 0, 3, -2, 2}));
  // Structural mistakes are reported, not executed.
  FusionSpec bad = fs;
  bad.root.children[0].nodes[1].source = 9;
  EXPECT_THROW(run_spec(bad, {}, args), Error);
  bad = fs;
  bad.root.children[0].nodes[4].operands = {2};  // a Tile into a Col output
  EXPECT_THROW(run_spec(bad, {}, args), Error);
  bad = fs;
  bad.root.nodes[1].arg = 3;  // scalar broadcast of a row vector
  EXPECT_THROW(run_spec(bad, {}, args), Error);
  TensorMap missing = args;
  missing.erase("bias");
  EXPECT_THROW(run_spec(fs, {}, missing), Error);
  EXPECT_THROW(run_spec(fs, {{"M", 4}}, args), Error);  // dims disagree with the operands
}

// X x X^T: run_lowered binds the one input to both operands.
TEST(Lowered, OneInputAsBothOperands) {
  Graph g;
  Value x = g.input("x", DType::F32, {Dim::of("M"), Dim::of("K")});
  g.output(g.matmul(x, x), "gram", DType::F32);
  const Tensor xs = T({2, 3}, {1, 2, 3, -1, 0, 2});
  const TensorMap in{{"x", xs}};
  const Bindings d{{"M", 2}, {"K", 3}};
  const TensorMap got = run_lowered(g, lower(g), d, in);
  EXPECT_EQ(got.at("gram").data, hand_matmul_nk(xs, xs).data);
  EXPECT_EQ(got.at("gram").data, (std::vector<double>{14, 5, 5, 5}));
}

// The reference check's tolerance follows what is rounded on the way: a region's f32 store
// that an op outside reads back loosens an f32 output from fp64 reassociation to f32 rounding.
TEST(Lowered, ToleranceFollowsStoredIntermediates) {
  Gemm t(BLayout::NK, DType::BF16);
  Value y = t.g.unary(UnaryOp::GeluTanh, t.acc);
  t.g.output(t.g.unary(UnaryOp::Exp, t.g.transpose(y)), "z", DType::F32);  // transpose: a fallback
  t.g.output(y, "y", DType::F32);                                           // stored, read by nothing outside
  t.g.output(t.g.unary(UnaryOp::Relu, t.acc), "r", DType::BF16);
  const LoweringResult lr = lower(t.g);
  ASSERT_EQ(lr.fallbacks.size(), 2u);
  EXPECT_EQ(reference_tolerance(t.g, lr, t.g.outputs()[0]), 1e-6);
  EXPECT_EQ(reference_tolerance(t.g, lr, t.g.outputs()[1]), 1e-9);
  EXPECT_EQ(reference_tolerance(t.g, lr, t.g.outputs()[2]), 4e-3);
  const Bindings d{{"M", 40}, {"N", 56}, {"K", 64}};
  std::mt19937_64 rng(5);
  const TensorMap in = random_inputs(t.g, d, rng);
  const TensorMap ref = run_graph(t.g, d, in), low = run_lowered(t.g, lr, d, in);
  const Comparison c = compare(low.at("z"), ref.at("z"));
  EXPECT_GT(c.rel_l2, 1e-9);  // the f32 rounding of y shows
  EXPECT_LE(c.rel_l2, 1e-6);
}

TEST(Lowered, RowLocality) {
  Gemm t;
  t.g.output(t.g.layer_norm(t.acc, t.row("gamma"), t.row("beta")), "y", DType::BF16);
  EXPECT_TRUE(row_local(t.g, "M"));
  EXPECT_FALSE(row_local(t.g, ""));
  Gemm cols;
  cols.g.output(cols.g.reduce(ReduceOp::Sum, cols.acc, 0), "colsum", DType::F32);  // across rows
  EXPECT_FALSE(row_local(cols.g, "M"));
  Graph gram;
  Value x = gram.input("x", DType::BF16, {Dim::of("M"), Dim::of("K")});
  gram.output(gram.matmul(x, x), "g", DType::F32);  // B has M rows too
  EXPECT_FALSE(row_local(gram, "M"));
  EXPECT_EQ(reference_rows(100000, 256, 256).size(), 48u);
  EXPECT_EQ(reference_rows(1000, 256, 256).size(), 1000u);
}

// Intermediates are freed after their last use, so the estimate (and the executors) hold a
// few tensors of a long chain, not all of them; beyond the budget the check is refused.
TEST(Lowered, MemoryOfLongChainsStaysBounded) {
  Gemm t;
  Value v = t.acc;
  for (int i = 0; i < 5000; ++i) v = t.g.unary(i % 2 ? UnaryOp::Relu : UnaryOp::Neg, v);
  t.g.output(v, "y", DType::F32);
  const Bindings d{{"M", 256}, {"N", 1024}, {"K", 64}};
  const int64_t tile = 8 * 256 * 1024;  // one fp64 [M, N] tensor
  const int64_t bytes = reference_memory_bytes(t.g, d);
  EXPECT_GT(bytes, 2 * tile);
  EXPECT_LT(bytes, 8 * tile) << "5000 intermediates of " << tile << " bytes each must not all stay alive";
  try {
    check_reference_memory(t.g, d, /*budget=*/tile);
    FAIL() << "over the budget";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the fp64 CPU reference would hold about"), std::string::npos) << e.what();
  }
  // A 500-node chain runs, and both executors agree.
  Gemm small;
  Value s = small.acc;
  for (int i = 0; i < 500; ++i) s = small.g.binary(BinaryOp::Add, s, small.row("b" + std::to_string(i)));
  small.g.output(s, "y", DType::F32);
  const Bindings sd{{"M", 8}, {"N", 16}, {"K", 64}};
  std::mt19937_64 rng(3);
  const TensorMap in = random_inputs(small.g, sd, rng);
  const Comparison c = compare(run_lowered(small.g, lower(small.g), sd, in).at("y"), run_graph(small.g, sd, in).at("y"));
  EXPECT_EQ(c.nonfinite, 0);
  EXPECT_LE(c.rel_l2, 1e-12);
}

// COMFUSE_REFERENCE_GIB as the caller had it, restored however the test ends.
struct SavedReferenceBudget {
  std::optional<std::string> value;
  SavedReferenceBudget() {
    if (const char* v = std::getenv("COMFUSE_REFERENCE_GIB")) value = v;
  }
  ~SavedReferenceBudget() {
    if (value) setenv("COMFUSE_REFERENCE_GIB", value->c_str(), 1);
    else unsetenv("COMFUSE_REFERENCE_GIB");
  }
};

// The budget is COMFUSE_REFERENCE_GIB GiB where set (a vocabulary-sized B in fp64 needs more than
// the 4 GiB default), and a value that is not a positive number is refused by name.
TEST(Lowered, ReferenceBudgetFromTheEnvironment) {
  const SavedReferenceBudget saved;
  Graph g;
  Value a = g.input("a", DType::BF16, {Dim::of("M"), Dim::of("K")});
  Value w = g.input("w", DType::BF16, {Dim::of("N"), Dim::of("K")});
  g.output(g.softmax(g.matmul(a, w)), "p", DType::F32);
  const Bindings lm_head{{"M", 48}, {"N", 128256}, {"K", 4096}};  // the GPU check's 48 sampled rows
  ASSERT_EQ(unsetenv("COMFUSE_REFERENCE_GIB"), 0);
  EXPECT_EQ(reference_memory_budget(), kReferenceMemoryBudget);
  try {
    check_reference_memory(g, lm_head);
    FAIL() << "4.19 GiB against 4";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("its budget is 4.00 GiB"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("COMFUSE_REFERENCE_GIB"), std::string::npos) << e.what();
  }
  ASSERT_EQ(setenv("COMFUSE_REFERENCE_GIB", "8", 1), 0);
  EXPECT_EQ(reference_memory_budget(), int64_t{8} << 30);
  EXPECT_NO_THROW(check_reference_memory(g, lm_head));
  for (const char* bad : {"-1", "0", "lots", "8GiB"}) {
    ASSERT_EQ(setenv("COMFUSE_REFERENCE_GIB", bad, 1), 0);
    try {
      reference_memory_budget();
      FAIL() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("COMFUSE_REFERENCE_GIB = '" + std::string(bad) + "'"), std::string::npos)
          << e.what();
    }
  }
}

TEST(Lowered, SizesAreCheckedBeforeAnyAllocation) {
  Gemm t;
  t.g.output(t.acc, "y", DType::F32);
  const LoweringResult lr = lower(t.g);
  for (const auto& [dims, says] : std::vector<std::pair<Bindings, std::string>>{
           {{{"M", 0}, {"N", 8}, {"K", 8}}, "M = 0: a dimension must be at least 1"},
           {{{"M", 8}, {"N", -3}, {"K", 8}}, "N = -3: a dimension must be at least 1"},
           {{{"M", 8}, {"N", 8}, {"K", int64_t{1} << 31}}, "K = 2147483648 exceeds 2147483392"}}) {
    for (int which = 0; which < 3; ++which) {
      try {
        std::mt19937_64 rng(1);
        if (which == 0) run_graph(t.g, dims, {});
        if (which == 1) run_lowered(t.g, lr, dims, {});
        if (which == 2) random_inputs(t.g, dims, rng);
        ADD_FAILURE() << "expected an Error mentioning " << says;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
      }
    }
  }
}

}  // namespace
}  // namespace comfuse
