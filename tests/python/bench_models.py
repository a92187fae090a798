"""bench/models.py, importable from the tests (conftest.load_bench loads it once)."""
import torch

import comfuse
from conftest import load_bench


def module():
    return load_bench("models")


def build(*args, **kwargs):
    return module().build(*args, **kwargs)


def compiled_prefill_matches_eager(arch: str, seq: int = 16, rel: float = 1e-6):
    """A small two-layer model's prefill (batch 2 x `seq` tokens) under
    torch.compile(backend="comfuse") on the CPU (the fusable regions through the custom op's aten
    fallback, or the kernels' emulation where the test turned it on, with whatever comfuse.config
    the test set) against eager within `rel`: the bench module, the model, its input ids and the
    frontend's report."""
    mod = module()
    model, ids = mod.build(arch, layers=2, batch=2, seq=seq, device="cpu", small=True)
    prefill = mod.Prefill(model)
    with torch.no_grad():
        ref = prefill(ids)
        with comfuse.collecting() as rep:
            out = torch.compile(prefill, backend="comfuse")(ids)
    assert mod.rel_err(out, ref) < rel
    return mod, model, ids, rep
