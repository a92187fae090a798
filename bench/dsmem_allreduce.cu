// bench/dsmem_allreduce.cu: latency of one cluster all-reduce round of the epilogue's channel
// (kernels/comfuse/cluster/dsmem.cuh): Rows (64 or 128) fp32 per CTA, one per row, in the
// wgmma row layout of one 128-thread warp group, C_N in {2, 4, 8, 16}, PeerToPeer vs
// LeaderFollower (TMA bulk copies completing on mbarriers). Each CTA occupies a whole SM
// (200 KB dynamic SMEM, as the fused kernel does); the grid holds as many clusters as fit.
// A chain of R dependent rounds (each round's input is the previous result) in one launch:
// latency per round = kernel time / R. The first round's result is checked exactly.
// Also the cross-cluster channel (cluster/global_exchange.cuh, Aggregation::Global): groups of
// G in {2, 4, 8, 16, 32} single-CTA clusters exchanging through L2, one CTA per SM.
// Build: nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr
//        -I third_party/cutlass/include -I kernels bench/dsmem_allreduce.cu -o dsmem_allreduce
#include <comfuse/cluster/dsmem.cuh>
#include <comfuse/cluster/global_exchange.cuh>

#include <algorithm>
#include <cstdio>
#include <vector>

using comfuse::cluster::Aggregation;
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); std::exit(1); } } while (0)

struct Sum {
  static __device__ float identity() { return 0.f; }
  static __device__ float combine(float a, float b) { return a + b; }
};

constexpr int kSmem = 200 * 1024;

// Round 0 checked exactly (integers in fp32: the sum over ranks of row + 1000 rank), then a
// chain of `rounds` dependent rounds (each round's input is the previous result / peers).
template <class Chan, class St>
__device__ void chain_of_rounds(St& st, comfuse::RowGroupSlot const& xs, comfuse::Params const& p, int rank, int peers,
                                int rounds, int* errors, float* sink) {
  int const t = threadIdx.x;
  constexpr int MB = Chan::MBlocks;
  float v[MB][2];
  for (int mi = 0; mi < MB; ++mi)
    for (int h = 0; h < 2; ++h) v[mi][h] = float(comfuse::accum_row(t, mi, h) + 1000 * rank);
  uint32_t round = 0;
  Chan::start(st, round, xs, p, t, 1, v);
  Chan::template finish<Sum>(st, round, xs, p, t, 1, v);
  ++round;
  for (int mi = 0; mi < MB; ++mi)
    for (int h = 0; h < 2; ++h) {
      float want = float(peers * comfuse::accum_row(t, mi, h) + 1000 * peers * (peers - 1) / 2);
      if (v[mi][h] != want) atomicAdd(errors, 1);
    }
  for (int r = 0; r < rounds; ++r, ++round) {
    Chan::start(st, round, xs, p, t, 1, v);
    Chan::template finish<Sum>(st, round, xs, p, t, 1, v);
    for (int mi = 0; mi < MB; ++mi) v[mi][0] *= 1.f / peers, v[mi][1] *= 1.f / peers;
  }
  if (v[0][0] == -1.f) sink[t] = v[0][1];  // keep the chain alive
}

template <int Rows, int CN, Aggregation Mode>
__global__ void __launch_bounds__(128, 1) allreduce_kernel(int rounds, int* errors, float* sink) {
  using Chan = comfuse::cluster::RowAllReduce<Rows, CN, Mode>;
  extern __shared__ __align__(1024) char smem[];
  auto& st = *reinterpret_cast<typename Chan::Storage*>(smem);
  if (threadIdx.x == 0) Chan::init(st);
  cute::cluster_sync();
  chain_of_rounds<Chan>(st, comfuse::RowGroupSlot{}, comfuse::Params{}, int(comfuse::cluster::cluster_rank()), CN, rounds,
                        errors, sink);
  cute::cluster_sync();
}

// The L2 channel: CTA b is rank b % G of row group b / G (CTAs past the last whole group idle).
template <int Rows, int G>
__global__ void __launch_bounds__(128, 1) global_kernel(__grid_constant__ comfuse::Params const p, int rounds, int* errors,
                                                        float* sink) {
  using Chan = comfuse::cluster::GlobalRowAllReduce<Rows, G>;
  if (int(blockIdx.x) >= int(gridDim.x) / G * G) return;
  typename Chan::Storage st;
  comfuse::RowGroupSlot const xs{int(blockIdx.x) / G, int(blockIdx.x) % G};
  chain_of_rounds<Chan>(st, xs, p, xs.rank, G, rounds, errors, sink);
}

// Microseconds per round: launches of `rounds` minus launches of 0 rounds, median of 5.
template <class Launch> static float us_per_round(Launch&& launch, int rounds) {
  launch(10);
  CK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  std::vector<float> ts;
  for (int i = 0; i < 5; ++i) {
    CK(cudaEventRecord(a)); launch(rounds); CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b));
    float ms0; CK(cudaEventElapsedTime(&ms0, a, b));
    CK(cudaEventRecord(a)); launch(0); CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b));
    float ms1; CK(cudaEventElapsedTime(&ms1, a, b));
    ts.push_back((ms0 - ms1) * 1e3f / rounds);  // launch cost removed
  }
  CK(cudaGetLastError());
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

template <int Rows, int G> static float measure_global(int rounds, int* d_err, float* d_sink) {
  auto k = global_kernel<Rows, G>;
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  using Chan = comfuse::cluster::GlobalRowAllReduce<Rows, G>;
  void* ws = nullptr;
  size_t const bytes = size_t(sms) * Chan::kSlotBytes;
  CK(cudaMalloc(&ws, bytes));
  CK(cudaMemset(ws, 0, bytes));
  comfuse::Params p{};
  p.exchange = ws;
  auto launch = [&](int r) {
    ++p.epoch;  // as the runtime does: the tagged words are never cleared
    k<<<sms, 128, kSmem>>>(p, r, d_err, d_sink);
    CK(cudaGetLastError());
  };
  float const us = us_per_round(launch, rounds);
  CK(cudaFree(ws));
  return us;
}

template <int Rows, int G> static void global_row(int rounds, int* d_err, float* d_sink) {
  std::printf("| %d | %d | %.3f |\n", Rows, G, measure_global<Rows, G>(rounds, d_err, d_sink));
}

template <int Rows, int CN, Aggregation Mode>
static float measure(int rounds, int* d_err, float* d_sink, int* clusters_out) {
  auto k = allreduce_kernel<Rows, CN, Mode>;
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  if (CN > 8) CK(cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = CN; attr[0].val.clusterDim.y = 1; attr[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(CN, 1, 1); cfg.blockDim = dim3(128, 1, 1); cfg.dynamicSmemBytes = kSmem;
  cfg.attrs = attr; cfg.numAttrs = 1;
  int clusters = 0;
  CK(cudaOccupancyMaxActiveClusters(&clusters, k, &cfg));
  cfg.gridDim = dim3(CN * clusters, 1, 1);
  *clusters_out = clusters;
  auto launch = [&](int r) { CK(cudaLaunchKernelEx(&cfg, k, r, d_err, d_sink)); };
  return us_per_round(launch, rounds);
}

template <int Rows, int CN> static void row(int rounds, int* d_err, float* d_sink) {
  int cl = 0;
  float p2p = measure<Rows, CN, Aggregation::PeerToPeer>(rounds, d_err, d_sink, &cl);
  float lf = measure<Rows, CN, Aggregation::LeaderFollower>(rounds, d_err, d_sink, &cl);
  std::printf("| %d | %d | %d | %.3f | %.3f | %s |\n", Rows, CN, cl, p2p, lf, p2p <= lf ? "p2p" : "leader");
}

int main() {
  int* d_err; float* d_sink;
  CK(cudaMalloc(&d_err, 4)); CK(cudaMemset(d_err, 0, 4)); CK(cudaMalloc(&d_sink, 512));
  int const rounds = 4000;
  std::printf("| rows (floats/CTA) | C_N | clusters | peer-to-peer us/round | leader-follower us/round | faster |\n");
  std::printf("|---|---|---|---|---|---|\n");
  row<64, 2>(rounds, d_err, d_sink); row<64, 4>(rounds, d_err, d_sink);
  row<64, 8>(rounds, d_err, d_sink); row<64, 16>(rounds, d_err, d_sink);
  row<128, 2>(rounds, d_err, d_sink); row<128, 4>(rounds, d_err, d_sink);
  row<128, 8>(rounds, d_err, d_sink); row<128, 16>(rounds, d_err, d_sink);
  std::printf("\n| rows | G (clusters of 1 in a row group) | global (L2) exchange us/round |\n|---|---|---|\n");
  global_row<64, 2>(rounds, d_err, d_sink); global_row<64, 4>(rounds, d_err, d_sink);
  global_row<64, 8>(rounds, d_err, d_sink); global_row<64, 16>(rounds, d_err, d_sink);
  global_row<64, 32>(rounds, d_err, d_sink); global_row<128, 2>(rounds, d_err, d_sink);
  global_row<128, 4>(rounds, d_err, d_sink); global_row<128, 8>(rounds, d_err, d_sink);
  CK(cudaDeviceSynchronize());
  int err = 0;
  CK(cudaMemcpy(&err, d_err, 4, cudaMemcpyDeviceToHost));
  std::printf("exact check of round 0: %s (%d mismatches)\n", err ? "FAIL" : "PASS", err);
  return err ? 1 : 0;
}
