"""Unfused baselines for the row-reduction examples (bench/NOTES.md), on the device machine.

cuBLAS GEMM alone (torch.matmul), then the same epilogue as examples/gemm_{layernorm,rmsnorm,
softmax}.cf unfused in PyTorch eager (cuBLAS GEMM + separate elementwise and reduction kernels)
and under torch.compile. Every variant is timed in alternating rounds with the GEMM alone, so
both run in the same power state (the H200 sits at its power cap; see bench/NOTES.md), and each
ratio is to the GEMM of the same round. bf16 throughout, B given N x K as in the examples.

  SHAPES="1152x32768x1024,..."   other shapes than the default three, each also under torch.compile
  EPILOGUES="layernorm,softmax"   a subset of the epilogues
  TORCH_COMPILE=0                 eager only
"""
import os
import statistics
import sys

import torch
import torch.nn.functional as F


def time_ms(fn, iters=20):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def epilogues(m, n, k):
    g = torch.Generator(device="cuda").manual_seed(7)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * k ** -0.5
    bias, gamma, beta = (torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    alpha = 0.75
    return a, w, {
        "layernorm": lambda: F.layer_norm(torch.matmul(a, w.t()) * alpha + bias, (n,), gamma, beta, 1e-5),
        "rmsnorm": lambda: F.rms_norm(torch.matmul(a, w.t()), (n,), gamma, 1e-6),
        "softmax": lambda: torch.softmax(torch.matmul(a, w.t()), dim=-1),
    }


def main():
    given = [tuple(int(d) for d in s.split("x")) for s in os.environ.get("SHAPES", "").split(",") if s]
    shapes = given or [(8192, 4096, 4096), (4096, 8192, 4096), (256, 4096, 4096)]
    compile_shapes = (set(given) or {(8192, 4096, 4096)}) if os.environ.get("TORCH_COMPILE", "1") == "1" else set()
    wanted = [e for e in os.environ.get("EPILOGUES", "").split(",") if e]
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print("| M x N x K | epilogue | GEMM alone ms | eager ms | eager / GEMM | compiled ms | compiled / GEMM |")
    print("|---|---|---|---|---|---|---|")
    for (m, n, k) in shapes:
        a, w, eps = epilogues(m, n, k)
        gemm = lambda: torch.matmul(a, w.t())
        for name, eager in eps.items():
            if wanted and name not in wanted:
                continue
            variants = {"eager": eager}
            if (m, n, k) in compile_shapes:
                variants["compiled"] = torch.compile(eager, dynamic=False)
            for f in [gemm, *variants.values()]:
                for _ in range(3):
                    f()
            torch.cuda.synchronize()
            ratios = {v: [] for v in variants}
            times = {v: [] for v in ["gemm", *variants]}
            for _ in range(5):
                tg = time_ms(gemm)
                times["gemm"].append(tg)
                for v, f in variants.items():
                    t = time_ms(f)
                    times[v].append(t)
                    ratios[v].append(t / tg)
            med = {v: statistics.median(t) for v, t in times.items()}
            r = {v: statistics.median(x) for v, x in ratios.items()}
            comp = (f"{med['compiled']:.4f} | {r['compiled']:.3f}x" if "compiled" in med else "- | -")
            print(f"| {m}x{n}x{k} | {name} | {med['gemm']:.4f} | {med['eager']:.4f} | {r['eager']:.3f}x | {comp} |")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
