"""Finding GEMM + epilogue regions in an aten-level FX graph and deciding which to fuse.

For each GEMM (mm / addmm / bmm over one broadcast matrix), in graph order:
  1. grow: the nodes after it that consume region values and that the translator knows
     (elementwise, casts, row reductions, layer_norm, softmax, views that keep rows);
  2. translate (translate.py) into a ComFuse graph; a node it refuses ends the region there;
  3. lower with Φ (the C++ core): what Φ leaves out of the region is dropped with Φ's reason,
     and the rest is translated again, until Φ fuses every node of the candidate;
  4. decide: the planner's estimate for the fused kernel against the unfused path (the GEMM
     alone as the planner prices it, plus an epilogue kernel that reads the GEMM output and
     writes the results at DRAM speed, plus a launch): fused only where it predicts a gain
     (and where a GPU is at hand, only where timing the region confirms it: measure.py).
Everything not fused stays in the graph for Inductor. Every decision has a reason, reported
by the user's module path and op name (report.py).
"""
from __future__ import annotations

import logging
import operator
import re
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from . import _core
from .config import config
from .translate import (_DTYPES, Translator, Unsupported, cast_change, column_halves, descendants_of, gemm_of,
                        is_gemm, is_translatable, rename_reason, val)

log = logging.getLogger("comfuse")

aten = torch.ops.aten


# ---- names the user knows -----------------------------------------------------------------
def module_path(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    path = re.sub(r"_modules\['([^']*)'\]", r"\1", path)
    path = re.sub(r"\[(\d+)\]", r".\1", path)
    path = re.sub(r"^L\['[^']*'\]\.?", "", path)
    return path


def op_name(node: fx.Node) -> str:
    t = node.target
    if hasattr(t, "overloadpacket"):
        return t.overloadpacket.__name__
    return getattr(t, "__name__", str(t))


def where(node: fx.Node) -> str:
    """'<module path>.<op>' (or the op and FX name where no module is known)."""
    path = module_path(node)
    op = op_name(node)
    if path:
        return f"{path}:{op}"
    return op if node.name == op else f"{op} ({node.name})"


# ---- the decision's numbers ---------------------------------------------------------------
# GUESS (until measured in bench/models.py): what one unfused epilogue kernel costs beyond its
# DRAM traffic (launch and tail), microseconds.
EPILOGUE_KERNEL_US = 3.0
# The DRAM bandwidth the planner prices streaming traffic at (its device model, src/plan/
# calibration.h: ~85% of the H200's 4.8 TB/s): a decode GEMM's stream of its operands. The
# unfused side of a decision is priced on the H200's numbers on any GPU (the fused side plans for
# the GPU at hand); on a GPU the measurement (measure.py) decides what the prices leave close.
DRAM_BYTES_PER_S = _core.planned_dram_bytes_per_s()
# What the unfused epilogue kernel's pass streams at. MEASURED (bench/NOTES.md Stop 21, GPT-2's
# prefill c_proj + residual + LayerNorm, 8192 x 1024 x 1024): Inductor's GEMM + its fused
# add + LayerNorm kernel 43.4 us against cuBLAS alone's ~25.5, so the norm kernel ~17.9 us for
# 67 MB of reads and writes; less EPILOGUE_KERNEL_US, 4.5 TB/s: above DRAM_BYTES_PER_S, the GEMM's
# output just written being read back from L2. (At 4.0 TB/s the unfused side was priced 46.2 us
# and the fused kernel, measured 46.4 us, looked 2% faster than Inductor's 43.4.) The H200's.
UNFUSED_EPILOGUE_BYTES_PER_S = 4.5e12


def m_bucket(m: int) -> int:
    """The shape class a kernel is compiled for: rows rounded up to a power of two, at least 8 (the
    planner takes decode rows, M <= 16, apart from 64-row blocks, calibration.cpp
    single_row_block_k_splits, and a kernel for up to 8 rows loads 8-row boxes of A and hands its
    split-K partials over as tagged words where a 16-row one cannot: KernelConfig::a_box_rows,
    split_words_tagged)."""
    return max(8, 1 << (m - 1).bit_length())


# Decode rows: at M <= 64 the GEMM alone is a stream of B, which cuBLAS splits over the whole GPU,
# while the planner's plan for it (one row of 64-row tiles, K unsplit) leaves most SMs idle and
# prices 1 x 1024 x 4096 at 12.9 us. MEASURED (cuBLAS per launch on the H200, bench/NOTES.md
# "Decode split-K owners"): 4.3-4.6 us for 2 MiB of operands, 6.5-6.9 for 8, 7.6-7.9 for 16,
# 10.2-10.4 for 32, 32.0 for 112: its bytes at DRAM_BYTES_PER_S plus one kernel's launch and tail
# (EPILOGUE_KERNEL_US) lands within 25% of each.
DECODE_ROWS = 64

_bare_gemm_cache: dict = {}


def bare_gemm_us(m: int, n: int, k: int, dtype: str, layout: str) -> float:
    """The GEMM alone (cuBLAS on the unfused path), stored in its output dtype: the planner's estimate,
    or at decode rows (DECODE_ROWS) its operands' DRAM traffic plus a launch."""
    key = (m, n, k, dtype, layout)
    if key not in _bare_gemm_cache:
        if m <= DECODE_ROWS:
            esize = 2 if dtype in ("bf16", "f16") else 4
            _bare_gemm_cache[key] = (m * k + n * k + m * n) * esize / DRAM_BYTES_PER_S * 1e6 + EPILOGUE_KERNEL_US
        else:
            g = _core.Graph()
            a = g.input("a", dtype, ["M", "K"])
            b = g.input("b", dtype, ["N", "K"] if layout == "nk" else ["K", "N"])
            g.output(g.matmul(a, b, layout), "y", dtype)
            region = _core.lower(g).regions()[0]
            _bare_gemm_cache[key] = region.plan({"M": m, "N": n, "K": k}).summary()["total_us"]
    return _bare_gemm_cache[key]


# ---- records -------------------------------------------------------------------------------
@dataclass
class Excluded:
    node: str      # where(): module path and op
    fx_name: str
    reason: str


@dataclass
class RegionInfo:
    """One GEMM root and what became of it."""
    id: int
    root: str                       # where(root)
    fx_nodes: list[str]             # FX names of the region (root first)
    ops: list[str]                  # where() of every non-view region node
    status: str = "fallback"        # fused | fallback
    reason: str = ""
    m: object = None
    n: int = 0
    k: int = 0
    dtype: str = ""
    layout: str = ""
    graph_text: str = ""
    fused_us: float | None = None
    unfused_us: float | None = None
    # The unfused epilogue kernel as decide() priced it (also the epilogue a measurement adds to
    # the measured GEMM), and what measure.py timed: fused_us, gemm_us, epilogue_us, inductor_us
    # (None where Inductor could not compile the region), unfused_us, device.
    unfused_epilogue_us: float | None = None
    # The columns of each GEMM the unfused path runs (decide(): [N], a gated region's [N, N], a
    # projection used as two halves [2N]), as decide() prices them and measure.py times them.
    unfused_gemm_columns: list[int] = field(default_factory=list)
    measured: dict = field(default_factory=dict)
    plan: dict = field(default_factory=dict)
    plan_options: dict = field(default_factory=dict)
    excluded: list[Excluded] = field(default_factory=list)
    # A B2B pair this region starts (pair.py): which GEMMs, one kernel or not, and why.
    b2b: str = ""
    # Runtime (kernels.py fills these as shapes come): per shape class, compile numbers.
    compiles: list[dict] = field(default_factory=list)
    calls: int = 0
    fallback_calls: int = 0
    runtime_fallback: str = ""
    # Fused on the condition that a measurement pays (decide(): the estimate alone did not, the
    # plan's low_us did); where no measurement will run, the region falls back.
    needs_measurement: bool = False

    @property
    def gain(self) -> float | None:
        if self.fused_us and self.unfused_us:
            return self.unfused_us / self.fused_us
        return None


@dataclass
class Candidate:
    root: fx.Node
    nodes: list[fx.Node]
    translator: Translator | None
    lowering: object | None
    info: RegionInfo
    region: object | None = None    # the lowering's fused region (_core.Region) where it translated


def _drop(nodes: list[fx.Node], bad: set[fx.Node], root: fx.Node) -> list[fx.Node]:
    """`nodes` without `bad` and without every node that depends on a dropped node."""
    keep: list[fx.Node] = []
    kept: set[fx.Node] = set()
    dropped = set(bad)
    for n in nodes:
        if n is not root and (n in dropped or any(i in dropped for i in n.all_input_nodes)):
            dropped.add(n)
            continue
        keep.append(n)
        kept.add(n)
    return keep


def grow(root: fx.Node, order: dict[fx.Node, int]) -> tuple[list[fx.Node], set[fx.Node], list[tuple[fx.Node, str]]]:
    desc = descendants_of(root)
    region = [root]
    inset = {root}
    # A projection used as two column halves (translate.Halves): its split is no op outside the
    # domain but the gated GEMM's two accumulators.
    halves = column_halves(root)
    split = set(halves.members) if halves is not None else set()
    refused: list[tuple[fx.Node, str]] = []
    for node in sorted(desc, key=order.__getitem__):
        ins = node.all_input_nodes
        if not any(i in inset for i in ins):
            continue
        if node.op != "call_function":
            continue  # the graph's output node
        if is_gemm(node):
            refused.append((node, "a second GEMM consumes this value: it starts its own region"))
            continue
        if node not in split and not is_translatable(node):
            why = f"op {node.target} is outside the fusion domain"
            if node.target in _SPLITS:
                why += (" (a split of a GEMM's value fuses as two equal blocks of the last dim, of 16-byte rows, "
                        "used by nothing else: translate.column_halves)")
            refused.append((node, why))
            continue
        through = [i for i in ins if i not in inset and i in desc]
        if through:
            refused.append((node, f"operand '{through[0].name}' comes from this GEMM's output through an unfused op"))
            continue
        if node.target == aten.native_layer_norm.default:
            stats = [u for u in node.users if not (u.target is operator.getitem and u.args[1] == 0)]
            if any(u.users for u in stats):
                refused.append((node, "native_layer_norm's mean/rstd are used (training): per-row outputs are not stored"))
                continue
        region.append(node)
        inset.add(node)
    return region, desc, refused


def _halves_cut(tr: Translator, low, nodes: list[fx.Node]) -> tuple[fx.Node, str] | None:
    """Where a projection used as two halves (translate.Halves) reaches Φ with an epilogue its
    gated GEMM cannot take (a reduction: Φ's gate-pair blocker), the first node that reduces and
    Φ's reason: the region ends before it and keeps the halves, rather than losing the second
    product (and with it the split) to the lowering's fallback."""
    if tr.halves is None:
        return None
    blocker = next((gp["blocker"] for gp in low.gate_pairs() if gp["blocker"]), None)
    if not blocker:
        return None
    for n in nodes:
        if any(tr.g.node(i)["kind"] == "reduce" for i in tr.cf_of.get(n, [])):
            return n, f"Φ: {rename_reason(blocker, tr.fx_name)}"
    return None


def find_regions(gm: fx.GraphModule, next_id) -> list[Candidate]:
    """Every GEMM root of the graph with its final region (no decision yet)."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    claimed: set[fx.Node] = set()
    out: list[Candidate] = []
    for root in list(gm.graph.nodes):
        if not is_gemm(root) or root in claimed:
            continue
        info = RegionInfo(id=next_id(), root=where(root), fx_nodes=[root.name], ops=[where(root)])
        try:
            gemm_of(root)
        except Unsupported as e:
            info.reason = e.reason
            out.append(Candidate(root, [root], None, None, info))
            continue
        nodes, desc, refused = grow(root, order)
        # An op an earlier region took stays there; what depends on it here goes too.
        nodes = _drop(nodes, {n for n in nodes if n is not root and n in claimed}, root)
        excluded: dict[fx.Node, str] = {n: r for n, r in refused}
        tr = low = region = None
        for _ in range(64):
            tr = Translator(root, nodes, desc)
            try:
                tr.translate()
            except Unsupported as e:
                bad = e.node if e.node is not None and e.node is not root else None
                if bad is None:
                    info.reason = e.reason
                    tr = None
                    break
                excluded.setdefault(bad, e.reason)
                nodes = _drop(nodes, {bad}, root)
                continue
            low = _core.lower(tr.g)
            cut = _halves_cut(tr, low, nodes)
            if cut is not None:  # the halves' gated GEMM takes an elementwise epilogue only
                node, why = cut
                excluded.setdefault(node, why)
                nodes = _drop(nodes, {node}, root)
                continue
            regions = low.regions()
            region = regions[0] if regions else None
            fused_ids = set(region.fused_nodes) if region is not None else set()
            reason_of = {nid: why for nid, _, why in low.fallbacks()}
            bad: set[fx.Node] = set()
            for n in nodes:
                ids = tr.cf_of.get(n, [])
                missing = [i for i in ids if i not in fused_ids and tr.g.node(i)["kind"] not in ("input", "const")]
                if missing:
                    bad.add(n)
                    why = next((reason_of[i] for i in missing if i in reason_of and
                                not reason_of[i].startswith("its operands come from")), None)
                    why = why or next((reason_of[i] for i in missing if i in reason_of), "left out of the region by the lowering")
                    excluded.setdefault(n, f"Φ: {rename_reason(why, tr.fx_name)}")
            if not bad:
                break
            if root in bad:
                info.reason = excluded.get(root, "the lowering does not fuse this GEMM")
                tr = None
                break
            nodes = _drop(nodes, bad, root)
        info.fx_nodes = [n.name for n in nodes]
        info.ops = [where(n) for n in nodes if n is root or n.target not in _VIEW_LIKE]
        # Report the region's boundary: the ops that consume one of its values and stay out
        # (what lies beyond them follows from them).
        final = set(nodes)
        info.excluded = [Excluded(where(n), n.name, r) for n, r in excluded.items()
                         if any(i in final for i in n.all_input_nodes)]
        if tr is not None:
            claimed.update(nodes)
            g = tr.gemm
            info.m, info.n, info.k = g.m, g.n, g.k
            info.dtype = _DTYPES[g.dtype]  # bf16 or f16: gemm_of refuses other operands
            info.layout = g.layout
            info.graph_text = tr.g.text()
        out.append(Candidate(root, nodes, tr, low, info, region))
    return out


from .translate import VIEWS as _VIEWS  # noqa: E402

_SPLITS = {aten.split.Tensor, aten.split_with_sizes.default, aten.glu.default}

_VIEW_LIKE = _VIEWS | {operator.getitem}


def external_inputs(nodes: list[fx.Node]) -> list[fx.Node]:
    """The nodes outside `nodes` that they read, in the order of first use."""
    inset = set(nodes)
    ext: dict[fx.Node, None] = {}
    for n in nodes:
        for i in n.all_input_nodes:
            if i not in inset:
                ext.setdefault(i)
    return list(ext)


def region_module(nodes: list[fx.Node], outputs: list[fx.Node], inputs: list[fx.Node],
                  perms: list | None = None) -> fx.GraphModule:
    """A region's aten ops as a GraphModule of their own: one placeholder per external input (in
    the order of `inputs`, named after it and carrying its meta), a copy of every node, and the
    outputs as a tuple; an output with a perm (translate.Translator.output_perms: a transposed
    tile) transposed back, as the kernel stores it."""
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for k, i in enumerate(inputs):
        # One FX value may be two kernel inputs (x as a GEMM's A and as the residual of a 2-D
        # activation): a placeholder each (unique names), the ops read the first.
        p = g.placeholder(i.name if i not in env else f"{i.name}_dup{k}")
        p.meta = dict(i.meta)
        env.setdefault(i, p)
    for n in nodes:
        env[n] = c = g.node_copy(n, lambda x: env[x])
        # A cast that names the device its input lives on (type_as, F.rms_norm) is a cast: without
        # the device, the module also runs on meta tensors (RuntimeRegion.out_shapes).
        if n.target == aten._to_copy.default and n.kwargs.get("device") is not None and cast_change(n) is None:
            c.kwargs = {k: v for k, v in n.kwargs.items() if k != "device"}
    outs = [env[o] if p is None else g.call_function(aten.transpose.int, (env[o], *p))
            for o, p in zip(outputs, perms or [None] * len(outputs))]
    g.output(tuple(outs))
    return fx.GraphModule(torch.nn.Module(), g)


def size_hint(x) -> int:
    if isinstance(x, int):
        return x
    try:
        from torch.fx.experimental import symbolic_shapes as ss

        return int(ss.size_hint(x) if hasattr(ss, "size_hint") else ss.hint_int(x))
    except Exception:
        return int(x)


def pays(fused_us: float, unfused_us: float, margin: float = 0.0) -> bool:
    """The fusion rule, for estimates and measurements alike: fused below unfused by min_gain (and
    a measurement's margin, config.measure_margin)."""
    return fused_us < unfused_us * (1.0 - config.min_gain - margin)


def decide(c: Candidate) -> None:
    """Sets c.info.status/reason from the planner's estimates (the region must have translated)."""
    info = c.info
    tr = c.translator
    if tr is None:
        info.status = "fallback"
        return
    # The GEMMs the unfused path runs: a gated region (pair.py gated_region) replaces a GEMM per
    # gate, whose product the unfused epilogue reads as an [M, N] tile; a projection used as two
    # halves (translate.Halves) is one GEMM of 2N columns, its second half read as a gate's product.
    gates = len(tr.gates)
    halves = int(tr.halves is not None)
    info.unfused_gemm_columns = [2 * info.n] if halves else [info.n] * (1 + gates)
    epilogue = [n for n in c.nodes if n is not c.root and n.target not in _VIEW_LIKE]
    if not epilogue:
        info.status = "fallback"
        if not info.reason:
            specific = [e for e in info.excluded if not e.reason.startswith(("a second GEMM", "Φ: its operands come"))]
            first = next(iter(specific or info.excluded), None)
            info.reason = ("no epilogue op fuses after this GEMM" +
                           (f" (next: {first.node}: {first.reason})" if first else "") +
                           ": cuBLAS runs it" + (" with its bias" if c.root.target == aten.addmm.default else ""))
        return
    m = size_hint(info.m)
    dims = {"M": m, "N": info.n, "K": info.k}
    region = c.region
    opts: dict = dict(config.plan_options)
    try:
        plan = region.plan(dims, opts).summary()
    except _core.Error as e:
        info.status = "fallback"
        info.reason = f"planner: {e}"
        return
    info.plan = plan
    info.plan_options = opts
    fused = plan["total_us"]
    gemm = sum(bare_gemm_us(m, n, info.k, info.dtype, info.layout) for n in info.unfused_gemm_columns)
    # The unfused epilogue: one kernel that reads the GEMM output and the tile operands and
    # writes the region's outputs; where the region is elementwise only and every consumer is
    # elementwise too, Inductor fuses it into that consumer instead and nothing is saved.
    esize = 2 if info.dtype in ("bf16", "f16") else 4
    tiles_in = sum(val(n).element_size() for n, r in zip(tr.inputs, tr.input_roles) if r == "tile") + (gates + halves) * esize
    out_bytes = sum(val(o).element_size() * (info.n if cls == "tile" else 1)
                    for o, cls in zip(tr.outputs, tr.output_classes))
    # A row of D per GEMM row (RoPE's cos and sin, segments.py's ptile): D elements a row.
    rows_in = sum(val(n).element_size() * int(s[-1])
                  for n, r, s in zip(tr.inputs, tr.input_roles, tr.input_shapes) if r == "ptile")
    bytes_ = m * (info.n * (esize + tiles_in) + out_bytes + rows_in)
    epi = bytes_ / UNFUSED_EPILOGUE_BYTES_PER_S * 1e6 + EPILOGUE_KERNEL_US
    reductions = region.reductions
    inset = set(c.nodes)
    external = [u for o in tr.outputs for u in o.users if u not in inset]
    absorbed = reductions == 0 and external and all(
        u.op == "call_function" and hasattr(u.target, "tags") and torch.Tag.pointwise in u.target.tags for u in external)
    if absorbed:
        epi = 0.0
    unfused = gemm + epi
    gemms = f"{1 + gates} GEMMs" if gates else f"GEMM of {2 * info.n} columns" if halves else "GEMM"
    info.fused_us, info.unfused_us, info.unfused_epilogue_us = fused, unfused, epi
    # A plan class the planner prices above its measured launches (one-wave split-K at decode:
    # calibration.h one_wave_split_overestimate; one wave of single CTAs streaming tens of MB:
    # its "one-wave long streams") may pay where its estimate does not: measured.
    low = plan["low_us"]
    if pays(fused, unfused):
        info.status = "fused"
        info.reason = (f"planner: fused {fused:.1f} us vs unfused {unfused:.1f} us "
                       f"({gemms} {gemm:.1f} + epilogue {epi:.1f}) at M={m}")
    elif not absorbed and pays(low, unfused):
        info.status, info.needs_measurement = "fused", True
        info.reason = (f"planner: fused {fused:.1f} us, as low as {low:.1f} (one-wave plans measure below "
                       f"their estimates) vs unfused {unfused:.1f} us ({gemms} {gemm:.1f} + epilogue {epi:.1f}) at "
                       f"M={m}: fused where a measurement pays")
    else:
        info.status = "fallback"
        info.reason = (f"no predicted gain: fused {fused:.1f} us vs unfused {unfused:.1f} us ({gemms} {gemm:.1f} + "
                       + (f"0: Inductor fuses this elementwise epilogue into its consumer {where(external[0])}"
                          if absorbed else f"epilogue {epi:.1f}") + f") at M={m}")
    if halves:
        info.reason = (f"its two column halves as one gated GEMM of {info.n} columns (W1 and W3 the weight's blocks): "
                       + info.reason)
