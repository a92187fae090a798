// A leading batch dim (attention over batch x heads) on the CPU: the graph's rank-3 inputs and
// batched matmul with its errors in the user's names, the text round trip, the fp64 executors
// against a hand loop, Φ's batched spec (and what a batched region refuses), the planner (the
// single-GEMM family refuses a batch; the B2B plan counts its jobs), the B2B scheduler's slots
// (every job once; causal mirror pairs balance the SMs) and NVRTC compiles of batched kernels.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <set>
#include <tuple>

#include "comfuse/emit.h"
#include "comfuse/interp.h"
#include "comfuse/lower.h"
#include "comfuse/params.cuh"
#include "comfuse/plan.h"
#include "comfuse/runtime.h"
#include "comfuse/scheduler/grid.cuh"
#include "comfuse/text.h"

namespace comfuse {
namespace {

const std::filesystem::path kRoot = COMFUSE_SOURCE_DIR;

std::string attention(bool causal, const std::string& dtype = "bf16") {
  return fmt::format(R"(input q: {0}[B, M, K]
input k: {0}[B, N, K]
input v: {0}[B, N, DV]
s = matmul(q, k)
scaled = mul(s, 0.125)
{1}p = softmax({2})
pb = cast(p, {0})
o = matmul(pb, v, layout=kn)
output o: {0}
)",
                     dtype, causal ? "masked = causal_mask(scaled)\n" : "", causal ? "masked" : "scaled");
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Batch, GraphShapesAndErrorsInTheUsersNames) {
  const Graph g = parse_graph(attention(true));
  const Node& s = g.node(g.find("s"));
  EXPECT_EQ(to_string(s.shape), "[B, M, N]");
  EXPECT_EQ(to_string(g.node(g.find("o")).shape), "[B, M, DV]");
  EXPECT_EQ(to_string(g.node(g.find("masked")).shape), "[B, M, N]");
  // The text round trip keeps the batch.
  EXPECT_EQ(print_graph(parse_graph(print_graph(g))), print_graph(g));

  const std::string shared = error_of([] {
    parse_graph("input q: bf16[B, M, K]\ninput w: bf16[N, K]\ny = matmul(q, w)\noutput y: bf16\n");
  });
  EXPECT_NE(shared.find("matmul: A 'q' [B, M, K] is batched but B 'w' [N, K] is not"), std::string::npos) << shared;
  EXPECT_NE(shared.find("flatten A's batch into its rows"), std::string::npos) << shared;
  const std::string differ = error_of([] {
    parse_graph("input q: bf16[B, M, K]\ninput k: bf16[H, N, K]\ns = matmul(q, k)\noutput s: bf16\n");
  });
  EXPECT_NE(differ.find("matmul: batch dims differ: A 'q' [B, M, K] and B 'k' [H, N, K]"), std::string::npos) << differ;
  const std::string flat = error_of([] {
    parse_graph("input q: bf16[M, K]\ninput k: bf16[B, N, K]\ns = matmul(q, k)\noutput s: bf16\n");
  });
  EXPECT_NE(flat.find("B 'k' [B, N, K] is batched but A 'q' [M, K] is not"), std::string::npos) << flat;
  const std::string rank4 = error_of([] { parse_graph("input q: bf16[A, B, M, K]\n"); });
  EXPECT_NE(rank4.find("rank 4 is not supported"), std::string::npos) << rank4;
}

// The B2B producer's one-register batch coordinate (params.cuh packed_batch_coord, unpacked for
// each TMA load by unpacked_batch_coord): every head and outer batch below kMaxBatchDim comes back,
// an outer batch of 2^15 or more (the register's top bit) included.
TEST(Batch, PackedBatchCoordinatesRoundTrip) {
  for (const int heads : {1, 3, 16, kMaxBatchDim - 1})
    for (const int outer : {0, 1, 32767, 32768, 40000, kMaxBatchDim - 1})
      for (const int head : {0, heads / 2, heads - 1}) {
        Params p{};
        p.heads = heads;
        const int64_t batch = int64_t{outer} * heads + head;
        if (batch > std::numeric_limits<int>::max()) continue;  // the flat index is an int
        const BatchCoord c = unpacked_batch_coord(packed_batch_coord(p, static_cast<int>(batch)));
        EXPECT_EQ(c.head, head) << heads << " heads, outer " << outer;
        EXPECT_EQ(c.outer, outer) << heads << " heads, outer " << outer;
      }
}

// softmax(q k^T / 8 [masked]) v per batch, by hand in fp64, against run_graph and run_lowered.
TEST(Batch, ExecutorsMatchAHandLoop) {
  const int64_t B = 3, M = 5, N = 7, K = 8, DV = 6;
  const Bindings dims{{"B", B}, {"M", M}, {"N", N}, {"K", K}, {"DV", DV}};
  for (const bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "unmasked");
    const Graph g = parse_graph(attention(causal));
    std::mt19937_64 rng(7);
    const TensorMap in = random_inputs(g, dims, rng);
    const Tensor &q = in.at("q"), &k = in.at("k"), &v = in.at("v");
    ASSERT_EQ(q.shape, (std::vector<int64_t>{B, M, K}));
    Tensor want;
    want.shape = {B, M, DV};
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < M; ++i) {
        std::vector<double> p(static_cast<size_t>(N));
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < N; ++j) {
          double acc = 0;
          for (int64_t c = 0; c < K; ++c) acc += q.data[size_t((b * M + i) * K + c)] * k.data[size_t((b * N + j) * K + c)];
          p[size_t(j)] = causal && j > i ? -INFINITY : acc * 0.125;
          mx = std::max(mx, p[size_t(j)]);
        }
        for (double& x : p) sum += (x = std::exp(x - mx));
        for (int64_t d = 0; d < DV; ++d) {
          double o = 0;
          for (int64_t j = 0; j < N; ++j) o += round_to(DType::BF16, p[size_t(j)] / sum) * v.data[size_t((b * N + j) * DV + d)];
          want.data.push_back(round_to(DType::BF16, o));
        }
      }
    const TensorMap got = run_graph(g, dims, in);
    ASSERT_EQ(got.at("o").shape, want.shape);
    const Comparison c = compare(got.at("o"), want);
    EXPECT_LE(c.rel_l2, 1e-12);
    EXPECT_EQ(c.nonfinite, 0);
    const TensorMap low = run_lowered(g, lower(g), dims, in);
    const Comparison cl = compare(low.at("o"), want);
    EXPECT_LE(cl.rel_l2, 4e-3);  // the lowered F rounds S as the kernel does, with tiled sums
    EXPECT_EQ(cl.nonfinite, 0);
  }
}

// Elementwise ops broadcast over the batch: a row vector [N] is shared, a [B, M, N] residual is
// per batch; reductions run over the last dim.
TEST(Batch, BroadcastingAndReductionsInTheExecutor) {
  const Graph g = parse_graph(R"(input x: f32[B, M, N]
input r: f32[N]
input t: f32[B, M, N]
y = add(mul(x, r), t)
m = max(y)
z = sub(y, m)
output z: f32
)");
  const Bindings dims{{"B", 2}, {"M", 3}, {"N", 4}};
  std::mt19937_64 rng(1);
  const TensorMap in = random_inputs(g, dims, rng);
  const std::vector<Tensor> all = run_graph_all(g, dims, in);
  const Tensor& z = all.at(static_cast<size_t>(g.find("z")));
  ASSERT_EQ(z.shape, (std::vector<int64_t>{2, 3, 4}));
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < 3; ++i) {
      double y[4], mx = -INFINITY;
      for (int64_t j = 0; j < 4; ++j) {
        const size_t e = size_t((b * 3 + i) * 4 + j);
        y[j] = in.at("x").data[e] * in.at("r").data[size_t(j)] + in.at("t").data[e];
        mx = std::max(mx, y[j]);
      }
      for (int64_t j = 0; j < 4; ++j) EXPECT_DOUBLE_EQ(z.data[size_t((b * 3 + i) * 4 + j)], y[j] - mx);
    }
}

TEST(Batch, LoweringCarriesTheBatchAndRefusesWhatNoKernelReads) {
  const Graph g = parse_graph(attention(true));
  const LoweringResult r = lower(g);
  const B2BCandidate* b = one_b2b_kernel(r);
  ASSERT_NE(b, nullptr) << describe(g, r);
  const FusionSpec &f = r.regions.at(0).spec, &e = r.regions.at(1).spec;
  EXPECT_TRUE(f.batched());
  EXPECT_EQ(f.batch, Dim::of("B"));
  EXPECT_EQ(e.batch, Dim::of("B"));
  EXPECT_EQ(f.m, Dim::of("M"));
  EXPECT_EQ(f.n, Dim::of("N"));
  EXPECT_EQ(f.k, Dim::of("K"));
  EXPECT_EQ(e.n, Dim::of("DV"));
  // The spec text round-trips with its batch; an unbatched spec prints none (the JIT keys of
  // unbatched kernels are unchanged).
  EXPECT_NE(print(f).find("k=K, batch=B)"), std::string::npos) << print(f);
  EXPECT_TRUE(parse_spec(print(f)) == f);
  FusionSpec unbatched = f;
  unbatched.batch = Dim{};
  EXPECT_FALSE(parse_spec(print(f)) == unbatched);
  EXPECT_EQ(print(unbatched).find("batch"), std::string::npos);

  // What a batched kernel has no device node for: an [M, N] input shared by the batches, a
  // per-batch column [B, M, 1]. Φ leaves the op outside, saying why in the user's names.
  for (const auto& [decl, why] : {std::pair{"input t: f32[M, N]", "operand 't' of shape [M, N] is not a scalar, a row "
                                                                   "vector [N] or a per-batch tile [B, M, N]"},
                                  std::pair{"input t: f32[B, M, 1]", "operand 't' of shape [B, M, 1]"}}) {
    SCOPED_TRACE(decl);
    const Graph gt = parse_graph(fmt::format("input q: bf16[B, M, K]\ninput k: bf16[B, N, K]\n{}\ns = matmul(q, k)\n"
                                             "y = add(s, t)\noutput y: bf16\n",
                                             decl));
    const LoweringResult rt = lower(gt);
    ASSERT_EQ(rt.fallbacks.size(), 1u) << describe(gt, rt);
    EXPECT_NE(rt.fallbacks[0].reason.find(why), std::string::npos) << rt.fallbacks[0].reason;
  }
  // A per-batch tile and a shared row vector fuse.
  const Graph ok = parse_graph("input q: bf16[B, M, K]\ninput k: bf16[B, N, K]\ninput t: f32[B, M, N]\n"
                               "input bias: f32[N]\ns = matmul(q, k)\ny = add(add(s, t), bias)\noutput y: bf16\n");
  const LoweringResult rok = lower(ok);
  EXPECT_TRUE(rok.fallbacks.empty()) << describe(ok, rok);
}

// The single-GEMM kernels take no batch: the planner refuses it (explain says so), naming the
// operands; the B2B plan counts batch x row blocks x O blocks.
TEST(Batch, PlannerRefusesASingleBatchedGemmAndPlansTheB2bPair) {
  const Graph g = parse_graph("input q: bf16[B, M, K]\ninput k: bf16[B, N, K]\ns = matmul(q, k)\n"
                              "y = gelu(s)\noutput y: bf16\n");
  const LoweringResult r = lower(g);
  ASSERT_EQ(r.regions.size(), 1u);
  const std::string why = error_of([&] {
    make_plan(r.regions[0].spec, problem_of(r.regions[0].spec, {{"B", 4}, {"M", 256}, {"N", 256}, {"K", 64}}));
  });
  EXPECT_NE(why.find("plan: the matmul of 'q' [B, M, K] and 'k' [B, N, K] is batched over B: the single-GEMM "
                     "kernels take no batch dim"),
            std::string::npos)
      << why;

  const Graph a = parse_graph(attention(false));
  const LoweringResult ra = lower(a);
  const FusionSpec &f = ra.regions.at(0).spec, &e = ra.regions.at(1).spec;
  const Bindings dims{{"B", 3}, {"M", 1000}, {"N", 520}, {"K", 64}, {"DV", 64}};
  const B2bProblem p = b2b_problem_of(f, e, dims);
  EXPECT_EQ(p.batches, 3);
  EXPECT_EQ(p.m, 1000);
  PlanOptions unsplit;  // one CTA per two jobs: the grid below counts jobs (the N1 split, pairing: test_b2b.cpp)
  unsplit.b2b_job_rows = 64;
  unsplit.cluster_n = 1;
  const B2bPlan plan = make_b2b_plan(f, e, p, unsplit);
  EXPECT_TRUE(plan.kernel.batched);
  EXPECT_EQ(plan.jobs, 3 * 16);  // 3 batches x ceil(1000 / 64) row blocks x 1 block of O
  EXPECT_EQ(plan.grid_ctas, 24);
  const std::string ex = explain(f, e, plan);
  EXPECT_NE(ex.find("M=1000 K=64 N1=520 N2=64 x 3 batches"), std::string::npos) << ex;
  EXPECT_NE(ex.find("48 job(s) (3 batch(es) x 16 row blocks x 1 block(s) of O) on 24 CTAs"), std::string::npos) << ex;
  // A batched spec binds 3-D tensors even at one batch: the kernel stays batched.
  EXPECT_TRUE(make_b2b_plan(f, e, b2b_problem_of(f, e, {{"B", 1}, {"M", 64}, {"N", 64}, {"K", 64}, {"DV", 64}}))
                  .kernel.batched);
  // Too many jobs for the kernel's 32-bit slots.
  const std::string big = error_of([&] {
    make_b2b_plan(f, e, b2b_problem_of(f, e, {{"B", 1 << 20}, {"M", 1 << 20}, {"N", 64}, {"K", 64}, {"DV", 64}}));
  });
  EXPECT_NE(big.find("numbers them in 32 bits"), std::string::npos) << big;
}

// scheduler/grid.cuh: the grid's slots hold every job exactly once, with or without a causal
// mask, paired or not, at any grid size; with a mask, a CTA holds a row block and its mirror (its
// two warp groups in one round, or paired in two consecutive rounds), and the SMs walk about as
// much as each other.
TEST(Batch, SchedulerSlotsCoverEveryJobOnceAndBalanceCausalWork) {
  for (const bool paired : {false, true})
    for (const bool causal : {false, true})
      for (const auto& [batches, M, N2, ctas] : {std::tuple{1, 1000, 64, 132}, std::tuple{3, 64 * 7, 192, 5},
                                                 std::tuple{5, 64 * 16, 64, 132}, std::tuple{2, 70, 520, 3},
                                                 std::tuple{64, 4096, 128, 132}, std::tuple{3, 128 * 5, 64, 4}}) {
        SCOPED_TRACE(fmt::format("paired {} causal {} batches {} M {} N2 {} ctas {}", paired, causal, batches, M, N2,
                                 ctas));
        B2bConfig c;
        c.online_softmax = causal;
        c.causal = causal;
        c.paired = paired;
        c.tile_n2 = 128;
        const int mb = (M + c.job_rows() - 1) / c.job_rows(), nb = (N2 + 127) / 128;
        std::set<std::tuple<int, int, int>> seen;
        const int slots = b2b_slot_count(c, batches, M, N2, ctas);
        for (int j = 0; j < slots + 2 * ctas; ++j) {
          const B2bJob job = b2b_job(c, j, batches, M, N2, ctas);
          EXPECT_EQ(job.done, j >= slots);
          if (!job.valid) continue;
          EXPECT_GE(job.batch, 0);
          EXPECT_LT(job.batch, batches);
          EXPECT_LT(job.m_block, mb);
          EXPECT_LT(job.n2_block, nb);
          EXPECT_TRUE(seen.insert({job.batch, job.m_block, job.n2_block}).second) << "a job twice at slot " << j;
          // The CTA's other job of the pair: its other warp group's (unpaired), or its previous
          // round's (paired): the mirror block.
          const bool second = paired ? (j / ctas) % 2 == 1 : j % 2 == 1;
          if (causal && second) {
            const B2bJob other = b2b_job(c, paired ? j - ctas : j - 1, batches, M, N2, ctas);
            if (!other.valid) {  // the middle block of an odd count is alone in its pair
              EXPECT_EQ(2 * job.m_block, mb - 1);
              continue;
            }
            EXPECT_EQ(other.m_block + job.m_block, mb - 1);
            EXPECT_EQ(other.batch, job.batch);
          }
        }
        EXPECT_EQ(static_cast<int>(seen.size()), b2b_job_count(c, batches, M, N2));
      }
  // Causal attention over 64 heads of 4096 (the benchmark's): every CTA walks within 5% of the
  // average; unpaired, a CTA's warp groups within 30% of each other (15 or 16 rounds of pairs:
  // with an odd count, the warp group that takes the long block in the last round walks one
  // more long job, which runs beside the partner's next ones: the SM's total is what stays even).
  for (const bool paired : {false, true}) {
    SCOPED_TRACE(fmt::format("paired {}", paired));
    B2bConfig c;
    c.online_softmax = c.causal = true;
    c.paired = paired;
    const int ctas = b2b_grid(c, 64, 4096, 128, 132), slots = b2b_slot_count(c, 64, 4096, 128, ctas);
    std::vector<double> wg(2 * static_cast<size_t>(ctas), 0.0);
    for (int j = 0; j < slots; ++j)
      if (const B2bJob job = b2b_job(c, j, 64, 4096, 128, ctas); job.valid) {
        const double chunks = b2b_chunks(c, job.m_block, 4096, 4096) * c.wgs_per_job();
        if (paired) wg[2 * static_cast<size_t>(j % ctas)] += chunks;  // both warp groups: the CTA's total
        else wg[static_cast<size_t>(j % (2 * ctas))] += chunks;
      }
    double total = 0, busiest = 0;
    for (int k = 0; k < ctas; ++k) {
      const double a = wg[2 * size_t(k)], b = wg[2 * size_t(k) + 1];
      total += a + b;
      busiest = std::max(busiest, a + b);
      if (!paired) {
        EXPECT_LE(std::max(a, b), 1.3 * std::min(a, b)) << "CTA " << k;
      }
    }
    EXPECT_LE(busiest, 1.05 * total / ctas);
  }
}

class BatchCompile : public ::testing::Test {
 protected:
  void SetUp() override {
    cache_ = std::filesystem::temp_directory_path() / ("comfuse-batch-test-" + std::to_string(::getpid()));
    opt_.jit.cache_dir = cache_;
  }
  void TearDown() override { std::filesystem::remove_all(cache_); }
  std::filesystem::path cache_;
  CompileOptions opt_;
};

// Ψ writes `.batched = true`, and NVRTC compiles the batched kernels (3-D TMA loads and stores)
// without serialized wgmmas: bf16 causal at d 64, f16 unmasked at d 128.
TEST_F(BatchCompile, BatchedAttentionCompiles) {
  for (const auto& [causal, dtype, d] : {std::tuple{true, "bf16", 64}, std::tuple{false, "f16", 128}}) {
    SCOPED_TRACE(fmt::format("{} {} d {}", causal ? "causal" : "unmasked", dtype, d));
    const Graph g = parse_graph(attention(causal, dtype));
    const LoweringResult r = lower(g);
    ASSERT_NE(one_b2b_kernel(r), nullptr) << describe(g, r);
    const FusionSpec &f = r.regions.at(0).spec, &e = r.regions.at(1).spec;
    const B2bProblem p = b2b_problem_of(f, e, {{"B", 3}, {"M", 1000}, {"N", 1032}, {"K", d}, {"DV", d}});
    const B2bPlan plan = make_b2b_plan(f, e, p);
    const std::string src = emit_b2b(f, e, plan).source;
    EXPECT_NE(src.find(".batched = true"), std::string::npos) << src;
    const CompiledKernel c = compile_only_b2b(f, e, p, opt_);
    EXPECT_TRUE(is_cubin_elf(c.cubin));
    EXPECT_FALSE(c.wgmma_serialized) << c.log;
  }
}

}  // namespace
}  // namespace comfuse
