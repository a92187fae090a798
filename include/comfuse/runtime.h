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

// A device tensor, row-major. `ld` is the row stride in elements (0 = packed rows).
struct DeviceTensor {
  void* data = nullptr;
  DType dtype = DType::BF16;
  std::vector<int64_t> shape;
  int64_t ld = 0;
};

struct RunArgs {
  std::map<std::string, DeviceTensor> tensors;  // operands, vectors, outputs by graph name
  std::map<std::string, double> scalars;        // runtime scalars ([] inputs) by graph name
};

struct CompileOptions {
  PlanOptions plan;
  PlannerTunables tunables;
  JitOptions jit;
  bool trace = false;  // -DCOMFUSE_TRACE: the kernel stamps a per-job timeline (debug/trace.cuh)
};

// True when a CUDA device of compute capability 9.0 is usable by this process.
bool gpu_available(std::string* why_not = nullptr);

class FusedKernel {
 public:
  // Plans, emits, compiles (or loads from the JIT cache) and loads the kernel.
  static FusedKernel build(const FusionSpec& spec, const Problem& problem, const CompileOptions& opt = {});

  // Validates every argument and launches. Throws Error naming the offending argument.
  void run(const RunArgs& args, Stream stream = nullptr) const;

  const FusionSpec& spec() const;
  const Plan& plan() const;
  const EmittedKernel& emitted() const;
  const CompiledKernel& compiled() const;
  // The timeline of the last launch (kernels/comfuse/debug/trace.cuh), empty unless the kernel
  // was built with CompileOptions::trace. Synchronizes the device.
  std::vector<uint64_t> trace() const;

  FusedKernel(FusedKernel&&) noexcept;
  FusedKernel& operator=(FusedKernel&&) noexcept;
  ~FusedKernel();

 private:
  struct State;
  explicit FusedKernel(std::unique_ptr<State> s);
  std::unique_ptr<State> state_;
};

// The whole-graph entry point: the graph must lower to exactly one region with no
// fallbacks (otherwise the Error lists what is not fused and why).
FusedKernel compile(const Graph& g, const Bindings& dims, const CompileOptions& opt = {});

// Emits and JIT-compiles without a GPU (for CI and `comfuse compile`).
CompiledKernel compile_only(const FusionSpec& spec, const Problem& problem, const CompileOptions& opt = {},
                            EmittedKernel* emitted = nullptr, Plan* plan = nullptr);

}  // namespace comfuse

// ---- Run a whole graph on the GPU on random inputs and check it against the fp64
// reference (used by `comfuse run --gpu` and the GPU tests).
#include "comfuse/interp.h"

namespace comfuse {

struct OutputCheck {
  std::string name;
  DType dtype = DType::F32;
  Comparison cmp;          // GPU result vs run_graph (fp64)
  int64_t unwritten = 0;   // elements still holding the NaN poison after the run
};

struct DeviceRunReport {
  std::vector<OutputCheck> outputs;
  double kernel_ms = 0;        // median over the timed launches (0 when not timed)
  double tflops = 0;           // 2*M*N*K / kernel time
  double cublas_ms = 0;        // cuBLAS GEMM alone (bf16/f16 out), timed alternately with the
                               // fused kernel in the same power state (0 when not asked)
  double ratio = 0;            // fused / cuBLAS: the median of the per-round ratios (each round
                               // pairs the two in one power state); 0 when not asked
  double ratio_lo = 0, ratio_hi = 0;  // the smallest and largest per-round ratio
  std::vector<uint64_t> trace;        // CompileOptions::trace: the last launch's timeline
  Plan plan;
  CompiledKernel compiled;
};

// The rel_l2 a GPU output may differ from the fp64 reference by: the bf16 bound the
// project holds kernels to (1e-2), and the finer ones its f16 and f32 outputs allow.
inline double gpu_result_tolerance(DType t) { return t == DType::BF16 ? 1e-2 : t == DType::F16 ? 5e-3 : 1e-4; }

// Lowers, compiles and runs `g` once on random inputs drawn from `seed` (outputs poisoned
// with NaN first), downloads the outputs and compares them with run_graph. With
// timing_reps > 0 also times batches of that many back-to-back launches (after warm-up; GPU time,
// src/runtime/baseline.h), alternating with the cuBLAS GEMM alone when cublas_baseline.
// Where a traced kernel's time went (per-job mainloop, epilogue, tensor-idle gaps, cross-CTA
// skew of a row group), from FusedKernel::trace(); `csv` (optional) gets every stamp.
std::string summarize_trace(const std::vector<uint64_t>& trace, const Plan& plan, std::string* csv = nullptr);

inline constexpr int kTimingRounds = 9;  // alternating fused / cuBLAS rounds of run_and_check
DeviceRunReport run_and_check(const Graph& g, const Bindings& dims, uint64_t seed, const CompileOptions& opt = {},
                              int timing_reps = 0, double input_offset = 0.0, bool cublas_baseline = false);

}  // namespace comfuse
