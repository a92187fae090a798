"""aten ops the ComFuse graph has no primitive for, written as its primitives (translate.py
calls these for a node whose target is in COMPOSITES). Each rule is exact in real arithmetic and
keeps torch's semantics over the tile; an argument it cannot honour raises Unsupported with the
reason, so the region ends before the node.

    clamp / hardtanh / relu6        max(x, lo), then min(., hi)
    leaky_relu(x, s)                max(x, s x) for s <= 1, else min(x, s x)
    hardsigmoid / hardswish         clamp(x / 6 + 1/2, 0, 1) (times x)
    var / std / var_mean            mean((x - mean x)^2) * N / (N - correction) over the last dim
                                    (or each run of N columns of a tile split into heads: the
                                    reductions below take the tile's segments, translate.py)
    linalg_vector_norm (F.normalize) sum |x| (ord 1), sqrt(sum x^2) (ord 2), max |x| (ord inf; as
                                    the graph's max reduction (amax too), it passes over a NaN where
                                    torch returns NaN)
    logsumexp                       m + log(sum exp(x - m)), m the row max clamped to +-FLT_MAX
    softplus(x, beta, 20)           softplus(beta x) / beta (the primitive's threshold is torch's 20)
    mish                            x tanh(softplus(x))
    elu / selu / celu               scale (max(x, 0) + alpha expm1(min(x, 0) input_scale))
    logsigmoid                      -softplus(-x)

where/compare ops have no primitive: they stay with Inductor, saying so.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.fx as fx

from . import segments as _segments
from .translate import TV, Unsupported

if TYPE_CHECKING:  # pragma: no cover
    from .translate import Translator

aten = torch.ops.aten
_F32_MAX = float(torch.finfo(torch.float32).max)


def _arg(node: fx.Node, i: int, name: str, default):
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


def _number(node: fx.Node, x, what: str) -> float | None:
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise Unsupported(node, f"{what} {x!r} is not a Python number (a tensor bound is not a kernel literal)")
    return float(x)


def _clamped(tr: "Translator", node: fx.Node, x: "TV", lo: float | None, hi: float | None) -> "TV":
    g, y = tr.g, x.id
    if lo is not None:
        y = g.binary("max", y, g.constant(lo))
    if hi is not None:
        y = g.binary("min", y, g.constant(hi))
    return tr._check_class(node, x.to(y))


def clamp(tr: "Translator", node: fx.Node) -> "TV":
    x = tr.operand(node.args[0], node)
    return _clamped(tr, node, x, _number(node, _arg(node, 1, "min", None), "min"),
                    _number(node, _arg(node, 2, "max", None), "max"))


def hardtanh(tr: "Translator", node: fx.Node) -> "TV":
    x = tr.operand(node.args[0], node)
    return _clamped(tr, node, x, _number(node, _arg(node, 1, "min_val", -1.0), "min_val"),
                    _number(node, _arg(node, 2, "max_val", 1.0), "max_val"))


def leaky_relu(tr: "Translator", node: fx.Node) -> "TV":
    x = tr.operand(node.args[0], node)
    s = _number(node, _arg(node, 1, "negative_slope", 0.01), "negative_slope")
    g = tr.g
    if s <= 1.0:  # s min(x, 0), not s x: at s = 0 a +inf stays +inf (0 * inf would be NaN)
        y = g.binary("max", x.id, g.binary("mul", g.binary("min", x.id, g.constant(0.0)), g.constant(s)))
    else:
        y = g.binary("min", x.id, g.binary("mul", x.id, g.constant(s)))
    return tr._check_class(node, x.to(y))


def _hardsigmoid(tr: "Translator", node: fx.Node, x: "TV") -> int:
    g = tr.g
    y = g.binary("add", g.binary("mul", x.id, g.constant(1.0 / 6.0)), g.constant(0.5))
    return g.binary("min", g.binary("max", y, g.constant(0.0)), g.constant(1.0))


def hardsigmoid(tr: "Translator", node: fx.Node) -> "TV":
    x = tr.operand(node.args[0], node)
    return tr._check_class(node, x.to(_hardsigmoid(tr, node, x)))


def hardswish(tr: "Translator", node: fx.Node) -> "TV":
    x = tr.operand(node.args[0], node)
    return tr._check_class(node, x.to(tr.g.binary("mul", x.id, _hardsigmoid(tr, node, x))))


def _moments(tr: "Translator", node: fx.Node) -> tuple[int, int, "TV"]:
    """(var, mean, x) over x's last dim (whole rows, or each run of its segment's columns) as
    var.correction / var_mean.correction define them."""
    x = tr.operand(node.args[0], node)
    seg = tr._last_dim(node, x, _arg(node, 1, "dim", None))
    correction = node.kwargs.get("correction", 1)
    correction = 1.0 if correction is None else _number(node, correction, "correction")
    n = seg or tr.gemm.n
    if n - correction <= 0:
        raise Unsupported(node, f"variance with correction {correction} over {n} columns divides by zero or less")
    g = tr.g
    mean = g.reduce("mean", x.id, -1, seg)
    centered = g.binary("sub", x.id, mean)
    var = g.reduce("mean", g.unary("square", centered), -1, seg)
    if correction:
        var = g.binary("mul", var, g.constant(n / (n - correction)))
    return var, mean, x


def var(tr: "Translator", node: fx.Node) -> "TV":
    v, _, x = _moments(tr, node)
    return _segments.stat(tr, node, x, v)


def std(tr: "Translator", node: fx.Node) -> "TV":
    v, _, x = _moments(tr, node)
    return _segments.stat(tr, node, x, tr.g.unary("sqrt", v))


def var_mean(tr: "Translator", node: fx.Node) -> tuple:
    v, m, x = _moments(tr, node)
    return (_segments.stat(tr, node, x, v), _segments.stat(tr, node, x, m))


def vector_norm(tr: "Translator", node: fx.Node) -> "TV":
    x = tr.operand(node.args[0], node)
    order = _number(node, _arg(node, 1, "ord", 2), "ord")
    seg = tr._last_dim(node, x, _arg(node, 2, "dim", None))
    if _arg(node, 4, "dtype", None) not in (None, torch.float32):
        raise Unsupported(node, f"linalg_vector_norm with dtype={_arg(node, 4, 'dtype', None)}")
    g = tr.g
    if order == 2.0:
        y = g.unary("sqrt", g.reduce("sum", g.unary("square", x.id), -1, seg))
    elif order == 1.0:
        y = g.reduce("sum", g.unary("abs", x.id), -1, seg)
    elif order == math.inf:
        y = g.reduce("max", g.unary("abs", x.id), -1, seg)
    else:
        raise Unsupported(node, f"linalg_vector_norm of order {order} (the kernel takes 1, 2 and inf)")
    return _segments.stat(tr, node, x, y)


def logsumexp(tr: "Translator", node: fx.Node) -> "TV":
    x = tr.operand(node.args[0], node)
    seg = tr._last_dim(node, x, _arg(node, 1, "dim", None))
    g = tr.g
    # The row max clamped to the finite range, as torch zeroes an infinite one: a row of -inf
    # gives -inf and a row holding +inf gives +inf, not inf - inf = NaN.
    m = g.reduce("max", x.id, -1, seg)
    m = g.binary("min", g.binary("max", m, g.constant(-_F32_MAX)), g.constant(_F32_MAX))
    s = g.reduce("sum", g.unary("exp", g.binary("sub", x.id, m)), -1, seg)
    return _segments.stat(tr, node, x, g.binary("add", m, g.unary("log", s)))


def softplus(tr: "Translator", node: fx.Node) -> "TV":
    x = tr.operand(node.args[0], node)
    beta = _number(node, _arg(node, 1, "beta", 1.0), "beta")
    threshold = _number(node, _arg(node, 2, "threshold", 20.0), "threshold")
    if threshold != 20.0 or beta <= 0.0:
        raise Unsupported(node, f"softplus with beta {beta}, threshold {threshold} (the kernel's is torch's default "
                                "threshold 20, beta > 0)")
    g = tr.g
    y = x.id if beta == 1.0 else g.binary("mul", x.id, g.constant(beta))
    y = g.unary("softplus", y)
    if beta != 1.0:
        y = g.binary("mul", y, g.constant(1.0 / beta))
    return tr._check_class(node, x.to(y))


def mish(tr: "Translator", node: fx.Node) -> "TV":
    x = tr.operand(node.args[0], node)
    g = tr.g
    return tr._check_class(node, x.to(g.binary("mul", x.id, g.unary("tanh", g.unary("softplus", x.id)))))


def elu(tr: "Translator", node: fx.Node) -> "TV":
    """aten.elu(x, alpha, scale, input_scale) (F.elu, and F.selu with its constants)."""
    return _elu(tr, node, _number(node, _arg(node, 1, "alpha", 1.0), "alpha"),
                _number(node, _arg(node, 2, "scale", 1.0), "scale"),
                _number(node, _arg(node, 3, "input_scale", 1.0), "input_scale"))


def celu(tr: "Translator", node: fx.Node) -> "TV":
    """max(0, x) + min(0, alpha (exp(x / alpha) - 1)): elu with input_scale 1 / alpha."""
    alpha = _number(node, _arg(node, 1, "alpha", 1.0), "alpha")
    if alpha == 0.0:
        raise Unsupported(node, "celu with alpha 0")
    return _elu(tr, node, alpha, 1.0, 1.0 / alpha)


def log_sigmoid(tr: "Translator", node: fx.Node) -> tuple:
    """log_sigmoid_forward's (value, buffer): -softplus(-x); the buffer (backward's) is no value here."""
    x = tr.operand(node.args[0], node)
    g = tr.g
    y = g.unary("neg", g.unary("softplus", g.unary("neg", x.id)))
    return (tr._check_class(node, x.to(y)), None)


def _elu(tr: "Translator", node: fx.Node, alpha: float, scale: float, input_scale: float) -> "TV":
    x = tr.operand(node.args[0], node)
    g = tr.g
    neg = g.binary("min", x.id, g.constant(0.0))
    if input_scale != 1.0:
        neg = g.binary("mul", neg, g.constant(input_scale))
    tail = g.unary("expm1", neg)
    if alpha != 1.0:
        tail = g.binary("mul", tail, g.constant(alpha))
    y = g.binary("add", g.binary("max", x.id, g.constant(0.0)), tail)
    if scale != 1.0:
        y = g.binary("mul", y, g.constant(scale))
    return tr._check_class(node, x.to(y))


COMPOSITES = {
    aten.softplus.default: softplus,
    aten.mish.default: mish,
    aten.elu.default: elu,
    aten.celu.default: celu,
    aten.log_sigmoid_forward.default: log_sigmoid,
    aten.clamp.default: clamp,
    aten.hardtanh.default: hardtanh,
    aten.leaky_relu.default: leaky_relu,
    aten.hardsigmoid.default: hardsigmoid,
    aten.hardswish.default: hardswish,
    aten.var.correction: var,
    aten.std.correction: std,
    aten.var_mean.correction: var_mean,
    aten.linalg_vector_norm.default: vector_norm,
    aten.logsumexp.default: logsumexp,
}
