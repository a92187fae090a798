"""Deciding by measurement (measure.py) on the CPU: config.measure = "on" times every region the
rewrite replaces (forced regions here, config.force_regions) with the timers injected, so the
decision that follows the measurement, the graph surgery after it and the report are checked
without a GPU."""
import pytest
import torch

import comfuse
from comfuse import measure
from comfuse.kernels import REGISTRY

from conftest import close, compile_vs_eager as run, randn
from test_runtime_glue import emulate  # noqa: F401 (the fixture: kernels emulated on the CPU)
import modules as M

_real_time_region = measure.time_region


@pytest.fixture
def timers(monkeypatch):
    """Replaces the three timers: `fused`, `gemm` and `inductor` (us, or a function of the region's
    RegionInfo / of (m, n, k) / of the RegionInfo, or an exception to raise: Inductor's by default,
    so the GEMM plus the modeled epilogue stand for the unfused path); records each call."""
    state = {"fused": 10.0, "gemm": 10.0, "inductor": RuntimeError("Inductor not timed in this test"),
             "region_calls": [], "gemm_calls": [], "inductor_calls": [], "order": []}

    def value(v, *a):
        if isinstance(v, Exception):
            raise v
        return v(*a) if callable(v) else v

    def time_region(rr, tensors, sizes):
        state["region_calls"].append((rr, tensors, sizes))
        state["order"].append("fused")
        return value(state["fused"], rr.info)

    def time_gemm(m, n, k, dtype, layout, device):
        state["gemm_calls"].append((m, n, k, dtype, layout, device))
        return value(state["gemm"], (m, n, k))

    def time_inductor(rr, tensors, sizes, options):
        state["inductor_calls"].append((rr, tensors, sizes, options))
        state["order"].append("inductor")
        return value(state["inductor"], rr.info)

    monkeypatch.setattr(measure, "time_region", time_region)
    monkeypatch.setattr(measure, "time_gemm", time_gemm)
    monkeypatch.setattr(measure, "time_inductor", time_inductor)
    comfuse.config.force_regions = True
    comfuse.config.rest = "eager"
    comfuse.config.min_gain = 0.0
    comfuse.config.measure = "on"
    return state


def _always_fuse(monkeypatch):
    # The planner's side fuses (a gain it predicts); the measurement alone decides after it.
    comfuse.config.min_gain = 0.0
    import comfuse.partition as part

    monkeypatch.setattr(part, "bare_gemm_us", lambda *a: 1e6)


def _layernorm_region():
    """Linear + LayerNorm (one region) compiled and run against eager: its RegionInfo, the report."""
    out, ref, rep = run(M.LinearLayerNorm(256, 512), randn(2, 96, 256))
    close(out, ref)
    (r,) = rep.regions
    return r, rep


def test_slower_fused_region_falls_back(timers, monkeypatch):
    _always_fuse(monkeypatch)
    timers["fused"], timers["gemm"] = 500.0, 20.0
    r, rep = _layernorm_region()
    assert r.status == "fallback", r.reason
    assert r.reason.startswith("measured on cpu: fused 500.0 us vs unfused"), r.reason
    assert "cuBLAS GEMM 20.0 us measured + epilogue" in r.reason and "planner had predicted" in r.reason
    assert r.measured["fused_us"] == 500.0 and r.measured["gemm_us"] == 20.0
    assert r.measured["epilogue_us"] == r.unfused_epilogue_us > 0
    assert r.id not in REGISTRY and r.calls == 0  # not replaced: the graph runs its aten ops
    ((m, n, k, dtype, layout, device),) = timers["gemm_calls"]
    assert (m, n, k, dtype, layout, device.type) == (192, 512, 256, torch.bfloat16, "nk", "cpu")
    ((rr, tensors, sizes),) = timers["region_calls"]
    for t, role in zip(tensors, rr.roles):  # random operands of the real shapes, never zero
        assert isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16
        assert (t != 0).all()
    assert tensors[0].shape == (2, 96, 256) or tensors[0].numel() == 192 * 256
    assert "measured on cpu" in str(rep)


def test_faster_fused_region_is_replaced(timers, monkeypatch):
    _always_fuse(monkeypatch)
    timers["fused"], timers["gemm"] = 5.0, 20.0
    r, rep = _layernorm_region()
    assert r.status in ("fused", "fusable") and "; measured: fused 5.0 us vs unfused" in r.reason, r.reason
    assert r.id in REGISTRY and r.calls == 1  # replaced; the measurement's own calls are not counted
    assert r.measured["unfused_us"] == pytest.approx(20.0 + r.unfused_epilogue_us)
    text = str(rep)
    assert "measured on cpu: fused 5.0 us, cuBLAS GEMM 20.0 us" in text, text


def test_min_gain_applies_to_the_measurement(timers, monkeypatch):
    _always_fuse(monkeypatch)
    comfuse.config.min_gain = 0.5
    timers["gemm"] = 20.0
    timers["fused"] = lambda info: 0.6 * (20.0 + info.unfused_epilogue_us)  # faster, by less than half
    _, _, rep = run(M.LinearLayerNorm(256, 512), randn(2, 96, 256))
    (r,) = rep.regions
    assert r.status == "fallback" and r.reason.startswith("measured on"), r.reason


@pytest.mark.parametrize("gain_in_margins,fuses", [(0.5, False), (2.0, True)])
def test_a_measured_gain_within_the_margin_falls_back(timers, monkeypatch, gain_in_margins, fuses):
    """A measured win smaller than config.measure_margin does not fuse (the compile-time burst is
    not the model's steady state); a larger one does."""
    _always_fuse(monkeypatch)
    timers["gemm"], timers["inductor"] = 100.0, 100.0
    timers["fused"] = 100.0 * (1.0 - comfuse.config.measure_margin * gain_in_margins)
    r, _ = _layernorm_region()
    assert (r.status in ("fused", "fusable")) == fuses, r.reason


@pytest.mark.parametrize("fused_us", [1000.0, 1.0])
def test_the_probe_measures_and_a_graph_left_with_nothing_goes_to_inductor_whole(timers, monkeypatch, inductor_graphs,
                                                                                 fused_us):
    """With Inductor for the rest, the probe times the regions the planner fuses: where all of them
    measure slower, the graph goes to Inductor whole (Dynamo's graph, as with nothing to fuse: the
    rewrite path's two AOTAutograd passes cost GPT-2's decode 13% on the H200); where one measures
    faster, the rewrite takes the probe's decision and times nothing again."""
    _always_fuse(monkeypatch)
    comfuse.config.rest = "inductor"
    timers["gemm"], timers["fused"] = 5.0, fused_us
    out, ref, rep = run(M.LinearLayerNorm(256, 512), randn(2, 96, 256))
    close(out, ref)
    (g,) = rep.graphs
    (r,) = rep.regions
    assert len(timers["region_calls"]) == 1, "a region timed once, in the probe"
    (gm,) = inductor_graphs
    fused_calls = [n for n in gm.graph.nodes if n.target is torch.ops.comfuse.fused.default]
    if fused_us > 5.0:
        assert g.note.startswith("nothing fused"), g.note
        assert r.status == "fallback" and r.reason.startswith("measured on"), r.reason
        assert not fused_calls and not any(isinstance(n.target, torch._ops.OpOverload) for n in gm.graph.nodes)
    else:
        assert r.status in ("fused", "fusable") and "; measured: fused 1.0 us" in r.reason, r.reason
        assert len(fused_calls) == 1 and r.calls == 1


def test_measure_off_leaves_the_planner_and_never_times(timers, monkeypatch):
    _always_fuse(monkeypatch)
    comfuse.config.measure = "off"
    timers["fused"] = timers["gemm"] = AssertionError("a timer ran with config.measure = 'off'")
    r, rep = _layernorm_region()
    assert r.status in ("fused", "fusable") and r.reason.startswith("planner:") and "measured" not in r.reason
    assert not r.measured and r.id in REGISTRY and r.calls == 1
    assert not timers["region_calls"] and not timers["gemm_calls"]


def test_auto_measures_nothing_without_a_gpu_tensor(timers, monkeypatch):
    """Under "auto" a region whose tensors are on the CPU (or no sm_90 GPU) is not timed."""
    _always_fuse(monkeypatch)
    comfuse.config.measure = "auto"
    _, _, rep = run(M.LinearLayerNorm(256, 512), randn(2, 96, 256))
    (r,) = rep.regions
    assert r.calls == 1 and not r.measured and not timers["region_calls"]


def test_timer_error_keeps_the_planners_decision(timers, monkeypatch, caplog):
    _always_fuse(monkeypatch)
    timers["fused"] = RuntimeError("no events here")
    r, rep = _layernorm_region()
    assert r.status in ("fused", "fusable") and "not measured (RuntimeError: no events here)" in r.reason, r.reason
    assert not r.measured and r.id in REGISTRY and r.calls == 1
    assert "no events here" in caplog.text


def _decode_norm_region():
    """GPT-2's decode c_proj + residual + LayerNorm at M = 1 (1024 x 1024): priced above the unfused
    side, but within one-wave split-K plans' known overestimate (RegionInfo.needs_measurement)."""
    out, ref, rep = run(M.Conv1DResidualLayerNorm(1024, 1024), randn(1, 1, 1024), randn(1, 1, 1024, seed=1))
    close(out, ref)
    (r,) = rep.regions
    return r


@pytest.mark.parametrize("fused_us,fuses", [(1.0, True), (50.0, False)])
def test_a_region_within_the_estimates_band_fuses_on_a_measurement(timers, fused_us, fuses):
    timers["fused"], timers["gemm"] = fused_us, 4.0
    r = _decode_norm_region()
    assert r.needs_measurement and r.fused_us > r.unfused_us, r.reason
    assert len(timers["region_calls"]) == 1
    if fuses:
        assert r.status in ("fused", "fusable") and "fused where a measurement pays" in r.reason, r.reason
        assert "; measured: fused 1.0 us" in r.reason, r.reason
        assert r.id in REGISTRY and r.calls == 1
    else:
        assert r.status == "fallback" and r.reason.startswith("measured on cpu: fused 50.0 us"), r.reason


def test_a_region_within_the_estimates_band_falls_back_unmeasured(timers):
    comfuse.config.measure = "off"
    timers["fused"] = timers["gemm"] = AssertionError("a timer ran with config.measure = 'off'")
    r = _decode_norm_region()
    assert r.status == "fallback" and r.reason.endswith("the estimate alone does not pay"), r.reason
    assert r.id not in REGISTRY and not timers["region_calls"]


def test_a_timer_error_drops_a_region_fused_only_on_a_measurement(timers, caplog):
    timers["fused"] = RuntimeError("no events here")
    r = _decode_norm_region()
    assert r.status == "fallback" and "not measured (RuntimeError: no events here)" in r.reason, r.reason
    assert r.id not in REGISTRY and r.calls == 0
    assert "no events here" in caplog.text


@pytest.mark.parametrize("drop", ["c_fc", "c_proj"])
def test_one_of_two_chained_regions_falls_back(timers, monkeypatch, drop):
    """GPT-2's MLP as two regions (c_fc + gelu_new, c_proj + residual): the measurement drops one;
    the other is replaced, its operand (or consumer) the dropped region's aten ops."""
    _always_fuse(monkeypatch)
    comfuse.config.b2b = "off"
    timers["gemm"] = 20.0
    timers["fused"] = lambda info: 1e4 if drop in info.root else 1.0
    out, ref, rep = run(M.GPT2MLP(256, 1024), randn(4, 64, 256))
    close(out, ref)
    by = {("c_fc" if "c_fc" in r.root else "c_proj"): r for r in rep.regions if "c_" in r.root}
    assert by[drop].status == "fallback" and by[drop].reason.startswith("measured on"), by[drop].reason
    assert by[drop].id not in REGISTRY and by[drop].calls == 0
    (kept,) = [r for k, r in by.items() if k != drop]
    assert kept.id in REGISTRY and kept.calls == 1 and "; measured:" in kept.reason


def test_random_input_keeps_layout_and_sizes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        w = torch.empty(64, 32, dtype=torch.bfloat16).t()        # [32, 64], strides (1, 32)
        b = torch.empty(64, dtype=torch.float16).expand(8, 64)    # stride 0
        i = torch.empty(8, dtype=torch.int64)
        m = torch.empty(8, dtype=torch.bool)
    x = measure.random_input(w)
    assert not isinstance(x, torch._subclasses.FakeTensor)
    assert x.shape == (32, 64) and x.stride() == (1, 32) and x.dtype == torch.bfloat16 and (x != 0).all()
    y = measure.random_input(b)
    assert y.shape == (8, 64) and y.stride() == (0, 1) and (y != 0).all()
    assert measure.random_input(i).dtype == torch.int64 and measure.random_input(m).dtype == torch.bool
    assert measure.random_input(7) == 7


def _run_twice(fn):
    fn()
    fn()
    return 1.0


def test_region_runs_on_random_inputs_through_the_custom_ops_path(monkeypatch, emulate):
    """The real time_region and time_inductor (their clock replaced): the emulated kernel runs on
    the random operands (prepare() sees the real layouts), and Inductor compiles the region's aten
    graph inside the backend's own compile and runs it (its time scaled here so the kernel wins);
    the report counts only the model's call."""
    _always_fuse(monkeypatch)
    comfuse.config.measure = "on"
    monkeypatch.setattr(measure, "_time_us", _run_twice)
    monkeypatch.setattr(measure, "time_gemm", lambda *a: 1000.0)
    real_time_inductor = measure.time_inductor
    compiled = []

    def slower_inductor(rr, tensors, sizes, options):
        compiled.append(options)
        return 3.0 * real_time_inductor(rr, tensors, sizes, options)

    monkeypatch.setattr(measure, "time_inductor", slower_inductor)
    real_inductor_region, inductor_compiles = measure.inductor_region, []
    monkeypatch.setattr(measure, "inductor_region",
                        lambda *a: inductor_compiles.append(1) or real_inductor_region(*a))
    out, ref, rep = run(M.LinearGelu(64, 136), randn(3, 37, 64, seed=11))
    close(out, ref)
    (r,) = rep.regions
    assert len(compiled) == measure.ROUNDS and len(inductor_compiles) == 1  # a timing a round, one compile
    assert "_measure_inductor" not in vars(REGISTRY[r.id])  # its kernels not kept past the measurement
    assert r.measured["fused_us"] == 1.0 and r.measured["inductor_us"] == 3.0 and r.measured["unfused_us"] == 3.0
    assert ("; measured: fused 1.0 us vs unfused 3.0 us, fused / unfused 0.333 (median of 7 rounds 0.333-0.333) "
            "(Inductor's kernels for the region") in r.reason, r.reason
    assert "Inductor's kernels for the region 3.0 us (cuBLAS GEMM alone 1000.0 us)" in str(rep)
    assert r.calls == 1 and r.fallback_calls == 0 and r.id in REGISTRY


def test_inductor_time_is_the_unfused_path(timers, monkeypatch):
    """Where Inductor compiled the region, its time is the unfused one (not the GEMM plus the
    modeled epilogue): a kernel faster than cuBLAS plus the model but slower than Inductor's
    kernels falls back, and says so."""
    _always_fuse(monkeypatch)
    timers["gemm"], timers["fused"], timers["inductor"] = 100.0, 105.0, 101.0
    r, rep = _layernorm_region()
    assert r.status == "fallback", r.reason
    assert r.reason.startswith("measured on cpu: fused 105.0 us vs unfused 101.0 us, fused / unfused 1.040 (median "
                               f"of {measure.ROUNDS} rounds 1.040-1.040) (Inductor's kernels for the "
                               "region, measured; cuBLAS GEMM alone 100.0 us)"), r.reason
    assert r.measured["inductor_us"] == 101.0 and r.measured["unfused_us"] == 101.0
    # Alternating rounds, the order swapped each round (both meet the same clock states).
    assert timers["order"] == ["fused", "inductor"] + ["inductor", "fused", "fused", "inductor"] * (measure.ROUNDS // 2)


def test_alternating_rounds_decide_by_the_median_ratio(timers, monkeypatch):
    """One outlying round (a clock change) does not decide: the median of the rounds' ratios does
    (each side's median is reported)."""
    _always_fuse(monkeypatch)
    fused, inductor = iter([90.0, 104.0, 103.0, 103.0, 104.0, 103.0, 104.0]), \
        iter([100.0, 101.0, 102.0, 101.0, 102.0, 101.0, 102.0])
    assert measure.ROUNDS == 7
    timers["gemm"] = 100.0
    timers["fused"], timers["inductor"] = (lambda info: next(fused)), (lambda info: next(inductor))
    r, rep = _layernorm_region()
    assert r.measured["fused_us"] == 103.0 and r.measured["inductor_us"] == 101.0
    assert len(r.measured["round_ratios"]) == 7 and r.measured["round_ratios"][0] == 0.9
    assert r.measured["ratio"] == pytest.approx(104.0 / 102.0)  # the rounds ratios median, not the medians ratio
    assert r.status == "fallback", r.reason


def test_a_kernel_that_falls_back_is_not_measured(timers, monkeypatch):
    """No GPU here: RuntimeRegion.run falls back to the aten ops, so there is nothing to time."""
    _always_fuse(monkeypatch)
    monkeypatch.setattr(measure, "time_region", _real_time_region)
    monkeypatch.setattr(measure, "_time_us", _run_twice)
    r, rep = _layernorm_region()
    assert "not measured (RuntimeError: the fused kernel did not run (" in r.reason, r.reason
    assert not r.measured and r.id in REGISTRY
    assert r.calls == 1 and r.fallback_calls == 1  # the model's call only


def test_inductor_region_compiles_an_aten_region():
    """The measurement's (and bench/models.py's per-region column's) Inductor kernels compile the
    region's aten graph itself (compile_fx), so they are Inductor's code by construction; here on
    the CPU, against the GraphModule's own output."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    def region(x, w, b):
        h = torch.ops.aten.addmm(b, x, w)
        return (0.5 * h * (1 + torch.tanh(0.79788456 * (h + 0.044715 * torch.pow(h, 3.0)))),)

    args = [torch.randn(64, 32), torch.randn(32, 48), torch.randn(48)]
    gm = make_fx(region)(*args)
    compiled = measure.inductor_region(gm, args)
    assert compiled is not gm
    torch.testing.assert_close(compiled(*args)[0], gm(*args)[0], rtol=1e-4, atol=1e-4)


def test_inductor_region_leaves_cuda_graphs_to_the_timing(monkeypatch):
    """The measurement captures Inductor's kernels in its own CUDA graph, so a mode's
    triton.cudagraphs (reduce-overhead, max-autotune) is dropped from the region's compile; the
    mode's other patches stay."""
    import torch._inductor.compile_fx as cfx

    seen = []
    monkeypatch.setattr(cfx, "compile_fx", lambda gm, args, config_patches: seen.append(config_patches) or (lambda *a: a))
    measure.inductor_region(torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph()), [],
                            {"triton.cudagraphs": True, "max_autotune": True})
    assert seen == [{"max_autotune": True}]


def test_measurement_pins_are_released():
    """A kernel the measurement's capture pinned is unpinned after it; the model's pins stay."""
    from comfuse.kernels import CACHE

    CACHE.pin("model's")
    with CACHE.pins_kept():
        CACHE.pin("measured")
    assert "model's" in CACHE.pinned and "measured" not in CACHE.pinned
    CACHE.pinned.discard("model's")
