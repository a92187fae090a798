"""Batched attention: ComFuse's B2B kernel (one kernel, S in registers, batch x heads as its
leading batch dim: examples/attention_batched.cf, attention_batched_causal.cf) against torch's
scaled_dot_product_attention with each backend forced (torch.nn.attention.sdpa_kernel:
cuDNN, FlashAttention, memory-efficient), on the same bf16 inputs in the same process run.

Times are GPU-only: each variant is captured once in a CUDA graph and replayed back to back
between CUDA events; the variants alternate round by round (the H200 sits at its power cap, so a
ratio pairs ComFuse with the backend of the same round) and every number is a median of rounds.
One set of inputs (attention is compute-bound; K and V of a head are re-read by every block of
rows, from L2, by every variant alike). Every output is checked first against SDPA's math backend
in float32 (rel-L2; a row FAILS, loudly, above 1e-2 or non-finite, and the script then exits 1).

    python bench/attention.py [--out DIR] [--cases substr,...] [--quick] [--budget-s S]
                              [--rounds R] [--reps N] [--dry-run]

writes DIR/attention.md, DIR/attention.json and prints the table. --quick: fewer rounds and
replays; --cases keeps the rows whose id ("B4 H16 S1024 D128 causal") contains one of the
substrings; --budget-s stops starting rows past that many seconds (the table says which were
left out); --dry-run plans every row on the CPU (no GPU). Runs on the GPU machine as
`BENCH_SCRIPT=bench/attention.py bash scripts/gpu_python.sh bench` (its default BENCH_ARGS pass
--layers, which this script ignores).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- the cases -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    b: int        # batch
    h: int        # heads
    s: int        # sequence (queries = keys)
    d: int        # head dim
    causal: bool

    @property
    def id(self) -> str:
        return f"B{self.b} H{self.h} S{self.s} D{self.d} {'causal' if self.causal else 'full'}"

    @property
    def batches(self) -> int:  # ComFuse's leading dim: batch x heads
        return self.b * self.h

    def dims(self) -> dict:
        return {"B": self.batches, "M": self.s, "N": self.s, "K": self.d, "DV": self.d}

    def flops(self) -> float:
        """Useful FLOPs: Q K^T and P V over the scores kept (a causal row r keeps r + 1 keys)."""
        kept = self.s * (self.s + 1) / 2 if self.causal else self.s * self.s
        return 4.0 * self.batches * kept * self.d


SHAPES = [(4, 16, 1024, 128), (8, 16, 2048, 64), (4, 16, 4096, 128)]
CASES = [Case(b, h, s, d, causal) for (b, h, s, d) in SHAPES for causal in (False, True)]
BACKENDS = ["cudnn", "flash", "efficient"]  # SDPBackend.CUDNN_ATTENTION, FLASH_ATTENTION, EFFICIENT_ATTENTION
TOLERANCE = 1e-2  # rel-L2 against SDPA's math backend in f32 (bf16 inputs and outputs)
TARGET_MS = 50.0  # replays per round fill about this much GPU time


def graph_text(case: Case, dtype: str = "bf16") -> str:
    """The batched attention graph with SDPA's default scale 1 / sqrt(D) (repr: exact in f64)."""
    scale = repr(1.0 / math.sqrt(case.d))
    mask = "masked = causal_mask(scaled)\np = softmax(masked)" if case.causal else "p = softmax(scaled)"
    return (f"input q: {dtype}[B, M, K]\ninput k: {dtype}[B, N, K]\ninput v: {dtype}[B, N, DV]\n"
            f"s = matmul(q, k)\nscaled = mul(s, {scale})\n{mask}\npb = cast(p, {dtype})\n"
            f"o = matmul(pb, v, layout=kn)\noutput o: {dtype}\n")


def select(cases, patterns: str = "") -> list:
    pats = [p.strip() for p in patterns.split(",") if p.strip()]
    return [c for c in cases if not pats or any(p in c.id for p in pats)]


def median_ratio(num: list, den: list):
    """The median of per-round ratios (a round pairs both variants in one power state)."""
    if not num or not den:
        return None
    return statistics.median(a / b for a, b in zip(num, den))


def tflops(case: Case, ms) -> float | None:
    return None if not ms else case.flops() / (ms * 1e-3) / 1e12


def _f(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def table_row(r: dict) -> list[str]:
    """One markdown row: the case, ComFuse's ms and TFLOP/s, each backend's ms, TFLOP/s and
    ComFuse's time over the backend's (below 1: ComFuse is faster), the check."""
    if r.get("error"):
        return [r["id"], "ERROR: " + r["error"]] + [""] * (2 + 2 * len(BACKENDS))
    c = r["times"]
    cells = [r["id"], _f(c.get("comfuse"), ".3f"), _f(r["tflops"].get("comfuse"), ".0f")]
    for b in BACKENDS:
        if b in r.get("skipped", {}):
            cells.append("n/a: " + r["skipped"][b])
        else:
            cells.append(f"{_f(c.get(b), '.3f')} ({_f(r['tflops'].get(b), '.0f')})")
        cells.append(_f(r["ratios"].get(b), ".3f"))
    cells.append(", ".join(f"{k} {v:.1e}" for k, v in r["rel_l2"].items()) + (" FAIL" if r.get("failed") else ""))
    return cells


def markdown(rows: list, note: str = "") -> str:
    head = ["case", "ComFuse ms", "TFLOP/s"]
    for b in BACKENDS:
        head += [f"{b} ms (TFLOP/s)", f"ComFuse / {b}"]
    head.append("rel-L2 vs SDPA math f32")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(table_row(r)) + " |" for r in rows]
    if note:
        lines += ["", note]
    return "\n".join(lines) + "\n"


# ---- the GPU side ------------------------------------------------------------------------------
def _sdpa_backend(name: str):
    from torch.nn.attention import SDPBackend
    return {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[name]


def rel_l2(out, ref) -> float:
    import torch
    o, r = out.float(), ref.float()
    if not torch.isfinite(o).all():
        return float("inf")
    return float(torch.linalg.vector_norm(o - r) / torch.linalg.vector_norm(r))


class GpuTimer:
    """CUDA-graph capture and alternating timed rounds (comfuse.gpu_timing), this script's knobs."""

    def __init__(self, rounds: int, reps: int):
        self.rounds, self.reps = rounds, reps

    def capture(self, fn):
        return _gpu_timing().capture(lambda i: fn())

    def measure(self, graphs: dict) -> dict:
        t = _gpu_timing()
        reps = self.reps if self.reps > 0 else t.reps_to_fill(graphs, TARGET_MS, 500)
        return t.alternating_rounds(graphs, self.rounds, reps)


def _gpu_timing():
    """comfuse.gpu_timing (imported on first use: it needs torch)."""
    from comfuse import gpu_timing

    return gpu_timing


def run_case(case: Case, timer: GpuTimer, log) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    import comfuse

    row = {"id": case.id, "case": case.__dict__, "times": {}, "tflops": {}, "ratios": {}, "rel_l2": {},
           "skipped": {}}
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (case.batches, case.s, case.d)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    q4, k4, v4 = (t.view(case.b, case.h, case.s, case.d) for t in (q, k, v))  # SDPA's [B, H, S, D]
    with sdpa_kernel(_sdpa_backend("math")):
        ref = F.scaled_dot_product_attention(q4.float(), k4.float(), v4.float(), is_causal=case.causal)
    t0 = time.perf_counter()
    kern = comfuse.compile_graph(graph_text(case), case.dims())
    row["build_s"] = time.perf_counter() - t0
    row["plan"] = kern.explain()
    out = torch.empty(shape, device="cuda", dtype=torch.bfloat16)
    fns = {"comfuse": lambda: kern(q=q, k=k, v=v, o=out)}
    outs = {"comfuse": out}
    for b in BACKENDS:
        # SDPA allocates its output: inside the CUDA graph it comes from the graph's pool and stays
        # valid (rewritten by every replay), so nothing but the attention kernel is timed.
        def sdpa(b=b):
            with sdpa_kernel(_sdpa_backend(b)):
                outs[b] = F.scaled_dot_product_attention(q4, k4, v4, is_causal=case.causal)
        fns[b] = sdpa
    graphs = {}
    for name, fn in fns.items():
        try:
            graphs[name] = timer.capture(fn)
        except Exception as e:  # a backend this build or shape does not offer
            row["skipped"][name] = str(e).splitlines()[0][:80] if str(e) else type(e).__name__
            log(f"  {case.id}: {name} not timed: {row['skipped'][name]}")
            torch.cuda.synchronize()
    if "comfuse" in row["skipped"]:
        row["error"] = row["skipped"].pop("comfuse")
        return row
    for name in graphs:
        row["rel_l2"][name] = rel_l2(outs[name].reshape(ref.shape), ref)
    row["failed"] = not all(math.isfinite(e) and e <= TOLERANCE for e in row["rel_l2"].values())
    if row["failed"]:
        log(f"  {case.id}: CHECK FAILED {row['rel_l2']}")
        return row
    times = timer.measure(graphs)
    for name, ts in times.items():
        row["times"][name] = statistics.median(ts)
        row["tflops"][name] = tflops(case, row["times"][name])
    for b in BACKENDS:
        if b in times:
            row["ratios"][b] = median_ratio(times["comfuse"], times[b])
    del graphs
    torch.cuda.synchronize()
    return row


def dry_run(cases, log) -> int:
    """Plans every row on the CPU: the graph lowers to one batched B2B pair and plans."""
    from comfuse import _core
    for c in cases:
        low = _core.lower(_core.parse_graph(graph_text(c)))
        if not low.is_b2b():
            log(f"{c.id}: not one B2B kernel:\n{low.describe()}")
            return 1
        log(f"{c.id}: one batched B2B kernel over {c.batches} batches")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "out"))
    ap.add_argument("--cases", default="")
    ap.add_argument("--quick", action="store_true", help="fewer rounds and replays")
    ap.add_argument("--budget-s", type=float, default=0.0, help="start no row past this many seconds (0: no limit)")
    ap.add_argument("--rounds", type=int, default=0)
    ap.add_argument("--reps", type=int, default=0)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--layers", type=int, default=0, help=argparse.SUPPRESS)  # gpu_python.sh's default args
    a = ap.parse_args(argv)
    cases = select(CASES, a.cases)
    if not cases:
        print(f"no case matches --cases {a.cases!r}", file=sys.stderr)
        return 2
    if a.dry_run:
        return dry_run(cases, print)
    import torch
    if not torch.cuda.is_available():
        print("bench/attention.py needs a CUDA GPU (--dry-run plans on the CPU)", file=sys.stderr)
        return 1
    os.makedirs(a.out, exist_ok=True)
    timer = GpuTimer(rounds=a.rounds or (5 if a.quick else 9), reps=a.reps)
    global TARGET_MS
    if a.quick:
        TARGET_MS = 20.0
    start, rows, left = time.perf_counter(), [], []
    for c in cases:
        if a.budget_s and time.perf_counter() - start > a.budget_s:
            left.append(c.id)
            continue
        print(f"{c.id} ...", flush=True)
        try:
            rows.append(run_case(c, timer, print))
        except Exception as e:
            rows.append({"id": c.id, "error": str(e).splitlines()[0] if str(e) else type(e).__name__})
    note = f"Left out by --budget-s {a.budget_s:g}: {', '.join(left)}." if left else ""
    md = markdown(rows, note)
    print(md)
    with open(os.path.join(a.out, "attention.md"), "w") as f:
        f.write(md)
    with open(os.path.join(a.out, "attention.json"), "w") as f:
        json.dump({"rows": rows, "left_out": left, "torch": torch.__version__,
                   "device": torch.cuda.get_device_name(0)}, f, indent=1, default=str)
    return 1 if any(r.get("failed") or r.get("error") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
