"""A projection used as two column halves (Phi-3's gate_up_proj: one Linear over the stacked gate
and up weights, chunk(2, -1), act(gate) * up) is the gated GEMM of N/2 columns Llama's separate
gate_proj and up_proj become: W1 and W3 are the weight's two blocks, read in place
(translate.Halves). On the CPU: the translation against torch in fp64, the argument tables of
the single-region path with the kernels emulated (the B2B path: test_b2b_pairs.py's PAIRS), the
unfused side priced as the one GEMM the model runs, and every split that is no such pair left to
Inductor with the reason."""
import pytest
import torch

import comfuse
from comfuse import _core
from comfuse.capture import capture

from conftest import randn
import modules as M
from test_b2b_pairs import module, randomize
from test_reference import _check
from test_runtime_glue import emulate  # noqa: F401 (the fixture: kernels emulated on the CPU)

CASES = {
    "phi3": (lambda: M.StackedGatedMLP(64, 200, up_first=True), (3, 37, 64)),
    "gate_first_gelu": (lambda: M.StackedGatedMLP(64, 136, act="gelu"), (101, 64)),
    "linear_bias": (lambda: M.StackedGatedMLP(72, 200, bias=True), (2, 45, 72)),
    "conv1d_bias": (lambda: M.StackedGatedMLP(64, 200, conv1d=True), (3, 37, 64)),
    "split_with_sizes": (lambda: M.StackedGatedMLP(64, 136, sizes=[136, 136]), (2, 45, 64)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_halves_are_one_gated_region_matching_torch_fp64(case):
    comfuse.config.b2b = "off"
    make, shape = CASES[case]
    model = randomize(module(make()))
    cap = capture(model, randn(*shape, offset=0.1, seed=5))
    c = cap.by_root("gate_up_proj")
    tr = c.translator
    assert tr is not None and tr.halves is not None, c.info.reason
    half = model.down_proj.in_features
    assert tr.gemm.n == half and c.info.n == half
    assert "input b3: bf16[N, K]" in c.info.graph_text or "input b3: bf16[K, N]" in c.info.graph_text, c.info.graph_text
    assert tr.input_cols[tr.input_roles.index("b")] == (0, half)
    assert tr.input_cols[tr.input_roles.index("b3")] == (half, 2 * half)
    assert any("split" in op for op in c.info.ops), c.info.ops
    assert all(e.reason.startswith("a second GEMM") for e in c.info.excluded), c.info.excluded  # down_proj only
    low = _core.lower(_core.parse_graph(c.info.graph_text))
    assert "one gated GEMM (region 0, two accumulators)" in low.describe(), low.describe()
    _check(c, cap.values)


def test_unfused_side_is_the_models_one_gemm():
    """decide() prices the unfused path as the model runs it: one GEMM of 2N columns (not two of N)
    and an epilogue reading both halves."""
    comfuse.config.b2b = "off"
    cap = capture(module(M.StackedGatedMLP(1024, 2816)), randn(4, 512, 1024))
    c = cap.by_root("gate_up_proj")
    assert c.translator.halves is not None
    assert f"GEMM of {2 * 2816} columns" in c.info.reason, c.info.reason
    from comfuse.partition import bare_gemm_us

    gemm = bare_gemm_us(2048, 2 * 2816, 1024, "bf16", "nk")
    assert c.info.unfused_gemm_columns == [2 * 2816]  # what measure.py times without Inductor, too
    assert c.info.unfused_us == pytest.approx(gemm + c.info.unfused_epilogue_us)
    llama = capture(module(M.LlamaMLP(1024, 2816)), randn(4, 512, 1024)).by_root("gate_proj")
    assert llama.translator.gates and llama.info.unfused_gemm_columns == [2816, 2816]


def test_phi3_decode_gate_up_waits_for_a_measurement():
    """Phi-3-mini's gate_up at decode (1 x 8192 x 3072, the halves as one gated GEMM over 128 CTAs):
    priced at the short kernels' one-wave DRAM rate above the model's one GEMM of 16384 columns plus
    its epilogue, while it measured 27.5 us against cuBLAS's 31.9 (bench/sweeps/gated_split_k.txt):
    the plan's low bound streams B at the DRAM's long-stream rate (calibration.h, one-wave long
    streams), so the region is fused where a measurement pays instead of refused on the estimate."""
    comfuse.config.b2b = "off"
    cap = capture(module(M.StackedGatedMLP(3072, 8192, up_first=True)), randn(1, 1, 3072))
    c = cap.by_root("gate_up_proj")
    assert c.translator.halves is not None
    assert c.info.plan["k_splits"] == 1
    assert c.info.plan["low_us"] < c.info.unfused_us < c.info.fused_us, c.info.reason
    assert c.info.status == "fused" and c.info.needs_measurement, c.info.reason
    assert c.info.reason.endswith("fused where a measurement pays"), c.info.reason


@pytest.mark.parametrize("make,why", [
    (lambda: M.StackedGatedMLP(64, 136, chunks=3), "split"),                 # three blocks
])
def test_other_splits_stay_with_inductor_and_say_why(make, why):
    comfuse.config.b2b = "off"
    model = randomize(module(make()))
    cap = capture(model, randn(2, 45, 64, offset=0.1))
    c = cap.by_root("gate_up_proj")
    assert c.translator is None or c.translator.halves is None
    assert c.info.status == "fallback" and why in c.info.reason, c.info.reason


class FullValueUsed(torch.nn.Module):
    """The projection's whole value is used besides its halves: no gated GEMM (its 2N columns are
    stored), the split stays outside."""

    def __init__(self):
        super().__init__()
        self.gate_up_proj = torch.nn.Linear(64, 272, bias=False)

    def forward(self, x):
        h = self.gate_up_proj(x)
        g, u = h.chunk(2, dim=-1)
        return torch.nn.functional.silu(g) * u, h.sum(-1)


def test_whole_value_used_elsewhere_is_no_halves():
    comfuse.config.b2b = "off"
    cap = capture(randomize(module(FullValueUsed())), randn(2, 45, 64))
    c = cap.by_root("gate_up_proj")
    assert c.translator is None or c.translator.halves is None
    assert not any("split" in op for op in c.info.ops), c.info.ops


@pytest.mark.parametrize("case", sorted(CASES))
def test_halves_runtime_path_emulated(emulate, case):
    """The custom op's arguments: W1 and W3 (and the bias halves) are the weight's blocks in place,
    as the kernel's [N, K] rows (Linear) or [K, N] columns (Conv1D); outputs match eager."""
    make, shape = CASES[case]
    model = randomize(module(make()))
    x = randn(*shape, offset=0.1, seed=3)
    seen = {}
    from comfuse import kernels

    prepare = kernels.RuntimeRegion.prepare

    def spy(self, tensors, *a, **kw):
        res = prepare(self, tensors, *a, **kw)
        if "b3" in self.names:
            seen["w"] = next(t for t, r in zip(tensors, self.roles) if r == "b")
            seen["views"] = res[3]
        return res

    kernels.RuntimeRegion.prepare = spy
    try:
        with torch.no_grad(), comfuse.collecting() as rep:
            ref = model(x)
            out = torch.compile(model, backend="comfuse")(x)
    finally:
        kernels.RuntimeRegion.prepare = prepare
    reg = next(r for r in rep.regions if "gate_up_proj" in r.root)
    assert reg.calls == 1 and reg.fallback_calls == 0, (reg.status, reg.reason, reg.runtime_fallback)
    w, views = seen["w"], seen["views"]
    base = w.untyped_storage().data_ptr()
    assert views["b"].untyped_storage().data_ptr() == base == views["b3"].untyped_storage().data_ptr()  # no copy
    half = model.down_proj.in_features
    step = half * (w.stride(0) if w.stride(0) != 1 else w.stride(1)) if not isinstance(model.gate_up_proj, M.Conv1D) \
        else half
    assert views["b3"].data_ptr() - views["b"].data_ptr() == step * w.element_size()
    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    assert err < 1e-2, err


def test_halves_under_dynamic_rows(emulate):
    """Symbolic M (decode and prefill sharing one graph): the halves still are one gated region,
    and two row counts run through it."""
    model = randomize(module(M.StackedGatedMLP(64, 136, up_first=True)))
    f = torch.compile(model, backend="comfuse", dynamic=True)
    with torch.no_grad(), comfuse.collecting() as rep:
        for rows in (5, 77):
            x = randn(1, rows, 64, offset=0.1, seed=rows)
            err = ((f(x).float() - model(x).float()).norm() / model(x).float().norm()).item()
            assert err < 1e-2, (rows, err)
    reg = next(r for r in rep.regions if "gate_up_proj" in r.root)
    assert any("split" in op for op in reg.ops) and reg.calls == 2 and reg.fallback_calls == 0, (reg.reason,
                                                                                                   reg.runtime_fallback)


class HalvesThenNorm(torch.nn.Module):
    """The gated product normed: the gated GEMM takes an elementwise epilogue only."""

    def __init__(self):
        super().__init__()
        self.gate_up_proj = torch.nn.Linear(64, 272, bias=False)
        self.ln = torch.nn.LayerNorm(136)

    def forward(self, x):
        g, u = self.gate_up_proj(x).chunk(2, -1)
        return self.ln(torch.nn.functional.silu(g) * u)


def test_a_reduction_after_the_halves_ends_the_region_there():
    comfuse.config.b2b = "off"
    cap = capture(randomize(module(HalvesThenNorm())), randn(2, 45, 64, offset=0.1))
    c = cap.by_root("gate_up_proj")
    assert c.translator is not None and c.translator.halves is not None, c.info.reason
    assert [op.split(":")[-1] for op in c.info.ops[1:]] == ["split", "silu", "mul"], c.info.ops
    assert any("layer_norm" in e.node and "elementwise" in e.reason for e in c.info.excluded), c.info.excluded
    _check(c, cap.values)
