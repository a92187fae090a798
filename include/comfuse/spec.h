#pragma once
// The Fusion Spec IR  S = <N, E, tau, A, C>  (paper, eq. 10).
//
//   N    `Spec::nodes`, topologically ordered (every operand index < the node's index)
//   E    each node's `operands` (indices into the same Spec's nodes)
//   tau  `Spec::terminal`: the stage's Reduction, or in the last stage its last Store
//   A    `FusionSpec::args`: the runtime-argument table, shared by every nested Spec
//   C    `Spec::children`: nested specs; Reduction node r owns children[r.post], its
//        PostOp: the next stage, entered through Placeholder nodes (the statistic,
//        and bypassed values of the parent stage).
//
// Values in a stage have a shape class: a full Tile (rows x N), a Col (one value per
// row: reduction statistics and what is computed from them), a Row (one per column,
// a broadcast row vector) or a Scalar.
#include <cstdint>
#include <iosfwd>
#include <map>
#include <string>
#include <vector>

#include "comfuse/dtype.h"
#include "comfuse/graph.h"
#include "comfuse/ops.h"

namespace comfuse {

enum class NodeCategory { AccEntry, Broadcast, Compute, Reduction, Placeholder, Store };
enum class ValueClass { Tile, Col, Row, Scalar };
enum class BroadcastKind { Scalar, Row, Col, Tile };  // Scalar: a literal or a runtime scalar arg; Tile: an [M, N] input
// CausalMask: -inf where the element's column lies past its row (ops.h, CausalMaskOp), of a tile.
// RotateHalf: rotary embeddings' rotate_half within each run of FusionSpec::segment columns
// (ops.h, RotateHalfOp), of a tile; RotatePairs: the interleaved rotation (ops.h, RotatePairsOp).
enum class ComputeKind { Unary, Binary, Cast, CausalMask, RotateHalf, RotatePairs };
enum class PlaceholderKind { Stat, Bypass };
// Two reductions of a chain that share one exchange round (pair_kind below).
enum class PairKind { None, MeanVariance, MaxExpSum };
// Which kinds of pairs a kernel exchanges in one round (Plan::fused_pairs, emit).
struct OneRoundPairs {
  bool mean_variance = false, max_exp_sum = false;
  // Max-and-sum-of-exp pairs in one round over one N-tile a job whose PostStage reads the operand
  // only through the exp (pair_keeps_exp) keep the exp they sum in the registers: one exp a value
  // (reduce.cuh kPairGivenKept); PlanOptions::keep_pair_exp = false makes it again after the round.
  bool kept_exp = false;
  bool any() const { return mean_variance || max_exp_sum; }
  bool has(PairKind k) const {
    return (k == PairKind::MeanVariance && mean_variance) || (k == PairKind::MaxExpSum && max_exp_sum);
  }
};

std::string_view name_of(NodeCategory c);
std::string_view name_of(ValueClass c);

struct SpecNode {
  NodeCategory category = NodeCategory::AccEntry;
  ValueClass value_class = ValueClass::Tile;
  std::vector<int> operands;  // E

  // AccEntry: `arg` -1 is A x B; `arg` >= 0 names the OperandGate argument: A x Gate, the gated
  // GEMM's second accumulator (SwiGLU's x W3^T beside x W1^T; a B2B kernel's first GEMM only).
  // Broadcast: `arg` >= 0 names a runtime argument; otherwise the `literal` scalar.
  BroadcastKind broadcast = BroadcastKind::Scalar;
  int arg = -1;
  double literal = 0.0;

  // Compute.
  ComputeKind compute = ComputeKind::Unary;
  UnaryOp unary = UnaryOp::Relu;
  BinaryOp binary = BinaryOp::Add;
  DType cast_to = DType::F32;

  // Reduction (over the row, keepdim): its PostOp is children[post], -1 if none.
  ReduceOp reduce = ReduceOp::Sum;
  int post = -1;

  // Placeholder: Stat = the parent reduction's result; Bypass = parent node `source`.
  PlaceholderKind placeholder = PlaceholderKind::Stat;
  int source = -1;

  // Store: `arg` names the output argument; it rounds to that argument's dtype.

  std::string origin;  // the graph node this came from (diagnostics, explain)
};

struct Spec {
  std::vector<SpecNode> nodes;
  int terminal = -1;
  std::vector<Spec> children;
};

// OperandGate: a second B operand beside OperandB sharing A (a gated GEMM: AccEntry reads A x B,
// GateEntry A x Gate; SwiGLU's x W1^T and x W3^T).
enum class ArgRole { OperandA, OperandB, OperandGate, Scalar, RowVector, ColVector, TileInput, Output };
std::string_view name_of(ArgRole r);

struct RuntimeArg {
  std::string name;        // graph name of the tensor
  ArgRole role = ArgRole::Scalar;
  DType dtype = DType::F32;
  Shape shape;             // symbolic graph shape
  ValueClass value_class = ValueClass::Tile;  // Output only: Tile or Col
  int graph_node = -1;
};

// One fusable region: a GEMM (acc = A x B) and its epilogue spec.
struct FusionSpec {
  std::string name;
  BLayout b_layout = BLayout::NK;
  Dim m, n, k;              // the GEMM's symbolic problem dims
  // A batched GEMM (graph operands [B, M, K] and [B, N, K]): the batch dim B, one GEMM and one
  // epilogue per batch; its Tile and Col values and arguments are [B, M, N] and [B, M, 1].
  // Unset (Dim{}, printed as nothing) when not batched.
  Dim batch;
  bool batched() const { return !batch.sym.empty() || batch.size >= 0; }
  // Segments of N (graph.h Node::segment: heads). Every Reduction of the spec spans each run of
  // `segment` columns instead of the whole row, so its statistic (a Col value) is one per row of
  // a segment; every RotateHalf (RotatePairs) rotates within each run; 0: whole rows, no RotateHalf. The
  // kernel's tiles span whole runs (with reductions one run: KernelConfig::row_segment), which
  // finish their rows alone. An argument whose last dim is `segment` is read periodically
  // (periodic_arg).
  int64_t segment = 0;
  // A gated GEMM: an OperandGate argument (B3) beside OperandB sharing A (KernelConfig::gated).
  bool gated() const { return arg_index(ArgRole::OperandGate) >= 0; }
  std::vector<RuntimeArg> args;  // A
  Spec root;
  // How the user knows the graph values this spec names (args, node origins) that the graph
  // named itself, e.g. "%reduce3" -> "sum(h) inside 's' (line 3)". For messages only: Φ fills
  // it; it is neither printed nor compared.
  std::map<std::string, std::string> user_names;
  // user_names' entry for a graph name, else the name quoted: "'x'".
  std::string describe(const std::string& graph_name) const;

  int arg_index(ArgRole role) const;  // first arg with this role, -1 if none
  // Number of Reduction nodes in the whole nest.
  int reduction_count() const;
  // Stages in the chain (reductions + 1 along the deepest nest).
  int stage_count() const;
  // Reductions that pair with their PostStage's reduction in one exchange round (pair_kind).
  int pair_count(PairKind kind) const;
  // The [M, N] tile inputs the root stage reads (arg indices, in first-read order): what a plan
  // may carry in the mainloop's ring (KernelConfig::ring_input_bytes; emit places them there
  // in this order). A later stage's tile inputs are read from L2.
  std::vector<int> root_tile_inputs() const;
  // Tile stores of PostStages that write through the SMEM staging of a root-stage tile store of
  // the same element size (a stage's k-th store of a size takes the root's k-th of that size):
  // a PostStage runs after the root stage's body, so one buffer serves both (the kernel waits for
  // the root's TMA stores to have read it; nodes.cuh Store's Borrow). Keyed by (stage, node): the
  // root node whose staging it borrows. The planner's SMEM model and Ψ both follow it.
  std::map<std::pair<const Spec*, int>, int> staging_borrows() const;
};

// Whether argument `a` has the spec's segment length as its last dim and is read periodically
// along N (column j reads column j mod segment): a row vector [S] (a per-head norm's gamma) or a
// tile input [M, S] (rotary embeddings' cos and sin, one row per row of the GEMM).
bool periodic_arg(const FusionSpec& s, const RuntimeArg& a);

// Whether reduction `i` of `stage` and its PostStage's reduction form a pair whose statistics
// merge exactly from per-CTA partials, so the device exchanges both in ONE round
// (kernels/comfuse/epilogue/reduce.cuh, kPair*):
//   MeanVariance  a mean, then the mean of (its operand - that mean)^2 (LayerNorm after Φ);
//   MaxExpSum     a max, then the sum of exp(its operand - that max) (softmax, log-softmax).
PairKind pair_kind(const Spec& stage, int i);
// A MaxExpSum pair (node i of stage) whose PostStage reads the max's operand x, the max m and
// x - m only to make exp(x - m): nothing else in that stage, and no stage after it, takes them.
// In one round over one N-tile a CTA, the first stage then leaves exp(x - its CTA's own max) in
// x's registers, and the PostStage makes exp(x - m) from it with a per-row factor
// (reduce.cuh kPairGivenKept): one exp a value, not two.
bool pair_keeps_exp(const Spec& stage, int i);
// A pow node whose exponent is a literal 2, 3 or 4: that exponent (Ψ multiplies instead of
// calling powf); otherwise 0.
int literal_int_exponent(const Spec& stage, const SpecNode& n);
// An add of a tanh and the literal 1 (GPT-2's gelu_new: 0.5 x (1 + tanh(u))): the index of the
// tanh's operand u, which Ψ computes 1 + tanh(u) from as 2 sigmoid(2u) (no cancellation for
// u << 0, and a third of tanhf's instructions); otherwise -1.
int one_plus_tanh_operand(const Spec& stage, const SpecNode& n);
// Whether node i of `stage` is a tanh read, and read only, by such adds (a PostStage bypass is
// a read too): then nothing computes it in the kernel.
bool only_one_plus_tanh_users(const Spec& stage, int i);

// Whether rotate_half node i of `stage` takes its operand x in place (Ψ; kernels' RotateHalf,
// InPlace): each run's first-half fragment computes x there and at its partner once and writes
// both into the accumulator registers, which the second-half fragment reads back, so x's cone
// runs once a value and the raw accumulator need not outlive it. It needs a PostStage (after a
// reduction x's cone holds the norm's scaling, whose recomputation spilled 600+ B on 128-row
// tiles; in the root stage it is a few adds of what the epilogue loads anyway, and writing x
// back spilled 24 B beside a store of x where recomputing spilled none), x computed (not the
// accumulator or a bypassed tile itself: nothing to save), the stage's one rotate_half, no
// effect up to x (a store or a reduction would be skipped where x is read back), no node after x
// reading a value up to x other than x (they are not computed where x is read back) nor the
// accumulator or a parent's value (the registers then hold x), and no PostStage (nothing carried
// on in the registers x overwrites). Otherwise the partner's x is computed again there; after a
// per-segment norm the planner then keeps to 64-row tiles (ptxas spilled on 128: planner.cpp
// segment_tiles).
bool rotate_in_place(const Spec& stage, int i);

// Text form. print() and parse_spec() round-trip: parse_spec(print(s)) == s.
std::string print(const FusionSpec& s);
std::ostream& operator<<(std::ostream& os, const FusionSpec& s);
FusionSpec parse_spec(const std::string& text);  // throws Error with line and column
bool operator==(const FusionSpec& a, const FusionSpec& b);

// Structural checks; throws Error with a precise message (which spec path, which node).
void verify(const FusionSpec& s);

// Read-only traversal of a spec nest (Halide style): override what you need.
class SpecVisitor {
 public:
  virtual ~SpecVisitor() = default;
  // Called for each stage, depth first; `depth` 0 is the root.
  virtual void enter_stage(const Spec& stage, int depth) { (void)stage; (void)depth; }
  virtual void leave_stage(const Spec& stage, int depth) { (void)stage; (void)depth; }
  virtual void visit(const Spec& stage, int index, const SpecNode& node, int depth) {
    (void)stage; (void)index; (void)node; (void)depth;
  }
  // Visits nodes in order, descending into a Reduction's PostOp right after it.
  void walk(const Spec& root, int depth = 0);
};

}  // namespace comfuse
