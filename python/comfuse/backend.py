"""The torch.compile backend: `torch.compile(model, backend="comfuse")`.

Dynamo's graph goes through AOTAutograd without decompositions, which gives aten-level ops as
the model wrote them (addmm, views, native_layer_norm, _softmax, gelu, ...). partition.py
finds the GEMM + epilogue regions and decides; each fused region is replaced by one call of
the custom op comfuse::fused (kernels.py), and the rewritten graph goes to Inductor
(compile_fx) for everything else, with the options of the torch.compile mode
("reduce-overhead" and "max-autotune" capture CUDA graphs; fused kernels then plan a DSMEM
exchange, which graph replays keep correct).

Inference only: a graph that needs gradients is not partitioned (the report says so) and goes
to Inductor whole.
"""
from __future__ import annotations

import logging
import operator

import torch
import torch.fx as fx

from . import attention, eager_attention, measure
from .config import config
from .kernels import REGISTRY, RuntimePair, RuntimeRegion, gpu_status, next_region_id, precompile
from .pair import PairCandidate, form_pairs
from .partition import RegionInfo, decide, external_inputs, find_regions, region_module, size_hint, where
from .report import FusionReport, GraphReport
from .translate import val

log = logging.getLogger("comfuse")

# Every graph this process compiled (comfuse.last_report() / comfuse.reports()).
REPORT = FusionReport()
_collectors: list[FusionReport] = []


def _record(g: GraphReport) -> None:
    g.index = len(REPORT.graphs)
    REPORT.graphs.append(g)
    for c in _collectors:
        c.graphs.append(g)


def _boxed(fn):
    """`fn` with the boxed calling convention (one list of arguments) that AOTAutograd expects.
    Not torch's make_boxed_func: that wraps with functools.wraps, which would copy the callee's
    attributes (a GraphModule's modules and hooks, Inductor's compiled graph's cache key and CUDA
    graph info) onto the function and chain __wrapped__ into Inductor's output, which torch's
    wrapper walks (serialization, the bundled AOTAutograd cache) follow."""

    def run(args):
        return fn(*args)

    run._boxed_call = True
    return run


def _mode_options(mode, options) -> dict:
    opts: dict = {}
    if mode and mode != "default":
        import torch._inductor as ind

        opts.update(ind.list_mode_options(mode))
    opts.update(options or {})
    return opts


_GEMM_CALLS = {torch._C._nn.linear, torch.nn.functional.linear, torch.matmul, operator.matmul, torch.mm,
               torch.addmm, torch.bmm}


def _training_report(gm: fx.GraphModule, g: GraphReport) -> None:
    g.note = ("needs gradients: not partitioned (the fused kernels are inference only; run under "
              "torch.no_grad() or torch.inference_mode()); the whole graph goes to Inductor")
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in _GEMM_CALLS:
            g.regions.append(RegionInfo(id=next_region_id(), root=where(n), fx_nodes=[n.name], ops=[where(n)],
                                        status="fallback", reason="needs gradients (inference only)"))


def rewrite(gm: fx.GraphModule, g: GraphReport, apply: bool = True, inductor_options: dict | None = None,
            measured: dict | None = None) -> int:
    """_rewrite, then the SDPA ops put beside attention written out (eager_attention) that no
    kernel took are removed: the model's own ops run as it wrote them."""
    try:
        return _rewrite(gm, g, apply, inductor_options, measured)
    finally:
        if eager_attention.drop_unused(gm):
            gm.recompile()


def _rewrite(gm: fx.GraphModule, g: GraphReport, apply: bool = True, inductor_options: dict | None = None,
             measured: dict | None = None) -> int:
    """Partition `gm` (aten level), decide, and replace fused regions by comfuse::fused calls
    (apply=False: decide only). Returns how many regions it replaces (or would replace).
    inductor_options: the config patches the rest of the graph gets (the measurement compiles
    each region with them).

    Where the rewrite applies, the regions to replace are built first (RuntimeRegion objects, the
    graph untouched), their kernels compiled in parallel, and each single-GEMM region timed
    (measure.py, config.measure): one the measurement does not confirm falls back. Then the
    graph surgery replaces the rest.

    measured: the regions' measured decisions by region (its FX nodes and sizes). Given with
    apply=False (the probe), the regions are built and timed as above and their decisions kept
    there; the rewrite after it takes them from there instead of timing a region twice."""
    cands = find_regions(gm, next_region_id)
    for c in cands:
        decide(c)
    # Chained regions (an MLP) as one B2B pair where the core says one kernel (pair.py).
    cands, _ = form_pairs(cands, next_region_id)
    # Every SDPA op as a batched B2B kernel where the core takes it (attention.py).
    cands = cands + attention.find(gm, next_region_id)
    ok, why_not = gpu_status()
    chosen: list[tuple[object, bool]] = []  # (candidate, whether this process runs its kernel)
    for c in cands:
        info = c.info
        g.regions.append(info)
        if info.status != "fused":
            log.info("comfuse: %s: %s: %s", info.root, info.status, info.reason)
            continue
        if info.needs_measurement and not _timed(c, True):  # not even on a GPU
            info.status = "fallback"
            info.reason += ("; no measurement will run (config.measure, or a CUDA graph being captured), and the "
                            "estimate alone does not pay")
            log.info("comfuse: %s: %s", info.root, info.reason)
            continue
        devices = {val(n).device.type for n in _tensor_operands(c)}
        here = None if devices == {"cuda"} and ok else (why_not if not ok else f"inputs on {'/'.join(sorted(devices))}")
        if here:
            info.status = "fusable"
            info.reason += f"; not fused here: {here}"
            if not config.force_regions:
                log.info("comfuse: %s: %s", info.root, info.reason)
                continue
        if here is None and not _timed(c, True) and isinstance(c, attention.AttentionCandidate):
            why = attention.unmeasured_fallback(c)
            if why:  # no measurement will decide: the planner's prior does
                info.status, info.reason = "fallback", why + "; " + info.reason
                log.info("comfuse: %s: %s", info.root, info.reason)
                continue
        log.info("comfuse: %s%s + %d op(s): %s", "B2B pair " if isinstance(c, PairCandidate) else "", info.root,
                 len(info.ops) - 1, info.reason)
        chosen.append((c, here is None))
    if not apply and (measured is None or not any(_timed(c, on_gpu) for c, on_gpu in chosen)):
        return len(chosen)
    staged = [(c, on_gpu, *_runtime(c)) for c, on_gpu in chosen]
    precompile([(rr, size_hint(c.info.m)) for c, on_gpu, rr, _, _ in staged if on_gpu])
    for c, on_gpu, rr, ext_t, ext_s in staged:
        if not _timed(c, on_gpu):
            continue
        info = c.info
        key = (tuple(info.fx_nodes), size_hint(info.m), info.n, info.k)
        if measured is not None and key in measured:
            info.status, info.reason, info.measured = measured[key]
            continue
        if isinstance(c, attention.AttentionCandidate):
            measure.measure_attention(rr, ext_t, inductor_options)
        else:
            measure.measure_region(rr, ext_t, ext_s, inductor_options)
        if measured is not None:
            measured[key] = (info.status, info.reason, info.measured)
    if not apply:
        return sum(1 for c, *_ in staged if c.info.status != "fallback")
    subst: dict[fx.Node, fx.Node] = {}  # a replaced region's outputs -> the getitems that now carry them
    replaced = 0
    for c, _, rr, ext_t, ext_s in staged:
        if c.info.status == "fallback":
            continue
        if isinstance(c, attention.AttentionCandidate):
            attention.replace(gm, c, rr, subst)
        else:
            _replace(gm, c, rr, ext_t, ext_s, subst)
        replaced += 1
    if replaced:
        from torch.fx.passes.tools_common import legalize_graph

        legalize_graph(gm)
        gm.graph.lint()
        gm.recompile()
    return replaced


def _timed(c, on_gpu: bool) -> bool:
    """Whether the rewrite times candidate c before replacing it (B2B pairs stay on the core's
    estimate: measure.py says why)."""
    return not isinstance(c, PairCandidate) and measure.wanted(on_gpu)


def _tensor_operands(c) -> list[fx.Node]:
    """The tensors candidate c's kernel reads (where they live decides whether it runs here)."""
    if isinstance(c, attention.AttentionCandidate):
        return [c.q, c.k, c.v]
    return [n for n, role in zip(c.translator.inputs, c.translator.input_roles) if role != "scalar"]


def _runtime(c) -> tuple[RuntimeRegion, list[fx.Node], list[fx.Node]]:
    """What runs candidate c, without touching the graph: its RuntimeRegion (or RuntimePair), and the
    custom op's operands as nodes of the graph as it is now: tensors (the kernel's inputs first),
    then the sizes its views use. An attention: its RuntimeAttention and the nodes its measurement
    feeds (attention.runtime)."""
    if isinstance(c, attention.AttentionCandidate):
        rr, inputs = attention.runtime(c)
        return rr, inputs, []
    tr = c.translator
    nodes = c.nodes
    ext_t: list[fx.Node] = list(tr.inputs)
    ext_s: list[fx.Node] = []
    known = set(ext_t)
    for i in external_inputs(nodes):
        if i not in known:
            (ext_t if isinstance(val(i), torch.Tensor) else ext_s).append(i)
    # The region's aten ops as their own GraphModule: the fake implementation and the fallback.
    sub = region_module(nodes, tr.outputs, ext_t + ext_s, tr.output_perms)
    info = c.info
    if isinstance(c, PairCandidate):
        rr = RuntimePair(info, c.lowering, tr, sub, c.dims)
    else:
        rr = RuntimeRegion(info, c.region, tr.input_roles, tr.input_names, tr.output_names, sub, tr.output_classes,
                           tr.input_cols, tr.input_rows)
    return rr, ext_t, ext_s


def _replace(gm: fx.GraphModule, c, rr: RuntimeRegion, ext_t: list[fx.Node], ext_s: list[fx.Node],
             subst: dict) -> None:
    """Registers rr and replaces c's nodes by one comfuse::fused call and a getitem per output."""
    tr = c.translator
    nodes = c.nodes
    inset = set(nodes)
    info = c.info
    REGISTRY[info.id] = rr
    # An operand produced by a region replaced before this one is now that region's getitem.
    ext_t = [subst.get(n, n) for n in ext_t]
    ext_s = [subst.get(n, n) for n in ext_s]
    order = {n: k for k, n in enumerate(gm.graph.nodes)}
    last = max(nodes, key=order.__getitem__)
    graph = gm.graph
    with graph.inserting_after(last):
        call = graph.call_function(torch.ops.comfuse.fused.default, (info.id, ext_t, ext_s))
    # A transposed output (translate.Translator.output_perms) leaves the op as the kernel stores it,
    # packed rows before the transpose, and is transposed back after it.
    perms = tr.output_perms
    stored = [o.meta.get("val") if p is None else o.meta["val"].transpose(*p).contiguous()
              for o, p in zip(tr.outputs, perms)]
    call.meta["val"] = stored
    prev = call
    for k, (o, p) in enumerate(zip(tr.outputs, perms)):
        with graph.inserting_after(prev):
            gi = graph.call_function(operator.getitem, (call, k))
        gi.meta = {kk: v for kk, v in o.meta.items() if kk in ("val", "tensor_meta", "stack_trace", "nn_module_stack")}
        if p is not None:
            gi.meta["val"] = stored[k]
            gi.meta.pop("tensor_meta", None)
            with graph.inserting_after(gi):
                t = graph.call_function(torch.ops.aten.transpose.int, (gi, *p))
            t.meta = {**gi.meta, "val": stored[k].transpose(*p)}
            gi = t
        o.replace_all_uses_with(gi, delete_user_cb=lambda u: u not in inset)
        subst[o] = gi
        prev = gi
    # A view of an output used outside (translate.Translator.aliases): its views again, on the output.
    for a, origin, chain in tr.aliases:
        env = {origin: subst[origin]}
        for v in chain:
            with graph.inserting_after(prev):
                env[v] = graph.node_copy(v, lambda x: env.get(x, subst.get(x, x)))
            prev = env[v]
        a.replace_all_uses_with(env[a], delete_user_cb=lambda u: u not in inset)
        subst[a] = env[a]
    for n in reversed(nodes):
        graph.erase_node(n)


def _compile_rest(gm: fx.GraphModule, example_inputs, opts: dict, static_idxs):
    if config.rest == "eager":
        return _boxed(gm)
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    def inner(g, ex, **kw):
        # The rewritten graph reaches Inductor as a plain aten graph: tell it which inputs are
        # parameters (fixed addresses), as Dynamo would have, so CUDA graphs do not copy them.
        if static_idxs is not None:
            kw["static_input_idxs"] = list(static_idxs)
        return compile_fx_inner(g, ex, **kw)

    # Regions live in this process only: keep Inductor's on-disk graph caches out of it.
    patches = {"fx_graph_cache": False, **opts}
    with torch._functorch.config.patch(enable_autograd_cache=False):
        return _boxed(compile_fx(gm, example_inputs, inner_compile=inner, config_patches=patches))


def _compile(gm: fx.GraphModule, example_inputs, mode=None, options=None, explain_only: bool = False):
    from torch._dynamo.backends.common import aot_autograd

    opts = _mode_options(mode, options)
    g = GraphReport(index=0, mode=mode)
    g.dynamic = any(isinstance(x, torch.SymInt) for x in example_inputs)
    training = torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs)
    if training:
        _record(g)
        _training_report(gm, g)
        log.info("comfuse: graph %d %s", g.index, g.note)
        if explain_only or config.rest == "eager":
            return gm.forward
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, example_inputs, config_patches={"fx_graph_cache": False, **opts})

    measured: dict = {}  # the probe's measured decisions, for the rewrite (rewrite()'s `measured`)
    if not explain_only and config.rest == "inductor":
        # Decide first: where no region fuses, by the planner's estimate or by the measurement
        # (measure.py, where config.measure times the regions the planner fuses), Inductor takes
        # Dynamo's graph as its own backend would: one AOTAutograd pass, not ours (without
        # decompositions) and then compile_fx's. The rewrite then takes the probe's measured
        # decisions. (The rewrite path measured 4% slower than Inductor on Llama decode and 13% on
        # GPT-2's with nothing fused: the input mutations' copies below, bench/NOTES.md Stop 37.)
        probe = GraphReport(index=0, mode=mode, dynamic=g.dynamic)
        replaced: list[int] = []

        def analyse(agm: fx.GraphModule, ex):
            replaced.append(rewrite(agm, probe, apply=False, inductor_options=opts, measured=measured))
            return _boxed(agm)

        aot_autograd(fw_compiler=analyse, inference_compiler=analyse, **_AOT_OPTIONS)(gm, example_inputs)
        if not any(replaced):
            probe.note = "nothing fused: the graph goes to Inductor whole, as torch.compile's own backend takes it"
            _record(probe)
            from torch._inductor.compile_fx import compile_fx

            return compile_fx(gm, example_inputs, config_patches=opts)

    def inference(agm: fx.GraphModule, ex):
        ctx = torch._guards.TracingContext.try_get()
        static = list(ctx.fw_metadata.static_input_indices) if ctx is not None and ctx.fw_metadata else None
        _record(g)  # here, not before: Dynamo may restart and call the backend again
        rewrite(agm, g, apply=not explain_only, inductor_options=opts, measured=measured)
        if explain_only:
            return _boxed(agm)
        return _compile_rest(agm, ex, opts, static)

    return aot_autograd(fw_compiler=inference, inference_compiler=inference, **_AOT_OPTIONS)(gm, example_inputs)


# Our AOTAutograd pass (the probe's and the rewrite's: the same graph, so the probe's decisions
# carry over). In-place updates of the graph's inputs (a StaticCache's index_copy_) stay in the
# graph as copy_ into the input, which Inductor turns back into the in-place update, as its own
# backend asks; returned as extra outputs instead, AOTAutograd's wrapper copied each whole buffer
# every call (bench/NOTES.md Stop 37: a 256 MB cache, 172 ms a call on the CPU against 0.2).
_AOT_OPTIONS = {"keep_inference_input_mutations": True}


def comfuse_backend(gm: fx.GraphModule, example_inputs, mode=None, options=None, **_):
    """torch.compile backend (registered as "comfuse"); `mode` and `options` as torch.compile's."""
    return _compile(gm, example_inputs, mode=mode, options=options)


def explain_backend(gm: fx.GraphModule, example_inputs, mode=None, options=None, **_):
    """Partitions and reports; runs the graph eagerly (no kernel built, nothing compiled)."""
    return _compile(gm, example_inputs, mode=mode, options=options, explain_only=True)


def collecting():
    """Context manager: a FusionReport of the graphs compiled inside it."""
    import contextlib

    @contextlib.contextmanager
    def cm():
        rep = FusionReport()
        _collectors.append(rep)
        try:
            yield rep
        finally:
            _collectors.remove(rep)

    return cm()

