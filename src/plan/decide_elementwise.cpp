// The elementwise decider: an epilogue without row reductions, so any tile finishes alone.
// Unforced, the configuration measured fastest for the problem's shape class wins
// (calibration.cpp, measured_elementwise_config); forced clusters along M take PingPong tiles
// with B multicast. The general search (decide_cluster.cpp) adds its candidates as runners-up,
// or decides when other options are forced. Split-K is the row-group decider's division (a row
// block's N-tiles over a group of CTAs, K split over several such groups): forced, priced by
// that decider's one-wave model (its epilogue arithmetic fitted on reduction epilogues); unforced,
// only the measured split rows of calibration.cpp (long K at small M and at decode).
#include <fmt/format.h>

#include "plan_internal.h"

namespace comfuse::plan_detail {

std::vector<Candidate> decide_elementwise(const Request& r, Rejections& why) {
  const PlanOptions& opt = r.opt;
  if (opt.k_splits) return decide_row_groups(r, why);
  std::vector<Candidate> search = decide_cluster(r, why);
  // Forced clusters along M, or more consumer warp groups (which take the same forced PingPong path).
  const bool forced_cm = opt.cluster_m.has_value() || opt.consumer_wgs.value_or(Sm90::kConsumerWGs) > Sm90::kConsumerWGs;
  const bool forced_other = opt.cluster_n || opt.tile_n || opt.tile_m || opt.strategy || opt.aggregation ||
                            opt.row_group || opt.stash_bytes;
  if (forced_other && !forced_cm) return search;

  const bool short_epilogue = r.chain.ops_per_element <= r.tun.short_epilogue_ops && r.chain.tile_inputs == 0;
  MeasuredConfig mc = r.spec.gated() ? gated_elementwise_config(r.p, r.dev)
                                     : measured_elementwise_config(r.p, r.dev, short_epilogue);
  if (mc.k_splits > 1 && !forced_cm) {
    if (std::optional<Candidate> row = measured_split_row(r, mc.tile_m, mc.tile_n, mc.cluster_m, mc.k_splits)) {
      row->why = mc.why;
      search.insert(search.begin(), *row);
      return search;
    }
    mc = measured_elementwise_config(r.p, r.dev, short_epilogue, /*may_split_k=*/false);
  }
  const int consumers = opt.consumer_wgs.value_or(Sm90::kConsumerWGs);
  if (forced_cm) {
    const int tm = opt.tile_m.value_or(consumers > Sm90::kConsumerWGs ? 64 : 128), tn = opt.tile_n.value_or(128);
    const int cm = opt.cluster_m.value_or(1);
    // Cooperative where one warp group cannot hold the tile: a gated tile keeps 64 rows a warp
    // group, and 128x256 is the plain GEMM's cooperative tile (256 accumulators a thread alone).
    const int wgs = (r.spec.gated() && tm == 128) || (tm == 128 && tn == 256) ? 2 : 1;
    mc = {tm, tn, wgs, cm, 1, 8, 8, false,
          fmt::format("forced: {} {}x{}, clusters of {} along M (B multicast){}", wgs == 1 ? "PingPong" : "cooperative",
                      tm, tn, cm,
                      consumers > Sm90::kConsumerWGs ? fmt::format(", {} consumer warp groups", consumers) : "")};
  }
  Candidate m;
  m.k.b_kmajor = r.spec.b_layout == BLayout::NK;
  m.k.gated = r.spec.gated();
  m.k.tile_m = mc.tile_m, m.k.tile_n = mc.tile_n, m.k.wgs_per_tile = mc.wgs_per_tile;
  m.k.cluster_m = mc.cluster_m, m.k.cluster_n = mc.cluster_n;
  m.k.consumer_wgs = consumers;
  m.max_ring_stages = mc.max_ring_stages;
  m.raster_group = mc.raster_group, m.raster_along_n = mc.raster_along_n;
  m.tiles_m = (r.p.m + m.k.tile_m - 1) / m.k.tile_m, m.tiles_n = (r.p.n + m.k.tile_n - 1) / m.k.tile_n;
  m.jobs = (m.tiles_m + m.k.cluster_m - 1) / m.k.cluster_m * ((m.tiles_n + m.k.cluster_n - 1) / m.k.cluster_n);
  m.regs = m.k.accumulators() + r.tun.reg_overhead;
  m.why = mc.why;
  if (!fit_ring(m, r.chain, r.dev, opt.ring_stages) || check(m.k) != nullptr) {
    if (forced_cm)
      throw Error(fmt::format("plan: {}: {}", mc.why,
                              check(m.k) ? check(m.k) : "the SMEM budget does not fit two pipeline stages"));
    return search;
  }
  estimate_cluster(m, r);
  m.k.begin_early = begins_early(m);
  search.insert(search.begin(), m);
  return search;
}

}  // namespace comfuse::plan_detail
