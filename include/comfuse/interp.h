#pragma once
// CPU reference executors in fp64. Inputs are taken as given (already representable in
// their dtype); rounding to a storage dtype happens at casts and at stored outputs.
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "comfuse/graph.h"
#include "comfuse/lower.h"
#include "comfuse/spec.h"

namespace comfuse {

// A dense row-major fp64 tensor of rank 0..3 (rank 3: a batch of matrices).
struct Tensor {
  std::vector<int64_t> shape;
  std::vector<double> data;
  int64_t numel() const;
  int64_t rows() const { return shape.size() == 2 ? shape[0] : 1; }
  int64_t cols() const { return shape.empty() ? 1 : shape.back(); }
  double at(int64_t r, int64_t c) const;  // broadcasting read for rank 0/1/2 ([N] is a row)
};

using TensorMap = std::map<std::string, Tensor>;  // keyed by graph input / output name

// Random inputs for every graph input, rounded to its dtype, never zero-filled (no
// element is exactly 0). GEMM operands ~ N(0,1) * K^-1/4 (so acc ~ N(0,1)); other rank-2
// tensors ~ N(offset, 1); vectors ([N], [M, 1], [1, N]) ~ offset + U(0.5, 1.5) * random
// sign; scalars ([] or all dims 1) ~ U(0.5, 2). `offset` thus shifts every non-GEMM
// vector/tensor input by a large common amount (e.g. a bias or residual), which gives an
// epilogue like LayerNorm(acc + bias) rows whose mean >> std (a cancellation test).
TensorMap random_inputs(const Graph& g, const Bindings& dims, std::mt19937_64& rng, double offset = 0.0);

// Some rows of a larger problem (reference_rows): the inputs whose row dim (the first, or the
// second of a batched [B, rows, cols]) is `dim` hold
// rows `rows` of the full problem's, and the bindings bind `dim` to rows.size(). A
// position-dependent op (causal_mask) reads each row's index in the full problem from it.
struct RowSample {
  std::string dim;
  std::vector<int64_t> rows;
};

// Executes the whole graph (every op, fused domain or not). Returns the graph outputs.
// `sample`: the inputs are some rows of a larger problem (default: the whole problem).
TensorMap run_graph(const Graph& g, const Bindings& dims, const TensorMap& inputs, const RowSample& sample = {});
// Every node's value (for debugging and for feeding regions), indexed by node id.
std::vector<Tensor> run_graph_all(const Graph& g, const Bindings& dims, const TensorMap& inputs);

// How run_spec reduces a row, mimicking the kernel: the row is cut into tiles of `tile_n`
// columns (one CTA tile each, the last one padded); inside a tile `lanes` threads share
// the row, each holding `frag` consecutive columns per fragment and aggregating its
// columns thread-locally (padded columns contribute the op's identity); lane partials
// then tile partials are combined in a pairwise tree; finalize sees the true length n.
struct ReduceTiling {
  int64_t tile_n = 256;
  int lanes = 4;
  int frag = 2;
  std::optional<double> pad;  // testing only: what padded columns contribute (default: identity)
};
double reduce_row_tiled(ReduceOp op, const double* x, int64_t n, const ReduceTiling& t = {});

// Executes one FusionSpec: acc = A x B in fp64, then the stage chain. `args` maps each
// non-output runtime argument name to its tensor; returns the spec's outputs by name.
TensorMap run_spec(const FusionSpec& s, const Bindings& dims, const TensorMap& args, const ReduceTiling& t = {});

// Executes a lowered graph: regions through run_spec, fallbacks node by node, in
// dependency order (regions may feed fallbacks, fallbacks regions, regions regions).
// A value a region materializes for a consumer outside it is read back as stored
// (rounded to that Output arg's dtype), as the kernels would. Equal to run_graph up to
// fp64 reassociation (and that rounding); that equality is what Φ must preserve.
TensorMap run_lowered(const Graph& g, const LoweringResult& r, const Bindings& dims, const TensorMap& inputs,
                      const ReduceTiling& t = {});

struct Comparison {
  double max_abs = 0, max_rel = 0;  // max |a-b| and max |a-b| / max(|b|, floor), finite elements
  double rel_l2 = 0;                // ||a-b|| / ||b|| over the elements finite on both sides
  // Elements that are NaN or inf on either side. A check with any fails: NaN on both sides
  // (e.g. layer_norm with eps < 0) must not pass as "equal".
  int64_t nonfinite = 0;
  // Of them, the elements whose two sides are not the same non-finite value (one side finite, NaN
  // against inf, or infs of opposite sign): where the reference itself is NaN (a NaN input
  // propagated), a check asks for nonfinite_differ == 0 instead of nonfinite == 0.
  int64_t nonfinite_differ = 0;
};
Comparison compare(const Tensor& got, const Tensor& ref, double rel_floor = 1e-6);

// The rel_l2 by which run_lowered may differ from run_graph on output `o`: fp64
// reassociation (1e-9) where nothing is rounded on the way, else one rounding step of the
// coarsest dtype the value passes through: its own (bf16 4e-3, f16 5e-4) and that of every
// intermediate a region stores and an op outside the region reads back (f32 1e-6 too).
double reference_tolerance(const Graph& g, const LoweringResult& r, const GraphOutput& o);

// ---- What a CPU check can take ---------------------------------------------------------
// Every executor first checks the sizes (check_problem_size in graph.h for each matmul, every
// bound dim in 1..kMaxDimSize) and the memory it would hold.
void check_sizes(const Graph& g, const Bindings& dims);

// The executors hold fp64 tensors and free each intermediate after its last use. An estimate
// of the most bytes `comfuse run --reference` holds at once (the inputs, both executors'
// outputs, twice the largest set of intermediates alive at once: run_lowered's regions also
// copy their arguments), and the budget run_graph and run_lowered refuse beyond, naming it:
// 4 GiB, or COMFUSE_REFERENCE_GIB GiB where set (a machine with the memory: a GPU check of a
// vocabulary-sized row holds its whole fp64 B, 4.2 GB at 128256 x 4096).
inline constexpr int64_t kReferenceMemoryBudget = int64_t{4} << 30;  // 4 GiB
int64_t reference_memory_budget();  // COMFUSE_REFERENCE_GIB, else kReferenceMemoryBudget
int64_t reference_memory_bytes(const Graph& g, const Bindings& dims);
void check_reference_memory(const Graph& g, const Bindings& dims, int64_t budget = reference_memory_budget());

// The rows of M a check compares: all of them for small problems (M x N x K <= 2e9 or M <= 48),
// else 48 (the first 16, 16 spread, the last 16). Valid where every op is row-local in M.
std::vector<int64_t> reference_rows(int64_t m, int64_t n, int64_t k);
// Whether row i of every value of `g` depends only on row i of the inputs indexed by the
// symbol `m` (no transpose or reduction across M, no GEMM B operand indexed by M, M only as
// the first dim), and on the index i itself (a causal mask: run_graph takes the rows' indices
// from its RowSample): then a check of some rows is a check of those rows exactly.
bool row_local(const Graph& g, const std::string& m);

}  // namespace comfuse
