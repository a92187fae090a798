// Loading and launching a JIT-compiled fused kernel through the CUDA runtime's library
// API (cudaLibraryLoadData): no link against libcuda, so binaries start on machines
// without a GPU and report that cleanly.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <optional>

#include "comfuse/lower.h"
#include "comfuse/runtime.h"
#include "comfuse/scheduler/grid.cuh"
#include "launch.h"

namespace comfuse {

namespace {

void cuda_check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) throw Error(fmt::format("{}: {}", what, cudaGetErrorString(e)));
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

bool gpu_available(std::string* why_not) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    if (why_not)
      *why_not = e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice
                     ? fmt::format("no CUDA driver or GPU on this machine (cudaGetDeviceCount: {})", cudaGetErrorString(e))
                 : e != cudaSuccess ? std::string(cudaGetErrorString(e))
                                    : std::string("no CUDA device");
    cudaGetLastError();
    return false;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess || prop.major != 9) {
    if (why_not) *why_not = fmt::format("device 0 is {} (sm_{}{}), ComFuse kernels need sm_90", prop.name, prop.major, prop.minor);
    return false;
  }
  return true;
}

struct FusedKernel::State {
  FusionSpec spec;  // the kernel's spec; a B2B kernel's first (GEMM1 and F)
  Plan plan;
  // A pair: GEMM2's spec, and the pair's plan where it is one kernel (kernels/comfuse/b2b/).
  std::optional<FusionSpec> second;
  B2bPlan b2b_plan;
  // A pair as unfused kernels: each, and the intermediates between them (owned, [rows, cols]).
  struct Intermediate {
    std::string name;
    DType dtype = DType::BF16;
    int64_t rows = 0, cols = 0;
    void* data = nullptr;
  };
  std::vector<FusedKernel> parts;
  std::vector<Intermediate> intermediates;
  EmittedKernel emitted;
  CompiledKernel compiled;
  cudaLibrary_t library = nullptr;
  cudaKernel_t kernel = nullptr;
  int max_clusters = 0;
  void* stash = nullptr;     // the stash workspace (StashSpace::Workspace), owned
  void* exchange = nullptr;  // the L2 row exchange (Aggregation::L2Exchange), owned, initialized once
  ~State() {
    if (stash) cudaFree(stash);
    if (exchange) cudaFree(exchange);
    for (const Intermediate& i : intermediates) cudaFree(i.data);
    if (library) cudaLibraryUnload(library);
  }
};

FusedKernel::FusedKernel(std::unique_ptr<State> s) : state_(std::move(s)) {}
FusedKernel::FusedKernel(FusedKernel&&) noexcept = default;
FusedKernel& FusedKernel::operator=(FusedKernel&&) noexcept = default;
FusedKernel::~FusedKernel() = default;
const FusionSpec& FusedKernel::spec() const { return state_->spec; }
const Plan& FusedKernel::plan() const { return state_->parts.empty() ? state_->plan : state_->parts[0].plan(); }
const FusionSpec* FusedKernel::second_spec() const { return state_->second ? &*state_->second : nullptr; }
const B2bPlan* FusedKernel::b2b_plan() const {
  return state_->second && state_->parts.empty() ? &state_->b2b_plan : nullptr;
}
const std::vector<FusedKernel>& FusedKernel::parts() const { return state_->parts; }
const EmittedKernel& FusedKernel::emitted() const {
  return state_->parts.empty() ? state_->emitted : state_->parts[0].emitted();
}
const CompiledKernel& FusedKernel::compiled() const {
  return state_->parts.empty() ? state_->compiled : state_->parts[0].compiled();
}

std::vector<uint64_t> FusedKernel::trace() const {
  if (!state_->parts.empty()) return state_->parts[0].trace();  // unfused kernels: the first's timeline
  void* sym = nullptr;
  size_t bytes = 0;
  if (cudaLibraryGetGlobal(&sym, &bytes, state_->library, "comfuse_trace") != cudaSuccess) {
    cudaGetLastError();  // not a traced build
    return {};
  }
  std::vector<uint64_t> words(bytes / sizeof(uint64_t));
  cuda_check(cudaDeviceSynchronize(), "waiting for the traced launch");
  cuda_check(cudaMemcpy(words.data(), sym, words.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost), "reading the trace");
  return words;
}

std::optional<Gpu> gpu_of_this_device() {
  static std::mutex mu;
  static std::map<int, std::optional<Gpu>> known;  // by device ordinal: the properties query is slow
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();  // no device (a CPU-only machine): not an error here
    return std::nullopt;
  }
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = known.find(dev); it != known.end()) return it->second;
  cudaDeviceProp prop{};
  std::optional<Gpu> g;
  if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess) cudaGetLastError();
  else if (prop.major == 9) {
    const std::string_view name(prop.name);  // "NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA GH200 480GB"
    g = name.find("H200") != std::string_view::npos && name.find("GH200") == std::string_view::npos ? Gpu::H200 : Gpu::H100;
  }
  return known[dev] = g;
}

PlanOptions planned_for_this_device(PlanOptions o) {
  if (!o.gpu) o.gpu = gpu_of_this_device();
  return o;
}

CompiledKernel compile_only(const FusionSpec& spec, const Problem& problem, const CompileOptions& opt,
                            EmittedKernel* emitted, Plan* plan) {
  Plan p = make_plan(spec, problem, planned_for_this_device(opt.plan));
  EmittedKernel k = emit(spec, p);
  KernelSource src{spec.name, k.source, k.entry, {}};
  if (opt.trace) src.flags.push_back("-DCOMFUSE_TRACE");
  CompiledKernel c = jit_compile(src, opt.jit);
  if (c.wgmma_serialized)
    throw Error(fmt::format("kernel for '{}' compiled with serialized wgmma (ptxas C7510/C7520): a ComFuse bug\n{}", spec.name, c.log));
  if (emitted) *emitted = std::move(k);
  if (plan) *plan = std::move(p);
  return c;
}

CompiledKernel compile_only_b2b(const FusionSpec& first, const FusionSpec& second, const B2bProblem& problem,
                                const CompileOptions& opt, EmittedKernel* emitted, B2bPlan* plan) {
  B2bPlan p = make_b2b_plan(first, second, problem, planned_for_this_device(opt.plan));
  EmittedKernel k = emit_b2b(first, second, p);
  KernelSource src{first.name + "_b2b", k.source, k.entry, {}};
  if (opt.trace) src.flags.push_back("-DCOMFUSE_TRACE");
  CompiledKernel c = jit_compile(src, opt.jit);
  if (c.wgmma_serialized)
    throw Error(fmt::format("B2B kernel for '{}' compiled with serialized wgmma (ptxas C7510/C7520): a ComFuse bug\n{}",
                            first.name, c.log));
  if (emitted) *emitted = std::move(k);
  if (plan) *plan = std::move(p);
  return c;
}

FusedKernel FusedKernel::build(const FusionSpec& spec, const Problem& problem, const CompileOptions& opt) {
  std::string why;
  if (!gpu_available(&why)) throw Error("no usable GPU: " + why);
  auto st = std::make_unique<State>();
  st->spec = spec;
  st->compiled = compile_only(spec, problem, opt, &st->emitted, &st->plan);
  cuda_check(cudaLibraryLoadData(&st->library, st->compiled.cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
             "loading the compiled kernel");
  cuda_check(cudaLibraryGetKernel(&st->kernel, st->library, st->emitted.entry.c_str()), "finding the kernel entry");
  // Everything the launch needs comes from the plan's KernelConfig: the kernel was built from it.
  const KernelConfig& kc = st->plan.kernel;
  st->max_clusters = runtime_detail::prepare(st->kernel, kc);
  // The stash a plan keeps in global memory lives in a workspace sized for the persistent grid;
  // it stays L2-resident when the plan said so (explain: workspace).
  if (const size_t bytes = static_cast<size_t>(stash_workspace_bytes(kc, st->max_clusters)); bytes > 0)
    cuda_check(cudaMalloc(&st->stash, bytes), fmt::format("allocating the {}-byte stash workspace", bytes));
  if (const ExchangeLayout l = exchange_layout(kc, st->max_clusters); l.total_bytes > 0) {
    const size_t bytes = static_cast<size_t>(l.total_bytes);
    cuda_check(cudaMalloc(&st->exchange, bytes), fmt::format("allocating the {}-byte exchange workspace", bytes));
    init_exchange_workspace(st->exchange, bytes, static_cast<size_t>(l.tagged_bytes));
  }
  return FusedKernel(std::move(st));
}

FusedKernel FusedKernel::build_b2b(const FusionSpec& first, const FusionSpec& second, const B2bProblem& problem,
                                   const CompileOptions& opt) {
  std::string why;
  if (!gpu_available(&why)) throw Error("no usable GPU: " + why);
  auto st = std::make_unique<State>();
  st->spec = first;
  st->second = second;
  st->compiled = compile_only_b2b(first, second, problem, opt, &st->emitted, &st->b2b_plan);
  cuda_check(cudaLibraryLoadData(&st->library, st->compiled.cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
             "loading the compiled kernel");
  cuda_check(cudaLibraryGetKernel(&st->kernel, st->library, st->emitted.entry.c_str()), "finding the kernel entry");
  st->max_clusters = runtime_detail::prepare(st->kernel, st->b2b_plan.kernel);
  return FusedKernel(std::move(st));
}

FusedKernel FusedKernel::build_unfused(const FusionSpec& first, const FusionSpec& second, const Bindings& dims,
                                       const CompileOptions& opt) {
  auto st = std::make_unique<State>();
  st->spec = first;
  st->second = second;
  const UnfusedPair pair = unfused_pair(first, second, planned_for_this_device(opt.plan));
  for (const FusionSpec& k : pair.kernels) st->parts.push_back(build(k, problem_of(k, dims), opt));
  for (const RuntimeArg& a : pair.intermediates) {
    State::Intermediate& i = st->intermediates.emplace_back();
    i.name = a.name, i.dtype = a.dtype;
    i.rows = resolve(first.m, dims), i.cols = resolve(first.n, dims);
    const size_t bytes = static_cast<size_t>(i.rows * i.cols) * size_of(a.dtype);
    cuda_check(cudaMalloc(&i.data, bytes), fmt::format("allocating the {}-byte intermediate '{}'", bytes, a.name));
  }
  return FusedKernel(std::move(st));
}

namespace {

const DeviceTensor& tensor_arg(const RunArgs& args, const RuntimeArg& a) {
  auto it = args.tensors.find(a.name);
  if (it == args.tensors.end()) throw Error(fmt::format("missing tensor argument '{}' ({})", a.name, name_of(a.role)));
  if (it->second.dtype != a.dtype)
    throw Error(fmt::format("argument '{}' is {}, the kernel was built for {}", a.name, name_of(it->second.dtype),
                            name_of(a.dtype)));
  if (!it->second.data) throw Error(fmt::format("argument '{}' has a null pointer", a.name));
  return it->second;
}

const DeviceTensor& matrix_arg(const RunArgs& args, const RuntimeArg& a) {
  const DeviceTensor& t = tensor_arg(args, a);
  if (t.shape.size() != 2) throw Error(fmt::format("argument '{}' must be 2-D, got {}", a.name, shape_str(t.shape)));
  return t;
}

// A matrix argument of a kernel that may be batched: [rows, cols], or when `batched` (a B2B
// kernel over a batch dim) [B, rows, cols] or [B, H, rows, cols], with its strides (elements).
struct Matrix {
  const DeviceTensor* t = nullptr;
  int64_t batches = 1, heads = 1, rows = 0, cols = 0, ld = 0, batch_stride = 0, head_stride = 0;
};

Matrix batched_matrix_arg(const RunArgs& args, const RuntimeArg& a, bool batched) {
  const DeviceTensor& t = tensor_arg(args, a);
  if (batched ? t.shape.size() != 3 && t.shape.size() != 4 : t.shape.size() != 2)
    throw Error(fmt::format("argument '{}' must be {}, got {}", a.name,
                            batched ? "3-D [B, rows, cols] or 4-D [B, H, rows, cols] (the kernel is batched)" : "2-D",
                            shape_str(t.shape)));
  Matrix m;
  m.t = &t;
  const size_t r = t.shape.size() - 2;
  m.heads = t.shape.size() == 4 ? t.shape[1] : 1;
  m.batches = batched ? t.shape[0] * m.heads : 1;
  m.rows = t.shape[r];
  m.cols = t.shape[r + 1];
  m.ld = t.ld ? t.ld : m.cols;
  m.head_stride = t.head_stride ? t.head_stride : m.rows * m.ld;
  m.batch_stride = t.batch_stride ? t.batch_stride : m.heads > 1 ? m.heads * m.head_stride : m.rows * m.ld;
  return m;
}

// The head count of a batched kernel's launch: that of its [B, H, rows, cols] arguments, which
// must agree (the kernel splits its flat batch index by one count); 1 where all are 3-D.
int64_t launch_heads(const RunArgs& args) {
  int64_t heads = 1;
  std::string first;
  for (const auto& [name, t] : args.tensors) {
    if (t.shape.size() != 4) continue;
    if (first.empty()) heads = t.shape[1], first = name;
    else if (t.shape[1] != heads)
      throw Error(fmt::format("'{}' is {} with {} heads but '{}' has {}: the [B, H, rows, cols] arguments of a "
                              "batched kernel share H", name, shape_str(t.shape), t.shape[1], first, heads));
  }
  return heads;
}

// m's matrices as the kernel's 4-D descriptors see them, `heads` the launch's (launch_heads): a
// [B, H, ..] argument as it is; a 3-D one, whose batches are evenly spaced, split the same way.
runtime_detail::BatchLayout batch_layout(const Matrix& m, int64_t heads) {
  if (m.heads == heads)
    return {uint64_t(m.batches / heads), uint64_t(heads), uint64_t(m.batch_stride), uint64_t(m.head_stride)};
  return {uint64_t(m.batches / heads), uint64_t(heads), uint64_t(m.batch_stride * heads), uint64_t(m.batch_stride)};
}

// Every tensor argument names one of the kernel's (the intermediate of a B2B kernel is not one).
void check_names(const RunArgs& args, const std::vector<const FusionSpec*>& specs, const std::string& skip) {
  for (const auto& [name, t] : args.tensors) {
    bool known = false;
    for (const FusionSpec* s : specs)
      for (const RuntimeArg& a : s->args) known = known || (a.name == name && a.role != ArgRole::Scalar && a.name != skip);
    if (!known) throw Error(fmt::format("argument '{}' is not a tensor argument of kernel '{}'", name, specs[0]->name));
  }
}

// The epilogue's runtime arguments into their Params slots: scalars, row/column vectors,
// [M, N] inputs and outputs, [M, 1] outputs (N: the epilogue's columns; a B2B kernel's N2).
// batches > 0: a batched kernel, whose [M, N] inputs and outputs are [batches, M, N] (or
// [batches / heads, heads, M, N]) and whose [M, 1] outputs are [batches, M, 1] (packed: the kernel
// writes batch b's at b x M); vectors and scalars are shared by every batch.
void bind_epilogue(const RunArgs& args, const std::vector<const FusionSpec*>& specs, const std::vector<ArgSlot>& slots,
                   Params& p, int64_t M, int64_t N, int epi_rows, int64_t batches = 0, int64_t heads = 1) {
  for (const ArgSlot& sl : slots) {
    const RuntimeArg& a = specs.at(static_cast<size_t>(sl.spec))->args.at(static_cast<size_t>(sl.arg));
    // A B2B kernel's F reads vectors and [M, N] inputs along N1 (its columns are GEMM1's).
    const int64_t cols = sl.spec == 0 && specs.size() > 1 ? p.N1 : N;
    if (sl.kind == SlotKind::Scalar) {
      auto it = args.scalars.find(a.name);
      if (it == args.scalars.end()) throw Error(fmt::format("missing scalar argument '{}'", a.name));
      p.scalars[sl.slot] = static_cast<float>(it->second);
    } else if (sl.kind == SlotKind::Vector) {
      const DeviceTensor& v = tensor_arg(args, a);
      // A periodic row vector (spec.h periodic_arg) holds one segment's elements.
      const FusionSpec& spec = *specs.at(static_cast<size_t>(sl.spec));
      const int64_t want = periodic_arg(spec, a) ? spec.segment : a.role == ArgRole::RowVector ? cols : M;
      int64_t len = 1;
      for (int64_t d : v.shape) len *= d;
      if (len != want || v.shape.empty())
        throw Error(fmt::format("{} '{}' has shape {}, expected {} elements", name_of(a.role), a.name,
                                shape_str(v.shape), want));
      p.vectors[sl.slot] = v.data;
    } else if (sl.kind == SlotKind::Output || sl.kind == SlotKind::TileInput) {
      // A periodic tile input (spec.h periodic_arg: rotary cos and sin) holds one segment's columns.
      const FusionSpec& spec = *specs.at(static_cast<size_t>(sl.spec));
      const int64_t tile_cols = periodic_arg(spec, a) ? spec.segment : cols;
      const Matrix o = batched_matrix_arg(args, a, batches > 0);
      if (o.rows != M || o.cols != tile_cols || (batches > 0 && o.batches != batches))
        throw Error(fmt::format("{} '{}' has shape {}, expected {}", sl.kind == SlotKind::Output ? "output" : "input",
                                a.name, shape_str(o.t->shape),
                                batches > 0 ? fmt::format("[{}, {}, {}]{}", batches, M, tile_cols,
                                                          heads > 1 ? fmt::format(" or [{}, {}, {}, {}]", batches / heads,
                                                                                  heads, M, tile_cols) : "")
                                            : fmt::format("[{}, {}]", M, tile_cols)));
      const runtime_detail::BatchLayout bl = batches > 0 ? batch_layout(o, heads) : runtime_detail::BatchLayout{};
      const std::string what = fmt::format("{} '{}'", sl.kind == SlotKind::Output ? "output" : "input", a.name);
      if (sl.kind == SlotKind::Output)
        runtime_detail::set_output(p, epi_rows, sl.slot, a.dtype, o.t->data, o.ld, bl, what.c_str());
      else
        runtime_detail::set_tile_input(p, epi_rows, sl.slot, a.dtype, o.t->data, tile_cols, o.ld, bl, what.c_str());
    } else if (sl.kind == SlotKind::ColOutput) {
      const DeviceTensor& o = tensor_arg(args, a);
      const int64_t rows = batches > 0 ? batches * M : M;
      int64_t len = 1;
      for (int64_t d : o.shape) len *= d;
      const bool col_shape = o.shape.size() < 2 || o.shape.back() == 1;
      if (len != rows || o.shape.empty() || !col_shape || (o.ld != 0 && o.ld != 1) ||
          (o.batch_stride != 0 && o.batch_stride != M * (o.shape.size() == 4 ? o.shape[1] : 1)) ||
          (o.head_stride != 0 && o.head_stride != M))
        throw Error(fmt::format("per-row output '{}' has shape {}, expected {} (contiguous)", a.name,
                                shape_str(o.shape),
                                batches > 0 ? fmt::format("[{}, {}, 1]", batches, M) : fmt::format("[{}, 1]", M)));
      if (reinterpret_cast<uintptr_t>(o.data) % size_of(a.dtype))
        throw Error(fmt::format("per-row output '{}' is not aligned to its element size", a.name));
      p.col_outputs[sl.slot] = o.data;
    }
  }
}

}  // namespace

void FusedKernel::run(const RunArgs& args, Stream stream) const {
  const State& st = *state_;
  if (!st.parts.empty()) return run_parts(args, stream);
  if (st.second) return run_b2b(args, stream);
  run_single(args, stream, /*b_before_wait=*/false);
}

void FusedKernel::run_single(const RunArgs& args, Stream stream, bool b_before_wait) const {
  const State& st = *state_;
  const FusionSpec& s = st.spec;
  check_names(args, {&s}, "");
  const RuntimeArg& ra = s.args.at(static_cast<size_t>(s.arg_index(ArgRole::OperandA)));
  const RuntimeArg& rb = s.args.at(static_cast<size_t>(s.arg_index(ArgRole::OperandB)));
  const DeviceTensor& A = matrix_arg(args, ra);
  const DeviceTensor& B = matrix_arg(args, rb);
  const int64_t M = A.shape[0], K = A.shape[1];
  const bool nk = s.b_layout == BLayout::NK;
  const int64_t N = nk ? B.shape[0] : B.shape[1];
  if ((nk ? B.shape[1] : B.shape[0]) != K)
    throw Error(fmt::format("B '{}' is {} but A '{}' is {}: K differs", rb.name, shape_str(B.shape), ra.name, shape_str(A.shape)));
  check_problem_size(M, N, K);  // the one size rule (graph.h), as the plan was made under
  // A row reduction is finished by the CTAs that share a row: a longer row would silently
  // reduce in pieces. (Not cross_cta_reduction(): a row one CTA covers alone, row_peers() == 1,
  // has the same limit.) A per-segment epilogue (reductions, rotate_half) works in each tile at
  // any N, segments whole.
  const KernelConfig& kc = st.plan.kernel;
  if (st.spec.segment > 0 && N % st.spec.segment != 0)
    throw Error(fmt::format("N = {} is not a whole number of the {}-column segments this kernel works on", N,
                            st.spec.segment));
  if (kc.row_reduction && kc.row_segment == 0 && N > kc.row_cover())
    throw Error(fmt::format("N = {} exceeds what this kernel's CTAs cover for a row reduction ({} CTAs x {} x {} tiles = "
                            "{}); build the kernel for this N", N, kc.row_peers(), kc.tile_n, kc.n_tiles, kc.row_cover()));

  Params p{};
  p.stash = st.stash;
  p.exchange = st.exchange;
  p.workspace_clusters = st.max_clusters;
  p.raster_group = st.plan.raster_group;
  p.raster_along_n = st.plan.raster_along_n ? 1 : 0;
  p.batches = 1;
  p.heads = 1;
  p.b_before_wait = b_before_wait ? 1 : 0;
  // A gated GEMM's gate (OperandGate): B's shape, layout and type.
  const DeviceTensor* B3 = nullptr;
  if (const int gate = s.arg_index(ArgRole::OperandGate); gate >= 0) {
    const RuntimeArg& rg = s.args.at(static_cast<size_t>(gate));
    B3 = &matrix_arg(args, rg);
    if (B3->shape != B.shape)
      throw Error(fmt::format("the gate '{}' is {} but B '{}' is {}: a gated GEMM's two B operands share a shape",
                              rg.name, shape_str(B3->shape), rb.name, shape_str(B.shape)));
  }
  runtime_detail::set_operands(p, kc, ra.dtype, A.data, A.ld ? A.ld : K, B.data, B.ld ? B.ld : B.shape[1], int(M),
                               int(N), int(K), B3 ? B3->data : nullptr, B3 ? (B3->ld ? B3->ld : B3->shape[1]) : 0);
  bind_epilogue(args, {&s}, st.emitted.slots, p, M, N, kc.epi_rows());
  runtime_detail::launch(st.kernel, kc, p, reinterpret_cast<cudaStream_t>(stream), st.max_clusters);
}

// X [M, K]; W1 (and W3) [N1, K] (nk) or [K, N1]; W2 [N2, N1] (nk) or [N1, N2]; GEMM2's epilogue
// arguments over [M, N2]. A batched kernel (B2bConfig::batched): every one of these with a leading
// batch dim [B, ...] or two [B, H, ...], bound as 4-D TMA descriptors (row vectors and scalars
// shared).
void FusedKernel::run_b2b(const RunArgs& args, Stream stream) const {
  const State& st = *state_;
  const FusionSpec &f = st.spec, &e = *st.second;
  const B2bConfig& kc = st.b2b_plan.kernel;
  const std::string s_name = e.args.at(static_cast<size_t>(e.arg_index(ArgRole::OperandA))).name;
  check_names(args, {&f, &e}, s_name);
  const RuntimeArg& rx = f.args.at(static_cast<size_t>(f.arg_index(ArgRole::OperandA)));
  const RuntimeArg& rw1 = f.args.at(static_cast<size_t>(f.arg_index(ArgRole::OperandB)));
  const RuntimeArg& rw2 = e.args.at(static_cast<size_t>(e.arg_index(ArgRole::OperandB)));
  const bool batched = kc.batched;
  const Matrix X = batched_matrix_arg(args, rx, batched);
  const Matrix W1 = batched_matrix_arg(args, rw1, batched);
  const Matrix W2 = batched_matrix_arg(args, rw2, batched);
  const int64_t B = X.batches, M = X.rows, K = X.cols;
  const int64_t N1 = kc.w1_kmajor ? W1.rows : W1.cols;
  const int64_t N2 = kc.w2_kmajor ? W2.rows : W2.cols;
  for (const auto& [m, a] : {std::pair{&W1, &rw1}, std::pair{&W2, &rw2}})
    if (m->batches != B)
      throw Error(fmt::format("'{}' is {} but X '{}' is {}: the batch counts differ", a->name, shape_str(m->t->shape),
                              rx.name, shape_str(X.t->shape)));
  if ((kc.w1_kmajor ? W1.cols : W1.rows) != K)
    throw Error(fmt::format("W1 '{}' is {} but X '{}' is {}: K differs", rw1.name, shape_str(W1.t->shape), rx.name,
                            shape_str(X.t->shape)));
  if ((kc.w2_kmajor ? W2.cols : W2.rows) != N1)
    throw Error(fmt::format("W2 '{}' is {} but W1 '{}' is {}: N1 differs", rw2.name, shape_str(W2.t->shape), rw1.name,
                            shape_str(W1.t->shape)));
  check_b2b_problem_size(B2bProblem{B, M, K, N1, N2, rx.dtype});  // as the plan was made under
  const int64_t heads = batched ? launch_heads(args) : 1;
  // The producer carries (head, outer batch) packed in one register (params.cuh packed_batch_coord).
  if (heads >= kMaxBatchDim || B / heads >= kMaxBatchDim)
    throw Error(fmt::format("X '{}' is {}: {} outer batches of {} heads; a batched kernel's heads and outer batches "
                            "must each be below {}", rx.name, shape_str(X.t->shape), B / heads, heads, kMaxBatchDim));
  if (kc.x_k_blocks > 0 && ceil_div(static_cast<int>(K), Sm90::kTileK) > kc.x_k_blocks)
    throw Error(fmt::format("X '{}' is {}: K = {} exceeds the {} columns this kernel keeps resident; build the kernel "
                            "for this K", rx.name, shape_str(X.t->shape), K, kc.x_k_blocks * Sm90::kTileK));
  // GEMM2's epilogue finishes a row reduction inside one job: a longer row would reduce in pieces.
  if (e.reduction_count() > 0 && N2 > kc.tile_n2)
    throw Error(fmt::format("N2 = {} exceeds the {} columns of O one job of this kernel holds for GEMM2's row "
                            "reduction; build the kernel for this N2", N2, kc.tile_n2));
  Params p{};
  p.M = int(M), p.K = int(K), p.N1 = int(N1), p.N = int(N2), p.batches = int(B), p.heads = int(heads);
  const uint32_t box = Sm90::kTileK;
  auto layout = [&](const Matrix& t) { return batched ? batch_layout(t, heads) : runtime_detail::BatchLayout{}; };
  runtime_detail::encode_tensor(&p.tma_a, fmt::format("X '{}'", rx.name).c_str(), rx.dtype, X.t->data, M, K, X.ld,
                                box, kc.tile_m, layout(X));
  auto weight = [&](TmaDesc* d, const char* role, const RuntimeArg& a, const Matrix& t, bool kmajor, int rows) {
    runtime_detail::encode_tensor(d, fmt::format("{} '{}'", role, a.name).c_str(), a.dtype, t.t->data, t.rows, t.cols,
                                  t.ld, box, kmajor ? rows : box, layout(t));
  };
  weight(&p.tma_b, "W1", rw1, W1, kc.w1_kmajor, kc.chunk_n1);
  if (kc.gated) {
    const RuntimeArg& rw3 = f.args.at(static_cast<size_t>(f.arg_index(ArgRole::OperandGate)));
    const Matrix W3 = batched_matrix_arg(args, rw3, batched);
    if (W3.t->shape != W1.t->shape)
      throw Error(fmt::format("W3 '{}' is {} but W1 '{}' is {}", rw3.name, shape_str(W3.t->shape), rw1.name,
                              shape_str(W1.t->shape)));
    weight(&p.tma_b3, "W3", rw3, W3, kc.w1_kmajor, kc.chunk_n1);
  }
  weight(&p.tma_b2, "W2", rw2, W2, kc.w2_kmajor, kc.tile_n2);
  bind_epilogue(args, {&f, &e}, st.emitted.slots, p, M, N2, kc.tile_m, batched ? B : 0, heads);
  if (kc.decode()) {  // plain views for its loads and stores (the descriptors above checked them)
    if (M > kc.decode_rows)
      throw Error(fmt::format("X '{}' is {}: {} query rows a batch, and this decode kernel holds at most {}: build it "
                              "for this M", rx.name, shape_str(X.t->shape), M, kc.decode_rows));
    if (K != kc.tile_n2 || N2 != kc.tile_n2)  // its lanes hold rows of exactly this head dim
      throw Error(fmt::format("X '{}' is {} and W2 '{}' {}: head dims K = {} and N2 = {}, and this decode kernel was "
                              "built for {}: build it for these", rx.name, shape_str(X.t->shape), rw2.name,
                              shape_str(W2.t->shape), K, N2, kc.tile_n2));
    const RuntimeArg& ro = e.args.at(static_cast<size_t>(e.arg_index(ArgRole::Output)));
    const Matrix O = batched_matrix_arg(args, ro, true);
    auto ref = [&](const Matrix& m) { return runtime_detail::matrix_ref(m.t->data, m.ld, batch_layout(m, heads)); };
    p.b2b_x = ref(X), p.b2b_w1 = ref(W1), p.b2b_w2 = ref(W2), p.b2b_out = ref(O);
  }
  runtime_detail::launch(st.kernel, kc, p, reinterpret_cast<cudaStream_t>(stream), st.max_clusters);
}

// Each kernel gets its own arguments (the intermediates bound to the owned buffers); a name no
// kernel knows is an error, as for one kernel.
void FusedKernel::run_parts(const RunArgs& args, Stream stream) const {
  const State& st = *state_;
  const FusionSpec &f = st.spec, &e = *st.second;
  for (const auto& [name, t] : args.tensors)
    for (const State::Intermediate& i : st.intermediates)
      if (name == i.name)
        throw Error(fmt::format("argument '{}' names an intermediate these kernels hold themselves", name));
  check_names(args, {&f, &e}, "");
  const RuntimeArg& rx = f.args.at(static_cast<size_t>(f.arg_index(ArgRole::OperandA)));
  const int64_t m = matrix_arg(args, rx).shape[0];
  const State::Intermediate& s = st.intermediates.back();
  if (m > s.rows)
    throw Error(fmt::format("X '{}' has {} rows; these {} kernels were built for at most {} (their intermediate '{}' "
                            "holds that many): build them for this M",
                            rx.name, m, st.parts.size(), s.rows, s.name));
  // Each part after the first runs right behind the part before it on the stream, so it may
  // stream its weights (B) while that part still runs, where that part writes none of them.
  std::vector<const DeviceTensor*> prev_outputs;
  std::vector<RunArgs> owns(st.parts.size());
  for (size_t k = 0; k < st.parts.size(); ++k) {
    const FusedKernel& part = st.parts[k];
    RunArgs& own = owns[k];
    std::vector<const DeviceTensor*> weights, outputs;  // into `own`, whose nodes stay put
    for (const RuntimeArg& a : part.spec().args) {
      const auto held = std::find_if(st.intermediates.begin(), st.intermediates.end(),
                                     [&](const State::Intermediate& i) { return i.name == a.name; });
      const DeviceTensor* t = nullptr;  // null: a scalar, or missing (named by run_single)
      if (held != st.intermediates.end())
        t = &(own.tensors[a.name] = DeviceTensor{held->data, held->dtype, {m, held->cols}, 0});
      else if (a.role == ArgRole::Scalar && args.scalars.count(a.name)) own.scalars[a.name] = args.scalars.at(a.name);
      else if (args.tensors.count(a.name)) t = &(own.tensors[a.name] = args.tensors.at(a.name));
      if (t && (a.role == ArgRole::OperandB || a.role == ArgRole::OperandGate)) weights.push_back(t);
      if (t && a.role == ArgRole::Output) outputs.push_back(t);  // tile and per-row outputs alike
    }
    part.run_single(own, stream, k > 0 && runtime_detail::b_before_wait_allowed(weights, prev_outputs));
    prev_outputs = std::move(outputs);
  }
}

FusedKernel compile(const Graph& g, const Bindings& dims, const CompileOptions& opt) {
  LoweringResult r = lower(g);
  if (const B2BCandidate* b = one_b2b_kernel(r)) {
    const FusionSpec &f = r.regions[static_cast<size_t>(b->first_region)].spec,
                     &e = r.regions[static_cast<size_t>(b->second_region)].spec;
    const B2bProblem p = b2b_problem_of(f, e, dims);
    if (choose_b2b(f, e, p, planned_for_this_device(opt.plan)).one_kernel) return FusedKernel::build_b2b(f, e, p, opt);
    return FusedKernel::build_unfused(f, e, dims, opt);
  }
  if (r.regions.size() != 1 || !r.fallbacks.empty())
    throw Error("the graph does not lower to one fused kernel:\n" + describe(g, r));
  const FusionSpec& s = r.regions[0].spec;
  return FusedKernel::build(s, problem_of(s, dims), opt);
}

}  // namespace comfuse
