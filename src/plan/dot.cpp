// to_dot(): the stage chain as a Graphviz digraph. One `subgraph cluster_sK` per stage
// (nothing else is named cluster_*, so tools and tests can count stages), solid operand
// edges, dashed bypass edges between stages, bold reduction -> PostOp edges, and the plan
// summary plus a legend as the graph label.
#include <fmt/format.h>

#include "plan_internal.h"

namespace comfuse {
namespace {

std::string esc(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') { out += "\\n"; continue; }
    out += c;
  }
  return out;
}

const char* shape_of(NodeCategory c) {
  switch (c) {
    case NodeCategory::AccEntry: return "doubleoctagon";
    case NodeCategory::Broadcast: return "parallelogram";
    case NodeCategory::Compute: return "box";
    case NodeCategory::Reduction: return "invtriangle";
    case NodeCategory::Placeholder: return "ellipse";
    case NodeCategory::Store: return "box3d";
  }
  return "box";
}

std::string id(size_t stage, int node) { return fmt::format("s{}_n{}", stage, node); }

}  // namespace

std::string to_dot(const FusionSpec& s, const Plan& p) {
  const auto stages = plan_detail::collect_stages(s);
  std::string o = fmt::format("digraph \"{}\" {{\n", esc("comfuse_" + s.name));
  o += "  compound=true;\n  rankdir=TB;\n  labelloc=t;\n  node [fontname=\"monospace\", fontsize=10];\n";

  std::string summary = fmt::format(
      "{}: M={} N={} K={}\\ltile {}x{}x{}, {} stages, cluster 1x{}, {} N-tile(s)/CTA\\lstrategy {}, "
      "aggregation {}\\lSMEM {} of {} (unified reduction buffer {})\\lest {:.1f} us\\l"
      "legend: solid = operand, dashed = bypass, bold blue = reduction -> PostOp\\l",
      esc(s.name), p.problem.m, p.problem.n, p.problem.k, p.kernel.tile_m, p.kernel.tile_n, Sm90::kTileK, p.kernel.ring_stages, p.kernel.cluster_n,
      p.kernel.n_tiles, name_of(p.strategy()), name_of(p.kernel.aggregation), plan_detail::fmt_bytes(p.smem.total()),
      plan_detail::fmt_bytes(p.smem_limit), plan_detail::fmt_bytes(p.smem.reduction_buffer), p.estimate.total_us);
  o += fmt::format("  label=\"{}\";\n", summary);

  // Nodes and in-stage operand edges, one cluster per stage.
  for (size_t k = 0; k < stages.size(); ++k) {
    const Spec& st = *stages[k].spec;
    o += fmt::format("  subgraph cluster_s{} {{\n    label=\"stage {}{}\";\n    style=rounded;\n", k, k + 1,
                     stages[k].parent >= 0 ? fmt::format(" (PostOp of stage {})", stages[k].parent + 1) : "");
    for (int i = 0; i < static_cast<int>(st.nodes.size()); ++i) {
      const SpecNode& n = st.nodes[static_cast<size_t>(i)];
      const std::string what = plan_detail::node_label(s, st, i);
      std::string label = fmt::format("n{} {}", i, what);
      if (!n.origin.empty() && n.origin != what && what.rfind(n.origin + "[", 0) != 0) label += "\n" + n.origin;
      std::string extra = n.category == NodeCategory::Placeholder ? ", style=dashed" : "";
      if (i == st.terminal) extra += ", penwidth=2";
      o += fmt::format("    {} [label=\"{}\", shape={}{}];\n", id(k, i), esc(label), shape_of(n.category), extra);
    }
    for (int i = 0; i < static_cast<int>(st.nodes.size()); ++i)
      for (int a : st.nodes[static_cast<size_t>(i)].operands)
        if (a >= 0 && a < static_cast<int>(st.nodes.size())) o += fmt::format("    {} -> {};\n", id(k, a), id(k, i));
    o += "  }\n";
  }

  // Edges between stages: reduction -> its PostOp's stat, parent value -> bypass.
  for (size_t k = 0; k < stages.size(); ++k) {
    if (stages[k].parent < 0) continue;
    const size_t parent = static_cast<size_t>(stages[k].parent);
    const Spec& st = *stages[k].spec;
    bool stat_edge = false;
    for (int i = 0; i < static_cast<int>(st.nodes.size()); ++i) {
      const SpecNode& n = st.nodes[static_cast<size_t>(i)];
      if (n.category != NodeCategory::Placeholder) continue;
      if (n.placeholder == PlaceholderKind::Stat && stages[k].parent_reduction >= 0) {
        o += fmt::format("  {} -> {} [style=bold, color=blue, label=\"stat\"];\n",
                         id(parent, stages[k].parent_reduction), id(k, i));
        stat_edge = true;
      } else if (n.placeholder == PlaceholderKind::Bypass && n.source >= 0) {
        o += fmt::format("  {} -> {} [style=dashed, label=\"bypass\"];\n", id(parent, n.source), id(k, i));
      }
    }
    if (!stat_edge && stages[k].parent_reduction >= 0 && !st.nodes.empty())
      o += fmt::format("  {} -> {} [style=bold, color=blue, lhead=cluster_s{}, label=\"PostOp\"];\n",
                       id(parent, stages[k].parent_reduction), id(k, 0), k);
  }
  o += "}\n";
  return o;
}

}  // namespace comfuse
