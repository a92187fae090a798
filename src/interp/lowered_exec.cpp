// run_lowered: a lowered graph executed as the runtime would: each fused region through
// run_spec (its kernel), every other node one by one, on demand in dependency order.
#include <fmt/format.h>

#include <optional>

#include "interp_internal.h"

namespace comfuse {
namespace {
using namespace interp_detail;

int width_rank(DType d) { return d == DType::F32 ? 2 : 1; }

class LoweredExec {
 public:
  LoweredExec(const Graph& g, const LoweringResult& r, const Bindings& dims, const TensorMap& inputs,
              const ReduceTiling& t)
      : g_(g), r_(r), dims_(dims), inputs_(inputs), tiling_(t), vals_(g.nodes().size()),
        region_of_(g.nodes().size(), -1), state_(r.regions.size(), 0), stored_(g.nodes().size()) {
    for (size_t i = 0; i < r.regions.size(); ++i) {
      const FusedRegion& reg = r.regions[i];
      std::vector<int> ids = reg.fused_nodes;
      ids.push_back(reg.matmul_node);
      for (int id : ids) {
        if (id < 0 || id >= static_cast<int>(g.nodes().size()))
          throw Error(fmt::format("region {} names node {}, which is not in the graph", i, id));
        if (region_of_[id] >= 0 && region_of_[id] != static_cast<int>(i))
          throw Error(fmt::format("node '{}' is fused into regions {} and {}", g.node(id).name, region_of_[id], i));
        region_of_[id] = static_cast<int>(i);
      }
    }
  }

  TensorMap run() {
    TensorMap out;
    for (const GraphOutput& o : g_.outputs()) {
      eval(o.node);
      const Tensor* pick = nullptr;
      for (const Stored& s : stored_[o.node])
        if (s.name == o.name) pick = &s.value;  // the region stored this very output
      out[o.name] = rounded(pick ? *pick : *vals_[o.node], o.dtype);
    }
    return out;
  }

 private:
  struct Stored {
    std::string name;
    DType dtype;
    Tensor value;
  };

  void eval(int id) {
    if (vals_[id]) return;
    const Node& n = g_.node(id);
    if (n.kind == OpKind::Input) {
      vals_[id] = take_input(n, dims_, inputs_);
      return;
    }
    if (region_of_[id] >= 0) {
      run_region(region_of_[id]);
      if (!vals_[id])
        throw Error(fmt::format("region {} ('{}') fuses node '{}' but does not store it, and it is needed outside",
                                region_of_[id], r_.regions[region_of_[id]].spec.name, n.name));
      return;
    }
    std::vector<const Tensor*> in;
    for (int i : n.inputs) eval(i);
    for (int i : n.inputs) in.push_back(&*vals_[i]);
    vals_[id] = eval_node(n, dims_, in);
  }

  void run_region(int ri) {
    if (state_[ri] == 2) return;
    const FusedRegion& reg = r_.regions[ri];
    if (state_[ri] == 1) throw Error(fmt::format("region {} ('{}') depends on its own result", ri, reg.spec.name));
    state_[ri] = 1;
    TensorMap args;
    for (const RuntimeArg& a : reg.spec.args) {
      if (a.role == ArgRole::Output) continue;
      if (a.graph_node < 0 || a.graph_node >= static_cast<int>(g_.nodes().size()))
        throw Error(fmt::format("region {}: argument '{}' names no graph node", ri, a.name));
      if (region_of_[a.graph_node] == ri)
        throw Error(fmt::format("region {}: argument '{}' is a value fused into the same region", ri, a.name));
      eval(a.graph_node);
      args[a.name] = *vals_[a.graph_node];
    }
    TensorMap out = run_spec(reg.spec, dims_, args, tiling_);
    for (const RuntimeArg& a : reg.spec.args) {
      if (a.role != ArgRole::Output) continue;
      if (a.graph_node < 0 || a.graph_node >= static_cast<int>(g_.nodes().size()))
        throw Error(fmt::format("region {}: output '{}' names no graph node", ri, a.name));
      Tensor& t = out.at(a.name);
      // Consumers outside read the widest copy the region stored.
      auto& best = best_dtype_[a.graph_node];
      if (!vals_[a.graph_node] || width_rank(a.dtype) > width_rank(best)) {
        vals_[a.graph_node] = t;
        best = a.dtype;
      }
      stored_[a.graph_node].push_back(Stored{a.name, a.dtype, std::move(t)});
    }
    state_[ri] = 2;
  }

  const Graph& g_;
  const LoweringResult& r_;
  const Bindings& dims_;
  const TensorMap& inputs_;
  ReduceTiling tiling_;
  std::vector<std::optional<Tensor>> vals_;
  std::vector<int> region_of_;
  std::vector<int> state_;  // per region: 0 not run, 1 running, 2 done
  std::vector<std::vector<Stored>> stored_;
  std::map<int, DType> best_dtype_;
};

}  // namespace

TensorMap run_lowered(const Graph& g, const LoweringResult& r, const Bindings& dims, const TensorMap& inputs,
                      const ReduceTiling& t) {
  return LoweredExec(g, r, dims, inputs, t).run();
}

}  // namespace comfuse
