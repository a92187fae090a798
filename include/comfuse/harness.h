#pragma once
// The GPU harness (not the library's API): run a whole graph on random inputs, check every
// output against the fp64 reference, time it against cuBLAS GEMM alone, and summarize a traced
// launch. Used by `comfuse run` and the GPU tests; src/runtime/device_run.cpp, trace.cpp.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comfuse/interp.h"
#include "comfuse/runtime.h"

namespace comfuse {

struct OutputCheck {
  std::string name;
  DType dtype = DType::F32;
  Comparison cmp;          // GPU result vs run_graph (fp64)
  int64_t unwritten = 0;   // elements still holding the poison's bits after the run
  // NaN or inf anywhere in the output, the rows the reference skips (large problems) included:
  // a check wants 0 (or, with edit_inputs, the count its NaN inputs make).
  int64_t nonfinite_anywhere = 0;
};

struct DeviceRunReport {
  std::vector<OutputCheck> outputs;
  std::vector<OutputCheck> outputs_after_timing;  // timed runs: the outputs of one more launch after them
  double kernel_ms = 0;        // median over the timed launches (0 when not timed)
  double tflops = 0;           // 2*M*N*K / kernel time
  double cublas_ms = 0;        // cuBLAS GEMM alone (bf16/f16 out; a B2B kernel's two GEMMs back to
                               // back), timed alternately with the fused kernel in the same power
                               // state (0 when not asked)
  double ratio = 0;            // fused / cuBLAS: the median of the per-round ratios (each round
                               // pairs the two in one power state); 0 when not asked
  double ratio_lo = 0, ratio_hi = 0;  // the smallest and largest per-round ratio
  std::vector<uint64_t> trace;        // CompileOptions::trace: the last launch's timeline
  int kernels = 1;    // 2: a B2B pair run as two kernels (choose_b2b)
  Plan plan;          // a single-GEMM kernel's plan (two kernels: the first's)
  B2bPlan b2b_plan;   // a B2B kernel's (the pair's) plan
  CompiledKernel compiled;
};

// The rel_l2 a GPU output may differ from the fp64 reference by: the bf16 bound the
// project holds kernels to (1e-2), and the finer ones its f16 and f32 outputs allow.
inline double gpu_result_tolerance(DType t) { return t == DType::BF16 ? 1e-2 : t == DType::F16 ? 5e-3 : 1e-4; }

// What a check of an output wants: every element written, finite everywhere (none of its inputs
// edited to NaN), and within the dtype's tolerance of the reference.
inline bool output_passes(const OutputCheck& o) {
  return o.unwritten == 0 && o.cmp.nonfinite == 0 && o.nonfinite_anywhere == 0 &&
         o.cmp.rel_l2 <= gpu_result_tolerance(o.dtype);
}

// Lowers, compiles and runs `g` once on random inputs drawn from `seed` (outputs poisoned
// with NaN first), downloads the outputs and compares them with run_graph. `edit_inputs`, where
// given, changes the random inputs before both the kernel and the reference see them (e.g. a NaN
// that must propagate like the reference's); the outputs are then poisoned with a finite value
// instead (bytes 0x7B: about 1.3e36 in f32 and bf16, 61280 in f16), so an element left unwritten
// cannot pass for an expected NaN (an output that really equals it is counted as unwritten: the
// check fails, it does not pass wrongly). The kernel is built
// for `built_for` where given (e.g. more rows than `dims`, as a shape class's kernel runs), else
// for `dims`; it always runs on `dims`. With
// timing_reps > 0 also times batches of that many back-to-back launches (after warm-up; GPU time,
// src/runtime/baseline.h), alternating with the cuBLAS GEMM alone when cublas_baseline.
// Where a traced kernel's time went (per-job mainloop, epilogue, tensor-idle gaps, cross-CTA
// skew of a row group), from FusedKernel::trace(); `csv` (optional) gets every stamp.
std::string summarize_trace(const std::vector<uint64_t>& trace, const Plan& plan, std::string* csv = nullptr);
// The same for a B2B kernel's launch: per job, its chunks' ML1 / Epi1 / ML2 and its Epi2.
std::string summarize_b2b_trace(const std::vector<uint64_t>& trace, const B2bPlan& plan, std::string* csv = nullptr);

inline constexpr int kTimingRounds = 9;  // alternating fused / cuBLAS rounds of run_and_check
DeviceRunReport run_and_check(const Graph& g, const Bindings& dims, uint64_t seed, const CompileOptions& opt = {},
                              int timing_reps = 0, double input_offset = 0.0, bool cublas_baseline = false,
                              const Bindings& built_for = {},
                              const std::function<void(TensorMap&)>& edit_inputs = {});

}  // namespace comfuse

// ---- The cross-CTA channels on their own (kernels/comfuse/debug/channel_probe.cuh): the GPU
// test checks them, bench/channel_bench.cpp times them.
#include "comfuse/params.cuh"

namespace comfuse {

class ChannelProbe {
 public:
  // JIT-compiles channel_probe.cuh followed by `instantiations` (COMFUSE_DSMEM_PROBE(...),
  // COMFUSE_L2_PROBE(...) lines) and loads it. Needs a GPU.
  explicit ChannelProbe(const std::string& instantiations);
  ~ChannelProbe();
  ChannelProbe(const ChannelProbe&) = delete;
  ChannelProbe& operator=(const ChannelProbe&) = delete;

  struct Result {
    int errors = 0;    // rows that differ from the exact sum (meaningful for rounds >= 1)
    double ms = 0;     // GPU time of the launch
    int clusters = 0;  // clusters launched: as many as fit, each CTA taking a whole SM
  };
  // Runs probe `entry` for `rounds` dependent rounds on clusters of `cluster` CTAs along x.
  Result run(const std::string& entry, int cluster, const Params& p, int rounds) const;

 private:
  struct State;
  State* st_;
};

}  // namespace comfuse
