// Property tests of Φ: for hundreds of random GEMM-epilogue graphs (their reductions over whole
// rows, or all over runs of one segment of columns: per-head norms), lower() yields one region
// and executing its Fusion Spec (run_lowered -> run_spec) equals executing the graph (run_graph),
// both in fp64. Plus closure tests on graphs Φ must split.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "comfuse/interp.h"
#include "comfuse/lower.h"
#include "comfuse/text.h"

namespace comfuse {
namespace {

// One unit in the last place of `x` in storage type `t`.
double ulp(DType t, double x) {
  const int mant = t == DType::BF16 ? 7 : t == DType::F16 ? 10 : 23;
  const int emin = t == DType::BF16 ? -126 : t == DType::F16 ? -14 : -126;
  if (!std::isfinite(x) || x == 0) return std::ldexp(1.0, emin - mant);
  return std::ldexp(1.0, std::max(std::ilogb(x), emin) - mant);
}

std::string graph_text(const Graph& g) {
  try {
    return print_graph(g);
  } catch (const std::exception& e) {
    return std::string("(print_graph failed: ") + e.what() + ")";
  }
}

// --- the random epilogue generator ---------------------------------------------------------

class EpilogueGen {
 public:
  struct Live {
    Value v;
    bool col;  // one value a row ([M, 1]; or a segment's statistic, one a row of each segment)
    bool pos;  // known >= ~0.5: safe for log / rsqrt / sqrt / reciprocal / division
  };

  // `segments`: every reduction over runs of seg_ columns (Node::segment), N a whole number of
  // them, row vectors of seg_ elements and [M, seg_] tiles read periodically against segmented
  // values, rotate_half and rotate_pairs within the runs (seg_ even); no per-segment statistic is an output (Φ keeps none in a kernel: a graph with one would not be one region).
  explicit EpilogueGen(uint64_t seed, bool segments = false) : rng_(seed) {
    M_ = concrete_or_sym("M", between(1, 70));
    if (segments) seg_ = between(2, 9);
    N_ = segments ? concrete_or_sym("N", seg_ * between(1, 6))
         : coin(0.1) ? M_
                     : concrete_or_sym("N", between(1, 600));  // now and then square: N is M
    const Dim K = concrete_or_sym("K", between(1, 40));
    const BLayout layout = coin(0.5) ? BLayout::NK : BLayout::KN;
    Value x = g_.input("x", dtype(), {M_, K});
    Value w = g_.input("w", dtype(), layout == BLayout::NK ? Shape{N_, K} : Shape{K, N_});
    live_.push_back({g_.matmul(x, w, layout), false, false});
    const int ops = between(3, 25);
    for (int i = 0; i < ops; ++i) step();
    // 1-3 outputs: the last value and random others, distinct nodes.
    const int outs = between(1, 3);
    std::vector<int> used;
    for (int i = 0; i < outs; ++i) {
      const Live& l = i == 0 ? live_.back() : live_[pick(live_.size())];
      if (seg_ && l.col) continue;
      if (std::find(used.begin(), used.end(), l.v.id) != used.end()) continue;
      used.push_back(l.v.id);
      g_.output(l.v, "out" + std::to_string(i), dtype());
      if (coin(0.1)) g_.output(l.v, "again" + std::to_string(i), dtype());  // one node, two outputs
    }
    if (used.empty()) {  // every pick a segment's statistic: the latest value that is not one
      auto it = std::find_if(live_.rbegin(), live_.rend(), [](const Live& l) { return !l.col; });
      g_.output(it->v, "out", dtype());
    }
  }

  Graph& graph() { return g_; }
  const Bindings& dims() const { return dims_; }

 private:
  int between(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool coin(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  size_t pick(size_t n) { return static_cast<size_t>(between(0, static_cast<int>(n) - 1)); }
  template <class T>
  T one_of(std::initializer_list<T> xs) { return *(xs.begin() + pick(xs.size())); }
  DType dtype() { return one_of({DType::BF16, DType::F16, DType::F32}); }

  Dim concrete_or_sym(const std::string& sym, int value) {
    if (value >= 2 && coin(0.2)) return Dim::of(value);  // a concrete extent now and then
    dims_[sym] = value;
    return Dim::of(sym);
  }

  // Recent values are likelier operands, so chains (and deep nests) form.
  Live& operand() { return coin(0.45) ? live_.back() : live_[pick(live_.size())]; }
  Live& tile_operand() {
    for (int tries = 0; tries < 4; ++tries) {
      Live& l = operand();
      if (!l.col) return l;
    }
    return live_.front();  // acc
  }
  Value push(Value v, bool col, bool pos = false) {
    live_.push_back({v, col, pos});
    return v;
  }

  std::string fresh(const char* stem) { return stem + std::to_string(inputs_++); }
  // A row vector against `against`: of one segment (periodic) where that value is segmented.
  Value row(Value against = Value{}) {
    if (seg_ && against.id >= 0 && against.node().segment && coin(0.6))
      return coin(0.7) ? g_.input(fresh("vec"), dtype(), {Dim::of(seg_)})
                       : g_.input(fresh("per"), dtype(), {M_, Dim::of(seg_)});  // rotary's cos and sin
    return g_.input(fresh("row"), dtype(), coin(0.8) ? Shape{N_} : Shape{Dim::of(1), N_});
  }
  Value reduce(ReduceOp op, Value x) { return g_.reduce(op, x, -1, seg_); }
  Value col() { return g_.input(fresh("col"), dtype(), {M_, Dim::of(1)}); }
  Value scalar(bool rank0 = false) {
    if (rank0 || coin(0.7)) return g_.input(fresh("s"), DType::F32, {});
    return g_.input(fresh("s"), DType::F32, coin(0.5) ? Shape{Dim::of(1)} : Shape{Dim::of(1), Dim::of(1)});
  }
  Value literal() { return g_.constant(one_of({0.5, -1.25, 2.0, 3.0, -0.75, 1e-3, 7.5})); }
  // A value >= 0.5 made from `l`: square(v) + c, with c a literal or a runtime scalar.
  Value positive(const Live& l) {
    if (l.pos) return l.v;
    Value sq = g_.unary(UnaryOp::Square, l.v);
    return coin(0.7) ? g_.binary(BinaryOp::Add, sq, one_of({0.5, 1.0, 2.0})) : sq + scalar();
  }

  void step() {
    if (seg_ % 2 == 0 && seg_ && coin(0.08)) {  // a rotation within the runs, of a tile or a statistic
      Live l = operand();
      push(coin(0.5) ? g_.rotate_half(l.v, seg_) : g_.rotate_pairs(l.v, seg_), false);
      return;
    }
    const int kind = between(0, 99);
    if (kind < 22) {  // elementwise unary, any domain-safe op
      Live l = operand();
      const UnaryOp op = one_of({UnaryOp::Relu, UnaryOp::GeluErf, UnaryOp::GeluTanh, UnaryOp::Silu, UnaryOp::Sigmoid,
                                 UnaryOp::Tanh, UnaryOp::Exp, UnaryOp::Square, UnaryOp::Abs, UnaryOp::Neg});
      push(g_.unary(op, l.v), l.col, false);
    } else if (kind < 32) {  // domain-guarded unary
      Live l = operand();
      const UnaryOp op = one_of({UnaryOp::Log, UnaryOp::Rsqrt, UnaryOp::Sqrt, UnaryOp::Reciprocal});
      push(g_.unary(op, positive(l)), l.col, op == UnaryOp::Sqrt);
    } else if (kind < 50) {  // binary between live values
      Live a = operand(), b = operand();
      const BinaryOp op = one_of({BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Max, BinaryOp::Min, BinaryOp::Div});
      Value rhs = op == BinaryOp::Div ? positive(b) : b.v;
      const bool pos = (op == BinaryOp::Add || op == BinaryOp::Max) && a.pos && b.pos;
      push(g_.binary(op, a.v, rhs), a.col && b.col, pos);
    } else if (kind < 66) {  // binary with a leaf: row, column, runtime scalar or literal
      Live l = operand();
      const int leaf_kind = between(0, 3);
      Value leaf = leaf_kind == 0 ? row(l.v) : leaf_kind == 1 ? col() : leaf_kind == 2 ? scalar() : literal();
      const BinaryOp op = one_of({BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Max, BinaryOp::Min, BinaryOp::Div});
      const bool col_result = l.col && leaf_kind != 0;
      if (coin(0.5) || op == BinaryOp::Div) {
        push(g_.binary(op, l.v, leaf), col_result);  // leaves are never near 0
      } else {
        push(g_.binary(op, leaf, l.v), col_result);
      }
    } else if (kind < 70) {  // pow with a scalar exponent
      Live l = operand();
      Value e = coin(0.7) ? g_.constant(one_of({2.0, 3.0, 0.5, -0.5, 1.5, -1.0})) : scalar(true);
      push(g_.binary(BinaryOp::Pow, positive(l), e), l.col);
    } else if (kind < 76) {  // cast
      Live l = operand();
      push(g_.cast(l.v, dtype()), l.col, false);
    } else if (kind < 92) {  // a reduction, whose statistic is used right away most of the time
      Live x = tile_operand();
      const ReduceOp op = one_of({ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min});
      Value stat = push(reduce(op, x.v), true, x.pos && op != ReduceOp::Sum);
      if (coin(0.7)) {
        const BinaryOp use = one_of({BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Add, BinaryOp::Div});
        Value rhs = use == BinaryOp::Div ? positive(live_.back()) : stat;
        push(g_.binary(use, x.v, rhs), false);
      }
    } else {  // composites
      Live x = tile_operand();
      // The norms' gamma and beta: whole rows (of N), or one segment's where the norm is per segment.
      auto norm_vec = [&] { return seg_ ? g_.input(fresh("vec"), dtype(), {Dim::of(seg_)}) : row(); };
      switch (between(0, 4)) {
        case 0: push(g_.layer_norm(x.v, coin(0.5) ? norm_vec() : Value{}, coin(0.5) ? norm_vec() : Value{}, 1e-5, seg_), false); break;
        case 1: push(g_.rms_norm(x.v, coin(0.5) ? norm_vec() : Value{}, 1e-6, seg_), false); break;
        case 2: case 3: {  // softmax or log-softmax, written out over the run
          Value shifted = x.v - reduce(ReduceOp::Max, x.v);
          Value sum = reduce(ReduceOp::Sum, g_.unary(UnaryOp::Exp, shifted));
          push(coin(0.5) ? g_.unary(UnaryOp::Exp, shifted) / sum : shifted - g_.unary(UnaryOp::Log, sum), false);
          break;
        }
        default: push(x.v * g_.unary(UnaryOp::Rsqrt, g_.binary(BinaryOp::Max, reduce(ReduceOp::Sum, g_.unary(UnaryOp::Square, x.v)), 1e-24)), false); break;
      }
    }
  }

  std::mt19937_64 rng_;
  Graph g_;
  Bindings dims_;
  Dim M_, N_;
  int64_t seg_ = 0;  // the segment every reduction spans (0: whole rows)
  std::vector<Live> live_;
  int inputs_ = 0;
};

// Every value finite and of moderate size: the graphs test Φ, not fp64 overflow.
bool well_behaved(const Graph& g, const Bindings& dims, const TensorMap& in) {
  for (const Tensor& t : run_graph_all(g, dims, in))
    for (double v : t.data)
      if (!std::isfinite(v) || std::fabs(v) > 1e6) return false;
  return true;
}

struct Tally {
  int graphs = 0, rejected = 0, failures = 0;
  int64_t elements = 0, exact = 0, ill_conditioned = 0, ulp_flips = 0;
  int reductions = 0, max_stages = 0, bypasses = 0;
  int rotate_hazards = 0, rotates = 0;  // graphs regenerated for a rotate_half Φ leaves out; rotations fused
};

int count_rotates(const Spec& s) {
  int n = 0;
  for (const SpecNode& node : s.nodes)
    n += node.category == NodeCategory::Compute &&
         (node.compute == ComputeKind::RotateHalf || node.compute == ComputeKind::RotatePairs);
  for (const Spec& c : s.children) n += count_rotates(c);
  return n;
}

int count_bypasses(const Spec& s) {
  int n = 0;
  for (const SpecNode& node : s.nodes) n += node.category == NodeCategory::Placeholder && node.placeholder == PlaceholderKind::Bypass;
  for (const Spec& c : s.children) n += count_bypasses(c);
  return n;
}

// Compares run_lowered with run_graph element by element. An element passes when it is
// equal up to fp64 reassociation (1e-9 relative, 1e-12 absolute), or when the kernel's own
// association order visibly matters for it (two tilings of run_spec disagree: an
// ill-conditioned value such as a sum of centered values), or, rarely, when a rounding to
// a storage dtype landed on the other side of a boundary (one ulp of the output dtype).
std::string check_outputs(const Graph& g, const TensorMap& got, const TensorMap& alt, const TensorMap& ref, Tally& t) {
  for (const GraphOutput& o : g.outputs()) {
    auto it = got.find(o.name);
    if (it == got.end()) return "output '" + o.name + "' missing";
    const Tensor &a = it->second, &b = ref.at(o.name), &c = alt.at(o.name);
    if (a.shape != b.shape) return "output '" + o.name + "' has the wrong shape";
    for (size_t i = 0; i < b.data.size(); ++i) {
      ++t.elements;
      const double av = a.data[i], bv = b.data[i];
      if (!std::isfinite(av) || !std::isfinite(bv)) {
        if ((std::isnan(av) && std::isnan(bv)) || av == bv) { ++t.exact; continue; }
        return "output '" + o.name + "' [" + std::to_string(i) + "]: " + std::to_string(av) + " vs " + std::to_string(bv);
      }
      const double d = std::fabs(av - bv), tol = 1e-9 * std::fabs(bv) + 1e-12;
      if (d <= tol) { ++t.exact; continue; }
      const double spread = std::fabs(c.data[i] - av);
      if (spread > 1e-9 * std::fabs(bv) && d <= 100 * spread + tol) { ++t.ill_conditioned; continue; }
      if (d <= ulp(o.dtype, bv) * 1.000001) { ++t.ulp_flips; continue; }
      char buf[256];
      std::snprintf(buf, sizeof buf, "output '%s' [%zu] (row %lld): spec %.17g vs graph %.17g (tiling spread %.3g)",
                    o.name.c_str(), i, static_cast<long long>(static_cast<int64_t>(i) / b.cols()), av, bv, spread);
      return buf;
    }
  }
  return "";
}

// `segments`: the generator's per-segment mode (EpilogueGen).
void random_epilogues_lower_to_one_equivalent_region(bool segments) {
  // COMFUSE_PROPERTY_GRAPHS=N runs a longer sweep (CI runs 300).
  const char* env = std::getenv("COMFUSE_PROPERTY_GRAPHS");
  const int kGraphs = env ? std::max(1, std::atoi(env)) : 300;
  Tally t;
  ReduceTiling odd;  // another association order, to tell ill-conditioning from a bug
  odd.tile_n = 7;
  odd.lanes = 1;
  for (uint64_t seed = 1; seed <= static_cast<uint64_t>(kGraphs); ++seed) {
    // Regenerate (new sub-seed) until the graph's values stay finite and moderate.
    for (uint64_t attempt = 0;; ++attempt) {
      const uint64_t sub = seed * 1000 + attempt;
      EpilogueGen gen(sub, segments);
      Graph& g = gen.graph();
      std::mt19937_64 rng(sub);
      TensorMap in = random_inputs(g, gen.dims(), rng);
      if (!well_behaved(g, gen.dims(), in)) {
        ++t.rejected;
        ASSERT_LT(attempt, 50u) << "seed " << seed << ": cannot find a well-behaved graph";
        continue;
      }
      ++t.graphs;
      const std::string where = "seed " + std::to_string(seed) + " (sub-seed " + std::to_string(sub) + ")\n";
      LoweringResult lr = lower(g);
      // A rotate_half whose stage writes another tile value back into the registers it reads
      // leaves the region (lower.cpp evict_rotate_hazards): not one region, by design.
      if (!lr.fallbacks.empty() && describe(g, lr).find("reads its partner columns") != std::string::npos) {
        --t.graphs;
        ++t.rotate_hazards;
        ASSERT_LT(attempt, 50u) << "seed " << seed << ": cannot find a graph without a rotate_half hazard";
        continue;
      }
      const bool one_region = lr.regions.size() == 1 && lr.fallbacks.empty();
      EXPECT_TRUE(one_region) << where << describe(g, lr) << graph_text(g);
      if (!one_region) { ++t.failures; break; }
      const FusionSpec& fs = lr.regions[0].spec;
      EXPECT_NO_THROW(verify(fs)) << where << print(fs);
      if (segments && fs.reduction_count() > 0) {
        EXPECT_GT(fs.segment, 0) << where << print(fs);
      }
      try {
        EXPECT_TRUE(parse_spec(print(fs)) == fs) << where << print(fs);  // the text form round-trips
      } catch (const std::exception& e) {
        ADD_FAILURE() << where << "spec text does not parse back: " << e.what() << "\n" << print(fs);
      }
      t.reductions += fs.reduction_count();
      t.max_stages = std::max(t.max_stages, fs.stage_count());
      t.bypasses += count_bypasses(fs.root);
      t.rotates += count_rotates(fs.root);
      std::string failure;
      try {
        TensorMap ref = run_graph(g, gen.dims(), in);
        TensorMap got = run_lowered(g, lr, gen.dims(), in);
        TensorMap alt = run_lowered(g, lr, gen.dims(), in, odd);
        failure = check_outputs(g, got, alt, ref, t);
      } catch (const std::exception& e) {
        failure = std::string("threw: ") + e.what();
      }
      EXPECT_EQ(failure, "") << where << graph_text(g) << print(fs);
      if (!failure.empty()) ++t.failures;
      break;
    }
  }
  std::printf("random graphs: %d (rejected %d as ill-behaved, %d for a rotate_half left out); elements %lld: exact "
              "%lld, ill-conditioned %lld, one-ulp flips %lld; reductions %d, deepest chain %d stages, bypasses %d, "
              "rotations %d; failures %d\n",
              t.graphs, t.rejected, t.rotate_hazards, static_cast<long long>(t.elements), static_cast<long long>(t.exact),
              static_cast<long long>(t.ill_conditioned), static_cast<long long>(t.ulp_flips), t.reductions,
              t.max_stages, t.bypasses, t.rotates, t.failures);
  EXPECT_EQ(t.graphs, kGraphs);
  EXPECT_GE(t.max_stages, 4);  // the generator does reach deep nests
  if (segments) {
    EXPECT_GT(t.rotates, kGraphs / 10);  // and rotates runs
  }
  // Ill-conditioned elements and rounding flips are rare; many would hide a real bug.
  EXPECT_LT(t.ill_conditioned + t.ulp_flips, t.elements / 1000 + 10);
}

TEST(LoweringProperty, RandomEpiloguesLowerToOneEquivalentRegion) { random_epilogues_lower_to_one_equivalent_region(false); }

TEST(LoweringProperty, RandomPerSegmentEpiloguesLowerToOneEquivalentRegion) {
  random_epilogues_lower_to_one_equivalent_region(true);
}

// --- closure: graphs Φ must split into several regions and fallbacks -------------------------

// run_lowered against run_graph. Values a region materializes for a consumer outside it
// are stored (f32 unless a cast names the dtype), so `rel` admits that rounding.
void expect_equivalent(const Graph& g, const Bindings& dims, double rel, uint64_t seed = 7) {
  std::mt19937_64 rng(seed);
  TensorMap in = random_inputs(g, dims, rng);
  LoweringResult lr = lower(g);
  TensorMap ref = run_graph(g, dims, in);
  TensorMap got = run_lowered(g, lr, dims, in);
  for (const GraphOutput& o : g.outputs()) {
    const Tensor &a = got.at(o.name), &b = ref.at(o.name);
    ASSERT_EQ(a.shape, b.shape) << o.name;
    for (size_t i = 0; i < b.data.size(); ++i) {
      const double tol = std::max(rel * std::fabs(b.data[i]) + 1e-12, ulp(o.dtype, b.data[i]) * 1.000001);
      ASSERT_LE(std::fabs(a.data[i] - b.data[i]), tol) << o.name << "[" << i << "]\n" << describe(g, lr);
    }
  }
}

const Fallback* fallback_of(const LoweringResult& r, int node) {
  for (const Fallback& f : r.fallbacks)
    if (f.node == node) return &f;
  return nullptr;
}

struct Ffn {
  Graph g;
  Value h, acc2;
  explicit Ffn(bool cast_h) {
    Value x = g.input("x", DType::BF16, {Dim::of("M"), Dim::of("K")});
    Value w1 = g.input("w1", DType::BF16, {Dim::of("F"), Dim::of("K")});
    Value b1 = g.input("b1", DType::BF16, {Dim::of("F")});
    Value w2 = g.input("w2", DType::BF16, {Dim::of("N"), Dim::of("F")});
    h = g.unary(UnaryOp::GeluTanh, g.matmul(x, w1) + b1);
    if (cast_h) h = g.cast(h, DType::BF16);
    acc2 = g.matmul(h, w2);
    g.output(g.layer_norm(acc2, Value{}, Value{}), "y", DType::BF16);
  }
};

TEST(LoweringClosure, FfnIsTwoRegionsAndOneB2BCandidate) {
  for (bool cast_h : {true, false}) {
    Ffn f(cast_h);
    LoweringResult lr = lower(f.g);
    ASSERT_EQ(lr.regions.size(), 2u) << describe(f.g, lr);
    EXPECT_TRUE(lr.fallbacks.empty()) << describe(f.g, lr);
    ASSERT_EQ(lr.b2b_candidates.size(), 1u);
    EXPECT_EQ(lr.b2b_candidates[0].via_node, f.h.id);
    // Region 2 reads h as its A operand; region 1 stores it (exactly when it is a bf16 cast).
    const Bindings d{{"M", 37}, {"K", 24}, {"F", 300}, {"N", 130}};
    expect_equivalent(f.g, d, cast_h ? 1e-9 : 1e-5);
  }
}

TEST(LoweringClosure, TransposeOfEpilogueValueFallsBack) {
  Graph g;
  Value x = g.input("x", DType::BF16, {Dim::of("M"), Dim::of("K")});
  Value w = g.input("w", DType::BF16, {Dim::of("N"), Dim::of("K")});
  Value y = g.cast(g.softmax(g.matmul(x, w) + g.input("b", DType::F32, {Dim::of("N")})), DType::BF16);
  Value t = g.transpose(y);
  g.output(t, "yt", DType::BF16);
  g.output(y, "y", DType::F16);
  LoweringResult lr = lower(g);
  ASSERT_EQ(lr.regions.size(), 1u);
  const Fallback* f = fallback_of(lr, t.id);
  ASSERT_NE(f, nullptr) << describe(g, lr);
  EXPECT_NE(f->reason.find("outside the fusion domain"), std::string::npos) << f->reason;
  expect_equivalent(g, {{"M", 19}, {"K", 8}, {"N", 270}}, 1e-9);
}

TEST(LoweringClosure, DimZeroReductionOfEpilogueValueFallsBack) {
  Graph g;
  Value x = g.input("x", DType::F16, {Dim::of("M"), Dim::of("K")});
  Value w = g.input("w", DType::F16, {Dim::of("K"), Dim::of("N")});
  Value acc = g.matmul(x, w, BLayout::KN);
  Value y = g.unary(UnaryOp::Silu, acc);
  Value colsum = g.reduce(ReduceOp::Sum, y, 0);  // over M: outside the domain
  g.output(colsum, "colsum", DType::F32);
  g.output(g.reduce(ReduceOp::Max, g.l2_normalize(y), -1), "rowmax", DType::F32);
  LoweringResult lr = lower(g);
  ASSERT_EQ(lr.regions.size(), 1u);
  const Fallback* f = fallback_of(lr, colsum.id);
  ASSERT_NE(f, nullptr) << describe(g, lr);
  EXPECT_NE(f->reason.find("not the last"), std::string::npos) << f->reason;
  expect_equivalent(g, {{"M", 45}, {"K", 13}, {"N", 77}}, 1e-6);  // y is materialized in f32
}

TEST(LoweringClosure, RegionsFeedFallbacksAndFallbacksFeedRegions) {
  Graph g;
  Value x = g.input("x", DType::BF16, {Dim::of("M"), Dim::of("K")});
  Value w1 = g.input("w1", DType::BF16, {Dim::of("N"), Dim::of("K")});
  Value w2 = g.input("w2", DType::BF16, {Dim::of("P"), Dim::of("M")});
  Value bias = g.input("bias", DType::F32, {Dim::of("N")});
  // A pre-kernel fallback (bias * 2, no GEMM in it) feeds region 1 as a row vector.
  Value y1 = g.cast(g.unary(UnaryOp::Relu, g.matmul(x, w1) + bias * 2.0), DType::BF16);
  // Region 1's output, transposed by a fallback, is region 2's A operand.
  Value acc2 = g.matmul(g.transpose(y1), w2);  // [N, P]
  g.output(g.softmax(acc2), "p", DType::F32);
  // A node mixing two regions' values falls back, reading both regions' stores (the matmuls read
  // different A operands: on one X they would merge into one gated region).
  Value x3 = g.input("x3", DType::BF16, {Dim::of("M"), Dim::of("K")});
  Value y3 = g.matmul(x3, w1);
  Value mix = g.unary(UnaryOp::Tanh, y3) + y1;
  g.output(mix, "mix", DType::BF16);
  LoweringResult lr = lower(g);
  EXPECT_EQ(lr.regions.size(), 3u) << describe(g, lr);
  EXPECT_GE(lr.fallbacks.size(), 3u) << describe(g, lr);
  for (const Fallback& f : lr.fallbacks) EXPECT_FALSE(f.reason.empty());
  expect_equivalent(g, {{"M", 21}, {"K", 16}, {"N", 90}, {"P", 33}}, 1e-6);
}

TEST(LoweringClosure, MissingStoreIsReportedNotGuessed) {
  // A LoweringResult whose region does not store a value needed outside is rejected.
  Ffn f(true);
  LoweringResult lr = lower(f.g);
  auto& args = lr.regions.at(0).spec.args;
  for (RuntimeArg& a : args)
    if (a.role == ArgRole::Output) a.graph_node = 0;  // pretend it stored something else
  std::mt19937_64 rng(1);
  const Bindings d{{"M", 3}, {"K", 4}, {"F", 5}, {"N", 6}};
  TensorMap in = random_inputs(f.g, d, rng);
  EXPECT_THROW(run_lowered(f.g, lr, d, in), Error);
}

}  // namespace
}  // namespace comfuse
