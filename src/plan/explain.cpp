// explain(): the plan as text for `comfuse explain`: problem, tiles, grid, cluster,
// strategy, aggregation, the stage chain (one line per stage), the SMEM budget with the
// unified reduction buffer, the reasons and the runner-up candidates.
#include <fmt/format.h>

#include "plan_internal.h"

namespace comfuse {

using plan_detail::fmt_bytes;

namespace {

// "x (n2)" when the node has an origin name, else "n2".
std::string named(const Spec& st, int i) {
  std::string v = plan_detail::value_name(st, i);
  return v == fmt::format("n{}", i) ? v : fmt::format("{} (n{})", v, i);
}

std::string stage_line(const FusionSpec& s, const std::vector<plan_detail::StageRef>& stages, size_t idx) {
  const plan_detail::StageRef& ref = stages[idx];
  const Spec& st = *ref.spec;
  std::string head = fmt::format("stage {}", idx + 1);
  if (ref.parent >= 0) {
    const Spec& parent = *stages[static_cast<size_t>(ref.parent)].spec;
    head += fmt::format(" (PostOp of {} in stage {})", plan_detail::node_label(s, parent, ref.parent_reduction),
                        ref.parent + 1);
  }
  std::string nodes;
  for (int i = 0; i < static_cast<int>(st.nodes.size()); ++i)
    nodes += fmt::format("{}n{} {}", i ? "; " : "", i, plan_detail::node_label(s, st, i));

  std::string term = "none";
  if (st.terminal >= 0 && st.terminal < static_cast<int>(st.nodes.size())) {
    const SpecNode& t = st.nodes[static_cast<size_t>(st.terminal)];
    term = t.category == NodeCategory::Reduction
               ? fmt::format("reduces {} -> PostOp", plan_detail::node_label(s, st, st.terminal))
               : plan_detail::node_label(s, st, st.terminal);
  }
  std::string in, out;
  for (const SpecNode& n : st.nodes)
    if (n.category == NodeCategory::Placeholder && n.placeholder == PlaceholderKind::Bypass && ref.parent >= 0)
      in += (in.empty() ? "" : "; ") + named(*stages[static_cast<size_t>(ref.parent)].spec, n.source);
  for (const Spec& child : st.children)
    for (const SpecNode& n : child.nodes)
      if (n.category == NodeCategory::Placeholder && n.placeholder == PlaceholderKind::Bypass)
        out += (out.empty() ? "" : "; ") + named(st, n.source);
  return fmt::format("  {}: {} node(s): {} | terminal: {} | bypass in: {} | bypass out: {}", head,
                     st.nodes.size(), nodes, term, in.empty() ? "-" : in, out.empty() ? "-" : out);
}

}  // namespace

std::string explain(const FusionSpec& s, const Plan& p) {
  const Problem& pr = p.problem;
  const int ab = static_cast<int>(size_of(pr.ab_dtype));
  std::string o;
  o += fmt::format("plan for fusion '{}'\n", s.name);
  o += fmt::format("  problem      M={} N={} K={}, A/B {}, B layout {}\n", pr.m, pr.n, pr.k, name_of(pr.ab_dtype),
                   s.b_layout == BLayout::NK ? "nk (N x K)" : "kn (K x N)");
  o += fmt::format("  gpu          {}{}\n", name_of(p.gpu),
                   p.gpu == Gpu::H200 ? "" : " (the H100's model over the H200's numbers: src/plan/calibration.cpp device_model)");
  o += fmt::format("  tiles        {}x{}x{} ({}), {} x {} = {} tiles\n", p.kernel.tile_m, p.kernel.tile_n, Sm90::kTileK,
                   p.kernel.wgs_per_tile == 1 ? "PingPong: one consumer warp group per tile"
                                       : "cooperative: both consumer warp groups on one tile",
                   p.tiles_m, p.tiles_n, p.tiles_m * p.tiles_n);
  if (p.kernel.gated) {
    const int gate = s.arg_index(ArgRole::OperandGate), b = s.arg_index(ArgRole::OperandB);
    o += fmt::format("  gated        one {}-column wgmma a k-block: {} columns of {} then the same of {} (one B tile, "
                     "A's tiles shared)\n",
                     p.kernel.mma_n(), p.kernel.tile_n, b >= 0 ? s.describe(s.args[static_cast<size_t>(b)].name) : "B",
                     gate >= 0 ? s.describe(s.args[static_cast<size_t>(gate)].name) : "the gate");
  }
  o += fmt::format("  grid         persistent, {} CTAs = {} cluster(s) of {}x{} ({} resident at most, {} SMs "
                   "busy); {} job(s)\n",
                   p.grid_ctas, p.grid_ctas / std::max(1, p.kernel.hw_cluster_size()), p.kernel.hw_cluster_x(), p.kernel.cluster_n,
                   p.clusters_resident, p.ctas_busy, p.jobs);
  o += fmt::format("  cluster      {}x{} (C_N = {}), {} N-tile(s) per CTA, multicast A: {}, multicast B: {}, raster "
                   "{} x {}\n", p.kernel.cluster_m, p.kernel.cluster_n, p.kernel.cluster_n, p.kernel.n_tiles, (p.kernel.cluster_n > 1) ? "yes" : "no",
                   p.kernel.cluster_m > 1 ? "yes" : "no", p.raster_group, p.raster_along_n ? "N-blocks" : "M-blocks");
  if (p.kernel.row_group > 1)
    o += fmt::format("  row group    {} clusters share each row ({} CTAs along N), {}\n", p.kernel.row_group,
                     p.kernel.row_group * p.kernel.cluster_n,
                     p.kernel.cross_cta_reduction() ? "partials meet in L2"
                                                    : "each its own N-tiles (no row reduction across them: nothing to exchange)");
  if (p.kernel.row_segment > 0)
    o += fmt::format("  segments     each row reduction spans one {}-column run of N (a head), one tile's columns: the "
                     "tile finishes its rows alone by warp shuffles, nothing crosses a CTA\n",
                     p.kernel.row_segment);
  if (p.kernel.row_segment == 0 && s.segment > 0)
    o += fmt::format("  segments     the epilogue works on {}-column runs of N (heads: rotate_half, periodic operands); "
                     "each {}-column tile spans whole runs\n",
                     s.segment, p.kernel.tile_n);
  if (p.kernel.splits_in_cluster)
    o += fmt::format("  split-K      the {} CTAs of one hardware cluster share each tile's K ({} k-blocks each); rank 0 "
                     "adds the others' partial tiles (rows < M, fp32, over DSMEM, in rank order) and runs the epilogue\n",
                     p.kernel.k_splits, plan_detail::ceil_div64(plan_detail::ceil_div64(pr.k, Sm90::kTileK), p.kernel.k_splits));
  else if (p.kernel.k_splits > 1)
    o += fmt::format("  split-K      {} clusters share each tile's K ({} k-blocks each); split 0 adds the others' "
                     "partial tiles (rows < M, {}, through the L2 workspace, in split order) and runs the epilogue\n",
                     p.kernel.k_splits, plan_detail::ceil_div64(plan_detail::ceil_div64(pr.k, Sm90::kTileK), p.kernel.k_splits),
                     p.kernel.split_words_tagged() ? "fp32 in 8-byte words that carry their split's tag: no flag to wait for"
                                                   : "fp32 behind a flag each split releases");
  std::string strat(name_of(p.strategy()));
  if (p.strategy() == RowStrategy::SmemStash || p.strategy() == RowStrategy::WorkspaceStash) {
    std::string vals;
    for (const std::string& v : p.stashed) vals += (vals.empty() ? "" : "; ") + v;
    strat += fmt::format(" ({} {}{})", plan_detail::stash_type_name(p.kernel), vals.empty() ? "nothing" : vals,
                         p.strategy() == RowStrategy::WorkspaceStash ? ", workspace " + fmt_bytes(p.workspace_bytes) : "");
  }
  o += fmt::format("  strategy     {}\n", strat);
  if (p.kernel.stash_centers && !p.stashed.empty())
    o += "  precision    the bf16 stash holds each value less its row's running max or mean after its tile (kept "
         "beside it): the rounding falls on that distance, no coarser than the bf16 outputs; the pair's statistics "
         "come from the unrounded values (--stash fp32 keeps every bit)\n";
  else if (p.kernel.stash_elem_bytes == 2 && !p.stashed.empty())
    o += "  precision    the bf16 stash (requested) rounds the stashed value between stages, as an unfused bf16 "
         "intermediate would: where a later stage subtracts a row mean (LayerNorm), a mean large against the "
         "row's spread loses those bits (--stash fp32 keeps them)\n";
  o += fmt::format("  aggregation  {}{}\n", name_of(p.kernel.aggregation),
                   p.fused_pairs.mean_variance && p.fused_pairs.max_exp_sum ? "; paired reductions in one round"
                   : p.fused_pairs.mean_variance ? "; mean and variance in one round"
                   : p.fused_pairs.max_exp_sum   ? "; max and sum of exp in one round"
                                                 : "");
  o += fmt::format("  pipeline     {} stages, {}, {} consumer warp groups{}\n", p.kernel.ring_stages,
                   p.kernel.schedule(), p.kernel.consumer_wgs,
                   !p.kernel.tile_turns()     ? std::string()
                   : p.kernel.turn_lead == 1 ? std::string("; two jobs' tiles in turn, a tile each (KernelConfig::turn_lead)")
                                             : fmt::format("; two jobs' tiles in turn, consumer 0's first {0} and "
                                                           "consumer 1's last {0} alone (KernelConfig::turn_lead)",
                                                           p.kernel.turn_lead));
  if (p.kernel.a_box_rows > 0)
    o += fmt::format("  A boxes      {} rows of the tile's {}: all of M (runs with M <= {}); TMA's time on rows past M "
                     "is not spent\n",
                     p.kernel.a_box_rows, p.kernel.tile_m, p.kernel.a_box_rows);
  if (const std::vector<int> inputs = s.root_tile_inputs(); !inputs.empty()) {
    std::string names;
    for (int a : inputs) names += (names.empty() ? "" : "; ") + s.describe(s.args.at(static_cast<size_t>(a)).name);
    o += p.kernel.ring_input_bytes > 0
             ? fmt::format("  tile inputs  {} in the ring: the producer loads each tile's {} by TMA into one more ring "
                           "slot after its k-blocks, the epilogue reads SMEM\n",
                           names, fmt_bytes(p.kernel.ring_input_bytes))
             : fmt::format("  tile inputs  {} from L2 (prefetched before the mainloop), each fragment's loads on the "
                           "epilogue's critical path\n",
                           names);
  }
  if (p.kernel.poll_backoff)
    o += "  polls        pause 100 ns between tries: every CTA is in its round at once and a row spans many, whose "
         "re-polls would flood the last peer's L2 lines (calibration.h poll_backoff_wanted)\n";
  if (p.kernel.store_stages > 1)
    o += fmt::format("  stores       {} staging buffers per output: a 64-column subtile's TMA store reads one while the "
                     "next subtile is written (calibration.h kStoreStagesWhereFree)\n",
                     p.kernel.store_stages);
  if (p.kernel.begin_early)
    o += "  begin        early: a warp group's first job issues its epilogue's vector loads into registers before its "
         "mainloop, its epilogue writing them to SMEM (one job a CTA: nothing else hides them)\n";
  o += fmt::format("  estimate     {:.1f} us (mainloop {:.1f}, exposed epilogue {:.1f}, reread {:.1f}, DRAM floor "
                   "{:.1f})\n",
                   p.estimate.total_us, p.estimate.mainloop_us, p.estimate.epilogue_us, p.estimate.reread_us,
                   p.estimate.dram_floor_us);
  if (p.estimate.low_us < p.estimate.total_us)
    o += p.kernel.k_splits > 1
             ? fmt::format("               as low as {:.1f} us: one-wave split-K plans measured up to {:.2f}x faster "
                           "than estimated (calibration.h one_wave_split_overestimate)\n",
                           p.estimate.low_us, p.estimate.total_us / p.estimate.low_us)
             : fmt::format("               as low as {:.1f} us: B streamed at the DRAM's long-stream rate, not the "
                           "short kernels' one-wave rate the estimate takes (calibration.h, one-wave long streams)\n",
                           p.estimate.low_us);

  const auto stages = plan_detail::collect_stages(s);
  if (s.segment > 0)
    o += fmt::format("stage chain: {} stage(s), {} reduction(s) over each {}-column run\n", p.stages_in_chain,
                     s.reduction_count(), s.segment);
  else
    o += fmt::format("stage chain: {} stage(s), {} reduction(s)\n", p.stages_in_chain, p.reductions);
  for (size_t i = 0; i < stages.size(); ++i) o += stage_line(s, stages, i) + "\n";

  const SmemBudget& b = p.smem;
  auto row = [&](const char* what, int bytes, const std::string& how) {
    o += fmt::format("  {:<26}{:>11}  {}\n", what, fmt_bytes(bytes), how);
  };
  o += "SMEM budget (per CTA):\n";
  row("mainloop ring", b.mainloop_ring,
      fmt::format("{} stages x ({}x{} A + {}x{} B) x {} B, one ring shared by both consumer WGs", p.kernel.ring_stages, p.kernel.tile_m,
                  Sm90::kTileK, p.kernel.mma_n(), Sm90::kTileK, ab));
  std::string red;
  if (p.kernel.row_segment > 0) red = "per-segment reductions finish inside the tile: nothing crosses a CTA";
  else if (p.reductions == 0) red = "no reduction";
  else if (p.kernel.aggregation == Aggregation::L2Exchange)
    red = fmt::format("{}: the {} CTAs of a row group exchange partials through an L2 workspace "
                      "(2 phases x {} peers x 2 x {} rows x 8-byte tagged words per WG slot), reused by all {} "
                      "reduction(s)",
                      b.reduction_buffer > 0
                          ? fmt::format("{} WGs x {} B where warps 2-3 merge a pair round's second row slots at "
                                        "decode rows and hand them over (l2_exchange_smem_bytes)",
                                        p.kernel.consumer_wgs, p.kernel.channel_smem_bytes())
                          : std::string("none on chip"),
                      p.kernel.row_group, p.kernel.row_group, p.kernel.tile_m / p.kernel.wgs_per_tile, p.reductions);
  else if (p.kernel.cluster_n == 1) red = "C_N = 1: rows reduce by warp shuffles, nothing crosses a CTA";
  else
    red = fmt::format("{} WGs x 2 phases x {} slots x {} rows x 4 B ({}), ONE buffer reused by all {} reduction(s)",
                      p.kernel.consumer_wgs, p.kernel.cluster_n, p.kernel.tile_m / p.kernel.wgs_per_tile,
                      p.kernel.aggregation == Aggregation::LeaderFollower
                          ? "leader uses C_N slots, followers 1; every CTA reserves the leader's size"
                          : "peer-to-peer: one slot per peer",
                      p.reductions);
  row("unified reduction buffer", b.reduction_buffer, red);
  row("stash", b.stash,
      p.strategy() == RowStrategy::SmemStash && b.stash > 0
          ? fmt::format("{} WGs x {} earlier tile(s) x {}x{} x {} value(s) x {} B{}", p.kernel.consumer_wgs, p.kernel.n_tiles - 1, p.kernel.tile_m,
                        p.kernel.tile_n, p.stashed.size(), p.kernel.stash_elem_bytes,
                        p.kernel.stash_centers ? " + their row centers (8 B a thread a 64-row block)" : "")
          : "-");
  row("store buffer", b.store_buffer,
      fmt::format("{} WGs x ({} x {}x{} staging sub-tile(s) per output, later stages' outputs through the first's where "
                  "the element size matches, + row vectors)",
                  p.kernel.consumer_wgs, p.kernel.store_stages, p.kernel.epi_rows(), p.store_subtile_n));
  if (b.split_hand_over > 0)
    row("split hand-over", b.split_hand_over,
        fmt::format("{} WGs x one warp's share of a partial tile (32 x {} fp32) + 2 mbarriers: split-K over DSMEM",
                    p.kernel.consumer_wgs, p.kernel.accumulators()));
  if (b.split_gather > 0)
    row("split gather", b.split_gather,
        fmt::format("{} WGs x {} rows x {} fp32: the other splits' partial rows, summed by the owner's whole warp group",
                    p.kernel.consumer_wgs, p.kernel.split_gather_rows, p.kernel.mma_n()));
  row("barriers", b.barriers, "mbarriers: ring, reduction channel per WG and phase, PingPong order, store");
  row("total", b.total(), fmt::format("of {} ({} free)", fmt_bytes(p.smem_limit), fmt_bytes(p.smem_limit - b.total())));

  return o + plan_detail::reason_lists(p.reasons, p.alternatives, "runner-up candidates");
}

}  // namespace comfuse

namespace comfuse::plan_detail {

std::string reason_lists(const std::vector<std::string>& reasons, const std::vector<std::string>& alternatives,
                         const char* alternatives_title) {
  std::string o = "reasons:\n";
  for (const std::string& r : reasons) o += "  - " + r + "\n";
  if (!alternatives.empty()) {
    o += fmt::format("{}:\n", alternatives_title);
    for (const std::string& a : alternatives) o += "  - " + a + "\n";
  }
  return o;
}

}  // namespace comfuse::plan_detail
