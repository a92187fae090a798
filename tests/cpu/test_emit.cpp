// Ψ: deterministic rendering, one rule per category driven by the op vocabulary, and
// the emitted kernels compile for sm_90a (NVRTC; no GPU needed).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "comfuse/debug/trace.cuh"
#include "comfuse/emit.h"
#include "comfuse/lower.h"
#include "comfuse/harness.h"
#include "comfuse/jit.h"
#include "comfuse/runtime.h"
#include "comfuse/text.h"

namespace comfuse {
namespace {

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const std::filesystem::path kRoot = COMFUSE_SOURCE_DIR;

struct Built {
  Graph g;
  LoweringResult r;
};

// acc = x[M, K] x w[N, K]^T in bf16: the GEMM every case starts from.
Value bf16_gemm(Graph& g) {
  Value x = g.input("x", DType::BF16, {Dim::of("M"), Dim::of("K")});
  Value w = g.input("w", DType::BF16, {Dim::of("N"), Dim::of("K")});
  return g.matmul(x, w);
}

Built build_unary_chain(const std::vector<UnaryOp>& ops) {
  Built b;
  Value v = bf16_gemm(b.g);
  for (UnaryOp op : ops) v = b.g.unary(op, v);
  b.g.output(v, "y", DType::BF16);
  b.r = lower(b.g);
  return b;
}

Problem shape(int64_t m, int64_t n, int64_t k) { return Problem{m, n, k, DType::BF16}; }

TEST(Emit, EveryVocabularyOpHasARuleAndADeviceFunctor) {
  const std::string ops_cuh = read_file(kRoot / "kernels/comfuse/epilogue/ops.cuh");
  auto has_functor = [&](std::string_view name) {
    return ops_cuh.find("struct " + std::string(name) + " ") != std::string::npos ||
           ops_cuh.find("struct " + std::string(name) + "{") != std::string::npos;
  };
  for (int i = 0; i < kUnaryOpCount; ++i) {
    const UnaryOp op = static_cast<UnaryOp>(i);
    Built b = build_unary_chain({op});
    const std::string epi = emit_epilogue_type(b.r.regions.at(0).spec);
    EXPECT_NE(epi.find("comfuse::epi::" + std::string(device_functor_of(op))), std::string::npos) << name_of(op);
    EXPECT_TRUE(has_functor(device_functor_of(op))) << "ops.cuh lacks " << device_functor_of(op);
  }
  for (int i = 0; i <= static_cast<int>(BinaryOp::Pow); ++i)
    EXPECT_TRUE(has_functor(device_functor_of(static_cast<BinaryOp>(i)))) << name_of(static_cast<BinaryOp>(i));
}

// The causal mask renders as its device node (CausalMaskOp::device_node, nodes.cuh) on its
// operand's index, in whichever stage Φ put it.
TEST(Emit, CausalMaskRendersAsItsDeviceNode) {
  EXPECT_NE(read_file(kRoot / "kernels/comfuse/epilogue/nodes.cuh")
                .find("template <int Src> struct " + std::string(CausalMaskOp::device_node) + " {"),
            std::string::npos);
  Built b;
  Value acc = bf16_gemm(b.g);
  b.g.output(b.g.softmax(b.g.causal_mask(acc * 0.125)), "p", DType::BF16);
  b.r = lower(b.g);
  const FusionSpec& s = b.r.regions.at(0).spec;
  const std::string epi = emit_epilogue_type(s);
  EXPECT_NE(epi.find("/* n2 */ comfuse::epi::Compute<comfuse::epi::Mul, 0, 1>,\n    /* n3 */ comfuse::epi::CausalMask<2>,\n"
                     "    /* n4 */ comfuse::epi::Reduction<comfuse::epi::ReduceMax, 3,"),
            std::string::npos)
      << epi;
  const std::string src = emit(s, make_plan(s, shape(1000, 1032, 72))).source;
  EXPECT_NE(src.find("comfuse::epi::CausalMask<2>"), std::string::npos) << src;
}

TEST(Emit, DeterministicAndSlotsFollowArgs) {
  Graph g = parse_graph_file((kRoot / "examples/gemm_bias_gelu.cf").string());
  LoweringResult r = lower(g);
  const FusionSpec& s = r.regions.at(0).spec;
  Plan p = make_plan(s, shape(4096, 4096, 4096));
  EmittedKernel a = emit(s, p), b = emit(s, p);
  EXPECT_EQ(a.source, b.source);
  EXPECT_NE(a.source.find("RowBroadcast<0, cutlass::bfloat16_t>"), std::string::npos) << a.source;
  EXPECT_NE(a.source.find("comfuse::epi::GeluTanh"), std::string::npos);
  EXPECT_NE(a.source.find("COMFUSE_DEFINE_KERNEL(comfuse_fused_gemm, Kernel)"), std::string::npos);
  int outputs = 0;
  for (const ArgSlot& sl : a.slots) outputs += sl.kind == SlotKind::Output;
  EXPECT_EQ(outputs, 1);
}

TEST(Emit, LiteralsAreExactFloatsAndShared) {
  Built b;
  Value x = b.g.input("x", DType::F16, {Dim::of("M"), Dim::of("K")});
  Value w = b.g.input("w", DType::F16, {Dim::of("K"), Dim::of("N")});
  Value acc = b.g.matmul(x, w, BLayout::KN);
  b.g.output((acc * 0.1 + 0.1) * 3.0, "y", DType::F32);
  const std::string epi = emit_epilogue_type(lower(b.g).regions.at(0).spec);
  EXPECT_NE(epi.find("struct Lit0 { static constexpr float value = 0.1f; };"), std::string::npos) << epi;
  EXPECT_NE(epi.find("struct Lit1 { static constexpr float value = 3.0f; };"), std::string::npos) << epi;
  EXPECT_EQ(epi.find("Lit2"), std::string::npos) << "0.1 appears twice but needs one struct";
}

TEST(Emit, ReductionsExpandRecursivelyIntoPostOpStages) {
  Graph g = parse_graph_file((kRoot / "examples/gemm_layernorm.cf").string());
  const LoweringResult r = lower(g);
  const FusionSpec& s = r.regions.at(0).spec;
  const std::string epi = emit_epilogue_type(s);
  EXPECT_NE(epi.find("comfuse::epi::Reduction<comfuse::epi::ReduceMean"), std::string::npos);
  EXPECT_NE(epi.find("comfuse::epi::Stat"), std::string::npos);
  EXPECT_NE(epi.find("comfuse::epi::Bypass<"), std::string::npos);
  const Plan plan = make_plan(s, shape(8192, 4096, 4096));
  const EmittedKernel k = emit(s, plan);
  ASSERT_EQ(plan.kernel.aggregation, Aggregation::L2Exchange);
  // The plan's KernelConfig is written once, as the kernel's template argument.
  EXPECT_NE(k.source.find(kernel_config_source(plan.kernel)), std::string::npos) << k.source;
  EXPECT_NE(k.source.find("FusedGemmSm90<kConfig, cutlass::bfloat16_t, Epilogue>"), std::string::npos) << k.source;
  EXPECT_NE(k.source.find(".aggregation = comfuse::Aggregation::L2Exchange"), std::string::npos);
  EXPECT_NE(k.source.find(fmt::format(".row_group = {}", plan.kernel.row_group)), std::string::npos) << k.source;
  EXPECT_NE(k.source.find(fmt::format(".cluster_m = {}", plan.kernel.cluster_m)), std::string::npos);
  PlanOptions p2p;
  p2p.aggregation = Aggregation::PeerToPeer;
  const std::string dsmem = emit(s, make_plan(s, shape(8192, 4096, 4096), p2p)).source;
  EXPECT_NE(dsmem.find("Aggregation::PeerToPeer"), std::string::npos);
  // LayerNorm's mean and variance share one round (Reduction<..., 1> around <..., 2>) when each
  // CTA holds one N-tile and the row meets in L2; not over DSMEM, not with a stash.
  ASSERT_EQ(plan.kernel.n_tiles, 1);
  EXPECT_NE(k.source.find(", 2>>, 1>"), std::string::npos) << k.source;
  EXPECT_EQ(dsmem.find(", 2>>, 1>"), std::string::npos);
  EXPECT_EQ(emit_epilogue_type(s).find(", 2>>"), std::string::npos);
  // RMSNorm's one reduction is not a pair; Softmax's max and sum of exp are (kPairMaxExpSum = 3
  // around kPairGiven = 2), only when asked for.
  const OneRoundPairs both{true, true};
  Graph rms = parse_graph_file((kRoot / "examples/gemm_rmsnorm.cf").string());
  const LoweringResult rr = lower(rms);
  EXPECT_EQ(emit_epilogue_type(rr.regions.at(0).spec, both).find(">, 1>"), std::string::npos);
  Graph sm = parse_graph_file((kRoot / "examples/gemm_softmax.cf").string());
  const LoweringResult sr = lower(sm);
  EXPECT_NE(emit_epilogue_type(sr.regions.at(0).spec, both).find(", 2>>, 3>"), std::string::npos);
  // Kept (OneRoundPairs::kept_exp), softmax's pair keeps its exp in place (kPairGivenKept = 4).
  OneRoundPairs kept = both;
  kept.kept_exp = true;
  EXPECT_NE(emit_epilogue_type(sr.regions.at(0).spec, kept).find(", 4>>, 3>"), std::string::npos);
  EXPECT_EQ(emit_epilogue_type(sr.regions.at(0).spec, {true, false}).find(", 2>>, 3>"), std::string::npos);
  EXPECT_EQ(emit_epilogue_type(s, {false, true}).find(", 2>>, 1>"), std::string::npos);
  PlanOptions leader;
  leader.aggregation = Aggregation::LeaderFollower;
  EXPECT_NE(emit(s, make_plan(s, shape(8192, 4096, 4096), leader)).source.find("Aggregation::LeaderFollower"),
            std::string::npos);
  // A plan that walks several N-tiles per CTA instantiates the stash: count, type and space.
  PlanOptions two;
  two.row_group = 2;
  const Plan stash = make_plan(s, shape(8192, 4096, 4096), two);
  ASSERT_GT(stash.kernel.n_tiles, 1);
  const std::string src = emit(s, stash).source;
  EXPECT_NE(src.find(fmt::format(".n_tiles = {}", stash.kernel.n_tiles)), std::string::npos) << src;
  // One round (online) stashes bf16 about each tile's row centers (the outputs are bf16); two, fp32.
  EXPECT_EQ(stash.kernel.stash_centers, stash.fused_pairs.mean_variance);
  EXPECT_NE(src.find(fmt::format(".stash_elem_bytes = {},{}", stash.kernel.stash_centers ? 2 : 4,
                                 stash.kernel.stash_centers ? " .stash_centers = true," : "")),
            std::string::npos)
      << src;
  EXPECT_NE(src.find(stash.strategy() == RowStrategy::SmemStash ? "StashSpace::Smem" : "StashSpace::Workspace"),
            std::string::npos);
  // The mean-and-variance pair over the N-tiles in one round (online) where the plan's registers
  // hold it (calibration.h online_mean_variance_fits), in two where forced.
  EXPECT_EQ(src.find(", 2>>, 1>") != std::string::npos, stash.fused_pairs.mean_variance) << src;
  two.fuse_pairs = false;
  EXPECT_EQ(emit(s, make_plan(s, shape(8192, 4096, 4096), two)).source.find(", 2>>, 1>"), std::string::npos);
}

// Per-row [M, 1] outputs store through StoreCol, [M, N] epilogue inputs load through TileInput
// (their own Params slots: col_outputs, tma_in).
TEST(Emit, RowStatisticOutputsAndTileInputs) {
  Built b;
  Value acc = bf16_gemm(b.g);
  Value h = acc + b.g.input("residual", DType::F32, {Dim::of("M"), Dim::of("N")});
  Value m = b.g.reduce(ReduceOp::Max, h);
  b.g.output(h - m, "y", DType::BF16);
  b.g.output(m, "rowmax", DType::F32);
  const LoweringResult r = lower(b.g);
  ASSERT_EQ(r.regions.size(), 1u);
  ASSERT_TRUE(r.fallbacks.empty());
  const FusionSpec& s = r.regions[0].spec;
  const std::string epi = emit_epilogue_type(s);
  EXPECT_NE(epi.find("comfuse::epi::TileInput<0, float>"), std::string::npos) << epi;
  EXPECT_NE(epi.find("comfuse::epi::StoreCol<0, float, 0>"), std::string::npos) << epi;
  const EmittedKernel k = emit(s, make_plan(s, shape(1000, 1032, 72)));
  int tile_inputs = 0, col_outputs = 0;
  for (const ArgSlot& sl : k.slots) tile_inputs += sl.kind == SlotKind::TileInput, col_outputs += sl.kind == SlotKind::ColOutput;
  EXPECT_EQ(tile_inputs, 1);
  EXPECT_EQ(col_outputs, 1);
  EXPECT_NE(k.source.find("tma_in[0]     residual f32"), std::string::npos) << k.source;
}

// CI's proof that what Ψ emits is valid device code: every elementwise region of every
// example, and one kernel chaining every unary op, compile for sm_90a with HGMMA intact.
class EmitCompile : public ::testing::Test {
 protected:
  void SetUp() override {
    cache_ = std::filesystem::temp_directory_path() / ("comfuse-emit-test-" + std::to_string(::getpid()));
    opt_.jit.cache_dir = cache_;
    opt_.plan.gpu = Gpu::H200;  // the H200's plans on any machine (the runtime plans for the GPU it finds)
  }
  void TearDown() override { std::filesystem::remove_all(cache_); }
  std::filesystem::path cache_;
  CompileOptions opt_;
};

TEST_F(EmitCompile, EveryExampleRegionCompiles) {
  int compiled = 0;
  for (const char* name : {"gemm_bias_gelu.cf", "gemm_layernorm.cf", "gemm_rmsnorm.cf", "gemm_softmax.cf", "ffn.cf",
                           "attention.cf", "attention_causal.cf", "gemm_residual_layernorm.cf",
                           "gemm_residual_rmsnorm.cf"}) {
    Graph g = parse_graph_file((kRoot / "examples" / name).string());
    for (const FusedRegion& reg : lower(g).regions) {
      CompiledKernel k = compile_only(reg.spec, shape(1000, 1032, 72), opt_);
      EXPECT_FALSE(k.wgmma_serialized) << k.log;
      EXPECT_TRUE(is_cubin_elf(k.cubin)) << name;
      ++compiled;
    }
  }
  EXPECT_EQ(compiled, 12);
}

// The planner's kernels at the shapes bench/RESULTS.md times keep their values in registers:
// ptxas spills nothing (a spill inside the epilogue's unrolled stages costs more than the
// reductions' shorter chains gain: bench/NOTES.md, "Reduction chains"). Known spills are allowed
// where they are: the five-reduction chain on a cooperative 128x256 tile (128 accumulators a
// thread) spills 52 B and ran 22% faster than PingPong 64x128's spill-free kernel (117.7 against
// 150.7 us at 4096 x 4096 x 1024 on an H100, bench/NOTES.md Stop 54); the latter is checked too.
// The stash plans (several N-tiles a job): the planner's vocabulary softmax with bf16 out (128x128,
// 8 N-tiles) spills 32 B; forced onto PingPong 64x256 tiles (128 accumulators a thread beside the
// L2 exchange's polled words; calibration.h stash_tile_refused keeps the planner off them where
// a CTA walks several jobs), LayerNorm spilled 168 B in row groups of 32 (below: 332 B in the
// row groups of 16 a bf16 stash now prices cheaper), 896 B before its row vectors' SMEM
// addresses stopped being hoisted out of the job loop (nodes.cuh RowBroadcast::acquire).
// LayerNorm's pair in one round over several N-tiles (stage.cuh online_second) where the planner
// takes it (calibration.h online_mean_variance_fits), its stash bf16 about each tile's row
// centers: 64x128 in row groups of 32 (none), and 128x128 in row groups of 16 (64 B; 16 B with an
// fp32 stash, 288 B in two rounds). Forced 64x256, LayerNorm takes row groups of 16 with 8
// N-tiles (one round, centered): 332 B.
// The planner's kernels compile with NVRTC itself, without spills: an NVRTC failure falls back
// to nvcc at run time, which hid an NVRTC-only static_assert in every kernel that hands its pair
// rounds over between warps (decode and M <= 256 rows: LayerNorm 16 rows, softmax 256).
TEST_F(EmitCompile, PlannerKernelsDoNotSpill) {
  struct Case {
    const char* example;
    int64_t m, n, k;
    PlanOptions plan = {};
    int allowed_spill = 0, allowed_stack = 0;
  };
  PlanOptions pingpong;
  pingpong.tile_m = 64, pingpong.tile_n = 128, pingpong.cluster_m = 2;
  PlanOptions wide;
  wide.tile_m = 64, wide.tile_n = 256;
  PlanOptions sixteen;  // 4 N-tiles in row groups of 16: LayerNorm's pair in one round, online
  sixteen.tile_m = 128, sixteen.tile_n = 128, sixteen.row_group = 16;
  for (const Case& c : {Case{"gemm_chain", 4096, 4096, 1024, {}, 64, 32}, Case{"gemm_chain", 4096, 4096, 1024, pingpong},
                        Case{"gemm_chain", 1024, 4096, 1024, {}, 64, 32}, Case{"gemm_layernorm", 8192, 4096, 4096},
                        Case{"gemm_softmax", 256, 4096, 4096}, Case{"gemm_softmax", 1024, 4096, 1024},
                        Case{"gemm_rmsnorm", 1, 2048, 4096}, Case{"gemm_residual_layernorm", 8192, 1024, 1024},
                        Case{"gemm_layernorm", 16, 4096, 4096}, Case{"gemm_log_softmax", 256, 4096, 4096},
                        Case{"gemm_layernorm", 1152, 32768, 1024}, Case{"gemm_layernorm", 1152, 32768, 1024, wide, 332, 88},
                        Case{"gemm_softmax", 1024, 32768, 4096, {}, 32, 8}, Case{"gemm_log_softmax", 1024, 32768, 4096, {}, 32, 8},
                        Case{"gemm_residual_layernorm", 1152, 32768, 1024}, Case{"gemm_layernorm", 4096, 8192, 4096, sixteen, 64, 24}}) {
    Graph g = parse_graph_file((kRoot / "examples" / (std::string(c.example) + ".cf")).string());
    const LoweringResult r = lower(g);
    CompileOptions opt = opt_;
    opt.plan = c.plan;
    opt.plan.gpu = Gpu::H200;
    opt.jit.compiler = CompilerKind::Nvrtc;
    opt.jit.nvcc_fallback = false;
    CompiledKernel k = compile_only(r.regions.at(0).spec, shape(c.m, c.n, c.k), opt);
    const std::string what = fmt::format("{} {}x{}x{}{}", c.example, c.m, c.n, c.k,
                                         c.plan.tile_m ? fmt::format(" (forced {}x{})", *c.plan.tile_m, *c.plan.tile_n) : "");
    EXPECT_EQ(k.compiler.rfind("nvrtc-", 0), 0u) << what << ": " << k.compiler;
    EXPECT_LE(k.spill_bytes, c.allowed_spill) << what << "\n" << k.log;
    EXPECT_LE(k.stack_bytes, c.allowed_stack) << what;
  }
}

// The runtime plans for the GPU it finds unless told one: an explicit GPU stays; unset takes
// this machine's (none without a device or driver: the planner's default, the H200).
TEST_F(EmitCompile, RuntimePlansForTheGpuItFinds) {
  PlanOptions told;
  told.gpu = Gpu::H100;
  EXPECT_EQ(planned_for_this_device(told).gpu, Gpu::H100);
  EXPECT_EQ(planned_for_this_device(PlanOptions{}).gpu, gpu_of_this_device());
}

// 2-D clusters (forced: B multicast along M beside A along N, the row over DSMEM among a
// cluster row's CTAs), peer-to-peer and leader-follower, on-chip and with a stash, compile with
// HGMMA intact (the GPU tests run them: GpuReduce.TwoDimensionalClusters).
TEST_F(EmitCompile, TwoDimensionalClustersCompile) {
  struct V {
    const char* example;
    Problem problem;
    int cluster_n, tile_n;
    Aggregation agg;
  };
  for (const V& v : {V{"gemm_softmax.cf", shape(8192, 2048, 4096), 8, 256, Aggregation::PeerToPeer},
                     V{"gemm_layernorm.cf", shape(1000, 1032, 72), 4, 128, Aggregation::LeaderFollower},
                     V{"gemm_rmsnorm.cf", shape(4096, 4096, 1024), 2, 256, Aggregation::PeerToPeer}}) {
    SCOPED_TRACE(v.example);
    const FusionSpec spec = lower(parse_graph_file((kRoot / "examples" / v.example).string())).regions.at(0).spec;
    CompileOptions o = opt_;
    o.plan.cluster_m = 2, o.plan.cluster_n = v.cluster_n, o.plan.tile_n = v.tile_n, o.plan.aggregation = v.agg;
    Plan plan;
    const CompiledKernel k = compile_only(spec, v.problem, o, nullptr, &plan);
    EXPECT_EQ(plan.kernel.cluster_m, 2);
    EXPECT_EQ(plan.kernel.cluster_n, v.cluster_n);
    EXPECT_FALSE(k.wgmma_serialized) << k.log;
    EXPECT_TRUE(is_cubin_elf(k.cubin));
  }
}

// Three consumer warp groups (KernelConfig::consumer_wgs): a 512-thread kernel whose consumers
// take 160 registers each; the row groups' exchange and an elementwise epilogue, the residual
// through the ring.
TEST_F(EmitCompile, ThreeConsumerWarpGroupsCompile) {
  for (const char* example : {"gemm_residual_layernorm.cf", "gemm_bias_gelu.cf"}) {
    SCOPED_TRACE(example);
    const FusionSpec spec = lower(parse_graph_file((kRoot / "examples" / example).string())).regions.at(0).spec;
    CompileOptions o = opt_;
    o.plan.consumer_wgs = 3;
    Plan plan;
    const CompiledKernel k = compile_only(spec, shape(8192, 1024, 1024), o, nullptr, &plan);
    EXPECT_EQ(plan.kernel.consumer_wgs, 3);
    EXPECT_NE(emit(spec, plan).source.find(".consumer_wgs = 3"), std::string::npos);
    EXPECT_FALSE(k.wgmma_serialized) << k.log;
    EXPECT_TRUE(is_cubin_elf(k.cubin));
  }
}

// kernels/comfuse/mainloop/wgmma.cuh writes out the wgmma operands that CuTe's TiledMMA
// partitioning derives (the mainloops no longer instantiate that algebra: most of a JIT
// compile's time). Checked here against CuTe itself, at compile time, for every tile shape and
// operand layout the mainloops take, reachable by the planner or not: the descriptor tensors'
// layouts, the descriptors' SBO/LBO (make_gmma_desc's derivation), the fragments' types.
const char* kWgmmaVsCute = R"(
#include <cute/tensor.hpp>
#include "comfuse/mainloop/wgmma.cuh"
using namespace cute;
namespace W = comfuse::wgmma;

// make_gmma_desc's SBO and LBO of the SMEM tensor of one wgmma operand (in 16-byte units).
template <GMMA::Major M, class Op>
constexpr uint32_t cute_sbo() {
  using U = decltype(layout(recast<uint128_t const>(declval<Op>())));
  if constexpr (M == GMMA::Major::K) return stride<0, 1>(logical_divide(U{}, Tile<Layout<_8, _1>, Layout<_2, _1>>{}));
  else return stride<1, 1>(logical_divide(U{}, Tile<Layout<_8, _1>, Layout<_8, _1>>{}));
}
template <GMMA::Major M, class Op>
constexpr uint32_t cute_lbo() {
  using U = decltype(layout(recast<uint128_t const>(declval<Op>())));
  if constexpr (M == GMMA::Major::K) return stride<1, 0>(logical_divide(U{}, Tile<Layout<_8, _1>, Layout<_2, _1>>{}));
  else return stride<0, 1>(logical_divide(U{}, Tile<Layout<_8, _1>, Layout<_8, _1>>{}));
}
template <class T, GMMA::Major M, int Rows>
using SwTile = conditional_t<M == GMMA::Major::K,
    decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{}, Shape<Int<Rows>, _64>{})),
    decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<T>{}, Shape<Int<Rows>, _64>{}, Step<_2, _1>{}))>;

// The fused mainloop (mainloop_sm90.cuh): a ring of Stages (BM | BN) x 64 tiles; a warp group
// takes WGRows rows of A (cooperative: WGRows = BM / 2).
template <class T, int BM, int WGRows, int BN, int Stages, GMMA::Major MB>
struct Fused {
  using SmemA = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{}, make_shape(Int<BM>{}, _64{}, Int<Stages>{})));
  using SmemB = conditional_t<MB == GMMA::Major::K,
      decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{}, make_shape(Int<BN>{}, _64{}, Int<Stages>{}))),
      decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<T>{}, make_shape(Int<BN>{}, _64{}, Int<Stages>{}), Step<_2, _1, _3>{}))>;
  using Mma = decltype(make_tiled_mma(GMMA::ss_op_selector<T, T, float, Shape<_64, Int<BN>, _64>, GMMA::Major::K, MB>()));
  using Thr = decltype(Mma{}.get_slice(0));
  using SA = decltype(local_tile(make_tensor(make_smem_ptr(static_cast<T*>(nullptr)), SmemA{}),
                                 make_shape(Int<WGRows>{}, _64{}, Int<Stages>{}), make_coord(1, 0, 0)));
  using SB = decltype(make_tensor(make_smem_ptr(static_cast<T*>(nullptr)), SmemB{}));
  using PA = decltype(declval<Thr>().partition_A(declval<SA>()));
  using PB = decltype(declval<Thr>().partition_B(declval<SB>()));
  using Frags = W::SsFragments<WGRows, BM, BN, Stages, MB>;
  static_assert(is_same_v<typename decltype(declval<Thr>().make_fragment_A(declval<PA>()))::layout_type, typename Frags::LayoutA>);
  static_assert(is_same_v<typename decltype(declval<Thr>().make_fragment_B(declval<PB>()))::layout_type, typename Frags::LayoutB>);
  static_assert(is_same_v<decltype(partition_fragment_C(Mma{}, Shape<Int<WGRows>, Int<BN>>{})), typename Frags::FragC>);
  using A0 = decltype(tensor<0>(declval<PA>()));
  using B0 = decltype(tensor<0>(declval<PB>()));
  static_assert(cute_sbo<GMMA::Major::K, A0>() == W::Sw128<GMMA::Major::K>::kSbo);
  static_assert(cute_lbo<GMMA::Major::K, A0>() == W::Sw128<GMMA::Major::K>::template lbo<WGRows>());
  static_assert(cute_sbo<MB, B0>() == W::Sw128<MB>::kSbo);
  static_assert(cute_lbo<MB, B0>() == W::Sw128<MB>::template lbo<BN>());
  static constexpr bool ok = true;
};

// The B2B mainloop (b2b/mainloop_b2b.cuh): one k-block slot per wgmma operand; GEMM2 takes S
// from registers.
template <class T, int BN1, int BN2, GMMA::Major M1, GMMA::Major M2>
struct B2b {
  using Mma1 = decltype(make_tiled_mma(GMMA::ss_op_selector<T, T, float, Shape<_64, Int<BN1>, _64>, GMMA::Major::K, M1>()));
  using Mma2 = decltype(make_tiled_mma(GMMA::rs_op_selector<T, T, float, Shape<_64, Int<BN2>, Int<BN1>>, GMMA::Major::K, M2>()));
  using T1 = decltype(Mma1{}.get_slice(0));
  using T2 = decltype(Mma2{}.get_slice(0));
  template <GMMA::Major M, int Rows>
  using Tile = decltype(make_tensor(make_smem_ptr(static_cast<T*>(nullptr)), SwTile<T, M, Rows>{}));
  using PX = decltype(declval<T1>().partition_A(declval<Tile<GMMA::Major::K, 64>>()));
  using PW1 = decltype(declval<T1>().partition_B(declval<Tile<M1, BN1>>()));
  using PW2 = decltype(declval<T2>().partition_B(declval<Tile<M2, BN2>>()));
  static_assert(is_same_v<typename decltype(declval<T1>().make_fragment_A(declval<PX>()))::layout_type, W::KBlockDescLayout<GMMA::Major::K>>);
  static_assert(is_same_v<typename decltype(declval<T1>().make_fragment_B(declval<PW1>()))::layout_type, W::KBlockDescLayout<M1>>);
  static_assert(is_same_v<typename decltype(declval<T2>().make_fragment_B(declval<PW2>()))::layout_type, W::KBlockDescLayout<M2>>);
  static_assert(is_same_v<decltype(partition_fragment_C(Mma1{}, Shape<_64, Int<BN1>>{})), W::AccumM64<BN1>>);
  static_assert(is_same_v<decltype(partition_fragment_C(Mma2{}, Shape<_64, Int<BN2>>{})), W::AccumM64<BN2>>);
  using TileS = decltype(make_tensor(make_smem_ptr(static_cast<T*>(nullptr)),
                                     tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{}, Shape<_64, Int<BN1>>{})));
  static_assert(is_same_v<decltype(declval<T2>().partition_fragment_A(declval<TileS>())), W::RegsA64<T, BN1>>);
  static_assert(cute_sbo<M1, decltype(tensor<0>(declval<PW1>()))>() == W::Sw128<M1>::kSbo);
  static_assert(cute_lbo<M1, decltype(tensor<0>(declval<PW1>()))>() == W::Sw128<M1>::template lbo<BN1>());
  static_assert(cute_lbo<M2, decltype(tensor<0>(declval<PW2>()))>() == W::Sw128<M2>::template lbo<BN2>());
  static constexpr bool ok = true;
};

using bf16 = cutlass::bfloat16_t;
constexpr auto K = GMMA::Major::K, MN = GMMA::Major::MN;
static_assert(Fused<bf16, 64, 64, 64, 7, K>::ok && Fused<bf16, 64, 64, 256, 5, MN>::ok);
static_assert(Fused<bf16, 128, 128, 128, 5, K>::ok && Fused<bf16, 128, 128, 64, 7, MN>::ok);
static_assert(Fused<cutlass::half_t, 128, 128, 128, 2, MN>::ok);
static_assert(Fused<bf16, 128, 64, 256, 4, K>::ok && Fused<bf16, 128, 64, 256, 4, MN>::ok);  // cooperative
static_assert(Fused<bf16, 256, 128, 64, 3, MN>::ok);  // cooperative, 2 x 128 rows
static_assert(B2b<bf16, 64, 256, K, K>::ok && B2b<bf16, 128, 64, MN, MN>::ok);
static_assert(B2b<cutlass::half_t, 128, 192, K, MN>::ok && B2b<bf16, 64, 128, MN, K>::ok);

extern "C" __global__ void wgmma_vs_cute() {}
)";

TEST_F(EmitCompile, HandWrittenWgmmaOperandsMatchCute) {
  opt_.jit.compiler = CompilerKind::Nvrtc;
  opt_.jit.nvcc_fallback = false;
  opt_.jit.use_cache = false;
  CompiledKernel k = jit_compile({"wgmma_vs_cute", kWgmmaVsCute, "wgmma_vs_cute", {}}, opt_.jit);
  EXPECT_TRUE(is_cubin_elf(k.cubin));
}

// NVRTC has no __builtin_inff: infinite literals compile with NVRTC alone (no nvcc fallback).
// pow with a literal exponent of 2, 3 or 4 renders as multiplies (PowInt); other exponents, or a
// runtime scalar one, keep powf (Pow). The kernel compiles (EveryExampleRegion's JIT covers Pow).
TEST_F(EmitCompile, PowWithASmallLiteralExponentMultiplies) {
  Built b;
  Value acc = bf16_gemm(b.g);
  Value s = b.g.input("s", DType::F32, {});
  b.g.output(b.g.binary(BinaryOp::Pow, acc, 3.0) + b.g.binary(BinaryOp::Pow, acc, 2.5) + b.g.binary(BinaryOp::Pow, acc, s),
             "y", DType::BF16);
  b.r = lower(b.g);
  const FusionSpec& spec = b.r.regions.at(0).spec;
  const std::string epi = emit_epilogue_type(spec);
  EXPECT_NE(epi.find("comfuse::epi::Compute<comfuse::epi::PowInt<3>, 0>"), std::string::npos) << epi;
  EXPECT_EQ(epi.find("PowInt<2>"), std::string::npos) << epi;
  size_t powf_nodes = 0;
  for (size_t at = epi.find("comfuse::epi::Pow,"); at != std::string::npos; at = epi.find("comfuse::epi::Pow,", at + 1))
    ++powf_nodes;
  EXPECT_EQ(powf_nodes, 2u) << epi;
  CompiledKernel k = compile_only(spec, shape(256, 256, 64), opt_);
  EXPECT_TRUE(is_cubin_elf(k.cubin));
}

// add(tanh(u), 1), either order, renders as OnePlusTanh of u (2 sigmoid(2u)); a tanh another
// node also reads stays; an add of a tanh and another literal is an add. The kernel compiles.
TEST_F(EmitCompile, OnePlusTanhRendersAsASigmoid) {
  Built b;
  Value acc = bf16_gemm(b.g);
  Value t = b.g.unary(UnaryOp::Tanh, acc * 0.5);
  Value kept = b.g.unary(UnaryOp::Tanh, acc);
  b.g.output((t + 1.0) * acc + b.g.binary(BinaryOp::Add, b.g.constant(1.0), kept) * kept + (kept + 2.0), "y", DType::BF16);
  b.r = lower(b.g);
  const FusionSpec& spec = b.r.regions.at(0).spec;
  const std::string epi = emit_epilogue_type(spec);
  size_t sigmoids = 0, tanhs = 0;
  for (size_t at = epi.find("epi::OnePlusTanh,"); at != std::string::npos; at = epi.find("epi::OnePlusTanh,", at + 1))
    ++sigmoids;
  for (size_t at = epi.find("epi::Tanh,"); at != std::string::npos; at = epi.find("epi::Tanh,", at + 1)) ++tanhs;
  EXPECT_EQ(sigmoids, 2u) << epi;
  EXPECT_EQ(tanhs, 2u) << epi;  // rendered, but only `kept`'s is read
  int dead = 0;
  for (size_t i = 0; i < spec.root.nodes.size(); ++i) dead += only_one_plus_tanh_users(spec.root, static_cast<int>(i));
  EXPECT_EQ(dead, 1);
  CompiledKernel k = compile_only(spec, shape(256, 256, 64), opt_);
  EXPECT_TRUE(is_cubin_elf(k.cubin));
}

TEST_F(EmitCompile, InfiniteLiteralsCompileWithNvrtcAlone) {
  Built b;
  Value acc = bf16_gemm(b.g);
  b.g.output(b.g.binary(BinaryOp::Min, b.g.binary(BinaryOp::Max, acc, -INFINITY), INFINITY), "y", DType::BF16);
  const LoweringResult r = lower(b.g);
  const FusionSpec& s = r.regions.at(0).spec;
  const std::string epi = emit_epilogue_type(s);
  EXPECT_NE(epi.find("static constexpr float value = __builtin_bit_cast(float, 0xff800000u);"), std::string::npos) << epi;
  EXPECT_NE(epi.find("static constexpr float value = __builtin_bit_cast(float, 0x7f800000u);"), std::string::npos) << epi;
  opt_.jit.compiler = CompilerKind::Nvrtc;
  opt_.jit.nvcc_fallback = false;
  CompiledKernel k = compile_only(s, shape(256, 256, 64), opt_);
  EXPECT_TRUE(is_cubin_elf(k.cubin));
  EXPECT_EQ(k.compiler.rfind("nvrtc-", 0), 0u) << k.compiler;
}

TEST_F(EmitCompile, EveryUnaryOpInOneKernel) {
  std::vector<UnaryOp> all;
  for (int i = 0; i < kUnaryOpCount; ++i) all.push_back(static_cast<UnaryOp>(i));
  Built b = build_unary_chain(all);
  CompiledKernel k = compile_only(b.r.regions.at(0).spec, shape(4096, 4096, 4096), opt_);
  EXPECT_TRUE(is_cubin_elf(k.cubin));
  EXPECT_FALSE(k.wgmma_serialized);
}

// summarize_trace on a hand-made timeline (the layout of kernels/comfuse/debug/trace.cuh): two
// PingPong CTAs of one row group, three jobs each, 1 cycle per ns; CTA 1 runs 10 ns behind.
// Mainloops 100, 110, 100 us. WG0's first epilogue ends at 250 us, after WG1's accumulators
// (200 us): a 50 us gap of the tensor cores, all of it behind that epilogue.
TEST(Trace, SummaryFindsTheIdleGapBehindAnEpilogue) {
  std::vector<uint64_t> w(trace::kWords, 0);
  struct J { int wg, job; uint64_t turn, issued, acc, done; };
  const J jobs[] = {{0, 0, 1000, 91000, 101000, 251000}, {1, 0, 91000, 191000, 201000, 231000},
                    {0, 1, 251000, 341000, 351000, 401000}};
  for (int cta = 0; cta < 2; ++cta) {
    uint64_t* rec = w.data() + size_t(cta) * trace::kWordsPerCta;
    for (const J& j : jobs) {
      const uint64_t ev[4] = {j.turn, j.issued, j.acc, j.done};
      for (int e = 0; e < 4; ++e) {
        const size_t at = size_t((j.wg * trace::kMaxJobs + j.job) * trace::kEvents + e) * 2;
        rec[at] = ev[e] + 10 * cta;  // globaltimer
        rec[at + 1] = ev[e];         // clock64
      }
    }
    rec[trace::kPollBase] = 6000;  // WG0: 6 us in 2 polls (cycles)
    rec[trace::kPollBase + 1] = 2;
    // Epilogue parts (cycles) summed over WG0's 2 jobs and WG1's 1: 30 us of body, 60 of round.
    rec[trace::kEpiBase + trace::kEpiRootBody] = 20000;
    rec[trace::kEpiBase + trace::kEpiParts + trace::kEpiRootBody] = 10000;
    rec[trace::kEpiBase + trace::kEpiRound] = 60000;
    // Entry 0.5 us before the first turn, released 0.1 us later, the consumers' exits 2 and 5 us
    // after the last done.
    rec[trace::kEntryWord] = 1000 + 10 * cta - 500;
    rec[trace::kReleasedWord] = 1000 + 10 * cta - 400;
    rec[trace::kExitBase] = 401000 + 10 * cta + 2000;
    rec[trace::kExitBase + 1] = 401000 + 10 * cta + 5000;
    rec[trace::kWordsPerCta - 1] = 1 + cta;  // SM id + 1
  }
  Plan plan;
  plan.kernel.wgs_per_tile = 1;
  plan.kernel.row_group = 2;
  std::string csv;
  const std::string s = summarize_trace(w, plan, &csv);
  EXPECT_NE(s.find("2 CTAs, 3 jobs each"), std::string::npos) << s;
  EXPECT_NE(s.find("SM clock 1.00 GHz"), std::string::npos) << s;
  EXPECT_NE(s.find("mainloop per job (turn -> accumulators ready), us: mean 103.33"), std::string::npos) << s;
  EXPECT_NE(s.find("epilogue per job (accumulators ready -> done, rounds included), us: mean 76.67"), std::string::npos) << s;
  EXPECT_NE(s.find("(next turn - accumulators ready), us: mean 50.00"), std::string::npos) << s;
  EXPECT_NE(s.find("still in an epilogue, us: mean 50.00"), std::string::npos) << s;
  EXPECT_NE(s.find("(0.7 polls, loads issued -> every tag seen), us: mean 2.00"), std::string::npos) << s;
  EXPECT_NE(s.find("root stage's body (tile inputs, compute, stores), us: mean 10.00"), std::string::npos) << s;
  EXPECT_NE(s.find("(second statistic, exchange), us: mean 20.00"), std::string::npos) << s;
  EXPECT_NE(s.find("CTA span (first turn -> last done), us: mean 400.00"), std::string::npos) << s;
  EXPECT_NE(s.find("spread per job (3 peer sets x jobs), us: mean 0.01"), std::string::npos) << s;
  EXPECT_NE(s.find("CTA entry -> its first turn (barriers' init, the previous grid's wait, the begin), us: mean 0.50"),
            std::string::npos) << s;
  EXPECT_NE(s.find("(the last stores completed, the exchange's retire), us: mean 5.00"), std::string::npos) << s;
  EXPECT_NE(s.find("first CTA entry -> last CTA exit, us: 405.51"), std::string::npos) << s;
  // The header, every job stamp and each CTA's entry, release and two exits (job -1).
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 1 + 2 * 3 * 4 + 2 * 4);
  EXPECT_NE(csv.find(fmt::format("\n1,1,-1,-1,{},610,0\n", int(trace::kCsvReleased))), std::string::npos) << csv;
  EXPECT_NE(csv.find(fmt::format("\n0,0,1,-1,{},406000,0\n", int(trace::kCsvExit))), std::string::npos) << csv;
  EXPECT_NE(summarize_trace({}, plan).find("trace: none"), std::string::npos);
}

// With split-K only the owners (split 0) exchange rows: the row peers' spread is theirs, not the
// other splits' (which finish their mainloops earlier). One job a CTA, a row group of 2, 2 splits,
// both layouts: through L2 a split is a row group of CTAs, in a cluster the split varies fastest.
TEST(Trace, RowPeersWithSplitKAreTheOwners) {
  for (bool in_cluster : {false, true}) {
    std::vector<uint64_t> w(trace::kWords, 0);
    for (int cta = 0; cta < 4; ++cta) {
      const bool owner = in_cluster ? cta % 2 == 0 : cta < 2;
      const uint64_t acc = owner ? 100000 + 3000 * (cta % 2 + cta / 2) : 50000;  // owners 3 us apart
      const uint64_t ev[4] = {1000, 40000, acc, acc + 10000};
      uint64_t* rec = w.data() + size_t(cta) * trace::kWordsPerCta;
      for (int e = 0; e < 4; ++e) {
        rec[size_t(e) * 2] = ev[e];
        rec[size_t(e) * 2 + 1] = ev[e];
      }
      rec[trace::kWordsPerCta - 1] = 1 + cta;
      rec[trace::kReleasedWord] = owner ? 500 : 400;  // the owners released 0.1 us after the followers
    }
    Plan plan;
    plan.kernel.wgs_per_tile = 1;
    plan.kernel.row_group = 2;
    plan.kernel.k_splits = 2;
    plan.kernel.splits_in_cluster = in_cluster;
    const std::string s = summarize_trace(w, plan);
    EXPECT_NE(s.find("spread per job (1 peer sets x jobs), us: mean 3.00"), std::string::npos) << in_cluster << s;
    EXPECT_NE(s.find("split-K owners: release from the previous grid's wait after the first CTA's, us: mean 0.10"),
              std::string::npos) << in_cluster << s;
    EXPECT_NE(s.find("split-K followers: release from the previous grid's wait after the first CTA's, us: mean 0.00"),
              std::string::npos) << in_cluster << s;
  }
}

// `comfuse run --trace`: the traced build compiles (a row-group LayerNorm, the kernel the trace
// was made for), is a different cache entry, and carries the timeline buffer the runtime reads
// (FusedKernel::trace looks the symbol up by name); the default build has no trace in it.
// summarize_b2b_trace on a hand-made timeline: one CTA, two warp groups with two and one jobs,
// 1 cycle per ns; per-chunk stage sums per warp group.
TEST(Trace, B2bSummarySplitsAJobIntoItsStages) {
  std::vector<uint64_t> w(trace::kWords, 0);
  struct J { int wg, job; uint64_t start, issued, ready, done; };
  const J jobs[] = {{0, 0, 1000, 90000, 101000, 121000}, {0, 1, 121000, 210000, 221000, 241000},
                    {1, 0, 2000, 150000, 162000, 182000}};
  uint64_t* rec = w.data();
  for (const J& j : jobs) {
    const uint64_t ev[4] = {j.start, j.issued, j.ready, j.done};
    for (int e = 0; e < 4; ++e) {
      const size_t at = size_t((j.wg * trace::kMaxJobs + j.job) * trace::kEvents + e) * 2;
      rec[at] = rec[at + 1] = ev[e];
    }
  }
  const uint64_t stages[2][3] = {{120000, 60000, 20000}, {80000, 50000, 10000}};  // cycles (= ns: 1 GHz here)
  for (int wg = 0; wg < 2; ++wg)
    for (int st = 0; st < trace::kStages; ++st) rec[trace::kStageBase + wg * trace::kStages + st] = stages[wg][st];
  rec[trace::kWordsPerCta - 1] = 1;
  B2bPlan plan;
  plan.kernel.tile_m = 64, plan.kernel.tile_n2 = 128, plan.kernel.chunk_n1 = 64;
  std::string csv;
  const std::string s = summarize_b2b_trace(w, plan, &csv);
  EXPECT_NE(s.find("1 CTAs, 3 jobs each"), std::string::npos) << s;
  EXPECT_NE(s.find("launch 240.0 us"), std::string::npos) << s;
  EXPECT_NE(s.find("O complete: every chunk's ML1, Epi1, ML2), us: mean 120.00"), std::string::npos) << s;
  // WG0: 120 us of ML1 over 2 jobs = 60 us a job; WG1: 80 us over 1 job.
  EXPECT_NE(s.find("ML1 (GEMM1 issued and waited for), us: mean 70.00"), std::string::npos) << s;
  EXPECT_NE(s.find("Epi1 (F on the chunk, S into registers), us: mean 40.00"), std::string::npos) << s;
  EXPECT_NE(s.find("Epi2 per job (O complete -> GEMM2's epilogue stored), us: mean 20.00"), std::string::npos) << s;
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 1 + 3 * 4);
  EXPECT_NE(summarize_b2b_trace({}, plan).find("trace: none"), std::string::npos);
}

TEST_F(EmitCompile, TracedBuildCarriesTheTimelineBuffer) {
  Graph g = parse_graph_file((kRoot / "examples/gemm_layernorm.cf").string());
  const LoweringResult r = lower(g);
  const FusionSpec& s = r.regions.at(0).spec;
  auto has_trace = [](const CompiledKernel& k) {
    const std::string needle = "comfuse_trace";
    return std::search(k.cubin.begin(), k.cubin.end(), needle.begin(), needle.end()) != k.cubin.end();
  };
  CompiledKernel plain = compile_only(s, shape(8192, 4096, 4096), opt_);
  CompileOptions traced = opt_;
  traced.trace = true;
  CompiledKernel t = compile_only(s, shape(8192, 4096, 4096), traced);
  EXPECT_NE(plain.key, t.key);
  EXPECT_FALSE(has_trace(plain));
  EXPECT_TRUE(has_trace(t));
  EXPECT_FALSE(t.wgmma_serialized) << t.log;
}

// The planner's SMEM budget must match what the templates allocate: the heaviest
// epilogue (two fp32 outputs, two row vectors) at every tile shape the planner can pick
// must compile (the kernel static_asserts its SMEM), with the stages the plan chose.
TEST_F(EmitCompile, PlannedSmemFitsTheKernelAtEveryTileShape) {
  Built b;
  Value acc = bf16_gemm(b.g);
  Value r1 = b.g.input("r1", DType::BF16, {Dim::of("N")}), r2 = b.g.input("r2", DType::F32, {Dim::of("N")});
  b.g.output(acc * r1, "y1", DType::F32);
  b.g.output(acc + r2, "y2", DType::F32);
  const LoweringResult lowered = lower(b.g);
  const FusionSpec& s = lowered.regions.at(0).spec;
  int compiled = 0;
  for (int tm : {64, 128})
    for (int tn : {64, 128, 192, 256}) {
      if (tm * tn > 128 * 128) continue;  // the kernel's accumulator limit; the planner rejects these
      opt_.plan.tile_m = tm;
      opt_.plan.tile_n = tn;
      Plan plan;
      CompiledKernel k = compile_only(s, shape(4096, 4096, 4096), opt_, nullptr, &plan);
      EXPECT_TRUE(is_cubin_elf(k.cubin)) << tm << "x" << tn << " with " << plan.kernel.ring_stages << " stages";
      ++compiled;
    }
  EXPECT_EQ(compiled, 6);
  // And the measured configurations the planner picks by itself, one per shape class.
  opt_.plan = {};
  for (const Problem& pr : {shape(256, 4096, 4096), shape(4096, 4096, 4096), shape(8192, 4096, 4096), shape(8192, 8192, 8192)}) {
    Plan plan;
    CompiledKernel k = compile_only(s, pr, opt_, nullptr, &plan);
    EXPECT_FALSE(plan.measured_config.empty());
    EXPECT_TRUE(is_cubin_elf(k.cubin)) << plan.kernel.tile_m << "x" << plan.kernel.tile_n << " wgs " << plan.kernel.wgs_per_tile;
  }
}


// Row groups (Aggregation::Global) with clusters along M, a multi-tile row in a global stash,
// 64- and 128-row warp groups: the exchange channel and the scheduler's groups compile.
TEST_F(EmitCompile, RowGroupKernelsCompile) {
  Graph g = parse_graph_file((kRoot / "examples/gemm_layernorm.cf").string());
  const LoweringResult r = lower(g);
  const FusionSpec& s = r.regions.at(0).spec;
  struct V { int g, cm, tm; };
  for (V v : {V{2, 2, 64}, V{4, 1, 128}}) {
    opt_.plan = {};
    opt_.plan.row_group = v.g;
    opt_.plan.cluster_m = v.cm;
    opt_.plan.tile_m = v.tm;
    Plan plan;
    CompiledKernel k = compile_only(s, shape(4096, 4096, 4096), opt_, nullptr, &plan);
    EXPECT_EQ(plan.kernel.row_group, v.g);
    EXPECT_GT(plan.kernel.n_tiles, 1);
    EXPECT_TRUE(is_cubin_elf(k.cubin));
    EXPECT_FALSE(k.wgmma_serialized) << k.log;
  }
}

// Cooperative 128x256 tiles walking several N-tiles a job (forced here): both warp groups on each
// tile, each keeping its 64 rows' earlier tiles in its own stash (bf16 about the row centers where
// the pair runs online, fp32 for RMSNorm) compile at the shapes they are meant for, without spills
// but for the residual's loads from L2 beside the 128 accumulators a thread (24 B; at 1152 x 32768 x
// 1024 in row groups of 16, 284 B).
TEST_F(EmitCompile, CooperativeStashKernelsCompile) {
  struct C { const char* example; int64_t m, n, k; int g; int allowed_spill = 0; };
  for (const C& c : {C{"gemm_softmax", 1024, 32768, 4096, 16}, C{"gemm_layernorm", 4096, 8192, 4096, 8},
                     C{"gemm_rmsnorm", 4096, 8192, 4096, 8}, C{"gemm_residual_layernorm", 4096, 8192, 4096, 8, 24}}) {
    Graph g = parse_graph_file((kRoot / "examples" / (std::string(c.example) + ".cf")).string());
    const LoweringResult r = lower(g);
    opt_.plan = {};
    opt_.plan.tile_m = 128, opt_.plan.tile_n = 256, opt_.plan.cluster_m = 2, opt_.plan.row_group = c.g;
    opt_.plan.gpu = Gpu::H100;
    opt_.jit.compiler = CompilerKind::Nvrtc;
    opt_.jit.nvcc_fallback = false;
    Plan plan;
    CompiledKernel k = compile_only(r.regions.at(0).spec, shape(c.m, c.n, c.k), opt_, nullptr, &plan);
    const std::string what = fmt::format("{} {}x{}x{}", c.example, c.m, c.n, c.k);
    EXPECT_EQ(plan.kernel.wgs_per_tile, 2) << what;
    EXPECT_GT(plan.kernel.n_tiles, 1) << what;
    EXPECT_GT(plan.kernel.stash_elem_bytes, 0) << what;
    EXPECT_TRUE(is_cubin_elf(k.cubin)) << what;
    EXPECT_LE(k.spill_bytes, c.allowed_spill) << what << "\n" << k.log;
  }
}

// Split-K (scheduler/split_k.cuh): the planner's decode choice (row groups, split 8) and a
// forced 128-row split with a residual tile input compile without spills or serialized wgmma.
TEST_F(EmitCompile, SplitKKernelsCompile) {
  for (const char* ex : {"gemm_rmsnorm", "gemm_residual_rmsnorm"}) {
    Graph g = parse_graph_file((kRoot / "examples" / (std::string(ex) + ".cf")).string());
    const LoweringResult r = lower(g);
    const FusionSpec& s = r.regions.at(0).spec;
    opt_.plan = {};
    Plan plan;
    CompiledKernel k = compile_only(s, shape(1, 2048, 4096), opt_, nullptr, &plan);
    EXPECT_GT(plan.kernel.k_splits, 1) << ex;
    EXPECT_TRUE(is_cubin_elf(k.cubin));
    EXPECT_FALSE(k.wgmma_serialized) << k.log;
    opt_.plan.k_splits = 3;
    opt_.plan.tile_m = 128;
    opt_.plan.cluster_m = 1;
    CompiledKernel k3 = compile_only(s, shape(100, 1032, 520), opt_, nullptr, &plan);
    EXPECT_EQ(plan.kernel.k_splits, 3);
    EXPECT_TRUE(is_cubin_elf(k3.cubin));
  }
}

TEST(Emit, TwoTileValuesAcrossOneReductionAreRefusedByName) {
  // Stage 2 needs e = exp(acc - max) and acc itself: e's tile input (acc - max) does not
  // cross, so Φ cannot recompute e there, and the device carries one tile value.
  Built b;
  Value acc = bf16_gemm(b.g);
  Value e = b.g.unary(UnaryOp::Exp, acc - b.g.reduce(ReduceOp::Max, acc));
  b.g.output(e / b.g.reduce(ReduceOp::Sum, e) + acc, "y", DType::F32);
  const LoweringResult r = lower(b.g);
  const FusionSpec& s = r.regions.at(0).spec;
  try {
    emit(s, make_plan(s, shape(512, 1024, 64)));
    FAIL() << "expected an Error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("tile-shaped values cross the reduction"), std::string::npos) << err.what();
  }
}

TEST_F(EmitCompile, RecomputedValuesLetTwoNormalizationsShareAKernel) {
  // log_softmax and l2_normalize of the same accumulator: stage 2 would carry acc and
  // acc - max; Φ recomputes acc - max there from acc and the carried per-row max.
  Built b;
  Value acc = bf16_gemm(b.g);
  b.g.output(b.g.log_softmax(acc), "logp", DType::F32);
  b.g.output(b.g.l2_normalize(acc), "unit", DType::BF16);
  const LoweringResult r = lower(b.g);
  const FusionSpec& s = r.regions.at(0).spec;
  CompiledKernel k = compile_only(s, shape(512, 1024, 64), opt_);
  EXPECT_TRUE(is_cubin_elf(k.cubin));
}

}  // namespace
}  // namespace comfuse
