// The planner, as named steps (the way DeepGEMM's sm90 heuristics read):
//
//   1. check_request   the problem and the forced options are buildable at all; the spec's
//                      device limits (operand dtypes, tile values across a reduction)
//   2. analyze_chain   what the epilogue needs (chain.cpp): reductions, pairs, stash values,
//                      SMEM per stage, live tile values
//   3. plan_kind       which decider: elementwise, row groups or DSMEM
//   4. decide          the decider of that kind proposes layout candidates (tile, schedule,
//                      cluster, work division) as KernelConfigs, fits their storage (the SMEM
//                      left for the ring: storage.cpp) and launch (grid, residency), and
//                      estimates each with its model:
//                        elementwise (decide_elementwise.cpp)  measured configurations per shape class
//                        row groups  (decide_row_groups.cpp)   the row's CTAs meet in L2
//                        DSMEM       (decide_cluster.cpp)      one cluster along N covers the row
//   5. compare         the decider's first where measurement or the decider's own model decided
//                      (a measured elementwise configuration, row groups); else the cheapest,
//                      where within near_tie the simpler strategy, then the smaller cluster wins
//   6. assemble        the Plan: the chosen KernelConfig, pairs, SMEM breakdown, reasons,
//                      runners-up (reasons.cpp)
//
// A B2BGEMM plan fits the same steps: its decider proposes (tile, N1 chunk, cluster) configs,
// storage fits one ring for X/W1 and W2 tiles, and its estimate prices both mainloops.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <tuple>

#include "comfuse/error.h"
#include "plan_internal.h"

namespace comfuse {

using plan_detail::Candidate;
using plan_detail::ChainInfo;
using plan_detail::Rejections;
using plan_detail::Request;

std::string_view name_of(Aggregation m) {
  switch (m) {
    case Aggregation::None: return "none";
    case Aggregation::PeerToPeer: return "peer-to-peer";
    case Aggregation::LeaderFollower: return "leader-follower";
    case Aggregation::L2Exchange: return "l2 (exchange across a row group of clusters)";
  }
  return "?";
}

std::string_view option_word(Aggregation a) {
  switch (a) {
    case Aggregation::PeerToPeer: return "p2p";
    case Aggregation::LeaderFollower: return "leader";
    case Aggregation::L2Exchange: return "l2";
    case Aggregation::None: return "";
  }
  return "";
}
std::optional<Aggregation> aggregation_of_word(std::string_view word) {
  for (Aggregation a : {Aggregation::PeerToPeer, Aggregation::LeaderFollower, Aggregation::L2Exchange})
    if (word == option_word(a)) return a;
  return std::nullopt;
}

std::string_view name_of(RowStrategy s) {
  switch (s) {
    case RowStrategy::NoReduction: return "no-reduction";
    case RowStrategy::OnChip: return "on-chip";
    case RowStrategy::SmemStash: return "smem-stash";
    case RowStrategy::WorkspaceStash: return "workspace-stash";
  }
  return "?";
}

namespace {
RowStrategy strategy_of(const KernelConfig& k) {
  if (!k.row_reduction) return RowStrategy::NoReduction;
  if (k.n_tiles == 1) return RowStrategy::OnChip;
  return k.stash_space == StashSpace::Workspace ? RowStrategy::WorkspaceStash : RowStrategy::SmemStash;
}
}  // namespace

RowStrategy Plan::strategy() const { return strategy_of(kernel); }

Problem problem_of(const FusionSpec& s, const Bindings& dims) {
  Problem p;
  p.m = resolve(s.m, dims);
  p.n = resolve(s.n, dims);
  p.k = resolve(s.k, dims);
  int a = s.arg_index(ArgRole::OperandA);
  if (a >= 0) p.ab_dtype = s.args[static_cast<size_t>(a)].dtype;
  return p;
}

namespace plan_detail {

RowStrategy Candidate::strategy() const { return strategy_of(k); }

std::string Candidate::describe() const {
  std::string s = fmt::format("{} {}x{}, cluster {}x{}", k.schedule(), k.tile_m,
                              k.tile_n, k.cluster_m, k.cluster_n);
  if (k.row_group > 1) s += fmt::format(" in row groups of {}", k.row_group);
  s += fmt::format(", {}", name_of(strategy()));
  if (k.stash_elem_bytes) s += fmt::format("({})", plan_detail::stash_type_name(k));
  if (k.n_tiles > 1) s += fmt::format(" {} N-tiles/CTA", k.n_tiles);
  if (k.k_splits > 1) s += fmt::format(", split-K {}{}", k.k_splits, k.splits_in_cluster ? " in a cluster" : "");
  if (k.ring_input_bytes > 0) s += ", tile inputs in the ring";
  if (ring_inputs_declined) s += ", tile inputs from L2";
  return s + fmt::format(", {} ring stages: est {:.1f} us", k.ring_stages, est.total_us);
}

void Rejections::add(const std::string& kind, std::string why) {
  for (auto& [k, ex] : kinds)
    if (k == kind) {
      ++ex.second;
      return;
    }
  kinds.push_back({kind, {std::move(why), 1}});
}

std::string Rejections::str() const {
  std::string why;
  for (const auto& [kind, ex] : kinds)
    why += ex.second > 1 ? fmt::format("\n  - {} (and {} more like it)", ex.first, ex.second - 1) : "\n  - " + ex.first;
  return why.empty() ? "\n  - no candidate matches the forced options" : why;
}

}  // namespace plan_detail

namespace {

using plan_detail::kClusterNs;
using plan_detail::kTileNs;

// ---- 1. check_request ------------------------------------------------------------------------
void check_request(const FusionSpec& s, const Problem& p, const DeviceModel& dev, const PlanOptions& opt) {
  // The single-GEMM kernel family has no batch: its scheduler, TMA descriptors and epilogue
  // inputs are 2-D. Only the B2B family (attention: softmax(Q K^T) V per batch) runs batched.
  if (s.batched()) {
    const RuntimeArg& a = s.args.at(static_cast<size_t>(s.arg_index(ArgRole::OperandA)));
    const RuntimeArg& b = s.args.at(static_cast<size_t>(s.arg_index(ArgRole::OperandB)));
    throw Error(fmt::format("plan: the matmul of {} {} and {} {} is batched over {}: the single-GEMM kernels take no "
                            "batch dim; only a B2B pair (attention: softmax(q k^T) v, one kernel) runs batched. For "
                            "one weight shared by every batch, write A as [B*M, K] rows and B as 2-D",
                            s.describe(a.name), to_string(a.shape), s.describe(b.name), to_string(b.shape),
                            s.batch.str()));
  }
  try {
    check_problem_size(p.m, p.n, p.k, dim_label(s.m, "M"), dim_label(s.n, "N"), dim_label(s.k, "K"));
    check_device_limits(s);  // the spec's device limits, in the user's names (limits.cpp)
    // A gated GEMM (KernelConfig::gated) holds both products in one accumulator of twice the
    // tile's columns: an elementwise epilogue, one N-tile a job (check()); its two B operands are
    // loaded alike (A's 16-bit type).
    auto arg = [&](ArgRole role) -> const RuntimeArg& { return s.args.at(static_cast<size_t>(s.arg_index(role))); };
    if (s.gated() && arg(ArgRole::OperandGate).dtype != p.ab_dtype)
      throw Error(fmt::format("the gate {} is {}, A is {}: a gated GEMM's operands share one 16-bit type",
                              s.describe(arg(ArgRole::OperandGate).name), name_of(arg(ArgRole::OperandGate).dtype),
                              name_of(p.ab_dtype)));
    if (s.gated() && s.reduction_count() > 0)
      throw Error(fmt::format("the gated GEMM {} x {} beside {} reduces rows in its epilogue; a gated GEMM's "
                              "epilogue is elementwise",
                              s.describe(arg(ArgRole::OperandA).name), s.describe(arg(ArgRole::OperandGate).name),
                              s.describe(arg(ArgRole::OperandB).name)));
  } catch (const Error& e) {
    throw Error(fmt::format("plan: {}", e.what()));
  }
  const int64_t eb = static_cast<int64_t>(size_of(p.ab_dtype));
  if ((p.k * eb) % 16 != 0)
    throw Error(fmt::format("plan: {} = {} is not a multiple of {}: TMA needs 16-byte aligned rows of {} A and B "
                            "(pad K)", dim_label(s.k, "K"), p.k, 16 / eb, name_of(p.ab_dtype)));
  if (s.b_layout == BLayout::KN && (p.n * eb) % 16 != 0)
    throw Error(fmt::format("plan: {} = {} is not a multiple of {}: B {} is K x N (layout=kn) and TMA needs 16-byte "
                            "aligned rows", dim_label(s.n, "N"), p.n, 16 / eb,
                            s.describe(s.args.at(static_cast<size_t>(s.arg_index(ArgRole::OperandB))).name)));
  for (const RuntimeArg& a : s.args) {
    const bool tma = (a.role == ArgRole::Output && a.value_class == ValueClass::Tile) || a.role == ArgRole::TileInput;
    if (tma && (p.n * int64_t(size_of(a.dtype))) % 16 != 0)
      throw Error(fmt::format("plan: {} {} ({} x {} {}) has rows of {} bytes; TMA needs a multiple of 16 ({} a "
                              "multiple of {})", a.role == ArgRole::Output ? "output" : "input", s.describe(a.name), p.m,
                              p.n, name_of(a.dtype), p.n * int64_t(size_of(a.dtype)), dim_label(s.n, "N"),
                              16 / size_of(a.dtype)));
  }

  if (opt.cluster_n) {
    const int c = *opt.cluster_n;
    if (std::find(std::begin(kClusterNs), std::end(kClusterNs), c) == std::end(kClusterNs) || c > dev.max_cluster)
      throw Error(fmt::format("plan: cluster_n = {} is not one of 1, 2, 4, 8, 16 (max {} on this device)", c,
                              dev.max_cluster));
  }
  if (opt.tile_n && std::find(std::begin(kTileNs), std::end(kTileNs), *opt.tile_n) == std::end(kTileNs))
    throw Error(fmt::format("plan: tile_n = {} is not one of 64, 128, 192, 256", *opt.tile_n));
  if (s.gated() && opt.tile_n && *opt.tile_n > 128)
    throw Error(fmt::format("plan: tile_n = {}: a gated GEMM's tile holds B's and the gate's columns in one wgmma of "
                            "at most 256: tile_n 64 or 128", *opt.tile_n));
  // Per-segment epilogues: rotations and periodic operands alone take tiles of whole runs of
  // whole 16-column fragments (rotate_half's partner S/2 columns away, a periodic tile input's
  // columns: nodes.cuh); per-segment reductions finish inside a tile of one run
  // (KernelConfig::row_segment). N is a whole number of runs.
  if (s.segment > 0) {
    const bool reduces = s.reduction_count() > 0;
    const bool whole_runs = s.segment % 32 == 0 && std::any_of(std::begin(kTileNs), std::end(kTileNs),
                                                               [&](int t) { return t % s.segment == 0; });
    if (!reduces && !whole_runs)
      throw Error(fmt::format("plan: the epilogue works on runs of {} columns; a tile spans whole runs of whole "
                              "16-column fragments (and rotate_half swaps their halves), so a run is 32, 64, 96, 128, "
                              "192 or 256 columns",
                              s.segment));
    if (reduces && std::find(std::begin(kTileNs), std::end(kTileNs), s.segment) == std::end(kTileNs))
      throw Error(fmt::format("plan: the epilogue reduces runs of {} columns; a tile spans one run, and tiles are 64, "
                              "128, 192 or 256 columns wide",
                              s.segment));
    if (p.n % s.segment != 0)
      throw Error(fmt::format("plan: N = {} is not a whole number of the {}-column runs the epilogue {}", p.n,
                              s.segment, reduces ? "reduces" : "works on"));
    if (!reduces && opt.tile_n && *opt.tile_n % s.segment != 0)
      throw Error(fmt::format("plan: tile_n = {}: the epilogue works on runs of {} columns, which a tile spans whole",
                              *opt.tile_n, s.segment));
    if (reduces && opt.tile_n && *opt.tile_n != s.segment)
      throw Error(fmt::format("plan: tile_n = {}: the epilogue reduces runs of {} columns, which a tile spans exactly",
                              *opt.tile_n, s.segment));
    if (reduces && (opt.stash_bytes || opt.aggregation || opt.strategy || (opt.cluster_n && *opt.cluster_n > 1)))
      throw Error(fmt::format("plan: the epilogue reduces runs of {} columns inside each tile: no clusters along N, "
                              "aggregation, strategy or stash shape it (row groups only schedule the tiles)",
                              s.segment));
  }
  if (opt.tile_m && *opt.tile_m != 64 && *opt.tile_m != 128)
    throw Error(fmt::format("plan: tile_m = {} is not 64 or 128 (rows per consumer warp group)", *opt.tile_m));
  const bool rg = plan_detail::row_groups_forced(opt);
  const bool rg_only = opt.row_group || (opt.aggregation && *opt.aggregation == Aggregation::L2Exchange);
  if ((rg_only || opt.stash_bytes) && s.reduction_count() == 0)
    throw Error("plan: row_group, stash_bytes and aggregation l2 shape row reductions; this epilogue has none");
  if (opt.consumer_wgs && (*opt.consumer_wgs < Sm90::kConsumerWGs || *opt.consumer_wgs > Sm90::kMaxConsumerWGs))
    throw Error(fmt::format("plan: consumer_wgs = {} is not in {}..{}", *opt.consumer_wgs, Sm90::kConsumerWGs,
                            Sm90::kMaxConsumerWGs));
  if (opt.consumer_wgs && *opt.consumer_wgs > Sm90::kConsumerWGs) {
    // The forced options against what more consumers need (config.cuh check_consumer_wgs), the
    // others at the values these plans take.
    KernelConfig probe;
    probe.consumer_wgs = *opt.consumer_wgs;
    probe.tile_m = opt.tile_m.value_or(64), probe.tile_n = opt.tile_n.value_or(128);
    probe.cluster_n = opt.cluster_n.value_or(1), probe.k_splits = opt.k_splits.value_or(1);
    if (const char* why = check_consumer_wgs(probe))
      throw Error(fmt::format("plan: consumer_wgs = {} with tile {}x{}, cluster_n {}, k_splits {}: {}", probe.consumer_wgs,
                              probe.tile_m, probe.tile_n, probe.cluster_n, probe.k_splits, why));
    if (opt.strategy || (opt.aggregation && *opt.aggregation != Aggregation::L2Exchange))
      throw Error(fmt::format("plan: consumer_wgs = {}: more than {} consumer warp groups take row groups or "
                              "elementwise plans, not a DSMEM cluster (strategy, p2p / leader)",
                              *opt.consumer_wgs, Sm90::kConsumerWGs));
  }
  if (opt.turn_lead && (*opt.turn_lead < 0 || *opt.turn_lead > Sm90::kMaxNTiles))
    throw Error(fmt::format("plan: turn_lead = {} is not in 0..{}", *opt.turn_lead, Sm90::kMaxNTiles));
  if (opt.store_stages && *opt.store_stages != 1 && *opt.store_stages != 2)
    throw Error(fmt::format("plan: store_stages = {} is not 1 or 2 (TMA-store staging buffers per output)", *opt.store_stages));
  if (opt.ring_stages && (*opt.ring_stages < 2 || *opt.ring_stages > Sm90::kMaxRingStages))
    throw Error(fmt::format("plan: ring_stages = {} is not in 2..{}", *opt.ring_stages, Sm90::kMaxRingStages));
  if (opt.k_splits && (*opt.k_splits < 1 || *opt.k_splits > Sm90::kMaxKSplits))
    throw Error(fmt::format("plan: k_splits = {} is not in 1..{}", *opt.k_splits, Sm90::kMaxKSplits));
  if (opt.k_splits && *opt.k_splits > plan_detail::ceil_div64(p.k, Sm90::kTileK))
    throw Error(fmt::format("plan: k_splits = {}: K = {} has only {} k-blocks of {}", *opt.k_splits, p.k,
                            plan_detail::ceil_div64(p.k, Sm90::kTileK), Sm90::kTileK));
  if (opt.cluster_m && *opt.cluster_m > 1 && s.reduction_count() == 0) {
    if (opt.cluster_n && *opt.cluster_n > 1)
      throw Error("plan: clusters along M (cluster_m) or along N (cluster_n), not both");
    const int tn = opt.tile_n.value_or(128);
    if (s.b_layout == BLayout::KN && tn / 64 < *opt.cluster_m)
      throw Error(fmt::format("plan: B is K x N: a cluster of {} along M multicasts B in 64-column boxes, one per "
                              "CTA at least, so tile_n must be >= {} (got {})",
                              *opt.cluster_m, 64 * *opt.cluster_m, tn));
  }
  if (rg && (s.reduction_count() > 0 || opt.k_splits) && (opt.cluster_n || opt.strategy))
    throw Error("plan: row groups (cluster_m, row_group, k_splits, splits_in_cluster, aggregation l2) do not combine "
                "with a forced cluster_n or strategy (those pick the DSMEM search)");
  if (opt.cluster_m && *opt.cluster_m > 1 && s.reduction_count() > 0 && !opt.cluster_n && opt.aggregation &&
      *opt.aggregation != Aggregation::L2Exchange)
    throw Error(fmt::format("plan: cluster_m = {} with a DSMEM aggregation: clusters along M meet in L2 (row groups); "
                            "a 2-D DSMEM cluster takes cluster_n too",
                            *opt.cluster_m));
  if (opt.cluster_m && *opt.cluster_m != 1 && *opt.cluster_m != 2)
    throw Error(fmt::format("plan: cluster_m = {} is not 1 or 2", *opt.cluster_m));
  if (opt.row_group && (*opt.row_group < 1 || *opt.row_group > Sm90::kMaxRowGroup || !is_pow2(*opt.row_group)))
    throw Error(fmt::format("plan: row_group = {} is not a power of two in 1..{}", *opt.row_group, Sm90::kMaxRowGroup));
  if (opt.stash_bytes && *opt.stash_bytes != 2 && *opt.stash_bytes != 4)
    throw Error(fmt::format("plan: stash_bytes = {} is not 2 (bf16) or 4 (fp32)", *opt.stash_bytes));
  if (opt.strategy && s.reduction_count() == 0 && *opt.strategy != RowStrategy::NoReduction)
    throw Error(fmt::format("plan: strategy {} asked for, but the epilogue has no reduction", name_of(*opt.strategy)));
  if (opt.strategy && s.reduction_count() > 0 && *opt.strategy == RowStrategy::NoReduction)
    throw Error("plan: strategy no-reduction asked for, but the epilogue has reductions");
}

// ---- 3. plan_kind ----------------------------------------------------------------------------
enum class PlanKind { Elementwise, RowGroups, Dsmem };

PlanKind plan_kind(const ChainInfo& chain, const DeviceModel& dev, const PlannerTunables& tun, const PlanOptions& opt) {
  if (chain.reductions == 0) return PlanKind::Elementwise;
  // A DSMEM option forced keeps the DSMEM search; so does a chain the row-group model does not
  // price (several tile values alive) or a device without multi-tile rows.
  const bool dsmem_forced =
      opt.cluster_n || opt.strategy || (opt.aggregation && *opt.aggregation != Aggregation::L2Exchange);
  if (chain.live_tile_values <= 1 && dev.multi_tile_rows && tun.use_row_groups && !dsmem_forced)
    return PlanKind::RowGroups;
  return PlanKind::Dsmem;
}

// ---- 4. decide -------------------------------------------------------------------------------
// Row groups that fit nothing (e.g. more N-tiles per CTA than the kernel walks) fall back to
// the DSMEM search unless they were asked for.
std::vector<Candidate> decide(PlanKind kind, const Request& r, Rejections& why) {
  switch (kind) {
    case PlanKind::Elementwise: return plan_detail::decide_elementwise(r, why);
    case PlanKind::RowGroups: {
      std::vector<Candidate> c = plan_detail::decide_row_groups(r, why);
      return c.empty() && !plan_detail::row_groups_forced(r.opt) ? plan_detail::decide_cluster(r, why) : c;
    }
    case PlanKind::Dsmem: return plan_detail::decide_cluster(r, why);
  }
  return {};
}

// Whether a stage of the spec holds a rotate_half; `recomputing`: one that evaluates its operand
// again at the partner fragment (not in place: spec.h rotate_in_place). rotate_pairs reads its
// partner from the same fragment.
bool holds_rotate_half(const Spec& st, bool recomputing) {
  for (size_t i = 0; i < st.nodes.size(); ++i) {
    const SpecNode& n = st.nodes[i];
    if (n.category == NodeCategory::Compute && n.compute == ComputeKind::RotateHalf &&
        !(recomputing && rotate_in_place(st, static_cast<int>(i))))
      return true;
  }
  for (const Spec& c : st.children)
    if (holds_rotate_half(c, recomputing)) return true;
  return false;
}

// The elementwise deciders' plans with tile_n forced to `width` (the request's own options else).
std::vector<Candidate> elementwise_of_width(const Request& r, int width, Rejections& why) {
  PlanOptions forced = r.opt;
  forced.tile_n = width;
  return decide(PlanKind::Elementwise, Request{r.spec, r.p, r.dev, r.tun, forced, r.chain}, why);
}

// Per-segment reductions (ChainInfo::segment): plans whose tiles span one segment and finish it
// alone, each made a reducing kernel (KernelConfig::row_segment; check() holds it to one segment
// a tile, one N-tile a job). The row-group decider's first: a whole-row norm's divisions less the
// exchange, at decode its measured split rows (its epilogue priced at the elementwise rate, as
// ChainInfo::reductions is 0 here); but not its split-K on 128-row PingPong tiles, which no
// measurement chose and ptxas spills (52 B for a per-head RMSNorm at 256 x 4096 x 4096). Then the
// elementwise deciders' (64-column segments: theirs alone, the row-group decider prices a 64-wide
// plain tile only where forced); where none spans one segment, the deciders again with that width forced.
// Rotations and periodic operands without a reduction: the elementwise plans whose tiles span
// whole runs, nothing reduced.
std::vector<Candidate> segment_tiles(std::vector<Candidate> cands, const Request& r, Rejections& why) {
  const int seg = static_cast<int>(r.chain.segment);
  if (r.spec.reduction_count() == 0) {
    // rotate_half or periodic operands alone: any elementwise plan whose tiles span whole runs
    // (n0 a multiple of tile_n, so of the segment); where none, the deciders with the narrowest
    // such width forced.
    std::vector<Candidate> out;
    for (Candidate& c : cands)
      if (c.k.tile_n % seg == 0) out.push_back(std::move(c));
    if (out.empty() && !r.opt.tile_n) {
      const int width = *std::find_if(std::begin(kTileNs), std::end(kTileNs), [&](int t) { return t % seg == 0; });
      for (Candidate& c : elementwise_of_width(r, width, why))
        if (c.k.tile_n % seg == 0) out.push_back(std::move(c));
    }
    return out;
  }
  auto keep = [&](std::vector<Candidate> in, bool row_groups) {
    std::vector<Candidate> out;
    for (Candidate& c : in) {
      if (c.k.tile_n != seg) continue;
      if (row_groups && !r.opt.k_splits && c.k.k_splits > 1 && c.k.epi_rows() == 128) continue;
      c.k.row_reduction = true;
      c.k.row_segment = seg;
      if (const char* no = check(c.k)) why.add("per-segment reduction", no);
      else out.push_back(std::move(c));
    }
    return out;
  };
  // A rotate_half after a per-segment norm whose operand is not in place (spec.h
  // rotate_in_place; Qwen 3's q/k norms then RoPE take it in place) evaluates that operand again
  // at the partner fragment: on 128-row PingPong tiles ptxas spilled 600-660 B (64-row tiles:
  // none), so the elementwise deciders' 64-row plans only, whose mainloop is slow at many rows
  // (row_tile_rate). MEASURED on the H100 at 8192 x 4096 x 4096 before the in-place rotation:
  // the 64x128 plan 2.19x cuBLAS, 128x128 PingPong with the spill 1.23x, cooperative 128x128
  // 1.28x. The row-group decider's 64-row divisions price the rotary's cos and sin as
  // latency-bound passes of a many-tile job (78.5 us against the elementwise deciders' 52.6 at
  // 1024 x 4096 x 4096): the elementwise deciders' plans for every rotating spec.
  std::vector<Candidate> kept = seg == 64 || holds_rotate_half(r.spec.root, false)
                                    ? std::vector<Candidate>{}
                                    : keep(plan_detail::decide_row_groups(r, why), true);
  for (Candidate& c : keep(std::move(cands), false)) kept.push_back(std::move(c));
  if (kept.empty() && !r.opt.tile_n) kept = keep(elementwise_of_width(r, seg, why), false);
  if (holds_rotate_half(r.spec.root, true) && !r.opt.tile_m) {
    std::vector<Candidate> rows64;
    for (Candidate& c : kept)
      if (c.k.epi_rows() == 64) rows64.push_back(c);
    if (!rows64.empty()) kept = std::move(rows64);
  }
  // In place, the rotation after a per-head norm fits 128-row tiles, but not beside the state of
  // the tile inputs (cos and sin) that a warp group's first job holds through its mainloop where
  // it begins early: ptxas spilled 272 B at 300 x 3072 x 512, none without. Those begin in the
  // epilogue.
  if (holds_rotate_half(r.spec.root, false))
    for (Candidate& c : kept)
      if (c.k.epi_rows() == 128) c.k.begin_early = false;
  return kept;
}

// ---- 5. compare ------------------------------------------------------------------------------
// Within near_tie of the cheapest, the model is not trusted to tell candidates apart: prefer the
// simpler strategy (on-chip, then SMEM stash, then workspace; fp32 before a bf16 stash of x
// itself: no workspace, exact intermediates; a centered one rounds like the outputs), then the
// smaller cluster.
int simplicity(const Candidate& c) {
  const RowStrategy s = c.strategy();
  const int rank = s == RowStrategy::SmemStash ? 2 : s == RowStrategy::WorkspaceStash ? 4 : 0;
  return rank + (c.k.stash_elem_bytes == 2 && !c.k.stash_centers ? 1 : 0);
}

const Candidate& compare(const std::vector<Candidate>& cs, double near_tie) {
  if (!cs.front().why.empty()) return cs.front();  // decided by measurement or the decider's own model
  const Candidate* best = &cs.front();
  for (const Candidate& c : cs)
    if (c.est.total_us < best->est.total_us) best = &c;
  const Candidate* chosen = best;
  auto key = [](const Candidate* c) { return std::make_tuple(simplicity(*c), c->k.cluster_n, c->est.total_us); };
  for (const Candidate& c : cs)
    if (c.est.total_us <= best->est.total_us * (1 + near_tie) && key(&c) < key(chosen)) chosen = &c;
  return *chosen;
}

// ---- 6. assemble -----------------------------------------------------------------------------
// Whether the plan's max-and-sum-of-exp pair can keep the exp it sums (OneRoundPairs::kept_exp,
// unless --pair-exp again): a pair in one round over one N-tile whose exp is reused.
bool pair_can_keep_exp(const Plan& plan, const ChainInfo& chain) {
  return plan.fused_pairs.max_exp_sum && one_round_pairs_possible(plan).kept_exp &&
         chain.max_exp_sum_pairs_keeping_exp > 0;
}

// Forced options that change nothing in this plan, said so (not an error: a run's options apply
// to every region of a graph, and the frontend's to every region of a model).
std::string unused_forced_options(const Plan& plan, const ChainInfo& chain, const PlanOptions& opt) {
  std::vector<std::string> idle;
  if (opt.poll_backoff && *opt.poll_backoff && plan.kernel.aggregation != Aggregation::L2Exchange)
    idle.push_back("--poll-pause on (no row's CTAs meet in L2)");
  if (opt.turn_lead && *opt.turn_lead > 0 && !plan.kernel.tile_turns())
    idle.push_back(fmt::format("--turn-lead {} ({})", *opt.turn_lead,
                               plan.kernel.n_tiles == 1 ? "one N-tile a job"
                               : plan.kernel.wgs_per_tile != 1 || plan.kernel.consumer_wgs != 2
                                   ? "not two PingPong consumers"
                                   : "a lead of n_tiles or more is a job at a time"));
  if (opt.split_gather_in_smem && !*opt.split_gather_in_smem && !plan.kernel.splits_through_l2())
    idle.push_back("--split-k-gather registers (no split-K through L2)");
  if (opt.fuse_pairs && *opt.fuse_pairs && !plan.fused_pairs.any())
    idle.push_back("--pairs one-round (no pair of reductions shares a round in this plan)");
  if (opt.keep_pair_exp && !*opt.keep_pair_exp && !pair_can_keep_exp(plan, chain))
    idle.push_back("--pair-exp again (no max-and-sum-of-exp pair in one round over one N-tile keeps its exp)");
  if (opt.aggregation && *opt.aggregation != plan.kernel.aggregation)
    idle.push_back(fmt::format("--aggregation {} (the plan's: {})", option_word(*opt.aggregation),
                               plan.kernel.aggregation == Aggregation::None ? "none, no reduction crosses a CTA"
                                                                            : name_of(plan.kernel.aggregation)));
  if (opt.row_group && *opt.row_group != plan.kernel.row_group)
    // (the row-group decider takes a forced group as it is: only other aggregations drop it)
    idle.push_back(fmt::format("--row-group {} ({})", *opt.row_group,
                               plan.kernel.aggregation == Aggregation::None ? "no reduction crosses a CTA"
                                                                            : "a row is one cluster, over DSMEM"));
  if (opt.store_stages && !chain.has_tile_output)
    idle.push_back(fmt::format("--store-stages {} (no tile output is stored through SMEM)", *opt.store_stages));
  if (opt.stash_bytes && plan.kernel.stash_elem_bytes == 0)
    idle.push_back(fmt::format("--stash {} (nothing is stashed; the measured plans it rules out stay out)",
                               *opt.stash_bytes == 2 ? "bf16" : "fp32"));
  if (idle.empty()) return "";
  std::string o = "forced options this plan does not use:";
  for (size_t i = 0; i < idle.size(); ++i) o += (i ? ", " : " ") + idle[i];
  return o;
}

Plan assemble(const Candidate& c, const std::vector<Candidate>& cands, const Request& r, const std::string& unforced) {
  const ChainInfo& chain = r.chain;
  const KernelConfig& k = c.k;
  Plan plan;
  plan.problem = r.p;
  plan.kernel = k;
  std::string no_ring;
  plan.kernel.ring_input_bytes = c.ring_inputs_declined ? 0 : plan_detail::ring_input_bytes(r.spec, k, r.opt, &no_ring);
  if (r.opt.ring_inputs && *r.opt.ring_inputs && plan.kernel.ring_input_bytes == 0)
    throw Error(fmt::format("plan: tile inputs in the mainloop's ring were asked for, but {}", no_ring));
  if (r.opt.splits_in_cluster && *r.opt.splits_in_cluster && !k.splits_in_cluster)
    throw Error("plan: split-K's partials over DSMEM (the K-splits in one cluster) were asked for, but the plan has no "
                "split-K: force k_splits >= 2 (the splits of a tile are one hardware cluster of at most 16 CTAs, with "
                "no multicast along M)");
  // All of M in one row block's fewer rows (decode): A's boxes hold only those (KernelConfig::a_box_rows).
  if (const int rows = align_up(static_cast<int>(std::min<int64_t>(r.p.m, k.tile_m)), 8); rows < k.tile_m && k.a_slices() == 1)
    plan.kernel.a_box_rows = rows;
  // Split-K through L2: the owner's whole warp group sums the partial rows in SMEM
  // (KernelConfig::split_gather_rows: decode rows, or the whole tile), their loads in flight
  // together, by default where they fit beside the ring as planned, not at a ring stage's cost
  // (measured 1-7% faster than each thread's own loads at whole 64x64 tiles,
  // bench/sweeps/split_gather_whole_tiles.txt). Where asked for (--split-k-gather smem), the ring
  // gives up the stages the staging needs.
  std::string ring_note;  // a reason line where the forced staging shrank the ring
  if (r.opt.split_gather_in_smem.value_or(true)) {
    KernelConfig with = plan.kernel;
    with.split_gather_rows = with.split_gather_rows_wanted();
    const bool asked = r.opt.split_gather_in_smem.value_or(false);
    if (with.splits_through_l2() && asked) plan_detail::deepest_ring(with, r.dev.smem_per_cta_bytes, with.ring_stages);
    const char* refused = with.splits_through_l2() ? check(with) : nullptr;
    const bool over = with.smem_bytes() > r.dev.smem_per_cta_bytes;
    const bool fits = with.splits_through_l2() && !refused && !over;
    if (fits) {
      if (with.ring_stages < plan.kernel.ring_stages)
        ring_note = fmt::format("ring {} -> {} stages: the forced staging of split-K's partial rows (the estimate "
                                "is the {}-stage plan's)",
                                plan.kernel.ring_stages, with.ring_stages, plan.kernel.ring_stages);
      plan.kernel = with;
    } else if (asked) {
      throw Error(fmt::format(
          "plan: split-K's partial rows summed in SMEM were asked for, but {}",
          !with.splits_through_l2() ? "the plan has no split-K through L2 (force k_splits >= 2, the partials through L2)"
          : over ? fmt::format("their {} B beside a {}-stage ring exceed the SMEM a CTA may use",
                               with.consumer_wgs * with.split_gather_bytes(), with.ring_stages)
                 : std::string(refused)));
    }
  }
  plan.fused_pairs = plan_detail::fuse_pairs(chain, r.opt, k);
  plan.fused_pairs.kept_exp = pair_can_keep_exp(plan, chain) && r.opt.keep_pair_exp.value_or(true);
  plan.kernel.pair_hand_over = plan_detail::pair_hand_over(plan.fused_pairs, r.p.m, plan.kernel);
  {  // two jobs' tiles in turn (KernelConfig::turn_lead), where jobs hold several N-tiles
    KernelConfig with = plan.kernel;
    with.turn_lead =
        std::min(r.opt.turn_lead.value_or(turn_lead_wanted(plan.kernel, plan_detail::jobs_a_cta(c))), plan.kernel.n_tiles);
    if (with.tile_turns()) plan.kernel.turn_lead = with.turn_lead;
  }
  // The row groups' candidates fitted their ring with this already (decide_row_groups.cpp); the
  // others keep no pair storage on chip.
  if (plan_detail::epilogue_smem_bytes(chain, plan.kernel) != plan.kernel.epilogue_smem_bytes)
    throw Error(fmt::format("plan: internal error: the epilogue's SMEM with the pair hand-over ({} B) is not what the "
                            "ring was fitted with ({} B)",
                            plan_detail::epilogue_smem_bytes(chain, plan.kernel), plan.kernel.epilogue_smem_bytes));
  // TMA-store staging in two buffers (KernelConfig::store_stages) where they fit beside the ring
  // as planned and a tile has several 64-column subtiles (one subtile's store is waited for at the
  // next tile's begin either way); where asked for (--store-stages 2) the ring gives up the stages
  // they need.
  if (chain.has_tile_output) {
    KernelConfig with = plan.kernel;
    with.store_stages = r.opt.store_stages.value_or(with.tile_n > 64 ? kStoreStagesWhereFree : 1);
    with.epilogue_smem_bytes = plan_detail::epilogue_smem_bytes(chain, with);
    const int before = with.ring_stages;
    if (r.opt.store_stages) plan_detail::deepest_ring(with, r.dev.smem_per_cta_bytes, before);
    const char* refused = check(with);
    const bool over = with.smem_bytes() > r.dev.smem_per_cta_bytes;
    if (!refused && !over) {
      if (with.ring_stages < before)
        ring_note += fmt::format("{}ring {} -> {} stages: the forced second staging buffer of each output (the "
                                 "estimate is the {}-stage plan's)",
                                 ring_note.empty() ? "" : "; ", before, with.ring_stages, before);
      plan.kernel = with;
    } else if (r.opt.store_stages) {
      throw Error(fmt::format("plan: {} TMA-store staging buffers per output were asked for, but {}", *r.opt.store_stages,
                              refused ? std::string(refused)
                                      : fmt::format("they do not fit beside a ring of two stages ({} B of {})",
                                                    with.smem_bytes(), r.dev.smem_per_cta_bytes)));
    }
  }
  plan.raster_group = c.raster_group;
  plan.raster_along_n = c.raster_along_n;
  plan.measured_config = c.why;
  plan.reductions = chain.reductions;
  plan.stages_in_chain = chain.stages_in_chain;
  plan.smem = plan_detail::smem_budget(plan.kernel);
  plan.smem_limit = r.dev.smem_per_cta_bytes;
  plan.tiles_m = c.tiles_m, plan.tiles_n = c.tiles_n;
  plan.clusters_resident = r.dev.resident(k.hw_cluster_size());
  plan.ctas_busy = plan.clusters_resident * k.hw_cluster_size();
  if (k.stash_elem_bytes > 0) plan.stashed = chain.stash_names;
  plan.live_tile_values = chain.live_tile_values;
  plan.regs_per_thread = c.regs;
  plan.store_subtile_n = chain.has_tile_output ? std::min(k.tile_n, r.tun.store_subtile_n) : 0;
  plan.jobs = c.jobs;
  plan.grid_ctas = int64_t{c.resident} * k.cluster_size();
  plan.workspace_bytes = c.workspace;
  plan.estimate = c.est;

  // Runners-up: the best candidate of each other (tile, cluster, row group, strategy), cheapest first.
  std::vector<const Candidate*> sorted;
  for (const Candidate& x : cands) sorted.push_back(&x);
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const Candidate* a, const Candidate* b) { return a->est.total_us < b->est.total_us; });
  auto key = [](const Candidate* x) {
    return std::make_tuple(x->k.cluster_m, x->k.cluster_n, x->k.row_group, static_cast<int>(x->strategy()),
                           x->k.stash_elem_bytes, x->k.k_splits);
  };
  std::set<decltype(key(&c))> seen{key(&c)};
  for (const Candidate* x : sorted)
    if (seen.insert(key(x)).second && plan.alternatives.size() < 5) plan.alternatives.push_back(x->describe());

  plan.gpu = r.dev.gpu;
  plan_detail::add_reasons(plan, chain, r.dev, r.tun, r.opt, unforced);
  if (!ring_note.empty()) plan.reasons.push_back(ring_note);
  if (const std::string idle = unused_forced_options(plan, chain, r.opt); !idle.empty()) plan.reasons.push_back(idle);
  return plan;
}

bool any_forced(const PlanOptions& o) {
  return o.cluster_n || o.tile_n || o.tile_m || o.strategy || o.aggregation || o.cluster_m || o.row_group ||
         o.stash_bytes || o.k_splits || o.ring_stages || o.ring_inputs || o.split_gather_in_smem || o.store_stages;
}

}  // namespace

Plan make_plan(const FusionSpec& s, const Problem& p, const DeviceModel& dev, const PlannerTunables& tun,
               const PlanOptions& opt) {
  check_request(s, p, dev, opt);                                           // 1
  const ChainInfo chain = plan_detail::analyze_chain(s);                    // 2
  const Request r{s, p, dev, tun, opt, chain};
  const PlanKind kind = plan_kind(chain, dev, tun, opt);                    // 3
  Rejections why;
  std::vector<Candidate> cands = decide(kind, r, why);                      // 4
  if (chain.segment > 0) cands = segment_tiles(std::move(cands), r, why);
  if (cands.empty()) {
    if (kind == PlanKind::RowGroups && plan_detail::row_groups_forced(opt))
      throw Error(fmt::format("plan: no row-group plan (PingPong 64x256, 128x128 or 64x128 (64x64 gated or forced), or "
                              "cooperative 128x256 without split-K; clusters of 1 or 2 along M; row groups of 1..64 "
                              "clusters resident at once; <= 64 N-tiles per CTA) fits the forced options for {} x {} x {}:{}", p.m, p.n, p.k, why.str()));
    throw Error(fmt::format("plan: nothing fits for {} x {} x {} ({} reductions{}):{}", p.m, p.n, p.k,
                            s.reduction_count(), s.segment ? fmt::format(" over runs of {} columns", s.segment) : "",
                            why.str()));
  }
  const Candidate& chosen = compare(cands, tun.near_tie);             // 5
  // When an option was forced, say what the planner alone would have picked.
  std::string unforced;
  if (any_forced(opt)) {
    try {
      PlanOptions planner_alone;
      planner_alone.fuse_pairs = opt.fuse_pairs;
      planner_alone.keep_pair_exp = opt.keep_pair_exp;
      const Plan free = make_plan(s, p, dev, tun, planner_alone);
      unforced = fmt::format("{} {}x{}, cluster {}x{}{}{}, {}, {} ring stages: est {:.1f} us",
                             free.kernel.schedule(), free.kernel.tile_m,
                             free.kernel.tile_n, free.kernel.cluster_m, free.kernel.cluster_n,
                             free.kernel.row_group > 1 ? fmt::format(" in row groups of {}", free.kernel.row_group) : "",
                             free.kernel.k_splits > 1 ? fmt::format(", split-K {}", free.kernel.k_splits) : "",
                             name_of(free.strategy()), free.kernel.ring_stages, free.estimate.total_us);
    } catch (const Error&) {
      unforced = "nothing (no plan without the forced options)";
    }
  }
  return assemble(chosen, cands, r, unforced);                              // 6
}

Plan make_plan(const FusionSpec& s, const Problem& p, const PlanOptions& opt) {
  return make_plan(s, p, device_model(opt.gpu), PlannerTunables{}, opt);
}

double planned_dram_bytes_per_s(Gpu gpu) { return device_model(gpu).dram_bytes_per_s; }

const char* stash_centers_refused(const FusionSpec& s, const Plan& p) {
  if (!p.kernel.stash_centers) return nullptr;
  if (!plan_detail::stash_centers_possible(plan_detail::analyze_chain(s), p.fused_pairs, p.kernel.n_tiles))
    return "its stash is centered (stash_centers), which needs the root stage's pair in one round over several N-tiles "
           "and no later stage writing a tile value back into the stash";
  return nullptr;
}

}  // namespace comfuse
