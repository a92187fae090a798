// One reason line per planner choice. Kept apart from the search so the search stays
// about numbers and this file about words; explain() prints these verbatim.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "plan_internal.h"

namespace comfuse::plan_detail {
namespace {

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + v[i];
  return out;
}

}  // namespace

void add_reasons(Plan& plan, const ChainInfo& chain, const DeviceModel& dev, const PlannerTunables& tun,
                 const PlanOptions& opt, const std::string& unforced) {
  auto& r = plan.reasons;
  const Problem& p = plan.problem;
  const int64_t peers = int64_t{plan.kernel.cluster_n} * plan.kernel.row_group;  // CTAs that share a row
  const int64_t covered = peers * plan.kernel.tile_n * plan.kernel.n_tiles;
  const std::string ab = std::string(name_of(p.ab_dtype));

  if (!plan.measured_config.empty())
    r.push_back("why this configuration: " + plan.measured_config);
  if (plan.kernel.wgs_per_tile == 2)
    r.push_back(fmt::format("tile {}x{}x{}: cooperative, the {} consumer warp groups split one tile's rows ({} each); "
                            "the epilogue is not overlapped with a mainloop but both warp groups run theirs at once, "
                            "and the tile reads the fewest bytes a MAC{}", plan.kernel.tile_m, plan.kernel.tile_n, Sm90::kTileK,
                            plan.kernel.consumer_wgs, plan.kernel.tile_m / 2,
                            rows_off_128_byte_lines(p)
                                ? fmt::format(" (A's rows miss 128-byte lines, K = {}: every TMA box row straddles two)", p.k)
                                : std::string()));
  else r.push_back(fmt::format(
      "tile {}x{}x{}: PingPong, each of the {} consumer warp groups owns a {}x{} accumulator "
      "(~{} registers/thread with {} live tile value(s), limit {}); tile_k {} = one 128-byte {} row per TMA box{}",
      plan.kernel.tile_m, plan.kernel.tile_n, Sm90::kTileK, plan.kernel.consumer_wgs, plan.kernel.tile_m, plan.kernel.mma_n(),
      plan.regs_per_thread, plan.live_tile_values, plan.kernel.consumer_regs(), Sm90::kTileK, ab,
      plan.kernel.consumer_wgs > Sm90::kConsumerWGs
          ? fmt::format("; the tensor cores serve the {} in turn, so each job's epilogue may run as long as {} other "
                        "jobs' mainloops (two warp groups: one) before it holds the next turn back, but the "
                        "epilogues beside one another each run ~{:.1f}x as long (calibration.h "
                        "three_consumer_epilogue_stretch): measured slower than two wherever tried",
                        plan.kernel.consumer_wgs, plan.kernel.consumer_wgs - 1, tun.three_consumer_epilogue_stretch)
          : std::string()));

  const std::string forced = opt.cluster_n ? " (forced)" : "";
  if (plan.reductions == 0) {
    r.push_back(fmt::format("cluster {}x{}{}: {}, so tiles finish alone; a cluster only buys operand "
                            "multicast (A along N, B along M) at the cost of lock-step ({} of {} SMs busy at this size)",
                            plan.kernel.cluster_m, plan.kernel.cluster_n, forced,
                            plan.kernel.row_segment > 0 ? fmt::format("rows reduce within each {}-column tile",
                                                                      plan.kernel.row_segment)
                                                        : std::string("no reduction"),
                            plan.ctas_busy, dev.sm_count));
  } else if (plan.kernel.row_group > 1) {
    r.push_back(fmt::format("cluster {}x1 along M (B multicast) in row groups of {}: {} clusters resident keep {} of "
                            "{} SMs busy; a row group's {} CTAs cover {} x {} x {} = {} columns of N = {}",
                            plan.kernel.cluster_m, plan.kernel.row_group, plan.clusters_resident, plan.ctas_busy, dev.sm_count, peers,
                            peers, plan.kernel.tile_n, plan.kernel.n_tiles, covered, p.n));
    r.push_back(fmt::format("{} N-tile(s) per CTA: ceil(ceil(N / tile_n) / {} CTAs) = ceil({} / {})",
                            plan.kernel.n_tiles, peers, plan.tiles_n, peers));
  } else {
    r.push_back(fmt::format("cluster {}x{}{}: {} clusters resident keep {} of {} SMs busy; the cluster covers "
                            "{} x {} x {} = {} columns of N = {}{}",
                            plan.kernel.cluster_m, plan.kernel.cluster_n, forced, plan.clusters_resident, plan.ctas_busy,
                            dev.sm_count, plan.kernel.cluster_n, plan.kernel.tile_n, plan.kernel.n_tiles, covered, p.n,
                            plan.kernel.cluster_m > 1 && plan.kernel.cluster_n > 1
                                ? fmt::format(" and {} row blocks (2-D: B multicast along M too, the row reduced over "
                                              "DSMEM among the row's {} CTAs; forced only: measured slower than row groups)",
                                              plan.kernel.cluster_m, plan.kernel.cluster_n)
                                : std::string()));
    r.push_back(fmt::format("{} N-tile(s) per CTA: ceil(ceil(N / tile_n) / C_N) = ceil({} / {})",
                            plan.kernel.n_tiles, plan.tiles_n, plan.kernel.cluster_n));
  }

  const int stash_reads = stash_reads_after_round(chain, plan.fused_pairs, plan.kernel.n_tiles);
  const int write_backs = stash_write_backs_after_round(chain, plan.fused_pairs, plan.kernel.n_tiles);
  switch (plan.strategy()) {
    case RowStrategy::NoReduction:
      r.push_back("strategy no-reduction: elementwise epilogue only, every tile stores on its own");
      break;
    case RowStrategy::OnChip:
      r.push_back(fmt::format("strategy on-chip: {} CTA(s) sharing a row x tile_n = {} >= N = {}, each CTA holds its "
                              "whole tile in registers through all {} stage(s)", peers, covered, p.n,
                              plan.stages_in_chain));
      break;
    case RowStrategy::SmemStash:
      if (plan.stashed.empty())
        r.push_back(fmt::format("strategy smem-stash: {} N-tiles per CTA, but later stages read only statistics, so "
                                "nothing tile-sized is kept (0 B)", plan.kernel.n_tiles));
      else
        r.push_back(fmt::format(
            "strategy smem-stash: the {} earlier N-tile(s) of each row block keep stage 1's bypass values [{}] in SMEM "
            "as {} per consumer WG ({} total, limit max_stash_bytes {}){}; later stages recompute from them",
            plan.kernel.n_tiles - 1, join(plan.stashed), plan_detail::stash_type_name(plan.kernel),
            fmt_bytes(plan.smem.stash), fmt_bytes(tun.max_stash_bytes),
            plan.kernel.stash_elem_bytes == 2 && !plan.kernel.stash_centers
                ? " (bf16 as forced: rounds them like the unfused path's bf16 intermediate would)"
                : ""));
      break;
    case RowStrategy::WorkspaceStash:
      r.push_back(fmt::format(
          "strategy workspace-stash: the {} earlier N-tile(s) per CTA do not fit on chip, so stage 1's bypass values "
          "[{}] go to a global workspace as {} ({} for the jobs in flight, {}) and are re-read {} time(s) by the {} later "
          "stage(s){}{}",
          plan.kernel.n_tiles - 1, join(plan.stashed), plan_detail::stash_type_name(plan.kernel),
          fmt_bytes(plan.workspace_bytes),
          double(plan.workspace_bytes) <= tun.l2_workspace_fraction * double(dev.l2_bytes)
              ? "stays in L2"
              : "too big for L2: charged at DRAM bandwidth",
          stash_reads, plan.stages_in_chain - 1,
          stash_reads < plan.stages_in_chain - 1 ? " (the second stage of a pair in one round streams with the stage "
                                                   "after it: one read for both)"
                                                 : "",
          write_backs > 0 ? fmt::format(", and written back {} time(s) by stages that pass a tile value on", write_backs)
                          : std::string()));
      break;
  }

  switch (plan.kernel.aggregation) {
    case Aggregation::None:
      r.push_back("aggregation none: no reduction crosses a CTA");
      break;
    case Aggregation::PeerToPeer:
    case Aggregation::LeaderFollower: {
      const bool p2p = plan.kernel.aggregation == Aggregation::PeerToPeer;
      std::string why = opt.aggregation ? "forced by option"
                        : p2p ? fmt::format("C_N = {} <= p2p_max_cluster = {}", plan.kernel.cluster_n, tun.p2p_max_cluster)
                              : fmt::format("C_N = {} > p2p_max_cluster = {}", plan.kernel.cluster_n, tun.p2p_max_cluster);
      if (plan.kernel.cluster_n == 1) why += "; C_N = 1: rows finish by warp shuffles, no DSMEM traffic";
      r.push_back(fmt::format("aggregation {}: {} (measured with TMA bulk copies + mbarriers: peer-to-peer took "
                              "0.18-0.61 us a round at C_N 2-16, leader-follower 0.34-0.76 us: no crossover up to 16)",
                              name_of(plan.kernel.aggregation), why));
      break;
    }
    case Aggregation::L2Exchange:
      r.push_back(fmt::format(
          "aggregation l2: the {} CTAs that share a row sit in {} different clusters (clusters of {}x1 along M, "
          "B multicast) and exchange one fp32 per row and round through L2 in 8-byte words that carry "
          "their own round tag (cluster/global_exchange.cuh); a cluster along N could only multicast A, which left the 64x256 PingPong "
          "mainloop L2-bound at 1.53x cuBLAS (bench/NOTES.md), and 2-D clusters of 4 keep only 120 SMs busy",
          plan.kernel.row_group * plan.kernel.cluster_n, plan.kernel.row_group, plan.kernel.cluster_m));
      break;
  }

  // One line per kind of pair: one round or two, and why.
  const OneRoundPairs can = one_round_pairs_possible(plan);
  const bool several_tiles = plan.kernel.n_tiles > 1;
  // keepers: the pairs of this kind that can keep their exp in place (spec.h pair_keeps_exp), in
  // one round over one N-tile a CTA; kept: whether they do (OneRoundPairs::kept_exp;
  // PlanOptions::keep_pair_exp = false, --pair-exp again, turns it off).
  // online: how the second statistic runs over several N-tiles a CTA; below_root: pairs of the
  // kind below the root stage (ChainInfo); registers: why a kernel's registers keep it at two
  // rounds over several N-tiles, or null.
  auto pair_line = [&](int count, bool fused, bool possible, const char* needs, const std::string& what, int keepers,
                       bool kept, const char* online, int below_root, const char* registers) {
    if (count == 0) return;
    const std::string head = fmt::format("{} {}", count, what);
    r.push_back(fused ? fmt::format("{}: in one round, one synchronization of the row's CTAs instead of two{}", head,
                                    several_tiles ? fmt::format(" ({} across the CTA's N-tiles)", online)
                                    : keepers == 0 ? ""
                                    : kept ? fmt::format(" ({} keep(s) the exp summed before the round in the "
                                                         "registers: one exp a value)",
                                                         keepers)
                                           : fmt::format(" ({} could keep the exp summed before the round in the "
                                                         "registers, one exp a value: --pair-exp again forced it off)",
                                                         keepers))
                : opt.fuse_pairs == false ? fmt::format("{}: two rounds, forced by option", head)
                : !possible ? fmt::format("{}: two rounds; one round needs {}", head, needs)
                : plan.kernel.row_peers() == 1 ? fmt::format("{}: two rounds; one CTA per row has no round to save", head)
                : below_root > 0
                    ? fmt::format("{}: two rounds; over several N-tiles a CTA a pair below the root stage keeps every "
                                  "such pair at two (only the root's second statistic can run online, tile by tile, as "
                                  "its tiles pass)",
                                  head)
                : registers != nullptr && plan.kernel.row_peers() <= kOnlinePairMaxRowPeers
                    ? fmt::format("{}: two rounds; {} (--pairs one-round forces it)", head, registers)
                    : fmt::format("{}: two rounds; over several N-tiles a CTA one round unforced only in row groups of "
                                  "up to {} CTAs (measured: a row group of 64's kernel spills; --pairs one-round "
                                  "forces it; where CTAs walk several jobs over at least {} rows a wider group is "
                                  "not offered where one of that size holds the row: decide_row_groups.cpp "
                                  "two_round_pair_group)",
                                  head, kOnlinePairMaxRowPeers, kOnePairGroupMinRows));
  };
  pair_line(chain.mean_variance_pairs, plan.fused_pairs.mean_variance, can.mean_variance,
            "the L2 exchange or a single CTA per row",
            "mean-and-variance pair(s) (one round: each CTA sends its row sums and the sum of squares about its own "
            "mean, merged by Chan's formula, safe when |mean| >> std)",
            0, false, "each tile's squares about its own mean merged online by Chan's formula",
            chain.mean_variance_pairs_below_root,
            online_mean_variance_fits(plan.kernel)
                ? nullptr
                : "over several N-tiles a CTA, 128 accumulators a thread beside the round's words of more than 16 "
                  "peers spill in one round and measured no faster (calibration.h online_mean_variance_fits)");
  pair_line(chain.max_exp_sum_pairs, plan.fused_pairs.max_exp_sum, can.max_exp_sum,
            "the L2 exchange or a single CTA per row",
            "max-and-sum-of-exp pair(s) (one round: each CTA sends its row max and the sum of exp about its own max, "
            "merged as online softmax does, S = sum_j S_j exp(max_j - max))",
            chain.max_exp_sum_pairs_keeping_exp, plan.fused_pairs.kept_exp, "the sum of exp online",
            chain.max_exp_sum_pairs_below_root, nullptr);
  r.push_back((plan.kernel.cluster_n > 1)
                  ? fmt::format("multicast A: the {} CTAs of a cluster share the row block, one TMA load feeds all",
                                plan.kernel.cluster_n)
                  : plan.kernel.cluster_m > 1
                      ? fmt::format("multicast B: the {} CTAs of a cluster share the column block, one TMA load feeds all",
                                    plan.kernel.cluster_m)
                      : "no multicast: cluster of one");
  r.push_back(fmt::format("{} ring stages: as many {}-byte ring stages as fit after the epilogue buffers "
                          "(at most {}; up to {} where M <= 256 streams B or the ring is forced; both consumer WGs "
                          "share one ring)",
                          plan.kernel.ring_stages, plan.kernel.ring_stage_bytes(), Sm90::kRingStagesDefault,
                          Sm90::kMaxRingStages));
  r.push_back(fmt::format("SMEM {} of {}: the unified reduction buffer ({}) is sized by tile_m, C_N and the mode "
                          "only, not by the number of reductions (here {})",
                          fmt_bytes(plan.smem.total()), fmt_bytes(plan.smem_limit), fmt_bytes(plan.smem.reduction_buffer),
                          plan.reductions));
  r.push_back(fmt::format("persistent grid of {} CTAs: {} job(s) (row blocks{}) over {} resident cluster(s)",
                          plan.grid_ctas, plan.jobs, plan.reductions ? "" : " x N groups",
                          plan.grid_ctas / std::max(1, plan.kernel.cluster_n * plan.kernel.cluster_m)));
  const PlanEstimate& e = plan.estimate;
  r.push_back(fmt::format("estimate {:.1f} us = max(mainloop {:.1f} + exposed epilogue {:.1f}, DRAM floor {:.1f}) + "
                          "reread {:.1f} (the decider's cost model, src/plan/decide_*.cpp; constants marked GUESS in "
                          "src/plan/calibration.h await GPU measurement)",
                          e.total_us, e.mainloop_us, e.epilogue_us, e.dram_floor_us, e.reread_us));
  if (!unforced.empty()) r.push_back("without the forced options the model would pick: " + unforced);
}

}  // namespace comfuse::plan_detail
