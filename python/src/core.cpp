// comfuse._core: a thin nanobind binding over the C++ core's public API (graph.h, text.h,
// lower.h, plan.h, runtime.h, interp.h). Python holds graph values as node ids, ops and dtypes
// by their names in ops.def / dtype.h, and tensors as (data pointer, dtype, shape, row stride):
// no torch C++ here, the torch side (python/comfuse/) checks tensors and passes pointers.
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <memory>
#include <variant>

#include "comfuse/graph.h"
#include "comfuse/interp.h"
#include "comfuse/lower.h"
#include "comfuse/plan.h"
#include "comfuse/runtime.h"
#include "comfuse/text.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace comfuse::py {
namespace {

DType dtype_of(const std::string& s) {
  auto t = dtype_from_name(s);
  if (!t) throw Error("unknown dtype '" + s + "' (bf16, f16, f32)");
  return *t;
}

using DimArg = std::variant<int64_t, std::string>;

Shape shape_of(const std::vector<DimArg>& dims) {
  Shape s;
  for (const DimArg& d : dims)
    s.push_back(std::holds_alternative<int64_t>(d) ? Dim::of(std::get<int64_t>(d)) : Dim::of(std::get<std::string>(d)));
  return s;
}

std::vector<DimArg> dims_of(const Shape& s) {
  std::vector<DimArg> out;
  for (const Dim& d : s) out.push_back(d.sym.empty() ? DimArg(d.size) : DimArg(d.sym));
  return out;
}

// The builder keeps values as node ids on the Python side.
struct PyGraph {
  Graph g;
  Value v(int id) {
    if (id < 0 || id >= static_cast<int>(g.nodes().size())) throw Error("node " + std::to_string(id) + " is not in this graph");
    return Value{&g, id};
  }
  Value opt(int id) { return id < 0 ? Value{&g, -1} : v(id); }
};

nb::dict node_info(const Graph& g, int id) {
  const Node& n = g.node(id);
  nb::dict d;
  d["id"] = n.id;
  d["name"] = n.name;
  d["kind"] = std::string(name_of(n.kind));
  d["dtype"] = std::string(name_of(n.dtype));
  d["shape"] = dims_of(n.shape);
  d["inputs"] = n.inputs;
  if (n.kind == OpKind::Unary) d["op"] = std::string(name_of(n.unary));
  if (n.kind == OpKind::Binary) d["op"] = std::string(name_of(n.binary));
  if (n.kind == OpKind::Reduce) d["op"] = std::string(name_of(n.reduce));
  if (n.kind == OpKind::Constant) d["value"] = n.value;
  d["segment"] = n.segment;
  return d;
}

// A GPU by its plan-option name (`comfuse explain --gpu-model`).
Gpu gpu_model(const std::string& name) {
  const std::optional<Gpu> g = gpu_named(name);
  if (!g) throw Error("gpu_model wants h200 or h100, got '" + name + "'");
  return *g;
}

PlanOptions plan_options(const nb::dict& o) {
  PlanOptions p;
  for (auto [k, v] : o) {
    const std::string key = nb::cast<std::string>(k);
    if (v.is_none()) continue;
    if (key == "cluster_n") p.cluster_n = nb::cast<int>(v);
    else if (key == "tile_n") p.tile_n = nb::cast<int>(v);
    else if (key == "tile_m") p.tile_m = nb::cast<int>(v);
    else if (key == "cluster_m") p.cluster_m = nb::cast<int>(v);
    else if (key == "row_group") p.row_group = nb::cast<int>(v);
    else if (key == "k_splits") p.k_splits = nb::cast<int>(v);
    else if (key == "splits_in_cluster") p.splits_in_cluster = nb::cast<bool>(v);
    else if (key == "split_gather_in_smem") p.split_gather_in_smem = nb::cast<bool>(v);
    else if (key == "stash_bytes") p.stash_bytes = nb::cast<int>(v);
    else if (key == "fuse_pairs") p.fuse_pairs = nb::cast<bool>(v);
    else if (key == "keep_pair_exp") p.keep_pair_exp = nb::cast<bool>(v);
    else if (key == "poll_backoff") p.poll_backoff = nb::cast<bool>(v);
    else if (key == "turn_lead") p.turn_lead = nb::cast<int>(v);
    else if (key == "store_stages") p.store_stages = nb::cast<int>(v);
    else if (key == "b2b_job_rows") p.b2b_job_rows = nb::cast<int>(v);
    else if (key == "ring_stages") p.ring_stages = nb::cast<int>(v);
    else if (key == "consumer_wgs") p.consumer_wgs = nb::cast<int>(v);
    else if (key == "ring_inputs") p.ring_inputs = nb::cast<bool>(v);
    else if (key == "fma_exp_every") p.fma_exp_every = nb::cast<int>(v);
    else if (key == "b2b_overlap") p.b2b_overlap = nb::cast<bool>(v);
    else if (key == "b2b_x_resident") p.b2b_x_resident = nb::cast<bool>(v);
    else if (key == "b2b_x_buffers") p.b2b_x_buffers = nb::cast<int>(v);
    else if (key == "b2b_chain_jobs") p.b2b_chain_jobs = nb::cast<bool>(v);
    else if (key == "b2b_decode") p.b2b_decode = nb::cast<bool>(v);
    else if (key == "b2b") {  // a B2B pair: one kernel where it pays (auto), always (force), never (off)
      const std::string b = nb::cast<std::string>(v);
      p.b2b = b == "auto" ? PlanOptions::B2b::Auto
              : b == "force" ? PlanOptions::B2b::Force
              : b == "off" ? PlanOptions::B2b::Off
                           : throw Error("b2b wants auto, force or off, got '" + b + "'");
    }
    else if (key == "aggregation") {  // the names of `comfuse explain --aggregation`
      const std::string a = nb::cast<std::string>(v);
      p.aggregation = aggregation_of_word(a);
      if (!p.aggregation) throw Error("aggregation wants p2p, leader or l2, got '" + a + "'");
    } else if (key == "gpu_model") {
      p.gpu = gpu_model(nb::cast<std::string>(v));
    } else if (key == "strategy") {
      const std::string s = nb::cast<std::string>(v);
      p.strategy = s == "on-chip" ? RowStrategy::OnChip
                   : s == "smem-stash" ? RowStrategy::SmemStash
                   : s == "workspace-stash" ? RowStrategy::WorkspaceStash
                                            : throw Error("strategy wants on-chip, smem-stash or workspace-stash, got '" + s + "'");
    } else {
      throw Error("unknown plan option '" + key + "'");
    }
  }
  return planned_for_this_device(p);
}

struct PyPlan {
  FusionSpec spec;
  Plan plan;
};

nb::dict plan_summary(const Plan& p) {
  nb::dict d;
  d["m"] = p.problem.m;
  d["n"] = p.problem.n;
  d["k"] = p.problem.k;
  const KernelConfig& k = p.kernel;
  d["tile_m"] = k.tile_m;
  d["tile_n"] = k.tile_n;
  d["tile_k"] = Sm90::kTileK;
  d["stages"] = k.ring_stages;
  d["consumer_wgs"] = k.consumer_wgs;  // consumer warp groups (PingPong: each its own job in turn)
  d["cluster_m"] = k.cluster_m;
  d["cluster_n"] = k.cluster_n;
  d["row_group"] = k.row_group;
  d["n_tiles_per_cta"] = k.n_tiles;
  d["turn_lead"] = k.turn_lead;  // two jobs' tiles in turn (0: a job at a time)
  d["k_splits"] = k.k_splits;
  d["splits_in_cluster"] = k.splits_in_cluster;  // split-K's partials over DSMEM (else through L2)
  d["begin_early"] = k.begin_early;  // the first job's vectors before its mainloop (one job a CTA)
  d["store_stages"] = k.store_stages;  // TMA-store staging buffers per tile output
  d["ring_input_bytes"] = k.ring_input_bytes;  // the root stage's tile inputs in the ring (0: from L2)
  d["aggregation"] = std::string(name_of(k.aggregation));
  d["l2_exchange"] = k.aggregation == Aggregation::L2Exchange;  // rows reduced across clusters through L2
  d["strategy"] = std::string(name_of(p.strategy()));
  d["stash_bytes"] = k.stash_elem_bytes;   // 4: fp32, 2: bf16, 0: no stash
  d["stash_centers"] = k.stash_centers;    // bf16 about each tile's running max or mean
  d["reductions"] = p.reductions;
  d["pairs_in_one_round"] = p.fused_pairs.any();  // a paired reduction's two statistics in one round
  d["pair_exp_kept"] = p.fused_pairs.kept_exp;    // a softmax pair's exp made once a value
  d["workspace_bytes"] = p.workspace_bytes;
  d["smem_bytes"] = p.smem.total();
  d["mainloop_us"] = p.estimate.mainloop_us;
  d["epilogue_us"] = p.estimate.epilogue_us;
  d["reread_us"] = p.estimate.reread_us;
  d["dram_floor_us"] = p.estimate.dram_floor_us;
  d["total_us"] = p.estimate.total_us;
  d["low_us"] = p.estimate.low_us;  // the least such a plan measured against its estimate
  d["reasons"] = p.reasons;
  return d;
}

struct PyRegion {
  std::shared_ptr<const Graph> graph;
  FusedRegion region;

  Problem problem(const Bindings& dims) const { return problem_of(region.spec, dims); }
};

struct PyKernel {
  std::shared_ptr<FusedKernel> k;
};

nb::dict compiled_info(const CompiledKernel& c) {
  nb::dict d;
  d["key"] = c.key;
  d["compiler"] = c.compiler;
  d["compile_seconds"] = c.compile_seconds;
  d["elapsed_seconds"] = c.elapsed_seconds;
  d["cache_hit"] = c.cache_hit;
  return d;
}

CompileOptions compile_options(const nb::dict& plan_opts) {
  CompileOptions o;
  o.plan = plan_options(plan_opts);
  return o;
}

struct PyLowering {
  std::shared_ptr<const Graph> graph;
  LoweringResult result;
};

// Tensors for the fp64 executors cross as (shape, bytes of float64, row-major).
using HostTensor = std::pair<std::vector<int64_t>, nb::bytes>;

TensorMap host_tensors(const std::map<std::string, HostTensor>& in) {
  TensorMap m;
  for (const auto& [name, t] : in) {
    Tensor x;
    x.shape = t.first;
    const int64_t n = x.numel();
    if (static_cast<int64_t>(t.second.size()) != n * 8)
      throw Error("tensor '" + name + "': " + std::to_string(t.second.size()) + " bytes for " + std::to_string(n) +
                  " float64 elements");
    x.data.resize(static_cast<size_t>(n));
    std::memcpy(x.data.data(), t.second.c_str(), static_cast<size_t>(n) * 8);
    m[name] = std::move(x);
  }
  return m;
}

std::map<std::string, HostTensor> py_tensors(const TensorMap& m) {
  std::map<std::string, HostTensor> out;
  for (const auto& [name, t] : m)
    out.emplace(name, HostTensor{t.shape, nb::bytes(reinterpret_cast<const char*>(t.data.data()), t.data.size() * 8)});
  return out;
}

nb::list region_args(const FusionSpec& s) {
  nb::list out;
  for (const RuntimeArg& a : s.args) {
    nb::dict d;
    d["name"] = a.name;
    d["role"] = std::string(name_of(a.role));
    d["dtype"] = std::string(name_of(a.dtype));
    d["shape"] = dims_of(a.shape);
    d["value_class"] = std::string(name_of(a.value_class));
    d["graph_node"] = a.graph_node;
    out.append(d);
  }
  return out;
}

}  // namespace
}  // namespace comfuse::py

NB_MODULE(_core, m) {
  using namespace comfuse;
  using namespace comfuse::py;
  m.doc() = "ComFuse C++ core: graph builder, lowering, planner, JIT compile and launch";
  nb::exception<Error>(m, "Error", PyExc_RuntimeError);
  // Fused regions (and their specs) live in a process-wide registry until exit: not leaks.
  nb::set_leak_warnings(false);

  m.def("planned_dram_bytes_per_s", [](const std::string& name) { return planned_dram_bytes_per_s(gpu_model(name)); },
        "gpu_model"_a = "h200",
        "the DRAM bandwidth the planner prices streaming traffic at on that GPU (h200 or h100), bytes/s");
  m.def("build_info", [] {
    nb::dict d;
    d["kernels_dir"] = std::string(COMFUSE_KERNELS_DIR);
    d["cutlass_include"] = std::string(COMFUSE_CUTLASS_INCLUDE);
    d["version"] = std::string(COMFUSE_VERSION);
    return d;
  });

  nb::class_<PyGraph>(m, "Graph")
      .def(nb::init<>())
      .def("input", [](PyGraph& g, const std::string& name, const std::string& dtype, const std::vector<DimArg>& shape) {
        return g.g.input(name, dtype_of(dtype), shape_of(shape)).id;
      }, "name"_a, "dtype"_a, "shape"_a)
      .def("constant", [](PyGraph& g, double v) { return g.g.constant(v).id; })
      .def("matmul", [](PyGraph& g, int a, int b, const std::string& layout) {
        if (layout != "nk" && layout != "kn") throw Error("matmul layout wants nk or kn, got '" + layout + "'");
        return g.g.matmul(g.v(a), g.v(b), layout == "kn" ? BLayout::KN : BLayout::NK).id;
      }, "a"_a, "b"_a, "layout"_a = "nk")
      .def("unary", [](PyGraph& g, const std::string& op, int x) {
        auto u = unary_op_from_name(op);
        if (!u) throw Error("unknown unary op '" + op + "'");
        return g.g.unary(*u, g.v(x)).id;
      })
      // segment > 0: an operand whose last dim is `segment` ([S] or [M, S]) is read periodically.
      .def("binary", [](PyGraph& g, const std::string& op, int a, int b, int64_t segment) {
        auto o = binary_op_from_name(op);
        if (!o) throw Error("unknown binary op '" + op + "'");
        return g.g.binary(*o, g.v(a), g.v(b), segment).id;
      }, "op"_a, "a"_a, "b"_a, "segment"_a = 0)
      .def("rotate_half", [](PyGraph& g, int x, int64_t segment) { return g.g.rotate_half(g.v(x), segment).id; },
           "x"_a, "segment"_a)
      .def("rotate_pairs", [](PyGraph& g, int x, int64_t segment) { return g.g.rotate_pairs(g.v(x), segment).id; },
           "x"_a, "segment"_a)
      .def("rope", [](PyGraph& g, int x, int cos, int sin, int64_t segment, bool interleaved) {
        return g.g.rope(g.v(x), g.v(cos), g.v(sin), segment, interleaved).id;
      }, "x"_a, "cos"_a, "sin"_a, "segment"_a, "interleaved"_a = false)
      .def("cast", [](PyGraph& g, int x, const std::string& dtype) { return g.g.cast(g.v(x), dtype_of(dtype)).id; })
      // segment > 0: over each run of that many columns of the last dim (graph.h Node::segment).
      .def("reduce", [](PyGraph& g, const std::string& op, int x, int dim, int64_t segment) {
        auto r = reduce_op_from_name(op);
        if (!r) throw Error("unknown reduction '" + op + "'");
        return g.g.reduce(*r, g.v(x), dim, segment).id;
      }, "op"_a, "x"_a, "dim"_a = -1, "segment"_a = 0)
      .def("layer_norm", [](PyGraph& g, int x, int gamma, int beta, double eps, int64_t segment) {
        return g.g.layer_norm(g.v(x), g.opt(gamma), g.opt(beta), eps, segment).id;
      }, "x"_a, "gamma"_a = -1, "beta"_a = -1, "eps"_a = 1e-5, "segment"_a = 0)
      .def("rms_norm", [](PyGraph& g, int x, int gamma, double eps, int64_t segment) {
        return g.g.rms_norm(g.v(x), g.opt(gamma), eps, segment).id;
      }, "x"_a, "gamma"_a = -1, "eps"_a = 1e-6, "segment"_a = 0)
      .def("causal_mask", [](PyGraph& g, int x) { return g.g.causal_mask(g.v(x)).id; })
      .def("softmax", [](PyGraph& g, int x, int64_t segment) { return g.g.softmax(g.v(x), segment).id; },
           "x"_a, "segment"_a = 0)
      .def("log_softmax", [](PyGraph& g, int x, int64_t segment) { return g.g.log_softmax(g.v(x), segment).id; },
           "x"_a, "segment"_a = 0)
      .def("l2_normalize", [](PyGraph& g, int x, double eps, int64_t segment) {
        return g.g.l2_normalize(g.v(x), eps, segment).id;
      }, "x"_a, "eps"_a = 1e-12, "segment"_a = 0)
      .def("output", [](PyGraph& g, int v, const std::string& name, const std::string& dtype) {
        g.g.output(g.v(v), name, dtype_of(dtype));
      })
      .def("rename", [](PyGraph& g, int v, const std::string& name) { g.g.rename(g.v(v), name); })
      .def("find", [](const PyGraph& g, const std::string& name) { return g.g.find(name); })
      .def("node", [](const PyGraph& g, int id) { return node_info(g.g, id); })
      .def("__len__", [](const PyGraph& g) { return g.g.nodes().size(); })
      .def("outputs", [](const PyGraph& g) {
        std::vector<std::tuple<int, std::string, std::string>> out;
        for (const GraphOutput& o : g.g.outputs()) out.emplace_back(o.node, o.name, std::string(name_of(o.dtype)));
        return out;
      })
      .def("text", [](const PyGraph& g) { return print_graph(g.g); });

  m.def("parse_graph", [](const std::string& text) { return PyGraph{parse_graph(text)}; });

  nb::class_<PyPlan>(m, "Plan")
      .def("summary", [](const PyPlan& p) { return plan_summary(p.plan); })
      .def("explain", [](const PyPlan& p) { return explain(p.spec, p.plan); })
      .def("dot", [](const PyPlan& p) { return to_dot(p.spec, p.plan); });

  nb::class_<PyKernel>(m, "FusedKernel")
      // batch_strides: a batched kernel's [B, rows, cols] or [B, H, rows, cols] tensors whose
      // batches are not packed (name -> elements between batches, or (between batches, between
      // heads) for the 4-D ones; absent: packed).
      .def("run", [](const PyKernel& k, const std::map<std::string, std::tuple<uintptr_t, std::string, std::vector<int64_t>, int64_t>>& tensors,
                     const std::map<std::string, double>& scalars, uintptr_t stream,
                     const std::map<std::string, std::vector<int64_t>>& batch_strides) {
        RunArgs args;
        for (const auto& [name, t] : tensors) {
          DeviceTensor d{reinterpret_cast<void*>(std::get<0>(t)), dtype_of(std::get<1>(t)), std::get<2>(t), std::get<3>(t)};
          if (auto bs = batch_strides.find(name); bs != batch_strides.end()) {
            if (bs->second.empty() || bs->second.size() > 2)
              throw Error("batch_strides['" + name + "'] takes (batch stride) or (batch stride, head stride)");
            d.batch_stride = bs->second[0];
            if (bs->second.size() == 2) d.head_stride = bs->second[1];
          }
          args.tensors[name] = std::move(d);
        }
        args.scalars = scalars;
        nb::gil_scoped_release unlocked;
        k.k->run(args, reinterpret_cast<Stream>(stream));
      }, "tensors"_a, "scalars"_a, "stream"_a, "batch_strides"_a = std::map<std::string, std::vector<int64_t>>{})
      .def("plan", [](const PyKernel& k) { return PyPlan{k.k->spec(), k.k->plan()}; })
      .def("is_b2b", [](const PyKernel& k) { return k.k->b2b_plan() != nullptr; })
      // A B2B kernel's plan as `comfuse explain` prints it.
      .def("b2b_explain", [](const PyKernel& k) {
        if (!k.k->b2b_plan()) throw Error("not a B2B kernel");
        return explain(k.k->spec(), *k.k->second_spec(), *k.k->b2b_plan());
      })
      // The kernel's arguments: its spec's, and a B2B kernel's second spec's but the intermediate S.
      .def("args", [](const PyKernel& k) {
        nb::list out = region_args(k.k->spec());
        if (const FusionSpec* e = k.k->second_spec()) {
          const std::string s = e->args.at(static_cast<size_t>(e->arg_index(ArgRole::OperandA))).name;
          FusionSpec rest = *e;
          rest.args.clear();
          for (const RuntimeArg& a : e->args)
            if (a.name != s) rest.args.push_back(a);
          FusionSpec first = k.k->spec();
          first.args.clear();
          for (const RuntimeArg& a : k.k->spec().args)
            if (a.name != s) first.args.push_back(a);
          out = region_args(first);
          for (nb::handle h : region_args(rest)) out.append(h);
        }
        return out;
      })
      .def("compiled", [](const PyKernel& k) { return compiled_info(k.k->compiled()); });

  nb::class_<PyRegion>(m, "Region")
      .def_prop_ro("name", [](const PyRegion& r) { return r.region.spec.name; })
      .def_prop_ro("matmul_node", [](const PyRegion& r) { return r.region.matmul_node; })
      .def_prop_ro("fused_nodes", [](const PyRegion& r) { return r.region.fused_nodes; })
      .def_prop_ro("b_layout", [](const PyRegion& r) { return std::string(r.region.spec.b_layout == BLayout::KN ? "kn" : "nk"); })
      .def_prop_ro("reductions", [](const PyRegion& r) { return r.region.spec.reduction_count(); })
      .def_prop_ro("stages", [](const PyRegion& r) { return r.region.spec.stage_count(); })
      .def("args", [](const PyRegion& r) { return region_args(r.region.spec); })
      .def("spec_text", [](const PyRegion& r) { return print(r.region.spec); })
      .def("problem", [](const PyRegion& r, const Bindings& dims) {
        Problem p = r.problem(dims);
        return std::make_tuple(p.m, p.n, p.k, std::string(name_of(p.ab_dtype)));
      })
      .def("plan", [](const PyRegion& r, const Bindings& dims, const nb::dict& opts) {
        return PyPlan{r.region.spec, make_plan(r.region.spec, r.problem(dims), plan_options(opts))};
      }, "dims"_a, "options"_a = nb::dict())
      .def("compile", [](const PyRegion& r, const Bindings& dims, const nb::dict& opts) {
        CompileOptions o = compile_options(opts);
        const Problem p = r.problem(dims);
        nb::gil_scoped_release unlocked;  // NVRTC takes seconds: let other Python threads run
        return PyKernel{std::make_shared<FusedKernel>(FusedKernel::build(r.region.spec, p, o))};
      }, "dims"_a, "options"_a = nb::dict())
      .def("compile_only", [](const PyRegion& r, const Bindings& dims, const nb::dict& opts) {
        CompileOptions o = compile_options(opts);
        const Problem p = r.problem(dims);
        CompiledKernel c;
        {
          nb::gil_scoped_release unlocked;
          c = compile_only(r.region.spec, p, o);
        }
        return compiled_info(c);
      }, "dims"_a, "options"_a = nb::dict());

  nb::class_<PyLowering>(m, "Lowering")
      .def("regions", [](const PyLowering& l) {
        std::vector<PyRegion> out;
        for (const FusedRegion& r : l.result.regions) out.push_back(PyRegion{l.graph, r});
        return out;
      })
      .def("fallbacks", [](const PyLowering& l) {
        // Each node as the user knows it (graph.h user_descriptions), not the graph's made-up name.
        std::vector<std::tuple<int, std::string, std::string>> out;
        const std::vector<std::string> who = user_descriptions(*l.graph);
        for (const Fallback& f : l.result.fallbacks) out.emplace_back(f.node, who[static_cast<size_t>(f.node)], f.reason);
        return out;
      })
      .def("dead_nodes", [](const PyLowering& l) { return l.result.dead_nodes; })
      .def("describe", [](const PyLowering& l) { return describe(*l.graph, l.result); })
      // The B2B pair when the lowering is exactly one (lower.h's one_b2b_kernel), built as one kernel.
      .def("is_b2b", [](const PyLowering& l) { return one_b2b_kernel(l.result) != nullptr; })
      // Φ's B2B pairs and gated pairs (lower.h), with why not where one is blocked.
      .def("b2b_candidates", [](const PyLowering& l) {
        nb::list out;
        for (const B2BCandidate& b : l.result.b2b_candidates) {
          nb::dict d;
          d["first_matmul"] = b.first_matmul;
          d["second_matmul"] = b.second_matmul;
          d["via_node"] = b.via_node;
          d["first_region"] = b.first_region;
          d["second_region"] = b.second_region;
          d["gate_matmul"] = b.gate_matmul;
          d["blocker"] = b.blocker;
          out.append(d);
        }
        return out;
      })
      .def("gate_pairs", [](const PyLowering& l) {
        nb::list out;
        for (const GatePair& p : l.result.gate_pairs) {
          nb::dict d;
          d["first_matmul"] = p.first_matmul;
          d["gate_matmul"] = p.gate_matmul;
          d["meet_node"] = p.meet_node;
          d["region"] = p.region;
          d["blocker"] = p.blocker;
          out.append(d);
        }
        return out;
      })
      // choose_b2b (plan.h) for the lowering's one B2B pair: one kernel or its unfused kernels,
      // and why. The frontend asks before it builds anything (no GPU needed): {one_kernel, gated,
      // reason, fused_us, unfused_us, explain} (the estimates and plan text only where the
      // planner accepted the pair); an Error where the options refuse the pair (force on a pair
      // the kernel cannot take, off on a batched pair).
      .def("choose_b2b", [](const PyLowering& l, const Bindings& dims, const nb::dict& opts) {
        const B2BCandidate* b = one_b2b_kernel(l.result);
        if (!b) throw Error("the graph does not lower to one B2B pair:\n" + describe(*l.graph, l.result));
        const FusionSpec &f = l.result.regions.at(static_cast<size_t>(b->first_region)).spec,
                         &e = l.result.regions.at(static_cast<size_t>(b->second_region)).spec;
        const B2bProblem p = b2b_problem_of(f, e, dims);
        const B2bChoice c = choose_b2b(f, e, p, plan_options(opts));
        nb::dict d;
        d["one_kernel"] = c.one_kernel;
        d["gated"] = f.arg_index(ArgRole::OperandGate) >= 0;
        d["reason"] = c.reason;
        d["fused_us"] = c.plan ? nb::object(nb::cast(c.plan->fused_us)) : nb::object(nb::none());
        d["unfused_us"] = c.plan ? nb::object(nb::cast(c.plan->unfused_us)) : nb::object(nb::none());
        d["explain"] = c.plan ? explain(f, e, *c.plan) : std::string();
        d["decode"] = c.plan && c.plan->kernel.decode();  // the decode kernel (b2b/decode_attention.cuh)
        return d;
      }, "dims"_a, "options"_a = nb::dict())
      .def("compile_b2b", [](const PyLowering& l, const Bindings& dims, const nb::dict& opts) {
        const B2BCandidate* b = one_b2b_kernel(l.result);
        if (!b) throw Error("the graph does not lower to one B2B kernel:\n" + describe(*l.graph, l.result));
        const FusionSpec &f = l.result.regions.at(static_cast<size_t>(b->first_region)).spec,
                         &e = l.result.regions.at(static_cast<size_t>(b->second_region)).spec;
        CompileOptions o = compile_options(opts);
        const B2bProblem p = b2b_problem_of(f, e, dims);
        nb::gil_scoped_release unlocked;
        return PyKernel{std::make_shared<FusedKernel>(FusedKernel::build_b2b(f, e, p, o))};
      }, "dims"_a, "options"_a = nb::dict());

  m.def("lower", [](const PyGraph& g) {
    auto graph = std::make_shared<const Graph>(g.g);
    return PyLowering{graph, lower(*graph)};
  });

  m.def("run_graph", [](const PyGraph& g, const Bindings& dims, const std::map<std::string, HostTensor>& inputs) {
    return py_tensors(run_graph(g.g, dims, host_tensors(inputs)));
  }, "graph"_a, "dims"_a, "inputs"_a, "fp64 reference executor of the whole graph; tensors as (shape, float64 bytes)");
  m.def("run_lowered", [](const PyLowering& l, const Bindings& dims, const std::map<std::string, HostTensor>& inputs) {
    return py_tensors(run_lowered(*l.graph, l.result, dims, host_tensors(inputs)));
  }, "lowering"_a, "dims"_a, "inputs"_a, "fp64 executor of the lowered graph (regions through their Fusion Specs)");

  m.def("gpu_available", [] {
    std::string why;
    const bool ok = gpu_available(&why);
    return std::make_pair(ok, why);
  }, "(True, '') when a CUDA device of compute capability 9.0 is usable, else (False, why)");

}
