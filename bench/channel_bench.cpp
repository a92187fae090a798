// Latency of one round of the cross-CTA row all-reduce channels (kernels/comfuse/cluster/): the
// DSMEM channel, peer-to-peer vs leader-follower, at C_N 2..16, and the L2 exchange among row
// groups of G clusters, for 64 and 128 rows per warp group (one fp32 per row). The probe
// (kernels/comfuse/debug/channel_probe.cuh) runs a chain of R dependent rounds in one launch on
// as many clusters as fit, each CTA on a whole SM: us per round = (time of R rounds - time of
// 0 rounds) / R, the median of 5. The calibration of the planner (src/plan/calibration.h) comes
// from this table. Correctness of the same probe: tests/gpu/test_gpu_channels.cpp.
//   channel_bench [rounds]     (default 4000)
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <vector>

#include "comfuse/harness.h"
#include "comfuse/runtime.h"

namespace {

using comfuse::ChannelProbe;
using comfuse::Params;

constexpr int kRows[] = {64, 128};
constexpr int kClusters[] = {2, 4, 8, 16};
constexpr int kGroups[] = {2, 4, 8, 16, 32};

std::string instantiations() {
  std::string s;
  for (int r : kRows) {
    for (int c : kClusters)
      s += fmt::format("COMFUSE_DSMEM_PROBE({0}, {1}, PeerToPeer) COMFUSE_DSMEM_PROBE({0}, {1}, LeaderFollower)\n", r, c);
    for (int g : kGroups) s += fmt::format("COMFUSE_L2_PROBE({}, {})\n", r, g);
  }
  return s;
}

double us_per_round(const ChannelProbe& probe, const std::string& entry, int cluster, Params& p, int rounds) {
  auto launch = [&](int r) {
    return probe.run(entry, cluster, p, r);
  };
  launch(10);
  std::vector<double> ts;
  for (int i = 0; i < 5; ++i) {
    const ChannelProbe::Result full = launch(rounds);
    if (full.errors) throw comfuse::Error(fmt::format("{}: {} rows differ from the exact sum", entry, full.errors));
    ts.push_back((full.ms - launch(0).ms) * 1e3 / rounds);  // the launch's own cost removed
  }
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string why;
  if (!comfuse::gpu_available(&why)) {
    std::cerr << "channel_bench: no usable sm_90 GPU (" << why << ")\n";
    return 2;
  }
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 4000;
  try {
    ChannelProbe probe(instantiations());
    Params none{};
    std::cout << "| rows | C_N | peer-to-peer us/round | leader-follower us/round | faster |\n|---|---|---|---|---|\n";
    for (int r : kRows)
      for (int c : kClusters) {
        const double p2p = us_per_round(probe, fmt::format("dsmem_{}_{}_PeerToPeer", r, c), c, none, rounds);
        const double lf = us_per_round(probe, fmt::format("dsmem_{}_{}_LeaderFollower", r, c), c, none, rounds);
        std::cout << fmt::format("| {} | {} | {:.3f} | {:.3f} | {} |\n", r, c, p2p, lf, p2p <= lf ? "p2p" : "leader");
      }
    void* ws = nullptr;
    const size_t bytes = size_t(1) << 26;  // >= 132 CTAs x 2 x 2 x 128 rows x 8 bytes
    if (cudaMalloc(&ws, bytes) != cudaSuccess) throw comfuse::Error("allocating the exchange workspace");
    comfuse::init_exchange_workspace(ws, bytes);
    Params p{};
    p.exchange = ws;
    std::cout << "\n| rows | G (row group of clusters of 1) | L2 exchange us/round |\n|---|---|---|\n";
    for (int r : kRows)
      for (int g : kGroups)
        std::cout << fmt::format("| {} | {} | {:.3f} |\n", r, g,
                                 us_per_round(probe, fmt::format("l2_{}_{}", r, g), 1, p, rounds));
    cudaFree(ws);
  } catch (const comfuse::Error& e) {
    std::cerr << "channel_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
