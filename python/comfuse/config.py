"""Settings of the PyTorch frontend (attributes of comfuse.config; environment defaults)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field


def _env_flag(name: str, default: bool = False) -> bool:
    v = os.environ.get(name)
    return default if v is None else v not in ("", "0", "false", "False", "no")


@dataclass
class Config:
    # Compiled kernels kept in memory (an LRU over the on-disk JIT cache, which keeps them all).
    # Kernels used inside a CUDA graph capture are pinned: a replay launches them.
    kernel_cache_size: int = int(os.environ.get("COMFUSE_KERNEL_CACHE_SIZE", "64"))
    # Fuse where the planner's fused estimate < unfused estimate * (1 - min_gain), and, where a
    # region is measured (below), where its measured time < the measured unfused one * (1 - min_gain).
    min_gain: float = float(os.environ.get("COMFUSE_MIN_GAIN", "0.0"))
    # Time each single-GEMM region the planner fuses before putting it in the graph (measure.py):
    # "auto" where the rewrite applies, an sm_90 GPU runs the kernels, the region's tensors are on
    # CUDA and no CUDA graph is being captured; "off" never (the planner decides alone); "on"
    # wherever a region is replaced, GPU or not (for tests, which inject the timers).
    measure: str = os.environ.get("COMFUSE_MEASURE", "auto")
    # What a measured region must win by beyond min_gain: the measurement runs at compile time,
    # in bursts of a few ms on a GPU the model has not yet heated to its power cap, where the
    # model runs for long. MEASURED on the H200: Llama's gate_proj + silu * up timed 1.1% faster
    # than Inductor's kernels at compile time and 1.4-3% slower in the model's steady state; GPT-2's
    # c_fc + gelu_new 7.7% faster at compile time and 4-8% in the steady state (bench/NOTES.md Stop 26).
    measure_margin: float = float(os.environ.get("COMFUSE_MEASURE_MARGIN", "0.03"))
    # Rewrite fusable regions even where no sm_90 GPU runs them (they then execute their aten
    # subgraph): lets CPU tests drive the custom op, its fake implementation and Inductor.
    force_regions: bool = _env_flag("COMFUSE_FORCE_REGIONS")
    # What compiles the rest of the graph: "inductor" (compile_fx) or "eager" (the aten graph
    # as it is: fast, for tests and explain).
    rest: str = os.environ.get("COMFUSE_REST", "inductor")
    # Raise instead of falling back when a fused kernel cannot run (GPU tests).
    strict: bool = _env_flag("COMFUSE_STRICT")
    # Threads that build a graph's kernels at once when torch.compile hands it over (NVRTC
    # releases the GIL); 1: each kernel is built by its first call.
    compile_threads: int = int(os.environ.get("COMFUSE_COMPILE_THREADS", str(min(16, os.cpu_count() or 1))))
    # Keep each region's last inputs (RuntimeRegion.last_inputs), for per-region benchmarks.
    record_inputs: bool = False
    # Kernel plan overrides for every region (the keys of `comfuse explain` flags, e.g.
    # {"aggregation": "p2p"}); empty: the planner decides.
    plan_options: dict = field(default_factory=dict)
    # B2B pairs (two chained GEMM regions, e.g. an MLP, as one kernel; pair.py): "auto" builds
    # one where the core's choose_b2b says one kernel and its estimate beats the per-region path,
    # "force" wherever Φ forms the pair and the B2B kernel takes it (tests, benchmarks), "off"
    # never (every GEMM its own region, as before).
    b2b: str = os.environ.get("COMFUSE_B2B", "auto")


config = Config()
