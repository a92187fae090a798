"""Decode-step attention: one query row a head (or four: speculative tokens) against a cache of N
keys, the step's mask (keys past the sequence's length masked) an operand of the kernel
(attention.additive_mask): the planner's kernel, then each kernel forced (the wgmma pipeline, the
decode kernel by cluster size), against torch's scaled_dot_product_attention on the same inputs
with the boolean [B, 1, M, N] mask (the backend torch picks: what Inductor calls for a decode
step), in the same rounds.

GPU-only times: each side captured in a CUDA graph and replayed back to back, the two alternating
round by round (comfuse.gpu_timing), medians; the mask operand is made outside the kernel's timing
(in a model Inductor fuses it into the ops that compute the mask). Every output is checked against
SDPA's math backend in float32 first (a row FAILS above rel-L2 2e-2).

    python bench/decode_attention.py [--out DIR] [--cases B1xH16,...] [--rounds R] [--reps N] [--dry-run]
                                     [--ab-kernels DIR] [--variants NAMES]

--ab-kernels DIR also times the planner's kernel compiled from another kernels/ tree (e.g. the
parent commit's, `git archive HEAD~1 kernels | tar -x -C DIR/..`), in the same rounds. Only the
device code comes from that tree: the launch (grid, threads, SMEM) is this build's, so the other
tree's kernel must need no more SMEM than this one's plan gives.

writes DIR/decode_attention.md; --dry-run plans every row on the CPU (no GPU). On the GPU
machine: `BENCH_SCRIPT=bench/decode_attention.py bash scripts/gpu_python.sh bench`.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

# (batch, heads, query rows, cache keys, head dim): GPT-2 medium's heads at a short cache (the
# models' StaticCache of 64) and at long contexts; four query rows (speculative tokens).
# Llama's decode step groups a KV head's 4 query heads as rows (attention.group_view): 8 KV heads,
# 4 rows, head dim 128.
CASES = [(1, 16, 1, 64, 64), (32, 16, 1, 64, 64), (1, 16, 1, 1024, 64), (32, 16, 1, 1024, 64),
         (1, 16, 1, 4096, 64), (8, 16, 1, 4096, 128), (1, 16, 4, 4096, 64),
         (1, 8, 4, 64, 128), (32, 8, 4, 64, 128), (32, 8, 4, 1024, 128)]


def case_id(b, h, m, n, d) -> str:
    return f"B{b}xH{h}" + (f" M{m}" if m > 1 else "") + f" N{n} D{d}"


def variants(n: int) -> dict:
    """The planner's choice, then each kernel forced: the wgmma pipeline and the decode kernel by
    cluster size (those whose CTAs get 16 keys or more: the planner's own rule, a step of keys a
    CTA, is what this measures)."""
    v = {"planner": {}, "pipeline": {"b2b_decode": False}}
    for c in (1, 2, 4, 8, 16):
        if c == 1 or n >= c * 16:
            v[f"decode c{c}"] = {"b2b_decode": True, "cluster_n": c}
    return v


def run_case(b: int, h: int, m: int, n: int, d: int, rounds: int, reps: int, ab_kernels: str = "",
             only: tuple = ()) -> dict:
    import comfuse
    from comfuse import attention, gpu_timing
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dev = torch.device("cuda")
    g = attention.attention_graph("bf16", 1 / d ** 0.5, causal=False, mask="bf16")
    dims = {"B": b * h, "M": m, "N": n, "K": d, "DV": d}
    kerns = {name: comfuse.compile_graph(g.text(), dims, **opts) for name, opts in variants(n).items()
             if name == "planner" or not only or name in only}
    if ab_kernels:  # the planner's kernel built from another kernels/ tree (an A/B of a device change)
        was = os.environ.get("COMFUSE_KERNELS_DIR")
        os.environ["COMFUSE_KERNELS_DIR"] = ab_kernels
        try:
            kerns["planner (A/B tree)"] = comfuse.compile_graph(g.text(), dims)
        finally:
            if was is None:
                del os.environ["COMFUSE_KERNELS_DIR"]
            else:
                os.environ["COMFUSE_KERNELS_DIR"] = was
    q = torch.randn(b, h, m, d, device=dev, dtype=torch.bfloat16)
    k, v = (torch.randn(b, h, n, d, device=dev, dtype=torch.bfloat16) for _ in range(2))
    # Each sequence's filled slots, short ones included: a rank of N1's split over a cluster may see
    # no key of its row at all.
    lengths = torch.randint(1, n + 1, (b,), device=dev)
    keep = (torch.arange(n, device=dev)[None, None, None, :] < lengths[:, None, None, None]).expand(b, 1, m, n)
    operand = attention.additive_mask(keep, torch.bfloat16, (b, h, m, n))
    outs = {name: torch.empty(b, h, m, d, device=dev, dtype=torch.bfloat16) for name in kerns}
    runs = {name: (lambda i, kk=kk, o=outs[name]: kk(q=q, k=k, v=v, mask=operand, o=o)) for name, kk in kerns.items()}
    runs["sdpa"] = lambda i: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)  # noqa: E731
    with sdpa_kernel(SDPBackend.MATH):
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=keep)
    row = {"case": case_id(b, h, m, n, d), "err": {}}
    for name, kk in kerns.items():
        runs[name](0)
        row["err"][name] = ((outs[name].float() - ref).norm() / ref.norm()).item()
    if not all(e < 2e-2 for e in row["err"].values()):
        row["failed"] = True
        return row
    with torch.no_grad():
        graphs = {name: gpu_timing.capture(run) for name, run in runs.items()}
        ms = gpu_timing.alternating_rounds(graphs, rounds, reps)
    row["us"] = {name: 1e3 * statistics.median(t) for name, t in ms.items()}
    row["ratio"] = statistics.median(f / s for f, s in zip(ms["planner"], ms["sdpa"]))
    row["plan"] = "; ".join(" ".join(l.split()) for l in kerns["planner"].explain().splitlines()
                            if l.strip().startswith(("kernel ", "tiles", "N1 split", "grid")))
    return row


def dry_run(cases, log) -> int:
    """Plans every row on the CPU: one batched B2B kernel with the mask operand in F."""
    from comfuse import attention

    for b, h, m, n, d in cases:
        g = attention.attention_graph("bf16", 1 / d ** 0.5, causal=False, mask="bf16")
        for name, opts in variants(n).items():
            try:
                _, choice = attention.plan_kernel(g, {"B": b * h, "M": m, "N": n, "K": d, "DV": d}, opts)
            except attention.Refused as e:
                log(f"{case_id(b, h, m, n, d)} {name}: not one B2B kernel: {e}")
                return 1
            log(f"{case_id(b, h, m, n, d)} {name}: one batched B2B kernel, planner estimate {choice['fused_us']:.1f} us")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/out"))
    ap.add_argument("--cases", default="", help="only rows whose id contains one of these, comma-separated")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--dry-run", action="store_true", help="plan every row on the CPU; time nothing")
    ap.add_argument("--ab-kernels", default="", help="also time the planner's kernel built from this kernels/ tree")
    ap.add_argument("--variants", default="", help="the forced kernels to time beside the planner's, comma-separated "
                    "(e.g. 'pipeline,decode c2'; default all, 'none' for the planner's alone)")
    ap.add_argument("--layers", type=int, help=argparse.SUPPRESS)  # gpu_python.sh's default arguments
    ap.add_argument("--quick", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--budget-s", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    pats = [p for p in args.cases.split(",") if p]
    cases = [c for c in CASES if not pats or any(p in case_id(*c) for p in pats)]
    if not cases:
        print(f"no case matches --cases {args.cases!r}; the cases: {[case_id(*c) for c in CASES]}")
        return 2
    if args.dry_run:
        return dry_run(cases, print)
    rows = []
    for c in cases:
        try:
            rows.append(run_case(*c, rounds=args.rounds, reps=args.reps, ab_kernels=args.ab_kernels,
                                 only=tuple(v for v in args.variants.split(",") if v)))
        except Exception as e:  # noqa: BLE001 - a row that cannot run is reported, the others go on
            rows.append({"case": case_id(*c), "error": f"{type(e).__name__}: {str(e).splitlines()[0]}"})
        print(rows[-1], flush=True)
    lines = [f"# Decode attention ({torch.cuda.get_device_name()}, torch {torch.__version__})", "",
             "ComFuse: the planner's kernel; then each kernel forced (the wgmma pipeline, the decode kernel by "
             "cluster size), all against SDPA with the bool mask in the same rounds.", "",
             "| case | ComFuse us | SDPA (bool mask) us | ComFuse / SDPA | forced: us | worst rel-L2 vs math f32 | plan |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        err = max(r["err"].values()) if r.get("err") else float("nan")
        if "us" in r:
            forced = ", ".join(f"{k} {v:.1f}" for k, v in r["us"].items() if k not in ("planner", "sdpa"))
            lines.append(f"| {r['case']} | {r['us']['planner']:.1f} | {r['us']['sdpa']:.1f} | {r['ratio']:.3f} | "
                         f"{forced} | {err:.1e} | {r['plan']} |")
        else:
            lines.append(f"| {r['case']} | - | - | - | - | {r.get('err', '-')} | {r.get('error', 'FAILED')} |")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "decode_attention.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if any("failed" in r or "error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
