"""Shared pieces of the Python tests. GPU tests (test_gpu*.py) carry the `gpu` fixture, which
skips them with the reason where no sm_90 GPU runs ComFuse kernels (CI)."""
import logging
import os

import pytest
import torch

import comfuse


@pytest.fixture
def gpu():
    ok, why = comfuse.gpu_available()
    if not ok:
        pytest.skip(f"GPU test skipped: {why}")
    return torch.device("cuda")


@pytest.fixture(autouse=True)
def _fresh_config():
    """Each test starts from the default configuration, a clean Dynamo cache and torch's generator
    seeded: modules' initial weights do not depend on the tests run before (a rounding that flips
    at an intermediate cast makes a check's margin depend on the draw)."""
    saved = dict(vars(comfuse.config))
    torch._dynamo.reset()
    torch.manual_seed(0)
    yield
    for k, v in saved.items():
        setattr(comfuse.config, k, v)
    torch._dynamo.reset()


@pytest.fixture(autouse=True)
def _log(caplog):
    caplog.set_level(logging.INFO, logger="comfuse")


@pytest.fixture
def inductor_graphs(monkeypatch):
    """Stubs Inductor (compile_fx): the graphs it is handed, each run as it is (its forward)."""
    import torch._inductor.compile_fx as cfx

    seen = []

    def stub(gm, example_inputs, **kw):
        seen.append(gm)
        return gm.forward

    monkeypatch.setattr(cfx, "compile_fx", stub)
    return seen


def replay_in_user_graph(f, x, inputs, check):
    """Captures f(x) in a user's torch.cuda.CUDAGraph after two warm-up calls (the second on a side
    stream, as torch asks before a capture), then for each of `inputs`: copies it into x, replays
    and calls check(output, x)."""
    with torch.no_grad():
        f(x)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            f(x)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = f(x)
        for new in inputs:
            x.copy_(new)
            g.replay()
            torch.cuda.synchronize()
            check(y, x)


def compile_vs_eager(model, *inputs, **compile_kw):
    model = model.to(torch.bfloat16).eval()
    with torch.no_grad(), comfuse.collecting() as rep:
        ref = model(*inputs)
        out = torch.compile(model, backend="comfuse", **compile_kw)(*inputs)
    return out, ref, rep


def close(a, b, tol=2e-2):
    """Compiled outputs against eager ones (tensors, or tuples and lists of them): same shapes and
    dtypes, values within tol."""
    if isinstance(a, (tuple, list)):
        for x, y in zip(a, b):
            close(x, y, tol)
        return
    assert a.shape == b.shape and a.dtype == b.dtype
    torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)


def randn(*shape, dtype=torch.bfloat16, offset=0.0, scale=1.0, device="cpu", seed=None):
    """Random inputs that are never zero (|x| >= 0.05 away from 0 before the offset)."""
    g = torch.Generator().manual_seed(seed if seed is not None else hash(shape) % 10_000)
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    x = torch.where(x.abs() < 0.05, torch.sign(x + 1e-9) * 0.05, x)
    return (x * scale + offset).to(dtype).to(device)


def load_bench(script: str):
    """bench/<script>.py as a module (bench/ is no package), loaded once per test session."""
    import importlib.util
    import sys

    name = f"comfuse_bench_{script}"
    if name not in sys.modules:
        path = os.path.join(os.path.dirname(__file__), "..", "..", "bench", f"{script}.py")
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod  # dataclasses look their module up while the file executes
        spec.loader.exec_module(mod)
    return sys.modules[name]
