"""GPU-only timing, one description of it: the benchmarks' (bench/matrix.py, attention.py,
models.py) and the frontend's measurement before it fuses a region (measure.py).

A variant is a callable captured in a CUDA graph (after a warm-up call on a side stream, so lazy
inits, cuDNN plans and autotuning stay out of the graph) and replayed `reps` times between two CUDA
events: the GPU's time per call, no Python launch cost in it. Several variants are timed in
alternating rounds, the order rotating from round to round, so that every variant meets the power
and clock states of the others (the H200 runs at its power cap).
"""
from __future__ import annotations

import math
import statistics
from typing import Callable

import torch


def capture(fn: Callable[[int], object], calls: int = 1) -> torch.cuda.CUDAGraph:
    """One CUDA graph of fn(0), ..., fn(calls - 1) (e.g. one call per rotated input copy)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(calls):
            fn(i)  # warm-up outside the graph
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fn(i)
    g.replay()
    torch.cuda.synchronize()
    return g


def stretch_ms(g: torch.cuda.CUDAGraph, reps: int) -> float:
    """GPU milliseconds of `reps` back-to-back replays of `g`."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        g.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b)


def reps_to_fill(graphs: dict, target_ms: float, most: int) -> int:
    """Replays a round needs so that the slowest graph's stretch lasts about target_ms."""
    once = max(stretch_ms(g, 1) for g in graphs.values())
    return max(3, min(most, math.ceil(target_ms / max(once, 1e-3))))


def alternating(names: list, rounds: int, time: Callable[[object], float]) -> dict:
    """{name: [time(name), one per round]}: every round times each name once, the order rotating
    by one each round."""
    times = {v: [] for v in names}
    for r in range(rounds):
        for v in names[r % len(names):] + names[:r % len(names)]:
            times[v].append(time(v))
    return times


def alternating_rounds(graphs: dict, rounds: int, reps: int, calls_per_replay: int = 1) -> dict:
    """{variant: [ms per call, one per round]}: every round replays each graph `reps` times, the
    variants' order rotating by one each round."""
    return alternating(list(graphs), rounds, lambda v: stretch_ms(graphs[v], reps) / (reps * calls_per_replay))


def time_one(fn: Callable[[], object], reps: int = 20, rounds: int = 7, graph: bool = True) -> float:
    """Median over rounds of one callable's GPU ms per call (graph=False: back-to-back calls, for
    what cannot be captured), under no_grad."""
    with torch.no_grad():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        if graph:
            g = capture(lambda i: fn())
            return statistics.median(stretch_ms(g, reps) / reps for _ in range(rounds))
        times = []
        for _ in range(rounds):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(reps):
                fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / reps)
        return statistics.median(times)
