// run_and_check: the GPU end of `comfuse run --gpu` and of the GPU tests. Host buffers
// are converted to the storage dtype bit-exactly (the random inputs are already rounded
// to it), outputs are poisoned with NaN so an unwritten element cannot pass.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "comfuse/lower.h"
#include "comfuse/runtime.h"

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

}  // namespace

DeviceRunReport run_and_check(const Graph& g, const Bindings& dims, uint64_t seed, const CompileOptions& opt,
                              int timing_reps, double input_offset) {
  LoweringResult r = lower(g);
  if (r.regions.size() != 1 || !r.fallbacks.empty())
    throw Error("the graph does not lower to one fused kernel:\n" + describe(g, r));
  const FusionSpec& s = r.regions[0].spec;
  FusedKernel k = FusedKernel::build(s, problem_of(s, dims), opt);

  std::mt19937_64 rng(seed);
  const TensorMap inputs = random_inputs(g, dims, rng, input_offset);
  const TensorMap want = run_graph(g, dims, inputs);

  std::vector<std::unique_ptr<DeviceBuffer>> buffers;
  RunArgs args;
  struct Out {
    const RuntimeArg* arg;
    void* ptr;
    size_t bytes;
  };
  std::vector<Out> outs;
  for (const RuntimeArg& a : s.args) {
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
      check(cudaMemset(ptr, 0xFF, bytes), "poisoning outputs");  // all-ones bits: NaN in every dtype
      outs.push_back({&a, ptr, bytes});
    } else {
      auto it = inputs.find(a.name);
      if (it == inputs.end()) throw Error(fmt::format("no input named '{}' (computed arguments need the full graph path)", a.name));
      std::vector<char> host = to_device_bytes(it->second, a.dtype);
      check(cudaMemcpy(ptr, host.data(), host.size(), cudaMemcpyHostToDevice), "uploading inputs");
    }
    args.tensors[a.name] = DeviceTensor{ptr, a.dtype, shape, 0};
  }
  k.run(args);
  check(cudaGetLastError(), "kernel launch");
  check(cudaDeviceSynchronize(), "kernel execution");

  DeviceRunReport rep;
  rep.plan = k.plan();
  rep.compiled = k.compiled();
  for (const Out& o : outs) {
    std::vector<char> host(o.bytes);
    check(cudaMemcpy(host.data(), o.ptr, o.bytes, cudaMemcpyDeviceToHost), "downloading outputs");
    const Tensor& ref = want.at(o.arg->name);
    Tensor got;
    got.shape = ref.shape;
    got.data.resize(ref.data.size());
    OutputCheck oc;
    oc.name = o.arg->name;
    oc.dtype = o.arg->dtype;
    for (size_t i = 0; i < got.data.size(); ++i) {
      got.data[i] = from_device(host.data() + i * size_of(o.arg->dtype), o.arg->dtype);
      oc.unwritten += std::isnan(got.data[i]) && !std::isnan(ref.data[i]);
    }
    oc.cmp = compare(got, ref);
    rep.outputs.push_back(oc);
  }

  if (timing_reps > 0) {
    cudaEvent_t start, stop;
    check(cudaEventCreate(&start), "cudaEventCreate");
    check(cudaEventCreate(&stop), "cudaEventCreate");
    for (int i = 0; i < 3; ++i) k.run(args);
    std::vector<float> ms;
    for (int i = 0; i < timing_reps; ++i) {
      check(cudaEventRecord(start), "cudaEventRecord");
      k.run(args);
      check(cudaEventRecord(stop), "cudaEventRecord");
      check(cudaEventSynchronize(stop), "cudaEventSynchronize");
      float t = 0;
      check(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime");
      ms.push_back(t);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    std::sort(ms.begin(), ms.end());
    rep.kernel_ms = ms[ms.size() / 2];
    const Problem& p = rep.plan.problem;
    rep.tflops = 2.0 * double(p.m) * double(p.n) * double(p.k) / (rep.kernel_ms * 1e-3) / 1e12;
  }
  return rep;
}

}  // namespace comfuse
