"""The nanobind module over the C++ core: builder, text, lowering, planner, fp64 executor,
errors; the direct kernel API's argument checks; the kernel cache."""
import pytest
import torch

import comfuse
from comfuse import _core
from comfuse.kernels import KernelCache, check_tensor
from comfuse.reference import _host, _torch

from conftest import randn


def ln_graph():
    g = comfuse.Graph()
    x = g.input("x", "bf16", ["M", "K"])
    w = g.input("w", "bf16", ["N", "K"])
    b = g.input("bias", "bf16", ["N"])
    gamma = g.input("gamma", "bf16", ["N"])
    y = g.layer_norm(g.binary("add", g.matmul(x, w), b), gamma, -1, 1e-5)
    g.output(y, "y", "bf16")
    return g


def test_builder_text_round_trip_and_lowering():
    g = ln_graph()
    text = g.text()
    assert "matmul(x, w)" in text and "output" in text
    assert comfuse.parse_graph(text).text() == text
    low = comfuse.lower(g)
    (r,) = low.regions()
    assert r.reductions == 2 and r.stages == 3
    assert not low.fallbacks()
    assert "region 0" in low.describe()
    roles = {a["name"]: a["role"] for a in r.args()}
    assert roles == {"x": "operand_a", "w": "operand_b", "bias": "row_vector", "gamma": "row_vector", "y": "output"}
    assert "fusion" in r.spec_text()


def test_llama_mlp_graph_lowers_to_the_gated_pair():
    """Llama's MLP as one ComFuse graph: Φ merges gate_proj and up_proj (they share x and meet in
    silu(gate) * up) into one gated region whose spec reads W3 as the gate operand. (The
    torch.compile frontend fuses one GEMM per region; this is the graph API.)"""
    g = comfuse.Graph()
    x = g.input("x", "bf16", ["M", "K"])
    gate = g.matmul(x, g.input("w1", "bf16", ["N", "K"]))
    up = g.matmul(x, g.input("w3", "bf16", ["N", "K"]))
    s = g.cast(g.binary("mul", g.unary("silu", gate), up), "bf16")
    g.output(g.matmul(s, g.input("w2", "bf16", ["D", "N"])), "y", "bf16")
    low = comfuse.lower(g)
    first, _ = low.regions()
    assert not low.fallbacks()
    assert "one gated GEMM1 (region 0, two accumulators)" in low.describe()
    assert "one kernel, S in registers" in low.describe()
    roles = {a["name"]: a["role"] for a in first.args()}
    assert roles["w3"] == "operand_gate" and roles["w1"] == "operand_b"


def test_plan_and_explain():
    (r,) = comfuse.lower(ln_graph()).regions()
    p = r.plan({"M": 8192, "N": 4096, "K": 4096})
    s = p.summary()
    assert s["m"] == 8192 and s["total_us"] > 0 and s["reasons"]
    assert "plan for fusion" in p.explain()
    assert p.dot().startswith("digraph")
    forced = r.plan({"M": 8192, "N": 4096, "K": 4096}, {"aggregation": "p2p"}).summary()
    assert forced["aggregation"].startswith("peer")
    with pytest.raises(_core.Error, match="aggregation"):
        r.plan({"M": 64, "N": 4096, "K": 4096}, {"aggregation": "ring"})
    with pytest.raises(_core.Error, match="unknown plan option"):
        r.plan({"M": 64, "N": 4096, "K": 4096}, {"tile": 3})


def test_fp64_executor_matches_torch():
    g = ln_graph()
    m, n, k = 37, 136, 64
    ins = {"x": randn(m, k, seed=1), "w": randn(n, k, scale=0.1, seed=2), "bias": randn(n, seed=3),
           "gamma": randn(n, offset=1.0, seed=4)}
    out = comfuse.run_graph(g, {"M": m, "N": n, "K": k}, {k_: _host(v) for k_, v in ins.items()})
    y = _torch(*out["y"])
    d = {k_: v.double() for k_, v in ins.items()}
    ref = torch.nn.functional.layer_norm(d["x"] @ d["w"].t() + d["bias"], (n,), d["gamma"], None, 1e-5)
    ref = ref.to(torch.bfloat16).double()
    assert (y - ref).abs().max() <= 2 ** -7 * ref.abs().max()


def test_builder_errors_are_comfuse_errors():
    g = comfuse.Graph()
    x = g.input("x", "bf16", ["M", "K"])
    with pytest.raises(_core.Error, match="unknown unary op 'frob'"):
        g.unary("frob", x)
    with pytest.raises(_core.Error, match="unknown dtype"):
        g.input("y", "int8", ["M"])
    with pytest.raises(_core.Error, match="rank-2"):
        g.matmul(x, g.input("v", "bf16", ["K"]))
    with pytest.raises(_core.Error, match="line 1"):
        comfuse.parse_graph("input x: bf16[M, K\n")


def test_compile_without_gpu_says_why():
    if comfuse.gpu_available()[0]:
        pytest.skip("this machine has an sm_90 GPU")
    ok, why = comfuse.gpu_available()
    assert not ok and "sm_90" in why
    with pytest.raises(_core.Error, match="no usable GPU"):
        comfuse.compile_graph(ln_graph(), {"M": 128, "N": 256, "K": 64})


def test_check_tensor_errors():
    with pytest.raises(ValueError, match="on cpu"):
        check_tensor("x", torch.zeros(4, 8, dtype=torch.bfloat16), torch.bfloat16, [4, 8])
    with pytest.raises(TypeError):
        check_tensor("x", 3.0, torch.bfloat16, [4, 8])


def test_kernel_cache_is_a_bounded_lru_that_keeps_pinned_kernels():
    comfuse.config.kernel_cache_size = 2
    c = KernelCache()
    c.put("a", 1)
    c.pin("a")
    c.put("b", 2)
    c.put("c", 3)
    assert c.get("a") == 1 and c.get("b") is None and c.get("c") == 3
    c.put("d", 4)
    assert c.get("a") == 1 and c.get("c") is None and c.get("d") == 4
    c.clear()
    assert c.get("a") == 1 and c.get("d") is None
