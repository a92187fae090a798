"""bench/matrix.py on the CPU: everything but timing. The GPU run is expensive and cannot be
repeated cheaply, so here: every case's graph builds, lowers to one region and plans (with its
forced alternatives); every torch epilogue computes the same function as its ComFuse graph (the
fp64 reference executor); the whole row pipeline runs with the kernels emulated by that executor
and made-up times (ratios, the correctness gate, rows that cannot build, the time budget); the
tables come out with the expected columns."""
import dataclasses
import json
import math
import os

import pytest
import torch

import comfuse
from comfuse import _core
from comfuse.reference import _host, _torch
from conftest import load_bench

mx = load_bench("matrix")
CASE_IDS = [c.name for c in mx.CASES]
# Rows the planner is expected to refuse (the row then says why): GPT-2's vocabulary, 50257 f32
# columns, is no multiple of 4 (a TMA row must be a multiple of 16 bytes).
REFUSED = {("vocab softmax f32", (1024, 50257, 4096)): "multiple of 16"}


# ---- the cases' graphs and plans ---------------------------------------------------------------
def test_case_table_is_well_formed():
    ids = [mx.row_id(c, s) for c in mx.CASES for s in c.shapes]
    assert len(ids) == len(set(ids)), "two rows share an id"
    assert len({c.name for c in mx.CASES}) == len(mx.CASES)
    for c in mx.CASES:
        assert c.shapes and all(len(s) == 3 and all(isinstance(d, int) and d > 0 for d in s) for s in c.shapes), c.name
        assert callable(c.torch_fn)
    # the shape classes are all there
    names = " ".join(ids)
    for want in ("decode rmsnorm 1x2048x4096", "decode rmsnorm 7x", "decode layernorm 16x4096x4096",
                 "small softmax 256x4096x4096", "small bias+gelu 256x", "row-block bias+gelu 64x1024x3072",
                 "medium layernorm 2048x2048x1024",
                 "medium softmax 1024x4096x1024", "wide-N layernorm 4096x8192x4096", "large layernorm 8192x4096x4096",
                 "large rmsnorm 8192x", "large softmax 8192x", "chain", "softmax f32 1024x128256x4096",
                 "log-softmax f32 1024x32768x4096", "residual layernorm 8192x1024x4096",
                 "residual rmsnorm 8192x4096x4096"):
        assert want in names, want


@pytest.mark.parametrize("name", CASE_IDS)
def test_case_graph_builds_lowers_and_plans(name):
    case = next(c for c in mx.CASES if c.name == name)
    g = mx.build_graph(case.graph)
    io = mx.graph_io(g)
    assert io.a and io.b and io.outputs
    low = comfuse.lower(g)
    (region,) = low.regions()
    assert not low.fallbacks(), low.describe()
    assert region.b_layout == "nk"  # the GEMM baseline is F.linear(a, b): B given N x K
    args = {a["name"]: a for a in region.args()}
    assert set(args) == {n for n, _, _ in io.inputs} | {n for n, _, _ in io.outputs}
    for n, dtype, per_row in io.outputs:  # the bench allocates per-row outputs [M] and tiles [M, N]
        assert args[n]["role"] == "output" and args[n]["dtype"] == dtype
        assert (args[n]["value_class"] == "col") == per_row
    if case.graph.endswith("[f32]"):
        assert all(dt == "f32" for _, dt, _ in io.outputs)
    for shape in case.shapes:
        r = mx.plan_row(case, shape)
        if (name, shape) in REFUSED:
            assert r["plan"] is None and REFUSED[(name, shape)] in r["plan_error"]
            continue
        assert r["plan_error"] is None and r["plan"], (shape, r)
        p = r["plan"]
        assert p["label"] and p["total_us"] > 0 and p["reductions"] == region.reductions
        m, n, k = shape
        assert "plan for fusion" in region.plan({"M": m, "N": n, "K": k}).explain()
        assert r["alts"], "every planned row has a forced alternative"
        for a in r["alts"]:
            assert a.get("refused") or a.get("plan"), a
        auto = r["alts"][0]["options"]
        assert set(auto) == ({"aggregation"} if region.reductions else {"cluster_n"})


def test_alternatives_flip_the_planners_choice():
    case = mx.CASES[0]
    assert mx.alternatives({"reductions": 1, "aggregation": "l2 (exchange ...)"}, case) == [{"aggregation": "p2p"}]
    assert mx.alternatives({"reductions": 2, "aggregation": "peer-to-peer"}, case) == [{"aggregation": "l2"}]
    assert mx.alternatives({"reductions": 0, "cluster_n": 2}, case) == [{"cluster_n": 1}]
    extra = dataclasses.replace(case, alts=({"strategy": "smem-stash"}, {"aggregation": "p2p"}))
    assert mx.alternatives({"reductions": 1, "aggregation": "l2"}, extra) == [{"aggregation": "p2p"},
                                                                            {"strategy": "smem-stash"}]
    assert mx.opts_label({"aggregation": "p2p"}) == "p2p"
    assert mx.opts_label({"strategy": "smem-stash"}) == "strategy=smem-stash"


def test_graph_text_variants():
    assert "output p: f32" in mx.graph_text("gemm_softmax[f32]")
    assert "output p: bf16" in mx.graph_text("gemm_softmax")
    text = mx.graph_text("gemm_residual_layernorm[f32]")
    assert "output h: f32" in text and "output y: f32" in text and "input x: bf16" in text


# ---- the torch baselines compute the fused kernel's function ------------------------------------
SMALL = {"M": 5, "N": 48, "K": 40}


def fp64_reference(case, inputs: dict, dims: dict) -> dict:
    """The case's ComFuse graph on the fp64 executor, outputs stored as f32 (the least rounding)."""
    g = _core.parse_graph(mx.outputs_as_f32(mx.graph_text(case.graph)))
    host = {}
    for name, v in inputs.items():
        if isinstance(v, torch.Tensor):
            host[name] = _host(v)
        else:
            host[name] = ([], torch.tensor(v, dtype=torch.float64).numpy().tobytes())
    res = _core.run_graph(g, dims, host)
    return {name: _torch(*res[name]) for name in res}


def assert_same_function(case, fn, seed=1):
    io = mx.graph_io(mx.build_graph(case.graph))
    ins = mx.make_inputs(io, SMALL, "cpu", seed=seed)
    ref = fp64_reference(case, ins, SMALL)
    got = fn(mx.upcast(ins, torch.float64), torch.float64)
    assert set(got) == {n for n, _, _ in io.outputs}
    for name, _, per_row in io.outputs:
        a = got[name].to(torch.float64).reshape(SMALL["M"], 1 if per_row else SMALL["N"])
        b = ref[name].reshape(a.shape)
        assert a.dtype == torch.float64, f"{name}: the torch epilogue dropped precision to {got[name].dtype}"
        # b is the fp64 result rounded to f32: a few f32 ulps apart at most
        torch.testing.assert_close(a, b, rtol=2e-6, atol=1e-8, msg=lambda m: f"{case.name} output {name}: {m}")


@pytest.mark.parametrize("name", CASE_IDS)
def test_torch_epilogue_matches_the_fp64_reference(name):
    case = next(c for c in mx.CASES if c.name == name)
    assert_same_function(case, case.torch_fn)


@pytest.mark.parametrize("wrong", ["erf gelu", "eps", "no residual"])
def test_the_epilogue_check_has_teeth(wrong):
    import torch.nn.functional as F

    by_graph = {c.graph: c for c in mx.CASES}
    if wrong == "erf gelu":
        case = by_graph["gemm_bias_gelu"]
        fn = lambda t, f32: {"y": F.gelu(F.linear(t["x"], t["w"], t["bias"]))}  # noqa: E731
    elif wrong == "eps":
        case = by_graph["gemm_rmsnorm"]
        fn = lambda t, f32: {"y": F.rms_norm(F.linear(t["a"], t["w"]), (SMALL["N"],), t["gamma"], 1e-5)}  # noqa: E731
    else:
        case = by_graph["gemm_residual_rmsnorm"]

        def fn(t, f32):
            h = F.linear(t["x"], t["w"])
            return {"h": h, "y": F.rms_norm(h, (SMALL["N"],), t["gamma"], 1e-6)}
    with pytest.raises(AssertionError):
        assert_same_function(case, fn)


@pytest.mark.parametrize("name", ["large layernorm", "residual layernorm", "chain softmax>LN>RMS",
                                  "vocab log-softmax f32"])
def test_torch_epilogue_traces_in_one_graph(name):
    """What torch.compile gets (inputs positional, scalars constant) traces without a graph break."""
    case = next(c for c in mx.CASES if c.name == name)
    io = mx.graph_io(mx.build_graph(case.graph))
    ins = mx.upcast(mx.make_inputs(io, SMALL, "cpu"), torch.float32)
    names = io.tensors()
    call = mx.torch_callable(case.torch_fn, names, {s: ins[s] for s in io.scalars()})
    compiled = torch.compile(mx.fresh(call), backend="eager", fullgraph=True)
    want = case.torch_fn(ins, torch.float32)
    got = compiled(*(ins[n] for n in names))
    for k in want:
        torch.testing.assert_close(got[k], want[k])


def test_fresh_gives_an_independent_code_object():
    def f(x, y=2):
        return x * y

    g = mx.fresh(f)
    assert g.__code__ is not f.__code__ and g(3) == 6 and g(3, y=3) == 9


# ---- the row pipeline with emulated kernels ------------------------------------------------------
class Emulated:
    """Stands for a ComFuse kernel called through comfuse.Kernel: checks the arguments as
    Kernel.__call__ / check_tensor would (apart from the device) and computes on the fp64 executor."""

    def __init__(self, graph, dims, args, corrupt=0.0):
        self.graph, self.dims, self.args, self.corrupt = graph, dims, args, corrupt
        self.calls = 0

    def __call__(self, scalars=None, **tensors):
        self.calls += 1
        host = {}
        for a in self.args:
            name, role = a["name"], a["role"]
            if role == "scalar":
                host[name] = ([], torch.tensor(scalars[name], dtype=torch.float64).numpy().tobytes())
                continue
            t = tensors[name]
            want = [d if isinstance(d, int) else self.dims[d] for d in a["shape"]]
            assert t.dtype == mx._TORCH_DT[a["dtype"]], name
            if len(want) == 2 and want[1] != 1:
                assert list(t.shape) == want, name
            else:
                assert t.numel() == math.prod(want), name
            assert t.is_contiguous(), name
            # check_tensor: a matrix's row stride is a multiple of 16 bytes (TMA); vectors and
            # [M, 1] columns are packed
            assert not (len(want) == 2 and want[1] != 1) or (t.stride(0) * t.element_size()) % 16 == 0, name
            if role != "output":
                host[name] = _host(t)
        assert set(tensors) == {a["name"] for a in self.args if a["role"] != "scalar"}
        res = _core.run_graph(self.graph, self.dims, host)
        for a in self.args:
            if a["role"] == "output":
                o = tensors[a["name"]]
                o.copy_((_torch(*res[a["name"]]) + self.corrupt).reshape(o.shape))
        return {}


FAKE_MS = {"gemm": 1.0, "fused": 1.1, "eager": 2.0, "compile": 1.5, "max-autotune": 1.4, "alt": 1.05}


class FakeBench:
    """GpuBench on the CPU: emulated kernels, torch.compile left out, made-up times."""

    device = "cpu"

    def __init__(self, corrupt=0.0, real_build=False, ncopies=2, corrupt_default_only=False):
        self.corrupt, self.real_build, self.ncopies = corrupt, real_build, ncopies
        self.corrupt_default_only = corrupt_default_only
        self.modes, self.built, self.measured = [], [], []

    def reset(self):
        torch._dynamo.reset()

    def sync(self):
        pass

    def cleanup(self):
        pass

    def copies(self, nbytes):
        assert nbytes > 0
        return self.ncopies

    def build(self, graph, dims, options):
        self.built.append(dict(options))
        if self.real_build:
            return mx.GpuBench.build(self, graph, dims, options)  # no GPU here: raises, and says why
        (region,) = comfuse.lower(graph).regions()
        plan = region.plan(dims, options)
        corrupt = self.corrupt if (options == {} or not self.corrupt_default_only) else 0.0
        return Emulated(graph, dims, region.args(), corrupt), {"build_s": 0.1, "compile_s": 0.1,
                                                                    "cache_hit": False, "plan": plan}

    def compile(self, fn, mode):
        self.modes.append(mode)
        return mx.fresh(fn)

    def measure(self, variants, copies):
        self.measured.append(sorted(variants))
        times = {}
        for v, fn in variants.items():
            for i in range(copies):
                fn(i)
            t = FAKE_MS[v.split(":")[0]]
            times[v] = [t * 2, t, t * 0.5]  # the GEMM swings the same way: ratios stay exact, medians t
        return times, {}


TINY = (64, 256, 128)


def tiny_rows(names=None):
    return [(c, TINY) for c in mx.CASES if names is None or c.name in names]


def fresh_results():
    return {"gpu": "CPU (emulated)", "torch": torch.__version__, "comfuse": "test", "timing": "fake", "rows": []}


def test_every_case_runs_through_the_pipeline(tmp_path):
    bench = FakeBench()
    logs = []
    results = fresh_results()
    fails = mx.run_matrix(tiny_rows(), bench, results, str(tmp_path), logs.append)
    assert fails == 0, "\n".join(logs)
    assert len(results["rows"]) == len(mx.CASES)
    assert bench.modes == [None, "max-autotune-no-cudagraphs"] * len(mx.CASES)
    for r in results["rows"]:
        assert r["status"] == "ok", (r["id"], r)
        assert r["copies"] == 2
        assert r["err"] and max(r["err"].values()) < 1e-2, (r["id"], r["err"])
        assert r["eager_err"] < 5e-2, (r["id"], r["eager_err"])
        assert r["ratio"]["fused"] == pytest.approx(1.1) and r["ratio"]["eager"] == pytest.approx(2.0)
        assert r["ratio"]["compile"] == pytest.approx(1.5) and r["ratio"]["max-autotune"] == pytest.approx(1.4)
        assert r["ms"]["gemm"] == pytest.approx(1.0)
        assert r["fused_tflops"] == pytest.approx(2 * math.prod(TINY) / 1.1e-3 / 1e12)
        timed = [a for a in r["alts"] if a.get("ratio") is not None]
        assert timed, r["alts"]
        for a in timed:
            assert a["ratio"] == pytest.approx(1.05) and a["vs_fused"] == pytest.approx(1.05 / 1.1) and a["beats_plan"]
            assert a["err"] and max(a["err"].values()) < 1e-2
    md = (tmp_path / "matrix.md").read_text()
    assert md.count("\n| ") == len(mx.CASES) + 1  # header + one line per row
    assert "**beats plan**" in md
    saved = json.loads((tmp_path / "matrix.json").read_text())
    assert [r["id"] for r in saved["rows"]] == [r["id"] for r in results["rows"]]


def test_a_wrong_kernel_fails_loudly_and_is_not_timed(tmp_path):
    bench = FakeBench(corrupt=1.0)
    logs = []
    results = fresh_results()
    fails = mx.run_matrix(tiny_rows({"large layernorm"}), bench, results, str(tmp_path), logs.append)
    assert fails == 1
    (r,) = results["rows"]
    assert r["status"] == "FAIL" and "FAILED the check" in r["fused_error"]
    assert "fused" not in r["ms"] and not any(v.startswith("alt:") for v in r["ms"])
    assert "gemm" in r["ms"] and "eager" in r["ms"]  # the baselines are still timed
    assert any(line.startswith("!!!") and "FAILED" in line for line in logs)
    md = (tmp_path / "matrix.md").read_text()
    assert "**FAIL" in md


def test_a_wrong_default_plan_still_times_the_alternatives(tmp_path):
    results = fresh_results()
    fails = mx.run_matrix(tiny_rows({"large rmsnorm"}), FakeBench(corrupt=0.5, corrupt_default_only=True), results,
                          str(tmp_path), lambda m: None)
    assert fails == 1
    (r,) = results["rows"]
    assert r["status"] == "FAIL" and "fused" not in r["ms"]
    (a,) = r["alts"]
    assert a["ratio"] == pytest.approx(1.05) and "vs_fused" not in a and max(a["err"].values()) < 1e-2
    note = next(ln for ln in (tmp_path / "matrix.md").read_text().splitlines() if ln.startswith("- large rmsnorm"))
    assert note.endswith("1.05x GEMM")  # no comparison with a default that was not timed


def test_nan_output_fails(tmp_path):
    results = fresh_results()
    fails = mx.run_matrix(tiny_rows({"small softmax"}), FakeBench(corrupt=float("nan")), results, str(tmp_path),
                          lambda m: None)
    assert fails == 1 and results["rows"][0]["status"] == "FAIL"
    assert mx.failed({"y": float("nan"), "h": 1e-3}) == ["y"]
    assert mx.failed({"y": math.inf}) == ["y"]


@pytest.mark.skipif(comfuse.gpu_available()[0], reason="needs a machine without a GPU, where the real build fails")
def test_a_kernel_that_cannot_build_is_a_row_that_says_why(tmp_path):
    # The real build on a machine without a GPU: compile_graph raises, the row says why and the
    # baselines are still timed.
    bench = FakeBench(real_build=True)
    results = fresh_results()
    fails = mx.run_matrix(tiny_rows({"residual rmsnorm"}), bench, results, str(tmp_path), lambda m: None)
    assert fails == 0
    (r,) = results["rows"]
    assert r["status"] == "ok" and r["fused_error"].startswith("not built:") and "GPU" in r["fused_error"]
    assert bench.built == [{}]  # no alternative after the default failed
    assert set(r["ms"]) == {"gemm", "eager", "compile", "max-autotune"}
    assert "not built:" in (tmp_path / "matrix.md").read_text()


def test_a_shape_the_planner_refuses_is_a_row_that_says_why(tmp_path):
    case = next(c for c in mx.CASES if c.name == "vocab softmax f32")
    bench = FakeBench()
    results = fresh_results()
    mx.run_matrix([(case, (64, 250, 128))], bench, results, str(tmp_path), lambda m: None)  # f32 rows of 1000 bytes
    (r,) = results["rows"]
    assert r["plan"] is None and "multiple of 16" in r["plan_error"] and not bench.built
    assert set(r["ms"]) == {"gemm", "eager", "compile", "max-autotune"}
    line = next(ln for ln in (tmp_path / "matrix.md").read_text().splitlines() if ln.startswith("| vocab softmax f32"))
    assert "not planned: " in line and "multiple of 16" in line


def test_an_unexpected_error_is_a_row_not_a_crash(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("device fell over")

    monkeypatch.setattr(FakeBench, "measure", boom)
    results = fresh_results()
    logs = []
    mx.run_matrix(tiny_rows({"small softmax", "small layernorm"}), FakeBench(), results, str(tmp_path), logs.append)
    assert [r["status"] for r in results["rows"]] == ["error", "error"]
    assert "device fell over" in results["rows"][0]["reason"]
    assert "ERROR: RuntimeError: device fell over" in (tmp_path / "matrix.md").read_text()


def test_the_time_budget_skips_rows(tmp_path):
    bench = FakeBench()
    results = fresh_results()
    logs = []
    mx.run_matrix(tiny_rows({"small softmax", "small layernorm"}), bench, results, str(tmp_path), logs.append,
                  deadline=1.0)  # long past
    assert [r["status"] for r in results["rows"]] == ["skipped", "skipped"] and not bench.measured
    assert all("skipped" in m for m in logs[:2])
    assert (tmp_path / "matrix.md").read_text().count("skipped: time budget spent") == 2


# ---- selection, merging, the CLI ---------------------------------------------------------------
def test_select_rows():
    everything = mx.select_rows(mx.CASES)
    assert len(everything) == sum(len(c.shapes) for c in mx.CASES)
    quick = mx.select_rows(mx.CASES, quick=True)
    assert [c.name for c, _ in quick] == [c.name for c in mx.CASES if c.quick]
    assert all(s == c.shapes[0] for c, s in quick)
    decode = mx.select_rows(mx.CASES, "decode")
    assert len(decode) == 6 and all(c.name.startswith("decode") for c, _ in decode)
    by_shape = mx.select_rows(mx.CASES, "8192x1024x4096")
    assert {c.name for c, _ in by_shape} == {"residual layernorm", "residual rmsnorm"}
    assert len(mx.select_rows(mx.CASES, "Softmax, RMSNORM")) == len(
        [1 for c in mx.CASES for s in c.shapes if "softmax" in c.name or "rmsnorm" in c.name or "softmax" in c.graph
         or "rmsnorm" in c.graph])
    assert mx.select_rows(mx.CASES, "gemm_bias_gelu")[0][0].name == "small bias+gelu"


def test_merge_keeps_other_rows():
    old = [{"id": "a"}, {"id": "b", "v": 1}]
    assert mx.merge_rows(old, [{"id": "b", "v": 2}, {"id": "c"}]) == [{"id": "a"}, {"id": "b", "v": 2}, {"id": "c"}]


def test_main_dry_run_plans_on_the_cpu(tmp_path):
    out = str(tmp_path)
    assert mx.main(["--dry-run", "--out", out, "--cases", "large,vocab softmax"]) == 0
    md = (tmp_path / "matrix.md").read_text()
    assert "| large layernorm | 8192,4096,4096 |" in md and "not planned: " in md
    rows = json.loads((tmp_path / "matrix.json").read_text())["rows"]
    assert len(rows) == 3 + 3 and all(r["status"] == "planned" for r in rows)
    # --merge keeps what an earlier call wrote
    assert mx.main(["--dry-run", "--out", out, "--cases", "decode rmsnorm", "--merge"]) == 0
    rows = json.loads((tmp_path / "matrix.json").read_text())["rows"]
    assert len(rows) == 6 + 3
    assert os.path.exists(tmp_path / "matrix.log")


def test_main_without_a_gpu_says_so(tmp_path):
    if comfuse.gpu_available()[0]:
        pytest.skip("a GPU is here")
    assert mx.main(["--out", str(tmp_path), "--cases", "small softmax"]) == 2
    assert "needs an sm_90 GPU" in (tmp_path / "matrix.log").read_text()


# ---- the tables ---------------------------------------------------------------------------------
def fake_results():
    plan = {"label": "128x128 c2x1 rg32 l2 on-chip", "total_us": 362.8}
    return {"gpu": "NVIDIA H200", "torch": "2.11", "comfuse": "0.1.0", "timing": "fake", "rows": [
        {"id": "large layernorm 8192x4096x4096", "case": "large layernorm", "m": 8192, "n": 4096, "k": 4096,
         "status": "ok", "plan": plan, "plan_error": None,
         "ms": {"gemm": 0.35, "fused": 0.385, "eager": 0.52, "compile": 0.41, "max-autotune": 0.40, "alt:p2p": 0.37},
         "ratio": {"fused": 1.1, "eager": 1.486, "compile": 1.171, "max-autotune": 1.143, "alt:p2p": 1.057},
         "alts": [{"label": "p2p", "options": {"aggregation": "p2p"}, "plan": {"label": "64x256 c1x16 p2p on-chip",
                                                                               "total_us": 453.6},
                   "ratio": 1.057, "vs_fused": 0.961, "beats_plan": True},
                  {"label": "strategy=smem-stash", "options": {"strategy": "smem-stash"}, "refused": "plan: nothing fits"}],
         "err": {"y": 2.1e-3}, "fused_tflops": 714.2, "variant_errors": {}},
        {"id": "vocab softmax f32 1024x50257x4096", "case": "vocab softmax f32", "m": 1024, "n": 50257, "k": 4096,
         "status": "ok", "plan": None, "plan_error": "plan: rows of 201028 bytes; TMA needs a multiple of 16",
         "ms": {"gemm": 0.6, "eager": 1.2}, "ratio": {"eager": 2.0}, "alts": [], "err": {},
         "variant_errors": {"max-autotune": "BackendCompilerFailed: x"}},
        {"id": "residual rmsnorm 8192x1024x4096", "case": "residual rmsnorm", "m": 8192, "n": 1024, "k": 4096,
         "status": "FAIL", "plan": plan, "plan_error": None, "fused_error": "FAILED the check against torch float32",
         "ms": {"gemm": 0.1}, "ratio": {}, "alts": [{"label": "p2p", "options": {}, "plan": plan, "same_as_default": True}],
         "err": {"h": 1e-3, "y": 0.25}, "variant_errors": {}},
        {"id": "decode rmsnorm 1x2048x4096", "case": "decode rmsnorm", "m": 1, "n": 2048, "k": 4096,
         "status": "skipped", "reason": "time budget spent"},
    ]}


def test_table_columns_and_cells(tmp_path):
    mx.write_results(fake_results(), str(tmp_path))
    md = (tmp_path / "matrix.md").read_text()
    lines = md.splitlines()
    header = next(ln for ln in lines if ln.startswith("| case |"))
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "case", "M,N,K", "GEMM us", "ComFuse plan", "fused/GEMM", "eager/GEMM", "compile/GEMM", "max-autotune/GEMM",
        "forced-alt/GEMM", "fused TFLOP/s", "error"]
    assert lines[lines.index(header) + 1] == "|" + "---|" * 11
    assert ("| large layernorm | 8192,4096,4096 | 350.0 | 128x128 c2x1 rg32 l2 on-chip (est 363 us) | 1.10x | 1.49x | "
            "1.17x | 1.14x | 1.06x p2p **beats plan** | 714 | 2.1e-03 |") in md
    assert ("| vocab softmax f32 | 1024,50257,4096 | 600.0 | not planned: plan: rows of 201028 bytes; TMA needs a "
            "multiple of 16 | - | 2.00x | - | - | - | - | - |") in md
    row = next(ln for ln in lines if ln.startswith("| residual rmsnorm"))
    assert "FAILED the check" in row and "**FAIL 0.25 (y)**" in row and "- (p2p: same plan)" in row
    assert "| decode rmsnorm | 1,2048,4096 | - | skipped: time budget spent | - |" in md
    # the notes name every forced alternative and every baseline that failed
    assert "- large layernorm 8192x4096x4096: forced p2p (64x256 c1x16 p2p on-chip): 1.06x GEMM, 0.961x the planner's choice" in md
    assert "forced strategy=smem-stash: plan: nothing fits" in md
    assert "max-autotune: BackendCompilerFailed: x" in md
    data = json.loads((tmp_path / "matrix.json").read_text())
    assert data["gpu"] == "NVIDIA H200" and len(data["rows"]) == 4
    for r in fake_results()["rows"]:  # every row renders to the same number of cells
        assert len(mx.table_row(r)) == len(mx.COLUMNS)


def test_summary_line():
    r = fake_results()["rows"][0]
    r["wall_s"] = 42.0
    s = mx.summary_line(r)
    assert "fused/GEMM 1.10x" in s and "error 2.1e-03" in s and "(42 s)" in s
