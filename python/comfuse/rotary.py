"""RoPE's rotation of each head (translate.py calls these through rotary()): the ops transformers
traces for it become ONE graph op over the tile's runs of D columns (segments.py: heads, and the
cos and sin operands that read one row of D per GEMM row):

    rotate_half         slice(x, -1, 0, D/2), slice(x, -1, D/2, D), neg of the second and
                        cat((-x2, x1), -1) of a tile over segments (or of a tile whose last dim is
                        all of N: one head, e.g. a k_proj with one key head) are
                        Graph.rotate_half(x, D) (rotation()); the slices and the neg are no values
    rotate_pairs        the interleaved layout (GPT-J's rotate_every_two, Cohere's rotate_half):
                        slice(x, -1, 0, end, 2), slice(x, -1, 1, end, 2), neg of the second,
                        stack((-x2, x1), -1) and the view that flattens it back to [..., D] are
                        Graph.rotate_pairs(x, D) (pairs(): column 2i reads -x[2i + 1], column
                        2i + 1 reads x[2i]), the view its value

Each member is checked against the whole pattern. Anything else raises Unsupported with the
reason: other slice bounds, starts or steps (partial rotary: Phi's, GPT-NeoX's, StableLM's,
GPT-J's rotary_dim, part of each head), another cat or stack (order, sign, dim: x1 = x[..., 1::2]
is no rotation), halves or pairs used otherwise (an unsqueeze and cat in place of the stack too).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch
import torch.fx as fx

from .segments import per_segment
from .translate import _ROW_VIEWS, TV, Unsupported, _known_equal, val

if TYPE_CHECKING:  # pragma: no cover
    from .translate import Translator

aten = torch.ops.aten


# ---- rotate_half (RoPE) ----------------------------------------------------------------------
_SLICE = aten.slice.Tensor
_CAT = aten.cat.default
_NEG = aten.neg.default
_BIG = 2 ** 62  # a slice's end "to the end of the dim" (torch traces x[..., h:] as end = 2**63 - 1)


@dataclass
class Rotation:
    """transformers' rotate_half of x over each head's D columns: cat((-x[..., D/2:], x[..., :D/2]), -1)."""
    x: fx.Node
    lo: fx.Node    # slice(x, -1, 0, D/2): x1
    hi: fx.Node    # slice(x, -1, D/2, D): x2
    neg: fx.Node   # neg(hi)
    cat: fx.Node   # cat([neg, lo], -1)
    d: int


def is_rotation_neg(node: fx.Node) -> bool:
    """Whether `node` is a neg of a slice: the -x2 of a rotate_half (rotation() checks the rest)."""
    return (node.target == _NEG and bool(node.args) and isinstance(node.args[0], fx.Node)
            and node.args[0].op == "call_function" and node.args[0].target == _SLICE)


def _half_of(p, x: fx.Node) -> bool:
    """Whether p is a slice of x or the neg of one."""
    if isinstance(p, fx.Node) and is_rotation_neg(p):
        p = p.args[0]
    return isinstance(p, fx.Node) and p.op == "call_function" and p.target == _SLICE and p.args[0] is x


def _dim(node: fx.Node, pos: int, default: int) -> int:
    d = node.args[pos] if len(node.args) > pos else node.kwargs.get("dim", default)
    v = val(node)
    return int(d) % v.dim() if v is not None and v.dim() else int(d)


def _slice_args(node: fx.Node) -> tuple:
    """(dim, start, end, step) of an aten.slice.Tensor (None where start or end is left out)."""
    names, defaults = ("self", "dim", "start", "end", "step"), (None, 0, None, None, 1)
    a = [node.args[i] if len(node.args) > i else node.kwargs.get(names[i], defaults[i]) for i in range(5)]
    return a[1], a[2], a[3], 1 if a[4] is None else a[4]


def _joined_by(sl: fx.Node, target) -> fx.Node | None:
    """The `target` op (a rotation's cat or stack) that the slice `sl` alone feeds, directly or
    through one neg that only it reads; None where the slice is used otherwise."""
    users = list(sl.users)
    if len(users) != 1:
        return None
    user = users[0]
    if user.target == _NEG and len(user.users) == 1:
        user = next(iter(user.users))
    return user if user.target == target else None


def _parts(node: fx.Node) -> list | None:
    parts = node.args[0] if node.args else node.kwargs.get("tensors")
    return list(parts) if isinstance(parts, (list, tuple)) and all(isinstance(p, fx.Node) for p in parts) else None


def _combined(node: fx.Node, sl: fx.Node, target, why: str, order: str,
              takes: Callable[[fx.Node, fx.Node], bool]) -> tuple[fx.Node, fx.Node, fx.Node, fx.Node]:
    """The cat or stack (`target`) of a rotation that the slice `sl` of x feeds, checked as
    (-second, first) over the last dim with both parts slices of x's last dim read only there:
    (combiner, neg, first, second). Unsupported at `node` with `why` where a part is used or
    computed otherwise, with `order` (its {} the combiner's name) where the parts come in another
    order, sign or dim, or where `takes(first, second)` (the caller's columns of each) is false."""
    x = sl.args[0]
    rank = val(x).dim()
    comb = _joined_by(sl, target)
    if comb is None:
        raise Unsupported(node, why)
    parts = _parts(comb)
    if not parts or not all(_half_of(p, x) for p in parts):
        raise Unsupported(node, why)  # a part computed otherwise: partial rotary's rotated part and the rest
    if len(parts) != 2 or not is_rotation_neg(parts[0]) or parts[1].target != _SLICE:
        raise Unsupported(node, order.format(comb.name))
    neg, first = parts
    second = neg.args[0]
    cv = val(comb)
    if (cv is None or _dim(comb, 1, 0) != cv.dim() - 1 or first.args[0] is not x or second.args[0] is not x
            or int(_slice_args(first)[0]) % rank != rank - 1 or int(_slice_args(second)[0]) % rank != rank - 1
            or not takes(first, second)):
        raise Unsupported(node, order.format(comb.name))
    if list(first.users) != [comb] or list(second.users) != [neg] or list(neg.users) != [comb]:
        raise Unsupported(node, why)
    return comb, neg, first, second


def _rotated(tr: "Translator", sl: fx.Node, node: fx.Node,
             what: str = "the two halves of each head, as transformers' rotate_half does") -> tuple[TV, int, int]:
    """The region value a rotate_half's (or rotate_pairs') slice `sl` reads, the length D of its
    runs and the slice's step: a tile over segments (D = its segment), or a tile whose last dim is
    all of N (one head: D = N); Unsupported where the slice is of another dim."""
    x = sl.args[0]
    xv = val(x)
    dim, _, _, step = _slice_args(sl)
    rank = xv.dim() if xv is not None else 0
    if not rank or int(dim) % rank != rank - 1:
        raise Unsupported(node, f"slice of dim {dim} changes the row layout of the GEMM output (a region slices "
                                f"only the last dim, into {what})")
    tv = tr.env.get(x) if x in tr.in_region else None
    if isinstance(tv, TV) and tv.cls == "tile":
        if tv.seg and _known_equal(xv.shape[-1], tv.seg):
            return tv, tv.seg, step
        if not tv.seg and _known_equal(xv.shape[-1], tr.gemm.n):
            return tv, tr.gemm.n, step
    raise Unsupported(node, "slice of a value that is no tile of the GEMM output split into heads [..., H, D] (a "
                            f"region slices only {what})")


def rotation(tr: "Translator", node: fx.Node) -> Rotation:
    """The rotate_half `node` (a slice, the neg or the cat) is part of, checked whole: Unsupported at
    `node`, with the reason, where it is no transformers' rotate_half of each head's D columns
    (other bounds: partial rotary; a step: interleaved pairs; halves used otherwise; another
    cat) or where part of it stays out of the region."""
    t = node.target
    if t == _CAT:
        parts = node.args[0] if node.args else node.kwargs.get("tensors")
        why = ("cat is outside the fusion domain but as transformers' rotate_half of each head: cat((-x2, x1), -1) "
               "of its two halves x1 = x[..., :D/2], x2 = x[..., D/2:]")
        if not isinstance(parts, (list, tuple)) or len(parts) != 2 or not all(isinstance(p, fx.Node) for p in parts):
            raise Unsupported(node, why)
        first, second = parts
        if not (is_rotation_neg(first) and second.op == "call_function" and second.target == _SLICE):
            raise Unsupported(node, why)
        sl = second
    elif t == _NEG:
        sl = node.args[0]
    else:
        sl = node
    # The slice: its own bounds first (the reasons users meet: partial rotary, interleaved pairs).
    tv, d, step = _rotated(tr, sl, node)
    x = sl.args[0]
    if step != 1:  # a cat of interleaved columns (their slices' own rule, pairs(), says what a region takes)
        raise Unsupported(node, f"cat of slices with step {step} of each head's {d} columns: interleaved pairs "
                                "rotate as stack((-x2, x1), -1).flatten(-2) (GPT-J's rotate_every_two, Cohere's "
                                "rotary), the halves as cat((-x2, x1), -1) (transformers' rotate_half)")
    h = d // 2

    def bounds(s: fx.Node) -> tuple[int, int]:
        _, a, b, _ = _slice_args(s)
        a = 0 if a is None else int(a)
        b = d if b is None or int(b) >= _BIG else int(b)
        a, b = (a + d if a < 0 else a), (b + d if b < 0 else b)
        return max(0, min(a, d)), max(0, min(b, d))

    per_segment(tr, node, d, "rotates")
    lo_hi = bounds(sl)
    if d % 2 or lo_hi not in ((0, h), (h, d)):
        raise Unsupported(node, f"slice [{lo_hi[0]}:{lo_hi[1]}] of each head's {d} columns: a region takes only the "
                                f"halves [0:{h}] and [{h}:{d}] that transformers' rotate_half rotates (partial rotary, "
                                "a rotary_pct or partial_rotary_factor below 1, rotates part of each head)")
    # The whole pattern from the slice: lo -> cat, hi -> neg -> cat.
    why = (f"the halves of each head's {d} columns ('{sl.name}' [{lo_hi[0]}:{lo_hi[1]}]) are used otherwise than as "
           "transformers' rotate_half, cat((-x2, x1), -1) (partial rotary rotates one part of each head and passes "
           "the other)")
    order = ("cat '{}' of each head's halves in another order, sign or dim than transformers' rotate_half, "
             "cat((-x2, x1), -1) with x1 = x[..., :D/2], x2 = x[..., D/2:]")
    cat, neg, lo, hi = _combined(node, sl, _CAT, why, order,
                                 lambda lo, hi: bounds(lo) == (0, h) and bounds(hi) == (h, d)
                                 and _slice_args(lo)[3] == 1 and _slice_args(hi)[3] == 1)
    out = [n.name for n in (lo, hi, neg, cat) if n not in tr.in_region]
    if out:
        raise Unsupported(node, f"part of a rotate_half of each head whose op(s) {out} stay out of the region")
    return Rotation(x, lo, hi, neg, cat, d)


def _rotated_tile(tr: "Translator", node: fx.Node, x: fx.Node, d: int, rotate) -> TV:
    """The graph op `rotate` (Graph.rotate_half or rotate_pairs) of the region's tile x over its
    runs of d columns, as the value of `node`: a tile keeping x's segment and layout."""
    xv = tr.operand(x, node)
    return TV(rotate(xv.id, d), "tile", xv.seg, True, xv.perm)


def rotate_half(tr: "Translator", node: fx.Node) -> TV | None:
    """A member of a rotate_half (rotation()): the slices and the neg are no values (None); the cat
    is Graph.rotate_half(x, D) of the tile, over its runs of D columns."""
    rot = rotation(tr, node)
    return _rotated_tile(tr, node, rot.x, rot.d, tr.g.rotate_half) if node is rot.cat else None


# ---- rotate_pairs (interleaved RoPE) -----------------------------------------------------
_STACK = aten.stack.default


@dataclass
class Pairs:
    """The interleaved rotation of x over each head's D columns (GPT-J's rotate_every_two, Cohere's
    rotate_half): stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2), column 2i reading -x[2i + 1]
    and column 2i + 1 reading x[2i]."""
    x: fx.Node
    even: fx.Node   # slice(x, -1, 0, end, 2): x1
    odd: fx.Node    # slice(x, -1, 1, end, 2): x2
    neg: fx.Node    # neg(odd)
    stack: fx.Node  # stack([neg, even], -1): [..., D/2, 2]
    flat: fx.Node   # a view of the stack back to x's shape [..., D] (flatten(-2))
    d: int


def is_pairs_member(node: fx.Node) -> bool:
    """Whether `node` belongs to an interleaved rotation (pairs() checks it whole): a slice of the
    last dim with a step other than 1, the neg of one, a stack, or a view of a stack."""
    t = node.target
    if t == _NEG and is_rotation_neg(node):
        node, t = node.args[0], _SLICE
    if t == _SLICE:
        return _slice_args(node)[3] != 1
    if t == _STACK:
        return True
    p = node.args[0] if t in _ROW_VIEWS and node.args else None
    return isinstance(p, fx.Node) and p.op == "call_function" and p.target == _STACK



def pairs(tr: "Translator", node: fx.Node) -> Pairs:
    """The interleaved rotation `node` (a slice, the neg, the stack or the view that flattens it) is
    part of, checked whole: Unsupported at `node`, with the reason, where it is no
    stack((-x2, x1), -1).flatten(-2) of each head's D columns with x1 = x[..., ::2] and
    x2 = x[..., 1::2] (other starts, steps or bounds: partial rotary; another order, sign or dim;
    pairs used otherwise) or where part of it stays out of the region."""
    form = ("stack((-x2, x1), -1).flatten(-2) with x1 = x[..., ::2], x2 = x[..., 1::2] (GPT-J's rotate_every_two, "
            "Cohere's rotate_half)")
    t = node.target
    stack = node.args[0] if t in _ROW_VIEWS else node if t == _STACK else None
    if stack is not None:
        parts = _parts(stack)
        if (not parts or len(parts) != 2 or not is_rotation_neg(parts[0]) or parts[1].target != _SLICE
                or _slice_args(parts[1])[3] != 2):
            raise Unsupported(node, f"stack is outside the fusion domain but as the interleaved rotation of each head: "
                                    f"{form}")
        sl = parts[1]
    elif t == _NEG:
        sl = node.args[0]
    else:
        sl = node
    tv, d, step = _rotated(tr, sl, node, "each head's even and odd columns, as the interleaved rotation does")
    x = sl.args[0]
    xv = val(x)
    rank = xv.dim()
    if step != 2:
        raise Unsupported(node, f"slice with step {step} of each head's {d} columns: a region takes each head's two "
                                "halves (step 1, transformers' rotate_half) or its even and odd columns (step 2: "
                                f"{form})")

    def cols(s: fx.Node) -> range:
        _, a, b, k = _slice_args(s)
        return range(d)[slice(a, None if b is not None and int(b) >= _BIG else b, k)]

    per_segment(tr, node, d, "rotates")
    picked = cols(sl)
    if d % 2 or picked not in (range(0, d, 2), range(1, d, 2)):
        raise Unsupported(node, f"slice [{picked.start}:{picked.stop}:{picked.step}] of each head's {d} columns: a "
                                f"region takes only all even and all odd columns, [0:{d}:2] and [1:{d}:2], that the "
                                "interleaved rotation pairs (partial rotary, GPT-J's rotary_dim below the head's "
                                "width, rotates part of each head)")
    # The whole pattern from the slice: x1 -> stack, x2 -> neg -> stack -> the view back to [..., D].
    why = (f"the even or odd columns of each head's {d} ('{sl.name}' [{picked.start}::2]) are used otherwise than "
           f"as the interleaved rotation, {form}")
    order = ("stack '{}' of each head's even and odd columns in another order, sign or dim than the interleaved "
             f"rotation, {form}")
    stack, neg, even, odd = _combined(node, sl, _STACK, why, order,
                                      lambda even, odd: cols(even) == range(0, d, 2) and cols(odd) == range(1, d, 2))
    flat = next(iter(stack.users)) if len(stack.users) == 1 else None
    fv = val(flat) if flat is not None else None
    if (flat is None or flat.target not in _ROW_VIEWS or fv is None or fv.dim() != rank
            or not all(_known_equal(a, b) for a, b in zip(fv.shape, xv.shape))):
        raise Unsupported(node, f"stack '{stack.name}' of each head's rotated pairs is used otherwise than flattened "
                                f"back to the head's {d} columns: {form}")
    out = [n.name for n in (even, odd, neg, stack, flat) if n not in tr.in_region]
    if out:
        raise Unsupported(node, f"part of an interleaved rotation of each head whose op(s) {out} stay out of the "
                                "region")
    return Pairs(x, even, odd, neg, stack, flat, d)


def rotate_pairs(tr: "Translator", node: fx.Node) -> TV | None:
    """A member of an interleaved rotation (pairs()): the slices, the neg and the stack are no values
    (None); the view that flattens the stack is Graph.rotate_pairs(x, D) of the tile, over its
    runs of D columns."""
    rot = pairs(tr, node)
    return _rotated_tile(tr, node, rot.x, rot.d, tr.g.rotate_pairs) if node is rot.flat else None


def rotary(tr: "Translator", node: fx.Node) -> TV | None:
    """A member of RoPE's rotation of each head (a slice, the neg of one, a cat, a stack or the view
    that flattens it): rotate_pairs() for the interleaved layout, else rotate_half()."""
    return rotate_pairs(tr, node) if is_pairs_member(node) else rotate_half(tr, node)
