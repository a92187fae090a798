// run_graph: the fp64 reference for every op of the graph, fused domain or not.
#include <fmt/format.h>

#include <cmath>
#include <optional>

#include "interp_internal.h"

namespace comfuse {
namespace interp_detail {

const Tensor& take_input(const Node& n, const Bindings& dims, const TensorMap& inputs) {
  auto it = inputs.find(n.name);
  if (it == inputs.end())
    throw Error(n.loc, fmt::format("input '{}' of shape {} was not supplied", n.name, to_string(n.shape)));
  const std::vector<int64_t> want = concrete_shape(n.shape, dims);
  const Tensor& t = it->second;
  if (t.shape != want)
    throw Error(n.loc, fmt::format("input '{}' has shape {}, but the graph declares {} = {}", n.name,
                                   shape_str(t.shape), to_string(n.shape), shape_str(want)));
  if (static_cast<int64_t>(t.data.size()) != t.numel())
    throw Error(n.loc, fmt::format("input '{}': {} values for shape {}", n.name, t.data.size(), shape_str(t.shape)));
  return t;
}

namespace {

Tensor reduce(const Node& n, const Tensor& x) {
  const int rank = static_cast<int>(x.shape.size());
  const int dim = n.reduce_dim < 0 ? rank - 1 : n.reduce_dim;
  if (rank == 0 || dim >= rank) throw Error(n.loc, fmt::format("reduce '{}': bad dim {} for rank {}", n.name, dim, rank));
  // View x as [outer, len, inner] with the reduced dim in the middle.
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < dim; ++i) outer *= x.shape[i];
  for (int i = dim + 1; i < rank; ++i) inner *= x.shape[i];
  const int64_t len = x.shape[dim];
  if (n.segment > 0) {  // each run of `segment` columns of the last dim; the shape stays
    if (dim != rank - 1 || len % n.segment != 0)
      throw Error(n.loc, fmt::format("reduce '{}': the last dim of {} is not a whole number of segments of {}", n.name,
                                     shape_str(x.shape), n.segment));
    Tensor out = filled(x.shape);
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t s0 = 0; s0 < len; s0 += n.segment) {
        double acc = reduce_identity(n.reduce);
        for (int64_t l = s0; l < s0 + n.segment; ++l) acc = reduce_combine(n.reduce, acc, x.data[static_cast<size_t>(o * len + l)]);
        acc = reduce_finalize(n.reduce, acc, n.segment);
        for (int64_t l = s0; l < s0 + n.segment; ++l) out.data[static_cast<size_t>(o * len + l)] = acc;
      }
    return out;
  }
  std::vector<int64_t> shape = x.shape;
  shape[dim] = 1;
  Tensor out = filled(shape);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      double acc = reduce_identity(n.reduce);
      for (int64_t l = 0; l < len; ++l)
        acc = reduce_combine(n.reduce, acc, x.data[static_cast<size_t>((o * len + l) * inner + i)]);
      out.data[static_cast<size_t>(o * inner + i)] = reduce_finalize(n.reduce, acc, len);
    }
  return out;
}

}  // namespace

Tensor eval_node(const Node& n, const Bindings& dims, const std::vector<const Tensor*>& in, const RowSample& sample) {
  switch (n.kind) {
    case OpKind::Input: throw Error(n.loc, "eval_node: inputs are taken, not evaluated");
    case OpKind::Constant: return filled({}, n.value);
    case OpKind::MatMul: return matmul(*in[0], *in[1], n.b_layout);
    case OpKind::Unary: {
      Tensor t = *in[0];
      for (double& v : t.data) v = apply(n.unary, v);
      return t;
    }
    case OpKind::Cast: return rounded(*in[0], n.dtype);
    case OpKind::Binary: {
      // numpy broadcasting over rank 0..3, aligned on the right: each operand's dims are
      // either the output's or 1 (stride 0); or an operand whose last dim is the node's segment
      // length ([S] or [rows, S]), read periodically along the last dim (Node::segment).
      Tensor t = filled(concrete_shape(n.shape, dims));
      const size_t rank = t.shape.size();
      std::vector<std::vector<int64_t>> strides;
      bool periodic[2] = {false, false};
      for (const Tensor* x : in) {
        std::vector<int64_t> st(rank, 0);
        if (x->shape.size() > rank)
          throw Error(n.loc, fmt::format("{} '{}': operand shape {} does not broadcast to {}", name_of(n.binary), n.name,
                                         shape_str(x->shape), shape_str(t.shape)));
        const bool per = n.segment > 0 && periodic_operand(x->shape, t.shape, n.segment) &&
                         t.shape.back() % n.segment == 0;
        periodic[strides.size()] = per;
        int64_t stride = 1;
        for (size_t d = x->shape.size(); d-- > 0;) {
          const size_t od = d + rank - x->shape.size();
          if (x->shape[d] != 1 && x->shape[d] != t.shape[od] && !(per && od == rank - 1))
            throw Error(n.loc, fmt::format("{} '{}': operand shape {} does not broadcast to {}", name_of(n.binary),
                                           n.name, shape_str(x->shape), shape_str(t.shape)));
          st[od] = x->shape[d] == 1 ? 0 : stride;
          stride *= x->shape[d];
        }
        strides.push_back(std::move(st));
      }
      std::vector<int64_t> idx(rank, 0);
      auto offset = [&](int i) {
        int64_t o = 0;
        for (size_t d = 0; d < rank; ++d)
          o += (periodic[i] && d == rank - 1 ? idx[d] % n.segment : idx[d]) * strides[static_cast<size_t>(i)][d];
        return static_cast<size_t>(o);
      };
      for (size_t e = 0; e < t.data.size(); ++e) {
        t.data[e] = apply(n.binary, in[0]->data[offset(0)], in[1]->data[offset(1)]);
        for (size_t d = rank; d-- > 0;) {  // next index, last dim fastest
          if (++idx[d] < t.shape[d]) break;
          idx[d] = 0;
        }
      }
      return t;
    }
    case OpKind::Reduce: return reduce(n, *in[0]);
    case OpKind::CausalMask: {
      Tensor t = *in[0];
      if (t.shape.size() != 2 && t.shape.size() != 3)
        throw Error(n.loc, fmt::format("{} '{}' needs rank 2 (or 3, batched)", CausalMaskOp::name, n.name));
      // The last two dims are rows and columns; a leading batch dim repeats the mask per batch.
      const size_t r0 = t.shape.size() - 2;
      const int64_t batches = r0 ? t.shape[0] : 1, rows = t.shape[r0], cols = t.shape[r0 + 1];
      // The row's index in the whole problem: a sample's rows are some rows of it.
      const bool sampled = !sample.dim.empty() && n.shape.at(r0).sym == sample.dim;
      if (sampled && static_cast<int64_t>(sample.rows.size()) != rows)
        throw Error(n.loc, fmt::format("{} '{}': {} rows, but the row sample names {}", CausalMaskOp::name, n.name, rows,
                                       sample.rows.size()));
      for (int64_t b = 0; b < batches; ++b)
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t row = sampled ? sample.rows[static_cast<size_t>(r)] : r;
          for (int64_t c = 0; c < cols; ++c) {
            double& v = t.data[static_cast<size_t>((b * rows + r) * cols + c)];
            v = CausalMaskOp::apply(v, row, c);
          }
        }
      return t;
    }
    case OpKind::RotateHalf: case OpKind::RotatePairs: {
      const bool half = n.kind == OpKind::RotateHalf;
      const Tensor& x = *in[0];
      if (x.shape.empty() || x.shape.back() % n.segment != 0)
        throw Error(n.loc, fmt::format("{} '{}': the last dim of {} is not a whole number of segments of {}",
                                       name_of(n.kind), n.name, shape_str(x.shape), n.segment));
      Tensor t = x;
      const int64_t cols = x.shape.back();
      for (size_t e = 0; e < t.data.size(); ++e) {
        const int64_t c = static_cast<int64_t>(e) % cols, row0 = static_cast<int64_t>(e) - c;
        const int64_t p = half ? RotateHalfOp::partner(c, n.segment) : RotatePairsOp::partner(c);
        const double v = x.data[static_cast<size_t>(row0 + p)];
        t.data[e] = half ? RotateHalfOp::apply(v, c, n.segment) : RotatePairsOp::apply(v, c);
      }
      return t;
    }
    case OpKind::Transpose: {
      const Tensor& x = *in[0];
      if (x.shape.size() != 2) throw Error(n.loc, fmt::format("transpose '{}' needs rank 2", n.name));
      Tensor t = filled({x.shape[1], x.shape[0]});
      for (int64_t r = 0; r < x.shape[0]; ++r)
        for (int64_t c = 0; c < x.shape[1]; ++c)
          t.data[static_cast<size_t>(c * x.shape[0] + r)] = x.data[static_cast<size_t>(r * x.shape[1] + c)];
      return t;
    }
  }
  throw Error(n.loc, "eval_node: unknown op");
}

std::vector<int> read_counts(const Graph& g) {
  std::vector<int> reads(g.nodes().size(), 0);
  std::vector<bool> needed(g.nodes().size(), false);
  for (const GraphOutput& o : g.outputs()) {
    needed[static_cast<size_t>(o.node)] = true;
    ++reads[static_cast<size_t>(o.node)];
  }
  for (int id = static_cast<int>(g.nodes().size()) - 1; id >= 0; --id) {
    if (!needed[static_cast<size_t>(id)]) continue;
    for (int in : g.node(id).inputs) {
      needed[static_cast<size_t>(in)] = true;
      ++reads[static_cast<size_t>(in)];
    }
  }
  return reads;
}

}  // namespace interp_detail

using namespace interp_detail;

std::vector<Tensor> run_graph_all(const Graph& g, const Bindings& dims, const TensorMap& inputs) {
  check_sizes(g, dims);
  std::vector<Tensor> vals(g.nodes().size());
  for (const Node& n : g.nodes()) {  // ids are topological: operands precede their users
    if (n.kind == OpKind::Input) {
      vals[n.id] = take_input(n, dims, inputs);
      continue;
    }
    std::vector<const Tensor*> in;
    for (int i : n.inputs) in.push_back(&vals[i]);
    vals[n.id] = eval_node(n, dims, in);
  }
  return vals;
}

TensorMap run_graph(const Graph& g, const Bindings& dims, const TensorMap& inputs, const RowSample& sample) {
  check_sizes(g, dims);
  check_reference_memory(g, dims);
  // Ids are topological; each value is freed after its last read.
  std::vector<int> reads = read_counts(g);
  std::vector<std::optional<Tensor>> owned(g.nodes().size());
  std::vector<const Tensor*> val(g.nodes().size(), nullptr);
  auto release = [&](int id) {
    if (--reads[static_cast<size_t>(id)] == 0) owned[static_cast<size_t>(id)].reset();
  };
  TensorMap out;
  for (const Node& n : g.nodes()) {
    const size_t id = static_cast<size_t>(n.id);
    if (reads[id] == 0) continue;  // no output needs it
    if (n.kind == OpKind::Input) {
      val[id] = &take_input(n, dims, inputs);
    } else {
      std::vector<const Tensor*> in;
      for (int i : n.inputs) in.push_back(val[static_cast<size_t>(i)]);
      owned[id] = eval_node(n, dims, in, sample);
      val[id] = &*owned[id];
      for (int i : n.inputs) release(i);
    }
    for (const GraphOutput& o : g.outputs())
      if (o.node == n.id) {
        out[o.name] = rounded(*val[id], o.dtype);
        release(n.id);
      }
  }
  return out;
}

}  // namespace comfuse
