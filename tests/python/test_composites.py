"""aten ops without a ComFuse primitive, translated as compositions of its primitives
(comfuse.composites): each against torch in fp64 on the region's own inputs (random, ragged M and
N), through the run-time path with the kernel emulated, and the ones refused with their reason."""
import math

import pytest
import torch
import torch.nn.functional as F

import comfuse
from comfuse.capture import capture

from conftest import close, compile_vs_eager, randn
from test_reference import _check
from test_runtime_glue import emulate  # noqa: F401 (the fixture: kernels emulated on the CPU)


class LinearThen(torch.nn.Module):
    """Linear (+ bias) then f of its output; an optional residual second output of h."""

    def __init__(self, f, k=72, n=264):
        super().__init__()
        self.proj = torch.nn.Linear(k, n)
        self.f = f

    def forward(self, x):
        return self.f(self.proj(x))


OPS = {
    "clamp": lambda h: h.clamp(-0.5, 0.75),
    "clamp_min_only": lambda h: torch.clamp(h, min=-0.25),
    "relu6": lambda h: F.relu6(h * 8.0),
    "hardtanh": lambda h: F.hardtanh(h, -0.3, 0.4),
    "leaky_relu": lambda h: F.leaky_relu(h, 0.2),
    "leaky_relu_steep": lambda h: F.leaky_relu(h, 3.0),
    "hardsigmoid": lambda h: F.hardsigmoid(h * 6.0),
    "hardswish": lambda h: F.hardswish(h * 6.0),
    "var": lambda h: (h - h.mean(-1, keepdim=True)) / torch.sqrt(h.var(-1, keepdim=True, unbiased=False) + 1e-5),
    "std_unbiased": lambda h: h / h.std(-1, keepdim=True),
    "var_mean": lambda h: (lambda v, m: (h - m) * torch.rsqrt(v + 1e-5))(*torch.var_mean(h, -1, keepdim=True)),
    "normalize": lambda h: F.normalize(h, dim=-1),
    "norm1": lambda h: h / h.norm(p=1, dim=-1, keepdim=True),
    "norm_inf": lambda h: h / torch.linalg.vector_norm(h, ord=math.inf, dim=-1, keepdim=True),
    "logsumexp": lambda h: h - torch.logsumexp(h, -1, keepdim=True),
    "logsumexp_stat": lambda h: torch.logsumexp(h.float(), -1),
    "rms_norm_fn": lambda h: F.rms_norm(h, (h.shape[-1],), eps=1e-6),
    "glu": lambda h: F.glu(h, -1),  # two halves of 136 columns (translate.Halves)
    "softplus": lambda h: F.softplus(h * 30.0),  # past the threshold of 20 and its far tail
    "softplus_beta": lambda h: F.softplus(h * 4.0, beta=2.0),
    "mish": lambda h: F.mish(h * 4.0),
    "elu": lambda h: F.elu(h * 4.0, 0.7),
    "selu": lambda h: F.selu(h * 4.0),
    "celu": lambda h: F.celu(h * 4.0, 0.5),
    "logsigmoid": lambda h: F.logsigmoid(h * 30.0),
    "erf": lambda h: torch.erf(h * 2.0),
    "log1p": lambda h: torch.log1p(h * h * 1e-3),
    "expm1": lambda h: torch.expm1(h * 1e-3),
}


def _model(case):
    torch.manual_seed(0)
    m = LinearThen(OPS[case], n=272 if case == "glu" else 264).to(torch.bfloat16).eval()
    with torch.no_grad():
        m.proj.weight.copy_(randn(*m.proj.weight.shape, scale=0.2, seed=11))
        m.proj.bias.copy_(randn(*m.proj.bias.shape, offset=0.3, seed=12))
    return m


@pytest.mark.parametrize("case", sorted(OPS))
def test_composite_translates_whole_and_matches_torch_fp64(case):
    cap = capture(_model(case), randn(3, 101, 72, offset=0.1, seed=7))
    c = cap.by_root("proj")
    assert c.translator is not None, c.info.reason
    assert not c.info.excluded, [(e.node, e.reason) for e in c.info.excluded]  # every op of f in the region
    _check(c, cap.values)


@pytest.mark.parametrize("case", ["clamp", "leaky_relu", "hardswish", "var_mean", "normalize", "logsumexp_stat", "glu",
                                  "rms_norm_fn", "softplus", "mish", "elu", "logsigmoid"])
def test_composite_runtime_path_emulated(emulate, case):
    out, ref, rep = compile_vs_eager(_model(case), randn(2, 45, 72, offset=0.1, seed=3))
    r = next(r for r in rep.regions if "proj" in r.root)
    assert r.calls == 1 and r.fallback_calls == 0, (r.status, r.reason, r.runtime_fallback)
    close(out, ref)


REFUSED = {
    "softplus_threshold": (lambda h: F.softplus(h, threshold=10.0), "threshold 10.0"),
    "where": (lambda h: torch.where(h > 0, h, 0.1 * h), "outside the fusion domain"),
    "norm3": (lambda h: h / h.norm(p=3, dim=-1, keepdim=True), "order 3.0"),
    "tensor_bound": (lambda h: h.clamp(min=h.mean(-1, keepdim=True)), "outside the fusion domain"),
    "norm_over_rows": (lambda h: h / h.norm(dim=0, keepdim=True), "not the last"),
    "glu_unaligned": (lambda h: F.glu(h, -1), "16-byte rows"),  # halves of 132 columns: 264 bytes
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_composites_refused_say_why(case):
    f, why = REFUSED[case]
    model = LinearThen(f).to(torch.bfloat16).eval()
    cap = capture(model, randn(2, 45, 72))
    c = cap.by_root("proj")
    reasons = [e.reason for e in c.info.excluded] + [c.info.reason]
    assert any(why in r for r in reasons), reasons


class ExpandedNorm(torch.nn.Module):
    """The norm expanded to the tile and returned: stored it would be a tile, so it stays outside."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(72, 264)

    def forward(self, x):
        h = self.proj(x)
        n = h.norm(dim=-1, keepdim=True).expand_as(h)
        return h / n, n


def test_expanded_per_row_value_is_no_output():
    model = ExpandedNorm().to(torch.bfloat16).eval()
    with torch.no_grad():  # random weights away from 0: fp64 sums exact, so no rounding flips
        model.proj.weight.copy_(randn(*model.proj.weight.shape, scale=0.2, seed=11))
        model.proj.bias.copy_(randn(*model.proj.bias.shape, offset=0.3, seed=12))
    cap = capture(model, randn(2, 45, 72))
    c = cap.by_root("proj")
    reasons = [e.reason for e in c.info.excluded]
    assert any("expanded to" in r for r in reasons), reasons
    if c.translator is not None:
        _check(c, cap.values)


class ExpandedNormThen(ExpandedNorm):
    """An op after the expanded norm (exp of it): still a per-row value, refused as an output too."""

    def forward(self, x):
        h = self.proj(x)
        n = h.norm(dim=-1, keepdim=True).expand_as(h)
        return h / n, torch.exp(n * 0.01)


def test_a_value_computed_from_a_broadcast_is_no_output_either():
    model = ExpandedNormThen().to(torch.bfloat16).eval()
    with torch.no_grad():
        model.proj.weight.copy_(randn(*model.proj.weight.shape, scale=0.2, seed=11))
        model.proj.bias.copy_(randn(*model.proj.bias.shape, offset=0.3, seed=12))
    cap = capture(model, randn(2, 45, 72))
    c = cap.by_root("proj")
    # exp, then mul, then the expand itself are refused as outputs in turn (what reads the expanded
    # norm outside needs the tile); the norm stays in, a per-row output.
    assert any("expanded to" in e.reason for e in c.info.excluded), c.info.excluded
    assert not {"exp", "mul", "expand"} & {o.name for o in c.translator.outputs}
    _check(c, cap.values)


class MaskedThen(torch.nn.Module):
    """Linear, plus a mask tile holding -inf rows and +inf / NaN elements, then f."""

    def __init__(self, f):
        super().__init__()
        self.proj = torch.nn.Linear(72, 264)
        self.f = f

    def forward(self, x, mask):
        return self.f(self.proj(x) + mask)


@pytest.mark.parametrize("case", ["logsumexp", "leaky_relu_0", "leaky_relu", "leaky_relu_steep", "clamp", "elu",
                                  "softplus", "hardswish"])
def test_composites_keep_torchs_infinities(case):
    f = {"logsumexp": lambda h: torch.logsumexp(h.float(), -1),
         "leaky_relu_0": lambda h: F.leaky_relu(h, 0.0), "leaky_relu": lambda h: F.leaky_relu(h, 0.2),
         "leaky_relu_steep": lambda h: F.leaky_relu(h, 3.0), "clamp": lambda h: h.clamp(-0.5, 0.75),
         "elu": F.elu, "softplus": F.softplus, "hardswish": F.hardswish}[case]
    from comfuse import reference as R

    model = MaskedThen(f).to(torch.bfloat16).eval()
    mask = torch.zeros(2, 45, 264, dtype=torch.bfloat16)
    mask[0, 3] = float("-inf")              # a whole row
    mask[1, 7, 5] = float("inf")
    mask[1, 8, 9] = float("-inf")
    cap = capture(model, randn(2, 45, 72), mask)
    c = cap.by_root("proj")
    assert c.translator is not None and not c.info.excluded, c.info.excluded
    got, ref = R.comfuse_fp64(c, cap.values), R.eager_fp64(c, cap.values)
    for name, r in ref.items():
        x = got[name]
        same = (x == r) | (x.isnan() & r.isnan())
        finite = r.isfinite() & x.isfinite()
        assert (same | finite).all(), (case, x[~(same | finite)][:4], r[~(same | finite)][:4])
        assert ((x - r).abs()[finite] <= R.ulp(torch.bfloat16, r[finite]) * 1.01 + 1e-12).all()
