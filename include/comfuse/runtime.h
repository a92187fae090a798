#pragma once
// The runtime: a FusionSpec + problem shape -> plan (plan.h) -> CUDA C++ (emit.h) ->
// cubin (jit.h) -> a loaded, launchable kernel. Arguments are bound by their graph
// names and validated (shape, dtype, stride, alignment) with an error naming the
// argument; launches go on the caller's stream with the plan's cluster dims.
//
//   comfuse::Graph g = comfuse::parse_graph_file("examples/gemm_bias_gelu.cf");
//   comfuse::FusedKernel k = comfuse::compile(g, {{"M", 4096}, {"N", 4096}, {"K", 4096}});
//   comfuse::RunArgs args;
//   args.tensors["x"] = {x_dev, comfuse::DType::BF16, {4096, 4096}};
//   ...
//   k.run(args, stream);
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comfuse/emit.h"
#include "comfuse/graph.h"
#include "comfuse/jit.h"
#include "comfuse/plan.h"
#include "comfuse/spec.h"

struct CUstream_st;

namespace comfuse {

using Stream = CUstream_st*;  // a cudaStream_t; nullptr = the legacy default stream

// A device tensor, row-major. `ld` is the row stride in elements (0 = packed rows). A batched
// kernel's matrices come as [B, rows, cols] or [B, H, rows, cols] (the kernel's batch B x H, as
// attention's batch and heads), the last dim contiguous and the others at any strides whose
// elements do not overlap (q, k, v sliced out of one projection; O written as [B, S, H, D]).
struct DeviceTensor {
  void* data = nullptr;
  DType dtype = DType::BF16;
  std::vector<int64_t> shape;
  int64_t ld = 0;            // row stride in elements (0: packed rows)
  int64_t batch_stride = 0;  // a batched tensor: elements between batches (0: packed, rows x ld x H)
  int64_t head_stride = 0;   // a [B, H, rows, cols] tensor: elements between heads (0: rows x ld)
};

// The GPU of the current CUDA device as the planner models it (plan.h Gpu): an H200 as the H200,
// any other sm_90 part (H100 PCIe and NVL, GH200, H800, H20) as the H100 SXM, the Hopper measured
// beside it (the models price 132 SMs; a launch on fewer sizes its grid to the SMs it finds);
// nullopt without a device (a CPU-only build machine plans for the default, the H200). Queries
// the properties once per device ordinal (initialising CUDA if nothing has).
std::optional<Gpu> gpu_of_this_device();
// `o` with its gpu set to this device's where the caller left it unset: every plan the runtime
// makes is for the GPU it runs on.
PlanOptions planned_for_this_device(PlanOptions o);

struct RunArgs {
  std::map<std::string, DeviceTensor> tensors;  // operands, vectors, outputs by graph name
  std::map<std::string, double> scalars;        // runtime scalars ([] inputs) by graph name
};

struct CompileOptions {
  PlanOptions plan;
  JitOptions jit;
  bool trace = false;  // -DCOMFUSE_TRACE: the kernel stamps a per-job timeline (debug/trace.cuh)
};

// True when a CUDA device of compute capability 9.0 is usable by this process.
bool gpu_available(std::string* why_not = nullptr);

// Makes `bytes` of device memory a fresh exchange workspace (the L2 row exchange and split-K;
// scheduler/grid.cuh's exchange_layout sizes it): its ExchangeHeader (config.cuh) and the
// `tagged_bytes` after it (the exchange slots and split-K tags: exchange_layout().tagged_bytes)
// zeroed. Once, when it is allocated: the kernels keep it valid from launch to launch, CUDA
// graph replays included.
void init_exchange_workspace(void* workspace, size_t bytes, size_t tagged_bytes = SIZE_MAX);

class FusedKernel {
 public:
  // Plans, emits, compiles (or loads from the JIT cache) and loads the kernel.
  static FusedKernel build(const FusionSpec& spec, const Problem& problem, const CompileOptions& opt = {});
  // The same for a B2B pair (lower.h's B2BCandidate): GEMM1 and F, then GEMM2 and its
  // epilogue, one kernel with the intermediate S in registers.
  static FusedKernel build_b2b(const FusionSpec& first, const FusionSpec& second, const B2bProblem& problem,
                               const CompileOptions& opt = {});
  // The same pair as single-GEMM kernels launched in turn on one stream (plan.h unfused_pair;
  // where one B2B kernel does not pay, choose_b2b): GEMM1 and F store S into a buffer this kernel
  // owns, GEMM2 and its epilogue read it (a gated GEMM1: one gated GEMM, or with
  // PlanOptions::gated_gemm false X W3^T stored first, into another). The
  // buffers are sized for the problem's M: a run with more rows is refused. Arguments as for
  // build_b2b: no intermediate is one of them.
  static FusedKernel build_unfused(const FusionSpec& first, const FusionSpec& second, const Bindings& dims,
                                   const CompileOptions& opt = {});

  // Validates every argument and launches. Throws Error naming the offending argument. A
  // kernel's workspaces serve one launch at a time: run one FusedKernel on one stream at a time
  // (a CUDA graph may capture and replay it).
  void run(const RunArgs& args, Stream stream = nullptr) const;

  const FusionSpec& spec() const;  // a pair's first spec (GEMM1 and F)
  const Plan& plan() const;        // a single-GEMM kernel's plan (unfused kernels: the first's)
  const FusionSpec* second_spec() const;  // a pair's GEMM2 spec (one B2B kernel or unfused), else nullptr
  const B2bPlan* b2b_plan() const;        // a B2B kernel's plan, else nullptr
  // A pair's unfused kernels (build_unfused), in launch order; else empty.
  const std::vector<FusedKernel>& parts() const;
  const EmittedKernel& emitted() const;    // unfused kernels: the first's
  const CompiledKernel& compiled() const;  // unfused kernels: the first's
  // The timeline of the last launch (kernels/comfuse/debug/trace.cuh), empty unless the kernel
  // was built with CompileOptions::trace. Synchronizes the device.
  std::vector<uint64_t> trace() const;

  FusedKernel(FusedKernel&&) noexcept;
 private:
  void run_b2b(const RunArgs& args, Stream stream) const;
  void run_parts(const RunArgs& args, Stream stream) const;
  // A single-GEMM kernel; b_before_wait: the kernel before it on the stream writes none of its B
  // (run_parts knows: params.cuh Params::b_before_wait).
  void run_single(const RunArgs& args, Stream stream, bool b_before_wait) const;

 public:
  FusedKernel& operator=(FusedKernel&&) noexcept;
  ~FusedKernel();

 private:
  struct State;
  explicit FusedKernel(std::unique_ptr<State> s);
  std::unique_ptr<State> state_;
};

// The whole-graph entry point: the graph must lower to exactly one region with no fallbacks, or
// to one B2B pair of regions (otherwise the Error lists what is not fused and why); a pair is one
// B2B kernel or two kernels as choose_b2b (plan.h) decides under opt.plan.b2b.
FusedKernel compile(const Graph& g, const Bindings& dims, const CompileOptions& opt = {});

// Emits and JIT-compiles without a GPU (for CI and `comfuse compile`).
CompiledKernel compile_only(const FusionSpec& spec, const Problem& problem, const CompileOptions& opt = {},
                            EmittedKernel* emitted = nullptr, Plan* plan = nullptr);
CompiledKernel compile_only_b2b(const FusionSpec& first, const FusionSpec& second, const B2bProblem& problem,
                                const CompileOptions& opt = {}, EmittedKernel* emitted = nullptr,
                                B2bPlan* plan = nullptr);

}  // namespace comfuse

