"""B2B pairs in the frontend (CPU): chained GEMM regions (an MLP) translate into one ComFuse graph
that Φ lowers to a B2B pair (gated for Llama's SwiGLU / GeGLU, plain for GPT-2 and Linear MLPs);
the translation matches torch in fp64; the decision follows the core's choose_b2b and today's
per-region estimates, and the report says which and why in the model's module names."""
import math
from pathlib import Path

import pytest
import torch

import comfuse
from comfuse import _core
from comfuse import reference as R
from comfuse.capture import capture

from conftest import randn
import modules as M

BIG = (4, 512, 1024)


def module(m):
    return m.to(torch.bfloat16).eval()


def randomize(model):
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():  # random, nonzero weights and vectors
            p.copy_(randn(*p.shape, scale=0.2 if p.dim() > 1 else 1.0, offset=0.0 if p.dim() > 1 else 0.3,
                          seed=p.numel() % 997))
    return model


# ---- finding and translating pairs ------------------------------------------------------------
@pytest.mark.parametrize("act", ["silu", "gelu"])
def test_llama_mlp_is_a_gated_pair(act):
    cap = capture(module(M.LlamaMLP(1024, 2816, act=act)), randn(*BIG))
    p = cap.pair("gate_proj")
    assert p.gate is not None and "up_proj" in p.gate.info.root and "down_proj" in p.second.info.root
    text = p.info.graph_text
    assert "input b3: bf16[N1, K]" in text and "input b2: bf16[N2, N1]" in text and "cast(" in text
    d = p.lowering.describe()
    assert "gated pair" in d and "one gated GEMM1" in d and "b2b pair" in d, d
    assert p.lowering.is_b2b()
    assert p.dims == {"M": 2048, "K": 1024, "N1": 2816, "N2": 1024}


def test_gpt2_mlp_is_a_plain_pair_with_biases_and_residual():
    cap = capture(module(M.GPT2MLP(768, 3072)), randn(8, 256, 768))
    p = cap.pair("c_fc")
    assert p.gate is None and "c_proj" in p.second.info.root
    text = p.info.graph_text
    # Conv1D: K x N weights (layout kn) for both GEMMs, each bias a row of its own N.
    assert "input b: bf16[K, N1]" in text and "input b2: bf16[N1, N2]" in text
    assert "bf16[N1]" in text and "bf16[N2]" in text and "bf16[M, N2]" in text  # biases, residual
    d = p.lowering.describe()
    assert "b2b pair" in d and "gated" not in d, d
    assert p.info.layout == "kn"


def test_linear_mlp_with_biases_is_a_pair():
    cap = capture(module(M.LinearMLP(256, 1024)), randn(2, 64, 256))
    p = cap.pair("fc1")
    assert "input b: bf16[N1, K]" in p.info.graph_text and "bf16[N1]" in p.info.graph_text
    assert p.lowering.is_b2b()


def test_stored_hidden_is_no_pair_and_says_why():
    cap = capture(module(M.MLPKeepsHidden(256, 512)), randn(2, 64, 256))
    p = cap.pair("fc1")
    assert p.info.status == "fallback"
    assert p.info.reason.startswith("Φ: "), p.info.reason
    fc1 = cap.by_root("fc1")
    assert "B2B pair" in fc1.info.b2b and "fc2" in fc1.info.b2b and "Φ" in fc1.info.b2b


def test_single_gemm_modules_have_no_pair():
    cap = capture(module(M.LinearLayerNorm(256, 512)), randn(2, 64, 256))
    assert cap.pairs == []


# ---- the fp64 reference: the pair graph against torch ---------------------------------------------
PAIRS = {
    "swiglu": (lambda: M.LlamaMLP(64, 136), (3, 37, 64), "gate_proj"),
    "geglu_bias": (lambda: M.LlamaMLP(72, 200, bias=True, act="gelu"), (2, 45, 72), "gate_proj"),
    "gpt2_mlp": (lambda: M.GPT2MLP(64, 256), (3, 45, 64), "c_fc"),
    "linear_mlp": (lambda: M.LinearMLP(64, 264), (101, 64), "fc1"),
    # Phi-3's stacked gate_up_proj: the gated GEMM1 is one weight's two column blocks
    # (translate.Halves; test_column_halves.py), Linear with a bias and GPT-2's Conv1D.
    "stacked_gate_up_bias": (lambda: M.StackedGatedMLP(72, 200, bias=True, up_first=True), (2, 45, 72),
                             "gate_up_proj"),
    "stacked_gate_up_conv1d": (lambda: M.StackedGatedMLP(64, 200, conv1d=True), (3, 37, 64), "gate_up_proj"),
}


@pytest.mark.parametrize("case", sorted(PAIRS))
def test_pair_graph_matches_torch_fp64(case):
    make, shape, first = PAIRS[case]
    model = randomize(module(make()))
    cap = capture(model, randn(*shape, offset=0.1, seed=7))
    p = cap.pair(first)
    assert p.translator is not None and p.lowering is not None and p.lowering.is_b2b(), p.info.reason
    got = R.comfuse_fp64(p, cap.values)
    lowered = R.lowered_fp64(p, cap.values)
    ref = R.eager_fp64(p, cap.values)
    assert set(got) == set(ref) and len(got) == 1
    for name, r in ref.items():
        assert r.abs().max() > 0 and torch.isfinite(r).all()
        for what, x in (("graph executor", got[name]), ("lowered executor", lowered[name])):
            diff = (x - r).abs()
            # Both in fp64, rounded at the same places (S to bf16 as the model stores it, the
            # output): equal up to a rounding flipped by reassociation.
            tol = R.ulp(torch.bfloat16, r) * 1.01 + 1e-12
            assert (diff <= tol).all(), f"{case} ({what}): max diff {diff.max().item()}"
            assert (diff > 1e-9).float().mean() < 0.01, f"{case} ({what}): too many rounding differences"


# ---- the decision and the report ----------------------------------------------------------------
def test_auto_keeps_the_gated_pair_per_region_where_it_does_not_pay():
    """Where one gated kernel does not pay, the core says two kernels (the gated GEMM1, GEMM2);
    the frontend keeps today's regions then, and says so on gate_proj's region."""
    comfuse.config.b2b = "auto"
    cap = capture(module(M.LlamaMLP(1024, 2816)), randn(*BIG))
    p = cap.pair("gate_proj")
    ch = p.choice
    assert ch["gated"] and not ch["one_kernel"] and ch["fused_us"] > ch["unfused_us"]  # the core's model today
    assert p.info.status == "fallback" and "two kernels" in p.info.reason
    gate = cap.by_root("gate_proj")  # today's region is still there
    assert "silu" in " ".join(gate.info.ops)
    line = gate.info.b2b
    assert "gate_proj" in line and "up_proj" in line and "down_proj" in line and "not one kernel" in line
    text = "\n".join(comfuse.report.format_region(gate.info))
    assert "B2B pair" in text


def test_gated_region_where_no_pair_takes_gate_and_up():
    """Where the pair stays per-region, gate_proj and up_proj become one gated region (one GEMM over
    both weights, F reading both products) in place of their two regions, where the planner prices
    it below them; its graph declares W3 as b3 and Φ lowers it to one gated GEMM."""
    comfuse.config.b2b = "auto"
    model = randomize(module(M.LlamaMLP(1024, 2816)))
    x = randn(*BIG)
    cap = capture(model, x)
    assert cap.pair("gate_proj").info.status == "fallback"
    g = cap.by_root("gate_proj")
    assert g.translator.gates and "input b3: bf16[N, K]" in g.info.graph_text, g.info.graph_text
    assert any("up_proj" in op for op in g.info.ops) and "silu" in " ".join(g.info.ops)
    assert not any("up_proj" in c.info.root for c in cap.candidates)  # up_proj's region is gone
    assert g.info.status == "fused" and g.info.reason.startswith("gated with"), g.info.reason
    assert "not one kernel" in g.info.b2b  # the pair's line stays on the report
    low = _core.lower(_core.parse_graph(g.info.graph_text))
    assert "one gated GEMM (region 0, two accumulators)" in low.describe(), low.describe()


def test_gated_region_at_decode_waits_for_a_measurement():
    """Llama-3-8B's gate_proj and up_proj at decode (1 x 14336 x 4096): the gated region is priced
    above the two GEMMs, but its bound (the last round of tiles at the DRAM's long-stream rate:
    measured 64.1 us against cuBLAS's two GEMMs 63.3-66.8, bench/sweeps/gated_split_k.txt) pays, and
    neither member fuses on its own estimate: the gated region takes their place, fused where a
    measurement pays."""
    comfuse.config.b2b = "off"
    cap = capture(module(M.LlamaMLP(4096, 14336)), randn(1, 1, 4096))
    g = cap.by_root("gate_proj")
    assert g.translator.gates, g.info.reason
    assert not any("up_proj" in c.info.root for c in cap.candidates)
    assert g.info.status == "fused" and g.info.needs_measurement, g.info.reason
    assert g.info.reason.startswith("gated with") and g.info.reason.endswith("fused where a measurement pays")
    assert g.info.plan["low_us"] < g.info.unfused_us < g.info.fused_us


def test_gated_region_on_a_measurement_only_where_its_bound_beats_the_members():
    """pair._beats_members: a gated region fused only on a measurement's word replaces its members
    where none fuses on its own estimate and its bound is below theirs (the unfused path less what
    each member that may fuse saves at its own bound); else the members keep their chance."""
    from types import SimpleNamespace as NS

    from comfuse.pair import _beats_members

    def cand(status, low=None, unfused=None, needs=False):
        return NS(info=NS(status=status, needs_measurement=needs, unfused_us=unfused,
                          plan={"low_us": low} if low is not None else None))

    gated = cand("fused", low=61.6, unfused=67.8, needs=True)
    bare = cand("fallback")
    assert _beats_members(gated, (cand("fused", low=32.5, unfused=35.4, needs=True), bare))  # 61.6 < 64.9
    assert not _beats_members(gated, (cand("fused", low=25.0, unfused=35.4, needs=True), bare))  # 61.6 > 57.4
    assert not _beats_members(gated, (cand("fused", low=30.0, unfused=35.4), bare))  # a member fuses for sure
    assert _beats_members(gated, (bare, bare))


def test_auto_follows_choose_b2b_two_kernels():
    comfuse.config.b2b = "auto"
    cap = capture(module(M.GPT2MLP(768, 3072)), randn(8, 256, 768))
    p = cap.pair("c_fc")
    if not p.choice["one_kernel"]:  # the core's estimate at this shape (bench/RESULTS.md: most FFNs)
        assert p.info.status == "fallback" and "two kernels" in p.info.reason
        assert "per-region path" in p.info.reason
    else:
        assert p.info.fused_us is not None
    assert {c.info.root.split(":")[0] for c in cap.candidates} >= {"c_fc", "c_proj"}


@pytest.mark.parametrize("make,first", [(lambda: M.LlamaMLP(1024, 2816), "gate_proj"),
                                        (lambda: M.GPT2MLP(768, 3072), "c_fc")])
def test_force_replaces_the_members_by_one_pair(make, first):
    comfuse.config.b2b = "force"
    cap = capture(module(make()), randn(4, 256, 1024 if first == "gate_proj" else 768))
    p = cap.pair(first)
    assert p.info.status == "fused", p.info.reason
    assert "b2b force" in p.info.reason
    assert p in cap.candidates and not any(m in cap.candidates for m in p.members)
    text = "\n".join(comfuse.report.format_region(p.info))
    assert "GEMMs M=1024" in text and "plan: B2B kernel" in text and "one kernel" in text


def test_off_forms_no_pair():
    comfuse.config.b2b = "off"
    cap = capture(module(M.LlamaMLP(256, 512)), randn(2, 64, 256))
    assert cap.pairs == [] and not any(c.info.b2b for c in cap.candidates)


def test_unknown_mode_falls_back_with_the_reason():
    comfuse.config.b2b = "always"
    cap = capture(module(M.LlamaMLP(256, 512)), randn(2, 64, 256))
    assert "wants one of auto, force, off" in cap.pair("gate_proj").info.reason


def test_config_plan_options_reach_the_pair():
    """comfuse.config.plan_options apply to a pair's plan as to a single region's (here the GPU
    planned for, which explain names)."""
    comfuse.config.b2b = "force"
    comfuse.config.plan_options = {"gpu_model": "h100"}
    cap = capture(module(M.GPT2MLP(768, 3072)), randn(4, 256, 768))
    p = cap.pair("c_fc")
    assert p.info.status == "fused", p.info.reason
    assert p.info.plan_options == {"gpu_model": "h100", "b2b": "force"}
    assert "gpu          H100" in p.choice["explain"], p.choice["explain"]


def test_plan_option_b2b_reaches_choose_b2b():
    g = _core.parse_graph((Path(__file__).resolve().parents[2] / "examples" / "ffn.cf").read_text())
    low = _core.lower(g)
    dims = {"M": 2048, "K": 256, "N": 1024, "D": 256}
    assert low.choose_b2b(dims, {"b2b": "force"})["one_kernel"]
    assert not low.choose_b2b(dims, {"b2b": "off"})["one_kernel"]
    with pytest.raises(_core.Error, match="auto, force or off"):
        low.choose_b2b(dims, {"b2b": "sometimes"})


# ---- the custom op on the CPU (its aten fallback) --------------------------------------------------
@pytest.mark.parametrize("rest", ["eager", "inductor"])
@pytest.mark.parametrize("make,shape", [(lambda: M.LlamaMLP(256, 512), (2, 64, 256)),
                                        (lambda: M.GPT2MLP(256, 1024), (2, 64, 256))])
def test_forced_pair_goes_through_one_custom_op(make, shape, rest):
    comfuse.config.b2b = "force"
    comfuse.config.force_regions = True  # fusable regions go through the custom op (its aten fallback here)
    comfuse.config.rest = rest
    model = randomize(module(make()))
    x = randn(*shape, offset=0.1)
    with torch.no_grad(), comfuse.collecting() as rep:
        ref = model(x)
        out = torch.compile(model, backend="comfuse")(x)
    pairs = [r for r in rep.regions if r.plan.get("kind") == "b2b"]
    assert len(pairs) == 1 and pairs[0].status == "fusable", [(r.root, r.status, r.reason) for r in rep.regions]
    assert "not fused here" in pairs[0].reason
    assert pairs[0].calls == 1 and pairs[0].fallback_calls == 1
    assert len(rep.regions) == 1  # the regions the pair replaced are not reported separately
    # Eager rest: the same aten ops, bit for bit; Inductor computes the ops around (LayerNorm) in
    # f32 without bf16 roundings between them: bf16 noise.
    if rest == "eager":
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
    else:
        assert ((out.float() - ref.float()).norm() / ref.float().norm()).item() < 1e-2


# ---- the run-time path with the B2B kernel emulated on the CPU ------------------------------------
class EmulatedPair:
    """Stands for the compiled B2B kernel: checks the argument table RuntimePair.prepare built
    (every operand of both GEMMs as the pair graph's shape under dims M, K, N1, N2; W given as
    Linear's N x K rows; 16-byte aligned packed rows) and runs the pair graph in fp64."""

    def __init__(self, rr):
        self.rr = rr

    def run(self, args, scalars, stream):
        from comfuse import kernels
        from comfuse.reference import _host, _torch

        rr, views = self.rr, self.rr._views
        m = views["a"].shape[0]
        dims = rr._dims(m)
        inputs = {}
        for name, role, shape in zip(rr.names, rr.roles, rr.shapes):
            want = [dims[d] if isinstance(d, str) else d for d in shape]
            if role == "scalar":
                inputs[name] = ([], torch.tensor(scalars[name], dtype=torch.float64).numpy().tobytes())
                continue
            v = views[name]
            ptr, dtype, got, ld = args[name]
            assert ptr == v.data_ptr() and ptr % 16 == 0, name
            assert dtype == kernels._NAMES[v.dtype]
            if v.dim() == 2:
                assert got == want and list(v.shape) == want, (name, got, want)
                assert v.stride(1) == 1 and v.stride(0) == ld and (ld * v.element_size()) % 16 == 0, name
            else:
                assert v.is_contiguous() and v.numel() == math.prod(want), name
            inputs[name] = _host(v.reshape(want))
        out = _core.run_graph(_core.parse_graph(rr.info.graph_text), dims, inputs)
        for name, cls in zip(rr.out_names, rr.out_classes):
            ptr, dtype, shape, ld = args[name]
            assert (shape, ld) == (([m, dims["N2"]], dims["N2"]) if cls == "tile" else ([m, 1], 0))
            views[name].copy_(_torch(*out[name]))


@pytest.fixture
def emulate_pair(monkeypatch):
    from comfuse import backend as backend_mod
    from comfuse import kernels

    monkeypatch.setattr(kernels, "gpu_status", lambda: (True, ""))
    monkeypatch.setattr(backend_mod, "gpu_status", lambda: (True, ""))
    monkeypatch.setattr(kernels.RuntimeRegion, "device_type", "cpu")
    monkeypatch.setattr(kernels.RuntimePair, "kernel", lambda self, m, capturing: EmulatedPair(self))
    prepare = kernels.RuntimePair.prepare

    def keep_views(self, *a, **kw):
        res = prepare(self, *a, **kw)
        self._views = res[3]
        return res

    monkeypatch.setattr(kernels.RuntimePair, "prepare", keep_views)
    comfuse.config.force_regions = True
    comfuse.config.rest = "eager"
    comfuse.config.strict = True
    comfuse.config.b2b = "force"


@pytest.mark.parametrize("case", sorted(PAIRS))
def test_pair_runtime_path_emulated(emulate_pair, case):
    make, shape, first = PAIRS[case]
    model = randomize(module(make()))
    x = randn(*shape, offset=0.1, seed=3)
    with torch.no_grad(), comfuse.collecting() as rep:
        ref = model(x)
        out = torch.compile(model, backend="comfuse")(x)
    pair = next(r for r in rep.regions if r.plan.get("kind") == "b2b")
    assert pair.calls == 1 and pair.fallback_calls == 0, pair.runtime_fallback
    # fp64 with S rounded once against bf16 eager (every intermediate rounded): bf16 noise.
    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    assert err < 1e-2, err


# ---- whole transformers models (tiny widths) -----------------------------------------------------
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_models_offer_the_mlp_pairs_only(arch):
    """In a decoder, the MLP is the pair; a norm region that feeds several GEMMs (q/k/v, gate/up)
    or also stores the residual stream is no chain and is not offered. Forced: GPT-2's MLP runs as
    one pair (through its aten fallback here) and the model matches eager; Llama's down_proj region
    carries the next RMSNorm over N2 (more columns than a gated B2B job holds): per-region, saying so."""
    pytest.importorskip("transformers")
    import bench_models

    comfuse.config.b2b = "force"
    comfuse.config.force_regions = True
    comfuse.config.rest = "eager"
    rep = bench_models.compiled_prefill_matches_eager(arch)[3]
    lines = [l for r in rep.regions for l in r.b2b.splitlines()]
    assert all(".mlp." in l.split("->")[0] or "lm_head" in l for l in lines), lines
    if arch == "gpt2":
        pairs = [r for r in rep.regions if r.plan.get("kind") == "b2b"]
        assert [p.root for p in pairs] == [f"model.transformer.h.{i}.mlp.c_fc:addmm" for i in (0, 1)]
    else:
        gate = next(r for r in rep.regions if r.root == "model.model.layers.0.mlp.gate_proj:mm")
        assert "up_proj" in gate.b2b and "down_proj" in gate.b2b and "GEMM2's epilogue reduces" in gate.b2b


def test_an_error_in_the_pair_pass_keeps_the_regions(monkeypatch):
    from comfuse import pair as pair_mod

    def boom(p):
        raise KeyError("simulated")

    monkeypatch.setattr(pair_mod, "decide_pair", boom)
    cap = capture(module(M.LlamaMLP(256, 512)), randn(2, 64, 256))
    assert "internal error KeyError" in cap.pair("gate_proj").info.reason
    assert "silu" in " ".join(cap.by_root("gate_proj").info.ops)
    comfuse.config.strict = True
    torch._dynamo.reset()
    with pytest.raises(Exception, match="simulated"):
        capture(module(M.LlamaMLP(256, 512)), randn(2, 64, 256))
