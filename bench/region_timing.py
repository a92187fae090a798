"""Why a fused region's two timings disagree: the frontend's measurement before fusing
(python/comfuse/measure.py: random inputs; its clock was CUDA events around back-to-back calls
behind a spin kernel until it too captured CUDA graphs) against
bench/models.py's per-region rows (the model's own tensors, CUDA-graph replays). On the H200,
GPT-2's c_fc + gelu_new timed 122 us fused against Inductor's 138 the first way and 136 against
130 the second (bench/RESULTS.md, Stop 25).

One model case is compiled with backend="comfuse" and run once; each distinct fused region is then
timed, fused and Inductor's kernels for its aten graph alike, four ways: {the model's tensors,
random tensors of the same shapes and strides (measure.random_input)} x {CUDA-graph replays in
alternating rounds (gpu_timing), measure.py's own clock (measure._time_us)}. Every number of a
column comes from one run; the rounds alternate the callables, so power and clock states are
shared.

    python bench/region_timing.py [--arch gpt2] [--phase prefill] [--batch 8] [--seq 1024] [--out DIR]

writes DIR/region_timing.md and prints it. On the device machine (after scripts/stage_gpu_python.sh
here): BENCH_SCRIPT=bench/region_timing.py bash scripts/gpu_python.sh build bench
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
from comfuse import gpu_timing  # noqa: E402


regions_of = models.fused_regions  # the regions models.py's per-region rows time


def time_four_ways(rr, rounds: int) -> dict:
    """{(who, inputs, clock): us per call} for who in fused / inductor."""
    from comfuse import measure

    tensors, sizes = rr.last_inputs
    random = [measure.random_input(t) for t in tensors]
    calls = {}
    for inputs, ts in (("model", list(tensors)), ("random", random)):
        args = rr.subgraph_args([t.detach() for t in ts], sizes)
        ind = measure.inductor_region(rr.subgraph, args)
        calls[("fused", inputs)] = (lambda ts=ts: rr.run(ts, sizes))
        calls[("inductor", inputs)] = (lambda ind=ind, args=args: ind(*args))
    out = {}
    with torch.no_grad():
        graphs = {k: gpu_timing.capture(lambda i, f=f: f()) for k, f in calls.items()}
        reps = gpu_timing.reps_to_fill(graphs, target_ms=20.0, most=200)
        for k, ms in gpu_timing.alternating_rounds(graphs, rounds, reps).items():
            out[(*k, "graph rounds")] = 1e3 * statistics.median(ms)
        for k, us in gpu_timing.alternating(list(calls), rounds, lambda k: measure._time_us(calls[k])).items():
            out[(*k, "measure.py's clock")] = statistics.median(us)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="gpt2")
    ap.add_argument("--phase", default="prefill", choices=("prefill", "decode"))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/out"))
    # gpu_python.sh's default bench arguments (models.py's), accepted and ignored:
    ap.add_argument("--quick", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--budget-s", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    import comfuse

    if not torch.cuda.is_available() or not comfuse.gpu_available()[0]:
        print(f"bench/region_timing.py needs an sm_90 GPU: {comfuse.gpu_available()[1]}")
        return 2
    comfuse.config.strict = False
    comfuse.config.record_inputs = True
    model, ids = models.build(args.arch, layers=args.layers, batch=args.batch,
                              seq=args.seq if args.phase == "prefill" else 16)
    if args.phase == "prefill":
        module, call_args = models.Prefill(model), (ids,)
    else:
        cache = models.static_cache(model, ids, max_len=64)
        module, call_args = models.Decode(model, cache), (ids[:, -1:].contiguous(), torch.tensor([ids.shape[1]], device=ids.device))
    f = models.compiled("comfuse", module)
    with torch.no_grad(), comfuse.collecting() as rep:
        f(*call_args)
        torch.cuda.synchronize()

    lines = [f"# Fused regions timed four ways ({args.arch} {args.phase} b{args.batch}, "
             f"{torch.cuda.get_device_name()}, torch {torch.__version__})", "",
             "| region | M x N x K | inputs | clock | fused us | Inductor us | Inductor / fused |",
             "|---|---|---|---|---|---|---|"]
    regions = regions_of(rep)
    if not regions:
        lines.append("| (no region fused) | | | | | | |")
    for info, rr in regions:
        t = time_four_ways(rr, args.rounds)
        m = rr.last_inputs[0][0].numel() // info.k
        for inputs in ("model", "random"):
            for clock in ("graph rounds", "measure.py's clock"):
                fu, iu = t[("fused", inputs, clock)], t[("inductor", inputs, clock)]
                lines.append(f"| {info.root} | {m}x{info.n}x{info.k} | {inputs} | {clock} | {fu:.1f} | {iu:.1f} | "
                             f"{iu / fu:.3f}x |")
    text = "\n".join(lines) + "\n"
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "region_timing.md"), "w") as fh:
        fh.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
