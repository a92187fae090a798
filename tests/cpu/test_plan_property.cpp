// Property tests of the planners: for hundreds of random shapes and random forced options (valid
// and not), over every example graph, planning either yields a kernel that check() accepts, fits
// SMEM, has a grid and renders, or throws comfuse::Error with a message. Never another exception,
// never a crash: bad input gets a clear error at the planner, not at the JIT. Then the first
// forced plan of each example is JIT-compiled. PLAN_PROPERTY_VERBOSE=1 prints every refusal and
// every compiled case.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <typeinfo>
#include <utility>
#include <unistd.h>
#include <vector>

#include "comfuse/emit.h"
#include "comfuse/error.h"
#include "comfuse/lower.h"
#include "comfuse/plan.h"
#include "comfuse/runtime.h"
#include "comfuse/scheduler/grid.cuh"
#include "comfuse/scheduler/turn_order.cuh"
#include "comfuse/text.h"
#include "plan/calibration.h"
#include "plan_cases.h"

namespace comfuse {
namespace {

using namespace plan_cases;

// What a planner call ended in; a failure of the property is recorded where it happens.
struct Outcome {
  int planned = 0, refused = 0;
};

// Runs `plan_and_check`; a comfuse::Error counts as a refusal (its message must say something;
// none where `must_plan`: the planner's own choices at a size TMA takes), any other exception
// fails the test with the case's description.
template <class F>
void expect_plan_or_error(const std::string& what, bool must_plan, Outcome& o, F&& plan_and_check) {
  try {
    plan_and_check();
    ++o.planned;
  } catch (const Error& e) {
    EXPECT_GT(std::string(e.what()).size(), 10u) << what;
    EXPECT_FALSE(must_plan) << what << ": the planner's defaults refused a size TMA takes: " << e.what();
    if (std::getenv("PLAN_PROPERTY_VERBOSE")) std::printf("%s\n  -> %s\n", what.c_str(), e.what());
    ++o.refused;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": not a comfuse::Error: " << typeid(e).name() << ": " << e.what();
  }
}

// Every case plans (then `check_plan` looks at the plan) or is refused by name; both ends are
// reached: most random cases plan, and a good share is refused.
template <class Case, class CheckPlan>
void expect_cases_plan_or_refuse(const std::vector<Case>& cases, CheckPlan&& check_plan) {
  Outcome o;
  for (const Case& c : cases) expect_plan_or_error(c.what, c.must_plan, o, [&] { check_plan(c); });
  const int n = static_cast<int>(cases.size());
  EXPECT_GT(o.planned, n / 4) << o.refused << " refused of " << n;
  EXPECT_GT(o.refused, n / 20) << o.planned << " planned of " << n;
}

// TurnOrder (scheduler/turn_order.cuh) at every job length and lead: the pair's positions are
// each consumer's tiles exactly once and in order (the producer loads them in this order, each
// consumer skips the other's), and every hand-over of the turn meets a wait for it (named barriers
// that pair one arrive with one sync), with the solo stretches the lead says.
template <int T, int Lead>
void expect_pair_order() {
  using O = TurnOrder<T, Lead>;
  const std::string what = fmt::format("T = {}, lead {}", T, Lead);
  int arrives_for[2] = {0, 0}, syncs[2] = {0, 0};
  for (int i = 0; i < O::kTiles; ++i) {
    const int w = O::consumer(i), nt = O::tile(i);
    EXPECT_EQ(O::pos(w, nt), i) << what;
    if (nt > 0) {
      EXPECT_LT(O::pos(w, nt - 1), i) << what;
    }
    if (O::takes_turn(i)) ++syncs[w];
    if (O::hands_turn(i)) ++arrives_for[1 - w];
  }
  EXPECT_EQ(syncs[0], arrives_for[0]) << what;
  EXPECT_EQ(syncs[1], arrives_for[1]) << what;
  EXPECT_EQ(O::pos(1, 0), Lead) << what << ": consumer 0's first tiles alone";
  EXPECT_EQ(O::kTiles - 1 - O::pos(0, T - 1), Lead) << what << ": consumer 1's last tiles alone";
}
template <int T, int... Leads>
void expect_pair_orders(std::integer_sequence<int, Leads...>) {
  (expect_pair_order<T, Leads + 1>(), ...);
}
template <int... Ts>
void expect_pair_orders_up_to(std::integer_sequence<int, Ts...>) {
  (expect_pair_orders<Ts + 1>(std::make_integer_sequence<int, Ts + 1>{}), ...);
}

TEST(PlanProperty, TurnOrderVisitsEveryTileOnceAndPairsItsTurns) {
  expect_pair_orders_up_to(std::make_integer_sequence<int, 16>{});
  // Lead = T is a job at a time; Lead = 1 alternates every tile.
  EXPECT_EQ((TurnOrder<8, 8>::consumer(7)), 0);
  EXPECT_EQ((TurnOrder<8, 8>::consumer(8)), 1);
  for (int i = 0; i < 16; ++i) EXPECT_EQ((TurnOrder<8, 1>::consumer(i)), i % 2);
}

TEST(PlanProperty, SingleGemmPlansOrRefusesByName) {
  const DeviceModel dev;
  expect_cases_plan_or_refuse(single_cases(300), [&](const SingleCase& c) {
    const std::string& what = c.what;
    const Plan plan = make_plan(c.spec, c.problem, c.opt);
    EXPECT_EQ(check(plan.kernel), nullptr) << what << ": " << check(plan.kernel);
    EXPECT_LE(plan.smem.total(), dev.smem_per_cta_bytes) << what;
    EXPECT_GT(plan.grid_ctas, 0) << what;
    EXPECT_GT(plan.estimate.total_us, 0) << what;
    EXPECT_FALSE(explain(c.spec, plan).empty()) << what;
    EXPECT_FALSE(emit(c.spec, plan).source.empty()) << what;
  });
}

// The GPU run's selection (tests/gpu/test_gpu_property.cpp): every example, three cases each,
// each planned, some with options forced.
TEST(PlanProperty, GpuCasesCoverEveryExample) {
  const std::vector<SingleCase> cases = gpu_cases(3);
  EXPECT_EQ(cases.size(), 9u * 3);
  int forced = 0;
  for (const SingleCase& c : cases) {
    EXPECT_NO_THROW((void)make_plan(c.spec, c.problem, c.opt)) << c.what;
    forced += describe(c.opt) != " (defaults)";
    if (std::getenv("PLAN_PROPERTY_VERBOSE")) std::printf("gpu case %s\n", c.what.c_str());
  }
  EXPECT_GE(forced, 9) << "a third at least with forced options";
}

// The GPU run's B2B selection: every example, two cases each, each planned.
TEST(PlanProperty, GpuB2bCasesCoverEveryExample) {
  const std::vector<B2bCase> cases = gpu_b2b_cases(2);
  EXPECT_EQ(cases.size(), kB2bExamples.size() * 2);
  for (const B2bCase& c : cases) {
    EXPECT_NO_THROW((void)make_b2b_plan(c.first, c.second, c.problem, c.opt)) << c.what;
    EXPECT_NO_THROW((void)b2b_problem_of(c.first, c.second, b2b_bindings(c.example, c.problem))) << c.what;
    if (std::getenv("PLAN_PROPERTY_VERBOSE")) std::printf("gpu b2b case %s\n", c.what.c_str());
  }
}

// A sample of the random plans with forced options, JIT-compiled (NVRTC, no GPU): the forced
// variants the GPU's A/B sweeps run build, with no serialized wgmma. Of each example, the first
// case that plans with some option forced (~4 s each on two cores).
template <class Case, class Plan, class Compile>
void compile_first_forced_plan_of_each_example(const std::vector<Case>& cases, Plan&& plan, Compile&& compile) {
  const std::filesystem::path cache =
      std::filesystem::temp_directory_path() / ("comfuse-plan-property-" + std::to_string(::getpid()));
  std::vector<std::string> done, examples;
  for (const Case& c : cases) {
    if (std::find(examples.begin(), examples.end(), c.example) == examples.end()) examples.push_back(c.example);
    if (describe(c.opt) == " (defaults)" || std::find(done.begin(), done.end(), c.example) != done.end()) continue;
    try {
      plan(c);
    } catch (const Error&) {
      continue;
    }
    if (std::getenv("PLAN_PROPERTY_VERBOSE")) std::printf("compile %s\n", c.what.c_str());
    CompileOptions o;
    o.jit.cache_dir = cache;
    o.plan = c.opt;
    o.plan.gpu = Gpu::H200;  // the plan the first step checked (compile_only plans for the GPU it finds)
    const CompiledKernel k = compile(c, o);
    EXPECT_TRUE(is_cubin_elf(k.cubin)) << c.what;
    EXPECT_FALSE(k.wgmma_serialized) << c.what << "\n" << k.log;
    done.push_back(c.example);
  }
  EXPECT_EQ(done.size(), examples.size());
  std::filesystem::remove_all(cache);
}

TEST(PlanProperty, ForcedPlansCompile) {
  compile_first_forced_plan_of_each_example(
      single_cases(300), [](const SingleCase& c) { (void)make_plan(c.spec, c.problem, c.opt); },
      [](const SingleCase& c, const CompileOptions& o) { return compile_only(c.spec, c.problem, o); });
}

TEST(PlanProperty, B2bPlansOrRefusesByName) {
  const DeviceModel dev;
  expect_cases_plan_or_refuse(b2b_cases(300), [&](const B2bCase& c) {
    const std::string& what = c.what;
    const B2bPlan plan = make_b2b_plan(c.first, c.second, c.problem, c.opt);
    EXPECT_EQ(check(plan.kernel), nullptr) << what << ": " << check(plan.kernel);
    EXPECT_LE(plan.kernel.smem_bytes(), dev.smem_per_cta_bytes) << what;
    EXPECT_GT(plan.grid_ctas, 0) << what;
    EXPECT_GT(plan.jobs, 0) << what;
    EXPECT_FALSE(explain(c.first, c.second, plan).empty()) << what;
    EXPECT_FALSE(emit_b2b(c.first, c.second, plan).source.empty()) << what;
    // choose_b2b says the same under Force: the pair as planned.
    EXPECT_TRUE(choose_b2b(c.first, c.second, c.problem, c.opt).one_kernel) << what;
  });
}

TEST(PlanProperty, ForcedB2bPlansCompile) {
  compile_first_forced_plan_of_each_example(
      b2b_cases(300), [](const B2bCase& c) { (void)make_b2b_plan(c.first, c.second, c.problem, c.opt); },
      [](const B2bCase& c, const CompileOptions& o) { return compile_only_b2b(c.first, c.second, c.problem, o); });
}

}  // namespace
}  // namespace comfuse
