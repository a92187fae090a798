"""Attention from the frontend (CPU): torch's SDPA ops become one batched B2B kernel each
(attention.py) where the inputs allow, with the model's materialized causal mask recognized, and
fall back with the reason where they do not (dropout, grouped-query heads, a padding mask, a
bias); under config.force_regions the custom op's fallback (torch's SDPA into the traced output
layout) matches eager. The kernel itself: tests/gpu/test_gpu_b2b.cpp (AttentionOnHeadStridedViews)
and test_gpu.py on the GPU."""
import pytest
import torch
import torch.nn.functional as F

import comfuse
from comfuse import attention
from comfuse.capture import capture

from conftest import randn

transformers = pytest.importorskip("transformers")
import bench_models  # noqa: E402


class SelfAttention(torch.nn.Module):
    """GPT-2's attention: one projection to q, k, v, split and viewed as [B, H, S, D] (strided
    views, row stride 3 x width), SDPA, and the heads merged back."""

    def __init__(self, width=256, heads=4, **sdpa):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.sdpa = sdpa

    def forward(self, x, mask=None):
        b, s, w = x.shape
        q, k, v = (t.view(b, s, self.heads, w // self.heads).transpose(1, 2) for t in self.qkv(x).split(w, dim=2))
        kw = dict(self.sdpa)
        if mask is not None:
            kw["attn_mask"] = mask
        o = F.scaled_dot_product_attention(q, k, v, **kw)
        return o.transpose(1, 2).reshape(b, s, w)


def one_attention(cap):
    assert len(cap.attentions) == 1, [a.info.root for a in cap.attentions]
    return cap.attentions[0]


def test_gpt2_attention_with_its_causal_mask():
    """transformers materializes GPT-2's causal mask while tracing (from constants): it is
    evaluated at compile time and recognized, so each layer's attention is one causal kernel over
    the strided q, k, v views of c_attn's output; forced through the custom op (its fallback here)
    the model matches eager exactly."""
    comfuse.config.force_regions = True
    comfuse.config.rest = "eager"
    rep = bench_models.compiled_prefill_matches_eager("gpt2")[3]
    att = [r for r in rep.regions if r.layout == "attention"]
    assert [r.root for r in att] == [f"model.transformer.h.{i}.attn:_scaled_dot_product_flash_attention_for_cpu"
                                     for i in range(2)], str(rep)
    for r in att:
        assert r.status == "fusable", r.reason
        assert "causal, the model's mask recognized as causal, scale 0.125" in r.reason
        assert r.plan["dims"] == {"B": 8, "M": 16, "N": 16, "K": 64, "DV": 64}
        assert r.calls == 1 and r.fallback_calls == 1  # no GPU here: SDPA ran in the op's place
        assert "causal_mask" in r.graph_text
    assert "and 2 attention(s)" in rep.summary()


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_module_is_one_kernel(causal):
    cap = capture(SelfAttention(is_causal=causal).to(torch.bfloat16).eval(), randn(2, 40, 256))
    a = one_attention(cap)
    assert a.info.status == "fused", a.info.reason
    assert a.causal == causal and a.scale == pytest.approx(0.125)
    assert a.dims == {"B": 8, "M": 40, "N": 40, "K": 64, "DV": 64} and a.heads == 4
    assert ("causal_mask" in a.info.graph_text) == causal
    assert a.out_strides[3] == 1


def test_explicit_scale_and_constant_masks():
    """A constant boolean causal mask is causal, an all-true one is no mask, a banded one refused."""
    x = randn(1, 24, 256)
    a = one_attention(capture(SelfAttention(scale=0.3).to(torch.bfloat16).eval(), x))
    assert a.info.status == "fused" and a.scale == pytest.approx(0.3) and not a.causal

    class Masked(SelfAttention):
        def __init__(self, make):
            super().__init__()
            self.make = make

        def forward(self, x):
            s = x.shape[1]
            return super().forward(x, self.make(s, x.device))

    tril = lambda s, d: torch.ones(s, s, dtype=torch.bool, device=d).tril()  # noqa: E731
    full = lambda s, d: torch.ones(s, s, dtype=torch.bool, device=d)  # noqa: E731
    band = lambda s, d: tril(s, d) & ~torch.ones(s, s, dtype=torch.bool, device=d).tril(-4)  # noqa: E731
    additive = lambda s, d: torch.zeros(s, s, device=d, dtype=torch.bfloat16).masked_fill(~tril(s, d), float("-inf"))  # noqa: E731
    lowest = lambda s, d: torch.zeros(s, s, device=d, dtype=torch.bfloat16).masked_fill(  # noqa: E731
        ~tril(s, d), torch.finfo(torch.bfloat16).min)  # transformers' fill for the cuDNN / efficient kernels
    bias = lambda s, d: torch.full((s, s), 0.5, device=d, dtype=torch.bfloat16)  # noqa: E731
    for make, status, what in ((tril, "fused", "causal"), (full, "fused", "empty"), (additive, "fused", "causal"),
                               (lowest, "fused", "causal"),
                               (band, "fallback", "neither causal"), (bias, "fallback", "values other than 0")):
        a = one_attention(capture(Masked(make).to(torch.bfloat16).eval(), x))
        assert a.info.status == status and what in a.info.reason, (what, a.info.reason)
        if status == "fused":
            # The region's own ops (what a measurement times) get the mask as the model computes it.
            rr, _ = attention.runtime(a)
            q, k, v = (randn(1, 4, 24, 64) for _ in range(3))
            (got,) = rr.subgraph(*rr.subgraph_args([q, k, v], []))
            want = F.scaled_dot_product_attention(q, k, v, is_causal=a.causal)
            assert (got.float() - want.float()).abs().max().item() < 2e-2


def test_what_falls_back_says_why():
    x = randn(2, 32, 256)
    m = SelfAttention().to(torch.bfloat16).eval()
    pad = torch.ones(2, 1, 32, 32, dtype=torch.bool)
    a = one_attention(capture(m, x, pad))
    assert a.info.status == "fallback" and "depends on" in a.info.reason and "runtime input" in a.info.reason
    # Dropout (on the CPU torch decomposes it into the math ops; an SDPA op that keeps it falls back).
    cap = capture(SelfAttention(dropout_p=0.1).to(torch.bfloat16).eval(), x)
    assert all(a.info.status == "fallback" and "dropout_p = 0.1" in a.info.reason for a in cap.attentions)

    class Grouped(torch.nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    q, kv = randn(1, 8, 32, 64), randn(1, 2, 32, 64)
    a = one_attention(capture(Grouped(), q, kv, kv.clone()))
    assert a.info.status == "fallback" and ("grouped-query" in a.info.reason or "enable_gqa" in a.info.reason)
    a = one_attention(capture(Grouped(), q.float(), kv.float(), kv.float()))
    assert a.info.status == "fallback"
