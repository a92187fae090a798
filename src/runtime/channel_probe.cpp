// ChannelProbe (harness.h): the channel probe kernels, JIT-compiled and launched on as many
// clusters as fit.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include "comfuse/harness.h"
#include "comfuse/jit.h"

namespace comfuse {
namespace {
void check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) throw Error(fmt::format("{}: {}", what, cudaGetErrorString(e)));
}
constexpr int kProbeSmem = 200 * 1024;  // each CTA takes a whole SM, as the fused kernel does
}  // namespace

struct ChannelProbe::State {
  cudaLibrary_t lib = nullptr;
  int* errors = nullptr;
  cudaEvent_t a = nullptr, b = nullptr;
};

ChannelProbe::ChannelProbe(const std::string& instantiations) : st_(new State) {
  const std::string src = "#include \"comfuse/debug/channel_probe.cuh\"\n" + instantiations + "\n";
  const CompiledKernel k = jit_compile(KernelSource{"channel_probe", src, "", {}});
  check(cudaLibraryLoadData(&st_->lib, k.cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0), "loading the probe");
  check(cudaMalloc(&st_->errors, sizeof(int)), "cudaMalloc");
  check(cudaEventCreate(&st_->a), "cudaEventCreate");
  check(cudaEventCreate(&st_->b), "cudaEventCreate");
}

ChannelProbe::~ChannelProbe() {
  if (st_->a) cudaEventDestroy(st_->a);
  if (st_->b) cudaEventDestroy(st_->b);
  if (st_->errors) cudaFree(st_->errors);
  if (st_->lib) cudaLibraryUnload(st_->lib);
  delete st_;
}

ChannelProbe::Result ChannelProbe::run(const std::string& entry, int cluster, const Params& p, int rounds) const {
  cudaKernel_t kernel = nullptr;
  check(cudaLibraryGetKernel(&kernel, st_->lib, entry.c_str()), "finding probe " + entry);
  const void* f = reinterpret_cast<const void*>(kernel);
  check(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, kProbeSmem), "SMEM attribute");
  if (cluster > 8) check(cudaFuncSetAttribute(f, cudaFuncAttributeNonPortableClusterSizeAllowed, 1), "cluster attribute");
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = cluster, attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(cluster), cfg.blockDim = dim3(Sm90::kWarpGroupThreads), cfg.dynamicSmemBytes = kProbeSmem;
  cfg.attrs = &attr, cfg.numAttrs = 1;
  Result r;
  check(cudaOccupancyMaxActiveClusters(&r.clusters, f, &cfg), "cudaOccupancyMaxActiveClusters");
  if (r.clusters < 1) throw Error("probe " + entry + " fits no cluster");
  cfg.gridDim = dim3(cluster * r.clusters);
  check(cudaMemset(st_->errors, 0, sizeof(int)), "cudaMemset");
  Params params = p;
  int* errors = st_->errors;
  void* args[] = {&params, &rounds, &errors};
  check(cudaEventRecord(st_->a), "cudaEventRecord");
  check(cudaLaunchKernelExC(&cfg, f, args), "launching probe " + entry);
  check(cudaEventRecord(st_->b), "cudaEventRecord");
  check(cudaEventSynchronize(st_->b), "probe " + entry);
  float ms = 0;
  check(cudaEventElapsedTime(&ms, st_->a, st_->b), "cudaEventElapsedTime");
  r.ms = ms;
  check(cudaMemcpy(&r.errors, st_->errors, sizeof(int), cudaMemcpyDeviceToHost), "reading the probe's errors");
  return r;
}

}  // namespace comfuse
