#include "comfuse/graph.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <unordered_map>

namespace comfuse {

std::string Dim::str() const { return sym.empty() ? std::to_string(size) : sym; }

std::string to_string(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + s[i].str();
  return out + "]";
}

int64_t resolve(const Dim& d, const Bindings& b) {
  if (d.sym.empty()) return d.size;
  auto it = b.find(d.sym);
  if (it == b.end()) throw Error(fmt::format("dimension '{}' has no value (bind it, e.g. --shape or --dim {}=...)", d.sym, d.sym));
  return it->second;
}

std::string_view name_of(OpKind k) {
  switch (k) {
    case OpKind::Input: return "input";
    case OpKind::Constant: return "const";
    case OpKind::MatMul: return "matmul";
    case OpKind::Unary: return "unary";
    case OpKind::Binary: return "binary";
    case OpKind::Cast: return "cast";
    case OpKind::Reduce: return "reduce";
    case OpKind::Transpose: return "transpose";
    case OpKind::CausalMask: return CausalMaskOp::name;
    case OpKind::RotateHalf: return RotateHalfOp::name;
    case OpKind::RotatePairs: return RotatePairsOp::name;
  }
  return "?";
}

const Node& Value::node() const { return graph->node(id); }

Value operator+(Value a, Value b) { return a.graph->binary(BinaryOp::Add, a, b); }
Value operator-(Value a, Value b) { return a.graph->binary(BinaryOp::Sub, a, b); }
Value operator*(Value a, Value b) { return a.graph->binary(BinaryOp::Mul, a, b); }
Value operator/(Value a, Value b) { return a.graph->binary(BinaryOp::Div, a, b); }
Value operator+(Value a, double b) { return a.graph->binary(BinaryOp::Add, a, b); }
Value operator-(Value a, double b) { return a.graph->binary(BinaryOp::Sub, a, b); }
Value operator*(Value a, double b) { return a.graph->binary(BinaryOp::Mul, a, b); }
Value operator/(Value a, double b) { return a.graph->binary(BinaryOp::Div, a, b); }

int Graph::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : it->second;
}

std::vector<std::vector<int>> Graph::consumers() const {
  std::vector<std::vector<int>> out(nodes_.size());
  for (const Node& n : nodes_)
    for (int in : n.inputs)
      if (out[in].empty() || out[in].back() != n.id) out[in].push_back(n.id);
  return out;
}

std::string Graph::fresh_name(const std::string& stem) {
  for (;;) {
    std::string name = fmt::format("%{}{}", stem, name_counter_++);
    if (find(name) < 0) return name;
  }
}

Value Graph::add_node(Node n) {
  n.id = static_cast<int>(nodes_.size());
  n.loc = loc_;
  if (n.name.empty()) n.name = fresh_name(std::string(name_of(n.kind)));
  by_name_[n.name] = n.id;
  nodes_.push_back(std::move(n));
  return Value{this, nodes_.back().id};
}

void Graph::rename(Value v, const std::string& name) {
  if (name.empty()) throw Error(loc_, "empty name");
  int other = find(name);
  if (other >= 0 && other != v.id) throw Error(loc_, fmt::format("name '{}' is already defined", name));
  // Outputs and inputs bind by name at run time: one name, one tensor.
  for (const GraphOutput& o : outputs_)
    if (o.name == name && o.node != v.id)
      throw Error(loc_, fmt::format("name '{}' is already the name of an output (of '{}')", name, node(o.node).name));
  Node& n = nodes_.at(static_cast<size_t>(v.id));
  by_name_.erase(n.name);
  n.name = name;
  by_name_[name] = v.id;
}

static void check_handle(const Graph* g, Value v, std::string_view what, SourceLoc loc) {
  if (v.graph != g || v.id < 0 || v.id >= static_cast<int>(g->nodes().size()))
    throw Error(loc, fmt::format("{}: operand is not a value of this graph", what));
}

Shape Graph::broadcast_shapes(const Shape& a, const Shape& b, std::string_view what) const {
  const size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    const Dim* da = i < rank - a.size() ? nullptr : &a[i - (rank - a.size())];
    const Dim* db = i < rank - b.size() ? nullptr : &b[i - (rank - b.size())];
    if (!da) out[i] = *db;
    else if (!db) out[i] = *da;
    else if (*da == *db || db->is_one()) out[i] = *da;
    else if (da->is_one()) out[i] = *db;
    else
      throw Error(loc_, fmt::format("shape mismatch in {}: {} and {} do not broadcast", what,
                                    to_string(a), to_string(b)));
  }
  return out;
}

Value Graph::input(const std::string& name, DType dtype, Shape shape) {
  // Rank 3 is a batch of matrices [B, rows, cols] (batched matmul operands, their epilogue
  // values): the leading dim is the batch, the last two are a matrix as in rank 2.
  if (shape.size() > 3)
    throw Error(loc_, fmt::format("input '{}': rank {} is not supported (at most 3: [B, rows, cols], a leading batch "
                                  "dim)", name, shape.size()));
  for (const Dim& d : shape)
    if (d.sym.empty() && d.size <= 0)
      throw Error(loc_, fmt::format("input '{}': dimension {} must be positive", name, d.size));
  Node n;
  n.kind = OpKind::Input;
  n.dtype = dtype;
  n.shape = std::move(shape);
  Value v = add_node(std::move(n));
  rename(v, name);
  return v;
}

Value Graph::constant(double v) {
  Node n;
  n.kind = OpKind::Constant;
  n.value = v;
  return add_node(std::move(n));
}

Value Graph::matmul(Value a, Value b, BLayout layout) {
  check_handle(this, a, "matmul", loc_);
  check_handle(this, b, "matmul", loc_);
  const Node &na = node(a.id), &nb = node(b.id);
  auto who = [&](const Node& x) {
    return user_named(x) ? fmt::format("'{}' {}", x.name, to_string(x.shape))
                         : fmt::format("{} {}", short_name(*this, x.id), to_string(x.shape));
  };
  // Rank 2: one GEMM. Rank 3: a batched matmul, one GEMM per index of the shared leading dim.
  const size_t ra = na.shape.size(), rb = nb.shape.size();
  if (ra == 3 && rb == 2)
    throw Error(loc_, fmt::format("matmul: A {} is batched but B {} is not: a batched matmul takes one B per batch "
                                  "([B, N, K]); for one B shared by every batch, flatten A's batch into its rows "
                                  "([B*M, K])", who(na), who(nb)));
  if (ra == 2 && rb == 3)
    throw Error(loc_, fmt::format("matmul: B {} is batched but A {} is not: a batched matmul takes both operands "
                                  "with the same leading batch dim", who(nb), who(na)));
  if ((ra != 2 && ra != 3) || rb != ra)
    throw Error(loc_, fmt::format("matmul needs rank-2 operands (or rank 3 with a leading batch dim), got {} and {}",
                                  to_string(na.shape), to_string(nb.shape)));
  if (ra == 3 && na.shape[0] != nb.shape[0])
    throw Error(loc_, fmt::format("matmul: batch dims differ: A {} and B {}; a batched matmul's operands share their "
                                  "leading (batch) dim", who(na), who(nb)));
  const size_t r0 = ra - 2, r1 = ra - 1;  // the matrix dims
  const Dim& k_a = na.shape[r1];
  const Dim& k_b = layout == BLayout::NK ? nb.shape[r1] : nb.shape[r0];
  const Dim& n_b = layout == BLayout::NK ? nb.shape[r0] : nb.shape[r1];
  if (k_a != k_b)
    throw Error(loc_, fmt::format("matmul: contraction dims differ: A is {} and B ({}) is {}", to_string(na.shape),
                                  layout == BLayout::NK ? "N x K" : "K x N", to_string(nb.shape)));
  Node n;
  n.kind = OpKind::MatMul;
  n.inputs = {a.id, b.id};
  n.shape = ra == 3 ? Shape{na.shape[0], na.shape[r0], n_b} : Shape{na.shape[r0], n_b};
  n.dtype = DType::F32;  // fp32 accumulation
  n.b_layout = layout;
  return add_node(std::move(n));
}

Value Graph::unary(UnaryOp op, Value x) {
  check_handle(this, x, name_of(op), loc_);
  Node n;
  n.kind = OpKind::Unary;
  n.unary = op;
  n.inputs = {x.id};
  n.shape = node(x.id).shape;
  n.segment = node(x.id).segment;
  return add_node(std::move(n));
}

int64_t Graph::joint_segment(const Node& a, const Node& b, std::string_view what) const {
  if (a.segment && b.segment && a.segment != b.segment)
    throw Error(loc_, fmt::format("{}: its operands are computed over runs of {} and of {} columns (segments); one "
                                  "value takes one segment length",
                                  what, a.segment, b.segment));
  return a.segment ? a.segment : b.segment;
}

Value Graph::binary(BinaryOp op, Value a, Value b) { return binary(op, a, b, 0); }

Value Graph::binary(BinaryOp op, Value a, Value b, int64_t segment) {
  check_handle(this, a, name_of(op), loc_);
  check_handle(this, b, name_of(op), loc_);
  if (op == BinaryOp::Pow && !node(b.id).shape.empty())
    throw Error(loc_, fmt::format("pow: the exponent must be a scalar, got shape {}", to_string(node(b.id).shape)));
  if (segment < 0) throw Error(loc_, fmt::format("{}: segment = {} is not a positive column count", name_of(op), segment));
  Node n;
  n.kind = OpKind::Binary;
  n.binary = op;
  n.inputs = {a.id, b.id};
  n.segment = joint_segment(node(a.id), node(b.id), name_of(op));
  if (segment) {
    Node named;
    named.segment = segment;
    n.segment = joint_segment(n, named, name_of(op));
  }
  // An operand of `segment` columns against a segmented value of more: periodic along its last
  // dim (Node::segment), e.g. a per-head norm's gamma of head_dim elements ([S]) or rotary
  // embeddings' cos and sin ([rows, S]). Where the segment is the binary's own, the other's
  // last dim may be unsegmented so far (rotary's x * cos comes before rotate_half).
  auto periodic = [&](const Node& p, const Node& other) {
    return n.segment > 0 && (other.segment == n.segment || segment == n.segment) &&
           periodic_operand(p.shape, other.shape, Dim::of(n.segment));
  };
  const Node &na = node(a.id), &nb = node(b.id);
  if (periodic(nb, na) || periodic(na, nb)) {
    const Node& other = periodic(nb, na) ? na : nb;
    const Dim& last = other.shape.back();
    if (last.sym.empty() && last.size % n.segment != 0)
      throw Error(loc_, fmt::format("{}: the last dim of {} is not a whole number of segments of {}", name_of(op),
                                    to_string(other.shape), n.segment));
    n.shape = other.shape;
  } else {
    // A named segment with no operand of its length (rope's cos of another width than the head).
    if (segment && !na.shape.empty() && !nb.shape.empty() && na.shape.back() != nb.shape.back() &&
        !na.shape.back().is_one() && !nb.shape.back().is_one())
      throw Error(loc_, fmt::format("{} with segment={}: operands {} and {}; the one read periodically has a last dim "
                                    "of the segment ({}), the other a whole number of segments",
                                    name_of(op), segment, to_string(na.shape), to_string(nb.shape), segment));
    n.shape = broadcast_shapes(na.shape, nb.shape, name_of(op));
  }
  return add_node(std::move(n));
}

Value Graph::cast(Value x, DType to) {
  check_handle(this, x, "cast", loc_);
  Node n;
  n.kind = OpKind::Cast;
  n.dtype = to;
  n.inputs = {x.id};
  n.shape = node(x.id).shape;
  n.segment = node(x.id).segment;
  return add_node(std::move(n));
}

Value Graph::reduce(ReduceOp op, Value x, int dim, int64_t segment) {
  check_handle(this, x, name_of(op), loc_);
  const Shape& s = node(x.id).shape;
  const int rank = static_cast<int>(s.size());
  if (rank == 0) throw Error(loc_, fmt::format("{}: cannot reduce a scalar", name_of(op)));
  if (dim < -rank || dim >= rank)
    throw Error(loc_, fmt::format("{}: dim {} is out of range for shape {}", name_of(op), dim, to_string(s)));
  if (dim < 0) dim += rank;
  Node n;
  n.kind = OpKind::Reduce;
  n.reduce = op;
  n.reduce_dim = dim;
  n.inputs = {x.id};
  n.shape = s;
  if (segment != 0) {
    const Dim& last = s.back();
    if (segment < 0) throw Error(loc_, fmt::format("{}: segment = {} is not a positive column count", name_of(op), segment));
    if (dim != rank - 1)
      throw Error(loc_, fmt::format("{}: segments run along the last dim; dim {} of {} is not it", name_of(op), dim,
                                    to_string(s)));
    if (last.sym.empty() && last.size % segment != 0)
      throw Error(loc_, fmt::format("{}: the last dim of {} is not a whole number of segments of {}", name_of(op),
                                    to_string(s), segment));
    if (node(x.id).segment && node(x.id).segment != segment)
      throw Error(loc_, fmt::format("{}: segments of {} columns over a value computed from segments of {}", name_of(op),
                                    segment, node(x.id).segment));
    n.segment = segment;  // the shape stays: each column holds its segment's statistic
  } else {
    n.shape[static_cast<size_t>(dim)] = Dim::of(1);
  }
  return add_node(std::move(n));
}

Value Graph::transpose(Value x) {
  check_handle(this, x, "transpose", loc_);
  const Shape& s = node(x.id).shape;
  if (s.size() != 2) throw Error(loc_, fmt::format("transpose needs a rank-2 tensor, got {}", to_string(s)));
  Node n;
  n.kind = OpKind::Transpose;
  n.inputs = {x.id};
  n.shape = {s[1], s[0]};
  return add_node(std::move(n));
}

Value Graph::causal_mask(Value x) {
  check_handle(this, x, CausalMaskOp::name, loc_);
  const Shape& s = node(x.id).shape;
  auto who = [&] {  // the operand as the user wrote it: by name, or the nested expression
    const Node& in = node(x.id);
    return user_named(in) ? fmt::format("'{}'", in.name) : short_name(*this, x.id);
  };
  if (s.size() != 2 && s.size() != 3)
    throw Error(loc_, fmt::format("{}: {} has shape {}; the mask applies to a tile [M, N] of a matmul's output "
                                  "(rows: queries, columns: keys; [B, M, N] when batched)",
                                  CausalMaskOp::name, who(), to_string(s)));
  // The matmuls x is computed from (ids are topological: inputs precede their users).
  std::vector<bool> upstream(nodes_.size(), false);
  upstream[static_cast<size_t>(x.id)] = true;
  bool from_matmul = false, tile = false;
  for (int id = x.id; id >= 0; --id) {
    if (!upstream[static_cast<size_t>(id)]) continue;
    const Node& n = node(id);
    if (n.kind == OpKind::MatMul) {
      from_matmul = true;
      tile = tile || n.shape == s;
    }
    for (int in : n.inputs) upstream[static_cast<size_t>(in)] = true;
  }
  if (!from_matmul)
    throw Error(loc_, fmt::format("{}: {} is not computed from a matmul; the mask applies to a tile [M, N] of a "
                                  "matmul's output, e.g. the scores matmul(q, k)",
                                  CausalMaskOp::name, who()));
  if (!tile)
    throw Error(loc_, fmt::format("{}: {} has shape {}, which is not the output shape of a matmul it is computed from; "
                                  "the mask applies to a tile [M, N] of a matmul's output",
                                  CausalMaskOp::name, who(), to_string(s)));
  Node n;
  n.kind = OpKind::CausalMask;
  n.inputs = {x.id};
  n.shape = s;
  return add_node(std::move(n));
}

Value Graph::rotation(OpKind kind, std::string_view what, Value x, int64_t segment) {
  check_handle(this, x, what, loc_);
  const Node& in = node(x.id);
  const Shape& s = in.shape;
  if (s.empty())
    throw Error(loc_, fmt::format("{}: cannot rotate a scalar; it rotates runs of columns of the last dim", what));
  if (segment <= 0 || segment % 2 != 0)
    throw Error(loc_, fmt::format("{}: segment = {} is not a positive even column count (each run's halves swap)",
                                  what, segment));
  const Dim& last = s.back();
  if (last.sym.empty() && last.size % segment != 0)
    throw Error(loc_, fmt::format("{}: the last dim of {} is not a whole number of segments of {}", what, to_string(s),
                                  segment));
  if (in.segment && in.segment != segment)
    throw Error(loc_, fmt::format("{}: segments of {} columns over a value computed from segments of {}", what, segment,
                                  in.segment));
  Node n;
  n.kind = kind;
  n.inputs = {x.id};
  n.shape = s;
  n.segment = segment;
  return add_node(std::move(n));
}

Value Graph::rotate_half(Value x, int64_t segment) {
  return rotation(OpKind::RotateHalf, RotateHalfOp::name, x, segment);
}

Value Graph::rotate_pairs(Value x, int64_t segment) {
  return rotation(OpKind::RotatePairs, RotatePairsOp::name, x, segment);
}

Value Graph::rope(Value x, Value cos, Value sin, int64_t segment, bool interleaved) {
  Value rotated = interleaved ? rotate_pairs(x, segment) : rotate_half(x, segment);
  return binary(BinaryOp::Add, binary(BinaryOp::Mul, x, cos, segment), binary(BinaryOp::Mul, rotated, sin, segment));
}

// A norm's eps is a finite number >= 0, as torch documents it: layer_norm and rms_norm take the
// rsqrt of var + eps (a negative eps: NaN in every row whose variance is below -eps), and
// l2_normalize clamps the sum of squares at eps^2 (a negative eps would act as |eps|).
void Graph::check_norm_eps(const char* op, double eps) const {
  if (!std::isfinite(eps) || eps < 0)
    throw Error(loc_, fmt::format("{}: eps = {} is not a finite number >= 0", op, eps));
}

// Composites. Numerics follow DESIGN.md: variance of (x - mean), softmax subtracts the max.
Value Graph::layer_norm(Value x, Value gamma, Value beta, double eps, int64_t segment) {
  check_norm_eps("layer_norm", eps);
  Value mean = reduce(ReduceOp::Mean, x, -1, segment);
  Value centered = x - mean;
  Value var = reduce(ReduceOp::Mean, unary(UnaryOp::Square, centered), -1, segment);
  Value y = centered * unary(UnaryOp::Rsqrt, var + eps);
  if (gamma.id >= 0) y = y * gamma;
  if (beta.id >= 0) y = y + beta;
  return y;
}

Value Graph::rms_norm(Value x, Value gamma, double eps, int64_t segment) {
  check_norm_eps("rms_norm", eps);
  Value ms = reduce(ReduceOp::Mean, unary(UnaryOp::Square, x), -1, segment);
  Value y = x * unary(UnaryOp::Rsqrt, ms + eps);
  if (gamma.id >= 0) y = y * gamma;
  return y;
}

Value Graph::softmax(Value x, int64_t segment) {
  Value shifted = x - reduce(ReduceOp::Max, x, -1, segment);
  Value e = unary(UnaryOp::Exp, shifted);
  return e / reduce(ReduceOp::Sum, e, -1, segment);
}

Value Graph::log_softmax(Value x, int64_t segment) {
  Value shifted = x - reduce(ReduceOp::Max, x, -1, segment);
  Value lse = unary(UnaryOp::Log, reduce(ReduceOp::Sum, unary(UnaryOp::Exp, shifted), -1, segment));
  return shifted - lse;
}

Value Graph::l2_normalize(Value x, double eps, int64_t segment) {
  check_norm_eps("l2_normalize", eps);
  Value ss = reduce(ReduceOp::Sum, unary(UnaryOp::Square, x), -1, segment);
  return x * unary(UnaryOp::Rsqrt, binary(BinaryOp::Max, ss, eps * eps));
}

void Graph::output(Value v, const std::string& name, DType dtype) {
  check_handle(this, v, "output", loc_);
  if (name.empty()) throw Error(loc_, "an output needs a name");
  for (const GraphOutput& o : outputs_)
    if (o.name == name) throw Error(loc_, fmt::format("output '{}' is declared twice", name));
  // Arguments bind by name at run time: an output named like another value (an input above
  // all) would alias it, e.g. one buffer as both operand A and the output.
  if (const int other = find(name); other >= 0 && other != v.id) {
    const Node& o = node(other);
    throw Error(loc_, fmt::format("output name '{}' is already the name of {} '{}'{}; give the output its own name",
                                  name, o.kind == OpKind::Input ? "the input" : "the value", name,
                                  o.loc.known() ? fmt::format(" (line {})", o.loc.line) : std::string()));
  }
  outputs_.push_back(GraphOutput{v.id, name, dtype, loc_});
}

bool made_up_name(std::string_view name) { return !name.empty() && name[0] == '%'; }
bool user_named(const Node& n) { return !n.name.empty() && !made_up_name(n.name); }

std::string given_name(const Graph& g, int id) {
  if (user_named(g.node(id))) return g.node(id).name;
  for (const GraphOutput& o : g.outputs())
    if (o.node == id) return o.name;
  return "";
}

namespace {

// A value as the expression computing it in the user's names, temporaries `depth` calls deep at
// most ("..." below): a made-up name ("%reduce4") is in no file.
std::string expression(const Graph& g, int id, int depth) {
  const Node& n = g.node(id);
  if (std::string name = given_name(g, id); !name.empty()) return name;
  if (n.kind == OpKind::Input) return n.name;
  if (n.kind == OpKind::Constant) return fmt::format("{}", n.value);
  if (depth == 0) return "...";
  std::vector<std::string> args;
  for (int in : n.inputs) args.push_back(expression(g, in, depth - 1));
  return call_text(g, n, args);
}

}  // namespace

std::string call_text(const Graph& g, const Node& n, const std::vector<std::string>& args) {
  auto arg = [&](size_t i) -> const std::string& { return args.at(i); };
  // A segment neither operand carries is a binary's own (a periodic operand against an
  // unsegmented value); a per-segment reduction or rotation reads like a whole-row one without it.
  const std::string segment = n.segment ? fmt::format(", segment={}", n.segment) : "";
  switch (n.kind) {
    case OpKind::Input:
    case OpKind::Constant: break;
    case OpKind::Unary: return fmt::format("{}({})", name_of(n.unary), arg(0));
    case OpKind::Binary: {
      const bool own = n.segment > 0 && g.node(n.inputs.at(0)).segment != n.segment &&
                       g.node(n.inputs.at(1)).segment != n.segment;
      return fmt::format("{}({}, {}{})", name_of(n.binary), arg(0), arg(1), own ? segment : "");
    }
    case OpKind::Reduce: {
      const bool last = n.reduce_dim == -1 || n.reduce_dim == static_cast<int>(n.shape.size()) - 1;
      return fmt::format("{}({}{}{})", name_of(n.reduce), arg(0), last ? "" : fmt::format(", dim={}", n.reduce_dim),
                         segment);
    }
    case OpKind::Cast: return fmt::format("cast({}, {})", arg(0), name_of(n.dtype));
    case OpKind::MatMul:
      return fmt::format("matmul({}, {}{})", arg(0), arg(1), n.b_layout == BLayout::KN ? ", layout=kn" : "");
    case OpKind::Transpose: return fmt::format("transpose({})", arg(0));
    case OpKind::CausalMask: return fmt::format("{}({})", CausalMaskOp::name, arg(0));
    case OpKind::RotateHalf: return fmt::format("{}({}{})", RotateHalfOp::name, arg(0), segment);
    case OpKind::RotatePairs: return fmt::format("{}({}{})", RotatePairsOp::name, arg(0), segment);
  }
  throw Error(fmt::format("call_text: node {} ({}) is not an op call", n.id, n.name));
}

std::vector<std::string> user_descriptions(const Graph& g, SourceLines lines) {
  const auto& nodes = g.nodes();
  const auto consumers = g.consumers();
  std::vector<std::string> given(nodes.size());
  for (const Node& n : nodes) given[static_cast<size_t>(n.id)] = given_name(g, n.id);
  // The named statement of each source line (the text format: one statement per line).
  std::unordered_map<int, int> named_on_line;
  for (const Node& n : nodes)
    if (user_named(n) && n.loc.known()) named_on_line.emplace(n.loc.line, n.id);
  // The nearest named value each node feeds (ids are topological: consumers come later).
  std::vector<int> feeds(nodes.size(), -1);
  for (int id = static_cast<int>(nodes.size()) - 1; id >= 0; --id)
    for (int c : consumers[static_cast<size_t>(id)]) {
      feeds[static_cast<size_t>(id)] = !given[static_cast<size_t>(c)].empty() ? c : feeds[static_cast<size_t>(c)];
      if (feeds[static_cast<size_t>(id)] >= 0) break;
    }
  std::vector<std::string> out(nodes.size());
  for (const Node& n : nodes) {
    std::string& d = out[static_cast<size_t>(n.id)];
    if (!given[static_cast<size_t>(n.id)].empty()) {
      d = fmt::format("'{}'", given[static_cast<size_t>(n.id)]);
      continue;
    }
    // A literal alone reads as a number: say what it is.
    const std::string what =
        n.kind == OpKind::Constant ? fmt::format("the constant {}", n.value) : expression(g, n.id, 3);
    const std::string line = lines == SourceLines::Say ? fmt::format(" (line {})", n.loc.line) : std::string();
    if (auto it = named_on_line.find(n.loc.line); n.loc.known() && it != named_on_line.end())
      d = fmt::format("{} inside '{}'{}", what, g.node(it->second).name, line);
    else if (const int f = feeds[static_cast<size_t>(n.id)]; f >= 0)
      d = fmt::format("{} feeding '{}'", what, given[static_cast<size_t>(f)]);
    else if (n.loc.known())
      d = what + line;
    else
      d = what;
  }
  return out;
}

std::string short_name(const Graph& g, int id) { return expression(g, id, 1); }

}  // namespace comfuse
