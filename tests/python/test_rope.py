"""Rotary position embeddings (RoPE, transformers' apply_rotary_pos_emb with rotate_half) fused into
the q/k projection's region (segments.py): the slices, neg and cat of rotate_half become one
Graph.rotate_half over each head's D columns, cos and sin [B, 1, S, D] (or [B, S, 1, D] before the
transpose, [S, D], [1, 1, S, D] broadcast over the batch) an [M, D] input read periodically
(role "ptile"), a vector at one token. The interleaved layout (GPT-J's rotate_every_two, Cohere's
rotate_half: stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2)) likewise becomes one
Graph.rotate_pairs: its slices, neg, stack and the view that flattens it. Checked here on the CPU:
the translated graph against the region's aten ops in fp64 (graph executor and Φ's Fusion Spec
executor) at ragged sizes, with and without bias, after Qwen 3's per-head RMSNorm and Cohere's
per-head LayerNorm (its weight [H, D]), with one head; the compiled module against eager with the
kernel emulated (the custom op's [M, D] rows of cos and sin, the transposed output's strides); and
what stays out of the region with the reason (partial rotary, other slices, steps, orders or signs,
other cats and stacks)."""
import pytest
import torch
import torch.nn as nn

from comfuse.capture import capture

from conftest import close, compile_vs_eager, randn
from test_runtime_glue import emulate  # noqa: F401 (the fixture: kernels emulated on the CPU)
from test_segments import check_fp64, qwen3_norm


def rotate_half(x):
    """transformers' rotate_half."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rotate_pairs(x):
    """transformers' Cohere rotate_half (GPT-J's rotate_every_two): the interleaved pairs."""
    x1 = x[..., ::2]
    x2 = x[..., 1::2]
    return torch.stack([-x2, x1], dim=-1).flatten(-2)


def apply_rope(q, cos, sin, unsqueeze_dim=1, rotate=rotate_half):
    """transformers' apply_rotary_pos_emb for one tensor."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return (q * cos) + (rotate(q) * sin)


def cohere_norm(x, w, eps=1e-5):
    """CohereLayerNorm.forward as transformers writes it (its q/k norm: w [H, D], no bias)."""
    dtype = x.dtype
    x = x.to(torch.float32)
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).pow(2).mean(-1, keepdim=True)
    x = (x - mean) * torch.rsqrt(var + eps)
    return (w.to(torch.float32) * x).to(dtype)


class RoPE(nn.Module):
    """q = q_proj(x).view(B, S, H, D) [-> per-head norm] -> transpose(1, 2) -> RoPE (Llama, Qwen 2,
    Qwen 3 as transformers writes them). `where`: "after" the transpose (cos [B, S, D] unsqueezed
    at 1), "before" it (unsqueezed at 2, then transposed), "shared" (cos [1, 1, S, D] or [S, D] as
    given, broadcast over the batch), "f32" (in float32, as Cohere computes it, then cast back).
    `norm`: True (Qwen 3's RMSNorm, weight [D]) or "cohere" (Cohere's LayerNorm, weight [H, D]);
    `interleaved`: the pairs' rotation (GPT-J's, Cohere's) in place of rotate_half."""

    def __init__(self, k=72, heads=4, d=64, bias=False, norm=False, where="after", interleaved=False):
        super().__init__()
        self.proj = nn.Linear(k, heads * d, bias=bias)
        self.weight = nn.Parameter(torch.ones(heads, d) if norm == "cohere" else torch.ones(d)) if norm else None
        self.norm = cohere_norm if norm == "cohere" else qwen3_norm
        self.d, self.where = d, where
        self.rotate = rotate_pairs if interleaved else rotate_half

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q = self.proj(x).view(b, s, -1, self.d)
        if self.weight is not None:
            q = self.norm(q, self.weight)
        if self.where == "before":
            return apply_rope(q, cos, sin, unsqueeze_dim=2, rotate=self.rotate).transpose(1, 2)
        q = q.transpose(1, 2)
        if self.where == "shared":
            return q * cos + self.rotate(q) * sin
        if self.where == "f32":
            return apply_rope(q.float(), cos.float(), sin.float(), rotate=self.rotate).to(x.dtype)
        return apply_rope(q, cos, sin, rotate=self.rotate)


def _model(seed=0, **kw):
    m = RoPE(**kw).to(torch.bfloat16).eval()
    with torch.no_grad():  # random, nonzero weights
        m.proj.weight.copy_(randn(*m.proj.weight.shape, scale=0.2, seed=seed + 11))
        if m.weight is not None:
            m.weight.copy_(randn(*m.weight.shape, offset=0.5, scale=0.3, seed=seed + 12))
        if m.proj.bias is not None:
            m.proj.bias.copy_(randn(*m.proj.bias.shape, offset=0.2, seed=seed + 13))
    return m


def _inputs(b, s, d=64, k=72, cos_shape=None, seed=7):
    """x [B, S, K] and random cos, sin [B, S, D] (or cos_shape): random, not the model's tables,
    so a column read from the wrong half or head would show."""
    shape = cos_shape or (b, s, d)
    return (randn(b, s, k, offset=0.1, seed=seed), randn(*shape, seed=seed + 1), randn(*shape, seed=seed + 2))


CASES = {  # name: (RoPE arguments, (B, S), cos/sin shape or None: [B, S, D], the roles cos/sin take)
    "llama": (dict(), (2, 7), None, "ptile"),
    "bias": (dict(bias=True, d=32, heads=5), (3, 5), None, "ptile"),
    "qwen3_norm": (dict(norm=True), (1, 7), None, "ptile"),
    "qwen3_norm_bias": (dict(norm=True, bias=True, d=32, heads=5), (2, 7), None, "ptile"),
    "before_transpose": (dict(where="before"), (2, 7), None, "ptile"),
    "shared_over_batch": (dict(where="shared"), (3, 7), (1, 1, 7, 64), "ptile"),
    "shared_2d": (dict(where="shared"), (2, 5), (5, 64), "ptile"),
    "decode_batch": (dict(), (5, 1), None, "ptile"),
    "decode_one_token": (dict(), (1, 1), None, "vec"),
    "f32": (dict(where="f32"), (2, 7), None, "ptile"),
    # The interleaved pairs (GPT-J's layout: before the transpose; Cohere's: its per-head LayerNorm
    # with a weight [H, D], then in float32 after the transpose).
    "pairs": (dict(interleaved=True), (2, 7), None, "ptile"),
    "pairs_bias": (dict(interleaved=True, bias=True, d=32, heads=5), (3, 5), None, "ptile"),
    "pairs_qwen3_norm": (dict(interleaved=True, norm=True), (1, 7), None, "ptile"),
    "pairs_cohere": (dict(interleaved=True, norm="cohere", where="f32"), (2, 7), None, "ptile"),
    "pairs_cohere_bias": (dict(interleaved=True, norm="cohere", where="f32", bias=True, heads=3), (2, 5), None,
                          "ptile"),
    "pairs_gptj": (dict(interleaved=True, where="before"), (2, 7), None, "ptile"),
    "pairs_shared_over_batch": (dict(interleaved=True, where="shared"), (3, 7), (1, 1, 7, 64), "ptile"),
    "pairs_decode_one_token": (dict(interleaved=True), (1, 1), None, "vec"),
}


def _kinds(tr) -> list[str]:
    """The kinds of the translated graph's nodes."""
    return [tr.g.node(i)["kind"] for i in range(len(tr.g))]


@pytest.mark.parametrize("case", sorted(CASES))
def test_rope_translates_into_the_projection_and_matches_torch_fp64(case):
    kw, (b, s), cos_shape, role = CASES[case]
    model = _model(**kw)
    d = model.d
    cap = capture(model, *_inputs(b, s, d, cos_shape=cos_shape))
    c = cap.by_root("proj")
    assert c.translator is not None, c.info.reason
    # The whole RoPE is in the region: nothing consumes its values outside but the output.
    assert not c.info.excluded, [(e.node, e.reason) for e in c.info.excluded]
    tr = c.translator
    text = tr.g.text()
    kind, other, join = ("rotate_pairs", "rotate_half", "stack") if kw.get("interleaved") else \
        ("rotate_half", "rotate_pairs", "cat")
    rot = [line for line in text.splitlines() if f"= {kind}(" in line]
    assert len(rot) == 1 and f"segment={d}" in rot[0], text  # one op for slice, slice, neg and cat (or stack, view)
    assert _kinds(tr).count(kind) == 1 and other not in _kinds(tr), text
    assert {"slice", "neg", join} <= {op.split(":")[-1].split(" ")[0] for op in c.info.ops}, c.info.ops
    if kw.get("norm") == "cohere":  # its weight [H, D]: a row of N, the same for every row
        rows = [n.name for n, r in zip(tr.inputs, tr.input_roles) if r == "row"]
        assert len(rows) == 1 + bool(kw.get("bias")), (rows, tr.input_roles)  # and the bias
    # cos and sin: two inputs of one row of D per GEMM row (one D-vector at one token).
    assert tr.input_roles.count(role) == 2, tr.input_roles
    assert all(s == ["M", d] for s, r in zip(tr.input_shapes, tr.input_roles) if r == "ptile"), tr.input_shapes
    assert tr.output_classes == ["tile"]
    assert tr.output_perms == [(-3, -2)], tr.output_perms  # stored as [M, N], transposed after the op
    check_fp64(c, cap.values)


@pytest.mark.parametrize("cos_batch,interleaved", [(2, False), (1, False), (2, True), (1, True)])
def test_one_head_rotates_its_whole_row(cos_batch, interleaved):
    """A projection of one head (a k_proj with one key head, Qwen 2's and Mistral's at these
    widths): [B, S, 1, D] transposed is the same rows; rotate_half (or rotate_pairs) over all N
    columns, cos and sin [M, N] tiles (expanded over the batch where transformers' position ids are
    one sequence's, [1, S, D])."""
    model = _model(heads=1, interleaved=interleaved)
    cap = capture(model, *_inputs(2, 7, cos_shape=(cos_batch, 7, 64)))
    c = cap.by_root("proj")
    assert c.translator is not None and not c.info.excluded, (c.info.reason, c.info.excluded)
    text = c.translator.g.text()
    kind = "rotate_pairs" if interleaved else "rotate_half"
    assert f"= {kind}(" in text and "segment=64" in text and _kinds(c.translator).count(kind) == 1, text
    assert c.translator.input_roles.count("tile") == 2, c.translator.input_roles
    assert c.translator.output_perms == [None]  # a transpose of a dim of one: the same rows
    check_fp64(c, cap.values)


@pytest.mark.parametrize("cos_batch,interleaved", [(3, False), (1, False), (1, True)])
def test_one_head_compiled_matches_eager_with_the_kernel_emulated(emulate, cos_batch, interleaved):
    model = _model(heads=1, interleaved=interleaved)
    out, ref, rep = compile_vs_eager(model, *_inputs(3, 5, cos_shape=(cos_batch, 5, 64), seed=4))
    close(out, ref)
    (r,) = [r for r in rep.regions if "proj" in r.root]
    assert r.calls == 1 and r.fallback_calls == 0, (r.status, r.reason, r.runtime_fallback)
    assert ("stack" if interleaved else "cat") in {op.split(":")[-1].split(" ")[0] for op in r.ops}, r.ops


@pytest.mark.parametrize("case,dynamic", [("llama", False), ("bias", False), ("qwen3_norm", False),
                                          ("before_transpose", False), ("shared_over_batch", False),
                                          ("decode_one_token", False), ("f32", False), ("llama", True),
                                          ("qwen3_norm", True), ("pairs", False), ("pairs_cohere_bias", False),
                                          ("pairs_cohere", False), ("pairs_gptj", False),
                                          ("pairs_shared_over_batch", False), ("pairs_decode_one_token", False),
                                          ("pairs", True), ("pairs_cohere", True)])
def test_rope_compiled_matches_eager_with_the_kernel_emulated(emulate, case, dynamic):
    """The run-time path: cos and sin reach the custom op as the model has them and become the
    kernel's [M, D] rows (copied where they broadcast over the batch); the output has eager's shape
    and strides (the transpose of the heads after the op)."""
    kw, (b, s), cos_shape, _ = CASES[case]
    model = _model(**kw)
    out, ref, rep = compile_vs_eager(model, *_inputs(b, s, model.d, cos_shape=cos_shape, seed=3), dynamic=dynamic)
    close(out, ref)
    # Eager's strides (a dim of one element may have any)
    assert out.shape == ref.shape and all(a == b or n == 1 for a, b, n in zip(out.stride(), ref.stride(), out.shape))
    (r,) = [r for r in rep.regions if "proj" in r.root]
    assert r.calls == 1 and r.fallback_calls == 0, (r.status, r.reason, r.runtime_fallback)
    assert ("stack" if kw.get("interleaved") else "cat") in {op.split(":")[-1].split(" ")[0] for op in r.ops}, r.ops
    kind = "rotate_pairs" if kw.get("interleaved") else "rotate_half"
    assert r.graph_text.count(f"= {kind}(") == 1, r.graph_text


def test_ptile_rows_view_in_gemm_row_order():
    """segments.ptile_rows: the [M, D] rows of cos in the GEMM's row order, a view where the layout
    allows (transformers' [B, S, D] unsqueezed), the batch broadcast expanded."""
    from comfuse.segments import ptile_rows

    b, s, d = 3, 5, 8
    cos = torch.randn(b, s, d)
    rows = ptile_rows(cos.unsqueeze(1), b * s, (4, (-3, -2), True, None))
    assert rows.data_ptr() == cos.data_ptr() and torch.equal(rows, cos.reshape(b * s, d))
    rows = ptile_rows(cos.unsqueeze(2), b * s, (4, None, True, None))  # before the transpose: [B, S, 1, D]
    assert torch.equal(rows, cos.reshape(b * s, d))
    shared = torch.randn(1, 1, s, d)
    rows = ptile_rows(shared, b * s, (4, (-3, -2), True, -4))
    assert torch.equal(rows, shared.reshape(s, d).repeat(b, 1))
    rows = ptile_rows(shared[0, 0], b * s, (4, (-3, -2), True, -4))  # [S, D]
    assert torch.equal(rows, shared.reshape(s, d).repeat(b, 1))


class Refused(nn.Module):
    def __init__(self, f, k=72, heads=4, d=64):
        super().__init__()
        self.proj = nn.Linear(k, heads * d, bias=False)
        self.d, self.f = d, f

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        return self.f(self.proj(x).view(b, s, -1, self.d).transpose(1, 2), cos.unsqueeze(1), sin.unsqueeze(1))


def _partial(q, cos, sin, rot):
    """Partial rotary (Phi, GPT-NeoX, StableLM): the first `rot` columns of each head rotate."""
    q_rot, q_pass = q[..., :rot], q[..., rot:]
    q_rot = q_rot * cos[..., :rot] + rotate_half(q_rot) * sin[..., :rot]
    return torch.cat((q_rot, q_pass), dim=-1)


def _pairs(q, cos, sin, x1=slice(0, None, 2), x2=slice(1, None, 2), sign=(-1, 1), dim=-1):
    """The interleaved rotation (GPT-J's rotate_every_two) with its slices, signs or stack's dim
    changed (refused: no rotation of pairs)."""
    a, b = q[..., x2], q[..., x1]
    a, b = (-a if sign[0] < 0 else a), (-b if sign[1] < 0 else b)
    return q * cos + torch.stack((a, b), dim=dim).flatten(-2) * sin


def _pairs_partial(q, cos, sin, rot=32):
    """GPT-J's partial rotary (rotary_dim below the head's width): its first `rot` columns' pairs."""
    q_rot, q_pass = q[..., :rot], q[..., rot:]
    q_rot = q_rot * cos[..., :rot] + rotate_pairs(q_rot) * sin[..., :rot]
    return torch.cat((q_rot, q_pass), dim=-1)


def _pairs_partial_step(q, cos, sin, rot=32):
    """The pairs of the first `rot` columns sliced from the head with a step: x[..., 0:rot:2]."""
    x1, x2 = q[..., 0:rot:2], q[..., 1:rot:2]
    q_rot = torch.stack((-x2, x1), dim=-1).flatten(-2) * sin[..., :rot]
    return torch.cat((q_rot, q[..., rot:]), dim=-1) + q * cos


def _pairs_as_cat(q, cos, sin):
    """The pairs joined by unsqueeze and cat in place of stack (the same values)."""
    x1, x2 = q[..., ::2], q[..., 1::2]
    return q * cos + torch.cat(((-x2).unsqueeze(-1), x1.unsqueeze(-1)), -1).flatten(-2) * sin


def _shared_half(q, cos, sin):
    """rotate_half's x1 also used on its own."""
    x1, x2 = q[..., :32], q[..., 32:]
    return q * cos + torch.cat((-x2, x1), -1) * sin, x1 * 2


REFUSED = {
    # name: (f(q, cos, sin), the reason's words, the op the region ends before)
    "partial_half": (lambda q, c, s: _partial(q, c, s, 32), "partial rotary", "slice"),  # Phi's factor 0.5
    "partial_quarter": (lambda q, c, s: _partial(q, c, s, 16), "partial rotary", "slice"),  # GPT-NeoX's 0.25
    # The interleaved pairs otherwise than stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2):
    "pairs_odd_first": (lambda q, c, s: _pairs(q, c, s, x1=slice(1, None, 2), x2=slice(0, None, 2)),
                        "another order, sign or dim", "slice"),  # x1 from column 1, x2 from 0
    "pairs_sign": (lambda q, c, s: _pairs(q, c, s, sign=(1, -1)), "another order, sign or dim", "slice"),
    "pairs_no_neg": (lambda q, c, s: _pairs(q, c, s, sign=(1, 1)), "another order, sign or dim", "slice"),
    "pairs_stack_dim": (lambda q, c, s: _pairs(q, c, s, dim=-2), "another order, sign or dim", "slice"),
    "pairs_partial": (_pairs_partial, "partial rotary", "slice"),  # GPT-J's rotary_dim 32 of 64
    "pairs_partial_step": (_pairs_partial_step, "partial rotary", "slice"),
    "pairs_step_4": (lambda q, c, s: q * c + torch.cat([q[..., ::4]] * 4, -1) * s, "step 4", "slice"),
    "pairs_as_cat": (_pairs_as_cat, "used otherwise", "slice"),
    "stack_of_values": (lambda q, c, s: torch.stack((q, q * c), -1).sum(-1), "stack is outside", "stack"),
    "pairs_unflattened": (lambda q, c, s: q[..., ::2] * c[..., ::2] + torch.stack((-q[..., 1::2], q[..., ::2]), -1)
                          .sum(-1) * s[..., ::2], "flattened back", "slice"),
    "wrong_slice": (lambda q, c, s: q * c + torch.cat((-q[..., 30:], q[..., :30]), -1) * s, "halves [0:32]", "slice"),
    "cat_order": (lambda q, c, s: q * c + torch.cat((q[..., :32], -q[..., 32:]), -1) * s, "another order", "slice"),
    "cat_sign": (lambda q, c, s: q * c + torch.cat((-q[..., :32], q[..., 32:]), -1) * s, "another order", "slice"),
    "halves_used_twice": (_shared_half, "used otherwise", "slice"),
    "cat_of_heads": (lambda q, c, s: torch.cat((q, q * c), -2), "rotate_half", "cat"),
    "row_slice": (lambda q, c, s: q[:, :, 1:] * c[:, :, 1:], "row layout", "slice"),
    "cos_per_head": (lambda q, c, s: q * c.expand(-1, 4, -1, -1).contiguous(), "broadcasts as neither", "mul"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_rope_cannot_take_ends_the_region_with_the_reason(case):
    f, why, op = REFUSED[case]
    model = Refused(f).to(torch.bfloat16).eval()
    cap = capture(model, *_inputs(2, 7))
    c = cap.by_root("proj")
    hits = [e for e in c.info.excluded if why in e.reason]
    assert hits, [(e.node, e.reason) for e in c.info.excluded] + [c.info.reason]
    assert any(op in e.fx_name for e in hits), [(e.fx_name, e.reason) for e in hits]
    assert not any("rotate_half" in line or "rotate_pairs" in line for line in (c.info.graph_text or "").splitlines()
                   if not line.startswith("#")), c.info.graph_text
    if c.translator is not None and len(c.nodes) > 1 and c.translator.outputs:
        check_fp64(c, cap.values)  # what the region kept still computes as torch does


def test_pairs_sliced_odd_columns_first_still_rotate():
    """The interleaved rotation whose odd columns are sliced first (FX order is no part of the
    pattern): one rotate_pairs, the same values as torch."""
    cap = capture(Refused(_pairs).to(torch.bfloat16).eval(), *_inputs(2, 7))
    c = cap.by_root("proj")
    assert c.translator is not None and not c.info.excluded, (c.info.reason, c.info.excluded)
    slices = [n for n in c.nodes if "slice" in n.name]
    assert [n.args[2] for n in slices] == [1, 0], [n.args for n in slices]  # x[..., 1::2] first
    assert _kinds(c.translator).count("rotate_pairs") == 1, c.info.graph_text
    check_fp64(c, cap.values)


def test_per_head_weight_after_the_transpose_is_a_row():
    """Cohere's per-head LayerNorm after the transpose of the heads, its weight [H, 1, D] against
    [B, H, S, D]: one value per head and column, the row [N] of its elements in order (as [H, D]
    before the transpose); then the interleaved RoPE."""
    class Transposed(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(72, 256, bias=False)
            self.weight = nn.Parameter(randn(4, 1, 64, offset=0.5, scale=0.3, seed=5, dtype=torch.float32))

        def forward(self, x, cos, sin):
            b, s, _ = x.shape
            q = cohere_norm(self.proj(x).view(b, s, -1, 64).transpose(1, 2), self.weight)
            return apply_rope(q, cos, sin, rotate=rotate_pairs)

    cap = capture(Transposed().to(torch.bfloat16).eval(), *_inputs(2, 7))
    c = cap.by_root("proj")
    assert c.translator is not None and not c.info.excluded, (c.info.reason, c.info.excluded)
    tr = c.translator
    assert tr.input_roles.count("row") == 1, tr.input_roles
    assert _kinds(tr).count("rotate_pairs") == 1, c.info.graph_text
    check_fp64(c, cap.values)


def test_whole_row_norm_then_rope_ends_before_the_rope():
    """OLMo 2 norms q over the whole projection, then RoPE rotates each head: one kernel reduces
    whole rows or works on runs of one length, so the region keeps the norm and ends before RoPE."""
    class Olmo(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(72, 256, bias=False)
            self.weight = nn.Parameter(torch.ones(256))

        def forward(self, x, cos, sin):
            b, s, _ = x.shape
            q = qwen3_norm(self.proj(x), self.weight).view(b, s, -1, 64).transpose(1, 2)
            return apply_rope(q, cos, sin)

    cap = capture(Olmo().to(torch.bfloat16).eval(), *_inputs(2, 7))
    c = cap.by_root("proj")
    hits = [e for e in c.info.excluded if "reduces whole rows" in e.reason]
    assert hits and c.translator is not None, [(e.node, e.reason) for e in c.info.excluded]
    assert "rsqrt" in c.info.graph_text and "rotate_half" not in c.info.graph_text
    check_fp64(c, cap.values)


def test_cos_broadcast_over_two_row_dims_is_refused():
    """Rows of three dims [B, C, S] and a cos shared by two of them: the kernel's rows of cos are the
    model's tensor viewed, or expanded along one dim only."""
    class Chunks(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(72, 256, bias=False)

        def forward(self, x, cos):
            q = self.proj(x).view(*x.shape[:-1], 4, 64).transpose(-3, -2)  # [B, C, H, S, D]
            return q * cos  # cos [1, 1, 1, S, D]

    x, cos = randn(2, 3, 7, 72, seed=1), randn(1, 1, 1, 7, 64, seed=2)
    cap = capture(Chunks().to(torch.bfloat16).eval(), x, cos)
    c = cap.by_root("proj")
    hits = [e for e in c.info.excluded if "2 of the rows' dims" in e.reason]
    assert hits and "mul" in hits[0].fx_name, [(e.node, e.reason) for e in c.info.excluded]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_llama_and_qwen3_prefill_and_decode_with_rope_fused(emulate, arch, monkeypatch):
    """Llama's and Qwen 3's (small widths, bench/models.py) prefill and a StaticCache decode step
    with the single-GEMM kernels emulated (attention unfused: its kernel is not emulated): q_proj
    and k_proj run with their RoPE (after Qwen 3's per-head norms) in every layer, k's rotated
    value going on to the cache update at decode (a region output; the cache is updated in place
    outside the region), and the logits match eager."""
    pytest.importorskip("transformers")
    import bench_models
    import comfuse
    from comfuse import attention

    monkeypatch.setattr(attention, "find", lambda gm, next_id: [])

    def rope_regions(rep):
        rs = [r for r in rep.regions if r.root.split(":")[0].endswith(("q_proj", "k_proj"))]
        assert len(rs) == 4 and all(r.calls and r.fallback_calls == 0 for r in rs), str(rep)  # two layers
        for r in rs:
            assert r.graph_text.count("= rotate_half(") == 1, (r.root, r.graph_text)
        return rs

    mod, model, ids, rep = bench_models.compiled_prefill_matches_eager(arch, seq=7, rel=2e-2)
    rope_regions(rep)

    torch._dynamo.reset()
    cache = mod.static_cache(model, ids, 16)
    tok, pos = ids[:, -1:].contiguous(), torch.tensor([ids.shape[1]])
    dec = mod.Decode(model, cache)
    with torch.no_grad():
        mod.prefill_cache(model, cache, ids)
        ref = dec(tok, pos)
        mod.prefill_cache(model, cache, ids)
        with comfuse.collecting() as rep:
            out = torch.compile(dec, backend="comfuse")(tok, pos)
    assert mod.rel_err(out, ref) < 2e-2
    for r in rope_regions(rep):  # one token a sequence, one position: cos and sin one vector of D each
        assert "vec" in r.graph_text or "[64]" in r.graph_text, r.graph_text
