#pragma once
// The timing side of run_and_check (device_run.cpp): the cuBLAS floor a fused kernel is
// measured against, and GPU-only timing of a batch of launches.
#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <string>

#include "comfuse/harness.h"
#include "comfuse/runtime.h"

namespace comfuse::runtime_detail {

// C = A x B^T (B N x K) or A x B (B K x N), row-major, output in the A/B dtype, fp32
// accumulate: the GEMM of the fused kernel alone. Through cublasLt: the heuristic's top
// candidates are each timed once at construction and the fastest is kept (what a tuned
// library call, e.g. torch.matmul, reaches; cublasGemmEx's default pick was up to 1.45x
// slower at M = 256, bench/NOTES.md).
class CublasBaseline {
 public:
  CublasBaseline(const FusionSpec& s, const RunArgs& args);
  ~CublasBaseline();
  CublasBaseline(const CublasBaseline&) = delete;
  CublasBaseline& operator=(const CublasBaseline&) = delete;
  void run();
  const std::string& algo() const { return algo_; }

 private:
  struct State;
  std::unique_ptr<State> st_;
  std::string algo_;
};

// GPU time of one launch of f, averaged over `reps` back-to-back launches. A large memset
// is queued first so the GPU is busy while the host enqueues the batch: host-side launch
// cost (descriptor encoding, validation) is not counted, only what the GPU spends.
double batch_ms(const std::function<void()>& f, int reps);

}  // namespace comfuse::runtime_detail
