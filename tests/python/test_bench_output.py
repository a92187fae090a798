"""bench/models.py's report writing (the GPU run cannot be repeated cheaply: its tables must
come out right the first time), on made-up numbers."""
import os

import bench_models


def test_results_tables(tmp_path):
    mod = bench_models.module()
    results = {"gpu": "H200", "torch": "2.11", "transformers": "5.17", "layers": 2, "cases": [
        {"case": "gpt2 prefill b8x1024", "eager_ms": 10.0, "inductor_ms": 8.0, "max-autotune_ms": 7.5,
         "comfuse_ms": 7.0, "comfuse_speedup_vs_eager": 10 / 7, "comfuse_vs_inductor": 8 / 7,
         "comfuse_vs_max-autotune": 7.5 / 7, "comfuse-max-autotune_ms": 6.0,
         "comfuse-max-autotune_vs_max-autotune": 7.5 / 6, "fused_regions": 2, "region_count": 9, "eager_err": 0.0,
         "comfuse_err": 3e-3,
         "regions": [{"region": "h.0.mlp.c_fc:addmm + mul, tanh", "m": 8192, "n": 4096, "k": 1024,
                      "fused_us": 100.0, "inductor_us": 130.0, "eager_us": 200.0, "speedup_vs_inductor": 1.3,
                      "speedup_vs_eager": 2.0, "fused_est_us": 95.0, "unfused_est_us": 120.0},
                     {"region": "h.0.attn.c_proj:addmm + add", "m": 8192, "n": 1024, "k": 1024, "fused_us": 50.0,
                      "uncompiled_us": 75.0, "eager_us": 76.0, "speedup_vs_eager": 1.52, "fused_est_us": 40.0,
                      "unfused_est_us": 46.0, "error": "Inductor compiled no graph for this region"}]},
        {"case": "llama decode b1", "eager_ms": 1.0, "comfuse_ms": None, "comfuse_error": "x"},
    ]}
    mod.write_results(results, str(tmp_path))
    text = (tmp_path / "RESULTS.md").read_text()
    assert ("| gpt2 prefill b8x1024 | 10.000 | 8.000 | 7.500 | 7.000 | 1.43x | 1.14x | 1.07x | 6.000 | 1.25x | 2/9 | "
            "3.00e-03 |") in text
    assert "| llama decode b1 | 1.000 | - | - | - |" in text
    assert "8192x4096x1024 | 100.0 | 130.0 | 200.0 | 1.30x | 2.00x | 95.0/120.0 |  |" in text
    # A region Inductor did not compile: no Inductor time or ratio, and the note in its own column.
    assert "8192x1024x1024 | 50.0 | - | 76.0 | - | 1.52x | 40.0/46.0 | Inductor compiled no graph for this region |" in text
    assert all(line.count("|") == 11 for line in text.splitlines() if line.startswith("| gpt2 prefill b8x1024 | h.0"))
    assert os.path.exists(tmp_path / "results.json")


def test_plot(tmp_path):
    import pytest

    pytest.importorskip("matplotlib")
    mod = bench_models.module()
    results = {"cases": [
        {"case": "gpt2 prefill b8x1024", "comfuse_speedup_vs_eager": 1.4, "comfuse_vs_inductor": 1.1,
         "comfuse_vs_max-autotune": 1.05,
         "regions": [{"region": "c_fc + gelu", "m": 8192, "n": 4096, "k": 1024, "speedup_vs_inductor": 1.3,
                      "speedup_vs_eager": 2.0}]},
        {"case": "llama decode b1", "comfuse_speedup_vs_eager": None}]}
    mod.plot(results, str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").stat().st_size > 1000
