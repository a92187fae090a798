// Row reductions over row groups (AggregationMode::Global): the CTAs that share a row are G
// clusters of the persistent grid, the hardware cluster runs along M (B multicast), and the
// row's partials meet in L2 (kernels/comfuse/cluster/global_exchange.cuh).
//
// Why a model of its own: the general search (planner.cpp) prices mainloops with guessed
// efficiency tables; here the mainloop configurations are few and measured (PingPong 64x256
// or 128x128 with B multicast run at cuBLAS parity, bench/NOTES.md run 3), so what decides is
// the work division, which is exact arithmetic:
//   jobs        = ceil(row blocks / cluster_m)        a job: cluster_m row blocks x all of N
//   groups      = min(jobs, clusters resident / G)    row groups running at once
//   T           = ceil(N-tiles / G)                   N-tiles per CTA and job
//   per CTA     = ceil(jobs / groups) jobs x T tiles of mainloop
// PingPong hides a job's stash write-back and later stages behind the other consumer's next
// job, except the last one (the tail: T tiles of stage-2 traffic), a share of the stash
// traffic (it competes with the mainloop's operand loads), and except when a CTA has one job
// only (its one consumer runs alone: every epilogue exposed). Each reduction costs one
// exchange round, exposed once at the end.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "plan_internal.h"

namespace comfuse::plan_detail {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

double lookup(const std::map<int, double>& m, int key) {
  if (m.empty()) return 1.0;
  auto it = m.upper_bound(key);
  if (it == m.begin()) return it->second;
  return std::prev(it)->second;
}

struct TileShape {
  int tile_m, tile_n;
};
constexpr TileShape kTiles[] = {{64, 256}, {128, 128}, {64, 128}};
constexpr int kClusterMs[] = {2, 1};
constexpr int kGroups[] = {1, 2, 4, 8, 16, 32, 64};
constexpr int kMaxNTiles = 64;  // FusedGemmSm90's NTiles limit

}  // namespace

std::vector<RowGroupChoice> row_group_candidates(const Problem& p, const ChainInfo& chain, const DeviceModel& dev,
                                                 const PlannerTunables& tun, const PlanOptions& opt) {
  std::vector<RowGroupChoice> out;
  const int ab_bytes = static_cast<int>(size_of(p.ab_dtype));
  const int stash_bytes = opt.stash_bytes.value_or(4);
  const int values = static_cast<int>(chain.stash_nodes.size());
  for (const TileShape& ts : kTiles) {
    if (opt.tile_m && *opt.tile_m != ts.tile_m) continue;
    if (opt.tile_n && *opt.tile_n != ts.tile_n) continue;
    for (int cm : kClusterMs) {
      if (opt.cluster_m && *opt.cluster_m != cm) continue;
      const auto res = dev.clusters_resident.find(cm);
      if (res == dev.clusters_resident.end()) continue;
      const int64_t tiles_m = ceil_div(p.m, ts.tile_m), tiles_n = ceil_div(p.n, ts.tile_n);
      for (int g : kGroups) {
        if (opt.row_group && *opt.row_group != g) continue;
        if (!opt.row_group && g > 1 && g / 2 >= tiles_n) continue;  // CTAs with no columns at all
        const int64_t groups_max = res->second / g;
        if (groups_max < 1) continue;
        const int64_t n_tiles = ceil_div(tiles_n, g);
        if (n_tiles > kMaxNTiles) continue;
        RowGroupChoice c;
        c.tile_m = ts.tile_m, c.tile_n = ts.tile_n, c.cluster_m = cm, c.row_group = g, c.n_tiles = n_tiles;
        c.stash_elem = n_tiles > 1 && values > 0 ? stash_bytes : 0;
        c.jobs = ceil_div(tiles_m, cm);
        c.groups = std::min(c.jobs, groups_max);
        const int64_t jobs_per_cta = ceil_div(c.jobs, c.groups);
        const double eff = lookup(tun.row_group_mainloop_efficiency, ts.tile_m * 1000 + ts.tile_n) *
                           (cm > 1 ? 1.0 : tun.row_group_no_multicast_efficiency);
        const double t_tile = 2.0 * ts.tile_m * ts.tile_n * double(p.k) / (dev.sm_flops_per_s * eff) * 1e6;
        // Epilogue bytes of one tile: the stash written once and read back by each later stage
        // (none when T == 1), the outputs written. At one SM's share of DRAM bandwidth.
        const double elems = double(ts.tile_m) * ts.tile_n;
        const double stage1 = n_tiles > 1 ? elems * values * c.stash_elem : 0.0;
        const double stage2 = stage1 * std::max(1, chain.stages_in_chain - 1) + elems * chain.max_out_bytes;
        const double per_sm_bytes_per_us = dev.dram_bytes_per_s / dev.sm_count * 1e-6;
        const double t_s1 = stage1 / per_sm_bytes_per_us, t_s2 = stage2 / per_sm_bytes_per_us;
        const OneRoundPairs fuse = fuse_pairs(chain, opt, n_tiles, jobs_per_cta, AggregationMode::Global, g);
        const int rounds = chain.reductions - (fuse.mean_variance ? chain.mean_variance_pairs : 0) -
                           (fuse.max_exp_sum ? chain.max_exp_sum_pairs : 0);
        c.exchange_us = rounds * lookup(tun.row_group_exchange_us, g);
        if (jobs_per_cta == 1) {  // one consumer alone: nothing overlaps its epilogue
          c.mainloop_us = double(n_tiles) * t_tile;
          c.tail_us = double(n_tiles) * (t_s1 + t_s2);
        } else {  // the other consumer's mainloops hide all but a share of the stash traffic
          c.mainloop_us = double(jobs_per_cta * n_tiles) * (t_tile + tun.row_group_stash_exposed * t_s1);
          c.tail_us = double(n_tiles) * t_s2;
        }
        c.est_us = c.mainloop_us + c.tail_us + c.exchange_us;
        c.ab_bytes = ab_bytes;
        out.push_back(c);
      }
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const RowGroupChoice& a, const RowGroupChoice& b) {
    return a.est_us < b.est_us;
  });
  return out;
}

bool row_groups_forced(const PlanOptions& opt) {
  return opt.row_group || opt.cluster_m || (opt.aggregation && *opt.aggregation == AggregationMode::Global);
}

// A fused pair saves a synchronization of the row's CTAs but adds a pass over the tile (for
// softmax an exp per element) and the merge arithmetic; that pays when the epilogue hides
// behind the other consumer's next job, not when a CTA has one job and its epilogue is exposed,
// nor with one CTA per row (no round to save). fuse_pairs = true forces it where the device can.
// MEASURED (ncu cycles at base clock, one round vs two, bench/NOTES.md session 8, after the
// pair root began its PostStages' loads with its own, stage.cuh begin_phase<true>):
// 8192x4096x4096 LayerNorm 591.8k vs 614.8k (session 7), softmax 586.9k vs 616.4k, log-softmax
// 582.1k vs 611.9k; 4096x8192x4096 a tie (618-625k both ways); 256x4096x4096 (one job per CTA)
// LayerNorm 41.1k vs 37.7k.
OneRoundPairs fuse_pairs(const ChainInfo& chain, const PlanOptions& opt, int64_t n_tiles, int64_t jobs_per_cta,
                         AggregationMode agg, int row_peers) {
  if (chain.pairs() == 0 || !one_round_pairs_possible(n_tiles, agg, row_peers)) return {};
  if (opt.fuse_pairs) return {*opt.fuse_pairs && chain.mean_variance_pairs > 0, *opt.fuse_pairs && chain.max_exp_sum_pairs > 0};
  const bool saves_a_round = row_peers > 1;  // one CTA per row: no round to save
  const bool hides = saves_a_round && jobs_per_cta >= 2;
  return {chain.mean_variance_pairs > 0 && hides, chain.max_exp_sum_pairs > 0 && hides};
}

std::string RowGroupChoice::describe() const {
  return fmt::format("PingPong {}x{}, clusters {}x1 in row groups of {}, {} N-tile(s)/CTA: est {:.1f} us (mainloop "
                     "{:.1f}, tail {:.1f}, exchange {:.1f})",
                     tile_m, tile_n, cluster_m, row_group, n_tiles, est_us, mainloop_us, tail_us, exchange_us);
}

}  // namespace comfuse::plan_detail
