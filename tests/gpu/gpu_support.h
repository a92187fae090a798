#pragma once
// Shared by the GPU test binaries: the skip on machines without an sm_90 GPU (CI), the
// GEMM every case starts from, and the output checks against the fp64 reference.
#include <gtest/gtest.h>

#include <string>

#include "comfuse/harness.h"
#include "comfuse/runtime.h"

namespace comfuse::gpu_test {

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!gpu_available(&why)) GTEST_SKIP() << "no usable sm_90 GPU (" << why << "): GPU tests run on the device machine";
  }
};

// acc = x[M, K] x w (w given N x K, or K x N with layout kn) plus the vectors cases add.
struct GemmCase {
  Graph g;
  Value acc;
  explicit GemmCase(DType in = DType::BF16, BLayout layout = BLayout::NK) {
    Value x = g.input("x", in, {Dim::of("M"), Dim::of("K")});
    Value w = g.input("w", in, layout == BLayout::NK ? Shape{Dim::of("N"), Dim::of("K")} : Shape{Dim::of("K"), Dim::of("N")});
    acc = g.matmul(x, w, layout);
  }
  Value row(const std::string& n) { return g.input(n, DType::BF16, {Dim::of("N")}); }
  Value col(const std::string& n) { return g.input(n, DType::F32, {Dim::of("M"), Dim::of(1)}); }
};

// Every output fully written, finite everywhere, and within tolerance.
// Timed runs: the launch after the timed ones too.
inline void expect_outputs_match(const DeviceRunReport& rep) {
  ASSERT_FALSE(rep.outputs.empty());
  for (const auto* checks : {&rep.outputs, &rep.outputs_after_timing})
    for (const OutputCheck& o : *checks) {
      const char* when = checks == &rep.outputs ? "first launch" : "launch after the timed ones";
      EXPECT_EQ(o.unwritten, 0) << o.name << ": elements left unwritten (" << when << ")";
      EXPECT_EQ(o.cmp.nonfinite, 0) << o.name << " (" << when << ")";
      EXPECT_EQ(o.nonfinite_anywhere, 0) << o.name << ": NaN or inf in rows the reference samples or not (" << when << ")";
      EXPECT_LE(o.cmp.rel_l2, gpu_result_tolerance(o.dtype)) << o.name << " max_abs " << o.cmp.max_abs << " (" << when << ")";
    }
  EXPECT_FALSE(rep.compiled.wgmma_serialized);
}

}  // namespace comfuse::gpu_test
