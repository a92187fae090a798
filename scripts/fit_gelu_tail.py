#!/usr/bin/env python3
"""Fits the coefficients of erf-GELU's normal tail (kernels/comfuse/epilogue/ops.cuh GeluErf).

gelu(x) = x * Phi(x), Phi the standard normal CDF. With q = Phi(-|x|) (the tail, in (0, 1/2]),
Phi(x) = 1 - q for x >= 0 and q for x < 0, so no branch of it cancels. log2(q) is smooth on
[0, FIT_END] (-1 at 0, about -a^2 / (2 ln 2) far out): a polynomial P of low degree in a = |x|
fits it, and q = 2^P(a) is one MUFU.EX2. P still follows log2(q) to ~3% of q at 10 (q ~ 2^-77),
so a is clamped at CLAMP = 10: beyond it q * |x| is far below anything gelu's float value can
show for x > 0, and an absolute error below 1e-20 for x < 0 up to |x| ~ 1e3.

The fit is a least-squares fit on Chebyshev nodes of [0, FIT_END] (numpy), then checked in float32
emulation of the device code (Horner with fused multiply-adds rounded to float32) against the
fp64 formula over [-20, 20]. Prints the coefficients to paste into ops.cuh and the errors.

Run: build/pyvenv/bin/python scripts/fit_gelu_tail.py
"""
import math

import numpy as np

DEGREE = 7
FIT_END = 6.0
CLAMP = 10.0


def log2_tail(a):
    return np.log2(np.array([0.5 * math.erfc(v / math.sqrt(2.0)) for v in a]))


def fit():
    nodes = (1 - np.cos(np.pi * (np.arange(400) + 0.5) / 400)) * FIT_END / 2
    # Coefficients in increasing powers; P(0) is pinned near log2(1/2) = -1 by the fit itself.
    return np.polynomial.polynomial.polyfit(nodes, log2_tail(nodes), DEGREE)


def gelu_f32(x, coeffs):
    """The device code's arithmetic in float32: Horner with fma, ex2, select."""
    f = np.float32
    x = x.astype(np.float32)
    a = np.minimum(np.abs(x), f(CLAMP))
    c = coeffs.astype(np.float32)
    p = np.full_like(a, c[-1])
    for k in range(len(c) - 2, -1, -1):
        p = (p.astype(np.float64) * a + c[k]).astype(np.float32)  # one rounding: an FMA
    q = np.exp2(p.astype(np.float64)).astype(np.float32)           # ex2.approx: ~2 ulp; ignored
    phi = np.where(x >= 0, f(1) - q, q)
    return x * phi


def gelu_f64(x):
    return np.array([0.5 * v * math.erfc(-v / math.sqrt(2.0)) for v in x.astype(np.float64)])


def main():
    coeffs = fit()
    x = np.linspace(-20, 20, 400001).astype(np.float32)
    ref = gelu_f64(x)
    got = gelu_f32(x, coeffs).astype(np.float64)
    err = np.abs(got - ref)
    significant = np.abs(ref) > 1e-6
    rel = err[significant] / np.abs(ref[significant])
    print(f"degree {DEGREE} on [0, {FIT_END}], |x| clamped at {CLAMP}: coefficients (increasing powers of |x|):")
    print("  " + ", ".join(f"{v:.9e}f" for v in coeffs.astype(np.float32)))
    print(f"max relative error where |gelu| > 1e-6: {rel.max():.3e}")
    print(f"max absolute error elsewhere:           {err[~significant].max():.3e}")
    # What the GPU test (Gpu.GeluErfAcrossItsRange) bounds: |got - ref| / max(|ref|, 1e-6).
    print(f"max |error| / max(|gelu|, 1e-6):         {(err / np.maximum(np.abs(ref), 1e-6)).max():.3e}")


if __name__ == "__main__":
    main()
