"""Per-head norms (Qwen 3's and Gemma 3's q/k norms): a Linear's output viewed as [B, S, H, D] and
normalized over each head's D columns translates as segmented reductions of the GEMM's [M, N]
tile (translate.py, "Segments"). Checked here on the CPU: the translated graph (its segment, the
[D] weight as a periodic vector) against the region's aten ops in fp64 at ragged row counts (and
through Φ's Fusion Spec executor), the compiled model against
eager with the kernel emulated and without it (the aten fallback, eager and Inductor for the
rest), the transposed output's layout, and what stays out of a region with the reason."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import comfuse
from comfuse import reference as R
from comfuse.capture import capture

from conftest import close, compile_vs_eager, randn
from test_runtime_glue import emulate  # noqa: F401 (the fixture: kernels emulated on the CPU)


def qwen3_norm(x, w, eps=1e-6):
    """Qwen3RMSNorm.forward as transformers writes it."""
    dtype = x.dtype
    x = x.to(torch.float32)
    var = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(var + eps)
    return w * x.to(dtype)


def gemma3_norm(x, w, eps=1e-6):
    """Gemma3RMSNorm.forward: (x * w).to(dtype) in float32, with 1 + w."""
    out = x.float()
    out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + eps)
    return (out * (1.0 + w.float())).type_as(x)


NORMS = {
    "qwen3": qwen3_norm,
    "gemma3": gemma3_norm,
    "rms_norm_fn": lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-6),
    "layer_norm": lambda x, w: F.layer_norm(x, (x.shape[-1],), w, w * 0.5, 1e-5),
    "var": lambda x, w: (x - x.mean(-1, keepdim=True)) * torch.rsqrt(x.var(-1, keepdim=True) + 1e-5) * w,
    "softmax": lambda x, w: torch.softmax(x.float() * 0.5, dim=-1) * w,
    "logsumexp": lambda x, w: x - torch.logsumexp(x, -1, keepdim=True),
    # Back to [B, S, N] (a row vector [N] against it), and split into the same heads again.
    "view_back": lambda x, w: (qwen3_norm(x, w).flatten(-2) * w.repeat(x.shape[-2])).view(x.shape),
}


class HeadNorm(nn.Module):
    """q = norm(q_proj(x).view(B, S, H, D)).transpose(1, 2) (Qwen 3); transpose_first: the norm
    after the transpose (Gemma 3)."""

    def __init__(self, k=72, heads=4, d=64, norm="qwen3", transpose_first=False, bias=False):
        super().__init__()
        self.proj = nn.Linear(k, heads * d, bias=bias)
        self.weight = nn.Parameter(torch.ones(d))
        self.d, self.norm, self.transpose_first = d, NORMS[norm], transpose_first

    def forward(self, x):
        b, s, _ = x.shape
        q = self.proj(x).view(b, s, -1, self.d)
        if self.transpose_first:
            return self.norm(q.transpose(1, 2), self.weight)
        return self.norm(q, self.weight).transpose(1, 2)


def _model(seed=0, **kw):
    m = HeadNorm(**kw).to(torch.bfloat16).eval()
    with torch.no_grad():  # random, nonzero weights
        m.proj.weight.copy_(randn(*m.proj.weight.shape, scale=0.2, seed=seed + 11))
        m.weight.copy_(randn(*m.weight.shape, offset=0.5, scale=0.3, seed=seed + 12))
        if m.proj.bias is not None:
            m.proj.bias.copy_(randn(*m.proj.bias.shape, offset=0.2, seed=seed + 13))
    return m


def check_fp64(c, values):
    """The translated graph on the fp64 executor (and Φ's, where it fuses segmented reductions)
    against the region's aten ops in fp64: equal up to a rounding flipped by reassociation."""
    got = {"graph executor": R.comfuse_fp64(c, values), "lowered (Fusion Spec) executor": R.lowered_fp64(c, values)}
    ref = R.eager_fp64(c, values)
    assert ref
    for name, r in ref.items():
        dtype = next(o for o in c.translator.outputs if o.name == name).meta["val"].dtype
        assert r.abs().max() > 0 and torch.isfinite(r).all()
        for what, res in got.items():
            diff = (res[name] - r).abs()
            assert (diff <= R.ulp(dtype, r) * 1.01 + 1e-12).all(), f"{name} ({what}): max diff {diff.max().item()}"
            assert (diff > 1e-9).float().mean() < 0.01, f"{name} ({what}): too many rounding differences"


CASES = {  # name: (HeadNorm arguments, input shape)
    "qwen3": (dict(norm="qwen3"), (1, 7, 72)),
    "qwen3_bias_d32": (dict(norm="qwen3", d=32, heads=5, bias=True), (5, 1, 72)),
    "gemma3_transposed": (dict(norm="gemma3", transpose_first=True), (1, 7, 72)),
    "gemma3_untransposed": (dict(norm="gemma3"), (5, 1, 72)),
    "rms_norm_fn": (dict(norm="rms_norm_fn"), (1, 5, 72)),
    "layer_norm": (dict(norm="layer_norm", d=32, heads=3), (1, 7, 72)),
    "var": (dict(norm="var"), (1, 7, 72)),
    "softmax": (dict(norm="softmax"), (1, 5, 72)),
    "logsumexp": (dict(norm="logsumexp", d=32), (1, 7, 72)),
    "view_back": (dict(norm="view_back", heads=2), (1, 7, 72)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_per_head_norm_translates_as_segments_and_matches_torch_fp64(case):
    kw, shape = CASES[case]
    model = _model(**kw)
    d = model.d
    cap = capture(model, randn(*shape, offset=0.1, seed=7))
    c = cap.by_root("proj")
    assert c.translator is not None, c.info.reason
    # The whole norm is in the region: what stays out is no op of it.
    assert not c.info.excluded, [(e.node, e.reason) for e in c.info.excluded]
    text = c.translator.g.text()
    reductions = [line for line in text.splitlines() if line.startswith("%reduce")]
    assert reductions and all(f"segment={d})" in line for line in reductions), text  # over each head's D columns
    if case != "logsumexp":  # the weight: a periodic vector of D elements, not a row [N]
        assert f"[{d}]" in text and "vec" in c.translator.input_roles, text
    # One output: the normed tile, transposed in the region where the model transposes it.
    assert c.translator.output_classes == ["tile"]
    assert c.translator.output_perms == [(-3, -2)], c.translator.output_perms
    check_fp64(c, cap.values)


@pytest.mark.parametrize("case,dynamic", [("qwen3", False), ("gemma3_transposed", False), ("gemma3_transposed", True)])
def test_per_head_norm_compiled_matches_eager_with_the_kernel_emulated(emulate, case, dynamic):
    """The run-time path: the custom op's arguments (the [D] weight as a vector), the emulated
    kernel's [M, N] tile and the transpose after it; the output has eager's shape and strides."""
    kw, shape = CASES[case]
    model = _model(**kw)
    x = randn(3, 5, 72, offset=0.1, seed=3) if dynamic else randn(*shape, offset=0.1, seed=3)
    out, ref, rep = compile_vs_eager(model, x, dynamic=dynamic)
    close(out, ref)
    assert out.shape == ref.shape and out.stride() == ref.stride()
    (r,) = [r for r in rep.regions if "proj" in r.root]
    assert r.calls == 1 and r.fallback_calls == 0, (r.status, r.reason, r.runtime_fallback)
    assert {"pow", "mean", "rsqrt"} <= {op.split(":")[-1].split(" ")[0] for op in r.ops}, r.ops


@pytest.mark.parametrize("rest", ["eager", "inductor"])
def test_forced_region_runs_its_aten_ops_and_keeps_the_layout(rest):
    """Without a GPU a forced region runs its aten ops (the custom op's fallback, its fake
    implementation feeding Inductor): the transposed output comes back as eager has it."""
    comfuse.config.force_regions = True
    comfuse.config.rest = rest
    comfuse.config.min_gain = -1e9
    model = _model(norm="gemma3", transpose_first=True)
    out, ref, rep = compile_vs_eager(model, randn(2, 3, 72, offset=0.1, seed=5))
    close(out, ref)
    (r,) = [r for r in rep.regions if "proj" in r.root]
    if not comfuse.gpu_available()[0]:
        assert r.calls == 1 and r.fallback_calls == 1, (r.status, r.reason)


class Refused(nn.Module):
    def __init__(self, f, k=72, n=256):
        super().__init__()
        self.proj = nn.Linear(k, n, bias=False)
        self.w = nn.Parameter(torch.ones(64))
        self.f = f

    def forward(self, x):
        return self.f(self.proj(x), self.w)


def _heads(h, d=64):
    return h.view(*h.shape[:-1], -1, d)


REFUSED = {
    # name: (f(h, w), the reason's words, the op the region ends before)
    "two_lengths": (lambda h, w: (qwen3_norm(_heads(h), w), qwen3_norm(_heads(h, 32), w[:32])),
                    "share one length", "view"),
    "whole_rows_then_heads": (lambda h, w: qwen3_norm(_heads(F.normalize(h, dim=-1)), w),
                              "reduces each run of 64 columns in a region that reduces whole rows", "mean"),
    "stat_as_output": (lambda h, w: _heads(h).float().pow(2).mean(-1, keepdim=True), "used outside", "mean"),
    "no_keepdim": (lambda h, w: _heads(h).float().pow(2).mean(-1), "keepdim", "mean"),
    # A [D] vector against the heads is read periodically (binary(segment=D), as RoPE's cos at one
    # token is), but Φ takes one only in an epilogue with a per-segment reduction or rotate_half.
    "vec_before_reduction": (lambda h, w: _heads(h) * w, "repeats every 64 columns", "mul"),
    "rows_split": (lambda h, w: h.reshape(-1, 64).float().pow(2).mean(-1, keepdim=True),
                   "row layout", "view"),
    "transpose_last": (lambda h, w: qwen3_norm(_heads(h).transpose(-1, -2), w[:4]), "last dim", "transpose"),
    # softmax's output is packed [B, H, S, D] rows whatever its input's layout: no transposed tile.
    "packed_after_transpose": (lambda h, w: torch.softmax(_heads(h).transpose(1, 2), -1), "strides", "_softmax"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_segments_cannot_take_ends_the_region_with_the_reason(case):
    f, why, op = REFUSED[case]
    model = Refused(f).to(torch.bfloat16).eval()
    cap = capture(model, randn(1, 7, 72))
    c = cap.by_root("proj")
    hits = [e for e in c.info.excluded if why in e.reason]
    assert hits, [(e.node, e.reason) for e in c.info.excluded] + [c.info.reason]
    assert any(op in e.fx_name for e in hits), [(e.fx_name, e.reason) for e in hits]
    if c.translator is not None and len(c.nodes) > 1 and c.translator.outputs:
        check_fp64(c, cap.values)  # what the region kept still computes as torch does
