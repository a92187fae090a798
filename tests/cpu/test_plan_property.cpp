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
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

#include "comfuse/emit.h"
#include "comfuse/error.h"
#include "comfuse/lower.h"
#include "comfuse/plan.h"
#include "comfuse/runtime.h"
#include "comfuse/scheduler/grid.cuh"
#include "comfuse/text.h"
#include "plan/calibration.h"

namespace comfuse {
namespace {

const std::filesystem::path kRoot = COMFUSE_SOURCE_DIR;

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw Error(fmt::format("cannot read {}", path));
  return std::string(std::istreambuf_iterator<char>(f), {});
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : g_(seed) {}
  template <class T>
  T pick(const std::vector<T>& v) {  // one of v, uniformly
    return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(g_)];
  }
  bool coin(double p) { return std::bernoulli_distribution(p)(g_); }
  // A forced value from `v` now and then (p), else the planner's choice.
  template <class T>
  std::optional<T> maybe(const std::vector<T>& v, double p = 0.15) {
    return coin(p) ? std::optional<T>(pick(v)) : std::nullopt;
  }

 private:
  std::mt19937_64 g_;
};

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

std::string describe(const PlanOptions& o) {
  std::string s;
  auto add = [&](const char* name, const auto& v) {
    if (v) s += fmt::format(" {}={}", name, *v);
  };
  add("cluster_n", o.cluster_n), add("tile_n", o.tile_n), add("tile_m", o.tile_m);
  add("cluster_m", o.cluster_m), add("row_group", o.row_group), add("k_splits", o.k_splits);
  add("stash_bytes", o.stash_bytes), add("fuse_pairs", o.fuse_pairs), add("ring_stages", o.ring_stages);
  if (o.aggregation) s += fmt::format(" aggregation={}", static_cast<int>(*o.aggregation));
  if (o.strategy) s += fmt::format(" strategy={}", static_cast<int>(*o.strategy));
  add("b2b_job_rows", o.b2b_job_rows), add("fma_exp_every", o.fma_exp_every), add("b2b_overlap", o.b2b_overlap);
  add("b2b_x_resident", o.b2b_x_resident), add("b2b_x_buffers", o.b2b_x_buffers);
  add("b2b_chain_jobs", o.b2b_chain_jobs);
  return s.empty() ? " (defaults)" : s;
}

// A random case: an example's spec, a shape and forced options, and how a failure names it.
struct SingleCase {
  std::string example;
  FusionSpec spec;
  Problem problem;
  PlanOptions opt;
  std::string what;
  bool must_plan;  // the planner's own choices at a size TMA takes
};

// Single-GEMM examples: shapes from decode to vocabulary rows, ragged and misaligned ones among
// them; each option forced now and then, from values the kernel takes and values it does not.
std::vector<SingleCase> single_cases(int per_example) {
  std::vector<SingleCase> cases;
  for (const char* ex : {"gemm_bias_gelu.cf", "gemm_layernorm.cf", "gemm_rmsnorm.cf", "gemm_softmax.cf",
                         "gemm_log_softmax.cf", "gemm_chain.cf", "gemm_gelu_new.cf", "gemm_residual_layernorm.cf",
                         "gemm_residual_rmsnorm.cf"}) {
    // The example as written (bf16), and with every bf16 tensor f16.
    std::string text = read_text((kRoot / "examples" / ex).string()), f16 = text;
    for (size_t at; (at = f16.find("bf16")) != std::string::npos;) f16.replace(at, 4, "f16");
    const LoweringResult bf = lower(parse_graph(text)), hf = lower(parse_graph(f16));
    if (bf.regions.empty() || hf.regions.empty()) throw Error(fmt::format("{}: no region", ex));
    Rng rng(std::hash<std::string>{}(ex));
    for (int i = 0; i < per_example; ++i) {
      const bool half = rng.coin(0.3);
      SingleCase c{ex, (half ? hf : bf).regions.front().spec, {}, {}, {}, false};
      c.problem = Problem{rng.pick<int64_t>({1, 7, 16, 64, 200, 256, 1000, 4100, 8192}),
                          rng.coin(0.05) ? 1001 : rng.pick<int64_t>({8, 64, 1000, 2048, 4096, 8200, 32768}),
                          rng.coin(0.05) ? 100 : rng.pick<int64_t>({8, 64, 72, 1024, 4096, 14336}),
                          half ? DType::F16 : DType::BF16};
      PlanOptions& opt = c.opt;
      opt.cluster_n = rng.maybe<int>({1, 2, 3, 4, 8, 16, 32});
      opt.tile_n = rng.maybe<int>({32, 64, 96, 128, 192, 256, 512});
      opt.tile_m = rng.maybe<int>({32, 64, 128, 256});
      opt.aggregation = rng.maybe<Aggregation>(
          {Aggregation::None, Aggregation::PeerToPeer, Aggregation::LeaderFollower, Aggregation::L2Exchange}, 0.15);
      opt.strategy = rng.maybe<RowStrategy>({RowStrategy::NoReduction, RowStrategy::OnChip, RowStrategy::SmemStash,
                                             RowStrategy::WorkspaceStash},
                                            0.15);
      opt.cluster_m = rng.maybe<int>({1, 2, 3, 4});
      opt.row_group = rng.maybe<int>({1, 2, 3, 8, 32, 64, 128}, 0.15);
      opt.k_splits = rng.maybe<int>({1, 2, 3, 8, 16, 64}, 0.15);
      opt.stash_bytes = rng.maybe<int>({2, 3, 4}, 0.1);
      opt.fuse_pairs = rng.maybe<bool>({false, true}, 0.15);
      opt.ring_stages = rng.maybe<int>({1, 2, 5, 8, 9}, 0.15);
      const Problem& p = c.problem;
      c.what = fmt::format("{}{} M={} N={} K={}{}", ex, half ? " (f16)" : "", p.m, p.n, p.k, describe(opt));
      c.must_plan = describe(opt) == " (defaults)" && p.n % 8 == 0 && p.k % 8 == 0;
      cases.push_back(std::move(c));
    }
  }
  return cases;
}

TEST(PlanProperty, SingleGemmPlansOrRefusesByName) {
  const DeviceModel dev;
  Outcome o;
  const std::vector<SingleCase> cases = single_cases(300);
  for (const SingleCase& c : cases) {
    const std::string& what = c.what;
    expect_plan_or_error(what, c.must_plan, o, [&] {
      const Plan plan = make_plan(c.spec, c.problem, c.opt);
      EXPECT_EQ(check(plan.kernel), nullptr) << what << ": " << check(plan.kernel);
      EXPECT_LE(plan.smem.total(), dev.smem_per_cta_bytes) << what;
      EXPECT_GT(plan.grid_ctas, 0) << what;
      EXPECT_GT(plan.estimate.total_us, 0) << what;
      EXPECT_FALSE(explain(c.spec, plan).empty()) << what;
      EXPECT_FALSE(emit(c.spec, plan).source.empty()) << what;
    });
  }
  // Both ends are reached: most random cases plan, and a good share is refused by name.
  const int n = static_cast<int>(cases.size());
  EXPECT_GT(o.planned, n / 4) << o.refused << " refused of " << n;
  EXPECT_GT(o.refused, n / 20) << o.planned << " planned of " << n;
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

// B2B examples (FFN, gated FFN, attention, causal and batched): head dims from 8 to 320, N1 from
// one chunk to many, the batch; the B2B options forced now and then, valid or not.
struct B2bCase {
  std::string example;
  FusionSpec first, second;
  B2bProblem problem;
  PlanOptions opt;
  std::string what;
  bool must_plan;
};

std::vector<B2bCase> b2b_cases(int per_example) {
  std::vector<B2bCase> cases;
  for (const char* ex : {"ffn.cf", "ffn_swiglu.cf", "attention.cf", "attention_causal.cf", "attention_batched.cf",
                         "attention_batched_causal.cf"}) {
    // As written (bf16), and with every bf16 tensor f16.
    std::string text = read_text((kRoot / "examples" / ex).string()), f16 = text;
    for (size_t at; (at = f16.find("bf16")) != std::string::npos;) f16.replace(at, 4, "f16");
    const LoweringResult lowered[2] = {lower(parse_graph(text)), lower(parse_graph(f16))};
    const B2BCandidate* pair[2] = {one_b2b_kernel(lowered[0]), one_b2b_kernel(lowered[1])};
    if (!pair[0] || !pair[1]) throw Error(fmt::format("{}: no B2B pair", ex));
    Rng rng(std::hash<std::string>{}(ex) + 1);
    for (int i = 0; i < per_example; ++i) {
      const int half = rng.coin(0.3) ? 1 : 0;
      const LoweringResult& r = lowered[half];
      B2bCase c{ex, r.regions.at(static_cast<size_t>(pair[half]->first_region)).spec,
                r.regions.at(static_cast<size_t>(pair[half]->second_region)).spec, {}, {}, {}, false};
      const FusionSpec& first = c.first;
      B2bProblem& p = c.problem;
      p.ab_dtype = half ? DType::F16 : DType::BF16;
      p.batches = first.batched() ? rng.pick<int64_t>({1, 3, 64}) : 1;
      p.m = rng.pick<int64_t>({1, 40, 64, 300, 1000, 4100});
      p.k = rng.coin(0.05) ? 100 : rng.pick<int64_t>({8, 64, 72, 128, 192, 256, 320, 1024});
      p.n1 = rng.coin(0.05) ? 1001 : rng.pick<int64_t>({8, 40, 128, 520, 1032, 4096});
      p.n2 = rng.coin(0.05) ? 1001 : rng.pick<int64_t>({8, 64, 128, 136, 256, 1024});
      PlanOptions& opt = c.opt;
      opt.b2b = PlanOptions::B2b::Force;
      opt.cluster_n = rng.maybe<int>({1, 2, 3, 4, 8, 16}, 0.15);
      opt.tile_n = rng.maybe<int>({64, 100, 128, 256}, 0.1);
      opt.ring_stages = rng.maybe<int>({1, 3, 8}, 0.1);
      opt.b2b_job_rows = rng.maybe<int>({32, 64, 128, 256}, 0.2);
      opt.fma_exp_every = rng.maybe<int>({0, 1, 4, 7}, 0.1);
      opt.b2b_overlap = rng.maybe<bool>({false, true}, 0.2);
      opt.b2b_x_resident = rng.maybe<bool>({false, true}, 0.15);
      opt.b2b_x_buffers = rng.maybe<int>({0, 1, 2, 3}, 0.2);
      opt.b2b_chain_jobs = rng.maybe<bool>({false, true}, 0.2);
      c.what = fmt::format("{}{} B={} M={} K={} N1={} N2={}{}", ex, half ? " (f16)" : "", p.batches, p.m, p.k, p.n1,
                           p.n2, describe(opt));
      c.must_plan = describe(opt) == " (defaults)" && p.k % 8 == 0 && p.n1 % 8 == 0 && p.n2 % 8 == 0;
      cases.push_back(std::move(c));
    }
  }
  return cases;
}

TEST(PlanProperty, B2bPlansOrRefusesByName) {
  const DeviceModel dev;
  Outcome o;
  const std::vector<B2bCase> cases = b2b_cases(300);
  for (const B2bCase& c : cases) {
    const std::string& what = c.what;
    expect_plan_or_error(what, c.must_plan, o, [&] {
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
  const int n = static_cast<int>(cases.size());
  EXPECT_GT(o.planned, n / 4) << o.refused << " refused of " << n;
  EXPECT_GT(o.refused, n / 20) << o.planned << " planned of " << n;
}

TEST(PlanProperty, ForcedB2bPlansCompile) {
  compile_first_forced_plan_of_each_example(
      b2b_cases(300), [](const B2bCase& c) { (void)make_b2b_plan(c.first, c.second, c.problem, c.opt); },
      [](const B2bCase& c, const CompileOptions& o) { return compile_only_b2b(c.first, c.second, c.problem, o); });
}

}  // namespace
}  // namespace comfuse
