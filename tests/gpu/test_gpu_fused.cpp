// GPU correctness of the fused GEMM + Stage-Stream epilogue, against the fp64
// graph executor on random inputs. Skips, saying why, on a machine without an sm_90 GPU.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <functional>

#include "comfuse/runtime.h"
#include "gpu/gpu_support.h"

namespace comfuse {
namespace {

using gpu_test::expect_outputs_match;
using Case = gpu_test::GemmCase;
using Gpu = gpu_test::GpuTest;

void expect_matches(const Graph& g, Bindings dims, const CompileOptions& opt = {}, uint64_t seed = 7) {
  expect_outputs_match(run_and_check(g, dims, seed, opt));
}

const Bindings kRagged = {{"M", 1000}, {"N", 1032}, {"K", 72}};

// Four ops per kernel (one output each, the kernel's maximum) keeps JIT time down.
TEST_F(Gpu, EveryUnaryOp) {
  const int count = kUnaryOpCount;
  for (int first = 0; first < count; first += 4) {
    Case c;
    std::string names;
    for (int i = first; i < std::min(first + 4, count); ++i) {
      const UnaryOp op = static_cast<UnaryOp>(i);
      names += std::string(name_of(op)) + " ";
      // Domain-restricted ops see positive, well-scaled values.
      const bool positive = op == UnaryOp::Log || op == UnaryOp::Rsqrt || op == UnaryOp::Sqrt || op == UnaryOp::Reciprocal ||
                            op == UnaryOp::Log1p;
      Value in = positive ? c.g.unary(UnaryOp::Square, c.acc) + 0.5 : c.acc;
      c.g.output(c.g.unary(op, in), std::string(name_of(op)), DType::BF16);
    }
    SCOPED_TRACE(names);
    expect_matches(c.g, {{"M", 200}, {"N", 264}, {"K", 64}});
  }
}

// Every output of `rep` element by element: |got - fp64| <= bound * max(|fp64|, 1e-6).
void expect_each_element_within(const DeviceRunReport& rep, double bound) {
  expect_outputs_match(rep);
  for (const OutputCheck& o : rep.outputs) EXPECT_LE(o.cmp.max_rel, bound) << o.name << " max_abs " << o.cmp.max_abs;
}

// erf-GELU element by element over |x| up to ~17 (acc ~ N(0, 1), times 4), f32 out: within 1e-4
// of fp64 relative to max(|gelu|, 1e-6), the negative tail included, where the textbook
// 0.5 x (1 + erff(x / sqrt 2)) cancels (~10% off at x = -5). K = 16: one MMA step, so the
// accumulator's own rounding (amplified ~x^2 by gelu's tail) stays far below the bound.
TEST_F(Gpu, GeluErfAcrossItsRange) {
  Case c;
  c.g.output(c.g.unary(UnaryOp::GeluErf, c.acc * 4.0), "y", DType::F32);
  expect_each_element_within(run_and_check(c.g, {{"M", 200}, {"N", 264}, {"K", 16}}, 7), 1e-4);
}

// 1 + tanh(u) (Ψ: 2 sigmoid(2u)) element by element over |u| up to ~17, f32 out: within 1e-4 of
// fp64 relative to max(|value|, 1e-6), where 1 + tanhf(u) in fp32 loses its digits for u << 0
// (~7e-4 relative at u = -5), in either operand order.
TEST_F(Gpu, OnePlusTanhAcrossItsRange) {
  Case c;
  Value t = c.g.unary(UnaryOp::Tanh, c.acc * 4.0);
  c.g.output(t + 1.0, "tanh_plus_one", DType::F32);
  c.g.output(c.g.binary(BinaryOp::Add, c.g.constant(1.0), c.g.unary(UnaryOp::Tanh, c.acc * -4.0)), "one_plus_tanh", DType::F32);
  expect_each_element_within(run_and_check(c.g, {{"M", 200}, {"N", 264}, {"K", 16}}, 7), 1e-4);
}

// The ops that exist to keep small values (epilogue/ops.cuh): e^x - 1 near 0 (ELU's negative
// side), log(1 + x) of small x, softplus over |x| up to ~34 (its threshold at 20 and the tail
// where e^x is far below fp32's epsilon), and erf; f32 out, within 1e-4 of fp64 relative to
// max(|value|, 1e-6). K = 16 keeps the accumulator's own rounding far below the bound.
TEST_F(Gpu, SmallValueOpsAcrossTheirRange) {
  Case c;
  c.g.output(c.g.unary(UnaryOp::Expm1, c.acc * 1e-3), "expm1", DType::F32);
  c.g.output(c.g.unary(UnaryOp::Log1p, c.g.unary(UnaryOp::Square, c.acc) * 1e-3), "log1p", DType::F32);
  c.g.output(c.g.unary(UnaryOp::Softplus, c.acc * 8.0), "softplus", DType::F32);
  c.g.output(c.g.unary(UnaryOp::Erf, c.acc * 2.0), "erf", DType::F32);
  expect_each_element_within(run_and_check(c.g, {{"M", 200}, {"N", 264}, {"K", 16}}, 7), 1e-4);
}

// Each binary op against a row vector, a column vector, a runtime scalar and a literal.
TEST_F(Gpu, EveryBinaryOpWithEveryBroadcastKind) {
  const int count = static_cast<int>(BinaryOp::Pow) + 1;
  for (int first = 0; first < count; first += 4) {
    Case c;
    Value rv = c.row("rv"), cv = c.col("cv"), sc = c.g.input("s", DType::F32, {});
    std::string names;
    for (int i = first; i < std::min(first + 4, count); ++i) {
      const BinaryOp op = static_cast<BinaryOp>(i);
      names += std::string(name_of(op)) + " ";
      Value y;
      if (op == BinaryOp::Pow) {
        y = c.g.binary(op, c.g.unary(UnaryOp::Abs, c.acc) + 0.25, sc);
      } else if (op == BinaryOp::Div) {
        y = c.g.binary(op, c.g.binary(op, c.acc, cv), sc);  // inputs never near 0 (|v| >= 0.5)
      } else {
        y = c.g.binary(op, c.g.binary(op, c.g.binary(op, c.g.binary(op, c.acc, rv), cv), sc), 0.75);
      }
      c.g.output(y, std::string(name_of(op)), DType::F32);
    }
    SCOPED_TRACE(names);
    expect_matches(c.g, kRagged);
  }
}

// pow with a literal exponent 2, 3 or 4 compiles to multiplies (epilogue/ops.cuh PowInt), negative
// bases included; another literal exponent keeps powf.
TEST_F(Gpu, PowWithLiteralExponents) {
  Case c;
  Value x = c.acc * 0.5;
  c.g.output(c.g.binary(BinaryOp::Pow, x, 2.0), "p2", DType::F32);
  c.g.output(c.g.binary(BinaryOp::Pow, x, 3.0), "p3", DType::F32);
  c.g.output(c.g.binary(BinaryOp::Pow, x, 4.0), "p4", DType::F32);
  c.g.output(c.g.binary(BinaryOp::Pow, c.g.unary(UnaryOp::Abs, x) + 0.25, 2.5), "p25", DType::F32);
  expect_matches(c.g, kRagged);
}

TEST_F(Gpu, RaggedShapesLayoutsAndOutputDtypes) {
  struct Variant { DType in; BLayout layout; DType out; Bindings dims; };
  const std::vector<Variant> variants = {
      {DType::BF16, BLayout::NK, DType::BF16, kRagged},
      {DType::BF16, BLayout::KN, DType::F16, kRagged},
      {DType::F16, BLayout::NK, DType::F32, kRagged},
      {DType::F16, BLayout::KN, DType::BF16, {{"M", 77}, {"N", 136}, {"K", 16}}},
      {DType::BF16, BLayout::NK, DType::BF16, {{"M", 1}, {"N", 8}, {"K", 8}}},
      {DType::BF16, BLayout::NK, DType::F32, {{"M", 333}, {"N", 4104}, {"K", 2056}}},
  };
  for (const Variant& v : variants) {
    SCOPED_TRACE(fmt::format("{} {} -> {} M={} N={} K={}", name_of(v.in), v.layout == BLayout::NK ? "nk" : "kn",
                             name_of(v.out), v.dims.at("M"), v.dims.at("N"), v.dims.at("K")));
    Case c(v.in, v.layout);
    c.g.output(c.g.unary(UnaryOp::GeluTanh, c.acc + c.row("bias")), "y", v.out);
    expect_matches(c.g, v.dims);
  }
}

// The planner's small-M elementwise plans (calibration.cpp; CPU: Plan.SmallMElementwiseSpreadsAndSharesB)
// at ragged sizes: 64x64 tiles in clusters of 2 along M whose last cluster's second CTA has no
// rows (3 row blocks), 64x128 pairs along M with ragged N, one row block's pairs along N, and one
// row block at mid K split over 64x64 tiles (calibration.cpp narrow_tile_k_splits: the owner sums
// whole 64-row partial tiles, or decode rows, in SMEM; K off 64 and off the splits' count).
TEST_F(Gpu, SmallMPlansSpreadAndShareB) {
  for (const Bindings& dims : {Bindings{{"M", 130}, {"N", 1000}, {"K", 520}},
                               Bindings{{"M", 200}, {"N", 9000}, {"K", 264}},
                               Bindings{{"M", 64}, {"N", 9000}, {"K", 200}},
                               Bindings{{"M", 130}, {"N", 1000}, {"K", 8200}},  // long K: split in two
                               Bindings{{"M", 64}, {"N", 1000}, {"K", 3112}},   // mid K: split in four
                               Bindings{{"M", 3}, {"N", 760}, {"K", 3080}}}) {
    SCOPED_TRACE(fmt::format("M={} N={} K={}", dims.at("M"), dims.at("N"), dims.at("K")));
    Case c;
    c.g.output(c.g.unary(UnaryOp::GeluTanh, c.acc + c.row("bias")), "y", DType::BF16);
    expect_matches(c.g, dims);
  }
}

// Decode rows, fewer than one 64-row box: A's TMA box holds M rounded up to 8 rows
// (KernelConfig::a_box_rows; the box's other rows keep stale SMEM, which reaches only accumulator rows
// >= M), under the planner's decode plans (K split over 64x128 tiles at M <= 16 with K >= 4096,
// over 64x64 tiles at M = 40), a 128-row tile forced, and pairs along N whose A slices keep
// full boxes.
TEST_F(Gpu, DecodeRowsLoadShortABoxes) {
  auto graph = [] {
    Case c;
    c.g.output(c.g.unary(UnaryOp::GeluTanh, c.acc + c.row("bias")), "y", DType::BF16);
    return c;
  };
  for (int64_t m : {1, 7, 16, 40}) {
    SCOPED_TRACE(fmt::format("M={}", m));
    expect_matches(graph().g, {{"M", m}, {"N", 1000}, {"K", 4104}});
  }
  CompileOptions rows128;
  rows128.plan.tile_m = 128, rows128.plan.tile_n = 128, rows128.plan.cluster_m = 1;
  expect_matches(graph().g, {{"M", 5}, {"N", 520}, {"K", 1032}}, rows128);
  CompileOptions pairs_n;
  pairs_n.plan.cluster_n = 2;
  expect_matches(graph().g, {{"M", 3}, {"N", 1000}, {"K", 1032}}, pairs_n);
}

TEST_F(Gpu, TwoOutputsAndCasts) {
  Case c;
  Value x = c.acc * c.g.input("alpha", DType::F32, {}) + c.row("bias");
  c.g.output(c.g.cast(x, DType::F16), "x16", DType::F32);
  c.g.output(c.g.unary(UnaryOp::Silu, x) * c.col("scale"), "y", DType::BF16);
  expect_matches(c.g, kRagged);
}

TEST_F(Gpu, EveryClusterSize) {
  for (int cn : {1, 2, 4, 8, 16}) {
    SCOPED_TRACE("C_N=" + std::to_string(cn));
    Case c;
    c.g.output(c.g.unary(UnaryOp::Relu, c.acc + c.row("bias")), "y", DType::BF16);
    CompileOptions opt;
    opt.plan.cluster_n = cn;
    expect_matches(c.g, {{"M", 520}, {"N", 4096 + 8}, {"K", 256}}, opt);
  }
}

TEST_F(Gpu, MisalignedShapesAreRejectedWithClearErrors) {
  Case c;
  c.g.output(c.acc, "y", DType::BF16);
  try {
    run_and_check(c.g, {{"M", 64}, {"N", 1001}, {"K", 64}}, 1);
    FAIL() << "N = 1001 bf16 output rows are not 16-byte aligned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("16"), std::string::npos) << e.what();
  }
  try {
    run_and_check(c.g, {{"M", 64}, {"N", 64}, {"K", 20}}, 1);
    FAIL() << "K = 20 is not a multiple of 8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("K"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace comfuse
