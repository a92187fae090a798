"""bench/models.py, importable from the tests (conftest.load_bench loads it once)."""
import torch

import comfuse
from conftest import load_bench


def module():
    return load_bench("models")


def build(*args, **kwargs):
    return module().build(*args, **kwargs)


def compiled_prefill_matches_eager(arch: str):
    """A small two-layer model's prefill under torch.compile(backend="comfuse") on the CPU (the
    fusable regions through the custom op's aten fallback, with whatever comfuse.config the test
    set) against eager: the bench module, the model, its input ids and the frontend's report."""
    mod = module()
    model, ids = mod.build(arch, layers=2, batch=2, seq=16, device="cpu", small=True)
    prefill = mod.Prefill(model)
    with torch.no_grad():
        ref = prefill(ids)
        with comfuse.collecting() as rep:
            out = torch.compile(prefill, backend="comfuse")(ids)
    assert mod.rel_err(out, ref) < 1e-6
    return mod, model, ids, rep
