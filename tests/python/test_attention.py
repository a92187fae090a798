"""Attention from the frontend (CPU): torch's SDPA ops become one batched B2B kernel each
(attention.py) where the inputs allow, with the model's materialized causal mask recognized,
any other mask (a decode step's, padding, a band, a bias) added by the kernel as an operand
where its expanded bytes stay below K's and V's, and fall back with the reason where they do not
(dropout, grouped-query heads under a causal mask, a prefill's S x S padding mask); under config.force_regions the
custom op's fallback (torch's SDPA into the traced output layout) matches eager. The kernel itself: tests/gpu/test_gpu_b2b.cpp (AttentionOnHeadStridedViews)
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
    """A constant boolean causal mask is causal, an all-true one is no mask, a band or a bias a
    kernel operand (a prefill's S x S one only where S <= D + DV)."""
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
    bias = lambda s, d: torch.full((s, s), 0.5, device=d, dtype=torch.bfloat16).masked_fill(  # noqa: E731
        ~tril(s, d), float("-inf"))
    operand = "a kernel operand: a constant neither causal nor empty"
    for make, what in ((tril, "causal"), (full, "empty"), (additive, "causal"), (lowest, "causal"),
                       (band, operand), (bias, operand)):
        a = one_attention(capture(Masked(make).to(torch.bfloat16).eval(), x))
        assert a.info.status == "fused" and what in a.info.reason, (what, a.info.reason)
        assert a.mask_operand == (what == operand) and ("add(" in a.info.graph_text) == a.mask_operand
        # The region's own ops (what a measurement times) get the mask as the model computes it;
        # the custom op's fallback, the kernel's operands (a mask operand in its additive form).
        rr, _ = attention.runtime(a)
        q, k, v = (randn(1, 4, 24, 64) for _ in range(3))
        args = rr.subgraph_args([q, k, v] + ([randn(24, 24)] if a.mask is not None else []), [])
        (got,) = rr.subgraph(*args)
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=make(24, q.device), is_causal=False)
        assert (got.float() - want.float()).abs().max().item() < 2e-2
        (op,) = rr.fallback(rr.kernel_args(args), [], "test")
        assert (op.float() - want.float()).abs().max().item() < 2e-2
    # A prefill's S x S mask of another pattern, expanded to every head, would outweigh K and V.
    a = one_attention(capture(Masked(band).to(torch.bfloat16).eval(), randn(1, 160, 256)))
    assert a.info.status == "fallback" and "a mask operand fuses at M <= D + DV = 128" in a.info.reason, a.info.reason


def test_additive_mask_operand():
    """A bool mask's False becomes -inf (a row with no key left gives 0, as torch's SDPA); a float
    mask keeps its dtype (an f32 bias on bf16 scores stays exact) and its values, but finite ones
    below MASKED rise to it, whose exp(x - m) the kernel takes without overflow even where a whole
    chunk of a row is masked (x = m: the exponent is the rounding residual of m log2 e), and -inf
    stays; expanded to [B, H, M, N], contiguous."""
    keep = torch.tensor([[True, False, True, False]])
    assert attention.operand_dtype(torch.bool, torch.float16) == torch.float16
    got = attention.additive_mask(keep, torch.bfloat16, (2, 3, 1, 4))
    assert got.shape == (2, 3, 1, 4) and got.is_contiguous() and got.dtype == torch.bfloat16
    assert got[1, 2, 0].tolist() == [0.0, float("-inf"), 0.0, float("-inf")]
    f = torch.tensor([[0.5, float("-inf"), torch.finfo(torch.float32).min, -2.0]])
    assert attention.operand_dtype(f.dtype, torch.bfloat16) == torch.float32
    assert attention.operand_dtype(torch.float64, torch.bfloat16) == torch.float32
    got = attention.additive_mask(f, torch.float32, (1, 1, 1, 4))
    assert got.dtype == torch.float32 and got.flatten().tolist() == [0.5, float("-inf"), -30000.0, -2.0]
    lowest = torch.full((1, 4), torch.finfo(torch.float16).min, dtype=torch.float16)
    assert attention.additive_mask(lowest, torch.float16, (1, 1, 1, 4)).flatten().tolist() == [-30000.0] * 4
    for t in (torch.bfloat16, torch.float16, torch.float32):
        m = torch.tensor(torch.tensor(attention.MASKED, dtype=t).item(), dtype=torch.float32)
        c = torch.tensor(1.4426950408889634, dtype=torch.float32)
        residual = (m.double() * c.double() - (m * c).double()).abs().item()  # fma's exact product - rounded
        assert residual < 0.01
    # The fallback (SDPA on the additive form) as eager on the bool mask: a row with no key gives 0.
    q, k, v = (randn(1, 2, 3, 64).float() for _ in range(3))
    rows = torch.tensor([[True, False, True], [False, False, False], [True, True, True]])
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=rows)
    got = F.scaled_dot_product_attention(q, k, v, attn_mask=attention.additive_mask(rows, q.dtype, (1, 2, 3, 3)))
    assert torch.equal(want[:, :, 1], torch.zeros_like(want[:, :, 1])) and torch.allclose(got, want, atol=1e-6)


def test_runtime_mask_is_a_kernel_operand():
    """A padding mask given at run time: the kernel adds it (one operand, shared by the layers'
    attentions, computed in the graph); under force_regions the model matches eager."""
    comfuse.config.force_regions = True
    comfuse.config.rest = "eager"

    class TwoLayers(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = SelfAttention(), SelfAttention()

        def forward(self, x, pad):
            mask = pad[:, None, None, :]  # [B, 1, 1, S]: keys that exist
            return self.b(self.a(x, mask), mask)

    model = TwoLayers().to(torch.bfloat16).eval()
    x = randn(2, 40, 256)
    pad = torch.ones(2, 40, dtype=torch.bool)
    pad[1, 29:] = False
    cap = capture(model, x, pad)
    assert len(cap.attentions) == 2
    for a in cap.attentions:
        assert a.info.status == "fused" and "it depends on a runtime input" in a.info.reason, a.info.reason
        assert a.mask_operand and "input mask: bf16[B, M, N]" in a.info.graph_text
    with torch.no_grad():
        ref = model(x, pad)
        with comfuse.collecting() as rep:
            out = torch.compile(model, backend="comfuse")(x, pad)
    att = [r for r in rep.regions if r.layout == "attention"]
    assert len(att) == 2 and all(r.status == "fusable" and r.calls == 1 and r.fallback_calls == 1 for r in att), str(rep)
    assert (out.float() - ref.float()).abs().max().item() < 2e-2


def test_unmeasured_mask_operands_fall_back():
    """Where no measurement decides (config.measure off, a capture), an attention whose mask is an
    operand on the wgmma pipeline falls back on the prior (it measured up to 2x SDPA's time at
    decode), unless config.min_gain accepts that; on the decode kernel it fuses (its prior 0.8x);
    causal and unmasked attentions are not affected."""
    x = randn(2, 40, 256)
    pad = torch.ones(2, 1, 40, 40, dtype=torch.bool)
    a = one_attention(capture(SelfAttention().to(torch.bfloat16).eval(), x, pad))
    assert a.mask_operand and "fuses where a measurement says it pays" in attention.unmeasured_fallback(a)
    comfuse.config.min_gain = -1e9  # fuse regardless (a test of the kernel)
    assert attention.unmeasured_fallback(a) == ""
    comfuse.config.min_gain = 0.0
    causal = one_attention(capture(SelfAttention(is_causal=True).to(torch.bfloat16).eval(), x))
    assert attention.unmeasured_fallback(causal) == ""

    class Step(torch.nn.Module):  # a decode step: one query row a head, the mask a runtime input
        def forward(self, q, k, v, keep):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)

    q, kv = randn(2, 4, 1, 64), randn(2, 4, 40, 64)
    keep = torch.arange(40)[None, None, None, :] < torch.tensor([7, 40])[:, None, None, None]
    step = one_attention(capture(Step(), q, kv, kv.clone(), keep))
    assert step.mask_operand and step.decode_kernel, step.info.reason
    assert attention.unmeasured_fallback(step) == ""  # the decode kernel's prior is below 1
    comfuse.config.min_gain = 0.5
    assert "on the decode kernel (the prior" in attention.unmeasured_fallback(step)
    comfuse.config.min_gain = 0.0


def _decode_step(arch: str):
    """One decode step of a small `arch` (2 layers, batch 2) on a StaticCache of 64 after 16 tokens,
    compiled under force_regions with the rest eager: (the report, its output, eager's)."""
    comfuse.config.force_regions = True
    comfuse.config.rest = "eager"
    mod = bench_models.module()
    model, ids = mod.build(arch, layers=2, batch=2, seq=16, device="cpu", small=True)
    step = mod.Decode(model, mod.static_cache(model, ids, max_len=64))
    tok, pos = ids[:, -1:].contiguous(), torch.tensor([16])
    with torch.no_grad():
        ref = step(tok, pos)
        with comfuse.collecting() as rep:
            out = torch.compile(step, backend="comfuse")(tok, pos)
    return rep, out, ref


def test_gpt2_decode_step_attends_through_its_mask():
    """One decode step of GPT-2 on a StaticCache: its mask depends on the cache position (a runtime
    input), so each layer's attention is one kernel with the mask as an operand (M = 1 row a
    head); under force_regions the step matches eager."""
    rep, out, ref = _decode_step("gpt2")
    att = [r for r in rep.regions if r.layout == "attention"]
    assert len(att) == 2, str(rep)
    for r in att:
        assert r.status == "fusable" and "depends on a runtime input" in r.reason, r.reason
        assert r.plan["dims"] == {"B": 8, "M": 1, "N": 64, "K": 64, "DV": 64}
        assert r.calls == 1 and r.fallback_calls == 1
    assert bench_models.module().rel_err(out, ref) < 1e-2


def test_llama_decode_step_groups_its_heads():
    """One decode step of a Llama (grouped-query: 4 heads over 2 of k and v) on a StaticCache: each
    attention reads k and v through repeat_kv's copy, so the kernel takes the copy's sources and a
    group's heads as one batch's rows (B = batch x 2, M = 2); under force_regions the step matches
    eager through the op's fallback (SDPA with enable_gqa on the same operands)."""
    rep, out, ref = _decode_step("llama")
    att = [r for r in rep.regions if r.layout == "attention"]
    assert len(att) == 2, str(rep)
    for r in att:
        assert r.status == "fusable", r.reason
        assert r.plan["dims"] == {"B": 4, "M": 2, "N": 64, "K": 64, "DV": 64}, r.plan
        assert r.calls == 1 and r.fallback_calls == 1
    assert bench_models.module().rel_err(out, ref) < 1e-2


@pytest.mark.parametrize("m,contiguous", [(1, False), (3, True), (3, False)])
def test_group_view_puts_a_groups_heads_in_rows(m, contiguous):
    """group_view: [B, H, M, X] as [B, H / G, G x M, X], row g x M + i the head kv x G + g's row i
    (the heads of a group contiguous, as repeat_kv lays them out); a copy where the strides allow no
    view (rows of [B, M, H, X] storage, M > 1)."""
    t = randn(2, 6, m, 8) if contiguous else randn(2, m, 6, 8).transpose(1, 2)
    gv = attention.group_view(t, 3)
    assert gv.shape == (2, 2, 3 * m, 8)
    for kv in range(2):
        for g in range(3):
            assert torch.equal(gv[:, kv, g * m:(g + 1) * m], t[:, kv * 3 + g])
    assert (gv.data_ptr() == t.data_ptr()) == (m == 1 or contiguous)


def test_grouped_sdpa_is_one_kernel():
    """SDPA's enable_gqa (k and v with fewer heads) without a causal mask: the group's heads as one
    batch's rows; with is_causal it falls back (the rows would shift the mask)."""

    class Grouped(torch.nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    q, kv = randn(1, 8, 2, 64), randn(1, 2, 32, 64)
    a = one_attention(capture(Grouped(), q, kv, kv.clone()))
    assert a.info.status == "fused", a.info.reason
    assert a.dims == {"B": 2, "M": 8, "N": 32, "K": 64, "DV": 64} and a.group == 4
    assert "1 x 8 heads, grouped-query: 4 heads a group of k and v" in a.info.reason, a.info.reason

    class GroupedCausalMask(torch.nn.Module):  # a constant mask that is causal: recognized, so no grouping
        def forward(self, q, k, v):
            causal = torch.ones(32, 32, dtype=torch.bool).tril()
            return F.scaled_dot_product_attention(q, k, v, attn_mask=causal, enable_gqa=True)

    q = randn(1, 8, 32, 64)
    a = one_attention(capture(GroupedCausalMask(), q, kv, kv.clone()))
    assert a.info.status == "fallback" and "under a causal mask" in a.info.reason, a.info.reason


def test_llama_prefill_keeps_repeat_kv_under_its_causal_mask():
    """A Llama prefill: its mask is recognized as causal, so the attention reads repeat_kv's copy
    with q's heads (no grouping, which would shift the causal rows) and matches eager."""
    comfuse.config.force_regions = True
    comfuse.config.rest = "eager"
    mod = bench_models.module()
    model, ids = mod.build("llama", layers=1, batch=2, seq=32, device="cpu", small=True)
    with torch.no_grad():
        ref = model(ids).logits
        with comfuse.collecting() as rep:
            out = torch.compile(model, backend="comfuse")(ids).logits
    att = [r for r in rep.regions if r.layout == "attention"]
    assert len(att) == 1 and "causal" in att[0].reason and "grouped-query" not in att[0].reason, str(rep)
    assert att[0].plan["dims"] == {"B": 8, "M": 32, "N": 32, "K": 64, "DV": 64}, att[0].plan
    assert mod.rel_err(out, ref) < 1e-2


def test_what_falls_back_says_why():
    x = randn(2, 160, 256)
    m = SelfAttention().to(torch.bfloat16).eval()
    pad = torch.ones(2, 1, 160, 160, dtype=torch.bool)  # a prefill's padding mask: [B, 1, S, S]
    a = one_attention(capture(m, x, pad))
    assert a.info.status == "fallback" and "depends on a runtime input" in a.info.reason, a.info.reason
    assert "M x N = 160 x 160 values a head, more than K and V (160 x 128)" in a.info.reason
    x = randn(2, 32, 256)
    # Dropout (on the CPU torch decomposes it into the math ops; an SDPA op that keeps it falls back).
    cap = capture(SelfAttention(dropout_p=0.1).to(torch.bfloat16).eval(), x)
    assert all(a.info.status == "fallback" and "dropout_p = 0.1" in a.info.reason for a in cap.attentions)

    class Grouped(torch.nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    q, kv = randn(1, 8, 32, 64), randn(1, 2, 32, 64)
    a = one_attention(capture(Grouped(), q, kv, kv.clone()))
    assert a.info.status == "fallback" and "fewer heads than q (enable_gqa) under a causal mask" in a.info.reason
    a = one_attention(capture(Grouped(), q.float(), kv.float(), kv.float()))
    assert a.info.status == "fallback"
