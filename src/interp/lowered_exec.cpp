// run_lowered: a lowered graph executed as the runtime would: each fused region through
// run_spec (its kernel), every other node one by one, in dependency order. Each value is
// freed after its last read, so long chains hold a few tensors at a time.
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
      : g_(g), r_(r), dims_(dims), inputs_(inputs), tiling_(t), owned_(g.nodes().size()),
        val_(g.nodes().size(), nullptr), reads_(g.nodes().size(), 0), region_of_(g.nodes().size(), -1) {
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
      for (const RuntimeArg& a : reg.spec.args)
        if (a.graph_node < 0 || a.graph_node >= static_cast<int>(g.nodes().size()))
          throw Error(fmt::format("region {}: argument '{}' names no graph node", i, a.name));
    }
  }

  TensorMap run() {
    schedule();
    for (const Unit& u : order_) u.region >= 0 ? run_region(u.region) : run_node(u.node);
    for (const GraphOutput& o : g_.outputs())
      if (!out_.count(o.name)) out_[o.name] = rounded(value(o.node), o.dtype);
    return std::move(out_);
  }

 private:
  // What runs as one step: a region (its kernel) or a node outside every region.
  struct Unit {
    int region = -1, node = -1;
    bool operator==(const Unit& o) const { return region == o.region && node == o.node; }
  };

  // The unit that makes node `id`'s value; none (node -1) for graph inputs.
  Unit unit_of(int id) const {
    if (region_of_[id] >= 0) return {region_of_[id], -1};
    if (g_.node(id).kind == OpKind::Input) return {-1, -1};
    return {-1, id};
  }

  // Values a unit reads (node ids; once per read).
  std::vector<int> reads_of(const Unit& u) const {
    if (u.node >= 0) return g_.node(u.node).inputs;
    std::vector<int> in;
    for (const RuntimeArg& a : r_.regions[static_cast<size_t>(u.region)].spec.args) {
      if (a.role == ArgRole::Output) continue;
      if (region_of_[a.graph_node] == u.region)
        throw Error(fmt::format("region {}: argument '{}' is a value fused into the same region", u.region, a.name));
      in.push_back(a.graph_node);
    }
    return in;
  }

  // Whether region `r` stores output `o` under its name (the output is then taken from the store).
  bool stores_output(int r, const GraphOutput& o) const {
    for (const RuntimeArg& a : r_.regions[static_cast<size_t>(r)].spec.args)
      if (a.role == ArgRole::Output && a.name == o.name && a.graph_node == o.node) return true;
    return false;
  }

  // Every unit the outputs need, dependencies first (an explicit stack: chains may be long),
  // and how often each value will be read.
  void schedule() {
    std::vector<int> node_state(g_.nodes().size(), 0), region_state(r_.regions.size(), 0);  // 0 new, 1 open, 2 done
    auto state = [&](const Unit& u) -> int& { return u.region >= 0 ? region_state[u.region] : node_state[u.node]; };
    struct Open {
      Unit u;
      std::vector<int> in;  // reads_of(u)
      size_t next = 0;      // the next read to visit
    };
    std::vector<Open> stack;
    auto visit = [&](int id) {
      const Unit root = unit_of(id);
      if (root.region < 0 && root.node < 0) return;
      if (state(root) == 2) return;
      stack.push_back({root, reads_of(root), 0});
      state(root) = 1;
      while (!stack.empty()) {
        Open& top = stack.back();
        if (top.next < top.in.size()) {
          const Unit d = unit_of(top.in[top.next++]);
          if (d.region < 0 && d.node < 0) continue;
          if (state(d) == 1) {
            if (d.region >= 0)
              throw Error(fmt::format("region {} ('{}') depends on its own result", d.region,
                                      r_.regions[static_cast<size_t>(d.region)].spec.name));
            throw Error(fmt::format("node '{}' depends on its own value", g_.node(d.node).name));
          }
          if (state(d) == 0) {
            state(d) = 1;
            stack.push_back({d, reads_of(d), 0});  // invalidates `top`
          }
          continue;
        }
        for (int i : top.in) ++reads_[static_cast<size_t>(i)];
        state(top.u) = 2;
        order_.push_back(top.u);
        stack.pop_back();
      }
    };
    for (const GraphOutput& o : g_.outputs()) {
      visit(o.node);
      const Unit u = unit_of(o.node);
      if (u.region < 0 || !stores_output(u.region, o)) ++reads_[static_cast<size_t>(o.node)];
    }
  }

  const Tensor& value(int id) {
    if (!val_[id]) {
      const Node& n = g_.node(id);
      if (n.kind == OpKind::Input) {
        val_[id] = &take_input(n, dims_, inputs_);
      } else if (region_of_[id] >= 0) {
        throw Error(fmt::format("region {} ('{}') fuses node '{}' but does not store it, and it is needed outside",
                                region_of_[id], r_.regions[static_cast<size_t>(region_of_[id])].spec.name, n.name));
      } else {
        throw Error(fmt::format("node '{}' is read before it is computed", n.name));
      }
    }
    return *val_[id];
  }

  void release(int id) {
    if (--reads_[static_cast<size_t>(id)] <= 0) {
      owned_[id].reset();
      val_[id] = nullptr;
    }
  }

  void set(int id, Tensor t) {
    owned_[id] = std::move(t);
    val_[id] = &*owned_[id];
  }

  void run_node(int id) {
    const Node& n = g_.node(id);
    std::vector<const Tensor*> in;
    for (int i : n.inputs) in.push_back(&value(i));
    Tensor t = eval_node(n, dims_, in);
    for (int i : n.inputs) release(i);
    if (reads_[static_cast<size_t>(id)] > 0) set(id, std::move(t));
  }

  void run_region(int ri) {
    const FusedRegion& reg = r_.regions[static_cast<size_t>(ri)];
    std::map<std::string, const Tensor*> args;
    for (const RuntimeArg& a : reg.spec.args)
      if (a.role != ArgRole::Output) args[a.name] = &value(a.graph_node);
    TensorMap out = run_spec_refs(reg.spec, dims_, args, tiling_);
    for (const RuntimeArg& a : reg.spec.args)
      if (a.role != ArgRole::Output) release(a.graph_node);
    std::map<int, DType> kept;  // node -> dtype of the copy kept for consumers outside
    for (const RuntimeArg& a : reg.spec.args) {
      if (a.role != ArgRole::Output) continue;
      Tensor& t = out.at(a.name);
      for (const GraphOutput& o : g_.outputs())
        if (o.name == a.name && o.node == a.graph_node) out_[o.name] = rounded(t, o.dtype);
      // Consumers outside read the widest copy the region stored, as stored.
      if (reads_[static_cast<size_t>(a.graph_node)] <= 0) continue;
      auto it = kept.find(a.graph_node);
      if (it == kept.end() || width_rank(a.dtype) > width_rank(it->second)) {
        kept[a.graph_node] = a.dtype;
        set(a.graph_node, std::move(t));
      }
    }
  }

  const Graph& g_;
  const LoweringResult& r_;
  const Bindings& dims_;
  const TensorMap& inputs_;
  ReduceTiling tiling_;
  std::vector<std::optional<Tensor>> owned_;  // computed values still to be read
  std::vector<const Tensor*> val_;            // owned_ or a graph input
  std::vector<int> reads_;                    // reads still to come, per node
  std::vector<int> region_of_;
  std::vector<Unit> order_;
  TensorMap out_;
};

}  // namespace

TensorMap run_lowered(const Graph& g, const LoweringResult& r, const Bindings& dims, const TensorMap& inputs,
                      const ReduceTiling& t) {
  check_sizes(g, dims);
  check_reference_memory(g, dims);
  return LoweredExec(g, r, dims, inputs, t).run();
}

}  // namespace comfuse
