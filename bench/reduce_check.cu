// bench/reduce_check.cu: correctness harness (+ timing) of the fused GEMM with cluster row
// reductions in the epilogue (issue 4): hand-written nested Stage epilogues in the code
// generator's encoding (LayerNorm, RMSNorm, Softmax, a 4-reduction chain), ragged M and N,
// large-offset inputs, both aggregation modes forced; CPU fp64 reference (GEMM of the same
// bf16 inputs + epilogue), NaN-poisoned outputs with a guard region. Then (unless --check-only)
// LayerNorm / RMSNorm / Softmax timings vs cuBLAS GEMM alone in the same process.
// Build: nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr
//        -Xcompiler -fopenmp -I third_party/cutlass/include -I kernels bench/reduce_check.cu -lcublas -lgomp
#include <comfuse/kernel/fused_gemm_sm90.cuh>
#include <comfuse/host/launch.hpp>

#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

using bf16 = cutlass::bfloat16_t;
namespace ce = comfuse::epi;
using comfuse::cluster::Aggregation;
using comfuse::host::DType;

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); std::exit(1); } } while (0)

// ---- epilogues (the generator's encoding) ------------------------------------------------
// Runtime args: scalars[0] = alpha; vectors[0] = bias, [1] = gamma, [2] = beta (bf16, length N).
struct Eps { static constexpr float value = 1e-5f; };
using EpiLayerNorm = ce::Stage<
    ce::AccEntry, ce::ScalarArg<0>, ce::Compute<ce::Mul, 0, 1>, ce::RowBroadcast<0, bf16>, ce::Compute<ce::Add, 2, 3>,
    ce::Reduction<ce::ReduceMean, 4, ce::Stage<
        ce::Stat, ce::Bypass<4>, ce::Compute<ce::Sub, 1, 0>, ce::Compute<ce::Square, 2>,
        ce::Reduction<ce::ReduceMean, 3, ce::Stage<
            ce::Stat, ce::Bypass<2>, ce::ScalarLiteral<Eps>, ce::Compute<ce::Add, 0, 2>, ce::Compute<ce::Rsqrt, 3>,
            ce::Compute<ce::Mul, 1, 4>, ce::RowBroadcast<1, bf16>, ce::Compute<ce::Mul, 5, 6>,
            ce::RowBroadcast<2, bf16>, ce::Compute<ce::Add, 7, 8>, ce::Store<0, bf16, 9>>>>>>;
// RMSNorm: x = alpha * acc; out = x * rsqrt(mean(x^2) + eps) * gamma.
using EpiRmsNorm = ce::Stage<
    ce::AccEntry, ce::ScalarArg<0>, ce::Compute<ce::Mul, 0, 1>, ce::Compute<ce::Square, 2>,
    ce::Reduction<ce::ReduceMean, 3, ce::Stage<
        ce::Stat, ce::Bypass<2>, ce::ScalarLiteral<Eps>, ce::Compute<ce::Add, 0, 2>, ce::Compute<ce::Rsqrt, 3>,
        ce::Compute<ce::Mul, 1, 4>, ce::RowBroadcast<1, bf16>, ce::Compute<ce::Mul, 5, 6>, ce::Store<0, bf16, 7>>>>;
// Softmax(alpha * acc + bias): max, then sum of exp.
using EpiSoftmax = ce::Stage<
    ce::AccEntry, ce::ScalarArg<0>, ce::Compute<ce::Mul, 0, 1>, ce::RowBroadcast<0, bf16>, ce::Compute<ce::Add, 2, 3>,
    ce::Reduction<ce::ReduceMax, 4, ce::Stage<
        ce::Stat, ce::Bypass<4>, ce::Compute<ce::Sub, 1, 0>, ce::Compute<ce::Exp, 2>,
        ce::Reduction<ce::ReduceSum, 3, ce::Stage<
            ce::Stat, ce::Bypass<3>, ce::Compute<ce::Reciprocal, 0>, ce::Compute<ce::Mul, 1, 2>, ce::Store<0, bf16, 3>>>>>>;
// 4 reductions: p = softmax(x) -> out0; mu = mean(p); q = p - mu; mn = min(q); out1 = (q - mn) / mu
// (mu carried down as a per-row Bypass).
using EpiChain4 = ce::Stage<
    ce::AccEntry, ce::ScalarArg<0>, ce::Compute<ce::Mul, 0, 1>, ce::RowBroadcast<0, bf16>, ce::Compute<ce::Add, 2, 3>,
    ce::Reduction<ce::ReduceMax, 4, ce::Stage<
        ce::Stat, ce::Bypass<4>, ce::Compute<ce::Sub, 1, 0>, ce::Compute<ce::Exp, 2>,
        ce::Reduction<ce::ReduceSum, 3, ce::Stage<
            ce::Stat, ce::Bypass<3>, ce::Compute<ce::Div, 1, 0>, ce::Store<0, bf16, 2>,
            ce::Reduction<ce::ReduceMean, 2, ce::Stage<
                ce::Stat, ce::Bypass<2>, ce::Compute<ce::Sub, 1, 0>,
                ce::Reduction<ce::ReduceMin, 2, ce::Stage<
                    ce::Stat, ce::Bypass<2>, ce::Bypass<0>, ce::Compute<ce::Sub, 1, 0>, ce::Compute<ce::Div, 3, 2>,
                    ce::Store<1, bf16, 4>>>>>>>>>>;

using EpiPlain = ce::Stage<ce::AccEntry, ce::Store<0, bf16, 0>>;  // the mainloop alone, for attribution

enum class Epi { LayerNorm, RmsNorm, Softmax, Chain4, Plain };
static char const* epi_name(Epi e) {
  return e == Epi::LayerNorm ? "layernorm" : e == Epi::RmsNorm ? "rmsnorm" : e == Epi::Softmax ? "softmax"
       : e == Epi::Chain4 ? "chain4" : "plain";
}

struct Variant {
  std::string name;
  comfuse::host::KernelShape ks;
  void const* func;
  Epi epi;
  int max_clusters = 0;
  int max_reduce_n = 0;  // K::kMaxReduceN: the cluster must span the row
  void* stash = nullptr;  // global stash workspace (ks.stash_bytes_per_cta > 0)
  int round_below = 0;    // bf16 stash: columns < this (tiles 0..T-2) pass the stash rounded to bf16
};

// NT > 1: the Stash (NT N-tiles per job, stash type ST).
template <int BM, int BN, int S, int CN, int WG, class E, Aggregation Agg, int NT = 1, class ST = bf16>
Variant make_variant(Epi e) {
  using K = comfuse::FusedGemmSm90<comfuse::MainloopSm90<bf16, true, BM, BN, S, CN, WG>, E, Agg, NT, ST>;
  Variant v;
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s %s%dx%d s%d c%d %s", epi_name(e), WG == 2 ? "coop " : "pp ", BM, BN, S, CN,
                K::Geo::Agg == Aggregation::PeerToPeer ? "p2p" : "leader");
  v.name = buf;
  if (NT > 1)
    v.name += " T" + std::to_string(NT) + (sizeof(ST) == 4 ? " f32" : " bf16") +
              (K::kStashInSmem ? "-smem" : "-gmem") + " " + std::to_string(K::kSmemBytes / 1024) + "K";
  v.ks.n_tiles = NT;
  if (NT > 1 && sizeof(ST) == 2) v.round_below = (NT - 1) * CN * BN;
  v.ks.stash_bytes_per_cta = K::kStashGlobalBytesPerCta;
  v.ks.BM = BM; v.ks.BN = BN; v.ks.wgs_per_tile = WG; v.ks.cluster_n = CN; v.ks.smem_bytes = K::kSmemBytes;
  v.func = reinterpret_cast<void const*>(&comfuse::fused_gemm_sm90<K>);
  v.epi = e;
  v.max_reduce_n = K::kMaxReduceN;
  return v;
}

// ---- host data -------------------------------------------------------------------------------
static float bf(float x) { return float(bf16(x)); }
static uint32_t hash(uint32_t i, uint32_t seed) {
  uint32_t h = i * 2654435761u ^ (seed * 0x9E3779B9u);
  h ^= h >> 16; h *= 0x7feb352du; h ^= h >> 15; h *= 0x846ca68bu; h ^= h >> 16;
  return h;
}
static float uni(uint32_t i, uint32_t seed) { return float(hash(i, seed) >> 8) * (1.f / 16777216.f) * 2.f - 1.f; }

struct Problem {
  int M, N, K;
  float alpha = 0.5f, offset = 0.f;
  std::vector<float> A, B, bias, gamma, beta;  // bf16-exact values
  void *dA, *dB, *dbias, *dgamma, *dbeta, *dout[2];
  size_t out_elems;
};
// The cuBLAS GEMM alone (bf16 out into C, B as N x K): the floor the fused variants are timed
// against (cublasGemmEx's default algorithm; src/runtime/baseline.cpp's cublasLt pick is faster
// at small M, see bench/NOTES.md).
static void cublas_gemm(cublasHandle_t h, Problem const& P, void* C) {
  float const one = 1.f, zero = 0.f;
  cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, P.N, P.M, P.K, &one, P.dB, CUDA_R_16BF, P.K, P.dA, CUDA_R_16BF, P.K, &zero,
               C, CUDA_R_16BF, P.N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

static void* upload_bf16(std::vector<float> const& v) {
  std::vector<bf16> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = bf16(v[i]);
  void* d;
  CK(cudaMalloc(&d, h.size() * 2));
  CK(cudaMemcpy(d, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
  return d;
}
static Problem make_problem(int M, int N, int K, float offset, uint32_t seed) {
  Problem P;
  P.M = M; P.N = N; P.K = K; P.offset = offset;
  P.A.resize(size_t(M) * K); P.B.resize(size_t(N) * K);
  float const bs = 2.f / std::sqrt(float(K));
#pragma omp parallel for
  for (long i = 0; i < long(P.A.size()); ++i) P.A[i] = bf(uni(uint32_t(i), seed));
#pragma omp parallel for
  for (long i = 0; i < long(P.B.size()); ++i) P.B[i] = bf(bs * uni(uint32_t(i), seed + 1));
  for (int n = 0; n < N; ++n) {
    P.bias.push_back(bf(offset + 0.5f * uni(n, seed + 2) * (offset > 0 ? 16.f : 1.f)));
    P.gamma.push_back(bf(1.f + 0.5f * uni(n, seed + 3)));
    P.beta.push_back(bf(0.5f * uni(n, seed + 4)));
  }
  P.dA = upload_bf16(P.A); P.dB = upload_bf16(P.B);
  P.dbias = upload_bf16(P.bias); P.dgamma = upload_bf16(P.gamma); P.dbeta = upload_bf16(P.beta);
  P.out_elems = size_t(M) * N;
  for (auto& o : P.dout) CK(cudaMalloc(&o, (P.out_elems + 4096) * 2));
  return P;
}
static void free_problem(Problem& P) {
  for (void* p : {P.dA, P.dB, P.dbias, P.dgamma, P.dbeta, P.dout[0], P.dout[1]}) cudaFree(p);
}

// fp64 reference of one row: outputs (1 or 2 rows of N). round_below: a bf16 Stash rounds the
// tile value each stage bypasses to the next (after the stage's reduction read it in fp32) in
// columns < round_below (the job's tiles 0..T-2; the last tile stays in fp32 registers).
static void ref_row(Problem const& P, Epi e, int m, std::vector<double>& o0, std::vector<double>& o1,
                    int round_below = 0) {
  int const N = P.N, K = P.K;
  auto R = [&](int n, double v) { return n < round_below ? double(bf(float(v))) : v; };
  std::vector<double> x(N);
  for (int n = 0; n < N; ++n) {
    double acc = 0;
    float const* a = &P.A[size_t(m) * K];
    float const* b = &P.B[size_t(n) * K];
    for (int k = 0; k < K; ++k) acc += double(a[k]) * double(b[k]);
    x[n] = e == Epi::Plain ? acc : double(P.alpha) * acc + (e == Epi::RmsNorm ? 0.0 : double(P.bias[n]));
  }
  o0.assign(N, 0); o1.assign(N, 0);
  double const eps = double(Eps::value);
  if (e == Epi::Plain) {
    o0 = x;
  } else if (e == Epi::LayerNorm) {
    double mean = 0, var = 0;
    for (double v : x) mean += v;
    mean /= N;
    for (int n = 0; n < N; ++n) var += (R(n, x[n]) - mean) * (R(n, x[n]) - mean);
    var /= N;
    for (int n = 0; n < N; ++n) o0[n] = R(n, R(n, x[n]) - mean) / std::sqrt(var + eps) * P.gamma[n] + P.beta[n];
  } else if (e == Epi::RmsNorm) {
    double ms = 0;
    for (double v : x) ms += v * v;
    ms /= N;
    for (int n = 0; n < N; ++n) o0[n] = R(n, x[n]) / std::sqrt(ms + eps) * P.gamma[n];
  } else {
    double mx = -INFINITY, s = 0;
    for (double v : x) mx = std::max(mx, v);
    for (int n = 0; n < N; ++n) s += (o0[n] = std::exp(R(n, x[n]) - mx));
    for (int n = 0; n < N; ++n) o0[n] = R(n, o0[n]) / s;
    if (e == Epi::Chain4) {
      double mu = 0, mn = INFINITY;
      for (double v : o0) mu += v;
      mu /= N;
      for (int n = 0; n < N; ++n) mn = std::min(mn, R(n, o0[n]) - mu);
      for (int n = 0; n < N; ++n) o1[n] = (R(n, R(n, o0[n]) - mu) - mn) / mu;
    }
  }
}

static float bf16_bits_to_float(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Launch once on poisoned outputs, check `rows` (all when empty) against the fp64 reference.
// A variant's launch parameters on problem P: operands, every output its epilogue writes, the
// epilogue's vectors (bias, gamma, beta) and alpha, its stash workspace.
static comfuse::Params make_params(Variant const& v, Problem const& P) {
  comfuse::Params p{};
  p.raster_group = 8;
  comfuse::host::set_operands(p, v.ks, DType::BF16, P.dA, P.K, P.dB, P.K, P.M, P.N, P.K);
  int const nout = v.epi == Epi::Chain4 ? 2 : 1;
  for (int o = 0; o < nout; ++o) comfuse::host::set_output(p, v.ks, o, DType::BF16, P.dout[o], P.N);
  p.vectors[0] = P.dbias; p.vectors[1] = P.dgamma; p.vectors[2] = P.dbeta;
  p.scalars[0] = P.alpha;
  p.stash = v.stash;
  return p;
}

static bool check(Variant& v, Problem& P, std::vector<int> rows, char const* tag) {
  if (P.N > v.max_reduce_n) {
    std::printf("  SKIP %s: N = %d > C_N * BN = %d (row reductions need the cluster to span the row)\n",
                v.name.c_str(), P.N, v.max_reduce_n);
    return false;
  }
  if (!v.max_clusters) v.max_clusters = comfuse::host::prepare(v.func, v.ks);
  if (v.ks.stash_bytes_per_cta > 0 && !v.stash) CK(cudaMalloc(&v.stash, comfuse::host::stash_workspace_bytes(v.ks, v.max_clusters)));
  int const nout = v.epi == Epi::Chain4 ? 2 : 1;
  for (int o = 0; o < 2; ++o) CK(cudaMemset(P.dout[o], 0xFF, (P.out_elems + 4096) * 2));
  comfuse::host::launch(v.func, v.ks, make_params(v, P), 0, v.max_clusters);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  if (rows.empty())
    for (int m = 0; m < P.M; ++m) rows.push_back(m);
  bool ok = true;
  for (int o = 0; o < nout; ++o) {
    std::vector<uint16_t> h(P.out_elems + 4096);
    CK(cudaMemcpy(h.data(), P.dout[o], h.size() * 2, cudaMemcpyDeviceToHost));
    bool guard_ok = std::all_of(h.begin() + P.out_elems, h.end(), [](uint16_t b) { return b == 0xFFFF; });
    double se = 0, sr = 0, maxerr = 0;
    long bad = 0, nonfinite = 0;
#pragma omp parallel for reduction(+ : se, sr, bad, nonfinite) reduction(max : maxerr)
    for (long ri = 0; ri < long(rows.size()); ++ri) {
      int m = rows[ri];
      std::vector<double> r0, r1;
      ref_row(P, v.epi, m, r0, r1, v.round_below);
      std::vector<double> const& r = o ? r1 : r0;
      double rmax = 0;
      for (double x : r) rmax = std::max(rmax, std::fabs(x));
      for (int n = 0; n < P.N; ++n) {
        float g = bf16_bits_to_float(h[size_t(m) * P.N + n]);
        if (!std::isfinite(g)) { ++nonfinite; continue; }
        double err = std::fabs(double(g) - r[n]);
        se += err * err; sr += r[n] * r[n];
        maxerr = std::max(maxerr, err / (rmax + 1e-30));
        if (err > 8e-3 * std::fabs(r[n]) + 2e-3 * rmax) ++bad;
      }
    }
    double rel = std::sqrt(se / std::max(sr, 1e-300));
    bool pass = guard_ok && nonfinite == 0 && bad == 0 && rel < 5e-3;
    ok &= pass;
    std::printf("  %-4s %-34s %-10s out%d M=%d N=%d K=%d rows=%zu: rel_l2 %.2e, max_err/rowmax %.2e, out-of-tol %ld, "
                "nonfinite %ld, guard %s\n",
                pass ? "PASS" : "FAIL", v.name.c_str(), tag, o, P.M, P.N, P.K, rows.size(), rel, maxerr, bad, nonfinite,
                guard_ok ? "ok" : "WRITTEN");
  }
  return ok;
}

// One correctness case: a fresh problem (`note` describes it), each variant checked on `rows`
// (empty: every row) against the fp64 reference.
static void check_case(int& fails, int M, int N, int K, float offset, uint32_t seed, char const* note, char const* tag,
                       std::vector<Variant> vs, std::vector<int> const& rows = {}) {
  Problem P = make_problem(M, N, K, offset, seed);
  std::printf("M=%d N=%d K=%d%s:\n", M, N, K, note);
  for (auto& v : vs) fails += !check(v, P, rows, tag);
  free_problem(P);
}

// ---- timing ----------------------------------------------------------------------------------
// Rows a timing-shape run checks: tile edges and ten hashed rows.
static std::vector<int> timing_rows(int M) {
  std::vector<int> rows = {0, 1, 63, 64, 127, M - 1};
  for (int i = 0; i < 10; ++i) rows.push_back(int(hash(i, 99) % uint32_t(M)));
  return rows;
}

template <class F> static float median_ms(F&& f, int reps = 20) {
  for (int i = 0; i < 3; ++i) f();
  CK(cudaDeviceSynchronize());
  std::vector<float> t;
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(a)); f(); CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b));
    float ms; CK(cudaEventElapsedTime(&ms, a, b)); t.push_back(ms);
  }
  CK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// ---- the cases -------------------------------------------------------------------------------
static void run_checks(int& fails, bool small_only) {
  constexpr Aggregation kP = Aggregation::PeerToPeer, kL = Aggregation::LeaderFollower;
  // Ragged M and N, cluster 4 x BN 256 covers N = 1000; bias offset 2048 (mean >> std).
  {
    Problem P = make_problem(1000, 1000, 256, 2048.f, 1);
    std::printf("M=1000 N=1000 K=256, bias offset 2048:\n");
    std::vector<Variant> vs = {
        make_variant<64, 256, 4, 4, 1, EpiLayerNorm, kP>(Epi::LayerNorm),
        make_variant<64, 256, 4, 4, 1, EpiLayerNorm, kL>(Epi::LayerNorm),
#ifndef RC_QUICK
        make_variant<64, 256, 4, 4, 1, EpiRmsNorm, kP>(Epi::RmsNorm),
        make_variant<64, 256, 4, 4, 1, EpiSoftmax, kL>(Epi::Softmax),
        make_variant<64, 256, 4, 4, 1, EpiChain4, kP>(Epi::Chain4),
        make_variant<64, 256, 4, 4, 1, EpiChain4, kL>(Epi::Chain4),
        make_variant<128, 256, 3, 4, 2, EpiLayerNorm, kP>(Epi::LayerNorm),
        make_variant<128, 128, 4, 8, 1, EpiSoftmax, kP>(Epi::Softmax),
#endif
    };
    for (size_t i = 0; i < vs.size(); ++i)
      if (!small_only || i == 0 || i == 1 || i == 4) fails += !check(vs[i], P, {}, "offset2048");
    free_problem(P);
  }
  if (small_only) return;
#ifndef RC_QUICK
  // cluster 16 (non-portable) covering N = 4000; no offset, both modes
  check_case(fails, 1000, 4000, 256, 0.f, 2, "", "c16",
             {make_variant<64, 256, 4, 16, 1, EpiLayerNorm, kP>(Epi::LayerNorm),
              make_variant<64, 256, 4, 16, 1, EpiLayerNorm, kL>(Epi::LayerNorm)});
  // no cluster (N <= BN): reduce phase = quad shuffles only
  check_case(fails, 300, 200, 128, 100.f, 3, "", "c1", {make_variant<64, 256, 4, 1, 1, EpiChain4, kP>(Epi::Chain4)});
#endif
}

static void run_timings(int& fails) {
#ifndef RC_QUICK
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) { std::printf("cublas init failed\n"); ++fails; return; }
  constexpr Aggregation kA = Aggregation::Auto;
  constexpr Aggregation kL = Aggregation::LeaderFollower;
  std::vector<Variant> vs = {make_variant<64, 256, 4, 16, 1, EpiPlain, kA>(Epi::Plain),
                             make_variant<64, 256, 4, 16, 1, EpiLayerNorm, kA>(Epi::LayerNorm),
                             make_variant<64, 256, 4, 16, 1, EpiLayerNorm, kL>(Epi::LayerNorm),
                             make_variant<64, 256, 4, 16, 1, EpiRmsNorm, kA>(Epi::RmsNorm),
                             make_variant<64, 256, 4, 16, 1, EpiSoftmax, kA>(Epi::Softmax),
                             make_variant<128, 256, 3, 16, 2, EpiPlain, kA>(Epi::Plain),
                             make_variant<128, 256, 3, 16, 2, EpiLayerNorm, kA>(Epi::LayerNorm),
                             make_variant<128, 256, 3, 16, 2, EpiRmsNorm, kA>(Epi::RmsNorm),
                             make_variant<128, 256, 3, 16, 2, EpiSoftmax, kA>(Epi::Softmax)};
  std::printf("\n| M | N | K | cuBLAS GEMM ms | variant | fused ms | fused / cuBLAS |\n|---|---|---|---|---|---|---|\n");
  for (int M : {8192, 256}) {
    int const N = 4096, K = 4096;
    Problem P = make_problem(M, N, K, 1.f, 7);
    void* C;
    CK(cudaMalloc(&C, size_t(M) * N * 2));
    auto gemm = [&] { cublas_gemm(h, P, C); };
    float t_cb = median_ms(gemm);
    std::vector<int> const rows = timing_rows(M);
    for (auto& v : vs) {
      if (!check(v, P, rows, "timing-shape")) { ++fails; continue; }
      comfuse::Params const p = make_params(v, P);
      float t = median_ms([&] { comfuse::host::launch(v.func, v.ks, p, 0, v.max_clusters); });
      float t_cb2 = median_ms(gemm);
      std::printf("| %d | %d | %d | %.4f | %s | %.4f | %.3fx |\n", M, N, K, 0.5f * (t_cb + t_cb2), v.name.c_str(), t,
                  t / (0.5f * (t_cb + t_cb2)));
    }
    cudaFree(C);
    free_problem(P);
  }
  cublasDestroy(h);
#else
  (void)fails;
#endif
}

#ifndef RC_NO_MAIN
int main(int argc, char** argv) {
  bool check_only = argc > 1 && std::string(argv[1]) == "--check-only";
  bool small_only = argc > 1 && std::string(argv[1]) == "--small";  // sanitizer run
  int fails = 0;
  run_checks(fails, small_only);
  if (!check_only && !small_only) run_timings(fails);
  std::printf("%s: %d failure(s)\n", fails ? "FAILED" : "ALL PASS", fails);
  return fails ? 1 : 0;
}
#endif
