"""Attention written out (transformers' eager attention, hand-written modules): bmm, scale,
mask, softmax, bmm become the SDPA op they compute (eager_attention.py) and so one batched B2B
kernel where attention.py takes it; where no kernel takes them, the model's own ops stay as it
wrote them (CPU)."""
import math

import pytest
import torch
import torch.nn.functional as F

import comfuse
from comfuse.capture import capture

from conftest import randn


class WrittenOut(torch.nn.Module):
    """q, k, v projections viewed [B, H, S, D] (k and v with kv_heads, repeated as repeat_kv does),
    scores scaled by a mul, a div or not at all (q pre-scaled), an optional additive mask, the
    softmax in f32 or in the model's dtype, the heads merged back. `weights`: the probabilities
    are returned too (output_attentions): no chain."""

    def __init__(self, width=128, heads=4, kv_heads=4, scale="mul", softmax_f32=True, weights=False):
        super().__init__()
        self.h, self.kvh, self.d = heads, kv_heads, width // heads
        self.q = torch.nn.Linear(width, width, bias=False)
        self.k = torch.nn.Linear(width, kv_heads * self.d, bias=False)
        self.v = torch.nn.Linear(width, kv_heads * self.d, bias=False)
        self.scale, self.softmax_f32, self.weights = scale, softmax_f32, weights

    def forward(self, x, mask=None):
        b, s, w = x.shape
        q = self.q(x).view(b, s, self.h, self.d).transpose(1, 2)
        k = self.k(x).view(b, s, self.kvh, self.d).transpose(1, 2)
        v = self.v(x).view(b, s, self.kvh, self.d).transpose(1, 2)
        if self.kvh != self.h:  # transformers' repeat_kv
            r = self.h // self.kvh
            k = k[:, :, None].expand(b, self.kvh, r, s, self.d).reshape(b, self.h, s, self.d)
            v = v[:, :, None].expand(b, self.kvh, r, s, self.d).reshape(b, self.h, s, self.d)
        if self.scale == "none":
            q = q * (self.d ** -0.5)
        scores = q @ k.transpose(-2, -1)
        if self.scale == "mul":
            scores = scores * (self.d ** -0.5)
        elif self.scale == "div":
            scores = scores / math.sqrt(self.d)
        if mask is not None:
            # A padding mask [B, N] viewed to [B, 1, 1, N] here (BERT's extended mask), or 4-D already.
            scores = scores + (mask.view(b, 1, 1, s) if mask.dim() == 2 else mask)
        p = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) if self.softmax_f32 else scores.softmax(-1)
        o = (p @ v).transpose(1, 2).reshape(b, s, w)
        return (o, p) if self.weights else o


def _module(**kw):
    torch.manual_seed(0)
    return WrittenOut(**kw).to(torch.bfloat16).eval()


@pytest.mark.parametrize("kw", [dict(), dict(scale="div"), dict(scale="none"), dict(softmax_f32=False),
                                dict(kv_heads=2)], ids=["mul", "div", "prescaled", "bf16_softmax", "grouped"])
def test_written_out_attention_is_one_sdpa_candidate(kw):
    model = _module(**kw)
    cap = capture(model, randn(2, 24, 128))
    assert len(cap.attentions) == 1, [a.info.root for a in cap.attentions]
    c = cap.attentions[0]
    assert c.chain is not None and c.info.reason.startswith("attention written out"), c.info.reason
    assert c.info.status != "fallback", c.info.reason
    assert c.scale == pytest.approx(1.0 if kw.get("scale") == "none" else (128 // 4) ** -0.5)
    scaled = {"mul": ["mul"], "div": ["div"], "none": []}[kw.get("scale", "mul")]
    assert [op.split(":")[-1].split(" ")[0] for op in c.info.ops[1:]] == ["bmm"] + scaled + ["_softmax", "bmm"]
    if kw.get("kv_heads"):
        assert c.group == 2  # repeat_kv's copy skipped: each key read once for its group


@pytest.mark.parametrize("padding", [False, True])
def test_mask_is_recognized_or_an_operand(padding):
    model = _module()
    if padding:  # a view of it in the graph: the scores are told from the mask by their bmm
        mask = torch.zeros(2, 24, dtype=torch.bfloat16)
        mask[1, 20:] = torch.finfo(torch.bfloat16).min
    else:
        mask = torch.full((1, 1, 24, 24), float("-inf")).triu(1).to(torch.bfloat16)
    cap = capture(model, randn(2, 24, 128), mask)
    c = cap.attentions[0]
    assert c.chain is not None and c.mask is not None
    assert c.mask_operand or c.causal, c.info.reason


@pytest.mark.parametrize("rest", ["eager", "inductor"])
def test_forced_chain_runs_through_the_custom_op_and_matches_eager(rest):
    comfuse.config.force_regions = True  # the custom op's fallback (SDPA) on the CPU
    comfuse.config.rest = rest
    model = _module(kv_heads=2)
    x = randn(2, 24, 128)
    with torch.no_grad(), comfuse.collecting() as rep:
        ref = model(x)
        out = torch.compile(model, backend="comfuse")(x)
    att = [r for r in rep.regions if r.layout == "attention"]
    assert len(att) == 1 and att[0].calls == 1, [(r.root, r.status, r.reason) for r in rep.regions]
    assert ((out.float() - ref.float()).norm() / ref.float().norm()).item() < 2e-2


def test_no_kernel_leaves_the_models_ops(monkeypatch):
    """On the CPU nothing fuses: the rewritten graph (what the rest of the model compiles from)
    has the chain as written and no SDPA op."""
    from comfuse import backend

    comfuse.config.rest = "eager"
    seen = []
    rest = backend._compile_rest
    monkeypatch.setattr(backend, "_compile_rest", lambda gm, *a: seen.append(gm) or rest(gm, *a))
    model = _module()
    x = randn(2, 24, 128)
    with torch.no_grad():
        ref = model(x)
        out = torch.compile(model, backend="comfuse")(x)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    targets = {n.target for g in seen for n in g.graph.nodes}
    assert seen and torch.ops.aten.bmm.default in targets
    assert torch.ops.aten.scaled_dot_product_attention.default not in targets


def test_probabilities_used_elsewhere_are_no_chain():
    cap = capture(_module(weights=True), randn(2, 24, 128))
    assert not cap.attentions


class Chained(torch.nn.Module):
    """Two attentions written out, the second reading the first's output as its q, and the result
    viewed in a way only the chain's contiguous [B, H, S, D] layout allows (view, not reshape)."""

    def forward(self, x, y, z):
        def att(q, k, v):
            return torch.softmax(q @ k.transpose(-2, -1) * 0.25, dim=-1) @ v

        # Heads split from [B, S, H, D], as from a projection: SDPA's O would have that layout too.
        q, k, v = (t.transpose(1, 2) for t in (x, y, z))
        o1 = att(q, k, v)
        return o1.view(-1, o1.shape[-2], o1.shape[-1]), att(o1, k, v)


@pytest.mark.parametrize("rest", ["eager", "inductor"])
def test_chained_attentions_keep_the_chains_layout(rest):
    """The kernel's O takes the chain's layout (what follows was traced on it: a flatten, the
    graph's output), and an attention reading another's output reads the kernel's."""
    comfuse.config.force_regions = True
    comfuse.config.rest = rest
    q, k, v = (randn(2, 16, 4, 16, seed=s) for s in (1, 2, 3))
    model = Chained()
    with torch.no_grad(), comfuse.collecting() as rep:
        ref = model(q, k, v)
        out = torch.compile(model, backend="comfuse")(q, k, v)
    att = [r for r in rep.regions if r.layout == "attention"]
    assert len(att) == 2 and all(r.calls == 1 for r in att), [(r.root, r.status, r.reason) for r in rep.regions]
    for o, r in zip(out, ref):
        assert o.shape == r.shape and o.stride() == r.stride()
        assert ((o.float() - r.float()).norm() / r.float().norm()).item() < 2e-2
