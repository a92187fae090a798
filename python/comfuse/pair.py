"""B2B pairs in the frontend: two GEMM regions that chain (GEMM1 -> F -> GEMM2 + its epilogue),
translated into ONE ComFuse graph so that Φ forms the pair the B2B kernel family runs with S in
registers (README: "B2B: two GEMMs in one kernel").

After partition.py has found and decided the single-GEMM regions (today's path), this pass looks
for a region whose value feeds another region's GEMM as its A operand:

    plain   GPT-2's MLP: c_fc (addmm, K x N weight) + gelu_new -> c_proj (addmm) + residual
    gated   Llama's MLP: gate_proj and up_proj on the same input, silu(gate) * up -> down_proj;
            up_proj's GEMM (its own region today, no epilogue) joins the first segment as the
            gated pair's second accumulator (W3)

and translates the members together (translate.Translator, two segments over one graph). It then
asks the core, and keeps today's per-region path unless every answer says one kernel:
  1. Φ must lower the graph to one B2B pair (lower.h's one_b2b_kernel); else its blocker;
  2. choose_b2b (plan.h) under `config.b2b` (auto | force | off) must say one kernel;
  3. under auto, the pair's estimate must not exceed today's path as partition.py priced it
     (each member region fused or unfused, whichever it chose), so a fused pair is never slower
     than the path it replaces by the planner's own numbers.
Every outcome is reported on the first member's RegionInfo (`b2b`, in the model's module names);
a fused pair replaces its members in the report with one region of its own.

Where no fused pair takes them, a gated pair's first two members (gate_proj's region and up_proj's
plain GEMM) become one gated region (form_gated: the core's gated single-GEMM kernel) where
partition.decide's rule says it pays; measure.py then times it like any region.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch.fx as fx

from . import _core
from .config import config
from .partition import Candidate, RegionInfo, bare_gemm_us, decide, size_hint, where, _VIEW_LIKE
from .translate import _DTYPES, Translator, Unsupported, descendants_of, is_gemm, rename_reason, val

log = logging.getLogger("comfuse")

MODES = ("auto", "force", "off")


@dataclass
class PairCandidate:
    """Two (gated: three) member regions as one B2B pair."""
    first: Candidate                # GEMM1 and F
    second: Candidate               # GEMM2 and its epilogue
    gate: Candidate | None          # the gated pair's X W3^T region (its GEMM and views only)
    nodes: list[fx.Node]            # every member node, in graph order
    root: fx.Node                   # GEMM1's root
    info: RegionInfo
    translator: Translator | None = None    # the second segment: the graph's inputs and outputs
    lowering: object | None = None          # _core.Lowering of the pair graph
    choice: dict = field(default_factory=dict)
    dims: dict = field(default_factory=dict)  # M (hint), K, N1, N2

    @property
    def members(self) -> list[Candidate]:
        return [c for c in (self.first, self.gate, self.second) if c is not None]

    @property
    def region(self):  # as Candidate.region: no single-GEMM region for a pair
        return None


# ---- finding pairs --------------------------------------------------------------------------
def _base(n):
    """A value through the views that keep its elements (view/reshape/_unsafe_view/alias)."""
    from .translate import aten

    while isinstance(n, fx.Node) and n.op == "call_function" and n.target in (
            aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.alias.default):
        n = n.args[0]
    return n


def same_matrix(a: fx.Node, b: fx.Node) -> bool:
    """a and b are the same [M, K] matrix: one node, or views of one value with one shape (Dynamo
    gives each Linear its own view of a shared input)."""
    if a is b:
        return True
    va, vb = val(a), val(b)
    return (_base(a) is _base(b) and va is not None and vb is not None and
            list(va.shape) == list(vb.shape) and va.dtype == vb.dtype)


def _gate_of(first: Candidate, by_node: dict, taken: set) -> Candidate | None:
    """The region whose GEMM value F reads as an [M, N] tile (SwiGLU's up_proj), where it is a GEMM
    on the first GEMM's A with no epilogue of its own (its region: the GEMM and views)."""
    tr = first.translator
    for node, role in zip(tr.inputs, tr.input_roles):
        if role != "tile":
            continue
        g = by_node.get(node)
        if g is None or g is first or id(g) in taken or g.translator is None:
            continue
        if any(n is not g.root and n.target not in _VIEW_LIKE for n in g.nodes):
            continue  # X W3^T with an epilogue of its own: not the plain gate value
        if same_matrix(g.translator.gemm.a, tr.gemm.a):
            return g
    return None


def _chain_value(first: Candidate, second: Candidate) -> bool:
    """Whether `first` computes nothing but the A operand S of `second`'s GEMM: every value the
    region stores is S or a view of it, and S feeds that GEMM alone. A region that also stores
    another value (a residual stream beside its norm) or whose value feeds several GEMMs (the
    norm before q/k/v, or before gate/up) is no chain a B2B kernel runs: not offered (a pair
    whose S is also stored or returned is offered, and Φ says why not)."""
    s = second.translator.gemm.a
    outs = first.translator.outputs + [a for a, _, _ in first.translator.aliases]  # the values used outside
    if not outs or any(_base(o) is not _base(s) for o in outs):
        return False
    gemms = {u for o in outs for u in o.users if u.op == "call_function" and is_gemm(u)}
    return gemms == {second.root}


def _pair_of(first: Candidate, second: Candidate, gate: Candidate | None, next_id) -> PairCandidate:
    members = [c for c in (first, gate, second) if c is not None]
    order = {n: i for i, n in enumerate(first.root.graph.nodes)}
    nodes = sorted({n for c in members for n in c.nodes}, key=order.__getitem__)
    info = RegionInfo(id=next_id(), root=where(first.root), fx_nodes=[n.name for n in nodes],
                      ops=[where(n) for n in nodes if n.target not in _VIEW_LIKE])
    return PairCandidate(first, second, gate, nodes, first.root, info)


def find_pairs(cands: list[Candidate], next_id) -> list[PairCandidate]:
    """Every chain region -> GEMM among the translated candidates, in graph order, translated,
    lowered and decided. A member of a fused pair is not offered to another pair (a chain of
    three GEMMs fuses its first two at most); one that stays per-region may be."""
    by_node = {n: c for c in cands if c.translator is not None for n in c.nodes}
    taken: set = set()
    out: list[PairCandidate] = []
    for second in cands:
        if second.translator is None or id(second) in taken:
            continue
        first = by_node.get(second.translator.gemm.a)
        if first is None or first is second or id(first) in taken or not _chain_value(first, second):
            continue
        gate = _gate_of(first, by_node, taken | {id(second)})
        p = _pair_of(first, second, gate, next_id)
        try:
            translate_pair(p)
            decide_pair(p)
        except Exception as e:  # a bug here must not cost the model its per-region path
            if config.strict:
                raise
            log.warning("comfuse: %s: not considered (internal error): %r", what_of(p), e)
            p.info.status, p.info.reason = "fallback", f"not considered: internal error {type(e).__name__}: {e}"
        out.append(p)
        if p.info.status == "fused":
            taken.update(id(c) for c in p.members)
    return out


def translate_pair(p: PairCandidate) -> None:
    """The pair's ComFuse graph and Φ's lowering of it; p.info.reason says why not where either
    fails (the members then stay as they are)."""
    first, second, gate = p.first, p.second, p.gate
    inset = set(p.nodes)
    desc = set().union(*(descendants_of(c.root) for c in p.members))
    g1, g2 = first.translator.gemm, second.translator.gemm
    try:
        # Segment 1: X [M, K], W1 (and W3) over N1: GEMM1 (+ the gate GEMM) and F.
        seg1 = set(first.nodes) | set(gate.nodes if gate is not None else [])
        seg1_nodes = [n for n in p.nodes if n in seg1]
        t1 = Translator(first.root, seg1_nodes, desc, dims=("M", "N1", "K"), in_region=inset)
        if gate is not None:
            t1.gates = [gate.root]
        t1.translate(declare_outputs=False)
        # Segment 2: S [M, N1] (GEMM1's value, cast) times W2 over N2, and GEMM2's epilogue.
        for n in second.nodes:
            for i in n.all_input_nodes:
                if i in t1.env and not (n is second.root and i is g2.a):
                    raise Unsupported(n, f"GEMM2's epilogue reads '{i.name}', a value of the first GEMM's region, "
                                         "besides S: the B2B kernel holds S only as GEMM2's operand")
        t2 = Translator(second.root, second.nodes, desc, dims=("M", "N2", "N1"), parent=t1, in_region=inset,
                        b_role="b2")
        t2.a_from = g2.a
        t2.translate(declare_outputs=False)
        t1._declare_outputs(p.nodes)
    except Unsupported as e:
        p.info.reason = f"not translated as one graph: {where(e.node) + ': ' if e.node is not None else ''}{e.reason}"
        return
    except _core.Error as e:
        p.info.reason = f"not translated as one graph: {e}"
        return
    p.translator = t2
    p.info.graph_text = t1.g.text()
    p.info.m, p.info.n, p.info.k = g1.m, g2.n, g1.k
    p.info.dtype = _DTYPES[g1.dtype]
    p.info.layout = g1.layout if g1.layout == g2.layout else f"{g1.layout}/{g2.layout}"
    p.dims = {"M": size_hint(g1.m), "K": g1.k, "N1": g1.n, "N2": g2.n}
    try:
        low = _core.lower(t1.g)
    except _core.Error as e:
        p.info.reason = f"Φ: {e}"
        return
    p.lowering = low
    if not low.is_b2b():
        p.info.reason = "Φ: " + _why_not_b2b(low, t1)


def _names(tr: Translator) -> dict[str, str]:
    """Canonical graph names -> the user's (module path and op) for Φ's and the planner's reasons."""
    by_fx = {n.name: n for n in tr.nodes}
    out = {}
    for cf, fxn in tr.fx_name.items():
        node = by_fx.get(fxn) or next((i for i in tr.inputs if i.name == fxn), None)
        out[cf] = where(node) if node is not None and node.op == "call_function" else fxn
    return out


def _why_not_b2b(low, tr: Translator) -> str:
    names = _names(tr)
    for gp in low.gate_pairs():
        if gp["blocker"]:
            return rename_reason(f"the gated pair is not merged: {gp['blocker']}", names)
    cands = low.b2b_candidates()
    if not cands:
        return "no B2B pair in the translated graph"
    blocked = [c["blocker"] for c in cands if c["blocker"]]
    if blocked:
        return rename_reason(f"not one B2B kernel: {blocked[0]}", names)
    falls = low.fallbacks()
    if falls:
        return rename_reason(f"{falls[0][1]} falls back: {falls[0][2]}", names)
    return "the graph does not lower to exactly one B2B pair"


# ---- deciding -------------------------------------------------------------------------------
def today_us(c: Candidate) -> float | None:
    """What partition.py's decision costs for one member region (the planner's numbers)."""
    info = c.info
    if info.fused_us is not None and info.unfused_us is not None:
        return min(info.fused_us, info.unfused_us) if info.status == "fused" else info.unfused_us
    if c.translator is None:
        return None
    return sum(bare_gemm_us(size_hint(info.m), n, info.k, info.dtype, info.layout)  # cuBLAS alone
               for n in info.unfused_gemm_columns or [info.n])


def decide_pair(p: PairCandidate) -> None:
    info = p.info
    mode = config.b2b
    if mode not in MODES:
        info.status, info.reason = "fallback", f"comfuse.config.b2b = {mode!r}: wants one of {', '.join(MODES)}"
        return
    if p.lowering is None or not p.lowering.is_b2b():
        info.status = "fallback"
        return
    opts = {**config.plan_options, "b2b": mode}  # the user's plan options (e.g. gpu_model) too
    try:
        ch = p.choice = dict(p.lowering.choose_b2b(p.dims, opts))
    except _core.Error as e:
        info.status, info.reason = "fallback", f"choose_b2b (b2b {mode}): {str(e).splitlines()[0]}"
        return
    fused = ch.get("fused_us")
    info.fused_us = fused
    parts = [today_us(c) for c in p.members]
    today = sum(parts) if all(x is not None for x in parts) else None
    info.unfused_us = today
    at = f" at M={p.dims['M']}"
    today_txt = f"today's per-region path {today:.1f} us" if today is not None else "today's per-region path"
    if not ch["one_kernel"]:
        info.status, info.reason = "fallback", f"core: {ch['reason']}; {today_txt} runs it{at}"
    elif mode == "force":
        info.status, info.reason = "fused", f"core: {ch['reason']}; b2b force (comfuse.config.b2b){at}"
    elif fused is None or today is None or fused > today:
        info.status = "fallback"
        info.reason = (f"core: {ch['reason']}; but {today_txt} is no slower" +
                       (f" ({fused:.1f} us as one B2B kernel)" if fused is not None else "") + at)
    else:
        info.status = "fused"
        info.reason = f"core: {ch['reason']}; {today_txt}{at}"
    info.plan = {"kind": "b2b", "gated": bool(ch["gated"]), "dims": dict(p.dims), "explain": ch.get("explain", "")}
    info.plan_options = opts


def form_pairs(cands: list[Candidate], next_id) -> tuple[list, list[PairCandidate]]:
    """The candidates with each fused pair in place of its members (at its first member's place),
    and every pair considered. A pair not fused leaves a line on its first member's report. Then
    gated regions (form_gated) among what is left."""
    if config.b2b == "off":
        return form_gated(cands, next_id), []
    pairs = find_pairs(cands, next_id)
    replace: dict[int, PairCandidate] = {}
    for p in pairs:
        if p.info.status == "fused":
            for c in p.members:
                replace[id(c)] = p
            log.info("comfuse: %s: one kernel: %s", what_of(p), p.info.reason)
        else:
            line = f"{what_of(p)}: not one kernel: {p.info.reason}"
            p.first.info.b2b = f"{p.first.info.b2b}\n    {line}" if p.first.info.b2b else line
            log.info("comfuse: %s: per-region path: %s", what_of(p), p.info.reason)
    out, seen = [], set()
    for c in cands:
        p = replace.get(id(c))
        if p is None:
            out.append(c)
        elif id(p) not in seen:
            seen.add(id(p))
            p.info.b2b = f"{what_of(p)}: one kernel"
            out.append(p)
    return form_gated(out, next_id), pairs


# ---- gated regions ----------------------------------------------------------------------------
# SwiGLU's gate_proj and up_proj where no B2B pair takes them (Llama's MLP: down_proj's region
# holds the residual and the next RMSNorm): one gated region, F reading both products of one
# gated GEMM (the core's KernelConfig::gated: W1's and W3's tiles in one wgmma over X's shared
# tiles), in place of gate_proj's region reading up_proj's output as an [M, N] tile.
def gated_region(first: Candidate, gate: Candidate, next_id) -> Candidate | None:
    """The merged region of `first` (GEMM + F reading gate's value) and `gate` (a plain GEMM on
    the same A), translated, lowered to one gated region and decided; None where it does not
    translate or lower so (the members then stay as they are)."""
    order = {n: i for i, n in enumerate(first.root.graph.nodes)}
    nodes = sorted(set(first.nodes) | set(gate.nodes), key=order.__getitem__)
    desc = descendants_of(first.root) | descendants_of(gate.root)
    try:
        tr = Translator(first.root, nodes, desc)
        tr.gates = [gate.root]
        tr.translate()
        low = _core.lower(tr.g)
    except (Unsupported, _core.Error) as e:
        log.info("comfuse: %s gated with %s: not one region: %s", where(first.root), where(gate.root), e)
        return None
    regions = low.regions()
    if len(regions) != 1 or low.fallbacks() or not any(not gp["blocker"] for gp in low.gate_pairs()):
        return None
    info = RegionInfo(id=next_id(), root=where(first.root), fx_nodes=[n.name for n in nodes],
                      ops=[where(n) for n in nodes if n in (first.root, gate.root) or n.target not in _VIEW_LIKE])
    g = tr.gemm
    info.m, info.n, info.k = g.m, g.n, g.k
    info.dtype, info.layout, info.graph_text = _DTYPES[g.dtype], g.layout, tr.g.text()
    info.excluded = first.info.excluded
    info.b2b = first.info.b2b
    c = Candidate(first.root, nodes, tr, low, info, regions[0])
    decide(c)
    return c


def _beats_members(c: Candidate, members) -> bool:
    """Whether a gated region fused only on a measurement's word (c) is the better bet than its two
    members: none of them fuses on its own estimate, and c's low bound is below the members' best
    case, the unfused path (c's) less what each member that may fuse saves at its own bound."""
    if any(m.info.status == "fused" and not m.info.needs_measurement for m in members):
        return False
    best = c.info.unfused_us - sum(max(0.0, m.info.unfused_us - m.info.plan["low_us"]) for m in members
                                   if m.info.status == "fused" and m.info.plan)
    return c.info.plan["low_us"] < best


def form_gated(cands: list, next_id) -> list:
    """The candidates with each gated region that pays in place of its two members: fused by
    partition.decide's rule (the gated kernel's estimate against the two GEMMs alone and the
    unfused epilogue); measure.py then times it against Inductor's kernels for the same ops, as
    any region. (Not against the members' own estimates: the gate region's fused estimate is what
    the measurement of its kernel most often refutes, bench/NOTES.md.)"""
    by_node = {n: c for c in cands if isinstance(c, Candidate) and c.translator is not None for n in c.nodes}
    replace: dict[int, Candidate] = {}
    for first in cands:
        if not isinstance(first, Candidate) or first.translator is None or id(first) in replace:
            continue
        gate = _gate_of(first, by_node, set(replace))
        if gate is None:
            continue
        c = gated_region(first, gate, next_id)
        if c is None:
            continue
        # One that would fuse only on a measurement's word takes its members' place only where neither
        # fuses on its own estimate and its bound beats theirs (the unfused path less what each member
        # that may fuse could save at its own bound: decode's members wait for a measurement too),
        # so that a refuted measurement costs no fusion the members were sure of or likelier to win.
        if c.info.status != "fused" or (c.info.needs_measurement and not _beats_members(c, (first, gate))):
            log.info("comfuse: %s gated with %s: per-region path: %s", where(first.root), where(gate.root), c.info.reason)
            continue
        c.info.reason = f"gated with {where(gate.root)} (one GEMM over both weights): {c.info.reason}"
        replace[id(first)] = replace[id(gate)] = c
    out, seen = [], set()
    for c in cands:
        r = replace.get(id(c), c)
        if id(r) not in seen:
            seen.add(id(r))
            out.append(r)
    return out


def what_of(p: PairCandidate) -> str:
    gate = f" (gated with {where(p.gate.root)})" if p.gate is not None else ""
    return f"B2B pair {where(p.first.root)}{gate} -> {where(p.second.root)}"
