#pragma once
// The user's computation graph: tensors of rank 0..3 with symbolic or concrete dims (rank 3:
// a leading batch dim, [B, rows, cols]),
// built through a small builder API (or parsed from text, see text.h). Composite ops
// (layer_norm, rms_norm, softmax, log_softmax, l2_normalize) expand into primitives
// here, so every later layer sees primitives only.
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "comfuse/dtype.h"
#include "comfuse/error.h"
#include "comfuse/ops.h"

namespace comfuse {

// A dimension is a symbol ("M", "N", "K", ...) or a concrete extent.
struct Dim {
  std::string sym;    // empty when concrete
  int64_t size = -1;  // >= 0 when concrete
  static Dim of(int64_t n) { return Dim{"", n}; }
  static Dim of(std::string s) { return Dim{std::move(s), -1}; }
  bool is_one() const { return sym.empty() && size == 1; }
  bool operator==(const Dim& o) const { return sym == o.sym && size == o.size; }
  bool operator!=(const Dim& o) const { return !(*this == o); }
  std::string str() const;
};
using Shape = std::vector<Dim>;
std::string to_string(const Shape& s);  // "[M, K]"

// Whether an operand of shape `v` is read periodically against a value of shape `o` whose last
// dim holds runs of `segment` columns (Node::segment): v's last dim is the run and o's is not,
// and v is a vector [S] or has o's leading dims (rotary's [rows, S] against [rows, N]). One rule
// for the graph's shapes (Dim), the fp64 executor's concrete ones (int64_t) and Φ's operands;
// a spec's arguments carry the outcome (spec.h periodic_arg).
template <class D>
bool periodic_operand(const std::vector<D>& v, const std::vector<D>& o, const D& segment) {
  if (v.empty() || o.empty() || v.back() != segment || o.back() == segment) return false;
  return v.size() == 1 || (v.size() == o.size() && std::equal(v.begin(), v.end() - 1, o.begin()));
}

// Concrete values for symbolic dims.
using Bindings = std::map<std::string, int64_t>;
int64_t resolve(const Dim& d, const Bindings& b);  // throws Error naming an unbound symbol

enum class OpKind {
  Input,      // a graph argument: tensor (rank 2, or 3 batched), row/column vector, or runtime scalar
  Constant,   // a literal scalar
  MatMul,     // A[M,K] x B, B given [N,K] (Linear layout, "nk") or [K,N] ("kn"); batched: A[B,M,K] x B[B,N,K] (or [B,K,N]) -> [B,M,N]
  Unary,
  Binary,
  Cast,       // round to a storage dtype
  Reduce,     // over one dim, keepdim; `dim` is -1 for the last dim
  Transpose,  // rank-2 transpose (outside the fusion domain; executed by the reference)
  CausalMask, // -inf where col > row of a matmul's [M, N] output (ops.h, CausalMaskOp)
  RotateHalf, // rotary embeddings' rotate_half within runs of `segment` columns (ops.h, RotateHalfOp)
  RotatePairs,// the interleaved rotation over (even, odd) column pairs (ops.h, RotatePairsOp)
};
std::string_view name_of(OpKind k);

enum class BLayout { NK, KN };

struct Node {
  int id = -1;
  OpKind kind = OpKind::Input;
  std::string name;  // unique within the graph
  DType dtype = DType::F32;  // storage dtype for Input/Cast; compute dtype (f32) otherwise
  Shape shape;
  std::vector<int> inputs;
  UnaryOp unary = UnaryOp::Relu;
  BinaryOp binary = BinaryOp::Add;
  ReduceOp reduce = ReduceOp::Sum;
  int reduce_dim = -1;  // -1 or rank-1: last dim (fusable); otherwise another dim
  // Segments of the last dim (heads: per-head norms such as Qwen 3's and Gemma 3's q/k norms,
  // rotary embeddings). A Reduce with segment S > 0 reduces each run of S consecutive columns of
  // the last dim and keeps its operand's shape: every column holds its run's statistic. A
  // RotateHalf rotates within each run. Any other node carries the segment of the per-segment
  // ops it is computed from, or the one a binary names (0: none), so an operand whose last dim
  // is S (a row vector [S], or rows [M, S] such as rotary cos/sin) broadcasts against it
  // periodically (column j reads column j mod S).
  int64_t segment = 0;
  double value = 0.0;   // Constant
  BLayout b_layout = BLayout::NK;
  SourceLoc loc;        // where the text format defined it, if it did
};

struct GraphOutput {
  int node = -1;
  std::string name;
  DType dtype = DType::F32;  // rounding applied when stored
  SourceLoc loc;             // where the text format declared it, if it did
};

class Graph;

// A handle to a node, with operator sugar for the builder API.
struct Value {
  Graph* graph = nullptr;
  int id = -1;
  const Node& node() const;
};
Value operator+(Value a, Value b);
Value operator-(Value a, Value b);
Value operator*(Value a, Value b);
Value operator/(Value a, Value b);
Value operator+(Value a, double b);
Value operator-(Value a, double b);
Value operator*(Value a, double b);
Value operator/(Value a, double b);

class Graph {
 public:
  // Inputs. `shape` may be rank 0 (runtime scalar), 1 (vector), 2 or 3 ([B, rows, cols]: a batch).
  Value input(const std::string& name, DType dtype, Shape shape);
  Value constant(double v);

  // Rank-2 operands, or rank 3 with the same leading (batch) dim: one GEMM per batch.
  Value matmul(Value a, Value b, BLayout layout = BLayout::NK);
  Value unary(UnaryOp op, Value x);
  Value binary(BinaryOp op, Value a, Value b);
  Value binary(BinaryOp op, Value a, double b) { return binary(op, a, constant(b)); }
  // The same over runs of `segment` columns (Node::segment): an operand whose last dim is
  // `segment` ([S] or [M, S]) reads column j mod S against the other's last dim.
  Value binary(BinaryOp op, Value a, Value b, int64_t segment);
  Value cast(Value x, DType to);
  // `segment` > 0: over each run of that many columns of the last dim (Node::segment).
  Value reduce(ReduceOp op, Value x, int dim = -1, int64_t segment = 0);
  Value transpose(Value x);
  // The causal mask of attention scores (ops.h, CausalMaskOp): -inf where the column (key) lies
  // past the row (query). `x` must be a tile [M, N] of a matmul's output or computed from one
  // (e.g. matmul(q, k) * scale): the mask reads the element's row and column in that output.
  Value causal_mask(Value x);
  // rotate_half within each run of `segment` columns of x's last dim (ops.h, RotateHalfOp).
  Value rotate_half(Value x, int64_t segment);
  // The interleaved rotation over column pairs (ops.h, RotatePairsOp), of heads of `segment`
  // columns (their cos and sin then read periodically).
  Value rotate_pairs(Value x, int64_t segment);

  // Composites (expanded into primitives). gamma/beta may be absent (id -1). `segment` > 0
  // normalizes each run of that many columns (a per-head norm; gamma/beta then have `segment`
  // elements, shared by every run); so do the softmaxes and l2_normalize.
  Value layer_norm(Value x, Value gamma, Value beta, double eps = 1e-5, int64_t segment = 0);
  Value rms_norm(Value x, Value gamma, double eps = 1e-6, int64_t segment = 0);
  Value softmax(Value x, int64_t segment = 0);
  Value log_softmax(Value x, int64_t segment = 0);
  Value l2_normalize(Value x, double eps = 1e-12, int64_t segment = 0);
  // Rotary position embeddings over heads of `segment` columns: x * cos + rotate_half(x) * sin,
  // cos and sin [rows, segment] (one row per row of x) or [segment], read periodically;
  // `interleaved`: rotate_pairs(x) instead (GPT-J's and Cohere's layout).
  Value rope(Value x, Value cos, Value sin, int64_t segment, bool interleaved = false);

  void output(Value v, const std::string& name, DType dtype);

  // Where the next nodes come from (the text parser sets this per line).
  void set_location(SourceLoc loc) { loc_ = loc; }
  // Name the node behind `v` (the text parser names each line's result).
  void rename(Value v, const std::string& name);

  const std::vector<Node>& nodes() const { return nodes_; }
  const Node& node(int id) const { return nodes_.at(static_cast<size_t>(id)); }
  const std::vector<GraphOutput>& outputs() const { return outputs_; }
  int find(const std::string& name) const;  // -1 when absent
  // Consumers of each node, in id order.
  std::vector<std::vector<int>> consumers() const;

 private:
  void check_norm_eps(const char* op, double eps) const;  // throws where eps is negative or not finite
  Value add_node(Node n);
  std::string fresh_name(const std::string& stem);
  Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view what) const;
  // rotate_half's and rotate_pairs' node (`kind`), checked: x's last dim in whole runs of an even segment.
  Value rotation(OpKind kind, std::string_view what, Value x, int64_t segment);
  // The segment a node computed from a and b carries (Node::segment); throws where they differ.
  int64_t joint_segment(const Node& a, const Node& b, std::string_view what) const;

  std::vector<Node> nodes_;
  std::unordered_map<std::string, int> by_name_;  // keeps find() O(1): parsers call it per statement
  std::vector<GraphOutput> outputs_;
  SourceLoc loc_{};
  int name_counter_ = 0;
};

// How the user knows each node, for messages and listings (indexed by node id): "'y'" for a
// node the user named or stores as output 'y'; for one a composite or a nested expression made
// (named "%reduce3" inside, in no file), the expression computing it in the user's names and the
// named statement it belongs to, e.g. "mean(h) inside 'y' (line 5)", or, in a graph without
// lines (the API's), the named value it feeds ("sum(exp(sub(..., ...))) feeding 's'").
// SourceLines::Omit leaves the "(line 5)" out, for a message that an Error already places at
// the node's own line.
enum class SourceLines { Say, Omit };
std::vector<std::string> user_descriptions(const Graph& g, SourceLines lines = SourceLines::Say);
// The user's name for a node: its own, else the output it is stored as; empty for a temporary.
std::string given_name(const Graph& g, int id);
// A node in a list: its given name, else its expression one call deep ("mean(h)", "sub(x, ...)").
std::string short_name(const Graph& g, int id);
// Node n as the text format calls its op on `args` (its operands' texts, in order), keyword
// arguments included: "sum(x, dim=0)", "rotate_half(q, segment=64)". The one spelling of every
// op for print_graph (text/graph_text.cpp) and the expressions of user_descriptions. Not for
// inputs and constants (no call).
std::string call_text(const Graph& g, const Node& n, const std::vector<std::string>& args);
// Whether a name is one the graph made up ("%reduce3"), not one the user gave.
bool made_up_name(std::string_view name);
// Whether n's name is one the user gave.
bool user_named(const Node& n);

// ---- Problem sizes (src/graph/problem.cpp) --------------------------------------------
// One rule for every path that takes concrete sizes (the planner, the CPU executors): each
// dim is at least 1 and at most kMaxDimSize, and a GEMM's M x N output is at most
// kMaxTiles64 tiles of 64 x 64. Why: the kernel holds M, N and K in int32
// (kernels/comfuse/params.cuh), rounds M and N up to whole tiles of up to 256 in int32 and
// numbers the tiles in int32 (scheduler/tile_scheduler.cuh), looking a few rounds of the grid's
// groups past the last (hence the margin of 4096); TMA coordinates are int32.
inline constexpr int64_t kMaxDimSize = (int64_t{1} << 31) - 256;  // 2147483392
inline constexpr int64_t kMaxTiles64 = (int64_t{1} << 31) - 4096;  // ceil(M/64) * ceil(N/64)
inline constexpr bool dim_size_ok(int64_t v) { return v >= 1 && v <= kMaxDimSize; }
// Throws unless dim_size_ok(v); `name` says which dim ("M", "N (D)", "'K'").
void check_dim_size(const std::string& name, int64_t v);
void check_problem_size(int64_t m, int64_t n, int64_t k, const std::string& m_name = "M",
                        const std::string& n_name = "N", const std::string& k_name = "K");
// "M" for a GEMM dim whose symbol is M (or concrete), "N (D)" when the graph calls it D.
std::string dim_label(const Dim& d, const std::string& role);

}  // namespace comfuse
