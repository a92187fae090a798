"""Attention written out (transformers' eager attention, hand-written attention modules) as the
SDPA op it computes, so that attention.py takes it as it takes torch's SDPA: one batched B2B
kernel, its mask recognized or made a kernel operand, grouped heads read once.

The chain, at aten level (each intermediate value used by the next node alone):

    s = bmm(q, k^T) viewed [B, H, M, N]      q [B, H, M, D] and k [B, H, N, D] through
                                             expand / clone / view (k through transpose(-2, -1))
    s = s * scale  |  s / d                  a Python number (none: scale 1)
    s = s + mask                             optional, either operand order
    p = softmax(s, -1)                       optionally in f32 (_to_copy there and back)
    p = clone(p)                             optional (eval-mode dropout)
    o = bmm(p, v) viewed [B, H, M, DV]       v [B, H, N, DV] through expand / view

find() puts aten.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale) beside each
such chain (a node without users, `Chain.sdpa`); attention.find then decides it as any SDPA op.
A fused one takes the chain's output's users (attention.replace) and the chain goes; one that
is not is removed again (drop_unused), so the model's own ops run unfused as it wrote them. The
measurement times the kernel against Inductor's kernels for that SDPA op, which are no slower
than Inductor's for the chain: a fused chain beats both.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.fx as fx

from .translate import cast_change, val

aten = torch.ops.aten

_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.expand.default,
          aten.clone.default)
_CASTS = (aten._to_copy.default,)


@dataclass
class Chain:
    """One attention written out, and the SDPA op put beside it."""
    out: fx.Node                 # o viewed [B, H, M, DV]: the chain's value the model uses
    nodes: list[fx.Node]         # every node of the chain from the first bmm to `out`, in order
    sdpa: fx.Node | None = None  # aten.scaled_dot_product_attention on the chain's q, k, v, mask


def _single_user(n: fx.Node) -> bool:
    return len(n.users) == 1


def _through(n, targets, seen: list[fx.Node]) -> fx.Node:
    """n's source through single-user nodes whose target is in `targets` (each appended to seen;
    a _to_copy only where it changes the dtype alone)."""
    while isinstance(n, fx.Node) and n.op == "call_function" and n.target in targets and _single_user(n) and \
            (n.target not in _CASTS or cast_change(n) is None):
        seen.append(n)
        n = n.args[0]
    return n


def _leads_to_bmm(y) -> bool:
    """Whether y is the scores: a bmm viewed 4-D, or that scaled by a number."""
    if isinstance(y, fx.Node) and y.op == "call_function" and y.target in (aten.mul.Tensor, aten.div.Tensor):
        y = y.args[0]
    return isinstance(y, fx.Node) and y.op == "call_function" and y.target == aten.view.default and \
        isinstance(y.args[0], fx.Node) and y.args[0].target == aten.bmm.default


def _rank4(n) -> bool:
    v = val(n)
    return v is not None and v.dim() == 4


def _source(n: fx.Node, seen: list[fx.Node], transposed: bool = False) -> fx.Node | None:
    """The [B, H, S, D] value an operand of a bmm views: back through the 3-D views of the bmm's
    batch and the 4-D expands and clones that keep the shape, to the first other 4-D value (so
    repeat_kv's copy stays the operand, as SDPA would get it); for k^T, through a transpose of its
    last two dims too."""
    x = n
    while isinstance(x, fx.Node) and x.op == "call_function" and x.target in _VIEWS and _single_user(x):
        vx = val(x)
        if vx is None:
            return None
        if vx.dim() == 4 and not (x.target in (aten.expand.default, aten.clone.default) and
                                  isinstance(x.args[0], fx.Node) and _rank4(x.args[0]) and
                                  tuple(val(x.args[0]).shape) == tuple(vx.shape)):
            break
        if vx.dim() not in (3, 4):
            return None  # neither the bmm's batch view nor a 4-D expand or clone that keeps the shape
        seen.append(x)
        x = x.args[0]
    if transposed:
        if not (isinstance(x, fx.Node) and x.op == "call_function" and x.target == aten.transpose.int and
                _single_user(x) and _rank4(x.args[0]) and sorted(d % 4 for d in x.args[1:3]) == [2, 3]):
            return None
        seen.append(x)
        x = x.args[0]
    return x if isinstance(x, fx.Node) and _rank4(x) else None


def _scores(n: fx.Node, seen: list[fx.Node]) -> tuple[fx.Node | None, float, fx.Node | None]:
    """(the first bmm, its scale, the mask) of the scores feeding the softmax, or (None, ...)."""
    mask = None
    scale = 1.0
    x = _through(n, _CASTS, seen)
    if x.op == "call_function" and x.target == aten.add.Tensor and _single_user(x) and x.kwargs.get("alpha", 1) == 1:
        a, b = x.args[:2]
        scored = [y for y in (a, b) if _leads_to_bmm(y)]
        if len(scored) != 1 or not all(isinstance(y, fx.Node) for y in (a, b)):
            return None, 0.0, None
        seen.append(x)
        mask = b if scored[0] is a else a
        x = scored[0]
    if x.op == "call_function" and x.target in (aten.mul.Tensor, aten.div.Tensor) and _single_user(x):
        s, c = x.args[:2]
        if not isinstance(s, fx.Node) or isinstance(c, bool) or not isinstance(c, (int, float)) or c == 0:
            return None, 0.0, None
        scale = float(c) if x.target == aten.mul.Tensor else 1.0 / float(c)
        seen.append(x)
        x = s
    if not (x.op == "call_function" and x.target == aten.view.default and _single_user(x) and _rank4(x)):
        return None, 0.0, None
    seen.append(x)
    bmm = x.args[0]
    if not (isinstance(bmm, fx.Node) and bmm.target == aten.bmm.default and _single_user(bmm)):
        return None, 0.0, None
    return bmm, scale, mask


def _chain(bmm2: fx.Node) -> tuple[Chain, fx.Node, fx.Node, fx.Node, fx.Node | None, float] | None:
    """The chain ending in bmm2 (p @ v) with its q, k, v, mask and scale, or None."""
    users = list(bmm2.users)
    if len(users) != 1 or users[0].target != aten.view.default or not _rank4(users[0]):
        return None
    out = users[0]
    seen: list[fx.Node] = []
    v = _source(bmm2.args[1], seen)
    p = _through(bmm2.args[0], _VIEWS, seen)
    p = _through(p, _CASTS, seen)
    if not (isinstance(p, fx.Node) and p.target == aten._softmax.default and _single_user(p)):
        return None
    dim = p.args[1]
    if not isinstance(dim, int) or dim % 4 != 3:
        return None
    seen.append(p)
    bmm1, scale, mask = _scores(p.args[0], seen)
    if bmm1 is None or v is None:
        return None
    seen.append(bmm1)
    q = _source(bmm1.args[0], seen)
    k = _source(bmm1.args[1], seen, transposed=True)
    if q is None or k is None:
        return None
    order = {n: i for i, n in enumerate(bmm2.graph.nodes)}
    nodes = sorted(set(seen) | {bmm2, out}, key=order.__getitem__)
    return Chain(out, nodes), q, k, v, mask, scale


def find(gm: fx.GraphModule) -> list[Chain]:
    """Every attention written out in gm, each with its SDPA op beside it (no users yet)."""
    from torch._guards import detect_fake_mode

    chains = []
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target != aten.bmm.default:
            continue
        found = _chain(node)
        if found is None:
            continue
        chain, q, k, v, mask, scale = found
        vals = [val(x) for x in (q, k, v)] + ([val(mask)] if mask is not None else [])
        if any(x is None for x in vals) or (mask is not None and not vals[3].is_floating_point()):
            continue
        kwargs = {"attn_mask": mask, "dropout_p": 0.0, "is_causal": False, "scale": scale}
        with graph.inserting_after(chain.out):
            sdpa = graph.call_function(aten.scaled_dot_product_attention.default, (q, k, v), kwargs)
        fake = detect_fake_mode(vals)
        try:
            with fake if fake is not None else contextlib.nullcontext():
                sdpa.meta["val"] = aten.scaled_dot_product_attention.default(
                    *vals[:3], attn_mask=vals[3] if mask is not None else None, dropout_p=0.0, is_causal=False,
                    scale=scale)
        except Exception:  # shapes SDPA does not take as one attention: the chain stays as it is
            graph.erase_node(sdpa)
            continue
        got, want = sdpa.meta["val"], val(chain.out)
        if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
            graph.erase_node(sdpa)  # the bmm's batch is not q's [B, H] as the chain views it
            continue
        # O in the chain's layout (a contiguous [B, H, M, DV]), not SDPA's: what follows was traced
        # on it (a view of it, or the graph's output), and the kernel, its fake and its fallback
        # write the layout the op's value has (attention.AttentionCandidate.out_strides).
        sdpa.meta["val"] = want
        for key in ("nn_module_stack", "stack_trace"):
            if key in node.meta:
                sdpa.meta[key] = node.meta[key]
        sdpa.meta["comfuse_eager_chain"] = True
        chain.sdpa = sdpa
        chains.append(chain)
    return chains


def take_over(graph: fx.Graph, chain: Chain, value: fx.Node) -> None:
    """The chain's users read `value` (the fused kernel's output) instead; the chain goes."""
    chain.out.replace_all_uses_with(value)
    for n in reversed(chain.nodes):
        if not n.users:
            graph.erase_node(n)


def drop_unused(gm: fx.GraphModule) -> bool:
    """Removes every SDPA op find() put beside a chain that no kernel took (it has no users);
    whether the graph changed."""
    graph = gm.graph
    gone = [n for n in graph.nodes if n.meta.get("comfuse_eager_chain") and not n.users]
    for n in gone:
        graph.erase_node(n)
    return bool(gone)


__all__ = ["Chain", "find", "take_over", "drop_unused"]
