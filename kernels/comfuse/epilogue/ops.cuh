// comfuse/epilogue/ops.cuh: device functors of the operator vocabulary. Each name is the
// last column of include/comfuse/ops.def; semantics follow that file's fp64 expressions,
// computed in fp32. Fast intrinsics only where they stay well inside bf16 accuracy
// (__expf: ~2 ulp relative; __fdividef: 2 ulp, and 0 for a divisor beyond 2^126, which is
// the right limit where it is used). IEEE division costs a slow-path branch per element,
// and the epilogue is fully unrolled: code size matters (instruction cache), see NOTES.md.
// The reductions' functors (ReduceSum, ReduceMean, ReduceMax, ReduceMin) are in reduce.cuh.
#pragma once
#include "../common.cuh"

namespace comfuse::epi {

inline constexpr float kLog2e = 1.4426950408889634f;
// 2^x as one MUFU.EX2 (flush-to-zero: __expf adds a denormal-range fix-up per element).
COMFUSE_DEVICE float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// e^x as 2^(x log2(e)). Relative error ~2^-22 plus the rounding of x*log2(e): far inside bf16
// (2^-8).
COMFUSE_DEVICE float fast_exp(float x) { return fast_exp2(x * kLog2e); }
// e^(x - shift) for a shift shared by many x (softmax's row max): 2^(x log2(e) - shift log2(e)),
// the subtraction inside the FFMA that scales for ex2 (one instruction a value fewer than
// fast_exp(x - shift)). The extra error is the rounding of shift log2(e): at most 2^-24 |shift|
// relative, one factor for every x sharing the shift (1 + 6e-6 at |shift| = 100), which a
// softmax's normalization cancels exactly.
COMFUSE_DEVICE float fast_exp_shifted(float x, float shift) { return fast_exp2(fmaf(x, kLog2e, -(shift * kLog2e))); }
// v = fast_exp_shifted(v, shift) as ONE asm on a tied operand, for an exp that replaces its
// operand in the registers (stage.cuh kKeepsExp); fma.rn keeps the denormals that an ftz build's
// fmaf would flush. Written as the separate fmaf and ex2 above (or untied), a 128x256 cooperative
// tile's 128 exps a thread landed in fresh registers and ptxas spilled 268 B of them across the
// exchange round (the chain example at 4096 x 4096 x 1024); tied and fused, 16 B, as much as when
// they stayed x.
COMFUSE_DEVICE void fast_exp_shifted_in_place(float& v, float shift) {
  asm("fma.rn.f32 %0, %0, %1, %2;\n\tex2.approx.ftz.f32 %0, %0;" : "+f"(v) : "f"(kLog2e), "f"(-(shift * kLog2e)));
}
// 2^x for x <= 8 (the online softmax's stale reference, b2b/intermediate.cuh) on the FMA and
// integer pipes, for where the MUFU's 16 results a clock per SM bound a softmax (the B2B online
// softmax at small head dims; FlashAttention-4's trick): x = j + f with j = round(x) (the
// 1.5 * 2^23 shift leaves it in the low mantissa bits) and f in [-0.5, 0.5], 2^f a degree-3
// polynomial (relative error <= 1.1e-4, below bf16's 2^-9), j added into the exponent. x is
// clamped at -127: 2^-127 is 0 to S in bf16 and to the row sum.
COMFUSE_DEVICE float fma_exp2(float x) {
  x = fmaxf(x, -127.f);
  float const shifted = __fadd_rn(x, 12582912.f);  // _rn: never folded with the subtraction
  float const f = x - __fsub_rn(shifted, 12582912.f);
  float p = fmaf(0.05500869f, f, 0.24221063f);
  p = fmaf(p, f, 0.69328292f);
  p = fmaf(p, f, 1.f);
  return __int_as_float(__float_as_int(p) + (__float_as_int(shifted) << 23));
}

// max(x, y), NaN where either is (fmaxf returns the other operand): one FMNMX.NAN.
COMFUSE_DEVICE float max_nan(float x, float y) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(x), "f"(y));
  return r;
}

// Unary: static float apply(float x). Binary: static float apply(float a, float b).
struct Relu { static COMFUSE_DEVICE float apply(float x) { return x > 0.f ? x : 0.f; } };
// x Phi(x) through the normal tail q = Phi(-|x|) = 2^P(|x|): Phi = 1 - q or q by sign, so neither
// side cancels (0.5 x (1 + erff(x / sqrt 2)) is ~10% off at x = -5 in fp32), and the cost is seven
// FMAs and one MUFU.EX2 against erff's ~28 instructions (at K = 1024 an epilogue's instructions
// are paid on the other warp group's MMAs: NOTES.md, "K = 1024"). P: degree 7 on [0, 6], fitted
// by scripts/fit_gelu_tail.py, which still follows log2 q out to 10 (q ~ 2^-77), where |x| is
// clamped: gelu's relative error <= 4e-6 where |gelu| > 1e-6, absolute error < 3e-12 elsewhere.
// NaN propagates (max_nan, and the clamp's NaN-dropping min then meets it in the FFMA); +inf
// stays +inf; gelu(-inf) is ~-7e-23 (the fp64 formula's is NaN).
struct GeluErf {
  static COMFUSE_DEVICE float apply(float x) {
    float const a = fminf(fabsf(x), 10.f);
    float p = -1.889626219e-06f;
    p = fmaf(p, a, 6.268139987e-05f);
    p = fmaf(p, a, -9.388679173e-04f);
    p = fmaf(p, a, 8.539461531e-03f);
    p = fmaf(p, a, -5.402068794e-02f);
    p = fmaf(p, a, -4.584097862e-01f);
    p = fmaf(p, a, -1.151269197e+00f);
    p = fmaf(p, a, -9.999943376e-01f);
    float const q = fast_exp2(p);
    // x (1 - q) for x >= 0 and x q below, as one FFMA after a NaN-keeping max: max(x, 0) - a q.
    // Past |x| = 10 the clamped a leaves ~1e-22 where x Phi(x) rounds to x or 0; NaN stays NaN.
    return fmaf(-a, q, max_nan(x, 0.f));
  }
};
// 0.5 x (1 + tanh(u)) == x * sigmoid(2u): no cancellation for large negative x.
struct GeluTanh {
  static COMFUSE_DEVICE float apply(float x) {
    float u = 0.79788456080286535588f * (x + 0.044715f * x * x * x);
    return __fdividef(x, 1.f + fast_exp(-2.f * u));
  }
};
// 1 + tanh(u) == 2 sigmoid(2u) (Ψ's rendering of add(tanh(u), 1): spec.h one_plus_tanh_operand).
// 1 + tanhf(u) loses every digit for u << 0; this keeps the relative error of fast_exp and
// __fdividef. u beyond ~-44 gives 0 (the exp overflows, or the divisor passes 2^126), where the
// value is below 2^-126.
struct OnePlusTanh { static COMFUSE_DEVICE float apply(float u) { return __fdividef(2.f, 1.f + fast_exp(-2.f * u)); } };
struct Silu { static COMFUSE_DEVICE float apply(float x) { return __fdividef(x, 1.f + fast_exp(-x)); } };
struct Sigmoid { static COMFUSE_DEVICE float apply(float x) { return __fdividef(1.f, 1.f + fast_exp(-x)); } };
struct Tanh { static COMFUSE_DEVICE float apply(float x) { return tanhf(x); } };
// fast_exp: 2 instructions instead of expf's 8 (softmax's exp of every element: NOTES.md,
// "Softmax"); relative error <= ~5e-6 for |x| <= 88 (the rounding of x*log2(e)), results
// below 2^-126 flush to 0 (absolute error < 1.2e-38).
struct Exp { static COMFUSE_DEVICE float apply(float x) { return fast_exp(x); } };
struct Log { static COMFUSE_DEVICE float apply(float x) { return logf(x); } };
struct Rsqrt { static COMFUSE_DEVICE float apply(float x) { return rsqrtf(x); } };
struct Sqrt { static COMFUSE_DEVICE float apply(float x) { return sqrtf(x); } };
struct Square { static COMFUSE_DEVICE float apply(float x) { return x * x; } };
struct Abs { static COMFUSE_DEVICE float apply(float x) { return fabsf(x); } };
struct Neg { static COMFUSE_DEVICE float apply(float x) { return -x; } };
struct Reciprocal { static COMFUSE_DEVICE float apply(float x) { return 1.f / x; } };
// torch's softplus (beta 1, threshold 20): x past 20; below, log1pf keeps e^x's small values,
// which log(1 + e^x) rounds to 0 once e^x is below fp32's epsilon. fast_exp's relative error
// (~5e-6) passes through log1p(y) ~ y unchanged for small y and shrinks for larger; NaN stays NaN.
struct Softplus { static COMFUSE_DEVICE float apply(float x) { return x > 20.f ? x : log1pf(fast_exp(x)); } };
// The libdevice functions: exact to ~1-2 ulp of fp32 near 0, where e^x - 1 and log(1 + x)
// cancel (ELU's negative side, log1p of a small value).
struct Expm1 { static COMFUSE_DEVICE float apply(float x) { return expm1f(x); } };
struct Log1p { static COMFUSE_DEVICE float apply(float x) { return log1pf(x); } };
struct Erf { static COMFUSE_DEVICE float apply(float x) { return erff(x); } };

struct Add { static COMFUSE_DEVICE float apply(float a, float b) { return a + b; } };
struct Sub { static COMFUSE_DEVICE float apply(float a, float b) { return a - b; } };
struct Mul { static COMFUSE_DEVICE float apply(float a, float b) { return a * b; } };
// Tile / tile. A per-row or scalar divisor (softmax's e / sum) never gets here: the Stage
// executor multiplies by one reciprocal per row instead (stage.cuh, visit_nodes).
struct Div { static COMFUSE_DEVICE float apply(float a, float b) { return a / b; } };
// NaN-propagating, as ops.def (fmaxf/fminf would drop the NaN).
struct Max {
  static COMFUSE_DEVICE float apply(float a, float b) { return a > b ? a : (b > a ? b : (isnan(a) ? a : b)); }
};
struct Min {
  static COMFUSE_DEVICE float apply(float a, float b) { return a < b ? a : (b < a ? b : (isnan(a) ? a : b)); }
};
struct Pow { static COMFUSE_DEVICE float apply(float a, float b) { return powf(a, b); } };
// pow(x, E) for a literal exponent E in 2..4 (Ψ picks it: emit_rules.cpp): E - 1 multiplies
// instead of powf's ~80 instructions (GPT-2's gelu_new cubes every element). Rounds up to
// E - 1 times where powf rounds once: within 2 ulp in fp32, far below a 16-bit output's step.
template <int E> struct PowInt {
  static_assert(E >= 2 && E <= 4, "PowInt: exponents 2..4");
  static COMFUSE_DEVICE float apply(float x) {
    float const x2 = x * x;
    if constexpr (E == 2) return x2;
    else if constexpr (E == 3) return x2 * x;
    else return x2 * x2;
  }
};

}  // namespace comfuse::epi
