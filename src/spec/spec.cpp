// Fusion Spec IR: names, queries, traversal, structural equality and the verifier.
// The text form (print / parse_spec) lives in spec_text.cpp.
#include "comfuse/spec.h"

#include <fmt/format.h>

#include <functional>

#include <algorithm>
#include <cmath>

namespace comfuse {

std::string_view name_of(NodeCategory c) {
  switch (c) {
    case NodeCategory::AccEntry: return "acc_entry";
    case NodeCategory::Broadcast: return "broadcast";
    case NodeCategory::Compute: return "compute";
    case NodeCategory::Reduction: return "reduction";
    case NodeCategory::Placeholder: return "placeholder";
    case NodeCategory::Store: return "store";
  }
  return "?";
}

std::string_view name_of(ValueClass c) {
  switch (c) {
    case ValueClass::Tile: return "tile";
    case ValueClass::Col: return "col";
    case ValueClass::Row: return "row";
    case ValueClass::Scalar: return "scalar";
  }
  return "?";
}

std::string_view name_of(ArgRole r) {
  switch (r) {
    case ArgRole::OperandA: return "operand_a";
    case ArgRole::OperandB: return "operand_b";
    case ArgRole::OperandGate: return "operand_gate";
    case ArgRole::Scalar: return "scalar";
    case ArgRole::RowVector: return "row_vector";
    case ArgRole::ColVector: return "col_vector";
    case ArgRole::TileInput: return "tile_input";
    case ArgRole::Output: return "output";
  }
  return "?";
}

std::string FusionSpec::describe(const std::string& graph_name) const {
  auto it = user_names.find(graph_name);
  return it != user_names.end() ? it->second : "'" + graph_name + "'";
}

int FusionSpec::arg_index(ArgRole role) const {
  for (size_t i = 0; i < args.size(); ++i)
    if (args[i].role == role) return static_cast<int>(i);
  return -1;
}

namespace {

int count_reductions(const Spec& s) {
  int n = 0;
  for (const SpecNode& node : s.nodes) n += node.category == NodeCategory::Reduction;
  for (const Spec& c : s.children) n += count_reductions(c);
  return n;
}

// Stages along the deepest chain: a reduction ends a stage and starts its PostOp (a
// reduction without a PostOp still counts as the stage boundary it is).
int count_stages(const Spec& s) {
  int deepest = 0;
  for (const SpecNode& node : s.nodes) {
    if (node.category != NodeCategory::Reduction) continue;
    const bool has_post = node.post >= 0 && node.post < static_cast<int>(s.children.size());
    deepest = std::max(deepest, has_post ? count_stages(s.children[static_cast<size_t>(node.post)]) : 1);
  }
  return 1 + deepest;
}

// Doubles compare exactly: same bits up to NaN payload (the text form prints any NaN
// as `nan`/`-nan`), so -0.0 differs from 0.0 and NaN equals NaN of the same sign.
bool same_double(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b) && std::signbit(a) == std::signbit(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

// Structural: only the fields that the node's category gives meaning to.
bool same_node(const SpecNode& a, const SpecNode& b) {
  if (a.category != b.category || a.value_class != b.value_class || a.operands != b.operands ||
      a.origin != b.origin)
    return false;
  switch (a.category) {
    case NodeCategory::AccEntry: return a.arg == b.arg;
    case NodeCategory::Broadcast:
      if (a.broadcast != b.broadcast) return false;
      if (a.arg < 0 || b.arg < 0) return a.arg < 0 && b.arg < 0 && same_double(a.literal, b.literal);
      return a.arg == b.arg;
    case NodeCategory::Compute:
      if (a.compute != b.compute) return false;
      switch (a.compute) {
        case ComputeKind::Unary: return a.unary == b.unary;
        case ComputeKind::Binary: return a.binary == b.binary;
        case ComputeKind::Cast: return a.cast_to == b.cast_to;
        case ComputeKind::CausalMask: case ComputeKind::RotateHalf: case ComputeKind::RotatePairs: return true;
      }
      return false;
    case NodeCategory::Reduction: return a.reduce == b.reduce && a.post == b.post;
    case NodeCategory::Placeholder:
      return a.placeholder == b.placeholder && (a.placeholder == PlaceholderKind::Stat || a.source == b.source);
    case NodeCategory::Store: return a.arg == b.arg;
  }
  return false;
}

bool same_spec(const Spec& a, const Spec& b) {
  if (a.terminal != b.terminal || a.nodes.size() != b.nodes.size() || a.children.size() != b.children.size())
    return false;
  for (size_t i = 0; i < a.nodes.size(); ++i)
    if (!same_node(a.nodes[i], b.nodes[i])) return false;
  for (size_t i = 0; i < a.children.size(); ++i)
    if (!same_spec(a.children[i], b.children[i])) return false;
  return true;
}

bool same_arg(const RuntimeArg& a, const RuntimeArg& b) {
  return a.name == b.name && a.role == b.role && a.dtype == b.dtype && a.shape == b.shape &&
         a.value_class == b.value_class && a.graph_node == b.graph_node;
}

// ---- verifier ----

// The class of `a op b` (rows broadcast against columns make a tile).
ValueClass combine(ValueClass a, ValueClass b) {
  if (a == ValueClass::Scalar) return b;
  if (b == ValueClass::Scalar) return a;
  if (a == b) return a;
  return ValueClass::Tile;
}

class Verifier {
 public:
  explicit Verifier(const FusionSpec& s) : fs_(s) {}

  void run() {
    int a = 0, b = 0;
    for (size_t i = 0; i < fs_.args.size(); ++i) {
      const RuntimeArg& arg = fs_.args[i];
      a += arg.role == ArgRole::OperandA;
      b += arg.role == ArgRole::OperandB;
      if (arg.role == ArgRole::Output && arg.value_class != ValueClass::Tile && arg.value_class != ValueClass::Col)
        throw Error(fmt::format("arg a{} (`{}`): an output holds a tile or a col, not a {}", i, arg.name,
                                name_of(arg.value_class)));
      // A per-segment statistic is one value a row of a segment: no [M, 1] holds it (lower.cpp
      // keeps such a value in the kernel or out of it).
      if (fs_.segment > 0 && arg.role == ArgRole::Output && arg.value_class == ValueClass::Col)
        throw Error(fmt::format("arg a{} (`{}`): a per-segment spec (segment={}) stores tiles only", i, arg.name,
                                fs_.segment));
    }
    if (fs_.segment < 0) throw Error(fmt::format("segment = {}: a positive column count, or 0", fs_.segment));
    if (fs_.segment > 0 && (fs_.batched() || fs_.gated()))
      throw Error(fmt::format("segment = {}: per-segment epilogues run in an unbatched, ungated GEMM's kernel",
                              fs_.segment));
    if (a != 1) throw Error(fmt::format("the spec needs exactly one operand_a arg, found {}", a));
    if (b != 1) throw Error(fmt::format("the spec needs exactly one operand_b arg, found {}", b));
    stage(fs_.root, nullptr, 0, "stage 0");
  }

 private:
  [[noreturn]] void fail(const std::string& path, const std::string& msg) const {
    throw Error(fmt::format("{}: {}", path, msg));
  }

  const RuntimeArg* arg(int i) const {
    return i >= 0 && i < static_cast<int>(fs_.args.size()) ? &fs_.args[static_cast<size_t>(i)] : nullptr;
  }

  void expect_arity(const std::string& at, const SpecNode& n, size_t want, std::string_view what) const {
    if (n.operands.size() != want)
      fail(at, fmt::format("{} takes {} operand{}, has {}", what, want, want == 1 ? "" : "s", n.operands.size()));
  }

  void expect_class(const std::string& at, const SpecNode& n, ValueClass want, std::string_view why) const {
    if (n.value_class != want)
      fail(at, fmt::format("value class is {}, expected {} ({})", name_of(n.value_class), name_of(want), why));
  }

  void expect_arg(const std::string& at, int index, ArgRole role, std::string_view what) const {
    const RuntimeArg* a = arg(index);
    if (!a) fail(at, fmt::format("{} names arg {}, which does not exist ({} args)", what, index, fs_.args.size()));
    if (a->role != role)
      fail(at, fmt::format("{} names arg a{} (`{}`), a {} arg; expected a {} arg", what, index, a->name,
                           name_of(a->role), name_of(role)));
  }

  void stage(const Spec& sp, const Spec* parent, int depth, const std::string& path) {
    const int n = static_cast<int>(sp.nodes.size());
    if (n == 0) fail(path, "the stage has no nodes");
    int reduction = -1, stat = -1;
    for (int i = 0; i < n; ++i) {
      const SpecNode& node = sp.nodes[static_cast<size_t>(i)];
      const std::string at = fmt::format("{}: node n{}", path, i);
      for (int o : node.operands) {
        if (o < 0 || o >= n) fail(at, fmt::format("operand {} is out of range (the stage has {} nodes)", o, n));
        if (o >= i) fail(at, fmt::format("operand n{} does not precede it (nodes must be in topological order)", o));
        const SpecNode& src = sp.nodes[static_cast<size_t>(o)];
        if (src.category == NodeCategory::Store) fail(at, fmt::format("operand n{} is a store, which has no value", o));
        if (src.category == NodeCategory::Reduction)
          fail(at, fmt::format("operand n{} is this stage's reduction; its result is only visible in its post "
                               "stage, through a stat placeholder", o));
      }
      auto cls = [&](size_t k) { return sp.nodes[static_cast<size_t>(node.operands[k])].value_class; };
      switch (node.category) {
        case NodeCategory::AccEntry:
          expect_arity(at, node, 0, "an acc entry");
          if (depth != 0) fail(at, "an acc entry may only appear in the root stage");
          expect_class(at, node, ValueClass::Tile, "the accumulator is a tile");
          if (node.arg != -1) expect_arg(at, node.arg, ArgRole::OperandGate, "a gated acc entry (A x Gate)");
          break;
        case NodeCategory::Broadcast:
          expect_arity(at, node, 0, "a broadcast");
          switch (node.broadcast) {
            case BroadcastKind::Row:
              expect_arg(at, node.arg, ArgRole::RowVector, "a row broadcast");
              expect_class(at, node, ValueClass::Row, "a row broadcast");
              break;
            case BroadcastKind::Col:
              expect_arg(at, node.arg, ArgRole::ColVector, "a col broadcast");
              expect_class(at, node, ValueClass::Col, "a col broadcast");
              break;
            case BroadcastKind::Tile:
              expect_arg(at, node.arg, ArgRole::TileInput, "a tile input");
              expect_class(at, node, ValueClass::Tile, "a tile input");
              break;
            case BroadcastKind::Scalar:
              if (node.arg >= 0) expect_arg(at, node.arg, ArgRole::Scalar, "a scalar broadcast");  // < 0: literal
              expect_class(at, node, ValueClass::Scalar, "a scalar broadcast");
              break;
          }
          break;
        case NodeCategory::Compute:
          if (node.compute == ComputeKind::Binary) {
            expect_arity(at, node, 2, fmt::format("binary `{}`", name_of(node.binary)));
            if (node.binary == BinaryOp::Pow && cls(1) != ValueClass::Scalar)
              fail(at, fmt::format("pow's exponent n{} must be a scalar, is a {}", node.operands[1], name_of(cls(1))));
            expect_class(at, node, combine(cls(0), cls(1)),
                         fmt::format("{} op {}", name_of(cls(0)), name_of(cls(1))));
          } else if (node.compute == ComputeKind::CausalMask) {
            expect_arity(at, node, 1, CausalMaskOp::name);
            if (cls(0) != ValueClass::Tile)
              fail(at, fmt::format("{} masks a tile (it reads each element's row and column); operand n{} is a {}",
                                   CausalMaskOp::name, node.operands[0], name_of(cls(0))));
            expect_class(at, node, ValueClass::Tile, "a causal mask keeps its tile");
          } else if (node.compute == ComputeKind::RotateHalf || node.compute == ComputeKind::RotatePairs) {
            const std::string_view op =
                node.compute == ComputeKind::RotateHalf ? RotateHalfOp::name : RotatePairsOp::name;
            expect_arity(at, node, 1, op);
            if (fs_.segment <= 0 || fs_.segment % 2 != 0)
              fail(at, fmt::format("{} rotates within runs of the spec's segment columns; segment = {} is not a "
                                   "positive even count", op, fs_.segment));
            if (cls(0) == ValueClass::Row || cls(0) == ValueClass::Scalar)
              fail(at, fmt::format("{} rotates a tile or a per-row value; operand n{} is a {}", op,
                                   node.operands[0], name_of(cls(0))));
            expect_class(at, node, ValueClass::Tile, "a rotation gives a tile");
          } else {
            expect_arity(at, node, 1, node.compute == ComputeKind::Cast ? std::string("a cast")
                                                                         : fmt::format("unary `{}`", name_of(node.unary)));
            expect_class(at, node, cls(0), "an elementwise op keeps its operand's class");
          }
          break;
        case NodeCategory::Reduction:
          expect_arity(at, node, 1, "a reduction");
          if (cls(0) != ValueClass::Tile)
            fail(at, fmt::format("a reduction reduces a tile; operand n{} is a {}", node.operands[0], name_of(cls(0))));
          expect_class(at, node, ValueClass::Col, "a reduction yields one value per row");
          if (reduction >= 0)
            fail(at, fmt::format("a second reduction in one stage (n{} already ends it)", reduction));
          reduction = i;
          if (node.post < -1 || node.post >= static_cast<int>(sp.children.size()))
            fail(at, fmt::format("post {} does not name a child stage (the stage has {})", node.post,
                                 sp.children.size()));
          if (i != sp.terminal)
            fail(at, fmt::format("a reduction must be its stage's terminal (the terminal is {})",
                                 sp.terminal < 0 ? std::string("none") : fmt::format("n{}", sp.terminal)));
          break;
        case NodeCategory::Placeholder:
          expect_arity(at, node, 0, "a placeholder");
          if (!parent) fail(at, "a placeholder may only appear in a nested (post) stage");
          if (node.placeholder == PlaceholderKind::Stat) {
            if (stat >= 0) fail(at, fmt::format("a second stat placeholder (n{} is the first)", stat));
            stat = i;
            expect_class(at, node, ValueClass::Col, "a statistic is one value per row");
          } else {
            const int pn = static_cast<int>(parent->nodes.size());
            if (node.source < 0 || node.source >= pn)
              fail(at, fmt::format("bypass source {} is not a node of the parent stage ({} nodes)", node.source, pn));
            const SpecNode& src = parent->nodes[static_cast<size_t>(node.source)];
            if (src.category == NodeCategory::Store)
              fail(at, fmt::format("bypass source n{} is a store, which has no value", node.source));
            expect_class(at, node, src.value_class, fmt::format("the class of bypassed n{}", node.source));
          }
          break;
        case NodeCategory::Store: {
          expect_arity(at, node, 1, "a store");
          expect_arg(at, node.arg, ArgRole::Output, "a store");
          expect_class(at, node, cls(0), "a store has its value's class");
          const RuntimeArg& out = *arg(node.arg);
          if (out.value_class != cls(0))
            fail(at, fmt::format("stores a {} value into output a{} (`{}`), declared {}", name_of(cls(0)), node.arg,
                                 out.name, name_of(out.value_class)));
          break;
        }
      }
    }

    if (sp.terminal < 0 || sp.terminal >= n)
      fail(path, sp.terminal == -1 ? std::string("the stage has no terminal")
                                   : fmt::format("terminal {} is out of range (the stage has {} nodes)", sp.terminal, n));
    const SpecNode& term = sp.nodes[static_cast<size_t>(sp.terminal)];
    if (reduction < 0 && term.category != NodeCategory::Store)
      fail(path, fmt::format("a stage without a reduction must end in a store; terminal n{} is a {}", sp.terminal,
                             name_of(term.category)));

    for (size_t c = 0; c < sp.children.size(); ++c) {
      std::vector<int> refs;
      for (int i = 0; i < n; ++i) {
        const SpecNode& node = sp.nodes[static_cast<size_t>(i)];
        if (node.category == NodeCategory::Reduction && node.post == static_cast<int>(c)) refs.push_back(i);
      }
      if (refs.empty()) fail(path, fmt::format("child stage {} is not the post stage of any reduction", c));
      if (refs.size() > 1)
        fail(path, fmt::format("child stage {} is the post stage of both n{} and n{}", c, refs[0], refs[1]));
      stage(sp.children[c], &sp, depth + 1, fmt::format("{} > post of n{} (stage {})", path, refs[0], depth + 1));
    }
  }

  const FusionSpec& fs_;
};

}  // namespace

std::vector<int> FusionSpec::root_tile_inputs() const {
  std::vector<int> out;
  for (const SpecNode& node : root.nodes)
    if (node.category == NodeCategory::Broadcast && node.broadcast == BroadcastKind::Tile && node.arg >= 0 &&
        !periodic_arg(*this, args.at(static_cast<size_t>(node.arg))) &&
        std::find(out.begin(), out.end(), node.arg) == out.end())
      out.push_back(node.arg);
  return out;
}

std::map<std::pair<const Spec*, int>, int> FusionSpec::staging_borrows() const {
  auto tile_store_bytes = [&](const SpecNode& n) -> size_t {
    if (n.category != NodeCategory::Store || n.arg < 0 || n.arg >= static_cast<int>(args.size())) return 0;
    const RuntimeArg& a = args[static_cast<size_t>(n.arg)];
    return a.role == ArgRole::Output && a.value_class == ValueClass::Tile ? size_of(a.dtype) : 0;
  };
  std::map<size_t, std::vector<int>> lenders;  // element size -> the root's tile stores, in node order
  for (size_t i = 0; i < root.nodes.size(); ++i)
    if (const size_t b = tile_store_bytes(root.nodes[i])) lenders[b].push_back(static_cast<int>(i));
  std::map<std::pair<const Spec*, int>, int> out;
  std::function<void(const Spec&)> walk = [&](const Spec& st) {
    std::map<size_t, size_t> taken;
    for (size_t i = 0; i < st.nodes.size(); ++i)
      if (const size_t b = tile_store_bytes(st.nodes[i])) {
        const std::vector<int>& l = lenders[b];
        if (const size_t k = taken[b]++; k < l.size()) out[{&st, static_cast<int>(i)}] = l[k];
      }
    for (const Spec& c : st.children) walk(c);
  };
  for (const Spec& c : root.children) walk(c);
  return out;
}

int FusionSpec::reduction_count() const { return count_reductions(root); }
int FusionSpec::stage_count() const { return count_stages(root); }

bool operator==(const FusionSpec& a, const FusionSpec& b) {
  if (a.name != b.name || a.b_layout != b.b_layout || a.m != b.m || a.n != b.n || a.k != b.k || a.batch != b.batch ||
      a.segment != b.segment || a.args.size() != b.args.size())
    return false;
  for (size_t i = 0; i < a.args.size(); ++i)
    if (!same_arg(a.args[i], b.args[i])) return false;
  return same_spec(a.root, b.root);
}

void verify(const FusionSpec& s) { Verifier(s).run(); }

bool periodic_arg(const FusionSpec& s, const RuntimeArg& a) {
  if (s.segment <= 0 || a.shape.empty() || a.shape.back() == s.n || a.shape.back() != Dim::of(s.segment)) return false;
  return (a.role == ArgRole::RowVector && a.shape.size() == 1) || (a.role == ArgRole::TileInput && a.shape.size() == 2);
}

void SpecVisitor::walk(const Spec& root, int depth) {
  enter_stage(root, depth);
  for (size_t i = 0; i < root.nodes.size(); ++i) {
    const SpecNode& node = root.nodes[i];
    visit(root, static_cast<int>(i), node, depth);
    if (node.category == NodeCategory::Reduction && node.post >= 0 &&
        node.post < static_cast<int>(root.children.size()))
      walk(root.children[static_cast<size_t>(node.post)], depth + 1);
  }
  leave_stage(root, depth);
}

// Both pairs have one shape: reduction i (first op) of operand x, whose PostStage's terminal
// reduction (second op) reduces f(Bypass(x) - Stat), f = square (x * x too) or exp.
int literal_int_exponent(const Spec& st, const SpecNode& n) {
  if (n.category != NodeCategory::Compute || n.compute != ComputeKind::Binary || n.binary != BinaryOp::Pow) return 0;
  const SpecNode& e = st.nodes.at(static_cast<size_t>(n.operands.at(1)));
  if (e.category != NodeCategory::Broadcast || e.arg >= 0) return 0;
  for (int k = 2; k <= 4; ++k)
    if (e.literal == double(k)) return k;
  return 0;
}

namespace {
bool is_tanh(const SpecNode& n) {
  return n.category == NodeCategory::Compute && n.compute == ComputeKind::Unary && n.unary == UnaryOp::Tanh;
}
}  // namespace

int one_plus_tanh_operand(const Spec& st, const SpecNode& n) {
  if (n.category != NodeCategory::Compute || n.compute != ComputeKind::Binary || n.binary != BinaryOp::Add) return -1;
  auto node = [&](int k) -> const SpecNode& { return st.nodes.at(static_cast<size_t>(k)); };
  auto is_one = [](const SpecNode& c) {
    return c.category == NodeCategory::Broadcast && c.arg < 0 && c.literal == 1.0;
  };
  for (int side = 0; side < 2; ++side) {
    const SpecNode& t = node(n.operands.at(static_cast<size_t>(side)));
    if (is_tanh(t) && is_one(node(n.operands.at(static_cast<size_t>(1 - side))))) return t.operands.at(0);
  }
  return -1;
}

bool rotate_in_place(const Spec& st, int i) {
  const auto at = [&](int k) -> const SpecNode& { return st.nodes.at(static_cast<size_t>(k)); };
  const int x = at(i).operands.at(0);
  const SpecNode& xn = at(x);
  const bool post_stage = at(0).category == NodeCategory::Placeholder;  // a root stage starts at the accumulator
  if (!post_stage || !st.children.empty() || xn.category == NodeCategory::AccEntry ||
      xn.category == NodeCategory::Placeholder)
    return false;
  for (int k = 0; k < static_cast<int>(st.nodes.size()); ++k) {
    const SpecNode& n = at(k);
    if (k != i && n.category == NodeCategory::Compute && n.compute == ComputeKind::RotateHalf) return false;
    if (k <= x && (n.category == NodeCategory::Store || n.category == NodeCategory::Reduction)) return false;
    if (k <= x) continue;
    // The accumulator or a parent's value read past x: the registers then hold x.
    if (n.category == NodeCategory::AccEntry ||
        (n.category == NodeCategory::Placeholder && n.placeholder == PlaceholderKind::Bypass))
      return false;
    std::vector<int> reads = n.operands;
    if (n.category == NodeCategory::Compute && n.compute == ComputeKind::Binary)
      if (const int u = one_plus_tanh_operand(st, n); u >= 0) reads.push_back(u);
    for (int o : reads)
      if (o < x) return false;
  }
  return true;
}

bool only_one_plus_tanh_users(const Spec& st, int i) {
  if (!is_tanh(st.nodes.at(static_cast<size_t>(i)))) return false;
  int users = 0;
  for (const SpecNode& n : st.nodes)
    for (int o : n.operands)
      if (o == i) {
        if (one_plus_tanh_operand(st, n) < 0) return false;
        ++users;
      }
  for (const Spec& child : st.children)
    for (const SpecNode& n : child.nodes)
      if (n.category == NodeCategory::Placeholder && n.placeholder == PlaceholderKind::Bypass && n.source == i)
        return false;
  return users > 0;
}

PairKind pair_kind(const Spec& st, int i) {
  const SpecNode& r = st.nodes.at(static_cast<size_t>(i));
  if (r.category != NodeCategory::Reduction || r.post < 0) return PairKind::None;
  const Spec& post = st.children.at(static_cast<size_t>(r.post));
  auto node = [&](int k) -> const SpecNode* {
    return k >= 0 && k < static_cast<int>(post.nodes.size()) ? &post.nodes[static_cast<size_t>(k)] : nullptr;
  };
  const SpecNode* second = node(post.terminal);
  if (!second || second->category != NodeCategory::Reduction) return PairKind::None;
  const SpecNode* f = node(second->operands.at(0));
  if (!f || f->category != NodeCategory::Compute) return PairKind::None;
  PairKind kind = PairKind::None;
  int d = -1;
  if (r.reduce == ReduceOp::Mean && second->reduce == ReduceOp::Mean) {
    kind = PairKind::MeanVariance;
    if (f->compute == ComputeKind::Unary && f->unary == UnaryOp::Square) d = f->operands.at(0);
    else if (f->compute == ComputeKind::Binary && f->binary == BinaryOp::Mul && f->operands.at(0) == f->operands.at(1))
      d = f->operands.at(0);
  } else if (r.reduce == ReduceOp::Max && second->reduce == ReduceOp::Sum) {
    kind = PairKind::MaxExpSum;
    if (f->compute == ComputeKind::Unary && f->unary == UnaryOp::Exp) d = f->operands.at(0);
  }
  const SpecNode* diff = node(d);
  if (!diff || diff->category != NodeCategory::Compute || diff->compute != ComputeKind::Binary ||
      diff->binary != BinaryOp::Sub)
    return PairKind::None;
  const SpecNode* x = node(diff->operands.at(0));
  const SpecNode* stat = node(diff->operands.at(1));
  const bool shape = x && stat && x->category == NodeCategory::Placeholder && x->placeholder == PlaceholderKind::Bypass &&
                     x->source == r.operands.at(0) && x->value_class == ValueClass::Tile &&
                     stat->category == NodeCategory::Placeholder && stat->placeholder == PlaceholderKind::Stat;
  return shape ? kind : PairKind::None;
}

bool pair_keeps_exp(const Spec& st, int i) {
  if (pair_kind(st, i) != PairKind::MaxExpSum) return false;
  const Spec& post = st.children.at(static_cast<size_t>(st.nodes.at(static_cast<size_t>(i)).post));
  const SpecNode& sum = post.nodes.at(static_cast<size_t>(post.terminal));
  const int f = sum.operands.at(0);
  const int d = post.nodes.at(static_cast<size_t>(f)).operands.at(0);
  // What the kernel replaces: every Tile-class bypass of the PostStage (they all read the registers
  // that then hold the exps) and every Stat node (they all take the factor). Within the PostStage
  // they feed the difference only, and the difference the exp only.
  auto replaced = [&](int k) {
    const SpecNode& n = post.nodes.at(static_cast<size_t>(k));
    return n.category == NodeCategory::Placeholder &&
           (n.placeholder == PlaceholderKind::Stat || n.value_class == ValueClass::Tile);
  };
  for (size_t k = 0; k < post.nodes.size(); ++k)
    for (int o : post.nodes[k].operands) {
      if (replaced(o) && static_cast<int>(k) != d) return false;
      if (o == d && static_cast<int>(k) != f) return false;
    }
  // No later stage takes one of them, or the difference, by bypass.
  for (const Spec& later : post.children)
    for (const SpecNode& n : later.nodes)
      if (n.category == NodeCategory::Placeholder && n.placeholder == PlaceholderKind::Bypass &&
          (n.source == d || replaced(n.source)))
        return false;
  return true;
}

int FusionSpec::pair_count(PairKind kind) const {
  int pairs = 0;
  std::function<void(const Spec&)> walk = [&](const Spec& st) {
    for (size_t i = 0; i < st.nodes.size(); ++i)
      if (pair_kind(st, static_cast<int>(i)) == kind) ++pairs;
    for (const Spec& c : st.children) walk(c);
  };
  walk(root);
  return pairs;
}

}  // namespace comfuse
