"""Checking a translation: the region's ComFuse graph on the C++ fp64 reference executor
against the region's aten ops in torch float64, on the same inputs.

Both sides compute in float64 and round where the model stores: at casts (`_to_copy` to bf16
rounds; the ComFuse graph's cast does the same) and at the region's outputs (to their dtype).
They differ only by fp64 reassociation, which can flip a rounding at a tie: compare with one
unit in the last place of the output dtype.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from . import _core
from .partition import external_inputs, region_module
from .segments import ptile_rows
from .translate import CASTS, column_block, val


def _host(t: torch.Tensor):
    x = t.detach().to(torch.float64).contiguous().cpu()
    return list(x.shape), x.numpy().tobytes()


def _torch(shape, data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.float64).reshape(shape)


def kernel_inputs(c, values: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    """The ComFuse graph's inputs (by canonical name) and dims from the FX values of a region."""
    tr = c.translator
    if getattr(c, "dims", None):  # a B2B pair (pair.py): shapes from the pair graph's dims
        return _pair_inputs(c, values)
    g = tr.gemm
    m = values[g.a.name].numel() // g.k
    dims = {"M": int(m), "N": g.n, "K": g.k}
    out = {}
    for node, name, role, cols, layout in zip(tr.inputs, tr.input_names, tr.input_roles, tr.input_cols,
                                              tr.input_rows):
        t = column_block(values[node.name], cols)
        if role == "a":
            t = t.reshape(m, g.k)
        elif role in ("b", "b3"):
            t = t.reshape(g.k, g.n)
            if g.layout == "nk":
                t = t.t()
        elif role == "row":
            t = t.reshape(g.n)
        elif role == "vec":  # one segment's length, read periodically (segments.py)
            t = t.reshape(-1)
        elif role == "col":
            t = t.reshape(m, 1)
        elif role == "scalar":
            t = t.reshape(())
        elif layout is not None:  # RoPE's cos and sin as the model has them (segments.ptile_rows)
            t = ptile_rows(t, m, layout)
        else:
            t = t.reshape(m, g.n)
        out[name] = t
    return out, dims


def _pair_inputs(c, values: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    tr = c.translator
    m = values[tr.inputs[0].name].numel() // c.dims["K"]  # inputs[0]: X, GEMM1's A
    dims = {**c.dims, "M": int(m)}
    out = {}
    for node, name, shape, transposed, cols, role, layout in zip(tr.inputs, tr.input_names, tr.input_shapes,
                                                                 tr.input_transposed, tr.input_cols, tr.input_roles,
                                                                 tr.input_rows):
        want = [dims[d] if isinstance(d, str) else int(d) for d in shape]
        t = column_block(values[node.name], cols)
        if layout is not None:
            out[name] = ptile_rows(t, int(m), layout)
            continue
        out[name] = t.reshape(want[::-1]).t() if transposed else t.reshape(want)
    return out, dims


def comfuse_fp64(c, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The translated graph on the C++ fp64 executor: outputs by FX name, as [M, N]."""
    tr = c.translator
    ins, dims = kernel_inputs(c, values)
    res = _core.run_graph(tr.g, dims, {k: _host(v) for k, v in ins.items()})
    return {tr.fx_name[name]: _torch(*res[name]) for name in tr.output_names}


def lowered_fp64(c, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Same through Φ's Fusion Spec executor (what the kernel computes, in fp64)."""
    tr = c.translator
    ins, dims = kernel_inputs(c, values)
    res = _core.run_lowered(_core.lower(tr.g), dims, {k: _host(v) for k, v in ins.items()})
    return {tr.fx_name[name]: _torch(*res[name]) for name in tr.output_names}


class _Float64(fx.Interpreter):
    def __init__(self, gm, round_at: set[str] = frozenset()):
        super().__init__(gm)
        self.round_at = round_at  # node names whose values the model stores between kernels

    def run_node(self, n):
        v = super().run_node(n)
        if n.name in self.round_at and isinstance(v, torch.Tensor):
            v = v.to(n.meta["val"].dtype).to(torch.float64)
        return v

    def call_function(self, target, args, kwargs):
        if target in CASTS:
            x = args[0]
            dtype = kwargs.get("dtype", args[1] if len(args) > 1 else None)
            return x if dtype is None else x.to(dtype).to(torch.float64)
        kwargs = {k: (torch.float64 if isinstance(v, torch.dtype) and v.is_floating_point else v)
                  for k, v in kwargs.items()}
        return super().call_function(target, args, kwargs)


def eager_fp64(c, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The region's aten ops in torch float64 (CPU), rounding at casts and outputs."""
    tr = c.translator
    ext = external_inputs(c.nodes)
    gm = region_module(c.nodes, tr.outputs, ext, tr.output_perms)
    args = []
    for i in ext:
        v = values[i.name]
        args.append(v.detach().to(torch.float64).cpu() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
    # A B2B pair's S: the model stores GEMM1's epilogue value in its dtype for GEMM2 to read (the
    # pair graph casts it there too).
    round_at = {tr.gemm.a.name} if getattr(c, "dims", None) else set()
    outs = _Float64(gm, round_at).run(*args)
    m = values[tr.gemm.a.name].numel() // tr.gemm.k
    return {o.name: r.to(val(o).dtype).to(torch.float64).reshape(m, tr.gemm.n if cls == "tile" else 1)
            for o, r, cls in zip(tr.outputs, outs, tr.output_classes)}


def ulp(dtype: torch.dtype, x: torch.Tensor) -> torch.Tensor:
    """One unit in the last place of `dtype` at |x| (float64)."""
    mant = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23}[dtype]
    e = torch.floor(torch.log2(x.abs().clamp_min(torch.finfo(dtype).tiny)))
    return torch.pow(2.0, e - mant)
