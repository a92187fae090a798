// The B2B kernel family on the CPU: Φ pairs a second GEMM with the first whose epilogue feeds
// it (and says why not where S must be stored), the B2B planner's layout and refusals, Ψ's
// source (F with S as the register operand, GEMM2's epilogue, one B2bConfig), the causal mask
// (B2bConfig::causal, priced, refused without the online softmax), and NVRTC compiles the FFN,
// attention and causal attention kernels with their RS wgmmas.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "comfuse/emit.h"
#include "comfuse/lower.h"
#include "comfuse/plan.h"
#include "comfuse/runtime.h"
#include "comfuse/scheduler/grid.cuh"
#include "comfuse/text.h"
#include "expect_error.h"
#include "plan/calibration.h"
#include "runtime/launch.h"

namespace comfuse {
namespace {

using test::expect_error;

const std::filesystem::path kRoot = COMFUSE_SOURCE_DIR;

struct Pair {
  Graph g;
  LoweringResult r;
  const B2BCandidate* b = nullptr;
  const FusionSpec& first() const { return r.regions.at(static_cast<size_t>(b->first_region)).spec; }
  const FusionSpec& second() const { return r.regions.at(static_cast<size_t>(b->second_region)).spec; }
};

Pair lowered(const std::string& example) {
  Pair p;
  p.g = parse_graph_file((kRoot / "examples" / example).string());
  p.r = lower(p.g);
  p.b = one_b2b_kernel(p.r);
  return p;
}

TEST(B2b, FfnAndAttentionArePairs) {
  for (const char* ex : {"ffn.cf", "attention.cf", "attention_causal.cf"}) {
    SCOPED_TRACE(ex);
    Pair p = lowered(ex);
    ASSERT_NE(p.b, nullptr) << describe(p.g, p.r);
    EXPECT_TRUE(p.b->blocker.empty());
    EXPECT_NE(describe(p.g, p.r).find("one kernel, S in registers"), std::string::npos);
  }
}

TEST(B2b, PlanLayoutAndIntermediate) {
  Pair ffn = lowered("ffn.cf");
  B2bProblem pr{1, 8192, 1024, 4096, 1024, DType::BF16};
  B2bPlan p = make_b2b_plan(ffn.first(), ffn.second(), pr);
  EXPECT_EQ(p.intermediate, B2bIntermediate::Elementwise);
  EXPECT_EQ(p.kernel.tile_n2, 256);
  EXPECT_EQ(p.gemm1_passes, 4);  // N2 = 1024 in blocks of 256: GEMM1 four times
  EXPECT_EQ(check(p.kernel), nullptr);
  EXPECT_LE(p.kernel.smem_bytes(), Sm90::kSmemCapacity);
  EXPECT_GE(p.kernel.ring_stages, 2);
  EXPECT_NE(explain(ffn.first(), ffn.second(), p).find("GEMM1 runs 4 times"), std::string::npos);

  Pair att = lowered("attention.cf");
  B2bPlan a = make_b2b_plan(att.first(), att.second(), B2bProblem{1, 1024, 128, 1024, 128, DType::BF16});
  EXPECT_EQ(a.intermediate, B2bIntermediate::OnlineSoftmax);
  EXPECT_TRUE(a.kernel.online_softmax);
  EXPECT_FALSE(a.kernel.w2_kmajor);  // V is N1 x N2
  EXPECT_EQ(a.kernel.tile_n2, 128);
  EXPECT_EQ(a.gemm1_passes, 1);
}

// A B2B plan for the H100 (PlanOptions::gpu) prices its unfused kernels as the H100's planner
// plans them (GEMM2, a cast over 2048 tiles of 128x128, on cooperative tiles there, PingPong on
// the H200), and explain names the GPU.
TEST(B2b, PlansForTheGpuItIsTold) {
  Pair ffn = lowered("ffn.cf");
  const B2bProblem pr{1, 8192, 1024, 4096, 4096, DType::BF16};
  PlanOptions h100, h200;
  h100.gpu = Gpu::H100, h200.gpu = Gpu::H200;
  h100.b2b = h200.b2b = PlanOptions::B2b::Force;
  const B2bPlan a = make_b2b_plan(ffn.first(), ffn.second(), pr, h100), b = make_b2b_plan(ffn.first(), ffn.second(), pr, h200);
  EXPECT_EQ(a.gpu, Gpu::H100);
  EXPECT_EQ(b.gpu, Gpu::H200);
  EXPECT_NE(a.unfused_us, b.unfused_us);
  EXPECT_NE(explain(ffn.first(), ffn.second(), a).find("gpu          H100"), std::string::npos);
}

// A causal mask before the softmax: the plan sets B2bConfig::causal (a job walks only the chunks
// of N1 that reach its rows; a CTA's two warp groups take a row block and its mirror). The
// estimate prices the busiest SM: at M = N1 = 8192 (128 row blocks, 64 CTAs, one pair each) CTA
// 0 holds row blocks 127 (64 chunks) and 0 (1 chunk), and its long job runs alone after the short
// one; without the mask every CTA holds two jobs of 64 chunks. M < N1: the rows reach the first M
// columns only. The unfused GEMMs compute everything. Explain says so.
TEST(B2b, CausalAttentionPlan) {
  Pair att = lowered("attention.cf"), causal = lowered("attention_causal.cf");
  ASSERT_NE(causal.b, nullptr) << describe(causal.g, causal.r);
  const B2bProblem pr{1, 8192, 128, 8192, 128, DType::BF16};
  PlanOptions unsplit;  // the causal walk's pricing alone (the N1 split and pairing have their own tests)
  unsplit.cluster_n = 1;
  unsplit.b2b_job_rows = 64;
  const B2bPlan full = make_b2b_plan(att.first(), att.second(), pr, unsplit);
  const B2bPlan c = make_b2b_plan(causal.first(), causal.second(), pr, unsplit);
  EXPECT_FALSE(full.kernel.causal);
  EXPECT_TRUE(c.kernel.causal);
  EXPECT_TRUE(c.kernel.online_softmax);
  EXPECT_EQ(check(c.kernel), nullptr);
  EXPECT_EQ(c.intermediate, B2bIntermediate::OnlineSoftmax);
  EXPECT_EQ(c.kernel.tile_n2, full.kernel.tile_n2);
  EXPECT_EQ(c.kernel.chunk_n1, full.kernel.chunk_n1);
  EXPECT_EQ(c.kernel.ring_stages, full.kernel.ring_stages);
  EXPECT_EQ(c.grid_ctas, full.grid_ctas);
  const double alone = DeviceModel{}.b2b_single_wg_share;
  EXPECT_NEAR(c.fused_us / full.fused_us, (2.0 * 1 + 63 / alone) / 128.0, 1e-9);
  EXPECT_GE(c.unfused_us, full.unfused_us);  // the two kernels compute every column, then mask
  const std::string why = explain(causal.first(), causal.second(), c);
  EXPECT_NE(why.find("causal mask 'masked': a job walks only the chunks of N1 that reach its rows (51% of the GEMM "
                     "work); a CTA takes a row block and its mirror (i and 127 - i: its two warp groups at once)"),
            std::string::npos)
      << why;
  EXPECT_EQ(explain(att.first(), att.second(), full).find("causal mask"), std::string::npos);
  // M < N1 = 8192, M = 1024: 16 row blocks walk 1, 1, 2, 2, .. 8 chunks of 64 (N1 in chunks of
  // 128), eight CTAs of pairs (15 - i, i); CTA 0 holds 8 and 1 chunks. Unmasked: 64 each, two.
  const B2bPlan wide =
      make_b2b_plan(causal.first(), causal.second(), B2bProblem{1, 1024, 64, 8192, 64, DType::BF16}, unsplit);
  const B2bPlan wide_full = make_b2b_plan(att.first(), att.second(), B2bProblem{1, 1024, 64, 8192, 64, DType::BF16}, unsplit);
  EXPECT_EQ(wide.grid_ctas, 8);
  EXPECT_NEAR(wide.fused_us / wide_full.fused_us, (2.0 * 1 + 7 / alone) / 128.0, 1e-9);
}

// The mask must give the softmax -inf (then exp weighs 0) for a job to skip chunks: through the
// scale, a cast or a finite shift it does; clamped to a finite value it does not, and every job
// walks all of N1 (correct, not faster), saying why. Without the online softmax it is refused.
TEST(B2b, CausalMaskNeedsTheOnlineSoftmax) {
  const std::string head = R"(
input q: bf16[M, K]
input k: bf16[N, K]
input v: bf16[N, DV]
s = matmul(q, k)
)";
  const std::string tail = "o = matmul(pb, v, layout=kn)\noutput o: bf16\n";
  const B2bProblem pr{1, 1024, 64, 1024, 64, DType::BF16};
  auto plan = [&](const std::string& body) {
    Graph g = parse_graph(head + body + tail);
    LoweringResult r = lower(g);
    const B2BCandidate* b = one_b2b_kernel(r);
    EXPECT_NE(b, nullptr) << describe(g, r);
    return make_b2b_plan(r.regions.at(0).spec, r.regions.at(1).spec, pr);
  };
  EXPECT_TRUE(plan("m = causal_mask(s)\npb = cast(softmax(sub(mul(m, 0.5), 3)), bf16)\n").kernel.causal);
  EXPECT_TRUE(plan("m = causal_mask(cast(s, bf16))\npb = cast(softmax(div(m, 8)), bf16)\n").kernel.causal);
  const B2bPlan clamped = plan("m = causal_mask(s)\npb = cast(softmax(max(m, -30)), bf16)\n");
  EXPECT_FALSE(clamped.kernel.causal);
  EXPECT_TRUE(clamped.kernel.online_softmax);
  bool said = false;
  for (const std::string& r : clamped.reasons) said = said || r.find("every job walks all of N1") != std::string::npos;
  EXPECT_TRUE(said);
  EXPECT_FALSE(plan("m = causal_mask(s)\npb = cast(softmax(mul(m, -1)), bf16)\n").kernel.causal);
  try {
    plan("m = causal_mask(s)\npb = cast(relu(m), bf16)\n");
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("b2b: F applies the causal mask 'm' but is not a softmax over N1 "
                                         "(elementwise per chunk)"),
              std::string::npos)
        << e.what();
  }
}

// F reducing over N1 other than as a softmax cannot run per chunk; S read elsewhere must be
// stored. Both say so by name.
TEST(B2b, RefusalsSayWhy) {
  Graph g = parse_graph(R"(
input x: bf16[M, K]
input w1: bf16[N, K]
input w2: bf16[D, N]
h = matmul(x, w1)
n = cast(layer_norm(h), bf16)
y = matmul(n, w2)
output y: bf16
)");
  LoweringResult r = lower(g);
  const B2BCandidate* b = one_b2b_kernel(r);
  ASSERT_NE(b, nullptr);
  try {
    make_b2b_plan(r.regions[0].spec, r.regions[1].spec, B2bProblem{1, 512, 64, 512, 64, DType::BF16});
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("softmax"), std::string::npos) << e.what();
  }
  Graph g2 = parse_graph(R"(
input x: bf16[M, K]
input w1: bf16[N, K]
input w2: bf16[D, N]
h = matmul(x, w1)
s = cast(gelu(h), bf16)
y = matmul(s, w2)
output y: bf16
output s: bf16
)");
  LoweringResult r2 = lower(g2);
  EXPECT_EQ(one_b2b_kernel(r2), nullptr);
  ASSERT_EQ(r2.b2b_candidates.size(), 1u);
  EXPECT_NE(r2.b2b_candidates[0].blocker.find("graph output"), std::string::npos) << r2.b2b_candidates[0].blocker;
}

// N1 need not be a multiple of 8 where no tensor has rows of N1 elements (attention's K and V:
// any sequence length); an FFN's W2 given as [N2, N1] does, and the refusal names it.
TEST(B2b, SequenceLengthNeedNotBeAMultipleOfEight) {
  Pair att = lowered("attention.cf");
  EXPECT_NO_THROW(make_b2b_plan(att.first(), att.second(), B2bProblem{1, 300, 64, 300, 64, DType::BF16}));
  Pair ffn = lowered("ffn.cf");
  try {
    make_b2b_plan(ffn.first(), ffn.second(), B2bProblem{1, 300, 64, 300, 64, DType::BF16});
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("N1 = 300 must be a multiple of 8: W2 'w2' is [N2, N1]"), std::string::npos)
        << e.what();
  }
  try {
    make_b2b_plan(att.first(), att.second(), B2bProblem{1, 300, 60, 300, 64, DType::BF16});
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("K = 60 and N2 = 64 must be multiples of 8"), std::string::npos) << e.what();
  }
}

TEST(B2b, EmitWritesOneConfigAndTheRegisterOperand) {
  Pair ffn = lowered("ffn.cf");
  const B2bPlan p = make_b2b_plan(ffn.first(), ffn.second(), B2bProblem{1, 1000, 72, 520, 136, DType::BF16});
  const EmittedKernel k = emit_b2b(ffn.first(), ffn.second(), p);
  EXPECT_NE(k.source.find("comfuse::epi::ToOperand<"), std::string::npos) << k.source;
  EXPECT_NE(k.source.find("comfuse::b2b::ElementwiseF"), std::string::npos);
  EXPECT_NE(k.source.find("constexpr comfuse::B2bConfig kConfig{"), std::string::npos);
  EXPECT_NE(k.source.find("tma_b2       w2 bf16"), std::string::npos) << k.source;
  EXPECT_EQ(k.source.find(" sb "), std::string::npos) << "S has no Params slot";
  Pair att = lowered("attention.cf");
  const B2bPlan a = make_b2b_plan(att.first(), att.second(), B2bProblem{1, 300, 64, 520, 64, DType::BF16});
  const std::string src = emit_b2b(att.first(), att.second(), a).source;
  EXPECT_NE(src.find("comfuse::b2b::OnlineSoftmaxF"), std::string::npos) << src;
  EXPECT_EQ(src.find("ReduceMax"), std::string::npos) << "the kernel runs the softmax's reductions itself";
  EXPECT_NE(src.find(".causal = false"), std::string::npos) << src;
  EXPECT_EQ(src.find("CausalMask"), std::string::npos) << src;
  EXPECT_NE(src.find("/* n3 */ comfuse::epi::ToOperand<0>>"), std::string::npos) << "the raw scores: " << src;
  EXPECT_NE(src.find(".logit_scale = 0.125000000f"), std::string::npos) << src;
  // The causal kernel: the config walks the chunks causally; the kernel masks the raw scores.
  Pair causal = lowered("attention_causal.cf");
  const B2bPlan c = make_b2b_plan(causal.first(), causal.second(), B2bProblem{1, 300, 64, 520, 64, DType::BF16});
  const std::string csrc = emit_b2b(causal.first(), causal.second(), c).source;
  EXPECT_NE(csrc.find("/* n4 */ comfuse::epi::ToOperand<0>>"), std::string::npos) << csrc;
  EXPECT_NE(csrc.find(".online_softmax = true, .causal = true"), std::string::npos) << csrc;
  EXPECT_NE(csrc.find(".logit_scale = 0.125000000f, .fma_exp_every = 0, .x_k_blocks = 1, .x_buffers = 1,\n    .f_beside_gemm2 = true, .chain_jobs = false, .decode_rows = 0}"),
            std::string::npos)
      << "causal: " << csrc;
  EXPECT_NE(src.find(".logit_scale = 0.125000000f, .fma_exp_every = 0, .x_k_blocks = 1, .x_buffers = 1,\n    .f_beside_gemm2 = true, .chain_jobs = false, .decode_rows = 0}"),
            std::string::npos)
      << src;
}

// F beside the previous chunk's GEMM2 (f_beside_gemm2) is the planner's default for attention
// wherever X (Q) fits resident (K <= 256): it keeps Q resident and its chunks of 128 (the
// exponentials in place in P); without the overlap (forced off) Q stays in the slots. X resident
// alone is forced only; a forced overlap or residency that cannot be built is refused by name.
TEST(B2b, AttentionOverlapByDefaultResidentXForcedOnly) {
  Pair att = lowered("attention.cf"), causal = lowered("attention_causal.cf"), ffn = lowered("ffn.cf");
  auto plan = [](Pair& g, int64_t k, const PlanOptions& opt = {}) {
    return make_b2b_plan(g.first(), g.second(), B2bProblem{1, 1024, k, 1024, 128, DType::BF16}, opt);
  };
  PlanOptions on, off, resident;
  on.b2b_overlap = true;
  off.b2b_overlap = false;
  resident.b2b_x_resident = true;
  const B2bPlan d128 = plan(att, 128, off);
  EXPECT_FALSE(d128.kernel.f_beside_gemm2);
  EXPECT_EQ(d128.kernel.x_k_blocks, 0);
  EXPECT_TRUE(plan(att, 128).kernel.f_beside_gemm2) << "the default where Q fits resident";
  EXPECT_TRUE(plan(causal, 64).kernel.f_beside_gemm2);
  EXPECT_FALSE(plan(att, 320).kernel.f_beside_gemm2) << "K > 256: Q in the slots, F between the GEMMs";
  EXPECT_EQ(plan(att, 320).kernel.x_k_blocks, 0);
  PlanOptions not_resident;
  not_resident.b2b_x_resident = false;
  EXPECT_FALSE(plan(att, 128, not_resident).kernel.f_beside_gemm2) << "--b2b-x-resident off: no overlap either";
  EXPECT_FALSE(make_b2b_plan(ffn.first(), ffn.second(), B2bProblem{1, 1024, 128, 4096, 1024, DType::BF16})
                   .kernel.f_beside_gemm2)
      << "an elementwise F: nothing to overlap";
  const B2bPlan over = plan(att, 128, on);
  EXPECT_TRUE(over.kernel.f_beside_gemm2);
  EXPECT_EQ(over.kernel.x_k_blocks, 2);
  EXPECT_EQ(over.kernel.chunk_n1, 128) << "the exponentials in place: no registers beyond P, S and O";
  EXPECT_EQ(check(over.kernel), nullptr);
  EXPECT_GE(over.kernel.ring_stages, over.kernel.x_k_blocks + over.kernel.chunk_n1 / 64);
  EXPECT_EQ(over.kernel.live_values(), d128.kernel.live_values());
  EXPECT_EQ(over.kernel.slot_a_bytes(), 0) << "the slots carry K and V only";
  EXPECT_NE(explain(att.first(), att.second(), over).find("X resident (2 k-blocks)"), std::string::npos);
  PlanOptions resident_only = resident;
  resident_only.b2b_overlap = false;
  const B2bPlan res = plan(att, 128, resident_only);
  EXPECT_FALSE(res.kernel.f_beside_gemm2);
  EXPECT_EQ(res.kernel.x_k_blocks, 2);
  EXPECT_EQ(res.kernel.chunk_n1, d128.kernel.chunk_n1);
  PlanOptions unpaired = resident_only;
  unpaired.b2b_job_rows = 64;
  const int deeper = plan(att, 128, unpaired).kernel.ring_stages;
  unpaired.b2b_x_resident = false;
  EXPECT_GT(deeper, plan(att, 128, unpaired).kernel.ring_stages) << "smaller slots, a deeper ring";
  EXPECT_NE(explain(att.first(), att.second(), res).find("X resident beside them"), std::string::npos);
  EXPECT_EQ(plan(att, 72, on).kernel.x_k_blocks, 2) << "a ragged K: X's last k-block zero-filled";
  EXPECT_EQ(plan(att, 192, on).kernel.x_k_blocks, 3);
  EXPECT_EQ(plan(causal, 64, resident).kernel.x_k_blocks, 1);
  EXPECT_EQ(make_b2b_plan(ffn.first(), ffn.second(), B2bProblem{1, 1024, 128, 4096, 1024, DType::BF16}, resident)
                .kernel.x_k_blocks,
            2)
      << "any F at a short K";
  EXPECT_THROW(plan(att, 320, on), Error) << "X resident for K <= 256";
  // Head dim 256 with 256 columns of O: Q resident and two chunks' 32 KiB slots leave no ring, so
  // the default runs F between the GEMMs (and says why); forced, the overlap is refused by name.
  const B2bPlan d256 = make_b2b_plan(att.first(), att.second(), B2bProblem{1, 1024, 256, 1024, 256, DType::BF16});
  EXPECT_FALSE(d256.kernel.f_beside_gemm2);
  EXPECT_EQ(d256.kernel.x_k_blocks, 0);
  EXPECT_EQ(check(d256.kernel), nullptr);
  EXPECT_NE(explain(att.first(), att.second(), d256).find("F between the GEMMs, X in the ring's slots: with X resident"),
            std::string::npos);
  PlanOptions capped;  // --ring-stages caps a B2B ring too; the overlap then needs its two chunks' slots
  capped.ring_stages = 5;
  EXPECT_EQ(plan(att, 128, capped).kernel.ring_stages, 5);
  capped.ring_stages = 3;
  EXPECT_FALSE(plan(att, 128, capped).kernel.f_beside_gemm2) << "2 k-blocks of Q and 2 of a chunk exceed 3 stages";
  PlanOptions defaults_forced;  // options forced to what the default is do not keep the overlap
  defaults_forced.b2b_chain_jobs = false, defaults_forced.b2b_x_buffers = 1, defaults_forced.b2b_job_rows = 64;
  EXPECT_FALSE(make_b2b_plan(att.first(), att.second(), B2bProblem{1, 1024, 256, 1024, 256, DType::BF16}, defaults_forced)
                   .kernel.f_beside_gemm2);
  expect_error([&] { make_b2b_plan(att.first(), att.second(), B2bProblem{1, 1024, 256, 1024, 256, DType::BF16}, on); }, "(forced: --b2b-overlap on)");
  // Forced values no B2B kernel takes are refused by the option's name, before planning.
  for (auto [set, name] : {std::pair{+[](PlanOptions& o) { o.b2b_job_rows = 32; }, "--b2b-job-rows 32"},
                           std::pair{+[](PlanOptions& o) { o.b2b_job_rows = 256; }, "--b2b-job-rows 256"},
                           std::pair{+[](PlanOptions& o) { o.tile_n = 100; }, "--tile-n 100"},
                           std::pair{+[](PlanOptions& o) { o.fma_exp_every = 3; }, "--fma-exp-every 3"}}) {
    PlanOptions o;
    set(o);
    expect_error([&] { plan(att, 128, o); }, name);
  }
  EXPECT_THROW(plan(att, 320, resident), Error);
  PlanOptions contradiction = on;
  contradiction.b2b_x_resident = false;
  EXPECT_THROW(plan(att, 128, contradiction), Error);
  expect_error([&] { make_b2b_plan(ffn.first(), ffn.second(), B2bProblem{1, 1024, 1024, 4096, 1024, DType::BF16}, on); }, "--b2b-overlap");
  PlanOptions fma;
  fma.fma_exp_every = 4;
  expect_error([&] { make_b2b_plan(ffn.first(), ffn.second(), B2bProblem{1, 1024, 1024, 4096, 1024, DType::BF16}, fma); }, "--fma-exp-every 4");
  // Two resident X buffers: the SMEM a second X takes comes out of the ring when forced; by
  // default only where a CTA walks several jobs and the ring keeps its stages. Refused where X is
  // not resident, where the ring cannot hold a chunk beside two, and any count but 1 or 2.
  PlanOptions two = on;
  two.b2b_x_buffers = 2;
  const B2bPlan dbl = plan(att, 128, two);
  EXPECT_EQ(dbl.kernel.x_buffers, 2);
  EXPECT_EQ(check(dbl.kernel), nullptr);
  EXPECT_LE(dbl.kernel.ring_stages, over.kernel.ring_stages);
  EXPECT_LE(dbl.kernel.smem_bytes(), Sm90::kSmemCapacity);
  EXPECT_EQ(dbl.kernel.ring_bytes() - over.kernel.ring_bytes() +
                (over.kernel.ring_stages - dbl.kernel.ring_stages) * over.kernel.slot_b_bytes(),
            over.kernel.x_k_blocks * over.kernel.x_block_bytes())
      << "one more X beside a ring of the stages left";
  EXPECT_NE(explain(att.first(), att.second(), dbl).find("X resident (2 k-blocks, 2 buffers)"), std::string::npos);
  EXPECT_NE(emit_b2b(att.first(), att.second(), dbl).source.find(".x_buffers = 2,"), std::string::npos);
  EXPECT_EQ(plan(att, 128).kernel.x_buffers, 1) << "one job a CTA: nothing to load during it";
  const B2bPlan batched = make_b2b_plan(att.first(), att.second(), B2bProblem{64, 1024, 128, 1024, 128, DType::BF16});
  EXPECT_EQ(batched.kernel.x_buffers, 2) << "several jobs a CTA: the next job's Q loads during this one";
  EXPECT_EQ(batched.kernel.ring_stages, 8) << "and no ring stage given for it";
  PlanOptions unpaired_two = two;
  unpaired_two.b2b_job_rows = 64;
  expect_error([&] { plan(att, 192, unpaired_two); }, "--b2b-x-buffers 2");
  unpaired_two.b2b_job_rows = 128;
  EXPECT_EQ(plan(att, 192, unpaired_two).kernel.x_buffers, 2) << "paired: one ring beside them";
  PlanOptions two_off = two;
  two_off.b2b_overlap = false;
  expect_error([&] { plan(att, 128, two_off); }, "--b2b-x-buffers 2");
  two.b2b_x_buffers = 3;
  EXPECT_THROW(plan(att, 128, two), Error);
  // Chained jobs (forced): two X buffers with them, one CTA per job; refused without the overlap,
  // with one X buffer, with N1 over a cluster, and where GEMM2's epilogue reads a tile input.
  PlanOptions chain;
  chain.b2b_chain_jobs = true;
  const B2bPlan chained = plan(att, 128, chain);
  EXPECT_TRUE(chained.kernel.chain_jobs);
  EXPECT_EQ(chained.kernel.x_buffers, 2);
  EXPECT_EQ(chained.kernel.cluster_n1, 1);
  EXPECT_EQ(check(chained.kernel), nullptr);
  EXPECT_NE(explain(att.first(), att.second(), chained).find("jobs chained"), std::string::npos);
  EXPECT_NE(emit_b2b(att.first(), att.second(), chained).source.find(".chain_jobs = true, .decode_rows = 0}"), std::string::npos);
  EXPECT_FALSE(plan(att, 128).kernel.chain_jobs) << "forced only";
  for (auto refuse : {+[](PlanOptions& o) { o.b2b_overlap = false; }, +[](PlanOptions& o) { o.b2b_x_buffers = 1; },
                      +[](PlanOptions& o) { o.cluster_n = 2; }}) {
    PlanOptions o = chain;
    refuse(o);
    expect_error([&] { plan(att, 128, o); }, "--b2b-chain-jobs on");
  }
  B2bConfig bad = over.kernel;
  bad.chain_jobs = true;
  EXPECT_NE(check(bad), nullptr) << "chained jobs with one X buffer";
  bad = over.kernel;
  bad.x_buffers = 2;
  bad.x_k_blocks = 0;
  bad.f_beside_gemm2 = false;
  EXPECT_NE(check(bad), nullptr) << "two buffers of no resident X";
  bad = over.kernel;
  bad.ring_stages = 2;
  EXPECT_NE(check(bad), nullptr) << "two chunks' GEMM1 and GEMM2 k-blocks in flight";
  bad = over.kernel;
  bad.x_k_blocks = 0;
  EXPECT_NE(check(bad), nullptr) << "F beside GEMM2 needs X resident";
}

// Attention's logits (a positive literal scale, a causal mask) fold into the online softmax; any
// other prologue renders as written, the kernel computing plain exponentials of it.
TEST(B2b, OnlySoftmaxOfScaledMaskedScoresFoldsTheScale) {
  auto plan_of = [](const std::string& logits, const PlanOptions& opt = {}) {
    Graph g = parse_graph(R"(
input q: bf16[M, K]
input k: bf16[N, K]
input v: bf16[N, DV]
input t: f32[]
s = matmul(q, k)
)" + logits + R"(
p = softmax(x)
pb = cast(p, bf16)
o = matmul(pb, v, layout=kn)
output o: bf16
)");
    LoweringResult r = lower(g);
    const B2BCandidate* b = one_b2b_kernel(r);
    EXPECT_NE(b, nullptr) << logits;
    const B2bPlan plan = make_b2b_plan(r.regions.at(static_cast<size_t>(b->first_region)).spec,
                                       r.regions.at(static_cast<size_t>(b->second_region)).spec,
                                       B2bProblem{1, 256, 128, 512, 128, DType::BF16}, opt);
    return plan.kernel;
  };
  EXPECT_FLOAT_EQ(plan_of("x = mul(s, 0.5)").logit_scale, 0.5f);
  EXPECT_FLOAT_EQ(plan_of("x = div(mul(2.0, s), 8.0)").logit_scale, 0.25f);
  EXPECT_FLOAT_EQ(plan_of("x = causal_mask(mul(s, 0.5))").logit_scale, 0.5f);
  EXPECT_TRUE(plan_of("x = causal_mask(mul(s, 0.5))").causal);
  EXPECT_FLOAT_EQ(plan_of("x = cast(s, f32)").logit_scale, 0.f) << "anything but masks and positive literal scales renders as written";
  EXPECT_EQ(plan_of("x = mul(s, -0.5)").logit_scale, 0.f) << "a negative scale flips the max";
  EXPECT_EQ(plan_of("x = mul(s, t)").logit_scale, 0.f) << "a runtime scalar";
  EXPECT_EQ(plan_of("x = add(mul(s, 0.5), 1.0)").logit_scale, 0.f);
  EXPECT_EQ(plan_of("x = causal_mask(mul(s, 0.5))").fma_exp_every, 0) << "causal: all on the MUFU";
  PlanOptions every8;
  every8.fma_exp_every = 8;
  EXPECT_EQ(plan_of("x = mul(s, 0.5)", every8).fma_exp_every, 8);
}

// The two-kernel path is priced as the planner plans its two kernels (a softmax over N1 is a row
// reduction over many N-tiles there), never below the DRAM traffic; so is the fused kernel.
TEST(B2b, UnfusedPathIsPricedAsTheTwoPlannedKernels) {
  Pair ffn = lowered("ffn.cf"), att = lowered("attention.cf");
  const B2bProblem small{1, 64, 1024, 3072, 1024, DType::BF16};
  const B2bPlan f = make_b2b_plan(ffn.first(), ffn.second(), small);
  const double weights_us = 2.0 * (3072.0 * 1024 * 2) / DeviceModel{}.dram_bytes_per_s * 1e6;  // W1 and W2
  EXPECT_GE(f.unfused_us, weights_us);
  EXPECT_GE(f.fused_us, f.dram_floor_us);
  EXPECT_GE(f.dram_floor_us, weights_us);
  EXPECT_NE(f.unfused_from.find("the planner's two kernels"), std::string::npos) << f.unfused_from;
  const B2bPlan a = make_b2b_plan(att.first(), att.second(), B2bProblem{1, 16384, 128, 16384, 128, DType::BF16});
  EXPECT_LT(a.fused_us, a.unfused_us) << a.unfused_from;
  EXPECT_NE(explain(att.first(), att.second(), a).find("the planner's two kernels: GEMM1 + F storing S"),
            std::string::npos);
}

// The partition along N1: where a pair has too few jobs to fill the GPU (FFN rows of 64 with one
// block of O per job: 128 jobs for 264 warp groups), the planner splits N1 over clusters; the
// cluster's ranks walk interleaved chunks, each chunk exactly once; a forced size is honoured or
// refused by name; attention's many jobs keep one CTA per job.
TEST(B2b, SplitsN1OverAClusterWhereJobsAreFew) {
  Pair ffn = lowered("ffn.cf");
  const B2bProblem few{1, 8192, 1024, 4096, 256, DType::BF16};
  const B2bPlan p = make_b2b_plan(ffn.first(), ffn.second(), few);
  EXPECT_GE(p.kernel.cluster_n1, 2);
  EXPECT_EQ(p.grid_ctas % p.kernel.cluster_n1, 0);
  EXPECT_GT(p.grid_ctas, 64) << "more CTAs than the 64 an unsplit grid of 128 jobs gets";
  EXPECT_LE(p.grid_ctas, 132);
  EXPECT_EQ(check(p.kernel), nullptr);
  const std::string e = explain(ffn.first(), ffn.second(), p);
  EXPECT_NE(e.find("N1 split     over clusters of"), std::string::npos) << e;
  EXPECT_NE(e.find("N1 over clusters of 1:"), std::string::npos) << "the unsplit runner-up: " << e;
  PlanOptions unsplit;
  unsplit.cluster_n = 1;
  const B2bPlan one = make_b2b_plan(ffn.first(), ffn.second(), few, unsplit);
  EXPECT_EQ(one.kernel.cluster_n1, 1);
  EXPECT_EQ(one.grid_ctas, 64);
  EXPECT_LT(p.fused_us, one.fused_us);
  EXPECT_NE(emit_b2b(ffn.first(), ffn.second(), p).source.find(fmt::format(".cluster_n1 = {}", p.kernel.cluster_n1)),
            std::string::npos);
  PlanOptions sixteen;
  sixteen.cluster_n = 16;  // non-portable, only when asked
  EXPECT_EQ(make_b2b_plan(ffn.first(), ffn.second(), few, sixteen).kernel.cluster_n1, 16);
  PlanOptions three;
  three.cluster_n = 3;
  expect_error([&] { make_b2b_plan(ffn.first(), ffn.second(), few, three); }, "--cluster-n 3");
  Pair att = lowered("attention_batched.cf");
  const B2bPlan a = make_b2b_plan(att.first(), att.second(), B2bProblem{64, 1024, 128, 1024, 128, DType::BF16});
  EXPECT_EQ(a.kernel.cluster_n1, 1) << explain(att.first(), att.second(), a);
  // Each chunk of a job is walked by exactly one rank, interleaved, and ranks past the chunks rest.
  for (int cluster : {2, 4, 8, 16}) {
    B2bConfig c = p.kernel;
    c.cluster_n1 = cluster;
    for (int chunks : {1, 3, 7, 8, 64, 65}) {
      int total = 0;
      for (int r = 0; r < cluster; ++r) {
        const int mine = b2b_rank_chunks(c, chunks, r);
        EXPECT_EQ(mine, r < chunks ? (chunks - r + cluster - 1) / cluster : 0);
        total += mine;
      }
      EXPECT_EQ(total, chunks) << cluster << " ranks, " << chunks << " chunks";
    }
  }
}

class B2bCompile : public ::testing::Test {
 protected:
  void SetUp() override {
    cache_ = std::filesystem::temp_directory_path() / ("comfuse-b2b-test-" + std::to_string(::getpid()));
    opt_.jit.cache_dir = cache_;
  }
  void TearDown() override { std::filesystem::remove_all(cache_); }
  std::filesystem::path cache_;
  CompileOptions opt_;
};

// `comfuse run --trace` on a B2B pair: the traced build carries the timeline buffer, keeps its
// wgmmas unserialized, and is a cache entry of its own; the plain build has no trace.
TEST_F(B2bCompile, TracedBuildCarriesTheTimelineBuffer) {
  Pair p = lowered("attention_causal.cf");
  ASSERT_NE(p.b, nullptr);
  const B2bProblem pr{1, 1000, 64, 1032, 64, DType::BF16};
  auto has_trace = [](const CompiledKernel& k) {
    const std::string needle = "comfuse_trace";
    return std::search(k.cubin.begin(), k.cubin.end(), needle.begin(), needle.end()) != k.cubin.end();
  };
  const CompiledKernel plain = compile_only_b2b(p.first(), p.second(), pr, opt_);
  CompileOptions traced = opt_;
  traced.trace = true;
  const CompiledKernel t = compile_only_b2b(p.first(), p.second(), pr, traced);
  EXPECT_NE(plain.key, t.key);
  EXPECT_FALSE(has_trace(plain));
  EXPECT_TRUE(has_trace(t));
  EXPECT_FALSE(t.wgmma_serialized) << t.log;
}

TEST_F(B2bCompile, FfnAndAttentionCompileWithRegisterOperandWgmma) {
  for (const char* ex : {"ffn.cf", "attention.cf", "attention_causal.cf"}) {
    SCOPED_TRACE(ex);
    Pair p = lowered(ex);
    ASSERT_NE(p.b, nullptr);
    const CompiledKernel c =
        compile_only_b2b(p.first(), p.second(), B2bProblem{1, 1000, 128, 1032, 128, DType::BF16}, opt_);
    EXPECT_TRUE(is_cubin_elf(c.cubin));
    EXPECT_FALSE(c.wgmma_serialized) << c.log;
  }
}

// An example's pair, planned with `o` at 1000 x 128 -> 1032 -> 128, compiles to a cubin whose
// wgmmas ptxas did not serialize.
void expect_compiles_unserialized(const char* example, const CompileOptions& o) {
  Pair p = lowered(example);
  ASSERT_NE(p.b, nullptr);
  const CompiledKernel c = compile_only_b2b(p.first(), p.second(), B2bProblem{1, 1000, 128, 1032, 128, DType::BF16}, o);
  EXPECT_TRUE(is_cubin_elf(c.cubin));
  EXPECT_FALSE(c.wgmma_serialized) << c.log;
}

// The split kernels (FFN, gated, causal attention with its row statistics) compile unserialized.
TEST_F(B2bCompile, SplitN1KernelsCompile) {
  for (const char* ex : {"ffn.cf", "ffn_swiglu.cf", "attention_causal.cf"}) {
    SCOPED_TRACE(ex);
    CompileOptions o = opt_;
    o.plan.cluster_n = 4;
    expect_compiles_unserialized(ex, o);
  }
}

// Paired jobs (B2bConfig::paired: both consumer warp groups on one job, one shared ring, ordered
// tensor-core turns) compile without serialized wgmmas, alone and with N1 split over a cluster.
TEST_F(B2bCompile, PairedKernelsCompile) {
  for (const char* ex : {"attention.cf", "attention_causal.cf", "ffn.cf", "ffn_swiglu.cf"})
    for (int cluster : {1, 2}) {
      SCOPED_TRACE(fmt::format("{} cluster {}", ex, cluster));
      CompileOptions o = opt_;
      o.plan.cluster_n = cluster;
      o.plan.b2b_job_rows = 128;
      expect_compiles_unserialized(ex, o);
    }
}

// Attention's turns as the planner takes them (F beside GEMM2, paired) and as forced: F between
// the GEMMs, unpaired, Q in two buffers, chained jobs (causal and a head dim of 64 too): each
// compiles without serialized wgmmas (ptxas serializes them all where it cannot count a turn's
// commit groups, C7514: the forced variants run on the GPU only in test_gpu_b2b).
TEST_F(B2bCompile, AttentionOverlapVariantsCompile) {
  struct V {
    const char* example;
    int64_t k;
    void (*set)(PlanOptions&);
  };
  for (const V& v : {V{"attention.cf", 128, [](PlanOptions&) {}},
                     V{"attention.cf", 128, [](PlanOptions& o) { o.b2b_overlap = false; }},
                     V{"attention.cf", 128, [](PlanOptions& o) { o.b2b_job_rows = 64; }},
                     V{"attention.cf", 128, [](PlanOptions& o) { o.b2b_x_buffers = 2; }},
                     V{"attention.cf", 128, [](PlanOptions& o) { o.b2b_chain_jobs = true; }},
                     V{"attention_causal.cf", 128, [](PlanOptions& o) { o.b2b_chain_jobs = true; }},
                     V{"attention.cf", 64, [](PlanOptions& o) { o.b2b_chain_jobs = true, o.b2b_job_rows = 64; }},
                     V{"attention_causal.cf", 256, [](PlanOptions&) {}}}) {  // head dim 256: F between the GEMMs
    CompileOptions o = opt_;
    v.set(o.plan);
    Pair p = lowered(v.example);
    ASSERT_NE(p.b, nullptr);
    const B2bProblem pr{1, 1000, v.k, 1032, v.k, DType::BF16};
    const B2bPlan plan = make_b2b_plan(p.first(), p.second(), pr, o.plan);
    SCOPED_TRACE(fmt::format("{} K {}: overlap {} paired {} x buffers {} chained {}", v.example, v.k,
                             plan.kernel.f_beside_gemm2, plan.kernel.paired, plan.kernel.x_buffers,
                             plan.kernel.chain_jobs));
    const CompiledKernel c = compile_only_b2b(p.first(), p.second(), pr, o);
    EXPECT_TRUE(is_cubin_elf(c.cubin));
    EXPECT_FALSE(c.wgmma_serialized) << c.log;
  }
}

// [M, N] inputs on both sides of S (a scale in F, a residual in GEMM2's epilogue) keep nothing
// in SMEM: the pair plans the same FFN's epilogue storage and ring as without them, and
// compiles, batched too (3-D L2 prefetches, the batch stride).
TEST_F(B2bCompile, TileInputsKeepNothingInSmemAndCompile) {
  auto ffn = [](bool inputs) {
    return parse_graph(fmt::format(R"(
input x: bf16[M, K]
input w1: bf16[N, K]
input w2: bf16[D, N]
{}
h = matmul(x, w1)
s = cast({}, bf16)
y = matmul(s, w2)
z = {}
output z: bf16
)",
                                   inputs ? "input scale: f32[M, N]\ninput residual: f32[M, D]" : "",
                                   inputs ? "mul(gelu(h), scale)" : "gelu(h)", inputs ? "add(y, residual)" : "cast(y, bf16)"));
  };
  const Graph plain_g = ffn(false), in_g = ffn(true);
  const LoweringResult plain_r = lower(plain_g), in_r = lower(in_g);
  const B2BCandidate *plain = one_b2b_kernel(plain_r), *in = one_b2b_kernel(in_r);
  ASSERT_NE(plain, nullptr) << describe(plain_g, plain_r);
  ASSERT_NE(in, nullptr) << describe(in_g, in_r);
  auto spec = [](const LoweringResult& r, int region) -> const FusionSpec& {
    return r.regions.at(static_cast<size_t>(region)).spec;
  };
  const FusionSpec &f = spec(in_r, in->first_region), &e = spec(in_r, in->second_region);
  const B2bProblem big{1, 4096, 1024, 4096, 256, DType::BF16};
  const B2bPlan p0 = make_b2b_plan(spec(plain_r, plain->first_region), spec(plain_r, plain->second_region), big);
  const B2bPlan p1 = make_b2b_plan(f, e, big);
  EXPECT_EQ(p1.kernel.epilogue_smem_bytes, p0.kernel.epilogue_smem_bytes);
  EXPECT_EQ(p1.kernel.ring_stages, p0.kernel.ring_stages);
  for (const int64_t batches : {1, 2}) {
    SCOPED_TRACE(fmt::format("{} batch(es)", batches));
    const CompiledKernel c = compile_only_b2b(f, e, B2bProblem{batches, 1000, 128, 1032, 136, DType::BF16}, opt_);
    EXPECT_TRUE(is_cubin_elf(c.cubin));
    EXPECT_FALSE(c.wgmma_serialized) << c.log;
  }
}

// A decode step's attention as the frontend builds it (python/comfuse/attention.py, a mask that
// is neither causal nor empty): an additive [B, M, N] mask added to the scaled scores before the
// softmax, one query row a batch. On the wgmma pipeline (--b2b-decode off) F is the online softmax
// with the mask read along N1 per chunk (the scale not folded: an add follows it); the kernel
// compiles, its spills small (24-48 bytes, as the unmasked kernel of the same plans: N1 split over
// clusters, the partial O's hand-over), a ceiling that catches a kernel that stops fitting.
constexpr const char* kMaskedAttention = R"(
input q: bf16[B, M, K]
input k: bf16[B, N, K]
input v: bf16[B, N, DV]
input mask: MASK[B, M, N]
s = matmul(q, k)
x = add(mul(s, 0.125), mask)
p = cast(softmax(x), bf16)
o = matmul(p, v, layout=kn)
output o: bf16
)";

Pair masked_attention(const std::string& mask_dtype) {
  std::string text = kMaskedAttention;
  text.replace(text.find("MASK"), 4, mask_dtype);
  Pair p;
  p.g = parse_graph(text);
  p.r = lower(p.g);
  p.b = one_b2b_kernel(p.r);
  if (!p.b) throw Error("the masked attention graph lowers to no B2B pair");
  return p;
}

TEST_F(B2bCompile, AttentionWithAnAdditiveMaskAtOneRow) {
  const Pair pair = masked_attention("bf16");
  const FusionSpec& f = pair.first();
  const FusionSpec& e = pair.second();
  CompileOptions pipeline = opt_;
  pipeline.plan.b2b_decode = false;
  for (const int64_t n : {64, 1024}) {
    SCOPED_TRACE(fmt::format("N = {}", n));
    const B2bProblem pr{16, 1, 64, n, 64, DType::BF16};
    const B2bPlan p = make_b2b_plan(f, e, pr, pipeline.plan);
    EXPECT_EQ(p.intermediate, B2bIntermediate::OnlineSoftmax);
    EXPECT_FALSE(p.kernel.decode());
    EXPECT_EQ(p.kernel.logit_scale, 0.f) << "the mask's add follows the scale";
    EXPECT_TRUE(p.kernel.batched);
    const CompiledKernel c = compile_only_b2b(f, e, pr, pipeline);
    EXPECT_TRUE(is_cubin_elf(c.cubin));
    EXPECT_FALSE(c.wgmma_serialized) << c.log;
    EXPECT_GE(c.spill_bytes, 0);
    EXPECT_LE(c.spill_bytes, 64) << c.log;
  }
  expect_error([&] { make_b2b_plan(f, e, B2bProblem{16, 1, 64, 1020, 64, DType::BF16}); },
               "F reads 'mask' [M, N1]");
}

// The decode kernel (B2bConfig::decode_rows; b2b/decode_attention.cuh): a few query rows a batch
// take it where it prices below the wgmma pipeline (long caches, few batches), its mask in the
// tile-input slot the binding fills, the scale folded; many batches of 4 rows at head dim 128 keep
// the pipeline (the FMAs pace the decode kernel there), which then names the decode kernel among its
// alternatives, while one row over as many batches streams on the decode kernel. Every variant compiles
// without spills (head dims 64 to 256, 1 to 8 rows, bf16 and f32 masks, none).
TEST_F(B2bCompile, DecodeKernelPlansAndCompiles) {
  const Pair masked = masked_attention("bf16");
  const B2bPlan p = make_b2b_plan(masked.first(), masked.second(), B2bProblem{16, 1, 64, 4096, 64, DType::BF16});
  ASSERT_TRUE(p.kernel.decode()) << explain(masked.first(), masked.second(), p);
  EXPECT_EQ(p.kernel.decode_rows, 1);
  EXPECT_FLOAT_EQ(p.kernel.logit_scale, 0.125f);
  EXPECT_GT(p.kernel.cluster_n1, 1) << "16 batches split their keys over clusters";
  EXPECT_EQ(p.grid_ctas, 16 * p.kernel.cluster_n1);
  ASSERT_GE(p.decode_mask_arg, 0);
  EXPECT_EQ(masked.first().args.at(static_cast<size_t>(p.decode_mask_arg)).name, "mask");
  const std::string why = explain(masked.first(), masked.second(), p);
  EXPECT_NE(why.find("the decode kernel"), std::string::npos) << why;
  EXPECT_NE(why.find("the wgmma pipeline: "), std::string::npos) << why;
  const std::string src = emit_b2b(masked.first(), masked.second(), p).source;
  EXPECT_NE(src.find("DecodeAttention<kConfig, cutlass::bfloat16_t, cutlass::bfloat16_t, 0>"), std::string::npos) << src;
  EXPECT_EQ(src.find("b2b_gemm_sm90.cuh"), std::string::npos) << "the decode TU includes its own kernel only";

  // Many batches of 4 rows at head dim 128: the FMAs pace the decode kernel (measured 52.5 us on
  // the H200 against the pipeline's 40.5, bench/NOTES.md Stop 46); one row streams at DRAM's rate
  // (68.0 us in clusters of 2 against the pipeline's 73.6).
  const B2bPlan many = make_b2b_plan(masked.first(), masked.second(), B2bProblem{256, 4, 128, 1024, 128, DType::BF16});
  EXPECT_FALSE(many.kernel.decode()) << explain(masked.first(), masked.second(), many);
  const B2bPlan streamed = make_b2b_plan(masked.first(), masked.second(), B2bProblem{128, 1, 128, 4096, 128, DType::BF16});
  EXPECT_TRUE(streamed.kernel.decode()) << explain(masked.first(), masked.second(), streamed);
  EXPECT_EQ(streamed.kernel.cluster_n1, 2) << explain(masked.first(), masked.second(), streamed);
  // Little's law counts the CTAs resident at once: 4 rows' registers leave 2 an SM.
  const B2bPlan four = make_b2b_plan(masked.first(), masked.second(), B2bProblem{256, 4, 128, 64, 128, DType::BF16});
  ASSERT_TRUE(four.kernel.decode()) << explain(masked.first(), masked.second(), four);
  EXPECT_NE(explain(masked.first(), masked.second(), four).find("2 CTAs an SM resident"), std::string::npos);
  EXPECT_TRUE(std::any_of(many.alternatives.begin(), many.alternatives.end(),
                          [](const std::string& a) { return a.find("the decode kernel") == 0; }));

  const Pair f32 = masked_attention("f32");
  const Pair plain = lowered("attention_batched.cf");
  ASSERT_NE(plain.b, nullptr);
  struct V {
    const Pair* pair;
    B2bProblem pr;
    int cluster;
  };
  for (const V& v : {V{&masked, {16, 1, 64, 4096, 64, DType::BF16}, 16}, V{&f32, {6, 3, 128, 1000, 128, DType::BF16}, 2},
                     V{&masked, {4, 8, 64, 296, 64, DType::BF16}, 1}, V{&plain, {2, 1, 256, 520, 256, DType::BF16}, 4}}) {
    SCOPED_TRACE(fmt::format("M = {} D = {} cluster {}", v.pr.m, v.pr.k, v.cluster));
    CompileOptions o = opt_;
    o.plan.b2b_decode = true;
    o.plan.cluster_n = v.cluster;
    const B2bPlan q = make_b2b_plan(v.pair->first(), v.pair->second(), v.pr, o.plan);
    ASSERT_TRUE(q.kernel.decode());
    EXPECT_EQ(q.kernel.cluster_n1, v.cluster);
    EXPECT_EQ(q.decode_mask_arg >= 0, v.pair != &plain);
    const CompiledKernel c = compile_only_b2b(v.pair->first(), v.pair->second(), v.pr, o);
    EXPECT_TRUE(is_cubin_elf(c.cubin));
    EXPECT_EQ(c.spill_bytes, 0) << c.log;
  }
}

// What the decode kernel does not run is refused by --b2b-decode on, with the reason; the
// planner's default then takes the pipeline without a word.
TEST(B2b, DecodeKernelRefusals) {
  const Pair masked = masked_attention("bf16");
  PlanOptions on;
  on.b2b_decode = true;
  auto plan = [&](const Pair& pr, const B2bProblem& p, const PlanOptions& o) {
    return make_b2b_plan(pr.first(), pr.second(), p, o);
  };
  expect_error([&] { plan(masked, {16, 9, 64, 1024, 64, DType::BF16}, on); }, "M = 9 query rows a batch (at most 8)");
  expect_error([&] { plan(masked, {16, 1, 96, 1024, 96, DType::BF16}, on); }, "head dims K = 96 and N2 = 96");
  EXPECT_FALSE(plan(masked, {16, 9, 64, 1024, 64, DType::BF16}, {}).kernel.decode());
  PlanOptions rows = on;
  rows.b2b_job_rows = 64;
  expect_error([&] { plan(masked, {16, 1, 64, 1024, 64, DType::BF16}, rows); },
               "--b2b-decode on runs no wgmma pipeline (forced: --b2b-job-rows 64)");
  PlanOptions three = on;
  three.cluster_n = 3;
  expect_error([&] { plan(masked, {16, 1, 64, 1024, 64, DType::BF16}, three); }, "splits keys over 1, 2, 4, 8 or 16 CTAs");
  const Pair causal = lowered("attention_batched_causal.cf");
  ASSERT_NE(causal.b, nullptr);
  expect_error([&] { plan(causal, {16, 1, 64, 1024, 64, DType::BF16}, on); }, "F applies the causal mask");
  const Pair ffn = lowered("ffn.cf");
  ASSERT_NE(ffn.b, nullptr);
  expect_error([&] { plan(ffn, {1, 1, 1024, 4096, 1024, DType::BF16}, on); }, "F is not a softmax over N1");
}

// A pair run as single-GEMM kernels: a part loads its weights before waiting for the part before
// it (Params::b_before_wait) only where that part writes none of their bytes. Spans are rows x
// row stride: a padded row's gap counts, a byte past the last element does not.
TEST(B2b, UnfusedPartsReadWeightsEarlyOnlyWhereNothingBeforeWritesThem) {
  using runtime_detail::b_before_wait_allowed;
  alignas(16) static char mem[1 << 16];
  auto at = [&](size_t offset, std::vector<int64_t> shape, int64_t ld = 0, DType t = DType::BF16) {
    return DeviceTensor{mem + offset, t, std::move(shape), ld};
  };
  const DeviceTensor w2 = at(0, {64, 128});           // bytes [0, 16384)
  const DeviceTensor s = at(16384, {64, 128});        // right after: shares none
  const DeviceTensor inside = at(8192, {8, 8});       // within w2
  const DeviceTensor padded = at(0, {2, 64}, 8000);   // rows 0 and 8000 elements apart: [0, 16128)
  const DeviceTensor tail = at(16000, {1}, 0, DType::F32);  // the last bytes of w2
  const DeviceTensor batched = at(40000, {2, 4, 8});  // three dims: its span is not worked out
  EXPECT_TRUE(b_before_wait_allowed({&w2}, {}));
  EXPECT_TRUE(b_before_wait_allowed({&w2}, {&s}));
  EXPECT_TRUE(b_before_wait_allowed({&s}, {&w2}));
  EXPECT_FALSE(b_before_wait_allowed({&w2}, {&s, &inside}));
  EXPECT_FALSE(b_before_wait_allowed({&s, &w2}, {&w2}));
  EXPECT_FALSE(b_before_wait_allowed({&w2}, {&padded}));
  EXPECT_FALSE(b_before_wait_allowed({&w2}, {&tail}));
  EXPECT_TRUE(b_before_wait_allowed({&s}, {&padded, &tail}));
  EXPECT_FALSE(b_before_wait_allowed({&w2}, {&batched}));
}

}  // namespace
}  // namespace comfuse
