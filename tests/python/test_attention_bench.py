"""bench/attention.py on the CPU: everything but the GPU. Each case's graph is one batched B2B pair
whose fp64 execution is torch's SDPA (math, float64) on the same inputs (the scale, the causal
alignment and batch x heads as the leading dim agree); FLOPs, case selection, ratios and the
table come out as expected on made-up rows; --dry-run plans every row."""
import math

import pytest
import torch
import torch.nn.functional as F

from comfuse import _core
from comfuse.reference import _host, _torch
from conftest import load_bench

at = load_bench("attention")


def test_cases_are_the_issues_shapes():
    ids = [c.id for c in at.CASES]
    assert ids == ["B4 H16 S1024 D128 full", "B4 H16 S1024 D128 causal", "B8 H16 S2048 D64 full",
                   "B8 H16 S2048 D64 causal", "B4 H16 S4096 D128 full", "B4 H16 S4096 D128 causal"]
    c = at.CASES[1]
    assert c.dims() == {"B": 64, "M": 1024, "N": 1024, "K": 128, "DV": 128}
    assert at.CASES[0].flops() == 4.0 * 64 * 1024 * 1024 * 128
    assert c.flops() == pytest.approx(at.CASES[0].flops() * (1024 * 1025 / 2) / 1024**2)
    assert [x.id for x in at.select(at.CASES, "S2048,S4096 D128 causal")] == [
        "B8 H16 S2048 D64 full", "B8 H16 S2048 D64 causal", "B4 H16 S4096 D128 causal"]
    assert at.select(at.CASES, "") == at.CASES


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_graph_is_one_batched_pair_computing_sdpa(causal, d):
    case = at.Case(2, 3, 70, d, causal)
    g = _core.parse_graph(at.graph_text(case))
    low = _core.lower(g)
    assert low.is_b2b(), low.describe()
    assert "batch=B" in low.regions()[0].spec_text()
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(case.batches, case.s, d, generator=gen).to(torch.bfloat16).double() for _ in range(3))
    out = _core.run_graph(g, case.dims(), {"q": _host(q), "k": _host(k), "v": _host(v)})
    got = _torch(*out["o"])
    want = F.scaled_dot_product_attention(q.view(2, 3, 70, d), k.view(2, 3, 70, d), v.view(2, 3, 70, d),
                                          is_causal=causal).reshape(got.shape)
    # The graph rounds P and O to bf16 as the kernel does; SDPA in f64 does not.
    assert torch.linalg.vector_norm(got - want) / torch.linalg.vector_norm(want) < 1e-2


def _row(case, comfuse_ms, backend_ms, skipped=None):
    times = {"comfuse": comfuse_ms, **{b: m for b, m in backend_ms.items()}}
    return {"id": case.id, "times": times, "tflops": {k: at.tflops(case, v) for k, v in times.items()},
            "ratios": {b: comfuse_ms / m for b, m in backend_ms.items()}, "rel_l2": {"comfuse": 3e-3},
            "skipped": skipped or {}, "failed": False}


def test_table_has_every_backend_with_ratios():
    c = at.CASES[0]
    rows = [_row(c, 1.0, {"cudnn": 0.8, "flash": 1.25, "efficient": 2.0}),
            _row(at.CASES[1], 0.6, {"flash": 0.5, "efficient": 1.0}, skipped={"cudnn": "no cuDNN attention"}),
            {"id": "B4 H16 S4096 D128 full", "error": "no usable GPU"}]
    md = at.markdown(rows, "Left out by --budget-s 1: x.")
    lines = md.splitlines()
    assert lines[0].startswith("| case | ComFuse ms | TFLOP/s | cudnn ms (TFLOP/s) | ComFuse / cudnn |")
    assert all(line.count("|") == lines[0].count("|") for line in lines[:5])
    assert "| 1.000 | 34 | 0.800 (43) | 1.250 | 1.250 (27) | 0.800 | 2.000 (17) | 0.500 |" in md
    assert "n/a: no cuDNN attention" in md
    assert "ERROR: no usable GPU" in md
    assert md.rstrip().endswith("Left out by --budget-s 1: x.")
    assert at.median_ratio([1.0, 2.0, 3.0], [1.0, 1.0, 1.0]) == 2.0
    assert at.median_ratio([], [1.0]) is None


def test_dry_run_plans_every_case(capsys):
    assert at.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("one batched B2B kernel") == len(at.CASES)
    assert at.main(["--dry-run", "--cases", "nothing like this"]) == 2


# bench/decode_attention.py and the graph its kernel runs (attention.attention_graph with a mask).
dec = load_bench("decode_attention")


@pytest.mark.parametrize("m", [1, 5])
def test_masked_graph_computes_sdpa_with_the_additive_mask(m):
    """attention.attention_graph with a mask, executed in fp64, is SDPA with the additive mask
    (attention.additive_mask of a boolean key mask: -inf where a key is past its sequence's
    length, the whole of some rows' chunks included) added to the scaled scores."""
    from comfuse import attention

    b, h, n, d = 2, 3, 200, 64
    g = attention.attention_graph("bf16", 0.125, causal=False, mask="bf16")
    assert _core.lower(g).is_b2b()
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(b, h, m, d, generator=gen).to(torch.bfloat16)
    k, v = (torch.randn(b, h, n, d, generator=gen).to(torch.bfloat16) for _ in range(2))
    keep = torch.arange(n)[None, None, None, :] < torch.tensor([3, 150])[:, None, None, None]
    mask = attention.additive_mask(keep, torch.bfloat16, (b, h, m, n))
    host = {name: _host(t.double().reshape(b * h, *t.shape[2:])) for name, t in (("q", q), ("k", k), ("v", v),
                                                                               ("mask", mask))}
    got = _torch(*_core.run_graph(g, {"B": b * h, "M": m, "N": n, "K": d, "DV": d}, host)["o"])
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=keep, scale=0.125)
    assert torch.linalg.vector_norm(got - want.reshape(got.shape)) / torch.linalg.vector_norm(want) < 1e-2


def test_decode_dry_run_plans_every_case(capsys):
    assert dec.main(["--dry-run"]) == 0
    kernels = sum(len(dec.variants(n)) for _, _, _, n, _ in dec.CASES)  # the planner's and each forced
    assert capsys.readouterr().out.count("one batched B2B kernel") == kernels
    assert dec.main(["--dry-run", "--cases", "nothing like this"]) == 2
