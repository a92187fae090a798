// The DSMEM decider: the row's CTAs are one cluster 1 x C_N along N (the paper's path), or,
// with no reduction, any tile finishes alone. A small scored search:
//
// Candidates: tile_m in {64, 128} (rows per consumer warp group; PingPong gives each of the
// two consumer WGs its own tile), tile_n in {64, 128, 192, 256}, cluster 1 x C_N with C_N in
// {1, 2, 4, 8, 16}, and for reductions the row strategy (on-chip; several N-tiles per CTA with
// an SMEM stash or a workspace stash, fp32 or bf16). Each gets its storage (the ring takes what
// is left) and an estimated time:
//
//   T = max(T_cluster, T_dram) + T_reread
//   T_cluster = ml + epi + (q - 1) * max(ml + a * epi_math, (ml + epi) / 2)
//     ml  = n_tiles * t_tile                mainloop of one job (one row block) on one CTA
//     epi = epilogue instructions (epi_math) + one cluster all-reduce round per reduction
//     q   = ceil(jobs / clusters_resident(C_N))     wave quantization at the resident SMs
//     a   = epilogue_mma_interference       what the epilogue's instructions cost the other
//                                           WG's MMAs beside them (calibration.h, measured)
//   The (q - 1) term is PingPong: one WG's epilogue runs beside the other's mainloop (slowing it
//   by a share of its instructions), and when the epilogue dominates the two WGs' epilogues
//   overlap each other.
//   T_dram   = unique DRAM bytes / bandwidth   (small-M shapes are memory bound)
//   T_reread = workspace-stash bytes (write once, read once per later stage) / L2 bandwidth,
//              or / DRAM bandwidth when the workspace in flight would not stay in L2
//
// Which constants are measured and which are guesses: calibration.h.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "plan_internal.h"

namespace comfuse::plan_detail {
namespace {

constexpr int kTileMs[] = {64, 128};

}  // namespace

void estimate_cluster(Candidate& c, const Request& r) {
  const ChainInfo& chain = r.chain;
  const DeviceModel& dev = r.dev;
  const PlannerTunables& tun = r.tun;
  const KernelConfig& k = c.k;
  const int ab_bytes = static_cast<int>(size_of(r.p.ab_dtype));
  const int values = k.stash_elem_bytes > 0 ? 1 : 0;  // the stash keeps one tile value
  const int64_t k_tiles = ceil_div64(r.p.k, Sm90::kTileK);
  const int resident_max = dev.resident(k.cluster_size());
  const int64_t q = ceil_div64(c.jobs, std::max(1, resident_max));  // waves of jobs
  // Several waves over several row blocks: the MACs pace the grid, and a 64-row tile's L2 feed
  // slows them (row_tile_rate). One wave, or one row of clusters, is B's stream from DRAM (below);
  // clusters along N have their rate in cluster_efficiency, measured on 64-row tiles.
  const bool mac_paced = q > 1 && c.tiles_m > k.cluster_m && k.cluster_n == 1;
  const double eff = lookup(tun.tile_n_efficiency, k.mma_n()) * lookup(tun.cluster_efficiency, k.cluster_n) *
                     (k_tiles >= 4 ? lookup(tun.stage_efficiency, k.ring_stages) : 1.0) *
                     (mac_paced ? row_tile_rate(tun, k.tile_m, k.mma_n(), k.cluster_m) : 1.0);
  // The mainloop's columns: a gated tile's wgmma covers B's and the gate's (KernelConfig::mma_n),
  // and both B operands stream from DRAM.
  const int b_operands = k.gated ? 2 : 1;
  const double t_tile = 2.0 * k.tile_m * k.mma_n() * double(k_tiles * Sm90::kTileK) / (dev.sm_flops_per_s * eff) * 1e6 +
                        tun.tile_fixed_us;
  const double elems = double(k.tile_m) * k.tile_n / Sm90::kWarpGroupThreads;  // per thread
  double instr = double(k.n_tiles) * elems * chain.ops_per_element;
  // The stash: written once, then read by each later stage and written back by each that passes
  // a tile value on (no pair in one round over DSMEM).
  const int stash_passes = 1 + stash_reads_after_round(chain, {}, k.n_tiles) + stash_write_backs_after_round(chain, {}, k.n_tiles);
  if (k.n_tiles > 1) instr += double(k.n_tiles - 1) * values * elems * stash_passes;
  double const epi_math = instr * tun.epilogue_cpi / dev.clock_hz * 1e6;
  double epi = epi_math;
  double round = chain.reductions > 0 ? lookup(dev.cluster_allreduce_us, k.cluster_n) : 0.0;
  if (k.aggregation == Aggregation::LeaderFollower) round *= tun.leader_follower_penalty;
  epi += chain.reductions * round;
  const double ml = double(k.n_tiles) * t_tile;
  double one_wave_saving = 0;  // what low_us takes off total_us (below)
  // B of a one-wave grid of single CTAs (no multicast cluster) past the short kernels' fit.
  const auto long_stream = [&](double b) {
    return k.cluster_size() == 1 && b >= tun.one_wave_long_stream_min_bytes;
  };

  c.resident = static_cast<int>(std::min<int64_t>(resident_max, c.jobs));
  // Each job after the first: its mainloop, taxed by the other WG's epilogue beside it.
  const double job = std::max(ml + tun.epilogue_mma_interference * epi_math, (ml + epi) / 2.0);
  double t_cluster = ml + epi + double(q - 1) * job;
  c.est.mainloop_us = double(q) * ml;
  // A CTA's share of B (clusters along M multicast it) and its time at one SM's streaming rate,
  // which was measured on shares up to 0.5 MiB only (calibration.h): a longer one keeps more
  // bytes in flight, so there the tile model stands (0).
  const double b_cta = double(k.n_tiles) * k.mma_n() * double(r.p.k) * ab_bytes / k.cluster_m;
  const double stream = b_cta <= tun.sm_stream_measured_bytes ? b_cta / tun.sm_stream_bytes_per_s * 1e6 : 0.0;
  if (q == 1) {
    // One wave (decode, small M), as the row groups' model (decide_row_groups.cpp): the launch's
    // fixed cost has nothing to hide behind, and B streams from DRAM once, all of it at what DRAM
    // gives a short kernel and a CTA's share at one SM's streaming rate. GPT-2's decode c_fc +
    // gelu_new (1 and 32 x 4096 x 1024, 32 CTAs of 256 KiB) measured 9.7-10.1 us in a CUDA graph
    // against 5.0 estimated without this.
    const double b_all = double(b_operands) * r.p.n * double(r.p.k) * ab_bytes;
    const double dram = tun.one_wave_dram(k.cluster_m, c.tiles_m >= k.cluster_m);
    c.est.mainloop_us = std::max({ml, stream, b_all / dram * 1e6});
    t_cluster = c.est.mainloop_us + epi + tun.one_wave_launch_us;
    // Single CTAs streaming tens of MB reach the DRAM's long-stream rate, not the short kernels'
    // one-wave rate (calibration.h, "one-wave long streams"): the bound a frontend measures against.
    if (long_stream(b_all))
      one_wave_saving = c.est.mainloop_us - std::max({ml, stream, b_all / dev.dram_bytes_per_s * 1e6});
  } else if (c.tiles_m <= k.cluster_m) {
    // A few rounds of one row of clusters (small M): each cluster streams its own panels of B
    // from DRAM, so a full round lasts at least their bytes at DRAM's rate, and the last, partial
    // one at what a short kernel gets (the one-wave rate) or one CTA's share at one SM's
    // streaming rate: the tail that decides 64x128 against 64x192 at 128 x 11008 x 4096, which
    // the compute-bound waves above miss (bench/NOTES.md Stop 33: 128 x 16384 x 4096 measured
    // 40.9 us where they give 34.9).
    const double b_job = b_cta * k.cluster_m * k.cluster_n;  // a cluster's panels (shared along M)
    const int64_t last = c.jobs - (q - 1) * resident_max;
    const double full = std::max(ml, double(resident_max) * b_job / dev.dram_bytes_per_s * 1e6);
    const double tail =
        std::max({ml, stream, double(last) * b_job / tun.one_wave_dram(k.cluster_m, true) * 1e6});
    const double rounds = double(q - 1) * full + tail;
    const double waves = t_cluster;
    if (rounds + epi + tun.one_wave_launch_us > t_cluster) {
      c.est.mainloop_us = rounds;
      t_cluster = rounds + epi + tun.one_wave_launch_us;
      // The last round's single CTAs at the DRAM's long-stream rate (calibration.h, one-wave long
      // streams: a gated 1 x 14336 x 4096, 224 tiles over 132 SMs, measured 64.1 us against 73.3),
      // not below the waves' compute-bound time this branch replaced.
      if (long_stream(double(c.jobs) * b_job)) {
        const double bound = double(q - 1) * full +
                             std::max({ml, stream, double(last) * b_job / dev.dram_bytes_per_s * 1e6}) + epi +
                             tun.one_wave_launch_us;
        one_wave_saving = std::max(0.0, t_cluster - std::max(bound, waves));
      }
    }
  }
  c.est.epilogue_us = t_cluster - c.est.mainloop_us;

  double dram = double(r.p.m) * r.p.k * ab_bytes + double(b_operands) * r.p.n * r.p.k * ab_bytes;
  if (chain.has_tile_output) dram += double(r.p.m) * r.p.n * chain.max_out_bytes;
  dram += double(r.p.m) * r.p.n * double(chain.tile_input_bytes_per_element);
  c.est.dram_floor_us = dram / dev.dram_bytes_per_s * 1e6;

  c.workspace = 0;
  c.est.reread_us = 0;
  if (k.stash_space == StashSpace::Workspace) {
    // Scratch for every job in flight: each CTA's two WGs hold one job each.
    c.workspace = int64_t{c.resident} * k.cluster_size() * k.stash_workspace_bytes_per_cta();
    const bool in_l2 = double(c.workspace) <= tun.l2_workspace_fraction * double(dev.l2_bytes);
    const double per_job = double(k.stash_bytes_per_wg()) * (k.tile_m / k.epi_rows()) * stash_passes;
    c.est.reread_us = double(c.jobs) * k.cluster_size() * per_job / (in_l2 ? dev.l2_bytes_per_s : dev.dram_bytes_per_s) * 1e6;
  }
  c.est.total_us = std::max(t_cluster, c.est.dram_floor_us) + c.est.reread_us;
  c.est.low_us = std::max(c.est.total_us - one_wave_saving, c.est.dram_floor_us);
}

std::vector<Candidate> decide_cluster(const Request& r, Rejections& why) {
  const ChainInfo& chain = r.chain;
  const PlanOptions& opt = r.opt;
  const DeviceModel& dev = r.dev;
  const PlannerTunables& tun = r.tun;
  std::vector<Candidate> out;
  for (int tm : kTileMs) {
    if (opt.tile_m && *opt.tile_m != tm) continue;
    for (int tn : kTileNs) {
      if (opt.tile_n && *opt.tile_n != tn) continue;
      // The kernel keeps one consumer WG's whole tile in registers (PingPong); a gated tile both products.
      const int acc = tm * tn * (r.spec.gated() ? 2 : 1) / Sm90::kWarpGroupThreads;
      if (acc > Sm90::kMaxAccumulatorsPerThread) {
        why.add("registers", fmt::format("{}x{} tile{}: {} accumulators/thread exceed the kernel's {}", tm, tn,
                                         r.spec.gated() ? " (gated: twice its columns)" : "", acc,
                                         Sm90::kMaxAccumulatorsPerThread));
        continue;
      }
      const int regs = (chain.live_tile_values - 1) * tm * tn / Sm90::kWarpGroupThreads + acc + tun.reg_overhead;
      if (regs > Sm90::kConsumerRegs) {
        why.add("registers", fmt::format("{}x{} tile: ~{} registers/thread for {} live tile value(s) exceed {}", tm, tn,
                                         regs, chain.live_tile_values, Sm90::kConsumerRegs));
        continue;
      }
      for (int cn : kClusterNs) {
        if (opt.cluster_n && *opt.cluster_n != cn) continue;
        // Forced only: a 2-D cluster (cluster_m with cluster_n), B multicast along M besides A
        // along N. Priced as its cluster along N (measured 0.84-1.0 of that: calibration.h
        // cluster_efficiency).
        const int cm = opt.cluster_n ? opt.cluster_m.value_or(1) : 1;
        if (cm * cn > dev.max_cluster || !dev.clusters_resident.count(cm * cn)) continue;
        Candidate c;
        c.k.b_kmajor = r.spec.b_layout == BLayout::NK;
        c.k.gated = r.spec.gated();
        c.k.tile_m = tm, c.k.tile_n = tn, c.k.cluster_n = cn, c.k.cluster_m = cm, c.regs = regs;
        c.k.row_reduction = chain.reductions > 0;
        c.tiles_m = ceil_div64(r.p.m, tm);
        c.tiles_n = ceil_div64(r.p.n, tn);
        // CTAs with no columns at all; a row reduction still takes the smallest power of two
        // that covers the row (its extra CTAs add identities).
        const bool covers_tight = chain.reductions > 0 && cn / 2 < c.tiles_n;
        if (cn > c.tiles_n && !covers_tight && !opt.cluster_n) continue;
        // (strategy, stash element): on-chip, SMEM stash, workspace stash.
        std::vector<std::pair<RowStrategy, int>> variants;
        if (chain.reductions == 0) {
          c.jobs = c.tiles_m * ceil_div64(c.tiles_n, cn);
          variants = {{RowStrategy::NoReduction, 0}};
        } else {
          const int64_t n_tiles = ceil_div64(c.tiles_n, cn);
          c.jobs = ceil_div64(c.tiles_m, cm);
          c.k.aggregation = opt.aggregation ? *opt.aggregation
                                            : (cn <= tun.p2p_max_cluster ? Aggregation::PeerToPeer
                                                                         : Aggregation::LeaderFollower);
          if (n_tiles > Sm90::kMaxNTiles) {
            why.add("n_tiles", fmt::format("N = {} needs {} N-tiles per CTA at {}x{} C_N={}: more than the kernel's {}",
                                           r.p.n, n_tiles, tm, tn, cn, Sm90::kMaxNTiles));
            continue;
          }
          if (n_tiles > 1 && !dev.multi_tile_rows) {
            why.add("device", fmt::format("N = {} needs {} N-tiles per CTA at {}x{} C_N={}: the device templates "
                                          "do not walk several N-tiles per CTA yet (stash / global-reread), so a "
                                          "row must fit one cluster: N <= C_N x tile_n <= 16 x 256",
                                          r.p.n, n_tiles, tm, tn, cn));
            continue;
          }
          c.k.n_tiles = static_cast<int>(n_tiles);
          if (n_tiles == 1) {
            variants = {{RowStrategy::OnChip, 0}};
          } else if (!chain.carries_tile) {
            variants = {{RowStrategy::SmemStash, 0}};  // nothing tile-sized to keep
          } else {
            variants = {{RowStrategy::SmemStash, 4}, {RowStrategy::WorkspaceStash, 4}};
            if (tun.allow_bf16_stash || opt.stash_bytes == 2) {
              variants.push_back({RowStrategy::SmemStash, 2});
              variants.push_back({RowStrategy::WorkspaceStash, 2});
            }
          }
        }
        for (auto [strategy, elem] : variants) {
          if (opt.strategy && *opt.strategy != strategy) continue;
          if (opt.stash_bytes && elem != 0 && elem != *opt.stash_bytes) continue;
          Candidate v = c;
          v.k.stash_elem_bytes = elem;
          // A bf16 stash about the root pair's running statistic where it runs online (one CTA a
          // row, forced: the DSMEM channel has no pair round).
          v.k.stash_centers = elem == 2 && stash_centers_possible(chain, fuse_pairs(chain, opt, v.k), v.k.n_tiles);
          v.k.stash_space = elem == 0 ? StashSpace::None
                            : strategy == RowStrategy::SmemStash ? StashSpace::Smem
                                                                 : StashSpace::Workspace;
          if (v.k.stash_space == StashSpace::Smem && v.k.consumer_wgs * v.k.stash_bytes_per_wg() > tun.max_stash_bytes) {
            why.add("stash", fmt::format("stash of {} exceeds max_stash_bytes {}",
                                         fmt_bytes(v.k.consumer_wgs * int64_t{v.k.stash_bytes_per_wg()}),
                                         fmt_bytes(tun.max_stash_bytes)));
            continue;
          }
          if (!fit_ring(v, chain, dev, opt.ring_stages)) {
            why.add("stages", fmt::format("{}x{} tile with C_N={} {}: fewer than 2 pipeline (ring) stages fit in {} of SMEM", tm,
                                          tn, cn, name_of(strategy), fmt_bytes(dev.smem_per_cta_bytes)));
            continue;
          }
          if (const char* bad = check(v.k)) {
            why.add("kernel", fmt::format("{}x{} tile with C_N={}: {}", tm, tn, cn, bad));
            continue;
          }
          estimate_cluster(v, r);
          if (v.workspace > tun.max_workspace_bytes) {
            why.add("workspace", fmt::format("workspace-stash needs {} of workspace (limit max_workspace_bytes {})",
                                             fmt_bytes(v.workspace), fmt_bytes(tun.max_workspace_bytes)));
            continue;
          }
          out.push_back(v);
        }
      }
    }
  }
  return out;
}

}  // namespace comfuse::plan_detail
