// run_spec: executes a Fusion Spec the way the fused kernel does: acc = A x B, then the
// stage chain. Every value is held as a rank-2 tensor of its shape class (Tile [M, N],
// Col [M, 1], Row [1, N], Scalar [1, 1]); reductions follow the kernel's tiled order.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "interp_internal.h"

namespace comfuse {
namespace {
using namespace interp_detail;

// The smallest class both fit into (Scalar < Row, Col < Tile).
ValueClass join(ValueClass a, ValueClass b) {
  if (a == b || b == ValueClass::Scalar) return a;
  if (a == ValueClass::Scalar) return b;
  return ValueClass::Tile;
}

class SpecExec {
 public:
  // `args`: each non-output argument by name; the operands are read in place, not copied.
  SpecExec(const FusionSpec& fs, const Bindings& dims, const std::map<std::string, const Tensor*>& args,
           const ReduceTiling& t)
      : fs_(fs), tiling_(t), bind_(dims) {
    const int ia = find_role(ArgRole::OperandA), ib = find_role(ArgRole::OperandB);
    if (ia < 0 || ib < 0) throw Error(fmt::format("spec '{}': no {} argument", fs.name, ia < 0 ? "A" : "B"));
    std::vector<const Tensor*> in(fs.args.size(), nullptr);
    for (size_t i = 0; i < fs.args.size(); ++i) {
      const RuntimeArg& a = fs.args[i];
      if (a.role == ArgRole::Output) continue;
      auto it = args.find(a.name);
      if (it == args.end() || !it->second)
        throw Error(fmt::format("spec '{}': {} argument '{}' was not supplied", fs.name, name_of(a.role), a.name));
      in[i] = it->second;
    }
    const Tensor &A = *in[static_cast<size_t>(ia)], &B = *in[static_cast<size_t>(ib)];
    if (A.shape.size() != 2 || B.shape.size() != 2)
      throw Error(fmt::format("spec '{}': operands must be rank 2, got A {} and B {}", fs.name, shape_str(A.shape),
                              shape_str(B.shape)));
    M_ = A.shape[0];
    N_ = fs.b_layout == BLayout::NK ? B.shape[0] : B.shape[1];
    check_dim(fs.m, M_, "M");
    check_dim(fs.n, N_, "N");
    check_dim(fs.k, A.shape[1], "K");
    check_problem_size(M_, N_, A.shape[1], dim_label(fs.m, "M"), dim_label(fs.n, "N"), dim_label(fs.k, "K"));
    if (!fs.m.sym.empty()) bind_[fs.m.sym] = M_;
    if (!fs.n.sym.empty()) bind_[fs.n.sym] = N_;
    acc_ = matmul(A, B, fs.b_layout);
    // A gated GEMM (SwiGLU): the second accumulator A x Gate, Gate laid out as B.
    if (const int ig = find_role(ArgRole::OperandGate); ig >= 0) {
      const Tensor& G = *in[static_cast<size_t>(ig)];
      if (G.shape != B.shape)
        throw Error(fmt::format("spec '{}': gate operand '{}' has shape {}, B '{}' has {}", fs.name,
                                fs.args[static_cast<size_t>(ig)].name, shape_str(G.shape),
                                fs.args[static_cast<size_t>(ib)].name, shape_str(B.shape)));
      gate_ = matmul(A, G, fs.b_layout);
    }
    vals_.resize(fs.args.size());
    for (size_t i = 0; i < fs.args.size(); ++i) {
      const RuntimeArg& a = fs.args[i];
      const auto expect = [&](int64_t rows, int64_t cols) {  // a broadcast operand: small, copied
        if (in[i]->numel() != rows * cols)
          throw Error(fmt::format("spec '{}': {} argument '{}' has shape {}, expected {} values", fs.name,
                                  name_of(a.role), a.name, shape_str(in[i]->shape), rows * cols));
        vals_[i] = *in[i];
        vals_[i].shape = {rows, cols};
      };
      if (a.role == ArgRole::Scalar) expect(1, 1);
      if (a.role == ArgRole::RowVector) expect(1, N_);
      if (a.role == ArgRole::ColVector) expect(M_, 1);
      if (a.role == ArgRole::TileInput) expect(M_, N_);
    }
  }

  TensorMap run() {
    exec(fs_.root, "root", nullptr);
    for (const RuntimeArg& a : fs_.args)
      if (a.role == ArgRole::Output && !out_.count(a.name))
        throw Error(fmt::format("spec '{}': output '{}' is never stored", fs_.name, a.name));
    return std::move(out_);
  }

 private:
  int find_role(ArgRole r) const {
    for (size_t i = 0; i < fs_.args.size(); ++i)
      if (fs_.args[i].role == r) return static_cast<int>(i);
    return -1;
  }

  void check_dim(const Dim& d, int64_t got, const char* what) const {
    auto want = try_resolve(d, bind_);
    if (want && *want != got)
      throw Error(fmt::format("spec '{}': {} ({}) is {} but the operands give {}", fs_.name, what, d.str(), *want, got));
  }

  std::vector<int64_t> shape_of(ValueClass c) const {
    switch (c) {
      case ValueClass::Tile: return {M_, N_};
      case ValueClass::Col: return {M_, 1};
      case ValueClass::Row: return {1, N_};
      case ValueClass::Scalar: return {1, 1};
    }
    return {1, 1};
  }

  [[noreturn]] void fail(const std::string& path, int i, const std::string& msg) const {
    throw Error(fmt::format("spec '{}', stage {}, node {}: {}", fs_.name, path, i, msg));
  }

  const RuntimeArg& arg(const std::string& path, int i, int a) const {
    if (a < 0 || a >= static_cast<int>(fs_.args.size())) fail(path, i, fmt::format("argument index {} out of range", a));
    return fs_.args[a];
  }

  // A stage's values as its PostOps see them: bypass_reads counts the PostOps' Bypass reads
  // still to come per value; the last one takes the value instead of copying it.
  struct Parent {
    std::vector<Tensor>* v;
    const std::vector<ValueClass>* cls;
    std::vector<int>* bypass_reads;
  };

  // Executes one stage. `parent` holds the parent stage's values (for Bypass), `stat`
  // the parent reduction's result (for Stat); both null at the root.
  void exec(const Spec& st, const std::string& path, Parent* parent, const Tensor* stat = nullptr) {
    const size_t count = st.nodes.size();
    std::vector<Tensor> v(count);
    std::vector<ValueClass> cls(count);
    std::vector<std::pair<int, int>> posts;  // (reduction node, child index)
    // A value is freed after its last use in this stage unless a PostOp reads it later (a
    // bypassed value, a reduction's statistic), and the PostOp takes it over: a chain of
    // many reductions holds a few tiles at a time, not every stage's.
    constexpr int kStatistic = 1 << 30;  // a reduction's value is its PostOps' Stat: never taken over
    std::vector<int> last_use(count, -1), bypass_reads(count, 0);
    for (size_t i = 0; i < count; ++i) {
      for (int o : st.nodes[i].operands)
        if (o >= 0 && o < static_cast<int>(count)) last_use[static_cast<size_t>(o)] = static_cast<int>(i);
      if (st.nodes[i].category == NodeCategory::Reduction) bypass_reads[i] = kStatistic;
    }
    for (const Spec& child : st.children)
      for (const SpecNode& n : child.nodes)
        if (n.category == NodeCategory::Placeholder && n.placeholder == PlaceholderKind::Bypass && n.source >= 0 &&
            n.source < static_cast<int>(count))
          ++bypass_reads[static_cast<size_t>(n.source)];
    auto release = [&](size_t i, size_t after) {
      if (bypass_reads[i] == 0 && last_use[i] <= static_cast<int>(after)) v[i] = Tensor{};
    };
    for (size_t ui = 0; ui < count; ++ui) {
      const int i = static_cast<int>(ui);
      const SpecNode& n = st.nodes[ui];
      for (int o : n.operands)
        if (o < 0 || o >= i) fail(path, i, fmt::format("operand {} is not an earlier node", o));
      auto opnd = [&](size_t k) -> const Tensor& {
        if (k >= n.operands.size()) fail(path, i, "missing operand");
        return v[static_cast<size_t>(n.operands[k])];
      };
      auto opcls = [&](size_t k) { return cls[static_cast<size_t>(n.operands[k])]; };
      cls[ui] = n.value_class;
      switch (n.category) {
        case NodeCategory::AccEntry:
          if (n.arg >= 0 && arg(path, i, n.arg).role != ArgRole::OperandGate)
            fail(path, i, "a gated acc entry names an argument that is not the gate operand");
          v[ui] = n.arg >= 0 ? gate_ : acc_;
          cls[ui] = ValueClass::Tile;
          break;
        case NodeCategory::Broadcast: {
          const ValueClass want = n.broadcast == BroadcastKind::Row    ? ValueClass::Row
                                  : n.broadcast == BroadcastKind::Col  ? ValueClass::Col
                                  : n.broadcast == BroadcastKind::Tile ? ValueClass::Tile
                                                                       : ValueClass::Scalar;
          cls[ui] = want;
          if (n.arg < 0) {
            if (n.broadcast != BroadcastKind::Scalar) fail(path, i, "a row/col broadcast needs an argument");
            v[ui] = filled({1, 1}, n.literal);
            break;
          }
          const RuntimeArg& a = arg(path, i, n.arg);
          const ArgRole role = want == ValueClass::Row    ? ArgRole::RowVector
                               : want == ValueClass::Col  ? ArgRole::ColVector
                               : want == ValueClass::Tile ? ArgRole::TileInput
                                                          : ArgRole::Scalar;
          if (a.role != role)
            fail(path, i, fmt::format("broadcast of '{}' expects a {} argument, it is a {}", a.name, name_of(role),
                                      name_of(a.role)));
          v[ui] = vals_[static_cast<size_t>(n.arg)];
          break;
        }
        case NodeCategory::Compute: {
          ValueClass c = opcls(0);
          if (n.compute == ComputeKind::Binary) {
            c = join(c, opcls(1));
            Tensor t = filled(shape_of(c));
            const Tensor &a = opnd(0), &b = opnd(1);
            const int64_t cols = t.shape[1];
            for (int64_t r = 0; r < t.shape[0]; ++r)
              for (int64_t k = 0; k < cols; ++k)
                t.data[static_cast<size_t>(r * cols + k)] = apply(n.binary, a.at(r, k), b.at(r, k));
            v[ui] = std::move(t);
          } else if (n.compute == ComputeKind::Unary) {
            v[ui] = opnd(0);
            for (double& x : v[ui].data) x = apply(n.unary, x);
          } else if (n.compute == ComputeKind::CausalMask) {
            if (c != ValueClass::Tile) fail(path, i, fmt::format("{} of a {}, not a tile", CausalMaskOp::name, name_of(c)));
            Tensor t = opnd(0);  // [M_, N_]: rows and columns of the whole output
            for (int64_t r = 0; r < M_; ++r)
              for (int64_t k = 0; k < N_; ++k) {
                double& x = t.data[static_cast<size_t>(r * N_ + k)];
                x = CausalMaskOp::apply(x, r, k);
              }
            v[ui] = std::move(t);
          } else if (n.compute == ComputeKind::RotateHalf || n.compute == ComputeKind::RotatePairs) {
            // run_segmented runs each segment as a spec of its own (N = segment, segment 0): the
            // rotation then spans the whole row.
            const bool half = n.compute == ComputeKind::RotateHalf;
            if (c == ValueClass::Row || c == ValueClass::Scalar)
              fail(path, i, fmt::format("{} of a {}, not a tile or a column", half ? RotateHalfOp::name : RotatePairsOp::name,
                                        name_of(c)));
            const int64_t seg = N_;
            Tensor t = filled(shape_of(ValueClass::Tile));
            const Tensor& x = opnd(0);
            for (int64_t r = 0; r < t.shape[0]; ++r)
              for (int64_t k = 0; k < N_; ++k)
                t.data[static_cast<size_t>(r * N_ + k)] =
                    half ? RotateHalfOp::apply(x.at(r, RotateHalfOp::partner(k, seg)), k, seg)
                         : RotatePairsOp::apply(x.at(r, RotatePairsOp::partner(k)), k);
            v[ui] = std::move(t);
            c = ValueClass::Tile;
          } else {
            v[ui] = rounded(opnd(0), n.cast_to);
          }
          cls[ui] = c;
          break;
        }
        case NodeCategory::Reduction: {
          const Tensor& x = opnd(0);
          const ValueClass c = opcls(0);
          cls[ui] = (c == ValueClass::Tile || c == ValueClass::Col) ? ValueClass::Col : ValueClass::Scalar;
          Tensor t = filled({x.shape[0], 1});
          for (int64_t r = 0; r < x.shape[0]; ++r)
            t.data[static_cast<size_t>(r)] =
                reduce_row_tiled(n.reduce, &x.data[static_cast<size_t>(r * x.shape[1])], x.shape[1], tiling_);
          v[ui] = std::move(t);
          if (n.post >= 0) {
            if (n.post >= static_cast<int>(st.children.size())) fail(path, i, fmt::format("PostOp {} does not exist", n.post));
            posts.emplace_back(i, n.post);
          }
          break;
        }
        case NodeCategory::Placeholder:
          if (n.placeholder == PlaceholderKind::Stat) {
            if (!stat) fail(path, i, "a Stat placeholder outside a PostOp");
            v[ui] = *stat;
            cls[ui] = ValueClass::Col;
          } else {
            if (!parent) fail(path, i, "a Bypass placeholder outside a PostOp");
            if (n.source < 0 || n.source >= static_cast<int>(parent->v->size()))
              fail(path, i, fmt::format("bypass source {} is not a node of the parent stage", n.source));
            const size_t src = static_cast<size_t>(n.source);
            if (--(*parent->bypass_reads)[src] == 0) v[ui] = std::move((*parent->v)[src]);
            else v[ui] = (*parent->v)[src];
            cls[ui] = (*parent->cls)[src];
          }
          break;
        case NodeCategory::Store: {
          const RuntimeArg& a = arg(path, i, n.arg);
          if (a.role != ArgRole::Output) fail(path, i, fmt::format("stores to '{}', which is not an output", a.name));
          store(path, i, a, opnd(0), opcls(0));
          v[ui] = opnd(0);
          cls[ui] = opcls(0);
          break;
        }
      }
      if (cls[ui] != n.value_class)
        fail(path, i, fmt::format("declared class {} but its value is a {}", name_of(n.value_class), name_of(cls[ui])));
      for (int o : n.operands) release(static_cast<size_t>(o), ui);
      release(ui, ui);  // nothing reads it (a store's copy, a dead value)
    }
    if (parent == nullptr) acc_ = gate_ = Tensor{};  // the root stage is the only one with acc entries
    Parent self{&v, &cls, &bypass_reads};
    for (auto [r, child] : posts)
      exec(st.children[static_cast<size_t>(child)], fmt::format("{}/{}", path, child), &self, &v[static_cast<size_t>(r)]);
  }

  void store(const std::string& path, int i, const RuntimeArg& a, const Tensor& x, ValueClass c) {
    if (out_.count(a.name)) fail(path, i, fmt::format("output '{}' is stored twice", a.name));
    if (join(c, a.value_class) != a.value_class)
      fail(path, i, fmt::format("stores a {} value into '{}', a {} output", name_of(c), a.name, name_of(a.value_class)));
    // The graph's shape for the output when its dims are bound, else the class shape.
    std::vector<int64_t> shape;
    bool bound = true;
    for (const Dim& d : a.shape) {
      auto r = try_resolve(d, bind_);
      if (!r) { bound = false; break; }
      shape.push_back(*r);
    }
    if (!bound || a.shape.empty()) shape = shape_of(a.value_class);
    Tensor t = filled(shape);
    const int64_t rows = t.rows(), cols = t.cols();
    const std::vector<int64_t> want = shape_of(a.value_class);
    if (rows * cols != want[0] * want[1] || (rows != want[0] && rows != 1))
      fail(path, i, fmt::format("output '{}' has shape {} but its class {} is {}", a.name, shape_str(shape),
                                name_of(a.value_class), shape_str(want)));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < cols; ++k) t.data[static_cast<size_t>(r * cols + k)] = round_to(a.dtype, x.at(r, k));
    out_[a.name] = std::move(t);
  }

  const FusionSpec& fs_;
  ReduceTiling tiling_;
  Bindings bind_;  // the caller's dims, plus M and N as the operands give them
  std::vector<Tensor> vals_;  // by arg index: the broadcast arguments as [rows, cols] (operands are not kept)
  Tensor acc_;
  Tensor gate_;  // a gated GEMM's A x Gate
  int64_t M_ = 0, N_ = 0;
  TensorMap out_;
};

}  // namespace

namespace interp_detail {
namespace {

// Batch b of a [B, ...] tensor: its trailing dims.
Tensor batch_slice(const Tensor& x, int64_t b) {
  Tensor out;
  out.shape.assign(x.shape.begin() + 1, x.shape.end());
  const int64_t n = out.numel();
  out.data.assign(x.data.begin() + b * n, x.data.begin() + (b + 1) * n);
  return out;
}

// A batched spec runs as the kernel does: per batch, the unbatched spec on that batch's operands
// and [B, M, N] inputs (what every batch shares, scalars and row vectors, as given); each
// output is the batches' results stacked along a leading dim.
TensorMap run_batched(const FusionSpec& s, const Bindings& dims, const std::map<std::string, const Tensor*>& args,
                      const ReduceTiling& t) {
  const RuntimeArg& ra = s.args.at(static_cast<size_t>(std::max(0, s.arg_index(ArgRole::OperandA))));
  auto it = args.find(ra.name);
  if (it == args.end() || !it->second)
    throw Error(fmt::format("spec '{}': operand A argument '{}' was not supplied", s.name, ra.name));
  if (it->second->shape.size() != 3)
    throw Error(fmt::format("spec '{}' is batched over {}: operand A '{}' must be [B, M, K], got {}", s.name,
                            s.batch.str(), ra.name, shape_str(it->second->shape)));
  const int64_t batches = it->second->shape[0];
  if (auto want = try_resolve(s.batch, dims); want && *want != batches)
    throw Error(fmt::format("spec '{}': the batch ({}) is {} but operand A '{}' has {}", s.name, s.batch.str(), *want,
                            ra.name, batches));
  FusionSpec one = s;
  one.batch = Dim{};
  std::vector<bool> sliced(s.args.size(), false);
  for (size_t i = 0; i < s.args.size(); ++i) {
    RuntimeArg& a = one.args[i];
    sliced[i] = a.shape.size() == 3 && a.shape[0] == s.batch;  // per batch: operands, tiles, outputs
    if (sliced[i]) a.shape.erase(a.shape.begin());
  }
  TensorMap out;
  for (int64_t b = 0; b < batches; ++b) {
    std::vector<Tensor> slices;
    slices.reserve(s.args.size());
    std::map<std::string, const Tensor*> refs = args;
    for (size_t i = 0; i < s.args.size(); ++i) {
      const RuntimeArg& a = s.args[i];
      if (!sliced[i] || a.role == ArgRole::Output) continue;
      auto at = args.find(a.name);
      if (at == args.end() || !at->second) continue;  // SpecExec names what is missing
      if (at->second->shape.size() != 3 || at->second->shape[0] != batches)
        throw Error(fmt::format("spec '{}': {} argument '{}' has shape {}, expected {} batches first", s.name,
                                name_of(a.role), a.name, shape_str(at->second->shape), batches));
      slices.push_back(batch_slice(*at->second, b));
      refs[a.name] = &slices.back();
    }
    for (auto& [name, v] : SpecExec(one, dims, refs, t).run()) {
      Tensor& o = out[name];
      if (b == 0) {
        o.shape = v.shape;
        o.shape.insert(o.shape.begin(), batches);
        o.data.reserve(static_cast<size_t>(o.numel()));
      }
      o.data.insert(o.data.end(), v.data.begin(), v.data.end());
    }
  }
  return out;
}

// Columns [c0, c0 + w) of a rank-2 [rows, cols] tensor.
Tensor column_slice(const Tensor& x, int64_t c0, int64_t w) {
  Tensor out;
  out.shape = {x.shape[0], w};
  out.data.reserve(static_cast<size_t>(x.shape[0] * w));
  for (int64_t r = 0; r < x.shape[0]; ++r) {
    const auto row = x.data.begin() + r * x.shape[1] + c0;
    out.data.insert(out.data.end(), row, row + w);
  }
  return out;
}

// A per-segment spec (FusionSpec::segment) runs as the kernel does: each run of `segment` columns
// is a GEMM of its own with N = segment (B's rows or columns, tile inputs' columns, row vectors'
// elements of the run; a periodic row vector whole), whose outputs are laid side by side.
TensorMap run_segmented(const FusionSpec& s, const Bindings& dims, const std::map<std::string, const Tensor*>& args,
                        const ReduceTiling& t) {
  const int64_t S = s.segment;
  const RuntimeArg& rb = s.args.at(static_cast<size_t>(std::max(0, s.arg_index(ArgRole::OperandB))));
  auto it = args.find(rb.name);
  if (it == args.end() || !it->second || it->second->shape.size() != 2)
    throw Error(fmt::format("spec '{}': operand B argument '{}' was not supplied as a matrix", s.name, rb.name));
  const Tensor& B = *it->second;
  const int64_t N = s.b_layout == BLayout::NK ? B.shape[0] : B.shape[1];
  if (N % S != 0)
    throw Error(fmt::format("spec '{}': N = {} is not a whole number of segments of {} columns", s.name, N, S));
  FusionSpec one = s;
  one.segment = 0;
  one.n = Dim::of(S);
  for (RuntimeArg& a : one.args) {
    if (a.role == ArgRole::Output && a.value_class != ValueClass::Tile)
      throw Error(fmt::format("spec '{}': output '{}' is per row; a per-segment spec stores tiles only", s.name, a.name));
    // The dim that is N (not M, which may equal it): B's rows (N x K) or columns, else the last.
    const bool b = a.role == ArgRole::OperandB || a.role == ArgRole::OperandGate;
    const size_t at = b && s.b_layout == BLayout::NK ? 0 : a.shape.size() - 1;
    if (a.role != ArgRole::OperandA && !a.shape.empty() && a.shape[at] == s.n) a.shape[at] = Dim::of(S);
  }
  Bindings bound = dims;
  if (!s.n.sym.empty()) bound.erase(s.n.sym);
  TensorMap out;
  for (int64_t c0 = 0; c0 < N; c0 += S) {
    std::vector<Tensor> slices;
    slices.reserve(s.args.size());
    std::map<std::string, const Tensor*> refs = args;
    for (const RuntimeArg& a : s.args) {
      auto at = args.find(a.name);
      if (a.role == ArgRole::Output || at == args.end() || !at->second || periodic_arg(s, a)) continue;
      const Tensor& x = *at->second;
      if (a.role == ArgRole::OperandB || a.role == ArgRole::OperandGate) {
        if (s.b_layout == BLayout::NK) {
          Tensor rows;
          rows.shape = {S, x.shape[1]};
          rows.data.assign(x.data.begin() + c0 * x.shape[1], x.data.begin() + (c0 + S) * x.shape[1]);
          slices.push_back(std::move(rows));
        } else {
          slices.push_back(column_slice(x, c0, S));
        }
      } else if (a.role == ArgRole::RowVector || a.role == ArgRole::TileInput) {
        if (x.numel() % N != 0)
          throw Error(fmt::format("spec '{}': {} argument '{}' has shape {}, not {} columns", s.name, name_of(a.role),
                                  a.name, shape_str(x.shape), N));
        Tensor x2 = x;
        x2.shape = {x.numel() / N, N};
        slices.push_back(column_slice(x2, c0, S));
      } else {
        continue;
      }
      refs[a.name] = &slices.back();
    }
    for (auto& [name, v] : SpecExec(one, bound, refs, t).run()) {
      Tensor& o = out[name];
      const int64_t rows = v.numel() / S;
      if (c0 == 0) {
        o.shape = v.shape;
        o.shape.back() = N;
        o.data.assign(static_cast<size_t>(rows * N), 0.0);
      }
      for (int64_t r = 0; r < rows; ++r)
        std::copy(v.data.begin() + r * S, v.data.begin() + (r + 1) * S, o.data.begin() + r * N + c0);
    }
  }
  return out;
}

}  // namespace

TensorMap run_spec_refs(const FusionSpec& s, const Bindings& dims, const std::map<std::string, const Tensor*>& args,
                        const ReduceTiling& t) {
  if (s.batched()) return run_batched(s, dims, args, t);
  if (s.segment > 0) return run_segmented(s, dims, args, t);
  return SpecExec(s, dims, args, t).run();
}
}  // namespace interp_detail

TensorMap run_spec(const FusionSpec& s, const Bindings& dims, const TensorMap& args, const ReduceTiling& t) {
  std::map<std::string, const Tensor*> refs;
  for (const auto& [name, t_] : args) refs[name] = &t_;
  return run_spec_refs(s, dims, refs, t);
}

}  // namespace comfuse
