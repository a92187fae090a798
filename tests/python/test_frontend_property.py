"""Property tests of the frontend on the CPU: random Linear + epilogue modules (activations,
residual adds, scales, casts, LayerNorm, RMSNorm as transformers writes it and F.rms_norm,
softmax and log-softmax, composites (hardswish, leaky ReLU, clamp, F.normalize), in random
orders, over 2-D and 3-D activations of ragged sizes) compile under
backend="comfuse" with the kernels emulated on the fp64 executor (test_runtime_glue's
`emulate`). Every region either runs fused and matches the module in float32, or falls back
with a reason; nothing raises. Sizes TMA cannot take (rows not a multiple of 16 bytes) fall back
with their reason too."""
import random

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import modules as M
from conftest import randn
from test_runtime_glue import emulate  # noqa: F401 (the fixture: kernels emulated on the CPU)

import comfuse

OPS = ("gelu", "gelu_tanh", "silu", "relu", "tanh", "sigmoid", "residual", "scale", "layer_norm", "rms_norm",
       "softmax", "log_softmax", "f32_roundtrip", "hardswish", "leaky_relu", "clamp", "normalize", "fn_rms_norm")


class RandomEpilogue(nn.Module):
    """Linear (bias or not) followed by `ops`; `r` is the residual ([..., N])."""

    def __init__(self, k: int, n: int, bias: bool, ops: list[str]):
        super().__init__()
        self.proj = nn.Linear(k, n, bias=bias)
        self.ops = ops
        self.norms = nn.ModuleList(nn.LayerNorm(n) if op == "layer_norm" else M.RMSNorm(n)
                                   for op in ops if op in ("layer_norm", "rms_norm"))

    def forward(self, x, r):
        h = self.proj(x)
        norms = iter(self.norms)
        for op in self.ops:
            if op in ("layer_norm", "rms_norm"):
                h = next(norms)(h)
            elif op == "gelu":
                h = F.gelu(h)
            elif op == "gelu_tanh":
                h = F.gelu(h, approximate="tanh")
            elif op == "residual":
                h = h + r
            elif op == "scale":
                h = h * 0.5
            elif op == "softmax":
                h = torch.softmax(h, dim=-1)
            elif op == "log_softmax":
                h = torch.log_softmax(h, dim=-1)
            elif op == "f32_roundtrip":
                h = h.float().to(x.dtype)
            elif op == "clamp":
                h = h.clamp(-1.5, 2.0)
            elif op == "normalize":
                h = F.normalize(h, dim=-1)
            elif op == "fn_rms_norm":
                h = F.rms_norm(h, (h.shape[-1],))
            else:
                h = getattr(F, op)(h)
        return h


def _case(seed: int):
    rng = random.Random(seed)
    k = rng.choice([16, 64, 72, 128])
    n = rng.choice([8, 64, 136, 200, 256]) if rng.random() > 0.1 else 36  # 36 x 2 bytes: not a 16-byte row
    lead = rng.choice([(rng.randint(1, 40),), (rng.randint(1, 3), rng.randint(1, 33))])
    ops = [rng.choice(OPS) for _ in range(rng.randint(1, 5))]
    return k, n, lead, rng.random() < 0.6, ops


@pytest.mark.parametrize("seed", range(48))
def test_random_epilogues_fuse_and_match_or_fall_back_with_a_reason(emulate, seed):
    k, n, lead, bias, ops = _case(seed)
    torch.manual_seed(seed)
    model = RandomEpilogue(k, n, bias, ops).to(torch.bfloat16).eval()
    x, r = randn(*lead, k, seed=seed), randn(*lead, n, seed=seed + 100)
    comfuse.config.strict = False  # a kernel that cannot run falls back, and says so
    with torch.no_grad(), comfuse.collecting() as rep:
        out = torch.compile(model, backend="comfuse")(x, r)
        # The reference: the module in float32 (fusion keeps fp32 between the ops, where eager
        # bf16 rounds each op's output).
        ref = model.float()(x.float(), r.float())
    assert out.shape == ref.shape, (ops, out.shape, ref.shape)
    err = ((out.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()
    assert err < 2e-2, (k, n, lead, bias, ops, err, str(rep))
    assert rep.regions, str(rep)
    for reg in rep.regions:
        assert reg.reason, str(rep)
        if reg.status != "fallback":  # "fusable" here: forced onto CPU tensors, the kernel emulated
            assert reg.calls >= 1 and reg.fallback_calls == 0, (reg.runtime_fallback, str(rep))
    if n * 2 % 16:  # rows TMA cannot read: nothing fuses, and the report says why
        assert all(reg.status == "fallback" and "16-byte rows" in reg.reason for reg in rep.regions), str(rep)
