"""Attention in the frontend: torch's scaled_dot_product_attention as one batched B2B kernel.

A model's attention reaches the aten graph as one SDPA op (the flash, memory-efficient, cuDNN or
CPU variant the trace picked, or the composite op), its q, k, v [B, H, S, D] views of the
projections' outputs (GPT-2: slices of c_attn's [B, S, 3HD] output, row stride 3HD). Each one
becomes the graph of examples/attention_batched(_causal).cf (softmax(Q Kᵀ · scale [+ mask]
[causal]) V with the batch B x H: S and P never leave the chip) and one comfuse::fused call that reads q, k
and v through 4-D descriptors where they lie and writes O in the layout the traced op's output
has (the flash kernel's: [B, S, H, D] storage viewed as [B, H, S, D], which the next projection
reads without a copy).

For each SDPA node, in graph order:
  1. accept (else fall back with the reason, by the user's module path): inference (dropout 0),
     static shapes, bf16/f16, q, k and v with one head count or grouped-query ones (k and v with
     fewer heads, or through repeat_kv's copy: a group's heads as one batch's rows, group_view;
     not under a causal mask), and
     a mask that is none, `is_causal`, or any other:
       - a mask computed from constants alone (transformers materializes the causal mask while
         tracing: it cannot see that the padding mask is all ones) is evaluated here at compile
         time; causal or empty, it costs nothing (the kernel's own causal walk, or no mask);
       - any other (one that depends on a runtime input: a decode step's cache position,
         padding; or a constant band or bias) is a kernel operand: an additive [B, H, M, N] tile
         (additive_mask: a bool mask's False as -inf, a float mask as it is in its own dtype,
         its finite values below MASKED raised to it), which F adds to the scaled scores before
         the online softmax. The graph computes it (additive_mask's ops: Inductor fuses them into
         the ops that build the mask; once per mask, shared by every layer), so one kernel
         serves every decode step. Only where those bytes stay below K's and V's (a decode
         step's [B, H, 1, N]; a prefill's [B, H, S, S] padding mask, S / 2D times K and V, falls
         back);
  2. the core: Φ must lower the graph to one B2B pair, choose_b2b must take it as one kernel;
  3. measure (measure.measure_attention, where the GPU that will run it is at hand): the kernel
     against Inductor's kernels for the SDPA node as the model has it (its mask included), kept
     only where it wins.
A causal or empty mask's nodes, left without users, are dropped with the rest of the graph's
dead code; a mask operand's stay, feeding its additive form.
"""
from __future__ import annotations

import logging
import math
import operator
from dataclasses import dataclass

import torch
import torch.fx as fx

from . import _core, eager_attention
from .config import config
from .kernels import RuntimeRegion, _Fallback, _NAMES
from .partition import RegionInfo, region_module, where
from .translate import _DTYPES, GEMM_DTYPES, val

log = logging.getLogger("comfuse")

aten = torch.ops.aten

# The SDPA ops of an aten graph; each takes (query, key, value, ...) by its schema's names.
SDPA_OPS = (aten._scaled_dot_product_flash_attention.default, aten._scaled_dot_product_efficient_attention.default,
            aten._scaled_dot_product_cudnn_attention.default, aten._scaled_dot_product_flash_attention_for_cpu.default,
            aten._scaled_dot_product_fused_attention_overrideable.default, aten.scaled_dot_product_attention.default)


def is_sdpa(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target in SDPA_OPS


class Refused(Exception):
    pass


# The floor of a mask operand's finite values (additive_mask). The kernel takes exp(x - m) as
# ex2(fma(x, log2 e, -round(m log2 e))); where a row's columns are all masked so far (a rank of a
# decode step's N1 split over a cluster that sees no key) x = m, and the exponent is the rounding
# residual of m log2 e, up to half its ulp: for transformers' fill, a dtype's lowest value
# (-3.4e38), up to ~2e31, exp = inf, then NaN (measured on the H200 with -1e30); for -30000, 2^-9.
# A value this far below a row's real scores still weighs exactly 0 (e^-30000 underflows), and a
# row with no other still weighs its columns alike (as torch does a row of the lowest value).
# -inf itself is exact (the kernel's rows masked so far take it: exp(-inf) = 0, a row of it
# gives 0, as torch's SDPA). Representable in f16 (65504 at most) as in f32; bf16 rounds it to -29952.
MASKED = -30000.0


@dataclass
class AttentionCandidate:
    node: fx.Node                 # the SDPA op
    out: fx.Node | None           # its attention output (getitem 0; the node itself for the composite op)
    info: RegionInfo
    q: fx.Node | None = None
    k: fx.Node | None = None
    v: fx.Node | None = None
    mask: fx.Node | None = None   # the op's mask: causal, empty, or (mask_operand) a kernel operand
    mask_module: fx.GraphModule | None = None  # a constant mask's ancestors: rebuild it for measurements
    mask_operand: bool = False    # neither causal nor empty: the kernel adds it (additive_mask)
    mask_dtype: torch.dtype | None = None  # a mask operand's (operand_dtype)
    causal: bool = False
    scale: float = 0.0
    dims: dict | None = None      # B (batch x heads), M, N, K, DV
    heads: int = 0                # q's heads
    # Grouped-query attention: q's heads per head of k and v (group_view). 1: k and v have q's
    # heads. Where the op reads k and v through repeat_kv's copy, k and v above are its sources
    # (the kernel reads each once), sdpa_k and sdpa_v the op's own arguments.
    group: int = 1
    sdpa_k: fx.Node | None = None
    sdpa_v: fx.Node | None = None
    out_strides: tuple = ()       # O's strides as the trace has them (the op's own layout)
    lowering: object | None = None
    decode_kernel: bool = False   # the planner chose the decode kernel (a few query rows a batch)
    chain: object | None = None   # attention written out (eager_attention.Chain) that `node` stands for

    def scores_shape(self) -> tuple:
        return scores_shape(self.dims, self.heads, self.group)


def scores_shape(dims: dict, heads: int, group: int) -> tuple:
    """The op's scores [B, H, M, N] (q's heads and rows, before group_view) from the kernel's dims
    (B = batch x k's heads, M = group x q's rows)."""
    return (dims["B"] * group // heads, heads, dims["M"] // group, dims["N"])


def _arguments(node: fx.Node) -> dict:
    """The op's arguments by its schema's names (attn_bias and attn_mask both as 'mask')."""
    schema = node.target._schema
    kw = {a.name: a.default_value if a.has_default_value() else None for a in schema.arguments}
    for a, x in zip(schema.arguments, node.args):
        kw[a.name] = x
    kw.update(node.kwargs)
    kw["mask"] = kw.get("attn_mask", kw.get("attn_bias"))
    return kw


def _ancestors(node: fx.Node) -> list[fx.Node]:
    """node and everything it is computed from, in dependency order."""
    seen: set[fx.Node] = set()
    order: list[fx.Node] = []
    stack = [(node, False)]
    while stack:
        n, done = stack.pop()
        if done:
            order.append(n)
            continue
        if n in seen:
            continue
        seen.add(n)
        stack.append((n, True))
        stack.extend((i, False) for i in n.all_input_nodes if i not in seen)
    return order


def mask_kind(mask: fx.Node, m: int, n: int) -> tuple[str, fx.GraphModule | None]:
    """How the kernel applies the op's mask: 'causal' (row r attends to columns 0..r, as
    is_causal) or 'none' (every column) for a mask computed from constants alone, with the module
    (no inputs) that computes it; 'operand' for any other: one computed from a graph input or a
    module's tensor (module None) or a constant one of another pattern (a band, a bias; with its
    module)."""
    nodes = _ancestors(mask)
    if any(x.op != "call_function" for x in nodes):
        return "operand", None
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for x in nodes:
        env[x] = g.node_copy(x, lambda a: env[a])
    g.output(env[mask])
    module = fx.GraphModule(torch.nn.Module(), g)
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily(), torch.no_grad():  # real tensors, inside the backend's fake mode
        try:
            value = module()
        except Exception as e:  # noqa: BLE001 - any failure to evaluate is a reason to fall back
            raise Refused(f"the attention mask could not be evaluated at compile time ({type(e).__name__}: {e})")
        if value.dtype == torch.bool:
            attend = value
        else:
            # Masked positions: -inf, or a floating dtype's most negative value (what transformers
            # fills in for SDPA's cuDNN and efficient kernels, in the mask's dtype or the model's):
            # exp() makes each exactly 0 after any row max.
            masked = value == float("-inf")
            for d in (value.dtype, torch.float16, torch.bfloat16, torch.float32):
                masked |= value == torch.finfo(d).min
            if bool(((value != 0) & ~masked).any()):
                return "operand", module  # a bias
            attend = value == 0
        attend = attend.expand(*attend.shape[:-2], m, n).reshape(-1, m, n)
        if bool((attend == torch.ones(m, n, dtype=torch.bool, device=attend.device).tril()).all()):
            return "causal", module
        if bool(attend.all()):
            return "none", module
    return "operand", module


def operand_dtype(mask_dtype: torch.dtype, q_dtype: torch.dtype) -> torch.dtype:
    """A mask operand's dtype: a float mask's own (an f32 bias on bf16 scores stays exact, as
    SDPA adds it; f64 as f32, the widest an epilogue input takes), a bool mask's q's (0 and -inf
    are exact in any)."""
    if not mask_dtype.is_floating_point:
        return q_dtype
    return mask_dtype if mask_dtype in (torch.bfloat16, torch.float16, torch.float32) else torch.float32


def _additive_mask(x, mask_dtype: torch.dtype, dtype: torch.dtype, shape: tuple, emit):
    """additive_mask written once as aten ops through emit(op, *args, **kwargs): run as they are
    (additive_mask: a measurement, the CPU fallback's tests) or put into the graph (_mask_node)."""
    if mask_dtype == torch.bool:
        x = emit(aten._to_copy.default, emit(aten.where.Scalar, x, 0.0, float("-inf")), dtype=dtype)
    else:  # finite values below MASKED raised to it; -inf kept
        if mask_dtype != dtype:
            x = emit(aten._to_copy.default, x, dtype=dtype)
        x = emit(aten.where.ScalarSelf, emit(aten.eq.Scalar, x, float("-inf")), float("-inf"),
                 emit(aten.clamp_min.default, x, MASKED))
    return emit(aten.clone.default, emit(aten.expand.default, x, list(shape)), memory_format=torch.contiguous_format)


def additive_mask(mask: torch.Tensor, dtype: torch.dtype, shape: tuple) -> torch.Tensor:
    """SDPA's attn_mask as the kernel's additive operand: `shape` [B, H, M, N], contiguous, in
    `dtype` (operand_dtype); a bool mask's False as -inf; a float mask's finite values below
    MASKED as MASKED, -inf kept."""
    return _additive_mask(mask, mask.dtype, dtype, shape, lambda op, *a, **k: op(*a, **k))


def attention_graph(dtype: str, scale: float, causal: bool, mask: str | None = None) -> "_core.Graph":
    """examples/attention_batched(_causal).cf's graph with the scale as a literal: q [B, M, K],
    k [B, N, K], v [B, N, DV] -> o [B, M, DV]; with `mask` (its dtype), an additive mask
    [B, M, N] added to the scaled scores (additive_mask makes it)."""
    g = _core.Graph()
    q = g.input("q", dtype, ["B", "M", "K"])
    k = g.input("k", dtype, ["B", "N", "K"])
    v = g.input("v", dtype, ["B", "N", "DV"])
    x = g.binary("mul", g.matmul(q, k, "nk"), g.constant(scale))
    if mask:
        x = g.binary("add", x, g.input("mask", mask, ["B", "M", "N"]))
    if causal:
        x = g.causal_mask(x)
    p = g.cast(g.softmax(x), dtype)
    g.output(g.matmul(p, v, "kn"), "o", dtype)
    return g


def _repeat_kv_source(node) -> tuple[fx.Node, int] | None:
    """(x, G) where node is transformers' repeat_kv of x ([B, Hkv, N, D] -> [B, Hkv x G, N, D]: head
    h reads x's head h // G) as aten has it: unsafe_view(clone(expand(unsqueeze(x, 2)))); else None."""
    if not isinstance(node, fx.Node) or node.target not in (aten._unsafe_view.default, aten.view.default,
                                                              aten.reshape.default):
        return None
    x = node.args[0]
    if isinstance(x, fx.Node) and x.target == aten.clone.default:
        x = x.args[0]
    if not isinstance(x, fx.Node) or x.target != aten.expand.default:
        return None
    u = x.args[0]
    if not isinstance(u, fx.Node) or u.target != aten.unsqueeze.default or u.args[1] != 2:
        return None
    src, vs, ve, vn = u.args[0], val(u.args[0]), val(x), val(node)
    if vs is None or ve is None or vn is None or vs.dim() != 4 or ve.dim() != 5:
        return None
    b, kv, n, d = vs.shape
    g = ve.shape[2]
    if tuple(ve.shape) != (b, kv, g, n, d) or tuple(vn.shape) != (b, kv * g, n, d):
        return None
    return src, int(g)


def _groups_in_place(t: torch.Tensor, group: int) -> bool:
    """Whether [B, H, M, X] views as group_view's [B, H / group, group x M, X] without a copy: one
    row a head, or each head M rows after the previous one."""
    return group == 1 or t.shape[2] == 1 or t.stride(1) == t.shape[2] * t.stride(2)


def group_view(t: torch.Tensor, group: int) -> torch.Tensor:
    """[B, H, M, X] as [B, H / group, group x M, X]: the group's heads' rows as one head's rows
    (grouped-query attention, the heads of a group contiguous as repeat_kv and SDPA's enable_gqa
    lay them out); a view where _groups_in_place, else a contiguous copy."""
    if group == 1:
        return t
    if not _groups_in_place(t, group):
        t = t.contiguous()
    b, h, m, x = t.shape
    rows = t.stride(2) if m > 1 else t.stride(1)
    return t.as_strided((b, h // group, group * m, x), (t.stride(0), group * t.stride(1), rows, t.stride(3)))


def _accept(c: AttentionCandidate) -> None:
    """Fills c from its node or raises Refused."""
    node = c.node
    kw = _arguments(node)
    if kw.get("dropout_p"):
        raise Refused(f"dropout_p = {kw['dropout_p']} (training): the fused kernel is inference only")
    q, k, v = kw["query"], kw["key"], kw["value"]
    c.sdpa_k, c.sdpa_v = k, v
    vals = [val(x) for x in (q, k, v)]
    if any(x is None for x in vals):
        raise Refused("q, k or v has no tensor metadata")
    vq, vk, vv = vals
    if any(x.dim() != 4 for x in vals):
        raise Refused(f"q, k, v of ranks {[x.dim() for x in vals]}: the kernel takes [B, H, S, D]")
    if not all(isinstance(s, int) for x in vals for s in list(x.shape) + list(x.stride())):
        raise Refused("symbolic shapes (dynamic sequence length): attention fuses at static shapes")
    if vq.dtype not in GEMM_DTYPES or vk.dtype != vq.dtype or vv.dtype != vq.dtype:
        raise Refused(f"dtypes {[str(x.dtype) for x in vals]}: the kernel takes bf16 or f16, one for all three")
    b, h, m, d = vq.shape
    if vk.shape[0] != b or vv.shape[0] != b or vk.shape[3] != d or vv.shape[2] != vk.shape[2] or \
            vk.shape[1] != vv.shape[1]:
        raise Refused(f"q {list(vq.shape)}, k {list(vk.shape)}, v {list(vv.shape)} do not form one attention")
    n, dv = vk.shape[2], vv.shape[3]
    # The mask first: whether it is causal decides the grouping below.
    causal = bool(kw.get("is_causal"))
    mask = kw.get("mask")
    if isinstance(mask, fx.Node):
        if causal:
            raise Refused("is_causal with an explicit mask")
        kind, c.mask_module = mask_kind(mask, m, n)
        causal = kind == "causal"
        c.mask = mask
        if kind == "operand":
            _accept_mask_operand(c, mask, (b, h, m, n), d + dv, vq.dtype)
    elif mask is not None:
        raise Refused(f"attention mask {mask!r} is not a tensor of the graph")
    # Grouped-query attention: k and v with fewer heads (SDPA's enable_gqa; the aten ops that take
    # them have no other meaning for it), or k and v through repeat_kv's copy, whose sources the
    # kernel then reads (each key once for its group). The group's heads become one batch's rows
    # (group_view), so not under a causal mask (is_causal, or a mask recognized as causal), whose
    # rows would shift: there repeat_kv's copy stays, and the kernel reads it.
    group = 1
    if vk.shape[1] != h:
        if causal:
            raise Refused("k and v with fewer heads than q (enable_gqa) under a causal mask: a group's heads as one "
                          "batch's rows would shift the causal mask")
        if h % vk.shape[1]:
            raise Refused(f"q has {h} heads, k and v {vk.shape[1]}: no grouping of q's heads")
        group = h // vk.shape[1]
    elif not causal:
        sk, sv = _repeat_kv_source(k), _repeat_kv_source(v)
        if sk and sv and sk[1] == sv[1] and sk[1] > 1:
            (k, group), v = sk, sv[0]
    vo = val(c.out)
    if vo is None or not all(isinstance(x, int) for x in vo.stride()):
        raise Refused("the op's output has no static strides")
    es = vq.element_size()
    if vo.stride(3) != 1 or any((x * es) % 16 for x in vo.stride()[:3]):
        raise Refused(f"the op's output strides {vo.stride()} are no layout TMA stores (a contiguous last dim, the "
                      "others multiples of 16 bytes)")
    scale = kw.get("scale")
    c.out_strides = tuple(vo.stride())
    c.q, c.k, c.v = q, k, v
    c.causal = causal
    c.scale = float(scale) if scale is not None else 1.0 / math.sqrt(d)
    c.heads = h
    c.group = group
    c.dims = {"B": b * h // group, "M": m * group, "N": n, "K": d, "DV": dv}


def _accept_mask_operand(c: AttentionCandidate, mask: fx.Node, shape: tuple, kv_cols: int, q_dtype: torch.dtype) -> None:
    """A mask that is neither causal nor empty, as the kernel's [B, H, M, N] operand (additive_mask),
    or Refused: it must broadcast to the scores and its expanded bytes stay below K's and V's
    (M <= D + DV: a decode step's rows, not a prefill's S x S)."""
    vm = val(mask)
    what = _mask_origin(c)
    if not isinstance(vm, torch.Tensor) or not (vm.dtype == torch.bool or vm.dtype.is_floating_point):
        raise Refused(f"the attention mask ({what}) is no bool or floating tensor")
    if not all(isinstance(x, int) for x in vm.shape):
        raise Refused(f"the attention mask ({what}) has symbolic shapes")
    try:
        if torch.broadcast_shapes(tuple(vm.shape), shape) != shape:
            raise RuntimeError
    except RuntimeError:
        raise Refused(f"the attention mask {list(vm.shape)} does not broadcast to the scores {list(shape)}")
    b, h, m, n = shape
    if m > kv_cols:
        raise Refused(f"the attention mask ({what}): as the kernel's operand, expanded to every head, it would hold "
                      f"M x N = {m} x {n} values a head, more than K and V ({n} x {kv_cols}); a mask operand fuses "
                      f"at M <= D + DV = {kv_cols} rows (a decode step's)")
    c.mask_operand = True
    c.mask_dtype = operand_dtype(vm.dtype, q_dtype)


def plan_kernel(g: "_core.Graph", dims: dict, plan_options: dict | None = None) -> tuple:
    """Step 2 above: the lowering and choose_b2b's choice for an attention graph at `dims`, or
    Refused with the reason (Φ forms no B2B pair, the planner refuses it, or not one kernel)."""
    try:
        low = _core.lower(g)
        if not low.is_b2b():
            raise Refused("Φ does not form one B2B pair:\n" + low.describe())
        choice = low.choose_b2b(dims, dict(plan_options or {}))
    except _core.Error as e:
        raise Refused(f"planner: {str(e).splitlines()[0]}")
    if not choice["one_kernel"]:
        raise Refused(f"planner: not one B2B kernel: {choice['reason']}")
    return low, choice


def decide(c: AttentionCandidate) -> None:
    info = c.info
    try:
        _accept(c)
    except Refused as e:
        info.status, info.reason = "fallback", str(e)
        return
    vq = val(c.q)
    dtype = _DTYPES[vq.dtype]
    g = attention_graph(dtype, c.scale, c.causal, _DTYPES[c.mask_dtype] if c.mask_operand else None)
    info.m, info.n, info.k = c.dims["M"], c.dims["N"], c.dims["K"]
    info.dtype, info.layout, info.graph_text = dtype, "attention", g.text()
    try:
        low, choice = plan_kernel(g, c.dims, config.plan_options)
    except Refused as e:
        info.status, info.reason = "fallback", str(e)
        return
    c.lowering = low
    c.decode_kernel = bool(choice.get("decode"))
    info.fused_us = choice["fused_us"]
    info.plan = {"kind": "attention", "explain": choice["explain"], "dims": dict(c.dims)}
    info.status = "fused"
    b = c.scores_shape()[0]
    kind = "causal" if c.causal else "masked" if c.mask_operand else "unmasked"
    grouped = (f", grouped-query: {c.group} heads a group of k and v, its rows one batch's"
               + (" (repeat_kv's copy skipped)" if c.k is not c.sdpa_k else "")) if c.group > 1 else ""
    info.reason = (f"one batched B2B kernel ({b} x {c.heads} heads{grouped}, {kind}{_mask_note(c)}"
                   + f", scale {c.scale:.6g}): planner estimate {choice['fused_us']:.1f} us")


def _mask_origin(c: AttentionCandidate) -> str:
    """Why a mask is a kernel operand, in the report's words: what it is computed from."""
    if c.mask_module is not None:
        return "a constant neither causal nor empty"
    # (The graph's placeholders carry AOTAutograd's names, arg0_1 .., not the user's.)
    sources = {x.op for x in _ancestors(c.mask) if x.op != "call_function"}
    return ("it depends on a runtime input (a cache position, padding)" if "placeholder" in sources
            else "it reads a tensor of the module")


def _mask_note(c: AttentionCandidate) -> str:
    """How the kernel applies the model's mask, for the report."""
    if c.mask is None:
        return ""
    if c.mask_operand:
        return f", the model's mask added to the scores (a kernel operand: {_mask_origin(c)})"
    return ", the model's mask recognized as " + ("causal" if c.causal else "empty")


# Where no measurement decides (config.measure off, a CUDA graph capture), an attention whose mask
# is a kernel operand: its kernel's time over SDPA's, MEASURED on the H200 at decode shapes (bench/
# RESULTS.md, "Decode attention"; bench/models.py's regions). The wgmma pipeline with the mask
# operand: 0.99-1.97x. The decode kernel: 0.16-0.93x at 16 to 512 batches of 64 to 4096 keys and
# in GPT-2's and Llama's decode steps at batch 32, 1.04-1.08x at Llama's batch 1 (8 batches of 64
# keys, head dim 128: its launch's fixed cost; the one prior fuses it where nothing measures). The
# B2B planner prices SDPA's kernel not at all, so these priors stand in for it.
MASK_OPERAND_PRIOR = 2.0
DECODE_KERNEL_PRIOR = 0.8


def unmeasured_fallback(c: AttentionCandidate) -> str:
    """The reason an attention falls back where no measurement decides, or "": one whose mask is
    an operand on the wgmma pipeline runs (a decode step's) slower than SDPA's kernel as measured
    so far, so it fuses only where config.min_gain accepts that prior (tests of the kernel set it
    to fuse anyway); on the decode kernel it fuses (its prior is below 1)."""
    prior = DECODE_KERNEL_PRIOR if c.decode_kernel else MASK_OPERAND_PRIOR
    if not c.mask_operand or prior < 1.0 - config.min_gain:
        return ""
    kernel = "the decode kernel" if c.decode_kernel else "the wgmma pipeline"
    return (f"not measured, and an attention whose mask is a kernel operand takes {prior:g}x SDPA's kernel's "
            f"time at decode shapes on {kernel} (the prior, bench/RESULTS.md), which config.min_gain = "
            f"{config.min_gain:g} does not accept: it fuses where a measurement says it pays")


def find(gm: fx.GraphModule, next_id) -> list[AttentionCandidate]:
    """Every SDPA node of the graph, decided; attention written out (eager_attention) too, as the
    SDPA op put beside it."""
    chains = {ch.sdpa: ch for ch in eager_attention.find(gm)}
    out = []
    for node in gm.graph.nodes:
        if not is_sdpa(node):
            continue
        if node.target is aten.scaled_dot_product_attention.default:
            res = node
        else:
            firsts = [u for u in node.users if u.target is operator.getitem and u.args[1] == 0]
            others = [u for u in node.users if not (u.target is operator.getitem and u.args[1] == 0) and u.users]
            res = firsts[0] if len(firsts) == 1 else None
        info = RegionInfo(id=next_id(), root=where(node), fx_nodes=[node.name], ops=[where(node)])
        c = AttentionCandidate(node, res, info, chain=chains.get(node))
        if res is None or (res is not node and others):
            info.status, info.reason = "fallback", "the op's log-sum-exp or other outputs are used (training)"
        else:
            decide(c)
        if c.chain is not None:  # the report names the model's own ops
            info.fx_nodes = [node.name] + [n.name for n in c.chain.nodes]
            info.ops = [where(node)] + [where(n) for n in c.chain.nodes if n.target in _CHAIN_OPS]
            info.reason = f"attention written out (bmm, softmax, bmm) as one SDPA op: {info.reason}"
        out.append(c)
    return out


_CHAIN_OPS = (aten.bmm.default, aten.mul.Tensor, aten.div.Tensor, aten.add.Tensor, aten._softmax.default)


class RuntimeAttention(RuntimeRegion):
    """What the custom op runs for one attention: the kernel on q, k, v (and a mask operand: the
    additive [B, H, M, N] tile the graph computes, additive_mask) as they lie (4-D descriptors; a
    view TMA cannot read is copied), O allocated with the strides the traced op's output has (the
    flash kernel's [B, S, H, D] storage viewed as [B, H, S, D]), so that the views after it stay
    valid; on the fallback path torch's SDPA into the same layout."""

    _what = "attention"

    def __init__(self, c: AttentionCandidate, subgraph: fx.GraphModule):
        names = ["q", "k", "v"] + (["mask"] if c.mask_operand else [])
        super().__init__(c.info, None, names, names, ["o"], subgraph)
        self.lowering = c.lowering
        self.dims = dict(c.dims)
        self.heads, self.group = c.heads, c.group
        self.causal, self.scale = c.causal, c.scale
        self.out_strides = c.out_strides
        self.mask_module = c.mask_module
        self.mask_operand, self.mask_dtype = c.mask_operand, c.mask_dtype

    def subgraph_args(self, tensors, sizes):
        """The SDPA region's arguments for tensors given for q, k, v and the op's mask (a
        measurement's random values, or a benchmark's recorded kernel operands, whose mask is its
        additive form: SDPA takes either alike): a constant mask as the model computes it."""
        if self.mask_module is None:
            return list(tensors)
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily(), torch.no_grad():
            return list(tensors[:3]) + [self.mask_module().to(tensors[0].device)]

    def kernel_args(self, args: list) -> list:
        """The custom op's tensors for the SDPA region's arguments (subgraph_args'): q, k, v, and
        a mask operand as the graph hands it over (additive_mask)."""
        q, k, v = args[:3]
        if self.group > 1 and k.shape[1] == self.heads:  # repeat_kv's copy: one head of each group
            k, v = k[:, ::self.group], v[:, ::self.group]
        if not self.mask_operand:
            return [q, k, v]
        shape = (q.shape[0], self.heads, q.shape[2], self.dims["N"])
        return [q, k, v, additive_mask(args[3], self.mask_dtype, shape)]

    def _out(self, q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        shape = (q.shape[0], q.shape[1], q.shape[2], v.shape[3])
        return torch.empty_strided(shape, self.out_strides, dtype=q.dtype, device=q.device)

    def fake(self, tensors, sizes):
        return [self._out(tensors[0], tensors[2])]

    def fallback(self, tensors, sizes, why: str):
        self._note_fallback(why)
        q, k, v = tensors[:3]
        mask = tensors[3] if self.mask_operand else None
        o = self._out(q, v)
        o.copy_(torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal,
                                                                 scale=self.scale, enable_gqa=self.group > 1))
        return [o]

    def kernel_key(self, m: int) -> tuple:
        key = ("attention", self.key_text, tuple(sorted(self.dims.items())), tuple(sorted(self.info.plan_options.items())))
        return self.dims["M"], key, self.info.plan_options

    def _compile(self, bucket: int, opts: dict):
        return self.lowering.compile_b2b(self.dims, opts)

    @staticmethod
    def _plan_summary(k) -> dict:
        return {"kind": "attention"}

    def _launch(self, tensors, sizes, dev):
        d, g = self.dims, self.group
        b, _, m, _ = scores_shape(d, self.heads, g)
        kv = self.heads // g
        want = [(b, self.heads, m, d["K"]), (b, kv, d["N"], d["K"]), (b, kv, d["N"], d["DV"]),
                (b, self.heads, m, d["N"])][:len(self.names)]
        got = [tuple(t.shape) for t in tensors]
        if got != want:
            raise _Fallback(f"{', '.join(self.names)} are {got}, the traced shapes {want}")
        o = self._out(tensors[0], tensors[2])
        # A group's heads as one batch's rows (group_view); O through a contiguous buffer where its
        # strides allow no such view.
        staged = None if _groups_in_place(o, g) else torch.empty(o.shape, dtype=o.dtype, device=o.device)
        og = group_view(o if staged is None else staged, g)
        views = [_tma_view(group_view(t, g) if i in (0, 3) else t, self.info.id) for i, t in enumerate(tensors)]
        capturing = dev.type == "cuda" and torch.cuda.is_current_stream_capturing()
        kern = self.kernel(self.dims["M"], capturing)
        args, strides = {}, {}
        for name, t in zip(self.names + ["o"], views + [og]):
            args[name] = (t.data_ptr(), _NAMES[t.dtype], list(t.shape), t.stride(2))
            strides[name] = [t.stride(0), t.stride(1)]
        kern.run(args, {}, torch.cuda.current_stream(dev).cuda_stream, strides)
        if staged is not None:
            o.copy_(staged)
        return [o]


def _tma_view(t: torch.Tensor, region: int) -> torch.Tensor:
    """t ([B, H, S, D]) as the kernel's 4-D descriptor reads it: contiguous last dim, 16-byte
    aligned base and strides; copied where it is not (logged at DEBUG)."""
    es = t.element_size()
    if t.stride(3) != 1 or t.data_ptr() % 16 or any((s * es) % 16 for s in t.stride()[:3]):
        log.debug("comfuse: attention %d copies a %s operand with strides %s", region, tuple(t.shape), t.stride())
        t = t.contiguous()
        if t.data_ptr() % 16:
            t = t.clone()
    return t


def runtime(c: AttentionCandidate) -> tuple[RuntimeAttention, list[fx.Node]]:
    """The candidate's runtime object and the nodes its measurement feeds Inductor's version of
    the op (q, k, v, and the mask where the op has one)."""
    inputs = [c.q, c.sdpa_k, c.sdpa_v] + ([c.mask] if c.mask is not None else [])
    nodes = [c.node] + ([c.out] if c.out is not c.node else [])
    return RuntimeAttention(c, region_module(nodes, [c.out], inputs)), inputs


def _mask_node(graph: fx.Graph, mask: fx.Node, dtype: torch.dtype, shape: tuple) -> fx.Node:
    """additive_mask(mask, dtype, shape) as aten nodes of the graph right after the mask (Inductor
    fuses them into the ops that compute it), made once per mask: every layer's attention that
    reads the same mask shares them."""
    key = (mask.name, dtype, tuple(shape))
    for n in graph.nodes:
        if n.meta.get("comfuse_additive_mask") == key:
            return n
    last = [mask]

    def emit(op, *args, **kwargs):
        with graph.inserting_after(last[0]):
            n = graph.call_function(op, args, kwargs)
        n.meta["val"] = op(*[val(a) if isinstance(a, fx.Node) else a for a in args], **kwargs)
        last[0] = n
        return n

    out = _additive_mask(mask, val(mask).dtype, dtype, shape, emit)
    out.meta["comfuse_additive_mask"] = key
    return out


def replace(gm: fx.GraphModule, c: AttentionCandidate, rr: RuntimeAttention, subst: dict) -> None:
    """Registers rr and puts one comfuse::fused call on q, k, v (and a mask operand's additive
    form, _mask_node) where the SDPA op was (`subst`: the values of regions replaced before it,
    backend.rewrite's)."""
    from .kernels import REGISTRY

    REGISTRY[c.info.id] = rr
    graph = gm.graph
    operands = [subst.get(x, x) for x in (c.q, c.k, c.v)]
    if c.mask_operand:
        operands.append(_mask_node(graph, subst.get(c.mask, c.mask), c.mask_dtype, c.scores_shape()))
    with graph.inserting_after(c.out):
        call = graph.call_function(torch.ops.comfuse.fused.default, (c.info.id, operands, []))
    with graph.inserting_after(call):
        gi = graph.call_function(operator.getitem, (call, 0))
    out_val = val(c.out)
    call.meta["val"] = [out_val]
    gi.meta = {k: v for k, v in c.out.meta.items() if k in ("val", "tensor_meta", "stack_trace", "nn_module_stack")}
    c.out.replace_all_uses_with(gi, delete_user_cb=lambda u: u is not call)
    subst[c.out] = gi  # a later attention or region reading this one's output reads the kernel's
    if c.chain is not None:
        subst[c.chain.out] = gi
    for u in list(c.node.users):
        if not u.users:
            graph.erase_node(u)
    if not c.node.users:
        graph.erase_node(c.node)
    if c.chain is not None:
        eager_attention.take_over(graph, c.chain, gi)
