"""Values over segments of the last dim (translate.py calls these): per-head norms, Qwen 3's and
Gemma 3's q/k norms over each head's D columns (`q_norm(q_proj(h).view(B, S, H, D))`).

A view of a tile that splits only its last dim N into [..., H, D] (D concrete, H = N / D > 1, the
leading dims' product still M) is the same [M, N] tile in the ComFuse graph, its TV's `seg` D;
the region's segment length (Translator.segment) is then D. Over such a value:

    tile  [..., H, D]           the tile, each row's N columns as H runs of D
    stat  [..., H, 1]           a reduction over each run (keepdim): a segmented reduction of the
                                graph (Graph.reduce(segment=D)), which keeps the tile's shape,
                                every column holding its run's statistic
    vec   [D] (or [1, .., D])   an operand of one run's length (a per-head norm's gamma): a graph
                                input [D] (role "vec") read periodically (column j reads j mod D),
                                which the graph allows only against a value computed from a
                                segmented reduction (TV.per_seg)
    row   [H, D]                an operand of one value per head and column, the same for every
                                row (Cohere's per-head LayerNorm weight): the row [N] of its
                                elements in order, a graph input [N] (role "row"; heads_row())

A view back to [..., N] is the tile again. A transpose of two dims before the last (Gemma 3 norms
q after `.transpose(1, 2)`) is the same graph value too, its TV's `perm` those dims: shapes are
compared with them swapped back, and an output so transposed is stored as the [M, N] tile and
transposed again after the custom op (Translator.output_perms), which gives it the strides an
elementwise op of the transposed view has in eager (an output of other strides, e.g. softmax's
packed rows, is refused).

Rotary position embeddings (RoPE, transformers' apply_rotary_pos_emb: q * cos + rotate_half(q) *
sin over each head, after the transpose of the heads or before it): rotary.py turns the rotation
of each head into one graph op; its cos and sin are operands here:

    ptile [..., 1, D]   an operand of one row of D per GEMM row (RoPE's cos and sin, [B, 1, S, D]
                        against [B, H, S, D], [B, S, 1, D] against [B, S, H, D], or [S, D], [1, 1,
                        S, D] broadcast over the batch): a graph input [M, D] (role "ptile") that
                        the binary reads periodically (Graph.binary(segment=D): column j reads
                        column j mod D). The custom op gets the model's tensor as it is;
                        ptile_rows() views it as the kernel's [M, D] rows in the GEMM's row order
                        at run time (a copy where it broadcasts over a row dim)

A vec against a value computed from no per-segment op (RoPE's cos at one token, [1, 1, 1, D]) is
a binary with segment=D too (Φ takes such a binary in an epilogue that rotates or reduces those
runs, and says why not otherwise).

One region takes one segment length, and its reductions share it (whole rows or runs of D, as Φ
fuses them). What else meets segments raises Unsupported with the reason: a second length, a
stat as an output (the kernel would store [M, N]), a reduction without keepdim, an operand that
torch broadcasts otherwise than the graph would.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.fx as fx

from .translate import _ROW_VIEWS, TV, Unsupported, _known_equal, cf_dtype, static_int, val

if TYPE_CHECKING:  # pragma: no cover
    from .translate import Translator

aten = torch.ops.aten


def swapped(shape, perm: tuple[int, int] | None) -> list:
    """shape with the dims `perm` (negative indices) swapped: a transposed value's shape in the
    layout before the transpose."""
    shape = list(shape)
    if perm is not None and len(shape) >= -perm[0]:
        i, j = perm
        shape[i], shape[j] = shape[j], shape[i]
    return shape


def seg_class(tr: "Translator", shape, perm: tuple[int, int] | None = None) -> str | None:
    """"tile" for [..., H, D] and "stat" for [..., H, 1] over the region's segments (the leading
    dims' product M; with `perm`, a shape whose dims perm are swapped against that), else None."""
    d = tr.segment
    if not d or len(shape) < 2 or perm is not None and len(shape) < -perm[0]:
        return None
    shape = swapped(shape, perm)
    if not (_known_equal(shape[-2], tr.gemm.n // d) and _known_equal(math.prod(shape[:-2]), tr.gemm.m)):
        return None
    if _known_equal(shape[-1], d):
        return "tile"
    if _known_equal(shape[-1], 1):
        return "stat"
    return None


def split(tr: "Translator", node: fx.Node, shape) -> int:
    """D where a view to `shape` splits only the last dim N of the tile into [..., H, D] (H, D > 1,
    D concrete, the leading dims' product M); 0 where it does not. The region's segment length
    becomes D; a second length raises Unsupported."""
    if len(shape) < 2:
        return 0
    d, h = static_int(shape[-1]), static_int(shape[-2])
    if d is None or h is None or d <= 1 or h <= 1 or d * h != tr.gemm.n:
        return 0
    if not _known_equal(math.prod(shape[:-2]), tr.gemm.m):
        return 0
    if tr.segment and tr.segment != d:
        raise Unsupported(node, f"splits the last dim into runs of {d} columns in a region over runs of "
                                f"{tr.segment}: a kernel's segments share one length")
    tr.segment = d
    return d


def operand_class(tr: "Translator", x: fx.Node, user: fx.Node, v: torch.Tensor) -> str | None:
    """An operand from outside the region over the region's segments: "vec" or "ptile" (its graph
    input added, in tr.leaf_ids), "tile" for a [..., H, D] one and "row" for an [H, D] one
    (heads_row: the caller adds the tile or row input), None for any other (the caller's classes
    apply); a [..., H, 1] one raises Unsupported."""
    d = tr.segment
    if not d:
        return None
    if v.dim() >= 1 and _known_equal(v.shape[-1], d) and all(_known_equal(s, 1) for s in v.shape[:-1]):
        tr.leaf_ids[x] = TV(tr._add_input(x, "vec", cf_dtype(v.dtype, user), [d]), "vec", d)
        return "vec"
    cls = seg_class(tr, v.shape)
    if cls == "stat":
        raise Unsupported(user, f"operand '{x.name}' of shape {tuple(v.shape)} holds a value per row and run of "
                                f"{d} columns: the kernel reads per-row columns and [M, N] tiles")
    if cls is None and v.dim() >= 2 and _known_equal(v.shape[-1], d) and heads_row(tr, user, v):
        return "row"  # a value per head and column (Cohere's per-head norm weight [H, D]): a row of N
    if cls is None and v.dim() >= 2 and _known_equal(v.shape[-1], d):
        layout = ptile_layout(tr, user, v)
        if layout is not None:  # one row of D per GEMM row: RoPE's cos and sin
            tr.leaf_ids[x] = TV(tr._add_input(x, "ptile", cf_dtype(v.dtype, user), [tr.dim_m, d]), "ptile", d,
                                False, layout[1])
            tr.input_rows[-1] = layout
            return "ptile"
    return cls


# The ops whose operand may be a ptile (the binaries the Translator gives a segment).
_PTILE_USERS = {aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor, aten.maximum.default,
                aten.minimum.default, aten.rsub.Tensor}


def _user_perm(tr: "Translator", user: fx.Node):
    """The perm of the binary `user`'s operands over segments (a tile or stat of the region), or
    False where it has none."""
    tvs = [tr.env.get(a) for a in user.args if isinstance(a, fx.Node) and a in tr.in_region]
    segs = [t for t in tvs if isinstance(t, TV) and t.seg and t.cls in ("tile", "stat")]
    return segs[0].perm if segs else False


def heads_row(tr: "Translator", user: fx.Node, v: torch.Tensor) -> bool:
    """Whether an operand `v` of the binary `user` holds one value per head and column, the same for
    every row ([H, D] against [..., H, D]: Cohere's per-head LayerNorm weight; [H, 1, D] against
    the heads transposed): the row [N] its elements are in their order (h * D + d, its only dims
    of more than one element being H and D, in that order), which the kernel reads as a row."""
    d = tr.segment
    perm = _user_perm(tr, user) if user.target in _PTILE_USERS else False
    out = val(user)
    if perm is False or out is None or seg_class(tr, out.shape, perm) != "tile" or v.dim() > out.dim():
        return False
    s = swapped([1] * (out.dim() - v.dim()) + list(v.shape), perm)
    return (all(_known_equal(a, 1) for a in s[:-2]) and _known_equal(s[-2], tr.gemm.n // d)
            and _known_equal(s[-1], d))


def ptile_layout(tr: "Translator", user: fx.Node, v: torch.Tensor, perm=False) -> tuple | None:
    """How an operand `v` of the binary `user` is one row of D per GEMM row: the layout (rows_of()
    below) that ptile_rows() views it with as [M, D] at run time; None where `user` has no operand
    over segments to align with, or that is not [..., 1, D] against its heads (the caller's classes
    apply). Unsupported where it broadcasts over several row dims.
    perm: the operands' perm, where the caller knows it (check_operands); else from user's args."""
    d = tr.segment
    if user.target not in _PTILE_USERS:
        return None
    if perm is False:
        perm = _user_perm(tr, user)
        if perm is False:
            return None
    out = val(user)
    if out is None or seg_class(tr, out.shape, perm) != "tile" or v.dim() > out.dim():
        return None
    s = swapped([1] * (out.dim() - v.dim()) + list(v.shape), perm)
    if not _known_equal(s[-2], 1):
        return None  # a value per head (Cohere's norm weight [H, D], heads_row()): no row of D per GEMM row
    return rows_of(user, v, out, perm, True, d)


def tile_layout(tr: "Translator", user: fx.Node, v: torch.Tensor) -> tuple | None:
    """Where the region has no segments: how an operand `v` [..., N] of the binary `user` that
    torch broadcasts over one row dim of the tile (RoPE's cos [1, 1, S, D] against a k_proj of one
    key head, [B, 1, S, D]: its D columns all of N) is the kernel's [M, N] tile input, viewed by
    ptile_rows() (expanded and copied); None where it is no such operand."""
    out = val(user)
    if (user.target not in _PTILE_USERS or out is None or v.dim() < 2 or v.dim() > out.dim()
            or tr.classify(out) != "tile" or not _known_equal(v.shape[-1], tr.gemm.n)):
        return None
    tvs = [tr.env.get(a) for a in user.args if isinstance(a, fx.Node) and a in tr.in_region]
    if not any(isinstance(t, TV) and t.cls == "tile" and not t.seg for t in tvs):
        return None
    return rows_of(user, v, out, None, False, tr.gemm.n)


def rows_of(user: fx.Node, v: torch.Tensor, out: torch.Tensor, perm, heads: bool, width: int) -> tuple:
    """The layout (rank, perm, heads, bdim) of an operand `v` of `user` (result `out`) as the
    kernel's [M, width] rows: padded to out's rank and its dims `perm` swapped (into the GEMM's row
    order), the heads' dim (-2, one for all heads) squeezed where `heads`, and the one row dim
    `bdim` (negative, of that rank) it broadcasts over, or None; Unsupported where it broadcasts
    over several row dims or its rows are no 16-byte multiple."""
    r = swapped(out.shape, perm)
    s = swapped([1] * (len(r) - v.dim()) + list(v.shape), perm)
    shape = tuple(v.shape)
    rows = len(r) - (2 if heads else 1)
    bcast = [i for i in range(rows) if not _known_equal(s[i], r[i])]
    if any(not _known_equal(s[i], 1) for i in bcast):
        raise Unsupported(user, f"operand of shape {shape} does not broadcast against {tuple(out.shape)}")
    if len(bcast) > 1:
        raise Unsupported(user, f"operand of shape {shape} broadcasts over {len(bcast)} of the rows' dims of "
                                f"{tuple(out.shape)}: the kernel reads one row of {width} per GEMM row, viewed or "
                                "expanded along one dim only")
    if (width * v.element_size()) % 16:
        raise Unsupported(user, f"operand of shape {shape}: rows of {width * v.element_size()} bytes are not a "
                                "multiple of 16 (TMA needs 16-byte rows)")
    return (len(r), perm, heads, bcast[0] - len(r) if bcast else None)


def ptile_rows(t: torch.Tensor, m: int, layout: tuple) -> torch.Tensor:
    """The kernel's [m, D] rows of an operand `t` with a layout (rows_of(): RoPE's cos as the model
    has it, e.g. [B, 1, S, D]), in the GEMM's row order: a view where its layout allows
    (transformers' cos [B, S, D] unsqueezed: no copy), else a copy. A broadcast over a row dim
    (cos [1, 1, S, D] against B > 1 sequences: transformers' position ids of one sequence) is
    expanded and copied, B * S * D elements a call (the kernel reads packed rows)."""
    rank, perm, heads, bdim = layout
    t = t.reshape([1] * (rank - t.dim()) + list(t.shape))
    if perm is not None:
        t = t.transpose(*perm)
    if heads:
        t = t.squeeze(-2)  # the heads' dim, 1: every head reads its row
    if bdim is not None:
        shape = list(t.shape)
        b = bdim + 1 if heads else bdim
        rest = math.prod(shape[:-1]) // shape[b]
        shape[b] = m // max(rest, 1)
        t = t.expand(shape)
    return t.reshape(m, t.shape[-1])


def result(tr: "Translator", node: fx.Node, tv: TV, v: torch.Tensor) -> TV | None:
    """The TV of an op's result `tv` (classes from its operands) over segments, from its torch
    shape: a tile or stat; None where neither the shape nor tv is over segments (the caller's
    classes apply); else Unsupported."""
    cls = seg_class(tr, v.shape, tv.perm)
    if cls is not None:
        return TV(tv.id, cls, tr.segment, tv.per_seg, tv.perm)
    if tv.seg or tv.cls in ("stat", "vec"):
        swap = f" with dims {tv.perm} swapped" if tv.perm else ""
        raise Unsupported(node, f"result shape {tuple(v.shape)} of a value over runs of {tr.segment} columns is "
                                f"neither [..., H, D] nor [..., H, 1]{swap}")
    return None


def check_operands(tr: "Translator", node: fx.Node, xs, tvs: list[TV]) -> None:
    """Unsupported where an elementwise op's operands would broadcast otherwise in the graph than
    in torch: operands of one perm, and against a result over segments ([..., H, D] or
    [..., H, 1]) each tensor operand aligned with it as a tile, a stat, a column [..., 1, 1], a
    vec or a ptile (torch broadcasts by position, the graph by class)."""
    d = tr.segment
    perms = {t.perm for t in tvs if t.cls not in ("scalar", "vec", "row")}  # a row: checked against the perm below
    if len(perms) > 1:
        raise Unsupported(node, "its operands over runs of columns are transposed differently")
    perm = perms.pop() if perms else None
    v = val(node)
    if any(t.cls == "ptile" for t in tvs) and (v is None or seg_class(tr, v.shape, perm) != "tile"):
        raise Unsupported(node, f"an operand of one row of {d} per GEMM row against a result that is no tile split "
                                f"into runs of {d} columns")
    if v is None or seg_class(tr, v.shape, perm) is None:
        return
    r = swapped(v.shape, perm)
    for x, t in zip(xs, tvs):
        xv = val(x)
        if t.cls == "scalar" or xv is None:
            continue
        s = swapped([1] * (len(r) - xv.dim()) + list(xv.shape), perm)
        if t.cls == "ptile":  # the layout its run-time rows were made for (operand_class)
            k = next(i for i, n in enumerate(tr.inputs) if n is x and tr.input_roles[i] == "ptile")
            ok = ptile_layout(tr, node, xv, perm) == tr.input_rows[k]
        elif t.cls == "vec":
            ok = all(_known_equal(a, 1) for a in s[:-1])
        elif t.cls == "row":  # [H, D] (heads_row): the row [N] of its elements, in order
            ok = (len(s) == len(r) and all(_known_equal(a, 1) for a in s[:-2])
                  and _known_equal(s[-2], r[-2]) and _known_equal(s[-1], d))
        else:
            want = {"tile": (r[-2], d), "stat": (r[-2], 1), "col": (1, 1)}.get(t.cls)
            ok = (want is not None and (t.seg or t.cls == "col") and len(s) == len(r)
                  and all(_known_equal(a, b) for a, b in zip(s[:-2], r[:-2]))
                  and all(_known_equal(a, b) for a, b in zip(s[-2:], want)))
        if not ok:
            raise Unsupported(node, f"operand '{x.name}' of shape {tuple(xv.shape)} broadcasts against {tuple(r)} "
                                    f"as no tile, value per run of {d} columns, column, vector of {d} or row of {d} "
                                    "per GEMM row")


def binary_segment(tr: "Translator", node: fx.Node, tvs: list[TV]) -> int:
    """The segment a binary of these operands names (Graph.binary(segment=)): D where one is a
    ptile, or a vec against values computed from no per-segment op (RoPE's cos at one token,
    [1, 1, 1, D]: the graph reads it periodically against the tile only where the binary says
    so); 0 otherwise (a vec against a per-segment value is periodic already)."""
    classes = {t.cls for t in tvs}
    if "ptile" in classes or "vec" in classes and not any(t.per_seg for t in tvs):
        per_segment(tr, node, tr.segment, "reads a row of")
        return tr.segment
    return 0


def per_segment(tr: "Translator", node: fx.Node, seg: int, what: str) -> None:
    """Records an op over runs of `seg` columns other than a reduction (rotate_half, a binary that
    reads an operand periodically): Unsupported in a region that reduces whole rows (OLMo 2 norms
    q over the whole projection, then RoPE rotates each head), as a reduction of each run is
    (reduces()): a kernel works over whole rows or over runs of one length."""
    if 0 in tr.reductions:
        raise Unsupported(node, f"{what} each run of {seg} columns in a region that reduces whole rows: a "
                                "kernel's reductions and per-head ops (rotate_half, RoPE's cos and sin) share one "
                                "segment length")
    if tr.segment and seg != tr.segment:
        raise Unsupported(node, f"{what} runs of {seg} columns in a region over runs of {tr.segment}: a kernel's "
                                "segments share one length")
    tr.per_segment_ops = True


def reduces(tr: "Translator", node: fx.Node, seg: int) -> None:
    """Records a reduction over runs of `seg` columns (0: whole rows): a region's reductions share
    one length (Φ fuses no mix), so the region ends before one of another."""
    other = next((s for s in tr.reductions if s != seg), None)
    if seg == 0 and other is None and tr.per_segment_ops:
        raise Unsupported(node, f"reduces whole rows in a region that works on runs of {tr.segment or tr.gemm.n} "
                                "columns (rotate_half, RoPE's cos and sin): a kernel's reductions and per-head ops "
                                "share one segment length")
    if other is not None:
        def what(s):
            return f"each run of {s} columns" if s else "whole rows"
        raise Unsupported(node, f"reduces {what(seg)} in a region that reduces {what(other)}: a kernel's "
                                "reductions share one segment length")
    tr.reductions.add(seg)


def stat(tr: "Translator", node: fx.Node, x: TV, id: int) -> TV:
    """The TV of `id`, a reduction of x over its last dim: a per-row column, or over runs of x.seg
    columns a stat, whose torch value must then be [..., H, 1] (keepdim: the graph keeps the
    tile's shape, where torch without keepdim drops the dim the heads broadcast over)."""
    if not x.seg:
        return TV(id, "col")
    vals = node.meta.get("val")
    for v in vals if isinstance(vals, (tuple, list)) else [vals]:
        if isinstance(v, torch.Tensor) and seg_class(tr, v.shape, x.perm) != "stat":
            raise Unsupported(node, f"reduces each run of {x.seg} columns to shape {tuple(v.shape)}, not "
                                    "[..., H, 1] (keepdim=True)")
    return TV(id, "stat", x.seg, True, x.perm)


def softmax(tr: "Translator", x: TV, log: bool) -> TV:
    """(log_)softmax over each run of x's columns: the graph's composites (graph.cpp Graph::softmax,
    log_softmax) over segments."""
    y = tr.g.log_softmax(x.id, x.seg) if log else tr.g.softmax(x.id, x.seg)
    return TV(y, "tile", x.seg, True, x.perm)


def transpose(tr: "Translator", node: fx.Node, x: TV) -> TV:
    """transpose(x, i, j) of a tile or stat over segments, of two dims before the last: the same
    graph value, its TV's perm (Gemma 3: q_proj(h).view(B, S, H, D).transpose(1, 2), then the
    norm). Any other transpose reorders the GEMM output's rows or a run's columns: Unsupported."""
    xv = val(node.args[0])
    if x.cls == "tile" and not x.seg and x.perm is None and xv is not None and _swaps_a_one(node, xv):
        return x  # one of the two dims is 1: the same rows (a k_proj of one key head: [B, S, 1, D] -> [B, 1, S, D])
    if x.cls not in ("tile", "stat") or not x.seg or xv is None:
        raise Unsupported(node, "transpose changes the row layout of the GEMM output (a region transposes only a "
                                "tile split into runs of columns, [..., H, D], at two dims before the last)")
    rank = xv.dim()
    i, j = sorted(int(d) % rank - rank for d in node.args[1:3])
    if i == j:
        return x
    if j == -1:
        raise Unsupported(node, f"transposes the last dim (the runs of {x.seg} columns the kernel reduces over)")
    if x.perm is None:
        perm = (i, j)
    elif x.perm == (i, j):
        perm = None  # transposed back
    else:
        raise Unsupported(node, f"a second transpose ({i}, {j}) of a value transposed at {x.perm}")
    v = val(node)
    if v is not None and seg_class(tr, v.shape, perm) != x.cls:
        raise Unsupported(node, f"transpose to {tuple(v.shape)} of a value over runs of {x.seg} columns")
    return TV(x.id, x.cls, x.seg, x.per_seg, perm)


def _swaps_a_one(node: fx.Node, xv: torch.Tensor) -> bool:
    """Whether transpose `node` of xv swaps two dims before the last of which one is 1: the
    elements keep their order, so a tile stays the same rows."""
    rank = xv.dim()
    i, j = sorted(int(d) % rank for d in node.args[1:3])
    return j < rank - 1 and (_known_equal(xv.shape[i], 1) or _known_equal(xv.shape[j], 1))


def view(tr: "Translator", node: fx.Node, x: TV, v: torch.Tensor) -> TV | None:
    """A view of a tile or stat (x) over segments: the TV of its result, where it splits the tile
    into runs of D columns, keeps the runs, or joins them back into [..., N]; None where x and
    the view know no segments (the caller's rules apply); else Unsupported."""
    t = node.target
    cls = seg_class(tr, v.shape, x.perm)
    if not x.seg:  # a split: the region's first, or into its runs again
        if x.cls == "tile" and t in _ROW_VIEWS and (cls == "tile" or cls is None and split(tr, node, v.shape)):
            return TV(x.id, "tile", tr.segment, x.per_seg)
        return None
    if cls == x.cls and (x.perm is None or list(v.shape) == list(val(node.args[0]).shape)):
        return x  # a transposed value's views keep its shape: a reshape would reorder it
    if (x.cls, cls, t) == ("stat", "tile", aten.expand.default):
        # Each run's statistic over its run: the graph's value already (its stat is tile-shaped);
        # as an output, no stored tile (an expanded view).
        tr.broadcasts.add(node)
        return TV(x.id, "tile", x.seg, True, x.perm)
    if x.cls == "tile" and x.perm is None and t in _ROW_VIEWS and tr.classify(v) == "tile":
        return TV(x.id, "tile", 0, x.per_seg)  # [..., H, D] back to [..., N]
    raise Unsupported(node, f"{getattr(t, '__name__', t)} to {tuple(v.shape)} of a value over runs of {x.seg} "
                            "columns changes its layout")


def check_output(tr: "Translator", node: fx.Node, tv: TV, v: torch.Tensor) -> None:
    """Unsupported where a value over segments cannot be a region output: a stat (stored it would
    be [M, N]), or a transposed tile whose strides are not a transpose of packed rows."""
    if tv.cls == "stat":
        raise Unsupported(node, f"'{node.name}' (a value per row and run of {tv.seg} columns, {tuple(v.shape)}) is "
                                "used outside the region: the kernel would store it as [M, N]")
    if tv.perm is not None and not _transposed_rows(v, tv.perm):
        raise Unsupported(node, f"'{node.name}' (transposed at {tv.perm}) is used outside the region with strides "
                                f"{tuple(v.stride())}, not those of a transposed [M, N] tile the kernel stores")


def _transposed_rows(v: torch.Tensor, perm: tuple[int, int]) -> bool:
    """Whether v's strides are those of packed rows (a contiguous tensor) transposed at perm: what
    the custom op's output, transposed again after it, has (and what eager's elementwise ops give
    a transposed operand)."""
    shape = swapped(v.shape, perm)
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc = acc * d
    want = swapped(strides[::-1], perm)
    return all(_known_equal(a, b) or _known_equal(n, 1) for a, b, n in zip(v.stride(), want, v.shape))
