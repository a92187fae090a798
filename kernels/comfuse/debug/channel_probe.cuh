// comfuse/debug/channel_probe.cuh: a probe of the cross-CTA row all-reduce channels
// (cluster/dsmem.cuh, cluster/global_exchange.cuh) on their own, in the wgmma row layout of one
// 128-thread warp group. Each CTA starts with row + 1000 * rank in every row; round 0 sums over
// the peers; every later round sums the (now equal) values and divides by the peer count, which
// leaves them unchanged: a chain of dependent rounds whose result is exact (integers in fp32,
// peers a power of two) and is checked in every row of every CTA. tests/gpu/test_gpu_channels.cpp
// checks the channels with it, bench/channel_bench.cpp times them. Instantiate with
// COMFUSE_DSMEM_PROBE(rows, cluster_n, mode) and COMFUSE_L2_PROBE(rows, row_group).
#pragma once

#include "../cluster/dsmem.cuh"
#include "../cluster/global_exchange.cuh"

namespace comfuse::probe {

struct Sum {
  static __device__ float identity() { return 0.f; }
  static __device__ float combine(float a, float b) { return a + b; }
};

template <class Chan, class St>
__device__ void rounds_and_check(St& st, comfuse::RowGroupSlot const& xs, comfuse::Params const& p, int rank, int peers,
                                 int rounds, int* errors) {
  int const t = threadIdx.x;
  constexpr int MB = Chan::MBlocks;
  float v[MB][2];
  for (int mi = 0; mi < MB; ++mi)
    for (int h = 0; h < 2; ++h) v[mi][h] = float(comfuse::accum_row(t, mi, h) + 1000 * rank);
  uint32_t round = 0;
  for (int r = 0; r < rounds; ++r, ++round) {
    Chan::start(st, round, xs, p, t, 1, v);
    Chan::template finish<Sum>(st, round, xs, p, t, 1, v);
    if (r > 0)
      for (int mi = 0; mi < MB; ++mi) v[mi][0] *= 1.f / peers, v[mi][1] *= 1.f / peers;
  }
  for (int mi = 0; mi < MB; ++mi)
    for (int h = 0; h < 2; ++h) {
      float const want = float(peers * comfuse::accum_row(t, mi, h) + 1000 * peers * (peers - 1) / 2);
      if (v[mi][h] != want) atomicAdd(errors, 1);
    }
}

template <int Rows, int CN, comfuse::Aggregation Mode>
__device__ void dsmem_probe(int rounds, int* errors) {
  using Chan = comfuse::cluster::RowAllReduce<Rows, CN, Mode>;
  extern __shared__ __align__(1024) char smem[];
  auto& st = *reinterpret_cast<typename Chan::Storage*>(smem);
  if (threadIdx.x == 0) Chan::init(st);
  cute::cluster_sync();
  rounds_and_check<Chan>(st, comfuse::RowGroupSlot{}, comfuse::Params{}, int(comfuse::cluster::cluster_rank()), CN,
                         rounds, errors);
  cute::cluster_sync();
}

// CTA b is rank b % G of row group b / G (CTAs past the last whole group idle). Each CTA is
// one "warp group" of the launch counter, as in the kernels: it reads the epoch first and
// retires last (cluster/global_exchange.cuh).
// Every CTA of the probe rounds at once, as in a one-job-a-CTA plan: the polls pause where such a
// plan's would (calibration.h poll_backoff_wanted).
template <int Rows, int G>
__device__ void l2_probe(comfuse::Params const& p, int rounds, int* errors) {
  using Chan = comfuse::cluster::GlobalRowAllReduce<Rows, G, /*HandsOverPairs=*/false, /*PollBackoff=*/(G >= 16)>;
  uint32_t const epoch = comfuse::cluster::exchange_epoch(p);
  if (int(blockIdx.x) < int(gridDim.x) / G * G) {
    typename Chan::Storage st;
    comfuse::RowGroupSlot const xs{int(blockIdx.x) / G, int(blockIdx.x) % G, epoch};
    rounds_and_check<Chan>(st, xs, p, xs.rank, G, rounds, errors);
  }
  comfuse::cluster::retire_exchange(p, epoch, int(threadIdx.x), 1, gridDim.x);
}

}  // namespace comfuse::probe

// Entries (extern "C", one per variant): (Params p, int rounds, int* errors); the DSMEM probe
// wants a 1-D cluster of C CTAs, the L2 probe clusters of 1 (the exchange workspace in p).

#define COMFUSE_DSMEM_PROBE(R, C, M)                                                        \
  extern "C" __global__ void __launch_bounds__(128, 1)                                      \
      dsmem_##R##_##C##_##M(__grid_constant__ comfuse::Params const p, int rounds, int* errors) { \
    comfuse::probe::dsmem_probe<R, C, comfuse::Aggregation::M>(rounds, errors);             \
  }
#define COMFUSE_L2_PROBE(R, G)                                                              \
  extern "C" __global__ void __launch_bounds__(128, 1)                                      \
      l2_##R##_##G(__grid_constant__ comfuse::Params const p, int rounds, int* errors) {    \
    comfuse::probe::l2_probe<R, G>(p, rounds, errors);                                      \
  }
