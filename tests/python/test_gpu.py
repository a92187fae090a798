"""GPU tests (an sm_90 GPU; each skips with the reason elsewhere): fused regions run their
ComFuse kernel (config.strict: a kernel error fails the test instead of falling back), results
against the same module in float32, shape classes, CUDA graphs, tensor checks, real models."""
import pytest
import torch

import comfuse
from comfuse.kernels import CACHE

from conftest import randn, replay_in_user_graph
import modules as M


def reference_f32(model, *inputs):
    """The module in float32 on the same bf16 weights and inputs (a finer reference than bf16 eager)."""
    import copy

    ref = copy.deepcopy(model).float()
    with torch.no_grad():
        out = ref(*[x.float() if x.is_floating_point() else x for x in inputs])
    return out


def assert_bf16_close(out, ref, rel=2e-2):
    if isinstance(out, (tuple, list)):
        for o, r in zip(out, ref):
            assert_bf16_close(o, r, rel)
        return
    o, r = out.float(), ref.float()
    err = ((o - r).norm() / r.norm()).item()
    assert err < rel, f"relative L2 error {err:.3g} >= {rel}"
    assert torch.isfinite(o).all()


def compiled_run(model, *inputs, mode=None, dynamic=None, rest="eager", always_fuse=True):
    comfuse.config.strict = True
    comfuse.config.rest = rest
    if always_fuse:  # the kernel is under test, not the planner's decision
        comfuse.config.min_gain = -1e9
    f = torch.compile(model, backend="comfuse", mode=mode, dynamic=dynamic)
    with torch.no_grad(), comfuse.collecting() as rep:
        out = f(*inputs)
        torch.cuda.synchronize()
    return out, rep


def fused_region(rep, root):
    rs = [r for r in rep.regions if root in r.root]
    assert len(rs) == 1, [(r.root, r.status, r.reason) for r in rep.regions]
    r = rs[0]
    assert r.status == "fused", r.reason
    assert r.calls >= 1 and r.fallback_calls == 0, r.runtime_fallback
    return r


CASES = {
    "bias_gelu": (lambda: M.LinearGelu(1024, 4096), "proj"),
    "bias_gelu_tanh": (lambda: M.LinearGelu(1024, 2048, "tanh"), "proj"),
    "layer_norm": (lambda: M.LinearLayerNorm(1024, 4096), "proj"),
    "softmax": (lambda: M.LinearSoftmax(1024, 4096), "proj"),
    "log_softmax_f32": (lambda: M.LinearLogSoftmax(1024, 2048), "proj"),
    "rms_norm": (lambda: M.LinearRMSNorm(1024, 4096), "proj"),
    "gpt2_mlp": (lambda: M.GPT2MLP(1024, 4096), "c_fc"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_module_runs_fused(gpu, case):
    make, root = CASES[case]
    model = make().to(torch.bfloat16).to(gpu).eval()
    x = randn(4, 512, 1024, device=gpu, seed=3)
    out, rep = compiled_run(model, x)
    r = fused_region(rep, root)
    assert r.compiles and r.compiles[0]["seconds"] > 0  # cold compile time is recorded
    assert_bf16_close(out, reference_f32(model, x))


@pytest.mark.parametrize("b2b", ["off", "force"])
@pytest.mark.parametrize("conv1d", [False, True])
def test_stacked_gate_up_runs_fused(gpu, conv1d, b2b, monkeypatch):
    """Phi-3's gate_up_proj (one projection over the stacked gate and up weights, chunk(2, -1)):
    the gated GEMM reads W1 and W3 in place as the two blocks of one weight (Linear's 2N x K rows,
    or a Conv1D K x 2N weight: rows of 2N columns, a bias of 2N), alone or as a B2B pair's GEMM1
    with down_proj; ragged M."""
    monkeypatch.setattr(comfuse.config, "b2b", b2b)
    model = M.StackedGatedMLP(1024, 2816, up_first=True, conv1d=conv1d).to(torch.bfloat16).to(gpu).eval()
    x = randn(3, 333, 1024, device=gpu, seed=5)
    out, rep = compiled_run(model, x)
    r = fused_region(rep, "gate_up_proj")
    assert (r.plan.get("kind") == "b2b") == (b2b == "force"), r.plan
    assert_bf16_close(out, reference_f32(model, x))


def test_written_out_attention_runs_fused(gpu, monkeypatch):
    """Attention written out (bmm, scale, softmax in f32, bmm; grouped heads through repeat_kv's
    copy) runs as one batched B2B kernel on the model's q, k, v (eager_attention.py)."""
    import test_eager_attention as E

    monkeypatch.setattr(comfuse.config, "measure", "off")  # the planner's decision: the kernel is under test
    model = E.WrittenOut(width=1024, heads=16, kv_heads=4).to(torch.bfloat16).to(gpu).eval()
    x = randn(2, 256, 1024, device=gpu, seed=5)
    out, rep = compiled_run(model, x)
    att = [r for r in rep.regions if r.layout == "attention"]
    assert len(att) == 1 and att[0].status == "fused" and att[0].calls == 1 and att[0].fallback_calls == 0, str(rep)
    assert_bf16_close(out, reference_f32(model, x))


def test_readme_example(gpu):
    """Linear + bias + residual + LayerNorm under torch.compile(backend="comfuse"), Inductor for the rest."""
    model = M.LinearResidualLayerNorm(1024).to(torch.bfloat16).to(gpu).eval()
    x = randn(8, 512, 1024, device=gpu, seed=5)
    out, rep = compiled_run(model, x, rest="inductor")
    assert_bf16_close(out, reference_f32(model, x))
    (r,) = rep.regions
    if r.status != "fused":
        pytest.xfail(f"the residual add does not fuse yet: {r.reason}; "
                     + "; ".join(f"{e.node}: {e.reason}" for e in r.excluded))
    assert r.calls == 1 and r.fallback_calls == 0
    assert any("native_layer_norm" in o for o in r.ops)


def test_measured_decision(gpu):
    """config.measure "auto" (the default): the region is timed before it is replaced (fused
    kernel against Inductor's kernels for the region; cuBLAS's GEMM alone too); the numbers are on
    its record, its calls are the model's only, and the result is the model's whichever way it is
    decided."""
    model = M.LinearLayerNorm(1024, 4096).to(torch.bfloat16).to(gpu).eval()
    x = randn(4, 512, 1024, device=gpu, seed=3)
    out, rep = compiled_run(model, x)  # min_gain -1e9: fused whatever the measurement says
    r = fused_region(rep, "proj")
    assert r.calls == 1 and "; measured: fused" in r.reason, r.reason
    t = r.measured
    assert t["fused_us"] > 0 and t["gemm_us"] > 0 and t["epilogue_us"] > 0 and t["device"], t
    assert t["inductor_us"] is not None and t["unfused_us"] == t["inductor_us"], t
    assert_bf16_close(out, reference_f32(model, x))

    torch._dynamo.reset()
    out, rep = compiled_run(model, x, rest="inductor", always_fuse=False)  # the measurement decides
    (r,) = rep.regions
    print(rep)
    if r.status == "fallback":
        assert r.reason.startswith(("measured on", "no predicted gain")), r.reason
        assert r.calls == 0
    else:
        assert r.measured and "; measured: fused" in r.reason and r.calls == 1, r.reason
    assert_bf16_close(out, reference_f32(model, x))


def test_decode_rows_share_one_kernel(gpu):
    """Decode batches of 1..8 rows are one shape class, 9..16 the next and 17..32 the next
    (partition.m_bucket): each is compiled once, never per step. One kernel then runs at several
    M, so the L2 exchange's rows past M (GlobalRowAllReduce::live: skipped at 17 and 24 rows,
    polled at 31) meet words an earlier launch left."""
    model = M.LinearLayerNorm(2048, 2048).to(torch.bfloat16).to(gpu).eval()
    comfuse.config.strict = True
    comfuse.config.rest = "eager"
    comfuse.config.min_gain = -1e9
    f = torch.compile(model, backend="comfuse", dynamic=True)
    with torch.no_grad(), comfuse.collecting() as rep:
        x = randn(1, 1, 2048, device=gpu)
        f(x)
        before = CACHE.compiles
        for classes, rows_of_classes in enumerate(((2, 4, 8, 3, 1), (16, 9, 12), (32, 17, 24, 31))):
            for rows in rows_of_classes:
                x = randn(rows, 1, 2048, device=gpu, seed=rows)
                assert_bf16_close(f(x), reference_f32(model, x))
            assert CACHE.compiles == before + classes
    assert len(rep.graphs) <= 2  # Dynamo's one recompile to a dynamic graph at most
    assert rep.regions and all(r.status == "fused" and r.fallback_calls == 0 for r in rep.regions), str(rep)


def test_cuda_graphs_reduce_overhead(gpu):
    """Replays of a captured kernel whose row groups exchange through L2: each replay must tag
    its rounds anew (the launch counter lives on the device), or it reads the last one's words."""
    model = M.LinearLayerNorm(4096, 4096).to(torch.bfloat16).to(gpu).eval()
    comfuse.config.strict = True
    comfuse.config.min_gain = -1e9
    f = torch.compile(model, backend="comfuse", mode="reduce-overhead")
    with torch.no_grad(), comfuse.collecting() as rep:
        for step in range(6):  # warm-up, record, replays
            x = randn(2, 2048, 4096, device=gpu, seed=10 + step)
            out = f(x).clone()
            assert_bf16_close(out, reference_f32(model, x))
    r = fused_region(rep, "proj")
    assert r.plan["l2_exchange"], r.plan  # the planner's choice at this shape: the case under test


def test_manual_cuda_graph_capture(gpu):
    """A region seen before capture replays correctly inside a user's torch.cuda.CUDAGraph."""
    model = M.LinearSoftmax(1024, 4096).to(torch.bfloat16).to(gpu).eval()
    comfuse.config.strict = True
    comfuse.config.rest = "eager"
    comfuse.config.min_gain = -1e9
    f = torch.compile(model, backend="comfuse")
    x = randn(2048, 1024, device=gpu)
    replay_in_user_graph(f, x, [randn(2048, 1024, device=gpu, seed=seed) for seed in (1, 2, 3)],
                         lambda y, x: assert_bf16_close(y, reference_f32(model, x)))


def test_non_contiguous_inputs_are_copied(gpu):
    model = M.LinearGelu(1024, 2048).to(torch.bfloat16).to(gpu).eval()
    x = randn(1024, 4096, device=gpu)[:, ::4]  # stride 4 on the last dim
    out, rep = compiled_run(model, x)
    fused_region(rep, "proj")
    assert_bf16_close(out, reference_f32(model, x.contiguous()))


def test_direct_kernel_api_checks_tensors(gpu):
    g = comfuse.Graph()
    x = g.input("x", "bf16", ["M", "K"])
    w = g.input("w", "bf16", ["N", "K"])
    b = g.input("bias", "bf16", ["N"])
    g.output(g.unary("gelu", g.binary("add", g.matmul(x, w), b)), "y", "bf16")
    m, n, k = 1000, 1032, 256
    kern = comfuse.compile_graph(g, {"M": m, "N": n, "K": k})
    X, W, B = randn(m, k, device=gpu), randn(n, k, scale=0.1, device=gpu), randn(n, device=gpu)
    y = kern(x=X, w=W, bias=B)["y"]
    ref = torch.nn.functional.gelu(X.float() @ W.float().t() + B.float())
    assert_bf16_close(y, ref)
    with pytest.raises(ValueError, match="'x' is on cpu"):
        kern(x=X.cpu(), w=W, bias=B)
    with pytest.raises(ValueError, match="'w' is torch.float16"):
        kern(x=X, w=W.half(), bias=B)
    with pytest.raises(ValueError, match="'x' has strides"):
        kern(x=randn(k, m, device=gpu).t(), w=W, bias=B)
    flat = randn(m * k + 1, device=gpu)
    with pytest.raises(ValueError, match="16-byte aligned"):
        kern(x=flat[1:].view(m, k), w=W, bias=B)
    with pytest.raises(ValueError, match="'x' has shape"):
        kern(x=X[:10], w=W, bias=B)


def _attention_kernel(batches: int, s: int, d: int, causal: bool):
    """examples/attention_batched(_causal).cf's graph, scale 1/sqrt(d), as one kernel for
    `batches` matrices of s x d."""
    import math

    mask = "causal_mask(x)" if causal else "x"
    text = (f"input q: bf16[B, M, K]\ninput k: bf16[B, N, K]\ninput v: bf16[B, N, DV]\ns = matmul(q, k)\n"
            f"x = mul(s, {1 / math.sqrt(d)!r})\npb = cast(softmax({mask}), bf16)\no = matmul(pb, v, layout=kn)\n"
            "output o: bf16\n")
    return comfuse.compile_graph(text, {"B": batches, "M": s, "N": s, "K": d, "DV": d})


@pytest.mark.parametrize("causal", [False, True])
def test_direct_kernel_api_runs_batched_attention(gpu, causal):
    """One B2B kernel over [B*H, S, D] tensors, against SDPA's math in f32; a strided batch (every
    other matrix of a larger batch) and a wrong batch count. [B, H, S, D] views: the next test."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, h, s, d = 2, 3, 300, 64
    kern = _attention_kernel(b * h, s, d, causal)
    assert "x 6 batches" in kern.explain()
    big = randn(2 * b * h, s, d, device=gpu)
    q, k, v = big[::2], randn(b * h, s, d, device=gpu), randn(b * h, s, d, device=gpu)  # q: every other batch
    o = kern(q=q, k=k, v=v)["o"]
    assert o.shape == (b * h, s, d)
    with sdpa_kernel(SDPBackend.MATH):
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    assert_bf16_close(o, ref)
    with pytest.raises(ValueError, match="'k' has shape"):
        kern(q=q, k=k[:2], v=v)


@pytest.mark.parametrize("causal", [False, True])
def test_direct_kernel_api_runs_attention_on_head_views(gpu, causal):
    """The batched kernel on [B, H, S, D] views with any strides, no copies: q, k, v sliced out of
    one [B, S, 3, H, D] projection (GPT-2's c_attn), O written into a [B, S, H, D] tensor through
    its [B, H, S, D] view; against SDPA's math in f32. 4-D arguments whose H differ are refused."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, h, s, d = 2, 5, 200, 64
    kern = _attention_kernel(b * h, s, d, causal)
    qkv = randn(b, s, 3, h, d, device=gpu)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # [B, H, S, D], row stride 3HD
    o = torch.full((b, s, h, d), float("nan"), device=gpu, dtype=torch.bfloat16)
    out = kern(q=q, k=k, v=v, o=o.transpose(1, 2))["o"]
    assert out.data_ptr() == o.data_ptr()
    with sdpa_kernel(SDPBackend.MATH):
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    assert_bf16_close(o.transpose(1, 2), ref)
    with pytest.raises(Exception, match="share H"):
        kern(q=q, k=k.reshape(b * h, s, d).reshape(5, 2, s, d), v=v)


def test_direct_kernel_api_runs_attention_with_a_mask_operand(gpu):
    """The kernel adds an additive [B, H, M, N] mask operand (attention.additive_mask) to the
    scaled scores: one query row a head (a decode step), keys masked past each sequence's length,
    so that whole chunks of N1 are masked (a rank of N1's split over a cluster may see no key at
    all) and one sequence has no key (its rows give 0, as SDPA's); a ragged multi-row case with an
    f32 bias on bf16 scores (the operand stays f32) and its finite masked values at MASKED;
    against SDPA's math in f32 on the same mask."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from comfuse import attention

    for b, h, m, n, d, mdt in ((3, 4, 1, 1000, 64, torch.bfloat16), (2, 3, 77, 520, 128, torch.float32)):
        g = attention.attention_graph("bf16", 1 / d ** 0.5, causal=False, mask=attention._DTYPES[mdt])
        kern = comfuse.compile_graph(g.text(), {"B": b * h, "M": m, "N": n, "K": d, "DV": d})
        q, k, v = randn(b, h, m, d, device=gpu), randn(b, h, n, d, device=gpu), randn(b, h, n, d, device=gpu)
        lengths = torch.tensor([5, n, 0][:b], device=gpu)  # keys 0 .. length - 1 exist
        keep = torch.arange(n, device=gpu)[None, None, None, :] < lengths[:, None, None, None]
        if mdt == torch.float32:  # a bias, and the lowest value for masked keys (transformers' fill)
            given = torch.where(keep, torch.rand(b, h, m, n, device=gpu), torch.finfo(torch.float32).min)
        else:
            given = keep
        mask = attention.additive_mask(given, mdt, (b, h, m, n))
        o = kern(q=q, k=k, v=v, mask=mask)["o"]  # [B x H, M, D]
        with sdpa_kernel(SDPBackend.MATH):
            ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                                   attn_mask=given)
        assert_bf16_close(o, ref.reshape(b * h, m, d))
        if b == 3:  # the sequence with no key: 0, as SDPA's
            assert o.view(b, h, m, d)[2].abs().max().item() == 0.0


@pytest.mark.parametrize("dtype,mdt,m,n,d,cluster", [
    (torch.bfloat16, torch.bfloat16, 1, 1000, 64, None),  # the planner's split
    (torch.bfloat16, torch.bfloat16, 1, 2048, 64, 16),    # 16 ranks, most see no key of sequence 0
    (torch.bfloat16, torch.float32, 3, 520, 128, 2),      # rows of speculative tokens, an f32 bias
    (torch.float16, torch.float16, 8, 136, 64, 1),        # the most rows, one CTA a batch
    (torch.bfloat16, None, 1, 776, 256, 4),               # no mask, head dim 256
])
def test_decode_kernel_matches_sdpa(gpu, dtype, mdt, m, n, d, cluster):
    """The decode kernel (B2bConfig::decode_rows: CUDA cores, keys split over a cluster, merged
    over DSMEM) forced, on q, k, v viewed out of one [B, S, 3, H, D] projection (strided heads), keys
    masked past each sequence's length (one sequence with 5 keys, one with none: its rows give 0, as
    SDPA's), against SDPA's math in f32."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from comfuse import attention

    b, h = 3, 4
    names = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}
    g = attention.attention_graph(names[dtype], 1 / d ** 0.5, causal=False, mask=names[mdt] if mdt else None)
    opts = {"b2b_decode": True} | ({"cluster_n": cluster} if cluster else {})
    kern = comfuse.compile_graph(g.text(), {"B": b * h, "M": m, "N": n, "K": d, "DV": d}, **opts)
    assert "the decode kernel" in kern.explain()
    q = randn(b, h, m, d, device=gpu, dtype=dtype)
    kv = randn(b, n, 2, h, d, device=gpu, dtype=dtype)  # one projection: heads strided
    k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
    # No sequence without keys beside the f32 bias: its finite lowest fill (raised to MASKED) weighs
    # a row of it by the scores, where torch's absorbs them (finfo.min + s == finfo.min: uniform).
    lengths = torch.tensor([5, n, 0 if mdt != torch.float32 else n // 2], device=gpu)
    keep = (torch.arange(n, device=gpu)[None, None, None, :] < lengths[:, None, None, None]).expand(b, h, m, n)
    if mdt is None:
        keep = torch.ones_like(keep)
        args = {}
    elif mdt == torch.float32:  # a bias, and the lowest value for masked keys
        keep = torch.where(keep, torch.rand(b, h, m, n, device=gpu), torch.finfo(torch.float32).min)
        args = {"mask": attention.additive_mask(keep, mdt, (b, h, m, n))}
    else:
        args = {"mask": attention.additive_mask(keep, mdt, (b, h, m, n))}
    o = kern(q=q, k=k, v=v, **args)["o"]
    with sdpa_kernel(SDPBackend.MATH):
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                               attn_mask=keep if mdt is not None else None)
    assert_bf16_close(o, ref.reshape(b * h, m, d))
    if mdt is not None and mdt != torch.float32:
        assert o.view(b, h, m, d)[2].abs().max().item() == 0.0


def assert_replays_at_another_position(step, tok, pos):
    """A CUDA graph of the compiled decode step, captured at pos and replayed at position 40,
    matches eager there."""
    f = torch.compile(step, backend="comfuse")
    with torch.no_grad():
        f(tok, pos)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = f(tok, pos)
        pos.fill_(40)
        graph.replay()
        torch.cuda.synchronize()
        want = step(tok, pos).float()
    assert_bf16_close(got, want, rel=3e-2)


def test_llama_decode_step_fuses_grouped_attention(gpu):
    """One decode step of a small Llama (4 heads over 2 of k and v) on a StaticCache: each layer's
    attention is one kernel on repeat_kv's sources, a group's heads as one batch's rows (the decode
    kernel's), the step's mask an operand; the step matches eager, and a CUDA graph of the step
    replays it at another position."""
    import bench_models

    mod = bench_models.module()
    comfuse.config.measure = "off"
    model, ids = mod.build("llama", layers=2, batch=4, seq=16, device=gpu, small=True)
    cache = mod.static_cache(model, ids, max_len=64)
    step = mod.Decode(model, cache)
    tok, pos = ids[:, -1:].contiguous(), torch.tensor([16], device=gpu)
    with torch.no_grad():
        ref = step(tok, pos).float()
    out, rep = compiled_run(step, tok, pos)
    att = [r for r in rep.regions if r.layout == "attention"]
    assert len(att) == 2 and all(r.status == "fused" and r.fallback_calls == 0 for r in att), str(rep)
    assert all("grouped-query: 2 heads a group" in r.reason and r.plan["dims"]["M"] == 2 for r in att), str(rep)
    assert all("the decode kernel" in r.plan["explain"] for r in att), att[0].plan["explain"]
    assert_bf16_close(out, ref, rel=3e-2)
    assert_replays_at_another_position(step, tok, pos)


def test_gpt2_decode_step_fuses_its_attention(gpu):
    """One GPT-2 decode step on a StaticCache (GPT-2 medium's width, 64 slots): each layer's
    attention is one kernel that adds the step's mask (a runtime input) as an operand, and the
    step matches eager; a CUDA graph of the step replays it at another position."""
    import bench_models

    mod = bench_models.module()
    comfuse.config.measure = "off"  # the kernel is under test here, not the measured decision
    model, ids = mod.build("gpt2", layers=2, batch=4, seq=16, device=gpu)
    cache = mod.static_cache(model, ids, max_len=64)
    step = mod.Decode(model, cache)
    tok, pos = ids[:, -1:].contiguous(), torch.tensor([16], device=gpu)
    with torch.no_grad():
        ref = step(tok, pos).float()
    out, rep = compiled_run(step, tok, pos)  # fused regardless of the planner's prior (unmeasured_fallback)
    att = [r for r in rep.regions if r.layout == "attention"]
    assert len(att) == 2 and all(r.status == "fused" and r.fallback_calls == 0 for r in att), str(rep)
    assert all("depends on a runtime input" in r.reason for r in att), str(rep)
    assert_bf16_close(out, ref, rel=3e-2)
    assert_replays_at_another_position(step, tok, pos)


def test_inductor_default_and_max_autotune_rest(gpu):
    model = M.GPT2MLP(1024, 4096).to(torch.bfloat16).to(gpu).eval()
    x = randn(4, 256, 1024, device=gpu)
    for mode in (None, "max-autotune-no-cudagraphs"):
        torch._dynamo.reset()
        out, rep = compiled_run(model, x, mode=mode, rest="inductor")
        fused_region(rep, "c_fc")
        assert_bf16_close(out, reference_f32(model, x))


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_transformers_model_end_to_end(gpu, arch, monkeypatch):
    pytest.importorskip("transformers")
    import bench_models  # tests/python/bench_models.py -> bench/models.py

    # The planner's decisions, deterministic: timing may drop c_fc (a ~10% margin at this M);
    # test_measured_decision covers the measured path.
    monkeypatch.setattr(comfuse.config, "measure", "off")
    # Realistic widths (GPT-2 medium, Llama-3-8B's), two layers, 4 x 256 tokens.
    model, ids = bench_models.build(arch, layers=2, batch=4, seq=256, device=gpu)
    with torch.no_grad():
        ref = model(ids).logits.float()
    out, rep = compiled_run(model, ids, always_fuse=False)
    print(rep)
    assert_bf16_close(out.logits, ref, rel=3e-2)
    assert all(r.fallback_calls == 0 for r in rep.regions), str(rep)
    if arch == "gpt2":  # the MLP's c_fc + gelu_new fuses in every layer
        fc = [r for r in rep.regions if r.root.endswith("mlp.c_fc:addmm")]
        assert len(fc) == 2 and all(r.status == "fused" and r.calls == 1 for r in fc), str(rep)
    # Each layer's attention: one causal kernel on the model's strided q, k, v (its mask recognized).
    att = [r for r in rep.regions if r.layout == "attention"]
    assert len(att) == 2 and all(r.status == "fused" and r.calls == 1 for r in att), str(rep)
    assert all("mask recognized as causal" in r.reason for r in att), str(rep)


@pytest.mark.parametrize("arch, ops", [("llama", ("cat",)), ("qwen3", ("rsqrt", "cat"))])
def test_head_epilogues_run_fused(gpu, arch, ops, monkeypatch):
    """Per-head epilogues in q_proj's and k_proj's kernels: Llama's rotary embeddings; Qwen 3's
    q/k norms (an RMSNorm over each head's 128 columns) then its rotary embeddings, one kernel. At
    the models' widths, two layers, 2 x 64 tokens, against the model in float32."""
    pytest.importorskip("transformers")
    import bench_models  # tests/python/bench_models.py -> bench/models.py

    model, ids = bench_models.build(arch, layers=2, batch=2, seq=64, device=gpu)
    out, rep = compiled_run(model, ids)
    assert_bf16_close(out.logits, reference_f32(model, ids).logits, rel=3e-2)
    for proj in ("self_attn.q_proj", "self_attn.k_proj"):
        rs = [r for r in rep.regions if proj in r.root]
        assert len(rs) == 2, [(r.root, r.status, r.reason) for r in rep.regions]
        for r in rs:
            assert r.status == "fused" and r.fallback_calls == 0, (r.root, r.reason, r.runtime_fallback)
            assert all(op in " ".join(r.ops) for op in ops), (r.root, r.ops)
