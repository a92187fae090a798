// The planner's random cases on the GPU (tests/plan_cases.h: every single-GEMM example, bf16 or
// f16, random shapes, options forced now and then): each example's first cases that plan run on
// random inputs against the fp64 reference, then again after two timed launches (the exchange
// and split-K tags of a later launch). The forced variants the A/B sweeps reach for are thereby
// run for real, not only compiled (tests/cpu/test_plan_property.cpp); the B2B cases likewise.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "gpu_support.h"
#include "plan_cases.h"

namespace comfuse {
namespace {

using namespace plan_cases;

// The cases of example `example` on random inputs against the fp64 reference, then again after
// two timed launches; `more(report)` adds a family's own checks. Returns how many ran.
template <class Case, class More>
int run_cases_of(const std::vector<Case>& cases, const std::string& example, More&& more) {
  uint64_t seed = 1;
  int ran = 0;
  for (const Case& c : cases) {
    if (c.example != example) continue;
    SCOPED_TRACE(c.what);
    CompileOptions o;
    o.plan = c.opt;
    const DeviceRunReport rep = run_and_check(parse_graph(c.text), bindings_of(c), seed++, o, /*timing_reps=*/2);
    gpu_test::expect_outputs_match(rep);
    EXPECT_FALSE(rep.outputs_after_timing.empty());
    more(rep);
    ++ran;
  }
  return ran;
}

std::string example_name(const ::testing::TestParamInfo<std::string>& i) { return i.param.substr(0, i.param.find('.')); }

// One instance per example (shards run them in parallel).
class GpuProperty : public gpu_test::GpuTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(GpuProperty, RandomForcedPlansMatchTheReference) {
  EXPECT_EQ(run_cases_of(gpu_cases(), GetParam(), [](const DeviceRunReport&) {}), 3);
}
INSTANTIATE_TEST_SUITE_P(Examples, GpuProperty, ::testing::ValuesIn(kSingleGemmExamples), example_name);

// The B2B cases (FFN, SwiGLU, attention plain, causal and batched; random shapes and forced B2B
// options), two per example, against the fp64 reference.
class GpuB2bProperty : public gpu_test::GpuTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(GpuB2bProperty, RandomForcedPlansMatchTheReference) {
  EXPECT_EQ(run_cases_of(gpu_b2b_cases(), GetParam(),
                         [](const DeviceRunReport& rep) { EXPECT_GT(rep.b2b_plan.jobs, 0) << "one B2B kernel"; }),
            2);
}
INSTANTIATE_TEST_SUITE_P(Examples, GpuB2bProperty, ::testing::ValuesIn(kB2bExamples), example_name);

}  // namespace
}  // namespace comfuse
