#pragma once
// Shared by planner.cpp, explain.cpp and dot.cpp: what the planner needs to know about a
// spec's stage chain, and short node labels for the human-facing printers.
#include <string>
#include <vector>

#include "comfuse/plan.h"
#include "comfuse/spec.h"

namespace comfuse::plan_detail {

// One stage of the nest, in SpecVisitor::walk order (depth first; the root is stage 0).
struct StageRef {
  const Spec* spec = nullptr;
  int depth = 0;
  int parent = -1;          // index into the stage list, -1 for the root
  int parent_reduction = -1;  // node index (in the parent) of the reduction whose PostOp this is
};
std::vector<StageRef> collect_stages(const FusionSpec& s);

struct ChainInfo {
  int reductions = 0;
  int stages_in_chain = 1;
  // Reduction pairs that can share one exchange round (pair_kind in spec.h, Plan::fused_pairs).
  int mean_variance_pairs = 0;
  int max_exp_sum_pairs = 0;
  int pairs() const { return mean_variance_pairs + max_exp_sum_pairs; }
  // Largest number of Tile-class Bypass placeholders entering any stage: tile-sized
  // register values that must survive a reduce phase (the accumulator counts as one).
  int live_tile_values = 1;
  // Tile-class values of stage 1 bypassed into stage 2: what a CTA walking several
  // N-tiles must keep for its earlier tiles (later stages recompute from these).
  std::vector<int> stash_nodes;  // node indices in the root stage
  std::vector<std::string> stash_names;
  // Epilogue instructions per tile element, summed over every stage (cost model).
  double ops_per_element = 0;
  bool has_tile_output = false;
  int max_out_bytes = 0;  // widest stored Tile output element
  // What the epilogue stages in SMEM per consumer WG (kernels/comfuse/epilogue/nodes.cuh):
  // each Store node a tile_m x 64 subtile of its dtype, each RowBroadcast tile_n floats.
  int store_bytes_per_row_of_64 = 0;  // sum over Store nodes of 64 * sizeof(dtype)
  int row_broadcasts = 0;
  // The same per stage: each stage's epilogue storage is its own 1024-aligned block.
  std::vector<std::pair<int, int>> stage_storage;  // (store bytes per row of 64, row broadcasts)
};
ChainInfo analyze_chain(const FusionSpec& s);

// "add(%1, %2)", "mean(%4)", "bias[row]", "2.5", ... (no stage prefix).
std::string node_label(const FusionSpec& s, const Spec& stage, int index);
// The origin name when the lowering recorded one, else "%index".
std::string value_name(const Spec& stage, int index);

std::string fmt_bytes(int64_t bytes);  // "40.0 KiB"

// Whether the options ask for a row-group plan (cluster_m, row_group, aggregation global).
bool row_groups_forced(const PlanOptions& opt);
// Which paired reductions share one exchange round (row_groups.cpp): where one N-tile per CTA
// and the row meets in L2 or in one CTA, every pair when forced (PlanOptions::fuse_pairs), else
// every pair where a round is saved (row_peers > 1) and the epilogue hides behind the other
// consumer's next job (>= 2 jobs per CTA).
OneRoundPairs fuse_pairs(const ChainInfo& chain, const PlanOptions& opt, int64_t n_tiles, int64_t jobs_per_cta,
                         AggregationMode agg, int row_peers);

// Row reductions over row groups of clusters along M (row_groups.cpp): the work division
// priced per candidate, cheapest first. The planner takes the first whose SMEM budget fits.
struct RowGroupChoice {
  int tile_m = 0, tile_n = 0, cluster_m = 1, row_group = 1, stash_elem = 0, ab_bytes = 2;
  int64_t n_tiles = 1, jobs = 0, groups = 0;
  double mainloop_us = 0, tail_us = 0, exchange_us = 0, est_us = 0;
  std::string describe() const;
};
std::vector<RowGroupChoice> row_group_candidates(const Problem& p, const ChainInfo& chain, const DeviceModel& dev,
                                                 const PlannerTunables& tun, const PlanOptions& opt);

// Fills plan.reasons: one line per choice (reasons.cpp). `unforced` describes what the
// model would have picked without the forced options ("" when nothing was forced).
void add_reasons(Plan& plan, const ChainInfo& chain, const DeviceModel& dev, const PlannerTunables& tun,
                 const PlanOptions& opt, const std::string& unforced);

}  // namespace comfuse::plan_detail
