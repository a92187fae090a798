"""The run-time path of a fused region with the kernel emulated on the CPU: the custom op's
real implementation prepares the kernel's arguments exactly as on the GPU (operands viewed as
2-D matrices and vectors, B transposed to N x K where the weight is Linear's, copies where a
layout is not packed rows, outputs allocated and viewed as [M, N]) and the emulated kernel runs
the region's ComFuse graph on the fp64 executor through the argument table it was given."""
import pytest
import torch

import comfuse
from comfuse import _core
from comfuse import backend as backend_mod
from comfuse import kernels
from comfuse.reference import _host, _torch

from conftest import compile_vs_eager, randn
import modules as M


class Emulated:
    """Stands for a compiled kernel: checks the argument table and computes in fp64."""

    def __init__(self, rr):
        self.rr = rr

    def run(self, args, scalars, stream):
        rr, views = self.rr, self.rr._views
        info = rr.info
        g = _core.parse_graph(info.graph_text)
        m = views["a"].shape[0]
        inputs = {}
        for name, role in zip(rr.names, rr.roles):
            if role == "scalar":
                inputs[name] = ([], torch.tensor(scalars[name], dtype=torch.float64).numpy().tobytes())
                continue
            v = views[name]
            ptr, dtype, shape, ld = args[name]
            assert ptr == v.data_ptr() and ptr % 16 == 0, name
            assert dtype == kernels._NAMES[v.dtype]
            if v.dim() == 2:  # the kernel reads packed rows of `ld` elements
                assert v.stride(1) == 1 and v.stride(0) == ld and (ld * v.element_size()) % 16 == 0, name
                assert list(v.shape) == shape
            else:
                assert v.is_contiguous() and v.numel() == shape[0]
            want = {"row": [info.n], "col": [m, 1]}.get(role, list(v.shape))
            inputs[name] = _host(v.reshape(want))
        out = _core.run_graph(g, {"M": m, "N": info.n, "K": info.k}, inputs)
        for name, cls in zip(rr.out_names, rr.out_classes):
            ptr, dtype, shape, ld = args[name]
            want = ([m, info.n], info.n) if cls == "tile" else ([m, 1], 0)
            assert (shape, ld) == want and ptr == views[name].data_ptr()
            views[name].copy_(_torch(*out[name]))


@pytest.fixture
def emulate(monkeypatch):
    monkeypatch.setattr(kernels, "gpu_status", lambda: (True, ""))
    monkeypatch.setattr(backend_mod, "gpu_status", lambda: (True, ""))
    monkeypatch.setattr(kernels.RuntimeRegion, "device_type", "cpu")
    monkeypatch.setattr(kernels.RuntimeRegion, "kernel", lambda self, m, capturing: Emulated(self))
    prepare = kernels.RuntimeRegion.prepare

    def keep_views(self, *a, **kw):
        res = prepare(self, *a, **kw)
        self._views = res[3]
        return res

    monkeypatch.setattr(kernels.RuntimeRegion, "prepare", keep_views)
    comfuse.config.force_regions = True  # CPU tensors: the backend would otherwise leave regions unfused
    comfuse.config.rest = "eager"
    comfuse.config.strict = True
    comfuse.config.min_gain = -1e9  # fuse whatever Φ accepts: the run-time path is under test
    comfuse.config.b2b = "off"  # one region a kernel: the emulator runs regions (pairs: test_b2b_pairs.py)


def run(model, *inputs, dynamic=None):
    out, ref, rep = compile_vs_eager(model, *inputs, dynamic=dynamic)
    ran = [r for r in rep.regions if r.calls]
    assert ran, str(rep)
    for r in ran:
        assert r.fallback_calls == 0, r.runtime_fallback
    return out, ref, rep


def close(out, ref, rel=2e-2):
    if isinstance(out, (tuple, list)):
        for o, r in zip(out, ref):
            close(o, r, rel)
        return
    assert out.shape == ref.shape and out.dtype == ref.dtype
    err = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
    assert err < rel, err


CASES = {
    "linear_gelu_nk": (lambda: M.LinearGelu(64, 136), (3, 37, 64)),
    "layer_norm": (lambda: M.LinearLayerNorm(64, 264), (299, 64)),
    "log_softmax_f32_out": (lambda: M.LinearLogSoftmax(64, 200), (2, 21, 64)),
    "rms_norm": (lambda: M.LinearRMSNorm(96, 128), (5, 9, 96)),
    "gpt2_mlp_kn": (lambda: M.GPT2MLP(64, 256), (2, 33, 64)),
    "elementwise": (lambda: M.Elementwise(64, 136), (2, 61, 64)),
    # gate_proj and up_proj as one gated region (W3 bound as role b3), then down_proj.
    "llama_mlp_gated": (lambda: M.LlamaMLP(64, 136), (2, 33, 64)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_emulated_kernel_matches_eager(emulate, case):
    make, shape = CASES[case]
    out, ref, rep = run(make(), randn(*shape, seed=11))
    close(out, ref)


def test_gated_region_binds_both_weights(emulate):
    """Llama's gate_proj and up_proj run as one gated region: W1 as b, W3 as b3 (N x K rows)."""
    out, ref, rep = run(M.LlamaMLP(64, 136), randn(2, 33, 64, seed=5))
    close(out, ref)
    gated = [r for r in rep.regions if r.calls and any("up_proj" in op for op in r.ops)]
    assert len(gated) == 1 and "gate_proj" in gated[0].root and "input b3:" in gated[0].graph_text, \
        [(r.root, r.ops) for r in rep.regions]


def test_non_contiguous_operand_is_copied(emulate):
    x = randn(40, 128, seed=2)[:, ::2]
    out, ref, _ = run(M.LinearGelu(64, 136), x)
    close(out, ref)


def test_dynamic_rows_and_a_runtime_scalar(emulate):
    model = M.LinearSoftmax(64, 128)
    for rows in (7, 30):
        torch._dynamo.reset()
        out, ref, rep = run(model, randn(rows, 64, seed=rows), dynamic=True)
        close(out, ref)


def test_bmm_over_one_broadcast_matrix(emulate):
    model = M.BatchedWeight(64, 128)
    out, ref, _ = run(model, randn(3, 16, 64), randn(3, 64, 128))
    close(out, ref)


def test_precompile_builds_each_kernel_once_in_parallel(monkeypatch):
    """A graph's distinct kernels are built at once (threads), each once; layers that share a
    kernel key share the build, and a failed build is left for the first call to report."""
    import threading
    import time
    from types import SimpleNamespace

    monkeypatch.setattr(comfuse.config, "compile_threads", 4)
    monkeypatch.setattr(kernels, "CACHE", kernels.KernelCache())
    running, peak, built, lock = [0], [0], [], threading.Lock()

    class Region:
        def __init__(self, key, fail=False):
            self.key, self.fail, self.info = key, fail, SimpleNamespace(id=key)

        def kernel_key(self, m, capturing=False):
            return kernels.m_bucket(m), ("text", self.key, kernels.m_bucket(m)), {}

        def build(self, bucket, opts):
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            time.sleep(0.2)
            with lock:
                running[0] -= 1
                built.append(self.key)
            if self.fail:
                raise _core.Error("no kernel")
            return f"kernel {self.key}"

    regions = [(Region(1), 5), (Region(1), 8), (Region(2), 8), (Region(3, fail=True), 8)]
    kernels.precompile(regions)
    assert sorted(built) == [1, 2, 3] and peak[0] == 3
    b = kernels.m_bucket(8)  # 5 and 8 rows share one class
    assert kernels.CACHE.get(("text", 1, b)) == "kernel 1" and kernels.CACHE.get(("text", 3, b)) is None
