// The cross-CTA row all-reduce channels on their own (kernels/comfuse/cluster/): the DSMEM
// channel in both modes at every cluster size, and the L2 exchange at every row-group size,
// for both warp-group row counts. The JIT-compiled probe (kernels/comfuse/debug/
// channel_probe.cuh) runs a chain of dependent rounds (round r + 2 reuses round r's buffer: the
// parity discipline) and checks every row of every CTA against the exact sum.
// bench/channel_bench.cpp times the same probe.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <memory>

#include "comfuse/harness.h"
#include "comfuse/runtime.h"
#include "gpu/gpu_support.h"

namespace comfuse::gpu_test {
namespace {

// The variants checked; the probe kernels live in kernels/comfuse/debug/channel_probe.cuh.
constexpr const char* kProbe = R"(
COMFUSE_DSMEM_PROBE(64, 2, PeerToPeer) COMFUSE_DSMEM_PROBE(64, 4, PeerToPeer) COMFUSE_DSMEM_PROBE(64, 8, PeerToPeer) COMFUSE_DSMEM_PROBE(64, 16, PeerToPeer)
COMFUSE_DSMEM_PROBE(128, 2, PeerToPeer) COMFUSE_DSMEM_PROBE(128, 16, PeerToPeer)
COMFUSE_DSMEM_PROBE(64, 2, LeaderFollower) COMFUSE_DSMEM_PROBE(64, 4, LeaderFollower) COMFUSE_DSMEM_PROBE(64, 8, LeaderFollower) COMFUSE_DSMEM_PROBE(64, 16, LeaderFollower)
COMFUSE_DSMEM_PROBE(128, 4, LeaderFollower)
COMFUSE_L2_PROBE(64, 2) COMFUSE_L2_PROBE(64, 4) COMFUSE_L2_PROBE(64, 8) COMFUSE_L2_PROBE(64, 16) COMFUSE_L2_PROBE(64, 32) COMFUSE_L2_PROBE(128, 2) COMFUSE_L2_PROBE(128, 16)
)";

class GpuChannels : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (!IsSkipped()) probe_ = std::make_unique<ChannelProbe>(kProbe);
  }
  int run(const std::string& entry, int cluster, const Params& p) { return probe_->run(entry, cluster, p, 9).errors; }
  std::unique_ptr<ChannelProbe> probe_;
};

TEST_F(GpuChannels, DsmemBothModesEveryClusterSize) {
  struct V {
    int rows, cn;
    const char* mode;
  };
  for (V v : {V{64, 2, "PeerToPeer"}, V{64, 4, "PeerToPeer"}, V{64, 8, "PeerToPeer"}, V{64, 16, "PeerToPeer"},
              V{128, 2, "PeerToPeer"}, V{128, 16, "PeerToPeer"}, V{64, 2, "LeaderFollower"},
              V{64, 4, "LeaderFollower"}, V{64, 8, "LeaderFollower"}, V{64, 16, "LeaderFollower"},
              V{128, 4, "LeaderFollower"}}) {
    const std::string entry = fmt::format("dsmem_{}_{}_{}", v.rows, v.cn, v.mode);
    EXPECT_EQ(run(entry, v.cn, Params{}), 0) << entry;
  }
}

// The L2 exchange: its tagged words are never cleared, so consecutive launches reuse them,
// told apart by the launch counter the kernels keep in the workspace (no host involvement, as
// in a CUDA graph replay); the workspace is one slot per row group of the grid.
TEST_F(GpuChannels, L2ExchangeEveryRowGroupAcrossLaunches) {
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  void* ws = nullptr;
  // The header, then sms / G slots of 2 x G x 2 x rows words.
  const size_t bytes = kExchangeHeaderBytes + size_t(sms) * 2 * 2 * 128 * 8;
  ASSERT_EQ(cudaMalloc(&ws, bytes), cudaSuccess);
  init_exchange_workspace(ws, bytes);
  Params p{};
  p.exchange = ws;
  auto epoch = [&] {
    ExchangeHeader h{};
    EXPECT_EQ(cudaMemcpy(&h, ws, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(h.retired, 0u);
    return h.epoch;
  };
  unsigned launches = 0;
  for (auto [rows, g] : {std::pair{64, 2}, {64, 4}, {64, 8}, {64, 16}, {64, 32}, {128, 2}, {128, 16}})
    for (int launch = 0; launch < 3; ++launch, ++launches) {
      const std::string entry = fmt::format("l2_{}_{}", rows, g);
      EXPECT_EQ(run(entry, 1, p), 0) << entry << " launch " << launch;
    }
  EXPECT_EQ(epoch(), launches);
  // Across the wrap of the tags' epoch bits (65535 launches): the last launch before it zeroes
  // the slots, so the words of 65535 launches ago cannot pass for the next launch's.
  const unsigned near_wrap = 2 * 65535 - 2;
  ASSERT_EQ(cudaMemcpy(ws, &near_wrap, sizeof near_wrap, cudaMemcpyHostToDevice), cudaSuccess);
  for (int launch = 0; launch < 4; ++launch) EXPECT_EQ(run("l2_64_8", 1, p), 0) << "launch " << launch << " at the wrap";
  EXPECT_EQ(epoch(), near_wrap + 4);
  cudaFree(ws);
}

}  // namespace
}  // namespace comfuse::gpu_test
