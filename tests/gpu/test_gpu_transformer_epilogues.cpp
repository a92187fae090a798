// GPU correctness of the epilogues real transformer layers need: [M, N] inputs read with the
// accumulator's tile (a residual, a gate, a per-element scale; bf16, f16 and f32; prefetched
// into L2 and read from global memory, or carried in the mainloop's ring; zero past M and N),
// outputs of several stages' tile values (the pre-norm sum and the norm), and per-row [M, 1]
// outputs (a norm's mean and rstd, a softmax's log-sum-exp), against the fp64 graph executor
// on random inputs, ragged shapes, planner defaults and forced plans. Skips, saying why, on a
// machine without an sm_90 GPU.
#include <fmt/format.h>

#include "gpu/gpu_support.h"

namespace comfuse {
namespace {

using gpu_test::expect_outputs_match;
using Case = gpu_test::GemmCase;
using GpuLayer = gpu_test::GpuTest;

Bindings dims(int64_t m, int64_t n, int64_t k) { return {{"M", m}, {"N", n}, {"K", k}}; }

DeviceRunReport expect_matches(const Graph& g, const Bindings& d, const CompileOptions& opt = {}, double offset = 0.0) {
  DeviceRunReport rep = run_and_check(g, d, /*seed=*/5, opt, /*timing_reps=*/0, offset);
  expect_outputs_match(rep);
  return rep;
}

// h = acc + bias + residual; y = LayerNorm(h); outputs h, y, mean and rstd.
Graph residual_layer_norm(DType in, DType residual_dtype) {
  Case c(in);
  Value r = c.g.input("residual", residual_dtype, {Dim::of("M"), Dim::of("N")});
  Value h = c.acc + c.g.input("bias", in, {Dim::of("N")}) + r;
  Value mu = c.g.reduce(ReduceOp::Mean, h);
  Value d = h - mu;
  Value rstd = c.g.unary(UnaryOp::Rsqrt, c.g.reduce(ReduceOp::Mean, d * d) + 1e-5);
  Value y = d * rstd * c.g.input("gamma", in, {Dim::of("N")}) + c.g.input("beta", in, {Dim::of("N")});
  c.g.output(h, "h", in);
  c.g.output(y, "y", in);
  c.g.output(mu, "mu", DType::F32);
  c.g.output(rstd, "rstd", DType::F32);
  return std::move(c.g);
}

TEST_F(GpuLayer, ResidualLayerNormPreNormSumAndRowStatistics) {
  struct V {
    DType in, res;
    Bindings d;
    const char* plan;
  };
  for (const V& v : {V{DType::BF16, DType::BF16, dims(1000, 1032, 72), "default"},
                     V{DType::F16, DType::F16, dims(333, 520, 64), "default"},
                     V{DType::BF16, DType::F32, dims(1000, 1032, 72), "default"},
                     V{DType::BF16, DType::BF16, dims(1000, 1032, 72), "p2p"},
                     V{DType::BF16, DType::BF16, dims(700, 4096, 64), "smem-stash"}}) {
    SCOPED_TRACE(fmt::format("{} in, {} residual, {} rows x {} cols, {} plan", name_of(v.in), name_of(v.res),
                             v.d.at("M"), v.d.at("N"), v.plan));
    CompileOptions opt;
    if (std::string(v.plan) == "p2p") opt.plan.aggregation = Aggregation::PeerToPeer;
    if (std::string(v.plan) == "smem-stash") {  // several N-tiles per CTA: each loads its residual tile
      opt.plan.cluster_n = 8, opt.plan.tile_n = 128, opt.plan.strategy = RowStrategy::SmemStash;
      opt.plan.stash_bytes = 2;
    }
    // The bf16 stash rounds h (opt-in, as an unfused bf16 h would): no offset to cancel there.
    const double offset = opt.plan.stash_bytes == 2 ? 0.0 : 50.0;
    const DeviceRunReport rep = expect_matches(residual_layer_norm(v.in, v.res), v.d, opt, offset);
    EXPECT_EQ(rep.outputs.size(), 4u);
  }
}

// The residual through the mainloop's ring (KernelConfig::ring_input_bytes: one more slot after
// each tile's k-blocks, read from SMEM by the first stage) against the same plan reading it from
// L2: the tile shapes whose slot holds it (128x128: an A box and a B box; 64x128 and 64x256: the
// A box and B boxes), B multicast along M (the slot freed to both CTAs), a DSMEM cluster along N
// (A multicast), several N-tiles per CTA (a slot per tile), f16, and ragged M, N and K (zero past
// both, from the TMA box).
TEST_F(GpuLayer, ResidualThroughTheRing) {
  struct V {
    const char* name;
    DType in;
    Bindings d;
    PlanOptions plan;
  };
  auto opts = [](int tm, int tn, int cm) {
    PlanOptions o;
    o.tile_m = tm, o.tile_n = tn, o.cluster_m = cm;
    return o;
  };
  PlanOptions dsmem;
  dsmem.cluster_n = 8, dsmem.tile_n = 128, dsmem.aggregation = Aggregation::PeerToPeer;
  PlanOptions stash = dsmem;
  stash.aggregation.reset();
  stash.strategy = RowStrategy::SmemStash, stash.stash_bytes = 2;
  for (const V& v : {V{"128x128 clusters 2x1", DType::BF16, dims(1000, 1032, 200), opts(128, 128, 2)},
                     V{"64x128 clusters 1x1", DType::F16, dims(333, 520, 72), opts(64, 128, 1)},
                     V{"64x256 clusters 2x1", DType::BF16, dims(1000, 1032, 64), opts(64, 256, 2)},
                     V{"DSMEM cluster of 8", DType::BF16, dims(700, 1000, 136), dsmem},
                     V{"stash, 4 N-tiles a CTA", DType::BF16, dims(700, 3976, 64), stash}}) {
    for (const bool ring : {true, false}) {
      SCOPED_TRACE(fmt::format("{}, {} rows x {} cols x K {}, residual from {}", v.name, v.d.at("M"), v.d.at("N"),
                               v.d.at("K"), ring ? "the ring" : "L2"));
      CompileOptions opt;
      opt.plan = v.plan;
      opt.plan.ring_inputs = ring;
      const double offset = opt.plan.stash_bytes == 2 ? 0.0 : 50.0;
      const DeviceRunReport rep = expect_matches(residual_layer_norm(v.in, v.in), v.d, opt, offset);
      EXPECT_EQ(rep.plan.kernel.ring_input_bytes > 0, ring);
    }
  }
  // An elementwise epilogue (no reduction: each tile on its own), the planner's plan.
  for (const Bindings& d : {dims(200, 264, 64), dims(2000, 2056, 128)}) {
    SCOPED_TRACE(fmt::format("elementwise, {} x {}", d.at("M"), d.at("N")));
    Case c;
    Value r = c.g.input("residual", DType::BF16, {Dim::of("M"), Dim::of("N")});
    c.g.output(c.g.unary(UnaryOp::Silu, c.acc + c.row("bias")) + r, "y", DType::BF16);
    const DeviceRunReport rep = expect_matches(c.g, d);
    EXPECT_EQ(rep.plan.kernel.ring_input_bytes > 0, rep.plan.kernel.wgs_per_tile == 1);
  }
}

// Llama's o_proj + residual -> RMSNorm, at the planner's choice for a large shape's rows, and
// for the measured shape's (8192 x 4096: 128 x 128 PingPong tiles in row groups), bf16 and f32
// residuals.
TEST_F(GpuLayer, ResidualRmsNormPlannerDefault) {
  for (const DType res : {DType::BF16, DType::F32})
    for (const Bindings& d : {dims(1100, 2048, 256), dims(8192, 4096, 256)}) {
      SCOPED_TRACE(fmt::format("{} residual, {} x {}", name_of(res), d.at("M"), d.at("N")));
      Case c;
      Value h = c.acc + c.g.input("residual", res, {Dim::of("M"), Dim::of("N")});
      c.g.output(h, "h", DType::BF16);
      c.g.output(c.g.rms_norm(h, c.row("gamma")), "y", DType::BF16);
      expect_matches(c.g, d);
    }
}

// An [M, N] input read by a later stage (after the norm's reduction: the stage starts its own
// L2 prefetch), with the root stage's residual, over ragged edges; with several N-tiles per CTA
// too (the later stage reads the input of each tile of the job).
TEST_F(GpuLayer, TileInputInALaterStage) {
  for (const char* plan : {"default", "smem-stash"}) {
    SCOPED_TRACE(plan);
    Case c;
    Value h = c.acc + c.g.input("residual", DType::BF16, {Dim::of("M"), Dim::of("N")});
    Value gate = c.g.input("gate", DType::F32, {Dim::of("M"), Dim::of("N")});
    c.g.output(c.g.rms_norm(h, c.row("gamma")) * gate, "y", DType::BF16);
    CompileOptions opt;
    if (std::string(plan) == "smem-stash") {  // 4 N-tiles per CTA, the last one ragged
      opt.plan.cluster_n = 8, opt.plan.tile_n = 128, opt.plan.strategy = RowStrategy::SmemStash;
      opt.plan.stash_bytes = 2;
    }
    const DeviceRunReport rep = expect_matches(c.g, std::string(plan) == "default" ? dims(1000, 1032, 72)
                                                                                    : dims(700, 3976, 64), opt);
    if (std::string(plan) == "smem-stash") {
      EXPECT_GT(rep.plan.kernel.n_tiles, 1);
    }
  }
}

// Elementwise epilogues with several [M, N] inputs (a gate and a per-element f32 scale), with
// the measured configuration of each shape class (PingPong 128 x 128, and cooperative 128 x 256
// for the largest, whose warp groups each read 64 rows of the tile), ragged and not.
TEST_F(GpuLayer, GateAndScaleInputsElementwise) {
  for (const Bindings& d : {dims(200, 264, 64), dims(2000, 2056, 128), dims(6400, 8192, 64)}) {
    SCOPED_TRACE(fmt::format("{} x {}", d.at("M"), d.at("N")));
    Case c;
    Value gate = c.g.input("gate", DType::BF16, {Dim::of("M"), Dim::of("N")});
    Value scale = c.g.input("scale", DType::F32, {Dim::of("M"), Dim::of("N")});
    c.g.output(c.g.unary(UnaryOp::Silu, c.acc) * gate * scale, "y", DType::BF16);
    const DeviceRunReport rep = expect_matches(c.g, d);
    if (d.at("M") == 6400) {
      EXPECT_EQ(rep.plan.kernel.wgs_per_tile, 2) << "the cooperative kernel";
    }
  }
}

// A softmax's log-sum-exp as a per-row output beside the probabilities.
TEST_F(GpuLayer, SoftmaxWithLogSumExp) {
  Case c;
  Value x = c.acc * 0.125;
  Value mx = c.g.reduce(ReduceOp::Max, x);
  Value e = c.g.unary(UnaryOp::Exp, x - mx);
  Value sum = c.g.reduce(ReduceOp::Sum, e);
  c.g.output(e / sum, "p", DType::BF16);
  c.g.output(mx + c.g.unary(UnaryOp::Log, sum), "lse", DType::F32);
  expect_matches(c.g, dims(777, 1000, 64));
}

// Per-head norms (FusionSpec::segment: Qwen 3's and Gemma 3's q/k norms): tiles of one head's
// columns reduce their rows alone, gamma of a head's length read periodically. RMSNorm at decode
// rows (the planner's split-K), ragged M and K, heads of 64, 128 and 256 columns; LayerNorm with
// a bias, the pre-norm sum as an output, an f32 gamma and a residual; f16; K x N weights; a
// forced split-K over L2 and over DSMEM.
TEST_F(GpuLayer, PerHeadNorms) {
  struct V {
    int64_t head;
    Bindings d;
    const char* what;
  };
  for (const V& v : {V{128, dims(1, 4096, 4096), "rms"}, V{128, dims(7, 1024, 2048), "rms"},
                     V{128, dims(333, 2048, 200), "rms"}, V{64, dims(77, 1024, 136), "rms"},
                     V{256, dims(300, 2048, 512), "rms"}, V{256, dims(3, 1024, 1024), "rms"},
                     V{128, dims(1000, 1024, 72), "layer"}, V{128, dims(5, 512, 1024), "f16"},
                     V{128, dims(130, 768, 264), "kn"}, V{128, dims(8, 1024, 4096), "split"},
                     V{128, dims(8, 1024, 4096), "split-dsmem"}}) {
    SCOPED_TRACE(fmt::format("heads of {}, {} x {} x {}, {}", v.head, v.d.at("M"), v.d.at("N"), v.d.at("K"), v.what));
    const std::string what = v.what;
    const DType in = what == "f16" ? DType::F16 : DType::BF16;
    Case c(in, what == "kn" ? BLayout::KN : BLayout::NK);
    Value gamma = c.g.input("gamma", what == "layer" ? DType::F32 : in, {Dim::of(v.head)});
    if (what == "layer") {
      Value h = c.acc + c.g.input("bias", in, {Dim::of("N")}) + c.g.input("residual", in, {Dim::of("M"), Dim::of("N")});
      c.g.output(h, "h", in);
      c.g.output(c.g.layer_norm(h, gamma, c.g.input("beta", in, {Dim::of(v.head)}), 1e-5, v.head), "y", in);
    } else {
      c.g.output(c.g.rms_norm(c.acc, gamma, 1e-6, v.head), "y", in);
    }
    CompileOptions opt;
    if (what.rfind("split", 0) == 0) opt.plan.k_splits = 4;
    if (what == "split-dsmem") opt.plan.splits_in_cluster = true;
    const DeviceRunReport rep = expect_matches(c.g, v.d, opt, what == "layer" ? 50.0 : 0.0);
    EXPECT_EQ(rep.plan.kernel.row_segment, v.head);
    EXPECT_EQ(rep.plan.kernel.tile_n, v.head);
  }
}

// Rotary embeddings after a projection (Llama's q/k_proj; Qwen 2's with a bias; Qwen 3's after
// its per-head RMSNorm): rotate_half reads each element's partner from the same thread's
// fragment S/2 columns away, cos and sin [M, head] periodically; heads of 64, 96 (two a tile),
// 128 and 256, ragged rows, decode split-K, f16, K x N; the interleaved rotation (GPT-J, Cohere),
// alone and after a per-head norm.
TEST_F(GpuLayer, RotaryEmbeddings) {
  struct V {
    int64_t head;
    Bindings d;
    const char* what;
  };
  for (const V& v : {V{128, dims(1, 4096, 4096), "rope"}, V{128, dims(7, 1024, 2048), "rope"},
                     V{128, dims(333, 2048, 200), "bias"}, V{64, dims(77, 1024, 136), "rope"},
                     V{96, dims(300, 960, 512), "rope"}, V{256, dims(3, 1024, 1024), "rope"},
                     V{128, dims(1000, 1024, 72), "norm"}, V{128, dims(1, 1024, 4096), "norm"},
                     V{128, dims(5, 512, 1024), "f16"}, V{128, dims(130, 768, 264), "kn"},
                     V{128, dims(8, 1024, 4096), "split"}, V{128, dims(77, 1024, 136), "pairs"},
                     V{128, dims(300, 2048, 512), "norm-pairs"},
                     // The norm's output rotated in place (spec.h rotate_in_place) on 128-row
                     // and (forced) 64-row tiles; heads of 64 (both halves in one store subtile)
                     // and 256 (two subtiles a half); one job a CTA (the epilogue's begin not
                     // early); and recomputed at the partner where the accumulator is read again
                     // after the rotation (a residual of the projection itself: 64-row tiles).
                     V{128, dims(1000, 2048, 264), "norm-128"}, V{128, dims(1000, 2048, 264), "norm-64"},
                     V{64, dims(500, 1024, 128), "norm"}, V{256, dims(70, 2048, 512), "norm"},
                     V{128, dims(300, 3072, 512), "norm"}, V{128, dims(1000, 2048, 264), "norm-residual"},
                     // The root stage recomputes: heads of 96 (halves start mid-subtile, tiles of
                     // 192), the operand stored too; and in place, x - max(x) rotated beside
                     // exp(x - max(x)) (the exp then reads x, not a - b, where x is read back).
                     V{96, dims(300, 960, 512), "bias"}, V{128, dims(300, 2048, 512), "bias-stored"},
                     V{128, dims(1000, 2048, 264), "exp"}}) {
    SCOPED_TRACE(fmt::format("heads of {}, {} x {} x {}, {}", v.head, v.d.at("M"), v.d.at("N"), v.d.at("K"), v.what));
    const std::string what = v.what;
    const DType in = what == "f16" ? DType::F16 : DType::BF16;
    Case c(in, what == "kn" ? BLayout::KN : BLayout::NK);
    Value q = c.acc;
    if (what.rfind("bias", 0) == 0) q = q + c.g.input("bias", in, {Dim::of("N")});
    if (what == "bias-stored") c.g.output(q, "h", in);
    if (what == "exp") q = q - c.g.reduce(ReduceOp::Max, q, -1, v.head);
    if (what.rfind("norm", 0) == 0) q = c.g.rms_norm(q, c.g.input("gamma", in, {Dim::of(v.head)}), 1e-6, v.head);
    Value cos = c.g.input("cos", in, {Dim::of("M"), Dim::of(v.head)});
    Value sin = c.g.input("sin", in, {Dim::of("M"), Dim::of(v.head)});
    Value y = c.g.rope(q, cos, sin, v.head, what.find("pairs") != std::string::npos);
    c.g.output(what == "norm-residual" ? y + c.acc : what == "exp" ? y + c.g.unary(UnaryOp::Exp, q) : y, "y", in);
    CompileOptions opt;
    if (what == "split") opt.plan.k_splits = 4;
    if (what == "norm-128") opt.plan.tile_m = 128;
    if (what == "norm-64") opt.plan.tile_m = 64;
    const DeviceRunReport rep = expect_matches(c.g, v.d, opt, 0.0);
    EXPECT_EQ(rep.plan.kernel.tile_n % v.head, 0);
  }
}

}  // namespace
}  // namespace comfuse
