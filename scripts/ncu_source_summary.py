#!/usr/bin/env python3
"""Summarize ncu's SASS source page (scripts/gpu_ncu_source.sh): warp-state samples by stall
reason, then by region of consecutive instructions, then the hottest instructions.

    python3 scripts/ncu_source_summary.py VARIANT.sass.csv [--region 128] [--top 25]
"""
import argparse
import collections
import csv


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    ap.add_argument("--region", type=int, default=128, help="instructions per region (default 128)")
    ap.add_argument("--top", type=int, default=25, help="hottest instructions to list (default 25)")
    a = ap.parse_args()
    with open(a.csv, newline="") as f:
        rows = list(csv.reader(f))
    header = next(i for i, r in enumerate(rows) if "Source" in r)  # a kernel-name line may precede it
    hdr, data = rows[header], rows[header + 1:]
    col = {h: i for i, h in enumerate(hdr)}
    reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    num = lambda r, h: int(r[col[h]] or 0)
    ins = [(r[col["Source"]].strip(), num(r, "Warp Stall Sampling (All Samples)"), num(r, "Instructions Executed"),
            collections.Counter({h[6:]: num(r, h) for h in reasons})) for r in data]
    total = sum(x[1] for x in ins) or 1
    by_reason = sum((x[3] for x in ins), collections.Counter())
    print(f"{len(ins)} instructions, {total} samples, {sum(x[2] for x in ins)} warp instructions executed")
    for h, v in by_reason.most_common(10):
        print(f"  {h:20s} {100 * v / total:5.1f}%")
    print(f"\nregions of {a.region} instructions (>= 0.5% of the samples): first instruction, samples, top reasons, opcodes")
    for b in range(0, len(ins), a.region):
        seg = ins[b:b + a.region]
        s = sum(x[1] for x in seg)
        if s < 0.005 * total:
            continue
        c = sum((x[3] for x in seg), collections.Counter())
        top = ", ".join(f"{h} {100 * v / max(s, 1):.0f}%" for h, v in c.most_common(3))
        ops = collections.Counter(x[0].split()[1] if x[0].startswith("@") else x[0].split()[0] for x in seg)
        print(f"  {b:6d} {100 * s / total:5.1f}%  {top:45s} {', '.join(f'{o} {n}' for o, n in ops.most_common(4))}")
    print(f"\nhottest instructions: index, samples, top reasons, instruction")
    for k, x in sorted(enumerate(ins), key=lambda kx: -kx[1][1])[:a.top]:
        top = ", ".join(f"{h} {v}" for h, v in x[3].most_common(2))
        print(f"  {k:6d} {x[1]:6d}  {top:30s} {x[0][:70]}")


if __name__ == "__main__":
    main()
