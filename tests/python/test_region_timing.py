"""bench/region_timing.py on the CPU: it takes gpu_python.sh's default bench arguments (models.py's)
and says plainly that it needs a GPU; each distinct fused region that recorded its inputs is
timed once (identical layers share one row), the others skipped."""
from types import SimpleNamespace

import pytest
import torch

from conftest import load_bench

rt = load_bench("region_timing")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path: a GPU runs the real thing")
def test_without_a_gpu_it_says_so_and_takes_the_default_bench_arguments(capsys):
    assert rt.main(["--quick", "--layers", "2", "--budget-s", "420", "--out", "/tmp/comfuse-region-timing"]) == 2
    assert "needs an sm_90 GPU" in capsys.readouterr().out


def test_regions_of_keeps_one_per_distinct_fused_region(monkeypatch):
    from comfuse import kernels

    def info(i, status="fused", n=4096, text="g"):
        return SimpleNamespace(id=i, status=status, graph_text=text, n=n, k=1024, m=8192)

    recorded = SimpleNamespace(last_inputs=([torch.zeros(2)], []))
    monkeypatch.setattr(kernels, "REGISTRY", {1: recorded, 2: recorded, 3: recorded, 4: recorded,
                                              5: SimpleNamespace(last_inputs=None)})
    rep = SimpleNamespace(regions=[info(1), info(2), info(3, n=1024), info(4, status="fallback"), info(5, text="h")])
    got = rt.regions_of(rep)
    assert [i.id for i, _ in got] == [1, 3], "layer 2 repeats layer 1; 4 is not fused; 5 recorded nothing"
