// What a CPU check can take and how close it must come: sizes, memory, sampled rows, and
// the tolerance of the reference comparison.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>

#include "interp_internal.h"

namespace comfuse {
namespace {

using namespace interp_detail;

double elements(const Shape& s, const Bindings& dims) {
  double n = 1;
  for (const Dim& d : s) n *= static_cast<double>(resolve(d, dims));
  return n;
}

std::string gib(double bytes) { return fmt::format("{:.2f} GiB", bytes / double(int64_t{1} << 30)); }

struct MemoryEstimate {
  double inputs = 0, outputs = 0, live_peak = 0;  // elements
  double bytes() const { return 8.0 * (inputs + 2.0 * outputs + 2.0 * live_peak); }
};

// run_graph's liveness, replayed on sizes: the largest set of intermediates alive at once.
MemoryEstimate estimate(const Graph& g, const Bindings& dims) {
  MemoryEstimate m;
  std::vector<int> reads = read_counts(g);
  std::vector<double> size(g.nodes().size(), 0.0);
  double live = 0;
  auto release = [&](int id) {
    if (--reads[static_cast<size_t>(id)] == 0 && g.node(id).kind != OpKind::Input) live -= size[static_cast<size_t>(id)];
  };
  for (const Node& n : g.nodes()) {
    const size_t id = static_cast<size_t>(n.id);
    if (reads[id] == 0) continue;
    size[id] = elements(n.shape, dims);
    if (n.kind == OpKind::Input) {
      m.inputs += size[id];
    } else {
      live += size[id];
      m.live_peak = std::max(m.live_peak, live);
      for (int i : n.inputs) release(i);
    }
    for (const GraphOutput& o : g.outputs())
      if (o.node == n.id) {
        m.outputs += size[id];
        release(n.id);
      }
  }
  return m;
}

double rounding_tolerance(DType t) { return t == DType::BF16 ? 4e-3 : t == DType::F16 ? 5e-4 : 1e-6; }

}  // namespace

void check_sizes(const Graph& g, const Bindings& dims) {
  std::set<std::string> seen;
  for (const Node& n : g.nodes()) {
    // A per-segment value's last dim (a segmented reduction's, rotate_half's, a periodic operand's
    // consumer's), bound now, in whole runs (graph.cpp checked it where concrete).
    if (n.segment > 0 && !n.shape.empty()) {
      const Dim& last = n.shape.back();
      if (const int64_t cols = resolve(last, dims); cols % n.segment != 0) {
        throw Error(n.loc, fmt::format("the last dim of {}, {} = {}, is not a whole number of runs of {} columns",
                                       user_descriptions(g, SourceLines::Omit)[static_cast<size_t>(n.id)],
                                       last.str(), cols, n.segment));
      }
    }
    for (const Dim& d : n.shape) {
      if (!d.sym.empty() && !seen.insert(d.sym).second) continue;
      const int64_t v = resolve(d, dims);
      if (!dim_size_ok(v))  // the message names the node only on the way out (a pass over the graph)
        check_dim_size(d.sym.empty() ? fmt::format("a dimension of {}", user_descriptions(g)[static_cast<size_t>(n.id)])
                                     : d.sym,
                       v);
    }
    if (n.kind == OpKind::MatMul) {  // [M, N] or batched [B, M, N]: the last two dims
      const Node& a = g.node(n.inputs[0]);
      const Dim &m = n.shape[n.shape.size() - 2], &nn = n.shape.back(), &k = a.shape.back();
      check_problem_size(resolve(m, dims), resolve(nn, dims), resolve(k, dims), dim_label(m, "M"), dim_label(nn, "N"),
                         dim_label(k, "K"));
    }
  }
}

int64_t reference_memory_bytes(const Graph& g, const Bindings& dims) {
  const double b = estimate(g, dims).bytes();
  return b >= 9.2e18 ? INT64_MAX : static_cast<int64_t>(b);
}

int64_t reference_memory_budget() {
  const char* v = std::getenv("COMFUSE_REFERENCE_GIB");
  if (v == nullptr || *v == '\0') return kReferenceMemoryBudget;
  char* end = nullptr;
  const double gibs = std::strtod(v, &end);
  if (*end != '\0' || !(gibs > 0) || gibs > 1e6)
    throw Error(fmt::format(
        "COMFUSE_REFERENCE_GIB = '{}': the fp64 reference's memory budget in GiB, a positive number up to 1e6", v));
  return static_cast<int64_t>(gibs * double(int64_t{1} << 30));
}

void check_reference_memory(const Graph& g, const Bindings& dims, int64_t budget) {
  check_sizes(g, dims);
  const MemoryEstimate m = estimate(g, dims);
  if (m.bytes() <= static_cast<double>(budget)) return;
  throw Error(fmt::format("the fp64 CPU reference would hold about {} at once (inputs {}, outputs {} twice, up to {} "
                          "of intermediates twice); its budget is {}: check smaller dims (the lowering does not "
                          "depend on them), or raise the budget where the memory is there (COMFUSE_REFERENCE_GIB)",
                          gib(m.bytes()), gib(8 * m.inputs), gib(8 * m.outputs), gib(8 * m.live_peak),
                          gib(static_cast<double>(budget))));
}

std::vector<int64_t> reference_rows(int64_t m, int64_t n, int64_t k) {
  std::vector<int64_t> rows;
  if (double(m) * double(n) * double(k) <= 2e9 || m <= 48) {
    for (int64_t r = 0; r < m; ++r) rows.push_back(r);
    return rows;
  }
  for (int64_t r = 0; r < 16; ++r) rows.push_back(r);                        // first tile's rows
  for (int64_t i = 1; i <= 16; ++i) rows.push_back(i * (m - 32) / 17 + 16);  // spread
  for (int64_t r = m - 16; r < m; ++r) rows.push_back(r);                    // ragged last tile
  return rows;
}

bool row_local(const Graph& g, const std::string& m) {
  if (m.empty()) return false;
  auto mentions = [&](const Shape& s) {
    return std::any_of(s.begin(), s.end(), [&](const Dim& d) { return d.sym == m; });
  };
  for (const Node& n : g.nodes()) {
    for (size_t i = 0; i < n.shape.size(); ++i)
      // M only indexes rows: dim 0 of a matrix, dim 1 of a batch of them ([B, M, N])
      if (n.shape[i].sym == m && !(n.shape.size() >= 2 && i + 2 == n.shape.size())) return false;
    switch (n.kind) {
      case OpKind::Transpose:
        if (mentions(g.node(n.inputs[0]).shape)) return false;
        break;
      case OpKind::Reduce: {
        const Shape& in = g.node(n.inputs[0]).shape;
        if (n.reduce_dim != static_cast<int>(in.size()) - 1 && in[static_cast<size_t>(n.reduce_dim)].sym == m)
          return false;  // across rows
        break;
      }
      case OpKind::MatMul:
        if (mentions(g.node(n.inputs[1]).shape)) return false;  // B indexed by M: X x X^T
        break;
      case OpKind::CausalMask: break;  // reads the row's index too: run_graph takes it from its RowSample
      default: break;
    }
  }
  return true;
}

double reference_tolerance(const Graph& g, const LoweringResult& r, const GraphOutput& o) {
  double tol = o.dtype == DType::F32 ? 1e-9 : rounding_tolerance(o.dtype);
  // What o's value depends on.
  std::vector<bool> upstream(g.nodes().size(), false);
  upstream[static_cast<size_t>(o.node)] = true;
  for (int id = o.node; id >= 0; --id)
    if (upstream[static_cast<size_t>(id)])
      for (int in : g.node(id).inputs) upstream[static_cast<size_t>(in)] = true;
  std::vector<int> region_of(g.nodes().size(), -1);
  for (size_t i = 0; i < r.regions.size(); ++i) {
    region_of[static_cast<size_t>(r.regions[i].matmul_node)] = static_cast<int>(i);
    for (int id : r.regions[i].fused_nodes) region_of[static_cast<size_t>(id)] = static_cast<int>(i);
  }
  // A value a region stores and an upstream op outside the region reads back, as stored.
  const auto consumers = g.consumers();
  for (const FusedRegion& reg : r.regions)
    for (const RuntimeArg& a : reg.spec.args) {
      if (a.role != ArgRole::Output || a.graph_node < 0) continue;
      for (int c : consumers[static_cast<size_t>(a.graph_node)])
        if (upstream[static_cast<size_t>(c)] && region_of[static_cast<size_t>(c)] != region_of[static_cast<size_t>(a.graph_node)])
          tol = std::max(tol, rounding_tolerance(a.dtype));
    }
  return tol;
}

}  // namespace comfuse
