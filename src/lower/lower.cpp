// Lowering Φ: graph -> Fusion Spec IR (paper, "Φ" and "recursive construction").
//
// Three passes per GEMM root:
//   1. Region growth (the closure of Φ): a node joins the region of matmul `mm` when
//      its op is in the domain (unary, binary, cast, last-dim reduction, the causal mask of
//      the [M, N] tile, whose device node reads each element's row and column), one operand
//      comes from the region, every other operand is a leaf Φ can broadcast (literal
//      -> scalar, rank-0 input -> runtime scalar, [N] -> row vector, [M, 1] -> column
//      vector, [M, N] -> a tile input loaded with the accumulator's tile) and its own shape
//      is a tile [M, N] or a per-row column [M, 1]. Anything
//      else stays outside with the reason recorded.
//   2. Staging: reductions, in topological order, are stage terminals r_0..r_{L-1};
//      r_i's statistic exists from stage i+1. Elementwise nodes are placed as late as
//      their consumers allow (fewer live registers), never before their inputs exist.
//      A value defined in stage s and used in stage t > s is carried through stages
//      s+1..t by Bypass placeholders: computed once, never recomputed.
//   3. Building the spec: stage s+1 is the PostOp (nested spec) of r_s; leaves are
//      re-broadcast in each stage that reads them (a broadcast is a load, not a value
//      worth carrying).
// Before growth, two matmuls sharing A whose values meet in an elementwise node (SwiGLU's
// silu(X W1^T) * (X W3^T)) become one gated region: the second is a gated AccEntry (OperandGate)
// of the first's. Only a B2B kernel's GEMM1 holds two accumulators, so a merged region that does
// not end up the first region of a B2B pair is refused (lower() runs Φ again without that merge
// and keeps the reason).
#include "comfuse/lower.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <set>

namespace comfuse {
namespace {

constexpr int kNoRegion = -1;

// The GEMM output a region's values are shaped against: [M, N], or [B, M, N] when batched.
struct OutFrame {
  Dim m, n;
  const Dim* batch = nullptr;  // a batched GEMM's leading dim
};
OutFrame frame_of(const Node& mm) {
  const size_t r = mm.shape.size();
  return OutFrame{mm.shape[r - 2], mm.shape[r - 1], r == 3 ? &mm.shape[0] : nullptr};
}

// Shape class of a graph shape relative to a GEMM's output [M, N].
std::optional<ValueClass> classify(const Shape& s, const Dim& m, const Dim& n) {
  if (s.empty()) return ValueClass::Scalar;
  if (s.size() == 1) {
    if (s[0] == n) return ValueClass::Row;
    if (s[0].is_one()) return ValueClass::Scalar;
    return std::nullopt;
  }
  if (s.size() == 2) {
    const bool rows = s[0] == m, rows1 = s[0].is_one();
    const bool cols = s[1] == n, cols1 = s[1].is_one();
    if (rows && cols) return ValueClass::Tile;
    if (rows && cols1) return ValueClass::Col;
    if (rows1 && cols) return ValueClass::Row;
    if (rows1 && cols1) return ValueClass::Scalar;
  }
  return std::nullopt;
}

// A batched GEMM's output [B, M, N]: per-batch values [B, M, N] (Tile) and [B, M, 1] (Col), and
// what every batch shares: scalars and row vectors [N]. Shared [M, N] or [M, 1] values have no
// device node that reads them for every batch (a tile input and a column vector are indexed by
// the batch), and per-batch rows or scalars none either: they are not classes here.
std::optional<ValueClass> classify(const Shape& s, const OutFrame& f) {
  if (!f.batch) return classify(s, f.m, f.n);
  if (s.size() == 3) {
    if (s[0] != *f.batch) return std::nullopt;
    const auto c = classify(Shape{s[1], s[2]}, f.m, f.n);
    return c == ValueClass::Tile || c == ValueClass::Col ? c : std::nullopt;
  }
  const auto c = classify(s, f.m, f.n);
  return c == ValueClass::Row || c == ValueClass::Scalar ? c : std::nullopt;
}

// Storage dtype of a materialized value: a cast names it, a transpose keeps its operand's
// (it moves values, it does not round them), everything else stays fp32.
DType storage_dtype(const Graph& g, const Node& n) {
  const Node* at = &n;
  while (at->kind == OpKind::Transpose) at = &g.node(at->inputs[0]);
  return (at->kind == OpKind::Input || at->kind == OpKind::Cast) ? at->dtype : DType::F32;
}

// Gate pairs (first matmul, gate matmul) that a previous run of Φ could not keep merged, and why.
using RefusedGates = std::map<std::pair<int, int>, std::string>;

class Lowering {
 public:
  Lowering(const Graph& g, const RefusedGates& refused) : g_(g), consumers_(g.consumers()), refused_(refused) {}

  // Merges this run made that turned out not to hold (filled by run()).
  const RefusedGates& newly_refused() const { return newly_refused_; }

  LoweringResult run() {
    check_outputs();
    const size_t count = g_.nodes().size();
    region_of_.assign(count, kNoRegion);
    depends_on_gemm_.assign(count, false);
    reason_.assign(count, "");
    live_ = live_nodes();

    for (const Node& n : g_.nodes()) {
      for (int in : n.inputs) depends_on_gemm_[n.id] = depends_on_gemm_[n.id] || depends_on_gemm_[in];
      if (n.kind == OpKind::MatMul) depends_on_gemm_[n.id] = true;
    }
    find_gate_pairs();
    for (const Node& n : g_.nodes())
      if (n.kind == OpKind::MatMul && live_[n.id] && region_of_[n.id] == kNoRegion) grow_region(n);
    if (roots_.empty()) nothing_to_fuse();
    for (size_t r = 0; r < roots_.size(); ++r) result_.regions.push_back(build_region(static_cast<int>(r)));
    report_outside();
    find_b2b();
    check_gate_regions();
    return std::move(result_);
  }

 private:
  // Outputs a kernel can compute: there are some, and none is an input or a constant as it
  // stands (a kernel would have nothing to compute; an input's buffer would be its own output).
  void check_outputs() const {
    if (g_.outputs().empty())
      throw Error("nothing to fuse: the graph has no outputs (declare one, e.g. `output y: bf16`)");
    for (const GraphOutput& o : g_.outputs()) {
      const Node& n = g_.node(o.node);
      if (n.kind == OpKind::Input)
        throw Error(o.loc, fmt::format("output '{}' is the graph input '{}' itself: a kernel computes its outputs "
                                       "from a GEMM and its epilogue; copy inputs outside ComFuse",
                                       o.name, n.name));
      if (n.kind == OpKind::Constant)
        throw Error(o.loc, fmt::format("output '{}' is the constant {}: a kernel computes its outputs from a GEMM and "
                                       "its epilogue",
                                       o.name, n.value));
    }
  }

  [[noreturn]] void nothing_to_fuse() const {
    std::string dead;
    for (const Node& n : g_.nodes())
      if (n.kind == OpKind::MatMul && dead.empty()) dead = n.name;
    if (dead.empty())
      throw Error("nothing to fuse: the graph has no matmul (ComFuse fuses a GEMM with its epilogue)");
    throw Error(fmt::format("nothing to fuse: no output depends on a matmul (matmul '{}' reaches no output)", dead));
  }

  // Nodes from which some graph output is reachable.
  std::vector<bool> live_nodes() const {
    std::vector<bool> live(g_.nodes().size(), false);
    for (const GraphOutput& o : g_.outputs()) live[o.node] = true;
    for (int id = static_cast<int>(g_.nodes().size()) - 1; id >= 0; --id)
      if (live[id])
        for (int in : g_.node(id).inputs) live[in] = true;
    return live;
  }

  // Why `n` cannot join region `r`, or empty when it can.
  std::string admission(const Node& n, int r) const {
    const Node& mm = g_.node(roots_[r]);
    bool touches = false;
    for (int in : n.inputs) touches = touches || region_of_[in] == r;
    if (!touches) return "";  // not a candidate; no reason needed
    switch (n.kind) {
      case OpKind::Unary: case OpKind::Binary: case OpKind::Cast: case OpKind::CausalMask: case OpKind::RotateHalf:
      case OpKind::RotatePairs:
        break;
      case OpKind::Reduce:
        if (n.reduce_dim != static_cast<int>(g_.node(n.inputs[0]).shape.size()) - 1)
          return fmt::format("{} reduces dim {}, not the last (N) dimension", name_of(n.reduce), n.reduce_dim);
        break;
      case OpKind::MatMul: return "a second GEMM consumes this epilogue value (region boundary)";
      default: return fmt::format("op '{}' is outside the fusion domain", name_of(n.kind));
    }
    if (std::string why = segment_conflict(n, r); !why.empty()) return why;
    const OutFrame f = frame_of(mm);
    auto cls = classify(n.shape, f);
    if (!cls || (*cls != ValueClass::Tile && *cls != ValueClass::Col))
      return fmt::format("result shape {} is neither the tile {} nor a per-row column {}", to_string(n.shape),
                         f.batch ? "[B, M, N]" : "[M, N]", f.batch ? "[B, M, 1]" : "[M, 1]");
    if (n.kind == OpKind::Reduce && classify(g_.node(n.inputs[0]).shape, f) != ValueClass::Tile)
      return "reduces a value that is not a full [M, N] tile";
    if (n.kind == OpKind::CausalMask && *cls != ValueClass::Tile)
      return fmt::format("{} masks the GEMM's [M, N] tile by row and column; its operand is {}", CausalMaskOp::name,
                         to_string(n.shape));
    for (int in : n.inputs) {
      if (region_of_[in] == r) continue;
      const Node& leaf = g_.node(in);
      if (depends_on_gemm_[in])
        return fmt::format("operand {} comes from outside this GEMM's epilogue ({})", who(in),
                           region_of_[in] == kNoRegion ? "an unfused node" : "another GEMM region");
      // An operand of the segment's length, read periodically (segment_conflict checked the
      // segment is this region's).
      if (periodic_leaf(n, leaf, f)) continue;
      const auto leaf_cls = classify(leaf.shape, f);
      // A batched kernel reads no per-batch column vector (ColBroadcast has one vector for all).
      if (f.batch && (!leaf_cls || leaf_cls == ValueClass::Col))
        return fmt::format("operand {} of shape {} is not a scalar, a row vector [N] or a per-batch tile [B, M, N] "
                           "of this batched GEMM's output [{}, {}, {}] (a batched kernel reads no [M, N] or [M, 1] "
                           "operand shared by the batches, and no per-batch column [B, M, 1] or row [B, 1, N])",
                           who(in), to_string(leaf.shape), f.batch->str(), f.m.str(), f.n.str());
      if (!leaf_cls)
        return fmt::format("operand {} of shape {} is not a scalar, a row vector [N], a column vector [M, 1] or "
                           "a tile [M, N] of this GEMM's output",
                           who(in), to_string(leaf.shape));
    }
    return "";
  }

  // --- gated pairs ---------------------------------------------------------------------
  // Nodes downstream of `id` (itself included); `elementwise`: through unary, binary and cast
  // nodes only.
  std::vector<bool> reach(int id, bool elementwise) const {
    std::vector<bool> in(g_.nodes().size(), false);
    in[id] = true;
    for (const Node& n : g_.nodes()) {
      if (n.id <= id) continue;
      if (elementwise && n.kind != OpKind::Unary && n.kind != OpKind::Binary && n.kind != OpKind::Cast) continue;
      for (int i : n.inputs) in[n.id] = in[n.id] || in[i];
    }
    return in;
  }

  // Why matmuls a and b (a < b, their values meeting elementwise) cannot be one gated GEMM, or "".
  std::string gate_blocker(const Node& a, const Node& b) {
    const Node &xa = g_.node(a.inputs[0]), &xb = g_.node(b.inputs[0]);
    if (xa.id != xb.id)
      return fmt::format("{} reads A {} and {} reads A {}: the two GEMMs of a gated pair share their A operand (X)",
                         who(a.id), who(xa.id), who(b.id), who(xb.id));
    const Node &w1 = g_.node(a.inputs[1]), &w3 = g_.node(b.inputs[1]);
    auto layout = [](const Node& mm) { return mm.b_layout == BLayout::NK ? "N x K" : "K x N (layout=kn)"; };
    if (a.b_layout != b.b_layout)
      return fmt::format("{} reads B {} as {} and {} reads B {} as {}: a gated pair's W1 and W3 share one layout",
                         who(a.id), who(w1.id), layout(a), who(b.id), who(w3.id), layout(b));
    const DType d1 = storage_dtype(g_, w1), d3 = storage_dtype(g_, w3);
    if (w1.shape != w3.shape || d1 != d3)
      return fmt::format("B operands {} {}{} and {} {}{} differ: a gated pair's W1 and W3 have one shape and dtype",
                         who(w1.id), name_of(d1), to_string(w1.shape), who(w3.id), name_of(d3), to_string(w3.shape));
    for (const Node* w : {&w1, &w3})
      if (depends_on_gemm_[w->id])
        return fmt::format("B operand {} is computed from a GEMM; a gated GEMM loads W1 and W3 from memory", who(w->id));
    return "";
  }

  // A node as the user knows it (graph.h user_descriptions).
  const std::string& who(int id) const { return described()[static_cast<size_t>(id)]; }

  // Pairs of live matmuls whose values meet in a binary elementwise node, neither downstream of
  // the other; each matmul joins at most one merged pair (the first found).
  void find_gate_pairs() {
    std::vector<int> mms;
    for (const Node& n : g_.nodes())
      if (n.kind == OpKind::MatMul && live_[n.id]) mms.push_back(n.id);
    std::set<int> paired;
    for (size_t i = 0; i < mms.size(); ++i) {
      const std::vector<bool> ra = reach(mms[i], true), below = reach(mms[i], false);
      for (size_t j = i + 1; j < mms.size(); ++j) {
        if (below[mms[j]]) continue;  // b reads a's value: a chain, not a gated pair
        const std::vector<bool> rb = reach(mms[j], true);
        int meet = -1;
        for (const Node& n : g_.nodes())
          if (meet < 0 && n.kind == OpKind::Binary && live_[n.id] &&
              ((ra[n.inputs[0]] && rb[n.inputs[1]]) || (rb[n.inputs[0]] && ra[n.inputs[1]])))
            meet = n.id;
        if (meet < 0) continue;
        const Node &a = g_.node(mms[i]), &b = g_.node(mms[j]);
        GatePair gp{a.id, b.id, meet, -1, gate_blocker(a, b)};
        for (int m : {a.id, b.id})
          if (gp.blocker.empty() && paired.count(m))
            gp.blocker = fmt::format("{} is already part of another gated pair", who(m));
        if (auto it = refused_.find({a.id, b.id}); gp.blocker.empty() && it != refused_.end()) gp.blocker = it->second;
        if (gp.blocker.empty()) {
          gate_of_root_[a.id] = b.id;
          paired.insert(a.id);
          paired.insert(b.id);
        }
        result_.gate_pairs.push_back(gp);
      }
    }
  }

  // A merged pair holds where its F fuses into the region and is elementwise: the region is a
  // gated GEMM, the first of a B2B pair or a single-GEMM kernel of its own.
  void check_gate_regions() {
    for (GatePair& gp : result_.gate_pairs) {
      if (!gp.blocker.empty()) continue;
      const int r = region_of_[gp.first_matmul];
      const Node& meet = g_.node(gp.meet_node);
      std::string why;
      int reduction = -1, per_segment = -1;
      for (int id : members_[r]) {
        if (g_.node(id).kind == OpKind::Reduce && reduction < 0) reduction = id;
        if (g_.node(id).segment > 0 && per_segment < 0) per_segment = id;
      }
      if (region_of_[gp.meet_node] != r) {
        why = fmt::format("{} does not fuse into the gated GEMM's epilogue: {}", who(meet.id), reason_[meet.id]);
      } else if (reduction >= 0) {
        why = fmt::format("its epilogue reduces ({}): a gated GEMM's epilogue is elementwise (a B2B pair's F per "
                          "chunk of N1; the single-GEMM kernel's two products share one accumulator)",
                          who(reduction));
      } else if (per_segment >= 0) {
        // rotate_half's partner evaluation reads the accumulator only, not the gate's half.
        why = fmt::format("its epilogue works on runs of {} columns ({}): per-segment epilogues run in ungated kernels",
                          g_.node(per_segment).segment, who(per_segment));
      }
      if (why.empty()) gp.region = r;
      else newly_refused_[{gp.first_matmul, gp.gate_matmul}] = why;
    }
  }

  void grow_region(const Node& mm) {
    const int r = static_cast<int>(roots_.size());
    roots_.push_back(mm.id);
    members_.emplace_back();
    segment_.push_back(-1);
    region_of_[mm.id] = r;
    members_[r].push_back(mm.id);
    const auto gate = gate_of_root_.find(mm.id);
    for (const Node& n : g_.nodes()) {
      if (n.id <= mm.id || region_of_[n.id] != kNoRegion || !live_[n.id]) continue;
      if (gate != gate_of_root_.end() && n.id == gate->second) {  // the second accumulator, A x W3
        region_of_[n.id] = r;
        members_[r].push_back(n.id);
        continue;
      }
      bool touches = false;
      for (int in : n.inputs) touches = touches || region_of_[in] == r;
      if (!touches) continue;
      std::string why = admission(n, r);
      if (why.empty()) {
        region_of_[n.id] = r;
        members_[r].push_back(n.id);
        if (n.kind == OpKind::Reduce || needs_runs(n)) segment_[r] = n.segment;
      } else if (reason_[n.id].empty()) {
        reason_[n.id] = why;
      }
    }
    // Per-segment members no kernel holds leave, each eviction possibly stranding another's
    // value, until none leaves.
    for (size_t before = 0; before != members_[r].size();) {
      before = members_[r].size();
      evict_segment_stat_sinks(r);
      evict_rotate_hazards(r);
    }
  }

  // --- per-segment epilogues (Node::segment: segmented reductions, rotate_half) ----------
  // An operand whose last dim is `segment`, read periodically against the tile's N columns: a
  // vector [S] (a per-head norm's gamma) or rows [M, S] (rotary cos and sin).
  static bool segment_operand(const Node& leaf, int64_t segment, const OutFrame& f) {
    return segment > 0 && !f.batch && periodic_operand(leaf.shape, Shape{f.m, f.n}, Dim::of(segment));
  }
  static bool periodic_leaf(const Node& n, const Node& leaf, const OutFrame& f) {
    return n.kind == OpKind::Binary && segment_operand(leaf, n.segment, f);
  }
  // A region works over whole rows or over runs of one segment length (its reductions span
  // either; rotate_half and periodic operands need the runs): why n cannot join r's, or "".
  std::string segment_conflict(const Node& n, int r) const {
    const bool whole_row_reduce = n.kind == OpKind::Reduce && n.segment == 0;
    if (!whole_row_reduce && n.segment == 0) return "";
    auto what = [&] {
      return n.kind == OpKind::Reduce       ? fmt::format("{} reduces runs of {} columns", name_of(n.reduce), n.segment)
             : n.kind == OpKind::RotateHalf ? fmt::format("{} rotates runs of {} columns", RotateHalfOp::name, n.segment)
             : n.kind == OpKind::RotatePairs ? fmt::format("{} rotates runs of {} columns", RotatePairsOp::name, n.segment)
                                            : fmt::format("{} works on runs of {} columns", who(n.id), n.segment);
    };
    if (n.segment && frame_of(g_.node(roots_[r])).batch)
      return fmt::format("{}; a batched GEMM's epilogue works on whole rows", what());
    if (segment_[r] < 0 || segment_[r] == n.segment) return "";
    const char* either = n.kind == OpKind::Reduce ? "one kernel reduces either" : "one kernel works on either";
    if (whole_row_reduce)
      return fmt::format("{} reduces whole rows, and this epilogue works on runs of {} columns ({})",
                         name_of(n.reduce), segment_[r], either);
    return segment_[r] == 0 ? fmt::format("{}, and this epilogue's {}reductions span whole rows ({})", what(),
                                          n.kind == OpKind::Reduce ? "other " : "", either)
                            : fmt::format("{}, and this epilogue's other ops work on runs of {}", what(), segment_[r]);
  }
  // Members that need the tiles to span runs: segmented reductions and rotations (a periodic
  // operand's consumer only reads one, wherever the tiles start).
  static bool needs_runs(const Node& n) {
    return n.segment > 0 && (n.kind == OpKind::Reduce || n.kind == OpKind::RotateHalf || n.kind == OpKind::RotatePairs);
  }
  // The segment region r works on, from its members: -1 none, 0 whole-row reductions.
  int64_t region_segment(int r) const {
    int64_t seg = -1;
    for (int id : members_[r]) {
      const Node& n = g_.node(id);
      if (needs_runs(n)) return n.segment;
      if (n.kind == OpKind::Reduce) seg = 0;
    }
    return seg;
  }

  // Members of region r whose value is one per row of a segment (a Col value of the kernel, though
  // the graph gives it the tile's shape): the segmented reductions and what is computed from them
  // and per-row or scalar operands only.
  std::vector<bool> segment_stats(int r) const {
    std::vector<bool> stat(g_.nodes().size(), false);
    const OutFrame f = frame_of(g_.node(roots_[r]));
    for (int id : members_[r]) {
      const Node& n = g_.node(id);
      if (n.kind == OpKind::Reduce) { stat[id] = n.segment > 0; continue; }
      if (n.kind != OpKind::Unary && n.kind != OpKind::Binary && n.kind != OpKind::Cast) continue;
      bool any = false, per_row = true;
      for (int in : n.inputs) {
        any = any || stat[in];
        const auto c = classify(g_.node(in).shape, f);
        per_row = per_row && (stat[in] || (c && (*c == ValueClass::Scalar || (*c == ValueClass::Col && !periodic_leaf(n, g_.node(in), f)))));
      }
      stat[id] = any && per_row;
    }
    return stat;
  }

  // A segment's statistic has no tile to store (the kernel holds one value a row of the tile):
  // one that would leave the kernel leaves the region, and with it what is computed from it.
  void evict_segment_stat_sinks(int r) {
    for (bool changed = true; changed;) {
      changed = false;
      const std::vector<bool> stat = segment_stats(r);
      for (int id : members_[r]) {
        if (!stat[id]) continue;
        bool sink = false;
        for (const GraphOutput& o : g_.outputs()) sink = sink || o.node == id;
        for (int c : consumers_[id]) sink = sink || (live_[c] && region_of_[c] != r);
        if (!sink) continue;
        reason_[id] = fmt::format("a per-segment statistic (one value a row per run of {} columns) is not stored by "
                                  "a kernel; the kernel may store what is computed from it with the tile",
                                  g_.node(id).segment ? g_.node(id).segment : segment_[r]);
        evict(r, id);
        changed = true;
        break;
      }
    }
    segment_[r] = region_segment(r);
    // An operand admitted as periodic against the region's segment (admission) where no member
    // needing runs stays (its segmented reductions left, or there were none: a rotate_half
    // outside): no kernel reads it periodically (build_region would classify a [S] vector against
    // N columns), so its consumer leaves too.
    if (segment_[r] > 0) return;
    const OutFrame f = frame_of(g_.node(roots_[r]));
    for (bool changed = true; changed;) {
      changed = false;
      for (int id : members_[r]) {
        const Node& n = g_.node(id);
        const auto leaf = std::find_if(n.inputs.begin(), n.inputs.end(), [&](int in) {
          return !depends_on_gemm_[in] && periodic_leaf(n, g_.node(in), f);
        });
        if (leaf == n.inputs.end()) continue;
        reason_[id] = fmt::format("operand {} of shape {} repeats every {} columns, but no segmented reduction or "
                                  "rotation of this epilogue works on those runs",
                                  who(*leaf), to_string(g_.node(*leaf).shape), n.segment);
        evict(r, id);
        changed = true;
        break;
      }
    }
  }

  // rotate_half reads its partner columns from the accumulator registers of its stage's tile
  // (nodes.cuh RotateHalf). A stage that ends in a reduction writes the tile value it carries
  // to the next stage back into those registers fragment by fragment (stage.cuh, Bypass): where
  // that value is not the stage's own input tile, a later fragment's partner would read it
  // instead. Such a rotate_half leaves the region, and what is computed from it.
  void evict_rotate_hazards(int r) {
    auto rotates = [&] {
      return std::any_of(members_[r].begin(), members_[r].end(),
                         [&](int id) { return g_.node(id).kind == OpKind::RotateHalf; });
    };
    for (bool changed = rotates(); changed;) {
      changed = false;
      const Staging st = stage_region(r);
      const int L = static_cast<int>(st.reductions.size());
      const std::vector<bool> seg_stat = segment_stats(r);
      for (int id : members_[r]) {
        if (g_.node(id).kind != OpKind::RotateHalf) continue;
        const int d = st.def_stage.at(id);
        if (d >= L) continue;
        int overwrites = -1;
        for (int c : members_[r])
          if (g_.node(c).kind != OpKind::Reduce && is_tile(c, r, seg_stat) && st.def_stage.at(c) == d &&
              st.last_use.at(c) > d && g_.node(c).kind != OpKind::MatMul &&
              !(st.remat.count(c) && st.remat.at(c).count(d + 1)))
            overwrites = c;
        if (overwrites < 0) continue;
        reason_[id] = fmt::format("{} reads its partner columns from registers that {}, carried across {} to the "
                                  "next stage, overwrites in the same kernel stage",
                                  RotateHalfOp::name, who(overwrites), who(st.reductions[static_cast<size_t>(d)]));
        evict(r, id);
        changed = true;
        break;
      }
    }
    segment_[r] = region_segment(r);
  }

  // Member `id` of region r leaves it, and with it every member computed from it.
  void evict(int r, int id) {
    std::vector<bool> gone(g_.nodes().size(), false);
    gone[id] = true;
    std::vector<int> kept;
    for (int m : members_[r]) {
      for (int in : g_.node(m).inputs) gone[m] = gone[m] || gone[in];
      if (gone[m]) region_of_[m] = kNoRegion;
      else kept.push_back(m);
    }
    members_[r] = kept;
  }

  // --- staging -------------------------------------------------------------------------
  struct Staging {
    std::vector<int> reductions;          // graph ids, topological: r_0..r_{L-1}
    std::map<int, int> def_stage;         // node -> stage where its value first exists
    std::map<int, int> last_use;          // node -> last stage that reads it
    std::map<int, std::set<int>> remat;   // node -> later stages that recompute it
    std::vector<std::pair<int, std::string>> sinks;  // (node, output name) stored
  };

  bool in_region(int id, int r) const { return region_of_[id] == r; }

  Staging stage_region(int r) const {
    Staging st;
    const auto& mem = members_[r];
    std::map<int, int> reduction_index;
    for (int id : mem)
      if (g_.node(id).kind == OpKind::Reduce) {
        reduction_index[id] = static_cast<int>(st.reductions.size());
        st.reductions.push_back(id);
      }
    // Earliest stage each value can exist in.
    std::map<int, int> avail;
    for (int id : mem) {
      const Node& n = g_.node(id);
      if (n.kind == OpKind::MatMul) { avail[id] = 0; continue; }
      int a = 0;
      for (int in : n.inputs)
        if (in_region(in, r)) a = std::max(a, avail[in]);
      avail[id] = n.kind == OpKind::Reduce ? reduction_index[id] + 1 : a;
    }
    // Latest placement that still precedes every consumer (ALAP), reverse topological.
    for (auto it = mem.rbegin(); it != mem.rend(); ++it) {
      const int id = *it;
      const Node& n = g_.node(id);
      if (n.kind == OpKind::MatMul || n.kind == OpKind::Reduce) { st.def_stage[id] = avail[id]; continue; }
      int need = -1;
      for (int c : consumers_[id]) {
        if (!in_region(c, r)) continue;
        const int s = g_.node(c).kind == OpKind::Reduce ? reduction_index[c] : st.def_stage.at(c);
        need = need < 0 ? s : std::min(need, s);
      }
      st.def_stage[id] = need < 0 ? avail[id] : std::max(need, avail[id]);
    }
    for (int id : mem) {
      int last = st.def_stage[id];
      for (int c : consumers_[id]) {
        if (!in_region(c, r)) continue;
        last = std::max(last, g_.node(c).kind == OpKind::Reduce ? reduction_index[c] : st.def_stage[c]);
      }
      st.last_use[id] = last;
    }
    // Values leaving the kernel: graph outputs and values consumed outside the region.
    for (int id : mem) {
      for (const GraphOutput& o : g_.outputs())
        if (o.node == id) st.sinks.emplace_back(id, o.name);
      bool escapes = false;
      for (int c : consumers_[id]) escapes = escapes || (live_[c] && !in_region(c, r));
      bool already = false;
      for (auto& s : st.sinks) already = already || s.first == id;
      if (escapes && !already) st.sinks.emplace_back(id, g_.node(id).name);
    }
    limit_tile_carries(st, r, mem);
    return st;
  }

  // A tile-class value of region r; `seg_stat`: the region's segment_stats (a per-segment
  // statistic has the tile's graph shape but is one value a row of the kernel's tile).
  bool is_tile(int id, int r, const std::vector<bool>& seg_stat) const {
    return classify(g_.node(id).shape, frame_of(g_.node(roots_[r]))) == ValueClass::Tile && !seg_stat[id];
  }

  // The device carries ONE tile-shaped value across each reduction (in the accumulator
  // registers). Where more would cross stage boundary s, recompute in stage s the
  // elementwise ones whose tile inputs cross anyway (e.g. x - max from x and the carried
  // per-row max) instead of carrying them: their per-row inputs cross instead, which costs
  // registers per row, not per element. What cannot be rewritten so stays as it is (emit
  // then names it).
  void limit_tile_carries(Staging& st, int r, const std::vector<int>& mem) const {
    const int L = static_cast<int>(st.reductions.size());
    const std::vector<bool> seg_stat = segment_stats(r);
    auto is_tile = [&](int id, int rr) { return this->is_tile(id, rr, seg_stat); };
    for (int s = 1; s <= L; ++s) {
      for (;;) {
        std::vector<int> carried;
        for (int id : mem)
          if (g_.node(id).kind != OpKind::Reduce && is_tile(id, r) && st.def_stage.at(id) < s &&
              st.last_use.at(id) >= s && !st.remat[id].count(s))
            carried.push_back(id);
        if (carried.size() <= 1) break;
        int pick = -1;
        for (int id : carried) {
          const Node& n = g_.node(id);
          if (n.kind != OpKind::Unary && n.kind != OpKind::Binary && n.kind != OpKind::Cast &&
              n.kind != OpKind::CausalMask)
            continue;
          bool inputs_cross = true;
          for (int in : n.inputs)
            if (in_region(in, r) && is_tile(in, r))
              inputs_cross = inputs_cross && in != id &&
                             std::find(carried.begin(), carried.end(), in) != carried.end();
          if (inputs_cross) { pick = id; break; }
        }
        if (pick < 0) break;
        st.remat[pick].insert(s);
        for (int in : g_.node(pick).inputs)
          if (in_region(in, r)) st.last_use[in] = std::max(st.last_use[in], s);
      }
    }
  }

  // --- building the spec ----------------------------------------------------------------
  // The runtime-argument table A of the spec being built: one argument per graph leaf.
  struct ArgTable {
    FusionSpec& fs;
    const Graph& g;
    // (graph id, role) -> arg index. Keyed by role too: one tensor may be both GEMM operands
    // (X x X^T), and the kernel loads A and B through separate descriptors.
    std::map<std::pair<int, ArgRole>, int> arg_of_node;

    int leaf_arg(const Node& leaf, ArgRole role) {
      auto it = arg_of_node.find({leaf.id, role});
      if (it != arg_of_node.end()) return it->second;
      RuntimeArg a;
      a.name = leaf.name;
      a.role = role;
      a.dtype = storage_dtype(g, leaf);
      a.shape = leaf.shape;
      a.graph_node = leaf.id;
      fs.args.push_back(a);
      return arg_of_node[{leaf.id, role}] = static_cast<int>(fs.args.size()) - 1;
    }
  };

  FusedRegion build_region(int r) {
    const Node& mm = g_.node(roots_[r]);
    const Node& a = g_.node(mm.inputs[0]);
    FusedRegion region;
    region.matmul_node = mm.id;
    region.fused_nodes = members_[r];
    FusionSpec& fs = region.spec;
    // Named as the user knows it: the matmul's own name, else the first output the region
    // stores. The name reaches file names and a tool's command line (jit/cache.cpp's dumps): an
    // API's names may hold any character, so only letters, digits and '_' are kept.
    std::string label = given_name(g_, mm.id);
    for (const GraphOutput& o : g_.outputs())
      if (label.empty() && std::find(members_[r].begin(), members_[r].end(), o.node) != members_[r].end()) label = o.name;
    for (char& ch : label)
      if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_') ch = '_';
    fs.name = fmt::format("region{}_{}", r, label.empty() ? "matmul" : label);
    fs.b_layout = mm.b_layout;
    const OutFrame frame = frame_of(mm);
    fs.m = frame.m;
    fs.n = frame.n;
    fs.k = a.shape.back();
    if (frame.batch) fs.batch = *frame.batch;
    fs.segment = std::max<int64_t>(segment_[r], 0);
    const std::vector<bool> seg_stat = segment_stats(r);
    ArgTable args{fs, g_, {}};
    args.leaf_arg(a, ArgRole::OperandA);
    args.leaf_arg(g_.node(mm.inputs[1]), ArgRole::OperandB);
    const auto gate = gate_of_root_.find(mm.id);
    if (gate != gate_of_root_.end()) args.leaf_arg(g_.node(g_.node(gate->second).inputs[1]), ArgRole::OperandGate);

    const Staging st = stage_region(r);
    const int L = static_cast<int>(st.reductions.size());
    std::vector<Spec*> stages;
    stages.push_back(&fs.root);
    std::vector<std::map<int, int>> index_in(L + 1);  // per stage: graph id -> spec node index

    for (int s = 0; s <= L; ++s) {
      Spec& sp = *stages[s];
      auto add = [&](SpecNode n) { sp.nodes.push_back(std::move(n)); return static_cast<int>(sp.nodes.size()) - 1; };
      auto store_if_sink = [&](int id, int at) {
        for (const auto& [node, name] : st.sinks) {
          if (node != id) continue;
          RuntimeArg out;
          out.name = name;
          out.role = ArgRole::Output;
          out.graph_node = id;
          out.shape = g_.node(id).shape;
          out.value_class = sp.nodes[at].value_class;
          out.dtype = storage_dtype(g_, g_.node(id));
          for (const GraphOutput& o : g_.outputs())
            if (o.node == id && o.name == name) out.dtype = o.dtype;
          fs.args.push_back(out);
          SpecNode store;
          store.category = NodeCategory::Store;
          store.value_class = sp.nodes[at].value_class;
          store.operands = {at};
          store.arg = static_cast<int>(fs.args.size()) - 1;
          store.origin = name;
          add(store);
        }
      };
      // Entry points from the parent stage: the statistic, then carried values.
      if (s > 0) {
        const int red = st.reductions[s - 1];
        SpecNode stat;
        stat.category = NodeCategory::Placeholder;
        stat.placeholder = PlaceholderKind::Stat;
        stat.value_class = ValueClass::Col;
        stat.origin = g_.node(red).name;
        index_in[s][red] = add(stat);
        store_if_sink(red, index_in[s][red]);
        for (int id : members_[r]) {
          if (id == red || st.def_stage.at(id) >= s || st.last_use.at(id) < s || (st.remat.count(id) && st.remat.at(id).count(s)))
            continue;
          SpecNode by;
          by.category = NodeCategory::Placeholder;
          by.placeholder = PlaceholderKind::Bypass;
          by.source = index_in[s - 1].at(id);
          by.value_class = stages[s - 1]->nodes[by.source].value_class;
          by.origin = g_.node(id).name;
          index_in[s][id] = add(by);
        }
      }
      std::map<int, int> leaf_here;  // leaves broadcast in this stage
      auto operand = [&](int in) -> int {
        if (in_region(in, r)) return index_in[s].at(in);
        auto it = leaf_here.find(in);
        if (it != leaf_here.end()) return it->second;
        const Node& leaf = g_.node(in);
        SpecNode b;
        b.category = NodeCategory::Broadcast;
        // An operand of the segment's length is read periodically (periodic_arg): a row [S] as a
        // row vector, rows [M, S] as a tile input.
        b.value_class = segment_operand(leaf, fs.segment, frame)
                            ? (leaf.shape.size() == 1 ? ValueClass::Row : ValueClass::Tile)
                            : *classify(leaf.shape, frame);
        b.origin = leaf.name;
        if (leaf.kind == OpKind::Constant) {
          b.broadcast = BroadcastKind::Scalar;
          b.literal = leaf.value;
          warn_literal(leaf);
        } else {
          b.broadcast = b.value_class == ValueClass::Row    ? BroadcastKind::Row
                        : b.value_class == ValueClass::Col  ? BroadcastKind::Col
                        : b.value_class == ValueClass::Tile ? BroadcastKind::Tile
                                                            : BroadcastKind::Scalar;
          const ArgRole role = b.broadcast == BroadcastKind::Row    ? ArgRole::RowVector
                               : b.broadcast == BroadcastKind::Col  ? ArgRole::ColVector
                               : b.broadcast == BroadcastKind::Tile ? ArgRole::TileInput
                                                                    : ArgRole::Scalar;
          b.arg = args.leaf_arg(leaf, role);
        }
        return leaf_here[in] = add(b);
      };
      for (int id : members_[r]) {
        const Node& n = g_.node(id);
        const bool recomputed = st.remat.count(id) && st.remat.at(id).count(s);
        if (n.kind == OpKind::Reduce || (st.def_stage.at(id) != s && !recomputed)) continue;
        SpecNode sn;
        sn.origin = n.name;
        if (n.kind == OpKind::MatMul) {
          sn.category = NodeCategory::AccEntry;
          sn.value_class = ValueClass::Tile;
          if (id != mm.id) sn.arg = args.leaf_arg(g_.node(n.inputs[1]), ArgRole::OperandGate);  // A x W3
        } else {
          sn.category = NodeCategory::Compute;
          sn.value_class = seg_stat[id] ? ValueClass::Col : *classify(n.shape, frame);
          for (int in : n.inputs) sn.operands.push_back(operand(in));
          sn.compute = n.kind == OpKind::Unary        ? ComputeKind::Unary
                       : n.kind == OpKind::Binary     ? ComputeKind::Binary
                       : n.kind == OpKind::CausalMask ? ComputeKind::CausalMask
                       : n.kind == OpKind::RotateHalf ? ComputeKind::RotateHalf
                       : n.kind == OpKind::RotatePairs ? ComputeKind::RotatePairs
                                                      : ComputeKind::Cast;
          sn.unary = n.unary;
          sn.binary = n.binary;
          sn.cast_to = n.dtype;
        }
        index_in[s][id] = add(sn);
        if (!recomputed) store_if_sink(id, index_in[s][id]);
      }
      if (s < L) {
        const Node& red = g_.node(st.reductions[s]);
        SpecNode rn;
        rn.category = NodeCategory::Reduction;
        rn.value_class = ValueClass::Col;
        rn.reduce = red.reduce;
        rn.operands = {operand(red.inputs[0])};
        rn.post = 0;
        rn.origin = red.name;
        sp.terminal = add(rn);
        sp.children.emplace_back();
        stages.push_back(&sp.children.back());
      } else {
        for (int i = static_cast<int>(sp.nodes.size()) - 1; i >= 0 && sp.terminal < 0; --i)
          if (sp.nodes[i].category == NodeCategory::Store) sp.terminal = i;
      }
    }
    name_for_user(fs);
    return region;
  }

  // The epilogue computes in f32: a literal f32 cannot hold differs from the fp64 graph.
  void warn_literal(const Node& c) {
    if (!warned_.insert(c.id).second || !std::isfinite(c.value)) return;
    const float f = static_cast<float>(c.value);
    const char* to = std::isinf(f) ? "inf" : (f == 0.0f && c.value != 0.0) ? "0" : nullptr;
    if (!to) return;
    const std::string& what = described()[static_cast<size_t>(c.id)];  // "the constant 1e+300 inside 'y' (line 4)"
    result_.warnings.push_back(fmt::format("{} rounds to {} in f32, the precision the kernel's epilogue computes in "
                                           "(the CPU reference keeps fp64)",
                                           what[0] == '\'' ? fmt::format("constant {} = {}", what, c.value) : what, to));
  }

  // Graph names the graph made up itself ("%reduce3"), in the user's terms, for messages.
  void name_for_user(FusionSpec& fs) {
    auto note = [&](const std::string& name) {
      if (!made_up_name(name) || fs.user_names.count(name)) return;
      if (const int id = g_.find(name); id >= 0) fs.user_names[name] = described()[static_cast<size_t>(id)];
    };
    for (const RuntimeArg& a : fs.args) {
      note(a.name);
      // An argument the graph computes (a fallback, another region's store): say so.
      if (a.role != ArgRole::Output && a.graph_node >= 0 && g_.node(a.graph_node).kind != OpKind::Input)
        fs.user_names[a.name] = described()[static_cast<size_t>(a.graph_node)] +
                                (region_of_[a.graph_node] != kNoRegion ? " (stored by another fused kernel)"
                                                                       : " (computed outside the kernel)");
    }
    struct Origins : SpecVisitor {
      std::function<void(const std::string&)> note;
      void visit(const Spec&, int, const SpecNode& n, int) override { note(n.origin); }
    } origins;
    origins.note = note;
    origins.walk(fs.root);
  }

  const std::vector<std::string>& described() const {
    if (described_.empty()) described_ = user_descriptions(g_);
    return described_;
  }

  // --- reporting -----------------------------------------------------------------------
  void report_outside() {
    for (const Node& n : g_.nodes()) {
      if (n.kind == OpKind::Input || n.kind == OpKind::Constant || region_of_[n.id] != kNoRegion) continue;
      if (!live_[n.id]) { result_.dead_nodes.push_back(n.id); continue; }
      std::string why = reason_[n.id];
      if (why.empty())
        why = depends_on_gemm_[n.id]
                  ? "its operands come from an unfused node"
                  : "does not depend on a GEMM accumulator: computed before the kernel and passed as a runtime argument";
      if (n.kind == OpKind::Transpose) why += transpose_hint(n);
      for (const GatePair& gp : result_.gate_pairs)
        if (gp.meet_node == n.id && !gp.blocker.empty())
          why += fmt::format("; the gated pair {} + {} is not merged: {}", who(gp.first_matmul), who(gp.gate_matmul),
                             gp.blocker);
      result_.fallbacks.push_back(Fallback{n.id, why});
    }
  }

  // A transposed GEMM operand: what the kernel reads without one.
  std::string transpose_hint(const Node& t) const {
    for (int c : consumers_[t.id]) {
      const Node& mm = g_.node(c);
      if (mm.kind != OpKind::MatMul) continue;
      const std::string src = short_name(g_, t.inputs[0]);
      if (mm.inputs[1] == t.id)
        return fmt::format("; matmul({}, {}{}) reads B = {} in the other layout without a transpose",
                           short_name(g_, mm.inputs[0]), src, mm.b_layout == BLayout::NK ? ", layout=kn" : "",
                           who(t.inputs[0]));
      return fmt::format("; the kernel reads A as [M, K] row-major: give {} to matmul {} already transposed",
                         who(t.inputs[0]), who(mm.id));
    }
    return "";
  }

  // A second GEMM whose A operand is a value of another region's epilogue: the B2B pair. One
  // kernel can hold both when S is what the first region exists for: S feeds the second GEMM
  // only (nothing else reads it) and the first region stores nothing else.
  void find_b2b() {
    for (int r2 = 0; r2 < static_cast<int>(roots_.size()); ++r2) {
      const int via = g_.node(roots_[r2]).inputs[0];
      const int r1 = region_of_[via];
      if (r1 == kNoRegion || r1 == r2) continue;
      const auto gate = gate_of_root_.find(roots_[r1]);
      B2BCandidate b{roots_[r1], roots_[r2], via, r1, r2, gate != gate_of_root_.end() ? gate->second : -1, ""};
      const Node& gemm2 = g_.node(roots_[r2]);
      // GEMM2 reads S from registers as its A operand and W2 from global memory by TMA: W2
      // must be a graph input, and S a 16-bit value (the register operand of a 16-bit MMA).
      if (gemm2.inputs.size() > 1 && depends_on_gemm_[gemm2.inputs[1]])
        b.blocker = fmt::format("{} reads operand B {} from a GEMM", who(gemm2.id), who(gemm2.inputs[1]));
      if (segment_[r1] > 0 || segment_[r2] > 0)
        b.blocker = "per-segment epilogues (per-head reductions, rotate_half) run in the single-GEMM kernels only";
      if (g_.node(via).dtype == DType::F32)
        b.blocker = fmt::format("{} is f32; the second GEMM reads a 16-bit operand (cast it)", who(via));
      for (int c : consumers_[via])
        if (live_[c] && c != roots_[r2])
          b.blocker = fmt::format("{} is also read by {}: it must be stored", who(via), who(c));
      for (const GraphOutput& o : g_.outputs())
        if (o.node == via) b.blocker = fmt::format("{} is a graph output: it must be stored", who(via));
      if (b.blocker.empty())
        for (int id : members_[r1]) {
          if (id == via) continue;
          bool out = false;
          for (const GraphOutput& o : g_.outputs()) out = out || o.node == id;
          for (int c : consumers_[id]) out = out || (live_[c] && region_of_[c] != r1);
          if (out) {
            b.blocker = fmt::format("the first GEMM's epilogue also stores {}", who(id));
            break;
          }
        }
      result_.b2b_candidates.push_back(b);
    }
  }

  const Graph& g_;
  std::vector<std::vector<int>> consumers_;
  std::vector<int> region_of_;
  std::vector<bool> depends_on_gemm_;
  std::vector<bool> live_;
  std::vector<std::string> reason_;
  // Per region: the segment its reductions span (Node::segment; 0: whole rows), -1 before any.
  std::vector<int64_t> segment_;
  std::vector<int> roots_;                 // region -> matmul id
  std::vector<std::vector<int>> members_;  // region -> graph ids, topological
  LoweringResult result_;
  const RefusedGates& refused_;
  RefusedGates newly_refused_;
  std::map<int, int> gate_of_root_;        // merged gate pairs: first matmul -> gate matmul
  std::set<int> warned_;                   // constants already warned about
  mutable std::vector<std::string> described_;  // user_descriptions(g_), built when first needed
};

}  // namespace

// A merged gate pair that does not hold is refused and Φ runs again without it (each run refuses
// at least one more pair, so this ends).
LoweringResult lower(const Graph& g) {
  RefusedGates refused;
  for (;;) {
    Lowering l(g, refused);
    LoweringResult r = l.run();
    if (l.newly_refused().empty()) return r;
    refused.insert(l.newly_refused().begin(), l.newly_refused().end());
  }
}

const B2BCandidate* one_b2b_kernel(const LoweringResult& r) {
  if (r.regions.size() != 2 || !r.fallbacks.empty() || r.b2b_candidates.size() != 1) return nullptr;
  return r.b2b_candidates[0].blocker.empty() ? &r.b2b_candidates[0] : nullptr;
}

std::string describe(const Graph& g, const LoweringResult& r) {
  std::string out;
  const std::vector<std::string> who = user_descriptions(g);
  auto listed = [&](int id) -> const std::string& { return who[static_cast<size_t>(id)]; };
  // A gated region that starts a B2B pair is its GEMM1; elsewhere a gated GEMM of its own.
  auto starts_pair = [&](int region) {
    for (const B2BCandidate& b : r.b2b_candidates)
      if (b.first_region == region && b.blocker.empty()) return true;
    return false;
  };
  for (size_t i = 0; i < r.regions.size(); ++i) {
    const FusedRegion& reg = r.regions[i];
    out += fmt::format("region {} ({}): GEMM {} + {} epilogue node(s), {} reduction(s), {} stage(s)\n", i,
                       reg.spec.name, listed(reg.matmul_node), reg.fused_nodes.size() - 1,
                       reg.spec.reduction_count(), reg.spec.stage_count());
    std::string names;
    for (int id : reg.fused_nodes) names += (names.empty() ? "" : "; ") + short_name(g, id);
    out += fmt::format("  fused: {}\n", names);
  }
  for (const Fallback& f : r.fallbacks)
    out += fmt::format("fallback: {}{}: {}\n", listed(f.node),
                       given_name(g, f.node).empty() ? "" : fmt::format(" ({})", name_of(g.node(f.node).kind)), f.reason);
  for (const GatePair& p : r.gate_pairs) {
    const Node &a = g.node(p.first_matmul), &b = g.node(p.gate_matmul);
    out += fmt::format("gated pair: {} (W1 {}) and {} (W3 {}) meet in {}{}\n", listed(a.id), listed(a.inputs[1]), listed(b.id),
                       listed(b.inputs[1]), listed(p.meet_node),
                       p.blocker.empty() ? fmt::format(": one gated GEMM{} (region {}, two accumulators)",
                                                       starts_pair(p.region) ? "1" : "", p.region)
                                         : ", not merged: " + p.blocker);
  }
  for (const B2BCandidate& b : r.b2b_candidates)
    out += fmt::format("b2b {}: region {} ({}{}) feeds GEMM {} (region {}) through {}{}\n",
                       b.blocker.empty() ? "pair" : "candidate", b.first_region, listed(b.first_matmul),
                       b.gate_matmul >= 0 ? fmt::format(" gated with {}", listed(b.gate_matmul)) : "",
                       listed(b.second_matmul), b.second_region, listed(b.via_node),
                       b.blocker.empty() ? ": one kernel, S in registers" : ", not fused: " + b.blocker);
  for (int id : r.dead_nodes) out += fmt::format("dead: {} reaches no output\n", listed(id));
  for (const std::string& w : r.warnings) out += fmt::format("warning: {}\n", w);
  return out;
}

}  // namespace comfuse
