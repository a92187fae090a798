// GPU correctness of the B2B kernel family (kernels/comfuse/b2b/): O = F(X W1^T) W2^T with S
// in registers, for elementwise F (an FFN, with vectors and [M, N1] inputs along N1 and an
// epilogue after GEMM2, a residual included), the gated F of SwiGLU / GeGLU (X W1^T and X W3^T)
// and the online softmax (attention, causal too), bf16 and f16, ragged shapes, against the fp64
// graph executor on random inputs; and the same pair as two kernels where the planner falls
// back. The pair is forced (--b2b force): the planner would run most of these shapes as two
// kernels. Skips, saying why, on a machine without an sm_90 GPU.
#include <fmt/format.h>

#include "comfuse/text.h"
#include "gpu/gpu_support.h"

namespace comfuse {
namespace {

using gpu_test::expect_outputs_match;
using GpuB2b = gpu_test::GpuTest;

DeviceRunReport expect_one_b2b_kernel_matches(const std::string& text, const Bindings& d,
                                              CompileOptions opt = {}) {
  const Graph g = parse_graph(text);
  opt.plan.b2b = PlanOptions::B2b::Force;
  DeviceRunReport rep = run_and_check(g, d, /*seed=*/11, opt, /*timing_reps=*/0);
  expect_outputs_match(rep);
  EXPECT_GT(rep.b2b_plan.jobs, 0) << "planned as one B2B kernel";
  return rep;
}

std::string ffn(const char* dtype, const char* act) {
  return fmt::format(R"(
input x: {0}[M, K]
input w1: {0}[N, K]
input b1: {0}[N]
input w2: {0}[D, N]
input b2: {0}[D]
h = matmul(x, w1)
s = cast({1}(add(h, b1)), {0})
y = matmul(s, w2)
z = add(y, b2)
output z: {0}
)",
                     dtype, act);
}

TEST_F(GpuB2b, FeedForwardElementwiseF) {
  struct V {
    const char* dtype;
    const char* act;
    int64_t m, k, n, d;
  };
  for (const V& v : {V{"bf16", "gelu", 1000, 72, 520, 136}, V{"f16", "relu", 333, 256, 1032, 64},
                     V{"bf16", "silu", 300, 128, 1024, 520}, V{"bf16", "gelu", 1, 64, 256, 256}}) {
    SCOPED_TRACE(fmt::format("{} {}: M={} K={} N={} D={}", v.dtype, v.act, v.m, v.k, v.n, v.d));
    expect_one_b2b_kernel_matches(ffn(v.dtype, v.act), {{"M", v.m}, {"K", v.k}, {"N", v.n}, {"D", v.d}});
  }
}

// GEMM2's epilogue may reduce its rows (N2 <= 256): an RMSNorm after the FFN.
TEST_F(GpuB2b, FeedForwardThenRmsNorm) {
  const std::string g = R"(
input x: bf16[M, K]
input w1: bf16[N, K]
input w2: bf16[D, N]
input gamma: bf16[D]
h = matmul(x, w1)
s = cast(relu(h), bf16)
y = matmul(s, w2)
nrm = rms_norm(y, gamma)
output nrm: bf16
)";
  for (int64_t d : {128, 256})
    expect_one_b2b_kernel_matches(g, {{"M", 700}, {"K", 64}, {"N", 520}, {"D", d}});
}

// [M, N] inputs on both sides of S: a per-element f32 scale in F (columns of N1, read per
// chunk) and a residual in GEMM2's epilogue (bf16 or f32, prefetched into L2 while the chunks
// run), over ragged M, N1 and N2.
TEST_F(GpuB2b, FeedForwardWithTileInputsOnBothSides) {
  struct V {
    const char* res;
    int64_t m, k, n, d;
  };
  for (const V& v : {V{"bf16", 1000, 72, 520, 136}, V{"f32", 333, 256, 1032, 64}, V{"bf16", 300, 128, 1024, 256}}) {
    SCOPED_TRACE(fmt::format("{} residual: M={} K={} N={} D={}", v.res, v.m, v.k, v.n, v.d));
    const std::string g = fmt::format(R"(
input x: bf16[M, K]
input w1: bf16[N, K]
input scale: f32[M, N]
input w2: bf16[D, N]
input residual: {}[M, D]
h = matmul(x, w1)
s = cast(mul(gelu(h), scale), bf16)
y = matmul(s, w2)
z = add(y, residual)
output z: bf16
)",
                                      v.res);
    expect_one_b2b_kernel_matches(g, {{"M", v.m}, {"K", v.k}, {"N", v.n}, {"D", v.d}});
  }
}

// Llama's MLP: S = F(X W1^T, X W3^T) with both accumulators of a chunk in registers (W3's
// k-block beside W1's in the ring), SwiGLU and GeGLU, bf16 and f16, ragged M, K, N1 and N2 (N2 past
// 192 columns: GEMM1 runs again per block of O), a bias on O.
std::string gated_ffn(const char* dtype, const char* act) {
  return fmt::format(R"(
input x: {0}[M, K]
input w1: {0}[N, K]
input w3: {0}[N, K]
input w2: {0}[D, N]
input b2: {0}[D]
gate = matmul(x, w1)
up = matmul(x, w3)
s = cast(mul({1}(gate), up), {0})
y = matmul(s, w2)
z = add(y, b2)
output z: {0}
)",
                     dtype, act);
}

TEST_F(GpuB2b, GatedFeedForwardSwiGluAndGeGlu) {
  struct V {
    const char* dtype;
    const char* act;
    int64_t m, k, n, d;
  };
  for (const V& v : {V{"bf16", "silu", 1000, 72, 520, 136}, V{"f16", "silu", 333, 256, 1032, 64},
                     V{"bf16", "gelu", 300, 128, 1024, 520}, V{"f16", "gelu", 77, 64, 264, 200},
                     V{"bf16", "silu", 1, 64, 256, 256}, V{"bf16", "silu", 4100, 136, 1096, 192}}) {
    SCOPED_TRACE(fmt::format("{} {}: M={} K={} N={} D={}", v.dtype, v.act, v.m, v.k, v.n, v.d));
    const DeviceRunReport rep =
        expect_one_b2b_kernel_matches(gated_ffn(v.dtype, v.act), {{"M", v.m}, {"K", v.k}, {"N", v.n}, {"D", v.d}});
    EXPECT_TRUE(rep.b2b_plan.kernel.gated);
  }
}

// Any elementwise F of the two accumulators, the examples/ffn_swiglu.cf shape written inline.
TEST_F(GpuB2b, GatedFeedForwardOtherF) {
  const std::string g = R"(
input x: bf16[M, K]
input w1: bf16[N, K]
input w3: bf16[N, K]
input w2: bf16[D, N]
s = cast(add(mul(sigmoid(matmul(x, w1)), 2), tanh(matmul(x, w3))), bf16)
y = matmul(s, w2)
output y: bf16
)";
  const DeviceRunReport rep = expect_one_b2b_kernel_matches(g, {{"M", 700}, {"K", 192}, {"N", 776}, {"D", 128}});
  EXPECT_TRUE(rep.b2b_plan.kernel.gated);
}

// Where one B2B kernel is not expected to pay (most FFN shapes), compile() builds two kernels:
// GEMM1 + F storing S (owned by the kernel), then GEMM2 + its epilogue; attention's softmax over
// N1 too (a row reduction in the first kernel). --b2b off forces it where auto would fuse.
TEST_F(GpuB2b, TwoKernelsWhereThePairDoesNotPay) {
  struct V {
    std::string text;
    Bindings dims;
  };
  const std::string attention = R"(
input q: bf16[M, K]
input k: bf16[N, K]
input v: bf16[N, DV]
s = matmul(q, k)
p = cast(softmax(mul(s, 0.125)), bf16)
o = matmul(p, v, layout=kn)
output o: bf16
)";
  for (const V& v : {V{ffn("bf16", "gelu"), {{"M", 1000}, {"K", 72}, {"N", 520}, {"D", 136}}},
                     V{ffn("f16", "relu"), {{"M", 2048}, {"K", 256}, {"N", 1032}, {"D", 64}}},
                     V{attention, {{"M", 300}, {"N", 520}, {"K", 64}, {"DV", 64}}}}) {
    SCOPED_TRACE(fmt::format("M={}", v.dims.at("M")));
    CompileOptions opt;
    opt.plan.b2b = PlanOptions::B2b::Off;
    const DeviceRunReport rep = run_and_check(parse_graph(v.text), v.dims, /*seed=*/5, opt, /*timing_reps=*/0);
    expect_outputs_match(rep);
    EXPECT_EQ(rep.kernels, 2);
    EXPECT_EQ(rep.b2b_plan.jobs, 0);
  }
  // Auto at a shape the planner prices as a loss: two kernels, not the pair.
  const DeviceRunReport rep =
      run_and_check(parse_graph(ffn("bf16", "gelu")), {{"M", 4096}, {"K", 512}, {"N", 2048}, {"D", 256}}, 5, {}, 0);
  expect_outputs_match(rep);
  EXPECT_EQ(rep.kernels, 2);
}

TEST_F(GpuB2b, AttentionOnlineSoftmax) {
  const std::string g = R"(
input q: bf16[M, K]
input k: bf16[N, K]
input v: bf16[N, DV]
s = matmul(q, k)
p = cast(softmax(mul(s, 0.125)), bf16)
o = matmul(p, v, layout=kn)
output o: bf16
)";
  for (const Bindings& d : {Bindings{{"M", 300}, {"N", 520}, {"K", 64}, {"DV", 64}},
                            Bindings{{"M", 1000}, {"N", 1032}, {"K", 128}, {"DV", 128}},
                            Bindings{{"M", 64}, {"N", 4096}, {"K", 64}, {"DV", 128}}}) {
    SCOPED_TRACE(fmt::format("M={} N={} K={} DV={}", d.at("M"), d.at("N"), d.at("K"), d.at("DV")));
    expect_one_b2b_kernel_matches(g, d);
  }
}

// Causal attention: the mask before the softmax (top-left aligned, as torch's is_causal). The
// kernel walks, per block of 64 rows, only the chunks of N that reach it (row blocks last-first),
// and the prologue masks the columns of the diagonal chunk. Ragged M and N, M < N (the rows reach
// the first columns only), M > N (the rows past N see every key), DV 64 and 128, bf16 and f16.
TEST_F(GpuB2b, CausalAttentionOnlineSoftmax) {
  for (const char* dtype : {"bf16", "f16"}) {
    const std::string g = fmt::format(R"(
input q: {0}[M, K]
input k: {0}[N, K]
input v: {0}[N, DV]
s = matmul(q, k)
masked = causal_mask(mul(s, 0.125))
p = cast(softmax(masked), {0})
o = matmul(p, v, layout=kn)
output o: {0}
)",
                                      dtype);
    for (const Bindings& d : {Bindings{{"M", 300}, {"N", 520}, {"K", 64}, {"DV", 64}},
                              Bindings{{"M", 1000}, {"N", 1032}, {"K", 128}, {"DV", 128}},
                              Bindings{{"M", 1000}, {"N", 328}, {"K", 64}, {"DV", 128}},
                              Bindings{{"M", 77}, {"N", 4096}, {"K", 64}, {"DV", 64}},
                              Bindings{{"M", 2100}, {"N", 1960}, {"K", 64}, {"DV", 64}}}) {
      SCOPED_TRACE(fmt::format("{} M={} N={} K={} DV={}", dtype, d.at("M"), d.at("N"), d.at("K"), d.at("DV")));
      const DeviceRunReport rep = expect_one_b2b_kernel_matches(g, d);
      EXPECT_TRUE(rep.b2b_plan.kernel.causal);
      EXPECT_TRUE(rep.b2b_plan.kernel.online_softmax);
    }
  }
}

}  // namespace
}  // namespace comfuse
