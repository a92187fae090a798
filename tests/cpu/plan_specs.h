#pragma once
// The fusion specs the planner's CPU tests plan (test_plan.cpp, test_plan_storage.cpp): a GEMM
// with a common epilogue, lowered through Φ, and the problem and device helpers.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "comfuse/lower.h"
#include "comfuse/plan.h"
#include "plan/calibration.h"

namespace comfuse::plan_specs {

// A GEMM y = f(x w^T) lowered through Φ; `epi` builds the epilogue on the accumulator.
inline FusionSpec lowered(const std::function<Value(Graph&, Value)>& epi, DType out = DType::BF16) {
  Graph g;
  Value x = g.input("x", DType::BF16, {Dim::of("M"), Dim::of("K")});
  Value w = g.input("w", DType::BF16, {Dim::of("N"), Dim::of("K")});
  Value acc = g.matmul(x, w);
  g.output(epi(g, acc), "y", out);
  LoweringResult r = lower(g);
  EXPECT_EQ(r.regions.size(), 1u);
  return r.regions.at(0).spec;
}

inline Value row(Graph& g, const std::string& name) { return g.input(name, DType::BF16, {Dim::of("N")}); }

inline FusionSpec bias_gelu() {
  return lowered([](Graph& g, Value acc) { return g.unary(UnaryOp::GeluErf, acc + row(g, "bias")); });
}
inline FusionSpec layer_norm() {
  return lowered([](Graph& g, Value acc) { return g.layer_norm(acc + row(g, "bias"), row(g, "gamma"), row(g, "beta")); });
}
inline FusionSpec rms_norm() {
  return lowered([](Graph& g, Value acc) { return g.rms_norm(acc, row(g, "gamma")); });
}
inline FusionSpec softmax() {
  return lowered([](Graph& g, Value acc) { return g.softmax(acc * 0.125); });
}
// A transformer block's residual norm: h = acc (+ bias) + residual, y = LayerNorm(h) or
// RMSNorm(h); h is stored too where store_h (the next block's residual, as
// examples/gemm_residual_*.cf), else the spec is the plain norm's plus the [M, N] input.
inline FusionSpec residual_norm(bool layer, DType residual, bool store_h) {
  return lowered([=](Graph& g, Value acc) {
    Value h = (layer ? acc + row(g, "bias") : acc) + g.input("residual", residual, {Dim::of("M"), Dim::of("N")});
    if (store_h) g.output(h, "h", DType::BF16);
    return layer ? g.layer_norm(h, row(g, "gamma"), row(g, "beta")) : g.rms_norm(h, row(g, "gamma"));
  });
}
// L dependent reductions: x <- x - mean(x), L times.
inline FusionSpec chain(int L) {
  return lowered([L](Graph& g, Value acc) {
    Value x = acc;
    for (int i = 0; i < L; ++i) x = x - g.reduce(ReduceOp::Mean, x);
    return x;
  });
}

inline Problem prob(int64_t m, int64_t n, int64_t k) { return Problem{m, n, k, DType::BF16}; }

// The planner's whole model, with the multi-N-tile strategies (stash, global-reread) that
// the device templates do not implement yet; DeviceModel{} is today's device.
inline DeviceModel full_device() {
  DeviceModel d;
  d.multi_tile_rows = true;
  return d;
}

}  // namespace comfuse::plan_specs
