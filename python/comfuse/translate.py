"""aten-level FX -> ComFuse graph, for one candidate region (a GEMM and the nodes after it).

A region's FX values are classified against the GEMM's output [M, N], where M is the product
of all leading dims (3-D activations [B, S, H] are rows B*S of a 2-D GEMM):

    tile    [..., N] with prod(leading) == M      (the accumulator and what follows from it)
    col     [..., 1] or [...] with prod == M      (per-row statistics: mean, max, rstd ...)
    row     [N] or [1, ..., 1, N]                 (bias, gamma, beta)
    scalar  a Python number                       (a literal in the kernel)

Views that keep that row layout (view/reshape/_unsafe_view/clone/alias/unsqueeze of a col)
translate to nothing. Operands from outside the region become ComFuse graph inputs named after
their FX node: [N] -> a row vector, [M, 1] -> a column, [M, N] -> a tile input (a residual;
Φ decides whether it fuses, and says why not). Every FX op the translator does not know, or a
shape it cannot classify, raises Unsupported with the reason; the region then ends before it.

A tile viewed as [..., H, D] (heads: Qwen 3's and Gemma 3's per-head q/k norms, rotary position
embeddings) stays the tile, over segments of D columns (its last dim's runs; not a B2B pair's two
segments below): segments.py says how reductions, operands, transposes, outputs and RoPE's
rotate_half (slices, neg and cat) or interleaved pairs (slices, neg, stack and its flattening
view) and cos/sin over it translate.
"""
from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass

import torch
import torch.fx as fx

from . import _core

aten = torch.ops.aten
prims = torch.ops.prims


class Unsupported(Exception):
    """A node the translator cannot put into the region, with the reason."""

    def __init__(self, node: fx.Node | None, reason: str):
        super().__init__(reason)
        self.node = node
        self.reason = reason


_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}
GEMM_DTYPES = (torch.bfloat16, torch.float16)


def cf_dtype(dt: torch.dtype, node: fx.Node | None = None) -> str:
    if dt not in _DTYPES:
        raise Unsupported(node, f"dtype {dt} is outside the fusion domain (bf16, f16, f32)")
    return _DTYPES[dt]


def val(node) -> torch.Tensor | None:
    v = node.meta.get("val") if isinstance(node, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _known_equal(a, b) -> bool:
    """a == b without adding a shape guard (symbolic sizes under dynamic shapes)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    try:
        from torch.fx.experimental.symbolic_shapes import statically_known_true

        return bool(statically_known_true(a == b))
    except Exception:  # pragma: no cover - very old torch
        return False


def static_int(x) -> int | None:
    if isinstance(x, int):
        return x
    try:
        from torch.fx.experimental.symbolic_shapes import is_concrete_int

        return int(x) if is_concrete_int(x) else None
    except Exception:  # pragma: no cover
        return None


# ---- ops -------------------------------------------------------------------------------
UNARY = {
    aten.silu.default: "silu",
    aten.relu.default: "relu",
    aten.sigmoid.default: "sigmoid",
    aten.tanh.default: "tanh",
    aten.exp.default: "exp",
    aten.log.default: "log",
    aten.rsqrt.default: "rsqrt",
    aten.sqrt.default: "sqrt",
    aten.neg.default: "neg",
    aten.reciprocal.default: "reciprocal",
    aten.abs.default: "abs",
    aten.square.default: "square",
    aten.erf.default: "erf",
    aten.log1p.default: "log1p",
    aten.expm1.default: "expm1",
}
BINARY = {
    aten.add.Tensor: "add", aten.add.Scalar: "add",
    aten.sub.Tensor: "sub", aten.sub.Scalar: "sub",
    aten.mul.Tensor: "mul", aten.mul.Scalar: "mul",
    aten.div.Tensor: "div", aten.div.Scalar: "div",
    aten.maximum.default: "max", aten.minimum.default: "min",
}
REDUCE = {
    aten.mean.dim: "mean",
    aten.sum.dim_IntList: "sum",
    aten.amax.default: "max",
    aten.amin.default: "min",
}
# Views and copies that do not change values; they keep a region value's row layout or the
# translation refuses them (a split of the tile leaves the region, but for a split of its last dim
# into heads, and a transpose of those heads: segments.py).
VIEWS = {
    aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.clone.default,
    aten.alias.default, aten.detach.default, aten.contiguous.default, aten.unsqueeze.default,
    aten.squeeze.dim, aten.squeeze.dims, aten.expand.default,
    aten.transpose.int,  # of two dims before the last of a tile split into runs of columns only
}
CASTS = {aten._to_copy.default, prims.convert_element_type.default}
GEMMS = {aten.mm.default, aten.addmm.default, aten.bmm.default}
OTHER = {
    aten.gelu.default, aten.pow.Tensor_Scalar, aten.rsub.Scalar, aten.rsub.Tensor,
    aten.native_layer_norm.default, aten._softmax.default, aten._log_softmax.default,
    aten.clamp_min.default, aten.clamp_max.default, operator.getitem,
    # Only as RoPE's rotation of each head: transformers' rotate_half (rotary.rotation), or the
    # interleaved pairs' stack (rotary.pairs); any other refused with the reason.
    aten.slice.Tensor, aten.cat.default, aten.stack.default,
}


def cast_change(node: fx.Node) -> str | None:
    """What an aten._to_copy changes besides the dtype ("device=cuda:1", "layout=..."), or None: a
    dtype conversion only. A device it names that its value already lives on (type_as and
    F.rms_norm name it) is no change."""
    src = val(node.args[0]) if node.args else None
    for k in ("device", "layout", "pin_memory"):
        v = node.kwargs.get(k)
        if v in (None, torch.strided, False):
            continue
        if k == "device" and src is not None and torch.device(v) == src.device:
            continue
        return f"{k}={v}"
    return None


def is_translatable(node: fx.Node) -> bool:
    t = node.target
    return node.op == "call_function" and (
        t in UNARY or t in BINARY or t in REDUCE or t in VIEWS or t in CASTS or t in OTHER or t in _composites.COMPOSITES)


def is_gemm(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target in GEMMS


# ---- values ----------------------------------------------------------------------------
@dataclass
class TV:
    """A translated value: a ComFuse node id and its shape class."""
    id: int
    cls: str  # tile | col | row | scalar, and over segments of the last dim stat | vec | ptile (segments.py)
    # D where the torch value splits N into runs of D: [..., H, D] (tile), [..., H, 1] (stat), [D] (vec),
    # [..., 1, D] (ptile: one row of D per GEMM row, RoPE's cos and sin)
    seg: int = 0
    # Computed from a per-segment op (a segmented reduction, rotate_half, a binary that names the
    # segment): the graph's node carries its segment (graph.h Node::segment), so a vec broadcasts
    # against it.
    per_seg: bool = False
    # A tile or stat over segments that a transpose of two dims before the last left permuted:
    # those dims (negative), swapped against the [..., H, D] layout the graph's value has.
    perm: tuple[int, int] | None = None

    def to(self, id: int) -> "TV":
        """A value of this one's class and layout: what an elementwise op of it computes."""
        return TV(id, self.cls, self.seg, self.per_seg, self.perm)


@dataclass
class Gemm:
    """What the region's root computes: acc[M, N] = A[M, K] x B."""
    a: fx.Node
    b: fx.Node            # the FX value fed to the GEMM as [K, N] (a t() of a weight, or a weight)
    layout: str           # "nk": B given as N x K (Linear); "kn": K x N (Conv1D, plain matmul)
    m: object             # int or SymInt: rows (product of A's leading dims)
    n: int
    k: int
    dtype: torch.dtype
    bias: object = None   # addmm's bias (an FX node), or None
    alpha: float = 1.0
    beta: float = 1.0


@dataclass
class Halves:
    """A GEMM whose value is used only as two equal column halves: Phi-3's gate_up_proj (one
    Linear over the stacked [W_gate; W_up], then chunk(2, -1) and silu(gate) * up). It runs as the
    gated GEMM of N/2 columns that Llama's separate gate_proj and up_proj become (pair.py): W1 is
    B's first block of columns, W3 its second, both read in place (the operands' `cols`)."""
    nodes: list[fx.Node]                 # the row-keeping views from the root to the split, the split
    parts: tuple[fx.Node, ...]           # getitem 0 and getitem 1 of the split (none for glu)
    n: int                               # columns of one half
    glu: fx.Node | None = None           # F.glu over the last dim in place of a split: a * sigmoid(b)

    @property
    def members(self) -> list[fx.Node]:
        """Every node the region takes with the root."""
        return [*self.nodes, *self.parts] + ([self.glu] if self.glu is not None else [])


def column_block(t: torch.Tensor, cols: tuple[int, int] | None) -> torch.Tensor:
    """The block of t's last dim a kernel input reads (Translator.input_cols), a view in place."""
    return t if cols is None else t.narrow(-1, cols[0], cols[1] - cols[0])


_ROW_VIEWS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)


def column_halves(root: fx.Node) -> Halves | None:
    """The root's Halves where its value (through views that keep its rows) feeds nothing but one
    split of the last dim into two equal blocks, both used (or aten.glu over the last dim); None
    otherwise. Only mm and addmm with no bias or a bias vector over the GEMM's whole width (a bias
    of another shape would need its own split)."""
    if root.op != "call_function" or root.target not in (aten.mm.default, aten.addmm.default):
        return None
    try:
        g = gemm_of(root)
    except Unsupported:
        return None
    if g.n % 2 or (g.n // 2 * val(g.a).element_size()) % 16:
        return None  # odd, or halves whose rows (and second block's start) are not 16-byte aligned
    if g.bias is not None:
        bv = val(g.bias)
        if bv is None or bv.dim() != 1 or not _known_equal(bv.shape[0], g.n):
            return None
    chain: list[fx.Node] = []
    x = root
    while True:
        users = list(x.users)
        if len(users) != 1 or users[0].op != "call_function":
            return None
        u = users[0]
        if u.target not in _ROW_VIEWS:
            break
        uv = val(u)
        if uv is None or uv.dim() < 1 or not _known_equal(uv.shape[-1], g.n):
            return None
        chain.append(u)
        x = u
    xv = val(x)
    half = g.n // 2
    if u.target == aten.glu.default:
        dim = u.args[1] if len(u.args) > 1 else u.kwargs.get("dim", -1)
        if xv is None or not isinstance(dim, int) or dim % xv.dim() != xv.dim() - 1:
            return None
        return Halves(chain, (), half, glu=u)
    if u.target == aten.split.Tensor:
        sizes = [u.args[1], u.args[1]] if isinstance(u.args[1], int) else None
    elif u.target == aten.split_with_sizes.default:
        sizes = list(u.args[1])
    else:
        return None
    dim = u.args[2] if len(u.args) > 2 else u.kwargs.get("dim", 0)
    if xv is None or sizes != [half, half] or not isinstance(dim, int) or dim % xv.dim() != xv.dim() - 1:
        return None
    parts: dict[int, fx.Node] = {}
    for gi in u.users:
        if gi.target is not operator.getitem or gi.args[1] not in (0, 1) or gi.args[1] in parts:
            return None
        parts[gi.args[1]] = gi
    if len(parts) != 2:
        return None
    return Halves(chain + [u], (parts[0], parts[1]), half)


def gemm_of(node: fx.Node) -> Gemm:
    """The GEMM a root node computes, or Unsupported with the reason."""
    t = node.target
    if t == aten.mm.default:
        a, b = node.args[:2]
        g = Gemm(a=a, b=b, layout="", m=None, n=0, k=0, dtype=torch.float32)
    elif t == aten.addmm.default:
        bias, a, b = node.args[:3]
        g = Gemm(a=a, b=b, layout="", m=None, n=0, k=0, dtype=torch.float32, bias=bias,
                 beta=float(node.kwargs.get("beta", 1)), alpha=float(node.kwargs.get("alpha", 1)))
    elif t == aten.bmm.default:
        a, b = node.args[:2]
        # A batched GEMM whose B is one matrix broadcast to every batch is a 2-D GEMM over the
        # flattened rows of A.
        if not (isinstance(b, fx.Node) and b.op == "call_function" and b.target == aten.expand.default):
            raise Unsupported(node, "bmm with a different B per batch is a batched GEMM (the kernel runs one 2-D GEMM)")
        src = b.args[0]
        sv = val(src)
        if sv is None or not (sv.dim() == 2 or (sv.dim() == 3 and static_int(sv.shape[0]) == 1)):
            raise Unsupported(node, "bmm whose B is not one matrix broadcast over the batch")
        g = Gemm(a=a, b=src, layout="", m=None, n=0, k=0, dtype=torch.float32)
    else:
        raise Unsupported(node, f"{t} is not a GEMM")
    av, bv = val(g.a), val(g.b)
    if av is None or bv is None:
        raise Unsupported(node, "GEMM operands without shape metadata")
    if av.dtype not in GEMM_DTYPES or bv.dtype != av.dtype:
        raise Unsupported(node, f"GEMM operands are {av.dtype} x {bv.dtype}: the kernel takes bf16 or f16 operands of one dtype")
    k = static_int(av.shape[-1])
    n = static_int(bv.shape[-1])
    if k is None or n is None:
        raise Unsupported(node, "K or N is dynamic (the weights' dims must be static)")
    g.k, g.n, g.dtype = k, n, av.dtype
    g.m = math.prod(av.shape[:-1])
    # Layout from B's strides ([K, N] as the GEMM sees it): a t() of an N x K weight has
    # stride (1, K'); a K x N weight (GPT-2's Conv1D) has stride (N', 1).
    bs = bv.stride()[-2:]
    if static_int(bs[0]) == 1 and bv.shape[-1] != 1:
        g.layout = "nk"
    else:
        g.layout = "kn"
    esize = av.element_size()
    for what, d in (("K", k), ("N", n)):
        if (d * esize) % 16:
            raise Unsupported(node, f"{what} = {d}: a row of {d * esize} bytes is not a multiple of 16 (TMA needs 16-byte rows)")
    return g


# The canonical names of GEMM operand inputs (roles): A, B; a B2B pair's W2 and a gated pair's W3.
OPERAND_ROLES = ("a", "b", "b2", "b3")


class Translator:
    """Builds the ComFuse graph of one candidate region (root first, FX graph order).

    A B2B pair (pair.py) translates as two segments into one graph: the first (GEMM1 [and the
    gated pair's second GEMM on the same A], F) as for a region, the second (GEMM2 and its
    epilogue) sharing the first's graph, inputs and outputs (`parent`), with its own dim names
    (N2, contracting over N1) and its A operand the first segment's value S (`a_value`)."""

    def __init__(self, root: fx.Node, nodes: list[fx.Node], descendants: set[fx.Node], *,
                 dims: tuple[str, str, str] = ("M", "N", "K"), parent: "Translator | None" = None,
                 in_region: set[fx.Node] | None = None, b_role: str = "b"):
        self.root = root
        self.nodes = nodes
        self.in_region = in_region if in_region is not None else set(nodes)
        self.descendants = descendants  # of the root: such a node can never be an operand
        self.dim_m, self.dim_n, self.dim_k = dims
        self.b_role = b_role
        self.gates: list[fx.Node] = []  # GEMM roots on the same A whose values F reads (pair.py)
        self.a_from: fx.Node | None = None  # GEMM2 of a pair: its A is this region value (S), cast
        self.leaf_ids: dict[fx.Node, TV] = {}  # per segment: a leaf's class depends on the GEMM's N
        self.gemm = gemm_of(root)
        # A projection used as two column halves (Halves): the region's GEMM has N/2 columns and
        # two accumulators; only where its views, split and getitems are all in the region.
        halves = column_halves(root) if b_role == "b" else None
        if halves is not None and all(n in self.in_region for n in halves.members):
            self.halves: Halves | None = halves
            self.gemm.n = halves.n
        else:
            self.halves = None
        self.segment = 0  # D where a view split the tile into runs of D columns (segments.py)
        self.reductions: set[int] = set()  # the segment lengths this region reduces over (0: whole rows)
        # rotate_half/rotate_pairs, or a binary reading an operand periodically (segments.per_segment)
        self.per_segment_ops = False
        if parent is None:
            self.g = _core.Graph()
            self.env: dict[fx.Node, object] = {}
            self.cf_of: dict[fx.Node, list[int]] = {}
            self.inputs: list[fx.Node] = []        # tensor inputs, in custom-op order
            self.input_names: list[str] = []
            self.input_roles: list[str] = []       # a, b, (b2, b3), row, col, tile, scalar
            self.input_shapes: list[list] = []     # their ComFuse shapes (dim names or ints)
            self.input_transposed: list[bool] = []  # a B given as N x K: the FX value is its t()
            # The block of the FX value's last dim an input reads ((start, stop)), or None: the
            # whole value. A Halves projection's W1 and W3 (and bias halves) share one FX value.
            self.input_cols: list[tuple[int, int] | None] = []
            # How an input's tensor is viewed or expanded as the kernel's rows (segments.rows_of:
            # RoPE's cos/sin, a ptile [M, D], or a tile [M, N] against one head), or None.
            self.input_rows: list[tuple | None] = []
            self.outputs: list[fx.Node] = []
            self.output_names: list[str] = []
            self.fx_name: dict[str, str] = {}
            self.output_classes: list[str] = []  # tile or col, per output
            # Per output, the dims a transpose swapped (TV.perm) or None: the kernel stores the tile
            # in the layout before it, and the transpose is replayed on the custom op's output
            # (partition.region_module, backend._replace).
            self.output_perms: list[tuple[int, int] | None] = []
            # Region nodes used outside that are views of an output's value (`origin`): not
            # stored again; the views (chain: origin's user first, the node last) are replayed on
            # the kernel's output (backend._replace).
            self.aliases: list[tuple[fx.Node, fx.Node, list[fx.Node]]] = []  # (node, origin, chain)
            self.broadcasts: set[fx.Node] = set()  # expands of a per-row value to the tile (a column here)
        else:  # a pair's second segment: one graph, one list of inputs and outputs
            for k in ("g", "env", "cf_of", "inputs", "input_names", "input_roles", "input_shapes",
                      "input_transposed", "input_cols", "input_rows", "outputs", "output_names", "fx_name",
                      "output_classes", "aliases", "broadcasts", "output_perms"):
                setattr(self, k, getattr(parent, k))

    # -- classification --------------------------------------------------------------
    def classify(self, v: torch.Tensor) -> str | None:
        shape = list(v.shape)
        n, m = self.gemm.n, self.gemm.m
        if not shape:
            return "scalar"
        last = shape[-1]
        lead = math.prod(shape[:-1])
        if _known_equal(last, n) and _known_equal(lead, m) and not (isinstance(m, int) and m == 1 and n == 1):
            return "tile"
        if _known_equal(last, n) and all(_known_equal(d, 1) for d in shape[:-1]):
            return "row"
        if _known_equal(last, 1) and _known_equal(lead, m):
            return "col"
        if _known_equal(math.prod(shape), m) and not _known_equal(last, n):
            return "col"  # a keepdim=False statistic
        if all(_known_equal(d, 1) for d in shape):
            return "scalar"
        return None

    # -- operands ----------------------------------------------------------------------
    def _add_input(self, node: fx.Node, role: str, dtype: str, shape: list, transposed: bool = False,
                   cols: tuple[int, int] | None = None) -> int:
        # Canonical names (a, b, in2, ...; outputs out0, ...) make the graph text, and so the
        # kernel cache key, the same for every layer of a model; fx_name maps them back.
        name = role if role in OPERAND_ROLES else f"in{len(self.inputs)}"
        self.fx_name[name] = node.name
        vid = self.g.input(name, dtype, shape)
        self.inputs.append(node)
        self.input_names.append(name)
        self.input_roles.append(role)
        self.input_shapes.append(list(shape))
        self.input_transposed.append(transposed)
        self.input_cols.append(cols)
        self.input_rows.append(None)
        return vid

    def operand(self, x, user: fx.Node) -> TV:
        if isinstance(x, bool) or x is None:
            raise Unsupported(user, f"operand {x!r} is not a number or a tensor")
        if isinstance(x, (int, float)):
            return TV(self.g.constant(float(x)), "scalar")
        if not isinstance(x, fx.Node):
            raise Unsupported(user, f"operand {x!r} ({type(x).__name__}) is not a number or a tensor")
        if x in self.in_region:
            tv = self.env.get(x)
            if not isinstance(tv, TV):
                raise Unsupported(user, f"operand '{x.name}' is not a tensor value of the region")
            return tv
        if x in self.leaf_ids:
            return self.leaf_ids[x]
        v = val(x)
        if v is None:
            raise Unsupported(user, f"operand '{x.name}' is a symbolic scalar (only Python numbers become kernel literals)")
        if x in self.descendants:
            raise Unsupported(user, f"operand '{x.name}' is computed from this GEMM's output outside the region")
        seg = _segments.operand_class(self, x, user, v)  # a vec, a ptile [..., 1, D], a tile [..., H, D], or None
        if seg in ("vec", "ptile"):
            return self.leaf_ids[x]
        # A 1-D operand broadcasts along the last dim: a row even where M is 1 (the graph Dynamo
        # specializes to M = 1 must build the same kernel as the dynamic graph, not a tile input).
        cls = "row" if v.dim() == 1 and _known_equal(v.shape[0], self.gemm.n) else seg or self.classify(v)
        if cls == "scalar" or cls is None and v.numel() == 1:
            # A one-element tensor (e.g. a float Dynamo keeps symbolic under dynamic=True): a
            # runtime scalar of the kernel, read on the host at each call.
            if not v.is_floating_point():
                raise Unsupported(user, f"operand '{x.name}' is a {v.dtype} scalar tensor")
            tv = TV(self._add_input(x, "scalar", "f32", []), "scalar")
            self.leaf_ids[x] = tv
            return tv
        dt = cf_dtype(v.dtype, user)
        layout = _segments.tile_layout(self, user, v) if cls is None and not self.segment else None
        if layout is not None:  # [..., N] broadcast over one row dim (RoPE's cos against one head): expanded
            tv = TV(self._add_input(x, "tile", dt, [self.dim_m, self.dim_n]), "tile")
            self.input_rows[-1] = layout
        elif cls == "row":
            tv = TV(self._add_input(x, "row", dt, [self.dim_n]), "row")
        elif cls == "col":
            tv = TV(self._add_input(x, "col", dt, [self.dim_m, 1]), "col")
        elif cls == "tile":
            tv = TV(self._add_input(x, "tile", dt, [self.dim_m, self.dim_n]), "tile", self.segment if seg else 0)
        else:
            raise Unsupported(user, f"operand '{x.name}' of shape {tuple(v.shape)} broadcasts as neither a row [N], "
                                    f"a column [M, 1] nor the tile [M, N] of this GEMM (M = {self.gemm.m}, N = {self.gemm.n})")
        self.leaf_ids[x] = tv
        return tv

    # -- the region --------------------------------------------------------------------
    def translate(self, declare_outputs: bool = True) -> None:
        gm = self.gemm
        dt = cf_dtype(gm.dtype)
        ids: list[int] = []
        if self.a_from is not None:
            # GEMM2 of a B2B pair reads S, a value of the first segment, in the dtype the model
            # gave it (the kernel's S is one 16-bit type with X and W2: Φ checks).
            s = self.env.get(self.a_from)
            if not isinstance(s, TV) or s.cls != "tile":
                raise Unsupported(self.root, f"A operand '{self.a_from.name}' is not a tile of the first GEMM")
            a = self.g.cast(s.id, cf_dtype(val(self.a_from).dtype, self.root))
            ids.append(a)
        else:
            a = self._add_input(gm.a, "a", dt, [self.dim_m, self.dim_k])
        roots = {self.root, *self.gates}
        if self.halves is not None and self.gates:
            raise Unsupported(self.root, "a projection used as two column halves is already a gated GEMM: it takes no "
                                         "second gate GEMM")
        if self.halves is not None:
            # W1 = B's first N/2 columns, W3 its second: getitem 0 and 1 of the split are the
            # gated GEMM's two accumulators (glu: its value a * sigmoid(b) of the two); the root,
            # its views and the split are no values.
            h = self.halves
            lo, hi = h.parts if h.glu is None else (self.root, h.glu)
            self._gemm(self.root, gm, a, self.b_role, ids, cols=(0, h.n), value_of=lo)
            self._gemm(self.root, gm, a, "b3", [], cols=(h.n, 2 * h.n), value_of=hi)
            if h.glu is not None:
                gate = self.g.unary("sigmoid", self.env[hi].id)
                y = self.g.binary("mul", self.env[lo].id, gate)
                self.env[hi] = TV(y, "tile")
                self.cf_of[hi] += [gate, y]
            else:
                self.cf_of[self.root], self.cf_of[lo] = self.cf_of[lo], []
            for n in h.nodes:
                self.env[n], self.cf_of[n] = None, []
            self.env[self.root] = None
            roots |= set(h.members)
        else:
            self._gemm(self.root, gm, a, self.b_role, ids)
        for gate in self.gates:  # a gated pair: X W3^T on the same A (its own B, role b3)
            self._gemm(gate, gemm_of(gate), a, "b3", [])
        for node in self.nodes:
            if node in roots:
                continue
            before = len(self.g)
            self.env[node] = self.node(node)
            self.cf_of[node] = list(range(before, len(self.g)))
        if declare_outputs:
            self._declare_outputs()

    def _gemm(self, root: fx.Node, gm: Gemm, a: int, b_role: str, ids: list[int],
              cols: tuple[int, int] | None = None, value_of: fx.Node | None = None) -> None:
        """acc = alpha * A B (+ beta * bias): the value of `root` (mm / addmm / bmm), or with `cols`
        of B's (and the bias's) columns cols only: the value of `value_of` (a Halves part)."""
        transposed = gm.layout == "nk"
        shape = [self.dim_n, self.dim_k] if transposed else [self.dim_k, self.dim_n]
        b = self._add_input(gm.b, b_role, cf_dtype(gm.dtype), shape, transposed, cols)
        acc = self.g.matmul(a, b, gm.layout)
        ids.append(acc)
        if gm.alpha != 1.0:
            acc = self.g.binary("mul", acc, self.g.constant(gm.alpha))
            ids.append(acc)
        if gm.bias is not None:
            if cols is not None:  # column_halves checked: a vector [2 * N], this half's block
                bias = TV(self._add_input(gm.bias, "row", cf_dtype(val(gm.bias).dtype, root), [self.dim_n], cols=cols),
                          "row")
            else:
                bias = self.operand(gm.bias, root)
            if gm.beta != 1.0:
                bias_id = self.g.binary("mul", bias.id, self.g.constant(gm.beta))
                ids.append(bias_id)
            else:
                bias_id = bias.id
            acc = self.g.binary("add", acc, bias_id)
            ids.append(acc)
        value_of = value_of if value_of is not None else root
        self.env[value_of] = TV(acc, "tile")
        self.cf_of[value_of] = ids

    def _view_chain(self, node: fx.Node, origin: fx.Node) -> list[fx.Node] | None:
        """The views from `origin` to `node` (origin's user first), each a region node of one
        value; None where `node` is no such chain of views of `origin`."""
        chain: list[fx.Node] = []
        n = node
        while n is not origin:
            if n.target not in VIEWS or not n.args or n.args[0] not in self.in_region or len(chain) > 64:
                return None
            chain.append(n)
            n = n.args[0]
        return chain[::-1]

    def _declare_outputs(self, nodes: list[fx.Node] | None = None) -> None:
        nodes = nodes if nodes is not None else self.nodes
        used = [n for n in nodes if any(u not in self.in_region for u in n.users)]
        # One value used outside through several views (Llama's normed h, viewed to 2-D once
        # for each of q/k/v or gate/up): one output, the first node computing it (`origin`).
        by_value: dict[int, list[fx.Node]] = {}
        for n in used:
            tv = self.env.get(n)
            if isinstance(tv, TV):
                by_value.setdefault(tv.id, []).append(n)
        origin_of: dict[fx.Node, fx.Node] = {}
        for vid, group in by_value.items():
            if len(group) < 2:
                continue
            origin = next(n for n in nodes if isinstance(self.env.get(n), TV) and self.env[n].id == vid)
            chains = {n: self._view_chain(n, origin) for n in group}
            if all(c is not None for c in chains.values()):
                for n in group:
                    origin_of[n] = origin
                    if n is not origin:
                        self.aliases.append((n, origin, chains[n]))
        declared: set[fx.Node] = set()
        for node in used:
            node = origin_of.get(node, node)
            if node in declared:
                continue
            declared.add(node)
            tv = self.env[node]
            if not isinstance(tv, TV):
                raise Unsupported(node, f"'{node.name}' (a tuple) is used outside the region")
            v = val(node)
            if node in self.broadcasts:
                raise Unsupported(node, f"'{node.name}' (a per-row value expanded to {tuple(v.shape)}) is used outside "
                                        "the region: the kernel stores per-row values as [M, 1]")
            _segments.check_output(self, node, tv, v)
            if tv.cls not in ("tile", "col"):
                raise Unsupported(node, f"'{node.name}' is a {tv.cls} value used outside the region: the kernel "
                                        "stores [M, N] tiles and per-row [M, 1] values")
            name = f"out{len(self.outputs)}"
            self.output_classes.append(tv.cls)
            self.fx_name[name] = node.name
            self.g.output(tv.id, name, cf_dtype(v.dtype, node))
            self.output_perms.append(tv.perm)
            self.outputs.append(node)
            self.output_names.append(name)

    def _check_class(self, node: fx.Node, tv: TV) -> TV:
        v = val(node)
        if v is None:
            return tv
        seg = _segments.result(self, node, tv, v)  # over segments: a tile or stat
        if seg is not None:
            return seg
        cls = self.classify(v)
        if cls is None:
            raise Unsupported(node, f"result shape {tuple(v.shape)} is neither the tile [M, N] nor a per-row column")
        if tv.cls == "col" and cls == "tile":
            # Computed from a per-row value broadcast to the tile (an expand): still one value a
            # row in the graph, so no tile to store, and no row to reduce.
            self.broadcasts.add(node)
            return tv
        return TV(tv.id, cls if cls != "scalar" else tv.cls, 0, tv.per_seg)

    def _operands(self, node: fx.Node, *xs) -> list[TV]:
        """The TVs of an elementwise op's operands, checked to broadcast as the graph will over
        segments (segments.check_operands)."""
        tvs = [self.operand(x, node) for x in xs]
        _segments.check_operands(self, node, xs, tvs)
        return tvs

    def node(self, node: fx.Node):
        t = node.target
        args, kw = node.args, node.kwargs
        g = self.g
        v = val(node)
        if v is not None and v.dtype not in _DTYPES:
            raise Unsupported(node, f"result dtype {v.dtype} is outside the fusion domain")
        if t == operator.getitem:
            src = self.env.get(args[0])
            if isinstance(src, tuple) and args[1] in range(len(src)) and src[args[1]] is not None:
                return src[args[1]]
            raise Unsupported(node, f"getitem {args[1]} of '{args[0].name}' is no value the kernel computes "
                                    "(native_layer_norm's mean/rstd, log_sigmoid_forward's buffer: what a backward "
                                    "pass reads)")
        if t in (aten.slice.Tensor, aten.cat.default, aten.stack.default) or (
                t == aten.neg.default and _rotary.is_rotation_neg(node)
                or t in _ROW_VIEWS and _rotary.is_pairs_member(node)):
            # RoPE's rotate_half or interleaved pairs (a view flattens their stack), or Unsupported with the reason
            return _rotary.rotary(self, node)
        if t in VIEWS:
            x = self.operand(args[0], node)
            if t == aten.transpose.int:
                return _segments.transpose(self, node, x)
            if x.cls in ("tile", "stat") and v is not None:
                seg = _segments.view(self, node, x, v)  # a split into segments, or a view over them
                if seg is not None:
                    return seg
            if x.cls in ("tile", "col"):
                cls = self.classify(v) if v is not None else None
                if t == aten.expand.default and (x.cls, cls) == ("col", "tile"):
                    # A per-row value broadcast to the tile (F.normalize's norm): the ops that read
                    # it broadcast the column anyway; as an output it would be no column.
                    self.broadcasts.add(node)
                    return x
                if cls != x.cls:
                    raise Unsupported(node, f"{t.__name__ if hasattr(t, '__name__') else t} to {tuple(v.shape)} changes "
                                            "the row layout of the GEMM output")
            return x
        if t in CASTS:
            x = self.operand(args[0], node)
            dtype = kw.get("dtype", args[1] if len(args) > 1 else None)
            if t == aten._to_copy.default:
                change = cast_change(node)  # a device or layout change leaves the region
                if change is not None:
                    raise Unsupported(node, f"_to_copy with {change}")
            if dtype is None:
                return x
            return self._check_class(node, x.to(g.cast(x.id, cf_dtype(dtype, node))))
        if t in UNARY:
            x = self.operand(args[0], node)
            return self._check_class(node, x.to(g.unary(UNARY[t], x.id)))
        if t == aten.gelu.default:
            x = self.operand(args[0], node)
            approx = kw.get("approximate", args[1] if len(args) > 1 else "none")
            return self._check_class(node, x.to(g.unary("gelu_tanh" if approx == "tanh" else "gelu", x.id)))
        if t == aten.pow.Tensor_Scalar:
            x = self.operand(args[0], node)
            e = float(args[1])
            if e == 1.0:
                return x
            if e == 2.0:
                return self._check_class(node, x.to(g.unary("square", x.id)))
            if e == 0.5:
                return self._check_class(node, x.to(g.unary("sqrt", x.id)))
            if e == -0.5:
                return self._check_class(node, x.to(g.unary("rsqrt", x.id)))
            if e == -1.0:
                return self._check_class(node, x.to(g.unary("reciprocal", x.id)))
            return self._check_class(node, x.to(g.binary("pow", x.id, g.constant(e))))
        if t in BINARY:
            a, b = self._operands(node, args[0], args[1])
            alpha = kw.get("alpha", 1)
            if t == aten.div.Tensor and kw.get("rounding_mode") is not None:
                raise Unsupported(node, "div with a rounding mode")
            bid = b.id
            if alpha != 1:
                bid = g.binary("mul", bid, g.constant(float(alpha)))
            return self._check_class(node, self._binary(node, BINARY[t], a, b, a.id, bid))
        if t in (aten.rsub.Scalar, aten.rsub.Tensor):
            a, b = self._operands(node, args[0], args[1])
            alpha = kw.get("alpha", 1)
            aid = a.id if alpha == 1 else g.binary("mul", a.id, g.constant(float(alpha)))
            return self._check_class(node, self._binary(node, "sub", a, b, b.id, aid))
        if t in (aten.clamp_min.default, aten.clamp_max.default):
            a, b = self._operands(node, args[0], args[1])
            return self._check_class(node, self._binary(node, "max" if t == aten.clamp_min.default else "min", a, b,
                                                         a.id, b.id))
        if t in REDUCE:
            x = self.operand(args[0], node)
            seg = self._last_dim(node, x, args[1] if len(args) > 1 else kw.get("dim"))
            if t in (aten.mean.dim, aten.sum.dim_IntList) and kw.get("dtype") not in (None, torch.float32):
                raise Unsupported(node, f"{t} with dtype={kw.get('dtype')}")
            return _segments.stat(self, node, x, g.reduce(REDUCE[t], x.id, -1, seg))
        if t == aten.native_layer_norm.default:
            x = self.operand(args[0], node)
            shape, w, b, eps = args[1], args[2], args[3], args[4]
            over = x.seg or self.gemm.n
            if x.cls != "tile" or len(shape) != 1 or not _known_equal(shape[0], over):
                raise Unsupported(node, f"layer_norm over {list(shape)}, not the last dimension of the GEMM output "
                                        f"({over} columns)")
            _segments.reduces(self, node, x.seg)
            wid = self.operand(w, node).id if w is not None else -1
            bid = self.operand(b, node).id if b is not None else -1
            y = g.layer_norm(x.id, wid, bid, float(eps), x.seg)
            return (TV(y, "tile", x.seg, bool(x.seg), x.perm), None, None)
        if t in (aten._softmax.default, aten._log_softmax.default):
            x = self.operand(args[0], node)
            seg = self._last_dim(node, x, [args[1]])
            if seg:
                return _segments.softmax(self, x, log=t == aten._log_softmax.default)
            y = g.softmax(x.id) if t == aten._softmax.default else g.log_softmax(x.id)
            return TV(y, "tile")
        rule = _composites.COMPOSITES.get(t)
        if rule is not None:
            return rule(self, node)
        raise Unsupported(node, f"op {t} is outside the fusion domain")

    def _binary(self, node: fx.Node, op: str, a: TV, b: TV, x: int, y: int) -> TV:
        """binary(op, x, y) of values computed from operands a and b, over segments where one of them
        is read periodically (segments.binary_segment: RoPE's cos and sin, a vec before any
        per-segment op): the result then carries the segment (TV.per_seg)."""
        seg = _segments.binary_segment(self, node, [a, b])
        if not seg:
            return _joined(self.g.binary(op, x, y), a, b)
        tv = _joined(self.g.binary(op, x, y, segment=seg), a, b)
        tv.per_seg = True
        return tv

    def _last_dim(self, node: fx.Node, x: TV, dims) -> int:
        """The segment length of a reduction of x over `dims` (0: whole rows; D: each run of D
        columns of a tile split as [..., H, D]), or Unsupported: not the last dim of a tile."""
        v = val(node.args[0])
        rank = v.dim() if v is not None else 2
        if x.cls != "tile":
            raise Unsupported(node, "reduces a value that is not a full [M, N] tile")
        if dims is None or len(dims) != 1 or int(dims[0]) % rank != rank - 1:
            raise Unsupported(node, f"reduces dims {dims}, not the last (N) dimension")
        _segments.reduces(self, node, x.seg)
        return x.seg


def _joined(id: int, a: TV, b: TV) -> TV:
    """The TV of a binary op of a and b (its class from theirs; _check_class settles it from the
    result's shape; Translator._operands checked that they share one perm)."""
    return TV(id, _join(a.cls, b.cls), a.seg or b.seg, a.per_seg or b.per_seg, a.perm or b.perm)


def _join(a: str, b: str) -> str:
    if "tile" in (a, b) or "ptile" in (a, b) or {a, b} == {"stat", "vec"}:
        return "tile"
    if "stat" in (a, b):
        return "stat"
    if a == "col" and b == "row" or a == "row" and b == "col":
        return "tile"
    if "col" in (a, b):
        return "col"
    if "row" in (a, b):
        return "row"
    return "scalar"


def descendants_of(node: fx.Node) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        for u in n.users:
            if u not in seen:
                seen.add(u)
                stack.append(u)
    return seen


__all__ = ["Translator", "Unsupported", "Gemm", "Halves", "cast_change", "column_block", "column_halves", "gemm_of", "is_gemm", "is_translatable", "descendants_of",
           "val", "TV", "cf_dtype"]


def rename_reason(reason: str, names: dict[str, str]) -> str:
    """Φ's reason with canonical graph names replaced by the FX names the user can find: quoted
    ('a'), and bare as an operand of the expressions Φ names made-up values by (matmul(a, b))."""
    if not names:
        return reason
    alt = "|".join(sorted(map(re.escape, names), key=len, reverse=True))
    pat = re.compile(rf"'({alt})'|(?:(?<=\()|(?<=, ))({alt})(?=[,)])")
    return pat.sub(lambda m: f"'{names[m.group(1)]}'" if m.group(1) else names[m.group(2)], reason)


# The rules for aten ops without a primitive, and for values over segments, build on TV and
# Unsupported above (imported last, as modules: any of the files may be imported first).
from . import composites as _composites  # noqa: E402
from . import segments as _segments  # noqa: E402
from . import rotary as _rotary  # noqa: E402
