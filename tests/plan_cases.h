#pragma once
// Random planner cases over the examples, shared by the planner's property tests (CPU:
// tests/cpu/test_plan_property.cpp) and their GPU run against the fp64 reference
// (tests/gpu/test_gpu_property.cpp): an example (bf16 as written, or every bf16 tensor f16), a
// shape, and options forced now and then, from values the kernel takes and values it does not.
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "comfuse/error.h"
#include "comfuse/lower.h"
#include "comfuse/plan.h"
#include "comfuse/text.h"

namespace comfuse::plan_cases {

inline const std::filesystem::path kRoot = COMFUSE_SOURCE_DIR;

inline std::string read_text(const std::string& path) {
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

inline std::string describe(const PlanOptions& o) {
  std::string s;
  auto add = [&](const char* name, const auto& v) {
    if (v) s += fmt::format(" {}={}", name, *v);
  };
  add("cluster_n", o.cluster_n), add("tile_n", o.tile_n), add("tile_m", o.tile_m);
  add("cluster_m", o.cluster_m), add("row_group", o.row_group), add("k_splits", o.k_splits);
  add("stash_bytes", o.stash_bytes), add("fuse_pairs", o.fuse_pairs), add("ring_stages", o.ring_stages);
  add("splits_in_cluster", o.splits_in_cluster);
  if (o.aggregation) s += fmt::format(" aggregation={}", static_cast<int>(*o.aggregation));
  if (o.strategy) s += fmt::format(" strategy={}", static_cast<int>(*o.strategy));
  add("b2b_job_rows", o.b2b_job_rows), add("fma_exp_every", o.fma_exp_every), add("b2b_overlap", o.b2b_overlap);
  add("b2b_x_resident", o.b2b_x_resident), add("b2b_x_buffers", o.b2b_x_buffers);
  add("b2b_chain_jobs", o.b2b_chain_jobs), add("b2b_decode", o.b2b_decode);
  return s.empty() ? " (defaults)" : s;
}

// A random case: an example's spec, a shape and forced options, and how a failure names it.
struct SingleCase {
  std::string example;
  std::string text;  // the graph
  FusionSpec spec;   // its one region
  Problem problem;
  PlanOptions opt;
  std::string what;
  bool must_plan;  // the planner's own choices at a size TMA takes
};

inline const std::vector<std::string> kSingleGemmExamples = {
    "gemm_bias_gelu.cf", "gemm_layernorm.cf",   "gemm_rmsnorm.cf",           "gemm_softmax.cf",          "gemm_log_softmax.cf",
    "gemm_chain.cf",     "gemm_gelu_new.cf",    "gemm_residual_layernorm.cf", "gemm_residual_rmsnorm.cf"};

// The shapes a generator draws from (a misaligned N or K now and then besides).
struct Shapes {
  std::vector<int64_t> m, n, k;
};
// From decode to vocabulary rows (the planner's tests).
inline const Shapes kPlannerShapes{{1, 7, 16, 64, 200, 256, 1000, 4100, 8192},
                                   {8, 64, 1000, 2048, 4096, 8200, 32768},
                                   {8, 64, 72, 1024, 4096, 14336}};

// Single-GEMM examples, `per_example` cases each; each option forced now and then.
inline std::vector<SingleCase> single_cases(int per_example, const Shapes& shapes = kPlannerShapes) {
  std::vector<SingleCase> cases;
  for (const std::string& ex : kSingleGemmExamples) {
    // The example as written (bf16), and with every bf16 tensor f16.
    std::string text = read_text((kRoot / "examples" / ex).string()), f16 = text;
    for (size_t at; (at = f16.find("bf16")) != std::string::npos;) f16.replace(at, 4, "f16");
    const LoweringResult bf = lower(parse_graph(text)), hf = lower(parse_graph(f16));
    if (bf.regions.empty() || hf.regions.empty()) throw Error(fmt::format("{}: no region", ex));
    Rng rng(std::hash<std::string>{}(ex));
    // Options added after the first cases were drawn come from a stream of their own, so the
    // earlier options' draws (and the GPU property test's cases) stay what they were.
    Rng later(std::hash<std::string>{}(ex) ^ 0x5eed);
    for (int i = 0; i < per_example; ++i) {
      const bool half = rng.coin(0.3);
      SingleCase c{ex, half ? f16 : text, (half ? hf : bf).regions.front().spec, {}, {}, {}, false};
      c.problem = Problem{rng.pick(shapes.m), rng.coin(0.05) ? 1001 : rng.pick(shapes.n),
                          rng.coin(0.05) ? 100 : rng.pick(shapes.k), half ? DType::F16 : DType::BF16};
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
      opt.splits_in_cluster = later.maybe<bool>({false, true}, 0.15);
      const Problem& p = c.problem;
      c.what = fmt::format("{}{} M={} N={} K={}{}", ex, half ? " (f16)" : "", p.m, p.n, p.k, describe(opt));
      c.must_plan = describe(opt) == " (defaults)" && p.n % 8 == 0 && p.k % 8 == 0;
      cases.push_back(std::move(c));
    }
  }
  return cases;
}

// B2B examples (FFN, gated FFN, attention, causal and batched): head dims from 8 to 1024, N1 from
// one chunk to many, the batch; the B2B options forced now and then, valid or not.
inline const std::vector<std::string> kB2bExamples = {"ffn.cf",           "ffn_swiglu.cf",        "attention.cf",
                                                      "attention_causal.cf", "attention_batched.cf",
                                                      "attention_batched_causal.cf"};
// The example's dim bindings for a problem (FFN: X [M, K], W1 [N, K], W2 [D, N]; attention:
// Q [(B,) M, K], K [(B,) N, K], V [(B,) N, DV]).
inline Bindings b2b_bindings(const std::string& example, const B2bProblem& p) {
  Bindings d{{"M", p.m}, {"K", p.k}, {"N", p.n1}};
  if (example.rfind("ffn", 0) == 0) d["D"] = p.n2;
  else d["DV"] = p.n2;
  if (example.find("batched") != std::string::npos) d["B"] = p.batches;
  return d;
}

struct B2bCase {
  std::string example;
  std::string text;  // the graph
  FusionSpec first, second;
  B2bProblem problem;
  PlanOptions opt;
  std::string what;
  bool must_plan;
};

// Shapes a B2B generator draws from.
struct B2bShapes {
  std::vector<int64_t> batches, m, k, n1, n2;
};
inline const B2bShapes kB2bPlannerShapes{{1, 3, 64}, {1, 40, 64, 300, 1000, 4100}, {8, 64, 72, 128, 192, 256, 320, 1024},
                                         {8, 40, 128, 520, 1032, 4096}, {8, 64, 128, 136, 256, 1024}};

inline std::vector<B2bCase> b2b_cases(int per_example, const B2bShapes& shapes = kB2bPlannerShapes) {
  std::vector<B2bCase> cases;
  for (const std::string& ex : kB2bExamples) {
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
      B2bCase c{ex, half ? f16 : text, r.regions.at(static_cast<size_t>(pair[half]->first_region)).spec,
                r.regions.at(static_cast<size_t>(pair[half]->second_region)).spec, {}, {}, {}, false};
      const FusionSpec& first = c.first;
      B2bProblem& p = c.problem;
      p.ab_dtype = half ? DType::F16 : DType::BF16;
      p.batches = first.batched() ? rng.pick(shapes.batches) : 1;
      p.m = rng.pick(shapes.m);
      p.k = rng.coin(0.05) ? 100 : rng.pick(shapes.k);
      p.n1 = rng.coin(0.05) ? 1001 : rng.pick(shapes.n1);
      p.n2 = rng.coin(0.05) ? 1001 : rng.pick(shapes.n2);
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
      opt.b2b_decode = rng.maybe<bool>({false, true}, 0.15);
      c.what = fmt::format("{}{} B={} M={} K={} N1={} N2={}{}", ex, half ? " (f16)" : "", p.batches, p.m, p.k, p.n1,
                           p.n2, describe(opt));
      c.must_plan = describe(opt) == " (defaults)" && p.k % 8 == 0 && p.n1 % 8 == 0 && p.n2 % 8 == 0;
      cases.push_back(std::move(c));
    }
  }
  return cases;
}

// The dim bindings a case's graph runs with.
inline Bindings bindings_of(const SingleCase& c) { return {{"M", c.problem.m}, {"N", c.problem.n}, {"K", c.problem.k}}; }
inline Bindings bindings_of(const B2bCase& c) { return b2b_bindings(c.example, c.problem); }

// Of each example, the first `per_example` cases that `plan` accepts (it throws Error to refuse):
// what tests/gpu/test_gpu_property.cpp runs on the GPU. The CPU test checks the selection
// (every example, each case planned), so the GPU run cannot find it short.
template <class Case, class Plan>
std::vector<Case> first_planned(std::vector<Case> cases, int per_example, Plan&& plan) {
  std::map<std::string, int> taken;
  std::vector<Case> out;
  for (Case& c : cases) {
    if (taken[c.example] == per_example) continue;
    try {
      plan(c);
    } catch (const Error&) {
      continue;  // refused by name: the CPU test covers the refusals
    }
    ++taken[c.example];
    out.push_back(std::move(c));
  }
  return out;
}

// At shapes the fp64 reference executes in well under a second.
inline std::vector<SingleCase> gpu_cases(int per_example = 3) {
  const Shapes small{{1, 7, 16, 64, 200, 256, 1000}, {8, 64, 136, 1000, 2048}, {8, 64, 72, 1024}};
  return first_planned(single_cases(200, small), per_example,
                       [](const SingleCase& c) { (void)make_plan(c.spec, c.problem, c.opt); });
}
inline std::vector<B2bCase> gpu_b2b_cases(int per_example = 2) {
  const B2bShapes small{{1, 3}, {1, 40, 64, 300}, {8, 64, 72, 128, 192, 256}, {8, 40, 128, 520}, {8, 64, 128, 136, 256}};
  return first_planned(b2b_cases(200, small), per_example,
                       [](const B2bCase& c) { (void)make_b2b_plan(c.first, c.second, c.problem, c.opt); });
}

}  // namespace comfuse::plan_cases
