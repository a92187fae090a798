"""Deciding a region by timing it, where the GPU that will run it is at hand.

The planner's estimates (partition.decide) are wrong in both directions at some shapes. On the
H200, GPT-2's c_proj + residual + LayerNorm at 8192 x 1024 x 4096 was predicted 7% faster fused
but ran at 0.88x of Inductor (cuBLAS ran the GEMM in 89 us where the planner priced it 101.6);
Llama's down_proj + residual + RMSNorm was priced 1271 us and ran 1581 (0.86x). Every region
ComFuse fuses must beat what Inductor would run, so before the rewrite puts a region the planner
fuses into the graph, it times it on random inputs of the region's shapes: the fused kernel
through the custom op's own path (RuntimeRegion.run) against Inductor's kernels for the region's
own aten graph (compile_fx with the options the rest of the model gets, as bench/models.py
compares them). The region stays fused only where the measurement agrees. The GEMM alone
(cuBLAS through torch.mm) is timed too: where Inductor cannot compile the region, it plus the
epilogue kernel decide() modeled (RegionInfo.unfused_epilogue_us) is the unfused time. Inductor
may still fuse the region's last op into its consumer in the whole graph; the region alone is
the comparison the issue's "faster than the Inductor kernel it replaces" asks for. MEASURED on
the H200 with the modeled epilogue instead: GPT-2's c_fc + gelu_new won its measurement by 9%
and Llama's gate_proj + silu * up by 2%, then both lost 1-3% to Inductor's kernels in the model.

B2B pairs (pair.py) are not measured: their unfused side is two regions and the kernel between
them, so they stay on the core's choose_b2b estimate.
"""
from __future__ import annotations

import contextlib
import logging
import statistics
import time

import torch
import torch.fx as fx

from . import gpu_timing, kernels
from .config import config
from .partition import pays, size_hint

log = logging.getLogger("comfuse")

# Per timed callable: warm-up calls, then the median over BATCHES batches of REPS calls (fewer where
# a batch would pass BATCH_US of GPU time or ENQUEUE_US of launching): a region and its GEMM take
# a few tens of milliseconds together.
WARMUP = 2
# Fused and Inductor's kernels timed in alternating rounds (measure_region), decided by the median
# of the rounds' ratios. MEASURED on the H200 (Llama prefill, gate_proj + up_proj as one gated
# region): with 3 rounds and each side's own median, Inductor's time for the same ops moved 12%
# between two layers' measurements and flipped one layer's decision (bench/NOTES.md Stop 34).
ROUNDS = 7
BATCHES = 5
REPS = 100
BATCH_US = 2000.0
ENQUEUE_US = 3000.0
CYCLES_PER_US = 2000  # the H200's SM clock (1.98 GHz) rounded up: a spin of n us lasts at least n us


def wanted(on_gpu: bool) -> bool:
    """Whether to time a region that the rewrite replaces; on_gpu: an sm_90 GPU runs its kernel and
    its tensors are on CUDA (or, asked by backend.rewrite of a region fused only on a measurement's
    word: would be). Never inside a CUDA graph capture (a launch there is only recorded)."""
    mode = str(config.measure).lower()
    if mode == "on":
        return True
    if mode in ("off", "0", "false", "no") or not on_gpu:
        return False
    return not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def _time_us(fn) -> float:
    """GPU microseconds per call of fn on the current CUDA stream, as the model benchmarks count
    it: fn captured in a CUDA graph (gpu_timing.capture: warm-up on a side stream first) and
    replayed in batches between CUDA events, each batch queued behind a spin kernel that outlasts
    its launching, so no CPU time is counted. MEASURED on the H200: RuntimeRegion.run takes 60-90
    us of Python a call, torch.mm a few, so plain back-to-back calls timed the CPU (GPT-2's c_fc +
    gelu_new at M=1024: 60 us vs 20); and back-to-back calls behind a spin, the clock before this
    one, read GPT-2's decode c_fc 5.2 us fused against Inductor's 6.8 where graph replays (the
    model's own, under CUDA graphs) read 6.5 against 6.3 (bench/region_timing.py): it kept a
    region that ties. A kernel used in the capture stays loaded (kernels.py pins it)."""
    graph = gpu_timing.capture(lambda i: fn())
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(WARMUP):
        graph.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    start.record()
    graph.replay()
    end.record()
    enqueue_us = (time.perf_counter() - t0) * 1e6
    end.synchronize()
    gpu_us = max(start.elapsed_time(end) * 1e3, 1.0)
    reps = max(1, min(REPS, int(BATCH_US / gpu_us), int(ENQUEUE_US / max(enqueue_us, 1.0))))
    times = []
    for _ in range(BATCHES):
        torch.cuda._sleep(int((reps * enqueue_us * 1.5 + 50.0) * CYCLES_PER_US))
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps)
    del graph
    return statistics.median(times)


@contextlib.contextmanager
def _measuring(rr: "kernels.RuntimeRegion"):
    """What a measurement runs in: real tensors inside the backend's fake mode, no autograd; on
    exit the report's counts and the kernel cache's pins are as the model left them (the report
    counts the model's calls, not these; the captures' pins are not the model's)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    info = rr.info
    saved = (info.calls, info.fallback_calls, info.runtime_fallback, set(rr._warned), rr.last_inputs)
    try:
        with kernels.CACHE.pins_kept(), unset_fake_temporarily(), torch.no_grad():
            yield
    finally:
        info.calls, info.fallback_calls, info.runtime_fallback, rr._warned, rr.last_inputs = saved


def time_region(rr: "kernels.RuntimeRegion", tensors: list, sizes: list) -> float:
    """The fused region per call, us, as the custom op runs it (tests replace this function)."""
    return _time_us(lambda: rr.run(tensors, sizes))


def time_gemm(m: int, n: int, k: int, dtype: torch.dtype, layout: str, device: torch.device) -> float:
    """cuBLAS's GEMM alone per call, us: A [m, k] times B, an [n, k] weight used transposed
    (layout "nk", Linear's) or [k, n] (tests replace this function)."""
    a = torch.randn(m, k, device=device, dtype=dtype) * 0.5
    b = (torch.randn(n, k, device=device, dtype=dtype) * 0.5).t() if layout == "nk" else \
        torch.randn(k, n, device=device, dtype=dtype) * 0.5
    try:
        return _time_us(lambda: torch.mm(a, b))
    finally:
        del a, b


def inductor_region(sub: fx.GraphModule, args: list, options: dict | None = None):
    """Inductor's kernels for a region's aten GraphModule (called with `args`), compiled as the
    comfuse backend hands Inductor the rest of a model (compile_fx, `options` its config patches;
    without the modes' own CUDA graphs: the timing captures the kernels itself), outside any
    tracing context (this runs inside the backend's own compile)."""
    from torch._inductor.compile_fx import compile_fx

    patches = {k: v for k, v in (options or {}).items() if k != "triton.cudagraphs"}
    with torch._guards.tracing(None):
        compiled = compile_fx(sub, args, config_patches=patches)
    if compiled is sub or compiled is getattr(sub, "forward", None):
        raise RuntimeError("Inductor returned the region uncompiled")
    return compiled


def time_inductor(rr: "kernels.RuntimeRegion", tensors: list, sizes: list, options: dict | None) -> float:
    """Inductor's kernels for the region (rr.subgraph) per call, us (tests replace this function).
    Compiled on the first call for these tensors; later rounds time the same kernels."""
    args = list(tensors) + list(sizes)
    cached = getattr(rr, "_measure_inductor", None)
    if cached is None or cached[0] is not tensors:
        rr._measure_inductor = cached = (tensors, inductor_region(rr.subgraph, args, options))
    fn = cached[1]
    return _time_us(lambda: fn(*args))


def _error_line(e: Exception) -> str:
    """An exception as the report's reasons quote it: its type and its message's first line."""
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def random_input(v):
    """A real value for an external input of the region, from its meta["val"]: a tensor of the
    same shape, strides, dtype and device (random, never zero where floating), or a size's hint."""
    if not isinstance(v, torch.Tensor):
        return size_hint(v) if isinstance(v, (int, torch.SymInt)) else v
    shape = [size_hint(s) for s in v.shape]
    stride = [size_hint(s) for s in v.stride()]
    offset = size_hint(v.storage_offset())
    # The storage the strides reach (stride 0 of an expanded operand included): as_strided keeps
    # the layout the kernel's operand preparation sees in the real graph (views, copies).
    n = offset + 1 + sum((d - 1) * s for d, s in zip(shape, stride)) if all(shape) else 0
    if v.dtype.is_floating_point:
        x = torch.randn(n, device=v.device, dtype=torch.float32)
        base = (torch.where(x.abs() < 0.1, 0.1, x) * 0.5).to(v.dtype)
    elif v.dtype == torch.bool:
        base = torch.rand(n, device=v.device) < 0.5
    else:
        base = torch.ones(n, device=v.device, dtype=v.dtype)
    return base.as_strided(shape, stride, offset)


def _more_rounds(time_fused, time_unfused, fused_us: list, unfused_us: list) -> None:
    """Rounds 2..ROUNDS after a first round of each side: the two alternate, the order swapped
    each round, so both meet the same clock and power states (an H200 at its power cap): timed one
    after the other, the two sides of a region met different ones (bench/region_timing.py,
    bench/NOTES.md Stop 26). Each round's two timings met the same clock state; a drift between
    rounds moves both, so the decision takes the median of the rounds' ratios, steadier than
    either side's median. What the short bursts here still miss, the model's steady state,
    config.measure_margin stands for."""
    for r in range(1, ROUNDS):
        for who in (("unfused", "fused") if r % 2 else ("fused", "unfused")):
            if who == "fused":
                fused_us.append(time_fused())
            else:
                unfused_us.append(time_unfused())


def measure_region(rr: "kernels.RuntimeRegion", tensor_nodes: list[fx.Node], size_nodes: list[fx.Node],
                   inductor_options: dict | None = None) -> None:
    """Times a region the planner fused (rr: not replaced yet; tensor_nodes and size_nodes: the
    custom op's operands; inductor_options: the config patches the rest of the model gets) and
    decides again: info.status becomes "fallback" where the median of the rounds' fused / unfused
    ratios (fused / the GEMM plus the modeled epilogue where Inductor was not timed) is not below
    1 - config.min_gain - config.measure_margin. The numbers go to info.measured and the reason.
    Where timing fails or the kernel does not run (a fallback), the planner's decision stays (a
    region fused only on a measurement's word, info.needs_measurement, falls back) and the reason
    says why."""
    info = rr.info
    m = size_hint(info.m)
    tensors = sizes = a = None
    try:
        with _measuring(rr):
            tensors = [random_input(n.meta.get("val")) for n in tensor_nodes]
            sizes = [random_input(n.meta.get("val")) for n in size_nodes]
            a = next(t for t, role in zip(tensors, rr.roles) if role == "a")
            before = info.fallback_calls
            fused_us = [time_region(rr, tensors, sizes)]
            if info.fallback_calls != before:
                raise RuntimeError(f"the fused kernel did not run ({info.runtime_fallback})")
            gemm = sum(time_gemm(m, n, info.k, a.dtype, info.layout, a.device)
                       for n in info.unfused_gemm_columns or [info.n])
            name = torch.cuda.get_device_name(a.device) if a.device.type == "cuda" else str(a.device)
            try:
                inductor_us, no_inductor = [time_inductor(rr, tensors, sizes, inductor_options)], ""
            except Exception as e:  # the modeled epilogue stands in
                inductor_us, no_inductor = [], _error_line(e)
            if inductor_us:
                _more_rounds(lambda: time_region(rr, tensors, sizes),
                             lambda: time_inductor(rr, tensors, sizes, inductor_options), fused_us, inductor_us)
            fused = statistics.median(fused_us)
            inductor = statistics.median(inductor_us) if inductor_us else None
            ratios = [f / i for f, i in zip(fused_us, inductor_us)]
    except Exception as e:
        stands = "" if info.needs_measurement else ", the planner's decision stands"
        log.warning("comfuse: region %d (%s): not measured%s: %s: %s", info.id, info.root, stands, type(e).__name__, e)
        info.reason += f"; not measured ({_error_line(e)})"
        if info.needs_measurement:  # fused only on a measurement's word
            info.status = "fallback"
        return
    finally:
        rr.__dict__.pop("_measure_inductor", None)
        del tensors, sizes, a
    epi = info.unfused_epilogue_us or 0.0
    unfused = inductor if inductor is not None else gemm + epi
    ratio = statistics.median(ratios) if ratios else fused / unfused
    info.measured = {"fused_us": fused, "gemm_us": gemm, "epilogue_us": epi, "inductor_us": inductor,
                     "unfused_us": unfused, "ratio": ratio, "round_ratios": ratios, "device": name}
    how = (f"Inductor's kernels for the region, measured; cuBLAS GEMM alone {gemm:.1f} us" if inductor is not None else
           f"cuBLAS GEMM {gemm:.1f} us measured + epilogue {epi:.1f} us modeled; Inductor not timed: {no_inductor}")
    spread = f", fused / unfused {ratio:.3f} (median of {len(ratios)} rounds {min(ratios):.3f}-{max(ratios):.3f})" \
        if len(ratios) > 1 else ""
    if not pays(ratio, 1.0, config.measure_margin):
        info.status = "fallback"
        info.reason = (f"measured on {name}: fused {fused:.1f} us vs unfused {unfused:.1f} us{spread} ({how}) at M={m}; "
                       f"planner had predicted fused {info.fused_us:.1f} us vs unfused {info.unfused_us:.1f} us")
    else:
        info.reason += f"; measured: fused {fused:.1f} us vs unfused {unfused:.1f} us{spread} ({how})"
    log.info("comfuse: region %d (%s): %s: %s", info.id, info.root, info.status, info.reason)


def measure_attention(rr: "kernels.RuntimeRegion", inputs: list[fx.Node], inductor_options: dict | None = None) -> None:
    """Times an attention the core takes as one kernel (attention.py; rr not in the graph yet)
    against Inductor's kernels for the SDPA op as the model traced it (`inputs`: q, k, v, given
    random values of the traced shapes and strides, and the op's mask: a constant one its real
    value, a runtime one random) and decides as measure_region does: the kernel stays only where
    the median of the rounds' ratios pays (partition.pays with config.measure_margin). Where either side cannot be timed, the attention falls back (there is
    no estimate of the SDPA kernel to stand in) and the reason says why."""
    info = rr.info
    tensors = operands = None
    try:
        with _measuring(rr):
            # Random q, k, v (and a runtime mask) of the traced shapes and strides; a constant mask
            # as the model computes it. The kernel's mask operand is made outside its timing: in
            # the model, Inductor fuses it into the ops that compute the mask.
            tensors = rr.subgraph_args([random_input(n.meta.get("val")) for n in inputs], [])
            operands = rr.kernel_args(tensors)
            fused_fn = lambda: _time_us(lambda: rr.run(operands, []))  # noqa: E731
            before = info.fallback_calls
            fused_us = [fused_fn()]
            if info.fallback_calls != before:
                raise RuntimeError(f"the fused kernel did not run ({info.runtime_fallback})")
            compiled = inductor_region(rr.subgraph, tensors, inductor_options)
            unfused_fn = lambda: _time_us(lambda: compiled(*tensors))  # noqa: E731
            inductor_us = [unfused_fn()]
            _more_rounds(fused_fn, unfused_fn, fused_us, inductor_us)
            name = torch.cuda.get_device_name(tensors[0].device)
    except Exception as e:  # noqa: BLE001 - a failed measurement is a reason to fall back
        info.status = "fallback"
        info.reason += f"; not measured, so not fused ({_error_line(e)})"
        log.warning("comfuse: attention %d (%s): not measured, falls back: %s", info.id, info.root, _error_line(e))
        return
    finally:
        del tensors, operands
    fused, inductor = statistics.median(fused_us), statistics.median(inductor_us)
    ratios = [f / i for f, i in zip(fused_us, inductor_us)]
    ratio = statistics.median(ratios)
    info.measured = {"fused_us": fused, "inductor_us": inductor, "unfused_us": inductor, "ratio": ratio,
                     "round_ratios": ratios, "device": name}
    spread = f"fused / unfused {ratio:.3f} (median of {len(ratios)} rounds {min(ratios):.3f}-{max(ratios):.3f})"
    if not pays(ratio, 1.0, config.measure_margin):
        info.status = "fallback"
        info.reason = (f"measured on {name}: fused {fused:.1f} us vs Inductor's SDPA kernel {inductor:.1f} us, {spread}; "
                       + info.reason)
    else:
        info.reason += f"; measured: fused {fused:.1f} us vs Inductor's SDPA kernel {inductor:.1f} us, {spread}"
    log.info("comfuse: attention %d (%s): %s: %s", info.id, info.root, info.status, info.reason)
