// run_and_check: the GPU end of `comfuse run --gpu` and of the GPU tests. Host buffers
// are converted to the storage dtype bit-exactly (the random inputs are already rounded
// to it), outputs are poisoned (NaN, or a finite value where NaN may be right) so an unwritten
// element cannot pass.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "comfuse/lower.h"
#include "comfuse/harness.h"
#include "comfuse/runtime.h"
#include "baseline.h"

namespace comfuse {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(fmt::format("{}: {}", what, cudaGetErrorString(e)));
}

std::vector<char> to_device_bytes(const Tensor& t, DType dt) {
  std::vector<char> out(static_cast<size_t>(t.numel()) * size_of(dt));
  for (size_t i = 0; i < t.data.size(); ++i) {
    const float f = static_cast<float>(t.data[i]);
    if (dt == DType::F32) {
      std::memcpy(out.data() + 4 * i, &f, 4);
    } else if (dt == DType::BF16) {
      __nv_bfloat16 h = __float2bfloat16_rn(f);
      std::memcpy(out.data() + 2 * i, &h, 2);
    } else {
      __half h = __float2half_rn(f);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

double from_device(const char* p, DType dt) {
  if (dt == DType::F32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  if (dt == DType::BF16) {
    __nv_bfloat16 h;
    std::memcpy(&h, p, 2);
    return __bfloat162float(h);
  }
  __half h;
  std::memcpy(&h, p, 2);
  return __half2float(h);
}

struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) { check(cudaMalloc(&ptr, std::max<size_t>(bytes, 16)), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};


// Rows `rows` of a matrix [M, cols] (or a column [M]), or of every batch of [B, M, cols].
Tensor take_rows(const Tensor& t, const std::vector<int64_t>& rows) {
  Tensor out;
  out.shape = t.shape;
  const size_t rd = t.shape.size() == 3 ? 1 : 0;  // the row dim
  out.shape[rd] = static_cast<int64_t>(rows.size());
  const int64_t cols = t.shape.size() >= 2 ? t.shape.back() : 1;
  const int64_t batches = rd ? t.shape[0] : 1, per_batch = t.shape[rd] * cols;
  for (int64_t b = 0; b < batches; ++b)
    for (int64_t r : rows) {
      const auto from = t.data.begin() + b * per_batch + r * cols;
      out.data.insert(out.data.end(), from, from + cols);
    }
  return out;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

DeviceRunReport run_and_check(const Graph& g, const Bindings& dims, uint64_t seed, const CompileOptions& opt,
                              int timing_reps, double input_offset, bool cublas_baseline,
                              const Bindings& built_for, const std::function<void(TensorMap&)>& edit_inputs) {
  // One kernel: a single region, or a B2B pair (one kernel or two, as compile() decides; its
  // intermediate S is no argument).
  FusedKernel k = compile(g, built_for.empty() ? dims : built_for, opt);
  const FusionSpec& s = k.spec();
  const FusionSpec* second = k.second_spec();
  const std::string intermediate =
      second ? second->args.at(static_cast<size_t>(second->arg_index(ArgRole::OperandA))).name : "";
  std::vector<const RuntimeArg*> kernel_args;
  for (const FusionSpec* sp : {&s, second})
    if (sp)
      for (const RuntimeArg& a : sp->args)
        if (a.name != intermediate) kernel_args.push_back(&a);

  std::mt19937_64 rng(seed);
  TensorMap inputs = random_inputs(g, dims, rng, input_offset);
  if (edit_inputs) edit_inputs(inputs);
  // The reference on the sampled rows: inputs indexed by M are cut to those rows.
  const Problem prob = problem_of(second ? *second : s, dims);  // M and the output columns N
  const int64_t batches = s.batched() ? resolve(s.batch, dims) : 1;  // a batched B2B pair
  const int64_t flops_k = second ? resolve(s.k, dims) + prob.k : prob.k;  // per output element
  TensorMap ref_inputs = inputs;
  Bindings ref_dims = dims;
  RowSample sample;
  // Sampled rows need ops that are row-local in M (not X x X^T, whose B has M rows too).
  // A batch multiplies the reference's work: the same rows of every batch are checked.
  const std::vector<int64_t> rows =
      row_local(g, s.m.sym) ? reference_rows(prob.m, prob.n, flops_k * batches) : reference_rows(prob.m, 1, 1);
  if (static_cast<int64_t>(rows.size()) != prob.m) {
    ref_dims[s.m.sym] = static_cast<int64_t>(rows.size());
    sample = RowSample{s.m.sym, rows};  // a causal mask reads the rows' indices
    for (const Node& n : g.nodes())
      if (n.kind == OpKind::Input && n.shape.size() >= 2 && n.shape[n.shape.size() - 2] == s.m)
        ref_inputs[n.name] = take_rows(inputs.at(n.name), rows);
  }
  const TensorMap want = run_graph(g, ref_dims, ref_inputs, sample);

  std::vector<std::unique_ptr<DeviceBuffer>> buffers;
  RunArgs args;
  struct Out {
    const RuntimeArg* arg;
    void* ptr;
    size_t bytes;
  };
  std::vector<Out> outs;
  for (const RuntimeArg* ap : kernel_args) {
    const RuntimeArg& a = *ap;
    if (args.tensors.count(a.name) || args.scalars.count(a.name)) continue;  // X x X^T: one tensor, A and B
    std::vector<int64_t> shape;
    for (const Dim& d : a.shape) shape.push_back(resolve(d, dims));
    if (a.role == ArgRole::Scalar) {
      args.scalars[a.name] = inputs.at(a.name).data.at(0);
      continue;
    }
    int64_t numel = 1;
    for (int64_t e : shape) numel *= e;
    const size_t bytes = static_cast<size_t>(numel) * size_of(a.dtype);
    buffers.push_back(std::make_unique<DeviceBuffer>(bytes));
    void* ptr = buffers.back()->ptr;
    if (a.role == ArgRole::Output) {
      outs.push_back({&a, ptr, bytes});
    } else {
      auto it = inputs.find(a.name);
      if (it == inputs.end()) throw Error(fmt::format("no input named '{}' (computed arguments need the full graph path)", a.name));
      std::vector<char> host = to_device_bytes(it->second, a.dtype);
      check(cudaMemcpy(ptr, host.data(), host.size(), cudaMemcpyHostToDevice), "uploading inputs");
    }
    args.tensors[a.name] = DeviceTensor{ptr, a.dtype, shape, 0};
  }
  // One launch on poisoned outputs, then each output against the reference. The poison is NaN in
  // every dtype (all-ones bits), or a finite value (0x7B bytes) where edited inputs may make NaN
  // a right answer.
  const int poison = edit_inputs ? 0x7B : 0xFF;
  auto run_and_compare = [&] {
    for (const Out& o : outs) check(cudaMemset(o.ptr, poison, o.bytes), "poisoning outputs");
    k.run(args);
    check(cudaGetLastError(), "kernel launch");
    check(cudaDeviceSynchronize(), "kernel execution");
    std::vector<OutputCheck> checks;
    for (const Out& o : outs) {
      std::vector<char> host(o.bytes);
      check(cudaMemcpy(host.data(), o.ptr, o.bytes, cudaMemcpyDeviceToHost), "downloading outputs");
      const Tensor& ref = want.at(o.arg->name);
      Tensor full;  // [M, N], or [M, 1] for a per-row output; [B, ...] when batched
      const int64_t cols = o.arg->value_class == ValueClass::Col ? 1 : prob.n;
      full.shape = s.batched() ? std::vector<int64_t>{batches, prob.m, cols} : std::vector<int64_t>{prob.m, cols};
      full.data.resize(static_cast<size_t>(batches * prob.m * cols));
      OutputCheck oc;
      oc.name = o.arg->name;
      oc.dtype = o.arg->dtype;
      const size_t width = size_of(o.arg->dtype);
      for (size_t i = 0; i < full.data.size(); ++i) {
        const char* e = host.data() + i * width;
        full.data[i] = from_device(e, o.arg->dtype);
        // The poison survived: never written.
        oc.unwritten += std::all_of(e, e + width, [&](char b) { return static_cast<unsigned char>(b) == poison; });
        oc.nonfinite_anywhere += !std::isfinite(full.data[i]);
      }
      const Tensor got = static_cast<int64_t>(rows.size()) == prob.m ? full : take_rows(full, rows);
      if (got.data.size() != ref.data.size()) throw Error(fmt::format("output '{}': reference shape differs", oc.name));
      Tensor ref_as = ref;  // the graph's shape ([B, M, 1], [M]) as the kernel's view of it
      ref_as.shape = got.shape;
      oc.cmp = compare(got, ref_as);
      checks.push_back(oc);
    }
    return checks;
  };

  DeviceRunReport rep;
  rep.plan = k.plan();
  rep.kernels = k.parts().empty() ? 1 : static_cast<int>(k.parts().size());
  if (k.b2b_plan()) rep.b2b_plan = *k.b2b_plan();
  rep.compiled = k.compiled();
  rep.outputs = run_and_compare();

  if (timing_reps > 0) {
    // The GPU drifts between power states (bench/NOTES.md): the fused kernel and cuBLAS are
    // timed in alternating rounds after a warm-up; times are median rounds, the ratio is the
    // median of the per-round ratios (a round pairs both in one power state).
    // A B2B kernel's floor is cuBLAS's GEMM1 and GEMM2 alone, back to back (S in memory).
    std::unique_ptr<runtime_detail::CublasBaseline> blas, blas2, blas3;
    std::unique_ptr<DeviceBuffer> s_buffer;
    RunArgs args2 = args;
    if (cublas_baseline) {
      blas = std::make_unique<runtime_detail::CublasBaseline>(s, args);
      if (second) {
        const RuntimeArg& sa = second->args.at(static_cast<size_t>(second->arg_index(ArgRole::OperandA)));
        const int64_t n1 = resolve(s.n, dims);
        const size_t s_bytes = static_cast<size_t>(batches * prob.m * n1) * size_of(sa.dtype);
        s_buffer = std::make_unique<DeviceBuffer>(s_bytes);
        check(cudaMemset(s_buffer->ptr, 0, s_bytes), "S for cuBLAS");
        args2.tensors[sa.name] = DeviceTensor{s_buffer->ptr, sa.dtype,
                                              s.batched() ? std::vector<int64_t>{batches, prob.m, n1}
                                                          : std::vector<int64_t>{prob.m, n1},
                                              0};
        blas2 = std::make_unique<runtime_detail::CublasBaseline>(*second, args2);
      }
      // A gated GEMM1 is two GEMMs for cuBLAS: X W1^T and X W3^T.
      if (const int gate = s.arg_index(ArgRole::OperandGate); gate >= 0) {
        RunArgs args3 = args;
        args3.tensors[s.args.at(static_cast<size_t>(s.arg_index(ArgRole::OperandB))).name] =
            args.tensors.at(s.args.at(static_cast<size_t>(gate)).name);
        blas3 = std::make_unique<runtime_detail::CublasBaseline>(s, args3);
      }
    }
    auto run_blas = [&] {
      blas->run();
      if (blas3) blas3->run();
      if (blas2) blas2->run();
    };
    for (int i = 0; i < 10; ++i) {
      k.run(args);
      if (blas) run_blas();
    }
    std::vector<double> fused, base;
    for (int round = 0; round < kTimingRounds; ++round) {
      fused.push_back(runtime_detail::batch_ms([&] { k.run(args); }, timing_reps));
      if (blas) base.push_back(runtime_detail::batch_ms(run_blas, timing_reps));
    }
    check(cudaGetLastError(), "timed launches");
    rep.kernel_ms = median_of(fused);
    if (blas) {
      rep.cublas_ms = median_of(base);
      std::vector<double> ratios;
      for (size_t i = 0; i < fused.size(); ++i) ratios.push_back(fused[i] / base[i]);
      rep.ratio_lo = *std::min_element(ratios.begin(), ratios.end());
      rep.ratio_hi = *std::max_element(ratios.begin(), ratios.end());
      rep.ratio = median_of(ratios);
    }
    // Useful FLOPs: one GEMM, or a B2B kernel's two (GEMM1 counted once, however often it ran).
    // A gated GEMM alone (KernelConfig::gated) computes two products.
    double flops = 2.0 * double(prob.m) * double(prob.n) * double(prob.k) * (!second && s.gated() ? 2 : 1);
    if (second) flops += 2.0 * double(prob.m) * double(resolve(s.n, dims)) * double(resolve(s.k, dims)) *
                         (s.gated() ? 2 : 1);
    // A causal B2B kernel's useful work: the unmasked scores only (row r keeps min(r + 1, N1) keys).
    if (second && rep.b2b_plan.kernel.causal) {
      const double m = double(prob.m), n1 = double(resolve(s.n, dims));
      const double kept = m <= n1 ? m * (m + 1) / 2 : n1 * (n1 + 1) / 2 + (m - n1) * n1;
      flops *= kept / (m * n1);
    }
    rep.tflops = double(batches) * flops / (rep.kernel_ms * 1e-3) / 1e12;
    // The kernels keep state across launches (the exchange workspace's launch counter and
    // tags): the launch after hundreds must be as right as the first.
    if (!opt.trace) rep.outputs_after_timing = run_and_compare();
  }
  if (opt.trace) rep.trace = k.trace();  // the last launch's timeline (a timed one when timed)
  return rep;
}

}  // namespace comfuse
