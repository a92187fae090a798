"""Epilogue reach: ComFuse's fused GEMM + epilogue kernels over the issue's shape classes, each
against the same function unfused, on the same inputs in the same process run:

    cuBLAS GEMM alone (F.linear of the same bf16 operands: the ratio's denominator)
    torch eager (the GEMM + the epilogue in plain torch)
    torch.compile (Inductor default)
    torch.compile mode="max-autotune-no-cudagraphs"
    ComFuse, the planner's choice, and forced alternative plans (e.g. {"aggregation": "p2p"})

Times are GPU-only: each variant is captured once in a CUDA graph and replayed back to back
between CUDA events; the variants alternate round by round (the H200 sits at its power cap, so a
ratio pairs the variant with the GEMM of the same round) and every number is a median of rounds.
Inputs rotate over copies totalling > 3 x L2 (as bench/NOTES.md's kernel bench), so a decode
GEMM streams its weight from HBM as in a model (--warm-l2: one set). torch.compile compiles and
warms up before any capture; torch._dynamo.reset() runs between rows. Every ComFuse output is
checked first against torch in float32 (rel-L2; a row FAILS, loudly, above 1e-2 or non-finite,
and the script then exits 1); a case ComFuse cannot build is a row that says why.

    python bench/matrix.py [--out DIR] [--cases substr,...] [--quick] [--budget-s S] [--reps N]
                           [--rounds R] [--warm-l2] [--merge] [--dry-run]

writes DIR/matrix.md, DIR/matrix.json and DIR/matrix.log. --cases keeps the rows whose
"case MxNxK" contains one of the substrings; --quick times the first shape of each case;
--merge keeps the rows of an earlier DIR/matrix.json that this run does not redo (a matrix
split over several calls); --dry-run plans every row on the CPU (no GPU, no timing).
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import re
import statistics
import sys
import time
import types
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from comfuse import gpu_timing  # the GPU-only timing shared by the benchmarks and measure.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- the cases -------------------------------------------------------------------------------
# A torch epilogue is the case's graph in plain torch: fn(t, f32) -> {output name: tensor}, t the
# graph's inputs by name (tensors, scalars as floats), f32 the dtype of outputs the graph stores
# as f32 (torch.float32; the CPU test passes torch.float64 to compare with the fp64 executor).
def layernorm(t, f32):  # examples/gemm_layernorm.cf
    x = torch.addmm(t["bias"], t["a"], t["w"].t(), alpha=t["alpha"])  # bias + alpha * a w^T: one cuBLAS call
    return {"y": F.layer_norm(x, x.shape[-1:], t["gamma"], t["beta"], 1e-5)}


def rmsnorm(t, f32):  # examples/gemm_rmsnorm.cf
    x = F.linear(t["a"], t["w"])
    return {"y": F.rms_norm(x, x.shape[-1:], t["gamma"], 1e-6)}


def softmax(t, f32):  # examples/gemm_softmax.cf
    return {"p": torch.softmax(F.linear(t["a"], t["w"]), -1)}


def softmax_f32(t, f32):  # gemm_softmax.cf storing f32 (an LM head's probabilities)
    return {"p": torch.softmax(F.linear(t["a"], t["w"]), -1, dtype=f32)}


def log_softmax_f32(t, f32):  # gemm_log_softmax.cf storing f32
    return {"p": torch.log_softmax(F.linear(t["a"], t["w"]), -1, dtype=f32)}


def log_softmax(t, f32):  # examples/gemm_log_softmax.cf
    return {"p": torch.log_softmax(F.linear(t["a"], t["w"]), -1)}


def bias_gelu(t, f32):  # examples/gemm_bias_gelu.cf
    return {"y": F.gelu(F.linear(t["x"], t["w"], t["bias"]), approximate="tanh")}


def residual_layernorm(t, f32):  # examples/gemm_residual_layernorm.cf: h, y and the row statistics
    h = F.linear(t["x"], t["w"], t["bias"]) + t["residual"]
    y, mu, rstd = torch.native_layer_norm(h, h.shape[-1:], t["gamma"], t["beta"], 1e-5)
    return {"h": h, "y": y, "mu": mu.to(f32), "rstd": rstd.to(f32)}


def residual_rmsnorm(t, f32):  # examples/gemm_residual_rmsnorm.cf
    h = F.linear(t["x"], t["w"]) + t["residual"]
    return {"h": h, "y": F.rms_norm(h, h.shape[-1:], t["gamma"], 1e-6)}


def chain(t, f32):  # examples/gemm_chain.cf: softmax, LayerNorm, RMSNorm (5 reductions), elementwise between
    p = torch.softmax(F.linear(t["a"], t["w"]), -1)
    l = F.layer_norm(F.silu(p * 1000.0), p.shape[-1:], t["gamma"], t["beta"], 1e-5)  # noqa: E741
    return {"y": F.rms_norm(F.gelu(l), l.shape[-1:], t["gamma2"], 1e-6)}


SCALARS = {"alpha": 0.75}  # values of the graphs' scalar inputs


@dataclass(frozen=True)
class Case:
    name: str
    graph: str            # examples/<graph>.cf; "X[f32]": X with its outputs stored as f32
    shapes: tuple         # ((M, N, K), ...); B is N x K
    torch_fn: object      # the torch epilogue (above)
    alts: tuple = ()      # plan options to force beside the automatic alternative (alternatives())
    quick: bool = True    # --quick times the first shape of the cases that have quick set


CASES = [
    Case("decode rmsnorm", "gemm_rmsnorm", ((1, 2048, 4096), (7, 2048, 4096), (16, 2048, 4096)), rmsnorm),
    Case("decode layernorm", "gemm_layernorm", ((1, 4096, 4096), (7, 4096, 4096), (16, 4096, 4096)), layernorm),
    Case("small layernorm", "gemm_layernorm", ((256, 4096, 4096),), layernorm),
    # Softmax's pair keeps its exp in the registers (one exp a value, the default); made again after
    # the round as the alternative.
    Case("small softmax", "gemm_softmax", ((256, 4096, 4096),), softmax, alts=({"keep_pair_exp": False},)),
    Case("small bias+gelu", "gemm_bias_gelu", ((256, 4096, 4096),), bias_gelu),
    # One row block at mid K (the small FFN's GEMM2, GPT-2's c_proj width at decode): K split over
    # 64x64 tiles (calibration.cpp narrow_tile_k_splits).
    Case("row-block bias+gelu", "gemm_bias_gelu", ((64, 1024, 3072), (1, 768, 3072)), bias_gelu),
    Case("medium layernorm", "gemm_layernorm", ((2048, 2048, 1024), (1024, 4096, 1024)), layernorm),
    Case("medium softmax", "gemm_softmax", ((1024, 4096, 1024), (2048, 2048, 1024)), softmax,
         alts=({"keep_pair_exp": False},)),
    Case("medium rmsnorm", "gemm_rmsnorm", ((4096, 1024, 1024),), rmsnorm, quick=False),
    Case("wide-N layernorm", "gemm_layernorm", ((4096, 8192, 4096),), layernorm),
    Case("large layernorm", "gemm_layernorm", ((8192, 4096, 4096),), layernorm, alts=({"strategy": "smem-stash"},)),
    Case("large rmsnorm", "gemm_rmsnorm", ((8192, 4096, 4096),), rmsnorm),
    Case("large softmax", "gemm_softmax", ((8192, 4096, 4096),), softmax),
    Case("chain softmax>LN>RMS", "gemm_chain", ((4096, 4096, 1024),), chain, alts=({"keep_pair_exp": False},)),
    # The max-and-sum-of-exp pair over several N-tiles a CTA: in one round (its sum online; the
    # planner's choice in row groups of up to 32) against two rounds, and one round in row groups
    # of 32 where the planner's row group is wider.
    Case("vocab softmax f32", "gemm_softmax[f32]", ((1024, 32768, 4096), (1024, 128256, 4096), (1024, 50257, 4096)),
         softmax_f32, alts=({"fuse_pairs": False}, {"fuse_pairs": True, "row_group": 32})),
    Case("vocab log-softmax f32", "gemm_log_softmax[f32]", ((1024, 32768, 4096), (1024, 128256, 4096)), log_softmax_f32,
         alts=({"fuse_pairs": False}, {"fuse_pairs": True, "row_group": 32})),
    # Long rows at K = 1024: a short mainloop beside the stash's DRAM round trip. With bf16 outputs
    # the stash is bf16 about each tile's running max or mean (KernelConfig::stash_centers); the
    # fp32 stash as the alternative. The vocabulary rows with bf16 out likewise, and PingPong
    # 128x128 tiles against the cooperative jobs of several N-tiles the planner takes there
    # (calibration.h cooperative_stash_taken).
    Case("long-row layernorm", "gemm_layernorm", ((1152, 32768, 1024),), layernorm, alts=({"stash_bytes": 4},)),
    Case("long-row softmax", "gemm_softmax", ((1152, 32768, 1024),), softmax, alts=({"stash_bytes": 4},)),
    Case("vocab bf16 softmax", "gemm_softmax", ((1024, 32768, 4096),), softmax,
         alts=({"stash_bytes": 4}, {"tile_m": 128, "tile_n": 128})),
    Case("vocab bf16 log-softmax", "gemm_log_softmax", ((1024, 32768, 4096),), log_softmax,
         alts=({"tile_m": 128, "tile_n": 128},)),
    # f32 mean and rstd beside bf16 h and y: the pair's statistics come from the unrounded values,
    # so the centered bf16 stash is the default here too.
    Case("long-row residual layernorm", "gemm_residual_layernorm", ((1152, 32768, 1024),), residual_layernorm,
         alts=({"stash_bytes": 4},)),
    Case("residual layernorm", "gemm_residual_layernorm", ((8192, 4096, 4096), (8192, 1024, 4096)), residual_layernorm),
    Case("residual rmsnorm", "gemm_residual_rmsnorm", ((8192, 4096, 4096), (8192, 1024, 4096)), residual_rmsnorm),
]

CHECK_TOL = 1e-2   # rel-L2 of a ComFuse output against torch in float32
ROTATE_L2 = 3      # inputs rotate over copies totalling this many times the L2
MAX_COPIES = 32
TARGET_MS = 10.0   # one timed stretch of graph replays (--reps 0: reps chosen to last this long)
COMPILE_MODES = (("compile", None), ("max-autotune", "max-autotune-no-cudagraphs"))
BEATS = 0.98       # a forced alternative "beats the planner" below this time ratio to its default


# ---- graphs, inputs, references ---------------------------------------------------------------
def graph_text(name: str) -> str:
    base, f32 = (name[:-5], True) if name.endswith("[f32]") else (name, False)
    with open(os.path.join(ROOT, "examples", base + ".cf")) as f:
        text = f.read()
    return outputs_as_f32(text) if f32 else text


def outputs_as_f32(text: str) -> str:
    return re.sub(r"^(output\s+\w+\s*:\s*)(bf16|f16)\b", r"\g<1>f32", text, flags=re.M)


def build_graph(name: str):
    from comfuse import _core

    return _core.parse_graph(graph_text(name))


_TORCH_DT = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


@dataclass
class IO:
    """A graph's interface: inputs (name, dtype, symbolic shape), outputs (name, dtype, per-row),
    and the GEMM's operands."""
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    a: str = ""
    b: str = ""

    def scalars(self) -> list[str]:
        return [n for n, _, s in self.inputs if not s]

    def tensors(self) -> list[str]:
        return [n for n, _, s in self.inputs if s]


def graph_io(g) -> IO:
    io = IO()
    for i in range(len(g)):
        nd = g.node(i)
        if nd["kind"] == "input":
            io.inputs.append((nd["name"], nd["dtype"], list(nd["shape"])))
        elif nd["kind"] == "matmul" and not io.a:
            io.a, io.b = (g.node(j)["name"] for j in nd["inputs"])
    for node, name, dtype in g.outputs():
        shape = g.node(node)["shape"]
        io.outputs.append((name, dtype, len(shape) == 2 and shape[1] == 1))  # [M, 1]: one value per row
    return io


def resolve(shape, dims) -> list[int]:
    return [d if isinstance(d, int) else dims[d] for d in shape]


def make_inputs(io: IO, dims: dict, device="cuda", seed: int = 0) -> dict:
    """The graph's inputs (bf16 as declared), seeded: A ~ N(0, 1), B ~ N(0, 1/K) (so the GEMM's
    output is ~ N(0, 1)), gamma* ~ 1 + 0.1 N(0, 1), other vectors 0.5 N(0, 1), [M, N] inputs N(0, 1);
    scalars as floats (SCALARS)."""
    g = torch.Generator(device=device).manual_seed(seed)
    t = {}
    for name, dtype, shape in io.inputs:
        if not shape:
            t[name] = float(SCALARS.get(name, 1.0))
            continue
        x = torch.randn(resolve(shape, dims), generator=g, device=device, dtype=torch.float32)
        if name == io.b:
            x = x * dims["K"] ** -0.5
        elif len(shape) == 1:
            x = 1.0 + 0.1 * x if name.startswith("gamma") else 0.5 * x
        t[name] = x.to(_TORCH_DT[dtype])
    return t


def alloc_outputs(io: IO, dims: dict, device="cuda") -> dict:
    """ComFuse's outputs: [M, N], or [M] for a per-row output (the direct API takes it 1-D)."""
    m, n = dims["M"], dims["N"]
    return {name: torch.empty([m] if per_row else [m, n], dtype=_TORCH_DT[dtype], device=device)
            for name, dtype, per_row in io.outputs}


def upcast(t: dict, dtype) -> dict:
    return {k: (v.to(dtype) if isinstance(v, torch.Tensor) else v) for k, v in t.items()}


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    a, b = out.detach().double().reshape(-1), ref.detach().double().reshape(-1)
    if not torch.isfinite(a).all():
        return math.inf
    d = (a - b).norm().item()
    r = b.norm().item()
    return d / r if r > 0 else d


def check_outputs(outs: dict, ref: dict) -> dict[str, float]:
    return {name: rel_l2(outs[name], ref[name]) for name in outs}


def failed(errs: dict) -> list[str]:
    return [n for n, e in errs.items() if not (e <= CHECK_TOL)]  # NaN and inf fail too


# ---- plans --------------------------------------------------------------------------------------
def first_line(e) -> str:
    s = str(e).strip()
    s = s.splitlines()[0] if s else type(e).__name__
    return s[:200]


def plan_label(s: dict) -> str:
    agg = str(s.get("aggregation", "?")).split(" ")[0]
    agg = {"peer-to-peer": "p2p", "leader-follower": "leader"}.get(agg, agg)
    parts = [f"{s.get('tile_m')}x{s.get('tile_n')}", f"c{s.get('cluster_m')}x{s.get('cluster_n')}"]
    if s.get("row_group", 1) != 1:
        parts.append(f"rg{s['row_group']}")
    if s.get("k_splits", 1) != 1:
        parts.append(f"split-K {s['k_splits']}")
    if s.get("reductions"):
        parts += [agg, str(s.get("strategy"))]
    if s.get("stash_bytes"):
        parts.append("bf16 centered" if s.get("stash_centers") else "bf16" if s["stash_bytes"] == 2 else "fp32")
    if s.get("pairs_in_one_round"):
        parts.append("pairs 1 round")
    if s.get("pair_exp_kept"):
        parts.append("exp kept")
    return " ".join(parts)


PLAN_KEYS = ("tile_m", "tile_n", "cluster_m", "cluster_n", "row_group", "aggregation", "strategy", "stages",
             "n_tiles_per_cta", "k_splits", "pairs_in_one_round", "pair_exp_kept", "stash_bytes", "stash_centers")
SUMMARY_KEYS = PLAN_KEYS + ("reductions", "workspace_bytes", "smem_bytes", "total_us", "mainloop_us", "epilogue_us")


def same_plan(a: dict, b: dict) -> bool:
    return all(a.get(k) == b.get(k) for k in PLAN_KEYS)


def alternatives(summary: dict, case: Case) -> list[dict]:
    """Forced plan options to time beside the planner's choice: the other aggregation where the
    epilogue reduces rows (l2 <-> p2p), the other cluster width where it does not; unsplit K where
    the plan splits it; then the case's own."""
    if summary.get("reductions"):
        agg = str(summary.get("aggregation", ""))
        auto = {"aggregation": "l2" if agg.startswith("peer") else "p2p"}
    else:
        auto = {"cluster_n": 1 if summary.get("cluster_n", 1) > 1 else 2}
    out = [auto]
    if summary.get("k_splits", 1) > 1:  # split-K against the same problem unsplit
        out.append({"k_splits": 1})
    for o in case.alts:
        if dict(o) not in out:
            out.append(dict(o))
    return out


def opts_label(o: dict) -> str:
    if set(o) == {"aggregation"}:
        return o["aggregation"]
    return ",".join(f"{k}={v}" for k, v in o.items())


def plan_row(case: Case, shape) -> dict:
    """What the planner does with a row, on the CPU: the default plan (or why there is none) and
    the forced alternatives' plans (or why each is refused / the same as the default)."""
    from comfuse import _core

    m, n, k = shape
    dims = {"M": m, "N": n, "K": k}
    res = {"plan": None, "plan_error": None, "alts": []}
    try:
        low = _core.lower(build_graph(case.graph))
        regions = low.regions()
        if len(regions) != 1 or low.fallbacks():
            raise _core.Error("the graph does not lower to one fused kernel: " + " / ".join(
                f"{name}: {why}" for _, name, why in low.fallbacks()))
        region = regions[0]
        s = region.plan(dims, {}).summary()
    except Exception as e:  # a graph or shape ComFuse does not take: the row says why
        res["plan_error"] = first_line(e)
        return res
    res["plan"] = {k_: s.get(k_) for k_ in SUMMARY_KEYS}
    res["plan"]["label"] = plan_label(s)
    for o in alternatives(s, case):
        alt = {"label": opts_label(o), "options": o}
        try:
            a = region.plan(dims, o).summary()
            alt["plan"] = {k_: a.get(k_) for k_ in SUMMARY_KEYS}
            alt["plan"]["label"] = plan_label(a)
            if same_plan(a, s):
                alt["same_as_default"] = True
        except Exception as e:
            alt["refused"] = first_line(e)
        res["alts"].append(alt)
    return res


# ---- the GPU side: kernels, compiled baselines, CUDA graphs, timing ------------------------------
def fresh(fn):
    """fn with a code object of its own: Dynamo keeps its cache on the code object, so torch.compile
    under two modes gets two independent compilations of one function."""
    c = fn.__code__
    return types.FunctionType(c.replace(co_name=c.co_name), fn.__globals__, fn.__name__, fn.__defaults__,
                              fn.__closure__)


def torch_callable(fn, names, scalars: dict):
    """The torch epilogue over positional tensors, scalars bound as constants: what torch.compile
    compiles (one compiled graph serves every input copy of the same shapes)."""
    def call(*xs):
        t = dict(scalars)
        for nm, x in zip(names, xs):
            t[nm] = x
        return fn(t, torch.float32)

    return call


class GpuBench:
    """Everything that needs the GPU (the CPU test replaces it with an emulation)."""

    device = "cuda"

    def __init__(self, reps: int = 0, rounds: int = 9, warm_l2: bool = False, log=print):
        self.reps, self.rounds, self.warm_l2, self.log = reps, rounds, warm_l2, log

    def reset(self) -> None:
        torch._dynamo.reset()

    def sync(self) -> None:
        torch.cuda.synchronize()

    def cleanup(self) -> None:
        gc.collect()
        torch.cuda.empty_cache()

    def l2_bytes(self) -> int:
        return int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20))

    def copies(self, bytes_per_call: int) -> int:
        if self.warm_l2:
            return 1
        return max(1, min(MAX_COPIES, math.ceil(ROTATE_L2 * self.l2_bytes() / max(1, bytes_per_call))))

    def build(self, graph, dims: dict, options: dict):
        """A ComFuse kernel (comfuse.compile_graph) and what its build took."""
        import comfuse

        t0 = time.perf_counter()
        k = comfuse.compile_graph(graph, dims, **options)
        c = k.compiled()
        return k, {"build_s": time.perf_counter() - t0, "compile_s": c.get("compile_seconds"),
                   "cache_hit": c.get("cache_hit"), "plan": k.plan()}

    def compile(self, fn, mode):
        return torch.compile(fresh(fn), mode=mode, dynamic=False)

    def measure(self, variants: dict, copies: int):
        """Per-call GPU ms of each variant in each round ({variant: [ms, ...]}) and the variants that
        could not be captured ({variant: why}). Each variant is one CUDA graph of `copies` calls (one
        per input copy); a round replays every graph `reps` times between two events, the order
        rotating from round to round."""
        graphs, errors = {}, {}
        for v, fn in variants.items():
            try:
                graphs[v] = gpu_timing.capture(fn, copies)
            except Exception as e:
                errors[v] = "CUDA graph capture failed: " + first_line(e)
                self.log(f"    {v}: {errors[v]}")
                torch.cuda.synchronize()
        if not graphs:
            return {}, errors
        # --reps 0: as many replays as fill TARGET_MS for the slowest variant of a first pass.
        reps = self.reps if self.reps > 0 else gpu_timing.reps_to_fill(graphs, TARGET_MS, 1000)
        times = gpu_timing.alternating_rounds(graphs, self.rounds, reps, calls_per_replay=copies)
        del graphs
        return times, errors


# ---- one row ------------------------------------------------------------------------------------
def row_id(case: Case, shape) -> str:
    return f"{case.name} {shape[0]}x{shape[1]}x{shape[2]}"


def new_row(case: Case, shape) -> dict:
    m, n, k = shape
    return {"id": row_id(case, shape), "case": case.name, "graph": case.graph, "m": m, "n": n, "k": k,
            "status": "ok", "plan": None, "plan_error": None, "alts": [], "ms": {}, "ratio": {}, "err": {},
            "variant_errors": {}, "first_call_s": {}}


def median_ratio(num: list, den: list):
    if not num or not den:
        return None
    return statistics.median(a / b for a, b in zip(num, den))


def run_row(case: Case, shape, bench, log) -> dict:
    """Checks and times one (case, shape): see the module docstring."""
    row = new_row(case, shape)
    m, n, k = shape
    dims = {"M": m, "N": n, "K": k}
    g = build_graph(case.graph)
    io = graph_io(g)
    row.update(plan_row(case, shape))
    bench.reset()
    dev = bench.device

    with torch.no_grad():
        base = make_inputs(io, dims, dev)
        ref = case.torch_fn(upcast(base, torch.float32), torch.float32)  # the float32 reference
        names = io.tensors()
        scalars = {s: base[s] for s in io.scalars()}
        per_call = sum(base[t].numel() * base[t].element_size() for t in names)
        per_call += sum(m * (1 if per_row else n) * _TORCH_DT[dt].itemsize for _, dt, per_row in io.outputs)
        copies = bench.copies(per_call)
        row["copies"] = copies
        ins = [base] + [{k_: (v.clone() if isinstance(v, torch.Tensor) else v) for k_, v in base.items()}
                        for _ in range(copies - 1)]
        args = [tuple(x[t] for t in names) for x in ins]

        variants = {"gemm": lambda i: F.linear(ins[i][io.a], ins[i][io.b]),
                    "eager": lambda i: case.torch_fn(ins[i], torch.float32)}
        out = variants["eager"](0)
        row["eager_err"] = max(check_outputs({o: out[o] for o in ref}, ref).values())
        del out

        wrapper = torch_callable(case.torch_fn, names, scalars)
        for label, mode in COMPILE_MODES:
            try:
                cf = bench.compile(wrapper, mode)
                t0 = time.perf_counter()
                for _ in range(2):  # compile (first call), then warm up, before any capture
                    for i in range(copies):
                        cf(*args[i])
                bench.sync()
                row["first_call_s"][label] = time.perf_counter() - t0
                variants[label] = (lambda cf_: lambda i: cf_(*args[i]))(cf)
            except Exception as e:
                row["variant_errors"][label] = f"{type(e).__name__}: {first_line(e)}"
                log(f"    {label}: FAILED {row['variant_errors'][label]}")

        kernels = []  # (variant name, alt record or None, options)
        if row["plan"] is not None:
            kernels.append(("fused", None, {}))
            for alt in row["alts"]:
                if not alt.get("refused") and not alt.get("same_as_default"):
                    kernels.append(("alt:" + alt["label"], alt, alt["options"]))
        for vname, alt, opts in kernels:
            rec = alt if alt is not None else row
            try:
                kern, info = bench.build(g, dims, opts)
            except Exception as e:
                why = f"not built: {first_line(e)}"
                if alt is None:
                    row["fused_error"] = why
                    log(f"    ComFuse {why}")
                    break  # no default kernel: no alternative either
                alt["error"] = why
                continue
            rec["build_s"] = info.get("build_s")
            rec["jit_cache_hit"] = info.get("cache_hit")
            outs = [alloc_outputs(io, dims, dev) for _ in range(copies)]
            call = (lambda kern_, outs_: lambda i: kern_(scalars, **{t: ins[i][t] for t in names}, **outs_[i]))(kern, outs)
            try:
                call(0)
                bench.sync()
            except Exception as e:
                rec["error" if alt else "fused_error"] = f"launch failed: {type(e).__name__}: {first_line(e)}"
                log(f"    {vname}: {rec['error' if alt else 'fused_error']}")
                continue
            errs = check_outputs(outs[0], ref)
            bad = failed(errs)
            if alt is None:
                row["err"] = errs
            else:
                alt["err"] = errs
            if bad:
                msg = "FAILED the check against torch float32: " + ", ".join(f"{b} rel-L2 {errs[b]:.3g}" for b in bad)
                if alt is None:
                    row["status"] = "FAIL"
                    row["fused_error"] = msg
                else:
                    alt["error"] = msg
                    row["status"] = "FAIL"
                log(f"!!! {row['id']} {vname}: {msg} (tolerance {CHECK_TOL})")
                continue  # a wrong kernel is not timed
            variants[vname] = call

        times, cap_errors = bench.measure(variants, copies)
    row["variant_errors"].update(cap_errors)
    row["rounds"] = {v: list(t) for v, t in times.items()}
    for v, t in times.items():
        row["ms"][v] = statistics.median(t)
        if v != "gemm":
            r = median_ratio(t, times.get("gemm"))
            if r is not None:
                row["ratio"][v] = r
    if "fused" in times:
        row["fused_tflops"] = 2.0 * m * n * k / (row["ms"]["fused"] * 1e-3) / 1e12
    for alt in row["alts"]:
        t = times.get("alt:" + alt["label"])
        if t:
            alt["ratio"] = row["ratio"].get("alt:" + alt["label"])
            if "fused" in times:  # paired round by round with the planner's choice
                alt["vs_fused"] = median_ratio(t, times["fused"])
                alt["beats_plan"] = alt["vs_fused"] < BEATS
    return row


# ---- output ------------------------------------------------------------------------------------
COLUMNS = ["case", "M,N,K", "GEMM us", "ComFuse plan", "fused/GEMM", "eager/GEMM", "compile/GEMM",
           "max-autotune/GEMM", "forced-alt/GEMM", "fused TFLOP/s", "error"]


def _x(v) -> str:
    return "-" if v is None else f"{v:.2f}x"


def best_alt(row: dict):
    timed = [a for a in row.get("alts", []) if a.get("ratio") is not None]
    return min(timed, key=lambda a: a["ratio"]) if timed else None


def plan_cell(p) -> str:
    if not p:
        return "-"
    return p["label"] + (f" (est {p['total_us']:.0f} us)" if p.get("total_us") is not None else "")


def table_row(r: dict) -> list[str]:
    shape = f"{r['m']},{r['n']},{r['k']}"
    if r.get("status") == "skipped":
        return [r["case"], shape, "-", f"skipped: {r.get('reason', '')}"] + ["-"] * 7
    if r.get("status") == "error":
        return [r["case"], shape, "-", f"ERROR: {r.get('reason', '')}"] + ["-"] * 7
    ratio = r.get("ratio", {})
    gemm = r.get("ms", {}).get("gemm")
    if r.get("plan_error"):
        plan = f"not planned: {r['plan_error']}"
    elif r.get("plan"):
        plan = plan_cell(r["plan"])
        if r.get("fused_error"):
            plan += f"; {r['fused_error']}"
    else:
        plan = "-"
    a = best_alt(r)
    if a:
        alt = f"{_x(a['ratio'])} {a['label']}" + (" **beats plan**" if a.get("beats_plan") else "")
    else:
        notes = [f"{x['label']}: " + ("same plan" if x.get("same_as_default") else "refused" if x.get("refused")
                                       else "failed" if x.get("error") else plan_cell(x.get("plan")))
                 for x in r.get("alts", [])]
        alt = "- (" + "; ".join(notes) + ")" if notes else "-"
    errs = r.get("err") or {}
    if errs:
        worst = max(errs, key=lambda o: errs[o] if errs[o] == errs[o] else math.inf)
        e = errs[worst]
        err = f"{e:.1e}" if e <= CHECK_TOL else f"**FAIL {e:.2g} ({worst})**"
    else:
        err = "-"
    tf = r.get("fused_tflops")
    return [r["case"], shape, "-" if gemm is None else f"{gemm * 1e3:.1f}", plan, _x(ratio.get("fused")),
            _x(ratio.get("eager")), _x(ratio.get("compile")), _x(ratio.get("max-autotune")), alt,
            "-" if tf is None else f"{tf:.0f}", err]


def markdown(results: dict) -> str:
    lines = ["# ComFuse epilogue reach (bench/matrix.py)", "",
             f"GPU: {results.get('gpu', '-')}; torch {results.get('torch', '-')}; comfuse {results.get('comfuse', '-')}; "
             f"{results.get('timing', '')}", "",
             "Ratios are to cuBLAS GEMM alone (F.linear of the same bf16 operands), each the median over rounds of "
             "(variant / GEMM of the same round); below 1.00x is faster than the GEMM alone. forced-alt: the fastest "
             "forced alternative plan, **beats plan** where it beat the planner's choice by more than "
             f"{(1 - BEATS) * 100:.0f}%. error: the worst rel-L2 of the fused outputs against torch float32 "
             f"(a row fails above {CHECK_TOL:g}).", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in results["rows"]:
        lines.append("| " + " | ".join(c.replace("|", "/") for c in table_row(r)) + " |")
    notes = []
    for r in results["rows"]:
        for a in r.get("alts", []):
            if a.get("ratio") is not None:
                notes.append(f"- {r['id']}: forced {a['label']} ({a['plan']['label']}): {_x(a['ratio'])} GEMM"
                             + (f", {a['vs_fused']:.3f}x the planner's choice" if a.get("vs_fused") else ""))
            elif a.get("refused") or a.get("error"):
                notes.append(f"- {r['id']}: forced {a['label']}: {a.get('refused') or a.get('error')}")
        for v, e in r.get("variant_errors", {}).items():
            notes.append(f"- {r['id']}: {v}: {e}")
    if notes:
        lines += ["", "## Notes", ""] + notes
    return "\n".join(lines) + "\n"


def write_results(results: dict, out: str) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "matrix.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    with open(os.path.join(out, "matrix.md"), "w") as f:
        f.write(markdown(results))


# ---- driver ------------------------------------------------------------------------------------
def select_rows(cases, patterns: str = "", quick: bool = False) -> list[tuple]:
    pats = [p.strip().lower() for p in patterns.split(",") if p.strip()]
    rows = []
    for c in cases:
        shapes = c.shapes[:1] if quick else c.shapes
        if quick and not c.quick:
            continue
        for s in shapes:
            rid = row_id(c, s).lower()
            if not pats or any(p in rid or p in c.graph.lower() for p in pats):
                rows.append((c, tuple(s)))
    return rows


def merge_rows(old: list, new: list) -> list:
    ids = {r["id"] for r in new}
    return [r for r in old if r.get("id") not in ids] + new


def run_matrix(rows, bench, results: dict, out: str, log, deadline: float = 0.0) -> int:
    """Runs the rows in order (none starts after `deadline`, a time.time(); 0: no limit), writing the
    tables after each; returns the number of rows that failed their check."""
    kept = list(results["rows"])
    done = []
    fails = 0
    for i, (case, shape) in enumerate(rows):
        rid = row_id(case, shape)
        if deadline and time.time() > deadline:
            row = new_row(case, shape)
            row.update(status="skipped", reason="time budget spent")
            log(f"[{i + 1}/{len(rows)}] {rid}: skipped (time budget spent)")
        else:
            log(f"[{i + 1}/{len(rows)}] {rid}")
            t0 = time.time()
            try:
                row = run_row(case, shape, bench, log)
            except Exception as e:  # anything unexpected: the row says so, the matrix goes on
                import traceback

                row = new_row(case, shape)
                row.update(status="error", reason=f"{type(e).__name__}: {first_line(e)}")
                log(f"!!! {rid}: ERROR {row['reason']}\n{traceback.format_exc()}")
            row["wall_s"] = time.time() - t0
            fails += row["status"] == "FAIL"
            log(f"    {summary_line(row)}")
            bench.cleanup()
        done.append(row)
        results["rows"] = merge_rows(kept, done)
        write_results(results, out)
    return fails


def summary_line(r: dict) -> str:
    cells = dict(zip(COLUMNS, table_row(r)))
    return "  ".join(f"{k} {cells[k]}" for k in ("ComFuse plan", "fused/GEMM", "eager/GEMM", "compile/GEMM",
                                                  "max-autotune/GEMM", "forced-alt/GEMM", "error")) + \
        f"  ({r.get('wall_s', 0):.0f} s)"


def dry_run(rows, results: dict, out: str, log) -> int:
    """Plans every row on the CPU (what the matrix would build) and writes the tables without times."""
    new = []
    for case, shape in rows:
        row = new_row(case, shape)
        row.update(plan_row(case, shape))
        row["status"] = "planned"
        new.append(row)
        log(f"{row['id']}: " + (row["plan"]["label"] if row["plan"] else f"not planned: {row['plan_error']}")
            + "".join(f"; {a['label']}: " + (a["plan"]["label"] if a.get("plan") else a.get("refused", ""))
                      for a in row["alts"]))
    results["rows"] = merge_rows(results["rows"], new)
    write_results(results, out)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", os.path.join(ROOT, "bench", "out")))
    ap.add_argument("--cases", default="", help="comma-separated substrings of 'case MxNxK' (or graph) to run")
    ap.add_argument("--quick", action="store_true", help="the first shape of each case (those marked quick), 5 rounds")
    ap.add_argument("--budget-s", type=float, default=0, help="start no row after this many seconds (0: no limit)")
    ap.add_argument("--reps", type=int, default=0, help="graph replays per timed stretch (0: ~10 ms worth)")
    ap.add_argument("--rounds", type=int, default=0, help="timing rounds (default 9, --quick 5)")
    ap.add_argument("--warm-l2", action="store_true", help="one input set (no rotation over > 3 x L2)")
    ap.add_argument("--merge", action="store_true", help="keep other rows of an existing OUT/matrix.json")
    ap.add_argument("--dry-run", action="store_true", help="plan every row on the CPU; no GPU, no timing")
    args = ap.parse_args(argv)
    start = time.time()

    import comfuse

    os.makedirs(args.out, exist_ok=True)
    logf = open(os.path.join(args.out, "matrix.log"), "a")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    rows = select_rows(CASES, args.cases, args.quick)
    rounds = args.rounds or (5 if args.quick else 9)
    results = {"torch": torch.__version__, "comfuse": getattr(comfuse, "__version__", "?"), "argv": sys.argv[1:],
               "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start)), "rows": []}
    if args.merge and os.path.exists(os.path.join(args.out, "matrix.json")):
        with open(os.path.join(args.out, "matrix.json")) as f:
            results["rows"] = json.load(f).get("rows", [])
    log(f"== bench/matrix.py {' '.join(sys.argv[1:])}: {len(rows)} row(s)")
    if args.dry_run:
        results.update(gpu="none (dry run: plans only)", timing="no timing (--dry-run)")
        return dry_run(rows, results, args.out, log)
    ok, why = comfuse.gpu_available()
    if not ok:
        log(f"bench/matrix.py needs an sm_90 GPU: {why} (--dry-run plans the rows without one)")
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False  # the float32 reference stays float32
    bench = GpuBench(reps=args.reps, rounds=rounds, warm_l2=args.warm_l2, log=log)
    results["gpu"] = torch.cuda.get_device_name()
    results["timing"] = (f"CUDA graph replays between events, {rounds} alternating rounds, median; "
                         + ("one input set (warm L2)" if args.warm_l2 else
                            f"inputs rotated over copies totalling > {ROTATE_L2} x L2 ({bench.l2_bytes() >> 20} MiB)"))
    deadline = start + args.budget_s if args.budget_s else 0.0
    fails = run_matrix(rows, bench, results, args.out, log, deadline)
    log(markdown(results))
    if fails:
        log(f"!!! {fails} row(s) FAILED the correctness check (rel-L2 > {CHECK_TOL}): see matrix.md")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
