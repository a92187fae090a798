// Property tests of the planners: for hundreds of random shapes and random forced options (valid
// and not), over every example graph, planning either yields a kernel that check() accepts, fits
// SMEM, has a grid and renders, or throws comfuse::Error with a message. Never another exception,
// never a crash: bad input gets a clear error at the planner, not at the JIT.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "comfuse/emit.h"
#include "comfuse/error.h"
#include "comfuse/lower.h"
#include "comfuse/plan.h"
#include "comfuse/scheduler/grid.cuh"
#include "comfuse/text.h"
#include "plan/calibration.h"

namespace comfuse {
namespace {

const std::filesystem::path kRoot = COMFUSE_SOURCE_DIR;

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

// Single-GEMM examples: shapes from decode to vocabulary rows, ragged and misaligned ones among
// them; each option forced now and then, from values the kernel takes and values it does not.
TEST(PlanProperty, SingleGemmPlansOrRefusesByName) {
  const DeviceModel dev;
  Outcome o;
  int cases = 0;
  for (const char* ex : {"gemm_bias_gelu.cf", "gemm_layernorm.cf", "gemm_rmsnorm.cf", "gemm_softmax.cf",
                         "gemm_log_softmax.cf", "gemm_chain.cf", "gemm_gelu_new.cf", "gemm_residual_layernorm.cf",
                         "gemm_residual_rmsnorm.cf"}) {
    const LoweringResult r = lower(parse_graph_file((kRoot / "examples" / ex).string()));
    ASSERT_FALSE(r.regions.empty()) << ex;
    const FusionSpec& spec = r.regions.front().spec;
    Rng rng(std::hash<std::string>{}(ex));
    for (int i = 0; i < 300; ++i, ++cases) {
      const Problem p{rng.pick<int64_t>({1, 7, 16, 64, 200, 256, 1000, 4100, 8192}),
                      rng.coin(0.05) ? 1001 : rng.pick<int64_t>({8, 64, 1000, 2048, 4096, 8200, 32768}),
                      rng.coin(0.05) ? 100 : rng.pick<int64_t>({8, 64, 72, 1024, 4096, 14336}), DType::BF16};
      PlanOptions opt;
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
      const std::string what = fmt::format("{} M={} N={} K={}{}", ex, p.m, p.n, p.k, describe(opt));
      const bool defaults = describe(opt) == " (defaults)", aligned = p.n % 8 == 0 && p.k % 8 == 0;
      expect_plan_or_error(what, defaults && aligned, o, [&] {
        const Plan plan = make_plan(spec, p, opt);
        EXPECT_EQ(check(plan.kernel), nullptr) << what << ": " << check(plan.kernel);
        EXPECT_LE(plan.smem.total(), dev.smem_per_cta_bytes) << what;
        EXPECT_GT(plan.grid_ctas, 0) << what;
        EXPECT_GT(plan.estimate.total_us, 0) << what;
        EXPECT_FALSE(explain(spec, plan).empty()) << what;
        EXPECT_FALSE(emit(spec, plan).source.empty()) << what;
      });
    }
  }
  // Both ends are reached: most random cases plan, and a good share is refused by name.
  EXPECT_GT(o.planned, cases / 4) << o.refused << " refused of " << cases;
  EXPECT_GT(o.refused, cases / 20) << o.planned << " planned of " << cases;
}

// B2B examples (FFN, gated FFN, attention, causal and batched): head dims from 8 to 320, N1 from
// one chunk to many, the batch; the B2B options forced now and then, valid or not.
TEST(PlanProperty, B2bPlansOrRefusesByName) {
  const DeviceModel dev;
  Outcome o;
  int cases = 0;
  for (const char* ex : {"ffn.cf", "ffn_swiglu.cf", "attention.cf", "attention_causal.cf", "attention_batched.cf",
                         "attention_batched_causal.cf"}) {
    Graph g = parse_graph_file((kRoot / "examples" / ex).string());
    const LoweringResult r = lower(g);
    const B2BCandidate* b = one_b2b_kernel(r);
    ASSERT_NE(b, nullptr) << ex;
    const FusionSpec& first = r.regions.at(static_cast<size_t>(b->first_region)).spec;
    const FusionSpec& second = r.regions.at(static_cast<size_t>(b->second_region)).spec;
    const bool batched = first.batched();
    Rng rng(std::hash<std::string>{}(ex) + 1);
    for (int i = 0; i < 300; ++i, ++cases) {
      B2bProblem p;
      p.batches = batched ? rng.pick<int64_t>({1, 3, 64}) : 1;
      p.m = rng.pick<int64_t>({1, 40, 64, 300, 1000, 4100});
      p.k = rng.coin(0.05) ? 100 : rng.pick<int64_t>({8, 64, 72, 128, 192, 256, 320, 1024});
      p.n1 = rng.coin(0.05) ? 1001 : rng.pick<int64_t>({8, 40, 128, 520, 1032, 4096});
      p.n2 = rng.coin(0.05) ? 1001 : rng.pick<int64_t>({8, 64, 128, 136, 256, 1024});
      PlanOptions opt;
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
      const std::string what =
          fmt::format("{} B={} M={} K={} N1={} N2={}{}", ex, p.batches, p.m, p.k, p.n1, p.n2, describe(opt));
      const bool defaults = describe(opt) == " (defaults)",
                 aligned = p.k % 8 == 0 && p.n1 % 8 == 0 && p.n2 % 8 == 0;
      expect_plan_or_error(what, defaults && aligned, o, [&] {
        const B2bPlan plan = make_b2b_plan(first, second, p, opt);
        EXPECT_EQ(check(plan.kernel), nullptr) << what << ": " << check(plan.kernel);
        EXPECT_LE(plan.kernel.smem_bytes(), dev.smem_per_cta_bytes) << what;
        EXPECT_GT(plan.grid_ctas, 0) << what;
        EXPECT_GT(plan.jobs, 0) << what;
        EXPECT_FALSE(explain(first, second, plan).empty()) << what;
        EXPECT_FALSE(emit_b2b(first, second, plan).source.empty()) << what;
        // choose_b2b says the same under Force: the pair as planned.
        const B2bChoice c = choose_b2b(first, second, p, opt);
        EXPECT_TRUE(c.one_kernel) << what;
      });
    }
  }
  EXPECT_GT(o.planned, cases / 4) << o.refused << " refused of " << cases;
  EXPECT_GT(o.refused, cases / 20) << o.planned << " planned of " << cases;
}

}  // namespace
}  // namespace comfuse
