// bench/stash_check.cu: the Stash cases (NTiles > 1: each CTA of a 1 x C_N cluster walks T
// N-tiles of one row block, stashing the bypassed tile value; kernel/fused_gemm_sm90.cuh).
// Reuses reduce_check.cu's epilogues, fp64 reference and NaN-poisoned check. Correctness:
// LayerNorm / Softmax at N = 4096 with C_N = 2 (T = 8) and 4 (T = 4), RMSNorm at N = 32768 with
// C_N = 16 (T = 8), the 4-reduction chain at ragged N = 1480 (C_N = 2, T = 3; C_N = 4 BN 128),
// both aggregation modes, fp32 and bf16 stash, SMEM and global stash. Timing: GEMM + LayerNorm /
// RMSNorm / Softmax at N = K = 4096 vs cuBLAS GEMM alone in alternating rounds.
// Build: nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr
//   -Xcompiler -fopenmp -I third_party/cutlass/include -I kernels bench/stash_check.cu -lcublas -lgomp
// Args: --small (sanitizer: two small cases), --check-only.
#define RC_NO_MAIN
#include "reduce_check.cu"

namespace {
constexpr Aggregation kP = Aggregation::PeerToPeer, kL = Aggregation::LeaderFollower, kA = Aggregation::Auto;

std::vector<int> sample_rows(int M, int step) {
  std::vector<int> r;
  for (int m = 0; m < M; m += step) r.push_back(m);
  for (int m : {1, 63, 64, 127, M - 1}) r.push_back(m);
  return r;
}

void stash_checks(int& fails, bool small) {
  if (small) {  // sanitizer: small M, a global and an SMEM stash
    check_case(fails, 130, 1480, 64, 100.f, 11, " [small]", "stash",
               {make_variant<64, 256, 4, 2, 1, EpiChain4, kP, 3, float>(Epi::Chain4),
                make_variant<64, 128, 4, 4, 1, EpiChain4, kL, 3, bf16>(Epi::Chain4)});
    return;
  }
  check_case(fails, 1000, 4096, 256, 2048.f, 21, ", bias offset 2048", "stash", {
      make_variant<64, 256, 4, 2, 1, EpiLayerNorm, kP, 8, bf16>(Epi::LayerNorm),
      make_variant<64, 256, 4, 2, 1, EpiLayerNorm, kL, 8, float>(Epi::LayerNorm),
      make_variant<64, 256, 4, 4, 1, EpiLayerNorm, kP, 4, float>(Epi::LayerNorm),
      make_variant<64, 256, 3, 8, 1, EpiLayerNorm, kP, 2, bf16>(Epi::LayerNorm),
      make_variant<64, 128, 4, 8, 1, EpiLayerNorm, kL, 4, bf16>(Epi::LayerNorm),
      make_variant<128, 256, 3, 8, 2, EpiLayerNorm, kP, 2, bf16>(Epi::LayerNorm),
      make_variant<64, 256, 4, 2, 1, EpiSoftmax, kP, 8, float>(Epi::Softmax),
      make_variant<64, 256, 4, 4, 1, EpiSoftmax, kL, 4, bf16>(Epi::Softmax),
  });
  check_case(fails, 1000, 1480, 256, 100.f, 22, " (ragged), chain of 4 reductions", "stash", {
      make_variant<64, 256, 4, 2, 1, EpiChain4, kP, 3, float>(Epi::Chain4),
      make_variant<64, 256, 4, 2, 1, EpiChain4, kL, 3, bf16>(Epi::Chain4),
      make_variant<64, 128, 4, 4, 1, EpiChain4, kP, 3, bf16>(Epi::Chain4),
  });
  check_case(fails, 1000, 32768, 256, 0.f, 23, " (every 5th row checked)", "stash",
             {make_variant<64, 256, 4, 16, 1, EpiRmsNorm, kP, 8, bf16>(Epi::RmsNorm)}, sample_rows(1000, 5));
}

float median_of(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void stash_timings(int& fails) {
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) { std::printf("cublas init failed\n"); ++fails; return; }
  std::vector<Variant> vs = {
      make_variant<64, 256, 4, 16, 1, EpiLayerNorm, kA>(Epi::LayerNorm),  // today: one tile, C_N = 16
      make_variant<64, 256, 4, 2, 1, EpiPlain, kA>(Epi::Plain),           // the mainloop alone at C_N = 2
      make_variant<64, 256, 3, 8, 1, EpiPlain, kA>(Epi::Plain),
      make_variant<64, 256, 4, 2, 1, EpiLayerNorm, kA, 8, bf16>(Epi::LayerNorm),
      make_variant<64, 256, 4, 4, 1, EpiLayerNorm, kA, 4, bf16>(Epi::LayerNorm),
      make_variant<64, 256, 3, 8, 1, EpiLayerNorm, kA, 2, bf16>(Epi::LayerNorm),
      make_variant<64, 128, 4, 8, 1, EpiLayerNorm, kA, 4, bf16>(Epi::LayerNorm),
      make_variant<64, 256, 4, 2, 1, EpiLayerNorm, kA, 8, float>(Epi::LayerNorm),
      make_variant<64, 256, 4, 2, 1, EpiRmsNorm, kA, 8, bf16>(Epi::RmsNorm),
      make_variant<64, 256, 4, 4, 1, EpiRmsNorm, kA, 4, bf16>(Epi::RmsNorm),
      make_variant<64, 256, 3, 8, 1, EpiRmsNorm, kA, 2, bf16>(Epi::RmsNorm),
      make_variant<64, 256, 4, 2, 1, EpiSoftmax, kA, 8, bf16>(Epi::Softmax),
      make_variant<64, 256, 4, 4, 1, EpiSoftmax, kA, 4, bf16>(Epi::Softmax),
      make_variant<64, 256, 3, 8, 1, EpiSoftmax, kA, 2, bf16>(Epi::Softmax),
  };
  int const kRounds = 5;
  std::printf("\n| M | variant | fused ms | cuBLAS ms | fused / cuBLAS (median of %d alternating rounds) | vs C_N=16 one-tile |\n"
              "|---|---|---|---|---|---|\n", kRounds);
  for (int M : {8192, 256}) {
    int const N = 4096, K = 4096;
    Problem P = make_problem(M, N, K, 1.f, 7);
    void* C;
    CK(cudaMalloc(&C, size_t(M) * N * 2));
    auto gemm = [&] { cublas_gemm(h, P, C); };
    std::vector<int> const rows = timing_rows(M);
    std::vector<comfuse::Params> ps(vs.size());
    std::vector<char> ok(vs.size());
    for (size_t i = 0; i < vs.size(); ++i) {
      Variant& v = vs[i];
      ok[i] = check(v, P, rows, "timing-shape");
      if (!ok[i]) { ++fails; continue; }
      ps[i] = make_params(v, P);
    }
    median_ms(gemm, 200);  // heat-up: sustained power state
    std::vector<std::vector<float>> t(vs.size()), ratio(vs.size()), rel16(vs.size());
    std::vector<float> tcb;
    for (int r = 0; r < kRounds; ++r) {
      float cb = median_ms(gemm, 10);
      tcb.push_back(cb);
      float t16 = 0;
      for (size_t i = 0; i < vs.size(); ++i) {
        if (!ok[i]) continue;
        float x = median_ms([&] { comfuse::host::launch(vs[i].func, vs[i].ks, ps[i], 0, vs[i].max_clusters); }, 10);
        if (i == 0) t16 = x;
        t[i].push_back(x); ratio[i].push_back(x / cb); rel16[i].push_back(x / t16);
      }
    }
    for (size_t i = 0; i < vs.size(); ++i)
      if (ok[i])
        std::printf("| %d | %s | %.4f | %.4f | %.3fx | %.3fx |\n", M, vs[i].name.c_str(), median_of(t[i]), median_of(tcb),
                    median_of(ratio[i]), median_of(rel16[i]));
    cudaFree(C);
    free_problem(P);
  }
  cublasDestroy(h);
}
}  // namespace

int main(int argc, char** argv) {
  bool check_only = argc > 1 && std::string(argv[1]) == "--check-only";
  bool small_only = argc > 1 && std::string(argv[1]) == "--small";
  int fails = 0;
  stash_checks(fails, small_only);
  if (!check_only && !small_only) stash_timings(fails);
  std::printf("%s: %d failure(s)\n", fails ? "FAILED" : "ALL PASS", fails);
  return fails ? 1 : 0;
}
