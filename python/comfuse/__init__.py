"""ComFuse for PyTorch: GEMM + epilogue regions of a model become single Hopper kernels.

    import comfuse, torch
    model = torch.compile(model, backend="comfuse")      # or comfuse.fuse(fn)
    print(comfuse.explain(model, x))                      # what fused, what fell back, why

Inference only (no autograd through fused regions); kernels need an sm_90 GPU. Elsewhere the
regions are reported as "fusable" and the graph runs through Inductor unfused.
"""
from __future__ import annotations

import logging
import os

from . import _core
from ._core import Graph, lower, parse_graph, run_graph, run_lowered  # noqa: F401

__version__ = _core.build_info()["version"]


def _kernels_dir() -> None:
    # An installed package carries the kernel headers the JIT compiles against; use them when
    # the checkout it was built from is gone (COMFUSE_KERNELS_DIR set by the user wins).
    if os.environ.get("COMFUSE_KERNELS_DIR"):
        return
    built = _core.build_info()["kernels_dir"]
    bundled = os.path.join(os.path.dirname(__file__), "_kernels")
    if not os.path.isdir(built) and os.path.isdir(bundled):
        os.environ["COMFUSE_KERNELS_DIR"] = bundled


_kernels_dir()
logging.getLogger("comfuse").addHandler(logging.NullHandler())

import torch  # noqa: E402

from .backend import REPORT, collecting, comfuse_backend, explain_backend  # noqa: E402
from .config import config  # noqa: E402
from .kernels import CACHE, Kernel, check_tensor, compile_graph, gpu_status  # noqa: E402
from .report import FusionReport  # noqa: E402


def _register() -> None:
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    if "comfuse" not in _COMPILER_FNS:
        register_backend(comfuse_backend, name="comfuse")


_register()


def gpu_available() -> tuple[bool, str]:
    """(True, '') where fused kernels run (an sm_90 GPU), else (False, why)."""
    return gpu_status()


def fuse(fn=None, *, mode=None, dynamic=None, fullgraph: bool = False, options=None):
    """torch.compile(fn, backend="comfuse") for a function or module; usable as a decorator."""
    if fn is None:
        return lambda f: fuse(f, mode=mode, dynamic=dynamic, fullgraph=fullgraph, options=options)
    return torch.compile(fn, backend=comfuse_backend, mode=mode, dynamic=dynamic, fullgraph=fullgraph,
                         options=options)


def explain(model, example_inputs=(), kwargs=None, *, mode=None, dynamic=False) -> FusionReport:
    """What would fuse in `model` on `example_inputs` (a tensor or a tuple), what falls back and
    why, by module path and op. Runs the model once eagerly under torch.no_grad(); builds no
    kernel and compiles nothing."""
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    target = model
    if hasattr(model, "_orig_mod"):  # an already compiled module: explain the original
        target = model._orig_mod
    compiled = torch.compile(target, backend=explain_backend, mode=mode, dynamic=dynamic)
    with collecting() as rep, torch.no_grad():
        compiled(*example_inputs, **(kwargs or {}))
    return rep


def last_report() -> FusionReport:
    """Every graph this process handed to the comfuse backend, with run-time numbers."""
    return REPORT


__all__ = ["fuse", "explain", "config", "gpu_available", "comfuse_backend", "last_report", "FusionReport",
           "Graph", "lower", "parse_graph", "run_graph", "run_lowered", "CACHE", "collecting", "compile_graph", "Kernel",
           "check_tensor"]
