// cuBLAS baseline and batch timing for run_and_check (see baseline.h).
#include "baseline.h"

#include <cublasLt.h>
#include <fmt/format.h>

#include <algorithm>
#include <vector>

namespace comfuse::runtime_detail {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(fmt::format("{}: {}", what, cudaGetErrorString(e)));
}
void check_lt(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) throw Error(fmt::format("cublasLt {}: status {}", what, int(st)));
}

// The spacer of batch_ms: 1 GiB of memset keeps the GPU busy for ~0.3 ms.
struct Spacer {
  void* p = nullptr;
  size_t bytes = size_t{1} << 30;
  Spacer() {
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      cudaGetLastError();
      p = nullptr;  // no room: time without a spacer (host cost may then show)
    }
  }
  ~Spacer() { cudaFree(p); }
};

}  // namespace

double batch_ms(const std::function<void()>& f, int reps) {
  static Spacer spacer;
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  if (spacer.p) check(cudaMemsetAsync(spacer.p, 0, spacer.bytes), "spacer memset");
  check(cudaEventRecord(start), "cudaEventRecord");
  for (int i = 0; i < reps; ++i) f();
  check(cudaEventRecord(stop), "cudaEventRecord");
  check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return double(ms) / reps;
}

struct CublasBaseline::State {
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  const void *a_ptr = nullptr, *b_ptr = nullptr;
  void* c_ptr = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = size_t{32} << 20;
  void run(const cublasLtMatmulAlgo_t& al) {
    const float one = 1.f, zero = 0.f;
    // Column-major view: C^T (N x M) = op(B) (N x K) x A^T (K x M).
    check_lt(cublasLtMatmul(lt, op, &one, b_ptr, a, a_ptr, b, &zero, c_ptr, c, c_ptr, c, &al, workspace,
                            workspace_bytes, nullptr),
             "matmul");
  }
  ~State() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (op) cublasLtMatmulDescDestroy(op);
    if (lt) cublasLtDestroy(lt);
    cudaFree(c_ptr);
    cudaFree(workspace);
  }
};

CublasBaseline::CublasBaseline(const FusionSpec& s, const RunArgs& args) : st_(std::make_unique<State>()) {
  const RuntimeArg& ra = s.args.at(static_cast<size_t>(s.arg_index(ArgRole::OperandA)));
  const RuntimeArg& rb = s.args.at(static_cast<size_t>(s.arg_index(ArgRole::OperandB)));
  const DeviceTensor& A = args.tensors.at(ra.name);
  const DeviceTensor& B = args.tensors.at(rb.name);
  const bool nk = s.b_layout == BLayout::NK;
  // A batched spec's operands are [batches, rows, cols], packed: cuBLAS's strided batched GEMM.
  const size_t r0 = A.shape.size() == 3 ? 1 : 0;
  const uint64_t batches = r0 ? uint64_t(A.shape[0]) : 1;
  const uint64_t m = uint64_t(A.shape[r0]), k = uint64_t(A.shape[r0 + 1]),
                 n = uint64_t(nk ? B.shape[r0] : B.shape[r0 + 1]);
  const cudaDataType_t t = ra.dtype == DType::F16 ? CUDA_R_16F : CUDA_R_16BF;
  State& st = *st_;
  st.a_ptr = A.data, st.b_ptr = B.data;
  check(cudaMalloc(&st.c_ptr, batches * m * n * 2), "cudaMalloc (cuBLAS output)");
  check(cudaMalloc(&st.workspace, st.workspace_bytes), "cudaMalloc (cuBLAS workspace)");
  check_lt(cublasLtCreate(&st.lt), "create");
  check_lt(cublasLtMatmulDescCreate(&st.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
  const cublasOperation_t ta = nk ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(st.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "transa");
  check_lt(cublasLtMatmulDescSetAttribute(st.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "transb");
  // B as stored: N x K row-major = K x N column-major (op T), or K x N row-major = N x K (op N).
  check_lt(cublasLtMatrixLayoutCreate(&st.a, t, nk ? k : n, nk ? n : k, nk ? k : n), "layout B");
  check_lt(cublasLtMatrixLayoutCreate(&st.b, t, k, m, k), "layout A");
  check_lt(cublasLtMatrixLayoutCreate(&st.c, t, n, m, n), "layout C");
  if (batches > 1) {
    const int32_t count = int32_t(batches);
    const int64_t offsets[3] = {int64_t(n * k), int64_t(m * k), int64_t(m * n)};  // B, A, C per batch
    cublasLtMatrixLayout_t layouts[3] = {st.a, st.b, st.c};
    for (int i = 0; i < 3; ++i) {
      check_lt(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
               "batch count");
      check_lt(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &offsets[i],
                                                sizeof(offsets[i])),
               "batch offset");
    }
  }
  cublasLtMatmulPreference_t pref;
  check_lt(cublasLtMatmulPreferenceCreate(&pref), "preference");
  check_lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &st.workspace_bytes,
                                                sizeof(st.workspace_bytes)),
           "workspace");
  cublasLtMatmulHeuristicResult_t res[8];
  int found = 0;
  const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(st.lt, st.op, st.a, st.b, st.c, st.c, pref, 8, res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (hs != CUBLAS_STATUS_SUCCESS || found == 0) throw Error("cublasLt: no algorithm for the baseline GEMM");
  double best = 1e30;
  for (int i = 0; i < found; ++i) {
    st.run(res[i].algo);  // warm-up
    const double ms = batch_ms([&] { st.run(res[i].algo); }, 10);
    if (ms < best) best = ms, st.algo = res[i].algo, algo_ = fmt::format("cublasLt heuristic #{} of {}", i, found);
  }
  check(cudaDeviceSynchronize(), "cuBLAS baseline");
}

CublasBaseline::~CublasBaseline() = default;

void CublasBaseline::run() { st_->run(st_->algo); }

}  // namespace comfuse::runtime_detail
