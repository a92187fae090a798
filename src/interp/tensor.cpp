// Tensor basics, random inputs, comparison, and the tiled row reduction of the kernels.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "interp_internal.h"

namespace comfuse {

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

double Tensor::at(int64_t r, int64_t c) const {
  switch (shape.size()) {
    case 0: return data[0];
    case 1: return data[static_cast<size_t>(shape[0] == 1 ? 0 : c)];
    default: {
      const int64_t rr = shape[0] == 1 ? 0 : r, cc = shape[1] == 1 ? 0 : c;
      return data[static_cast<size_t>(rr * shape[1] + cc)];
    }
  }
}

namespace interp_detail {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::vector<int64_t> concrete_shape(const Shape& s, const Bindings& b) {
  std::vector<int64_t> out;
  for (const Dim& d : s) out.push_back(resolve(d, b));
  return out;
}

std::optional<int64_t> try_resolve(const Dim& d, const Bindings& b) {
  if (d.sym.empty()) return d.size;
  auto it = b.find(d.sym);
  if (it == b.end()) return std::nullopt;
  return it->second;
}

Tensor filled(std::vector<int64_t> shape, double v) {
  Tensor t;
  t.shape = std::move(shape);
  t.data.assign(static_cast<size_t>(t.numel()), v);
  return t;
}

Tensor rounded(Tensor t, DType d) {
  for (double& x : t.data) x = round_to(d, x);
  return t;
}

Tensor matmul(const Tensor& a, const Tensor& b, BLayout layout) {
  // Rank 2, or rank 3: one product per index of the shared leading (batch) dim.
  const size_t rank = a.shape.size();
  if ((rank != 2 && rank != 3) || b.shape.size() != rank)
    throw Error(fmt::format("matmul: operands must be rank 2 (or both rank 3, batched), got {} and {}",
                            shape_str(a.shape), shape_str(b.shape)));
  const int64_t batches = rank == 3 ? a.shape[0] : 1;
  if (rank == 3 && b.shape[0] != batches)
    throw Error(fmt::format("matmul: batch dims differ: A {} and B {}", shape_str(a.shape), shape_str(b.shape)));
  const size_t r0 = rank - 2, r1 = rank - 1;
  const int64_t M = a.shape[r0], K = a.shape[r1];
  const int64_t N = layout == BLayout::NK ? b.shape[r0] : b.shape[r1];
  const int64_t Kb = layout == BLayout::NK ? b.shape[r1] : b.shape[r0];
  if (K != Kb)
    throw Error(fmt::format("matmul: contraction dims differ: A {} and B {} ({})", shape_str(a.shape),
                            shape_str(b.shape), layout == BLayout::NK ? "N x K" : "K x N"));
  Tensor c = filled(rank == 3 ? std::vector<int64_t>{batches, M, N} : std::vector<int64_t>{M, N});
  for (int64_t bt = 0; bt < batches; ++bt) {
    const double* ap = a.data.data() + bt * M * K;
    const double* bp = b.data.data() + bt * N * K;
    double* cp = c.data.data() + bt * M * N;
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double acc = 0.0;
        for (int64_t k = 0; k < K; ++k)
          acc += ap[i * K + k] * (layout == BLayout::NK ? bp[j * K + k] : bp[k * N + j]);
        cp[i * N + j] = acc;
      }
  }
  return c;
}

}  // namespace interp_detail

using namespace interp_detail;

double reduce_row_tiled(ReduceOp op, const double* x, int64_t n, const ReduceTiling& t) {
  if (t.tile_n <= 0 || t.lanes <= 0 || t.frag <= 0) throw Error("reduce_row_tiled: tiling parameters must be positive");
  const double pad = t.pad ? *t.pad : reduce_identity(op);
  const int64_t tiles = std::max<int64_t>(1, (n + t.tile_n - 1) / t.tile_n);
  auto tree = [&](std::vector<double> p) {
    while (p.size() > 1) {
      std::vector<double> next;
      for (size_t i = 0; i + 1 < p.size(); i += 2) next.push_back(reduce_combine(op, p[i], p[i + 1]));
      if (p.size() % 2) next.push_back(p.back());
      p.swap(next);
    }
    return p[0];
  };
  std::vector<double> tile_partials;
  std::vector<double> lane(static_cast<size_t>(t.lanes));
  for (int64_t tile = 0; tile < tiles; ++tile) {
    std::fill(lane.begin(), lane.end(), reduce_identity(op));
    // Thread-local phase: every column of the (padded) tile reaches exactly one lane.
    for (int64_t j = 0; j < t.tile_n; ++j) {
      const int64_t col = tile * t.tile_n + j;
      const double v = col < n ? x[col] : pad;
      double& acc = lane[static_cast<size_t>((j / t.frag) % t.lanes)];
      acc = reduce_combine(op, acc, v);
    }
    tile_partials.push_back(tree(lane));  // butterfly across the lanes sharing the row
  }
  return reduce_finalize(op, tree(tile_partials), n);  // across the CTAs of the cluster
}

TensorMap random_inputs(const Graph& g, const Bindings& dims, std::mt19937_64& rng, double offset) {
  check_sizes(g, dims);
  std::map<int, int64_t> gemm_k;  // input node -> K of a matmul it feeds
  for (const Node& n : g.nodes()) {
    if (n.kind != OpKind::MatMul) continue;
    const int64_t K = resolve(g.node(n.inputs[0]).shape.back(), dims);
    for (int in : n.inputs) gemm_k[in] = std::max<int64_t>(K, 1);
  }
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  TensorMap out;
  for (const Node& n : g.nodes()) {
    if (n.kind != OpKind::Input) continue;
    Tensor t = filled(concrete_shape(n.shape, dims));
    int unit_dims = 0;
    for (int64_t d : t.shape) unit_dims += d == 1;
    const bool scalar = unit_dims == static_cast<int>(t.shape.size());
    const bool vector = !scalar && (t.shape.size() == 1 || unit_dims == 1);
    auto it = gemm_k.find(n.id);
    for (double& v : t.data) {
      do {
        double x;
        if (it != gemm_k.end()) x = normal(rng) * std::pow(static_cast<double>(it->second), -0.25);
        else if (scalar) x = 0.5 + 1.5 * unit(rng);
        else if (vector) x = offset + (0.5 + unit(rng)) * (unit(rng) < 0.5 ? -1.0 : 1.0);
        else x = offset + normal(rng);
        v = round_to(n.dtype, x);
      } while (v == 0.0 || !std::isfinite(v));
    }
    out[n.name] = std::move(t);
  }
  return out;
}

Comparison compare(const Tensor& got, const Tensor& ref, double rel_floor) {
  if (got.shape != ref.shape)
    throw Error(fmt::format("compare: shapes differ: got {}, reference {}", shape_str(got.shape), shape_str(ref.shape)));
  Comparison c;
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.data.size(); ++i) {
    const double a = got.data[i], b = ref.data[i];
    if (!std::isfinite(a) || !std::isfinite(b)) {
      ++c.nonfinite;
      c.nonfinite_differ += !((std::isnan(a) && std::isnan(b)) || a == b);
      continue;
    }
    const double d = std::fabs(a - b);
    c.max_abs = std::max(c.max_abs, d);
    c.max_rel = std::max(c.max_rel, d / std::max(std::fabs(b), rel_floor));
    num += d * d;
    den += b * b;
  }
  c.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return c;
}

}  // namespace comfuse
