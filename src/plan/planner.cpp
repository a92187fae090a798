// The planner: a small scored search over kernel configurations.
//
// Candidates: tile_m in {64, 128} (rows per consumer warp group; PingPong gives each of the
// two consumer WGs its own tile), tile_n in {64, 128, 192, 256}, cluster 1 x C_N with
// C_N in {1, 2, 4, 8, 16}, and for reductions the row strategy (OnChip, Stash fp32/bf16,
// GlobalReread). Each candidate gets an SMEM budget (stages take what is left) and an
// estimated time:
//
//   T = max(T_cluster, T_dram) + T_reread
//   T_cluster = ml + epi + (q - 1) * max(ml, (ml + epi) / 2)
//     ml  = n_tiles_per_cta * t_tile        mainloop of one job (one row block) on one CTA
//     epi = epilogue instructions + one cluster all-reduce round per reduction
//     q   = ceil(jobs / clusters_resident(C_N))     wave quantization at the resident SMs
//   The (q - 1) term is PingPong: one WG's epilogue hides behind the other's mainloop, and
//   when the epilogue dominates the two WGs' epilogues overlap each other.
//   T_dram   = unique DRAM bytes / bandwidth   (small-M shapes are memory bound)
//   T_reread = GlobalReread bytes (write once, read once per later stage) / L2 bandwidth,
//              or / DRAM bandwidth when the workspace in flight would not stay in L2
//
// Which constants are measured and which are guesses is written beside each in plan.h.
// The cheapest candidate wins; within tun.near_tie of it the simpler strategy and then the
// smaller cluster win (see pick()).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <tuple>

#include "comfuse/error.h"
#include "plan_internal.h"

namespace comfuse {

using plan_detail::ChainInfo;

std::string_view name_of(AggregationMode m) {
  switch (m) {
    case AggregationMode::None: return "none";
    case AggregationMode::PeerToPeer: return "peer-to-peer";
    case AggregationMode::LeaderFollower: return "leader-follower";
    case AggregationMode::Global: return "global (L2 exchange across a row group of clusters)";
  }
  return "?";
}

std::string_view name_of(RowStrategy s) {
  switch (s) {
    case RowStrategy::NoReduction: return "no-reduction";
    case RowStrategy::OnChip: return "on-chip";
    case RowStrategy::Stash: return "stash";
    case RowStrategy::GlobalReread: return "global-reread";
  }
  return "?";
}

Problem problem_of(const FusionSpec& s, const Bindings& dims) {
  Problem p;
  p.m = resolve(s.m, dims);
  p.n = resolve(s.n, dims);
  p.k = resolve(s.k, dims);
  int a = s.arg_index(ArgRole::OperandA);
  if (a >= 0) p.ab_dtype = s.args[static_cast<size_t>(a)].dtype;
  return p;
}

namespace {

constexpr int kConsumerWGs = 2;        // PingPong: two consumer warp groups per CTA
constexpr int kThreadsPerWG = 128;
constexpr int kMaxStages = 8;
constexpr int kMaxAccumulatorsPerThread = 128;
constexpr int kMinStages = 2;
constexpr int kTileMs[] = {64, 128};
constexpr int kTileNs[] = {64, 128, 192, 256};
constexpr int kClusters[] = {1, 2, 4, 8, 16};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int align_up(int64_t v, int a) { return static_cast<int>((v + a - 1) / a * a); }

double lookup(const std::map<int, double>& m, int key) {
  if (m.empty()) return 1.0;
  auto it = m.upper_bound(key);  // largest entry <= key, else the smallest
  if (it == m.begin()) return it->second;
  return std::prev(it)->second;
}

struct Candidate {
  int tile_m = 0, tile_n = 0, tile_k = 0, cluster = 1, stages = 0, regs = 0;
  int wgs_per_tile = 1, cluster_m = 1, max_stages = kMaxStages;
  int raster_group = 8;
  bool raster_along_n = false;
  int64_t tiles_m = 0, tiles_n = 0, n_tiles = 1, jobs = 0;
  int row_group = 1;  // clusters that share a row (AggregationMode::Global)
  RowStrategy strategy = RowStrategy::NoReduction;
  int stash_elem = 0;
  AggregationMode agg = AggregationMode::None;
  SmemBudget smem;
  int resident = 0;
  int64_t workspace = 0;
  PlanEstimate est;

  std::string describe() const {
    std::string s = fmt::format("{}x{} C_N={} {}", tile_m, tile_n, cluster, name_of(strategy));
    if (strategy == RowStrategy::Stash || strategy == RowStrategy::GlobalReread)
      s += stash_elem == 2 ? "(bf16)" : "(fp32)";
    if (n_tiles > 1) s += fmt::format(" {} tiles/CTA", n_tiles);
    return s + fmt::format(" {} stages: est {:.1f} us", stages, est.total_us);
  }
};

struct Search {
  const FusionSpec& spec;
  const Problem& p;
  const DeviceModel& dev;
  const PlannerTunables& tun;
  const ChainInfo& chain;
  int ab_bytes = 2;
  // Why candidates died, for the error message: per kind, the first example and a count.
  std::map<std::string, std::pair<std::string, int>> rejections;
  void reject(const std::string& kind, std::string why) {
    auto it = rejections.try_emplace(kind, std::move(why), 0).first;
    ++it->second.second;
  }

  // SMEM for everything but the mainloop ring; the ring takes what is left.
  bool budget(Candidate& c) {
    const int values = static_cast<int>(chain.stash_nodes.size());
    SmemBudget& b = c.smem;
    const int rows = c.tile_m / c.wgs_per_tile;  // rows one consumer WG holds
    if (chain.reductions > 0 && c.cluster > 1)   // ONE buffer per WG channel, independent of the reduction count
      b.reduction_buffer = kConsumerWGs * align_up(tun.reduce_buffer_phases * c.cluster * rows * 4 + 16, 1024);
    // Exactly what the epilogue templates allocate per consumer WG: one tile_m x 64 staging
    // subtile per Store node, tile_n floats per RowBroadcast, and the 1 KiB the kernel
    // spends aligning its dynamic SMEM base for the 128-byte swizzle.
    // Each WG's epilogue storage is a 1024-aligned block (TMA staging needs it).
    int per_wg = 0;
    for (const auto& [store64, row_vectors] : chain.stage_storage)
      per_wg += align_up(rows * store64 + row_vectors * c.tile_n * 4, 1024);  // each stage its own block
    b.store_buffer = kConsumerWGs * per_wg + 1024;
    if (c.strategy == RowStrategy::Stash) {
      int64_t stash = int64_t{kConsumerWGs} * (c.n_tiles - 1) * c.tile_m * c.tile_n * values * c.stash_elem;
      if (stash > tun.max_stash_bytes) {
        reject("stash", fmt::format("stash of {} exceeds max_stash_bytes {}", plan_detail::fmt_bytes(stash),
                                      plan_detail::fmt_bytes(tun.max_stash_bytes)));
        return false;
      }
      b.stash = align_up(stash, 1024);
    }
    // Barriers: full+empty per ring stage, the reduction channel's full/empty per WG and
    // phase, PingPong order and store barriers; sized for the deepest ring.
    // They sit after the 1024-aligned buffers in the kernel's SharedStorage, whose size
    // rounds up to that alignment: a whole 1 KiB block.
    b.barriers = align_up(16 * kMaxStages + kConsumerWGs * tun.reduce_buffer_phases * 16 + 64, 1024);
    const int stage_bytes = (c.tile_m + c.tile_n) * c.tile_k * ab_bytes;
    const int left = dev.smem_per_cta_bytes - b.reduction_buffer - b.store_buffer - b.stash - b.barriers;
    c.stages = std::min(c.max_stages, left > 0 ? left / stage_bytes : 0);
    if (c.stages < kMinStages) {
      reject("stages", fmt::format("{}x{} tile with C_N={} {}: fewer than {} pipeline stages fit in {} of SMEM",
                                    c.tile_m, c.tile_n, c.cluster, name_of(c.strategy), kMinStages,
                                    plan_detail::fmt_bytes(dev.smem_per_cta_bytes)));
      return false;
    }
    b.mainloop_ring = c.stages * stage_bytes;
    return b.total() <= dev.smem_per_cta_bytes;
  }

  void estimate(Candidate& c) {
    const int values = static_cast<int>(chain.stash_nodes.size());
    const int64_t k_tiles = ceil_div(p.k, c.tile_k);
    const double eff = lookup(tun.tile_n_efficiency, c.tile_n) * lookup(tun.cluster_efficiency, c.cluster) *
                       (k_tiles >= 4 ? lookup(tun.stage_efficiency, c.stages) : 1.0);
    const double t_tile =
        2.0 * c.tile_m * c.tile_n * double(k_tiles * c.tile_k) / (dev.sm_flops_per_s * eff) * 1e6 + tun.tile_fixed_us;
    const double elems = double(c.tile_m) * c.tile_n / kThreadsPerWG;  // per thread
    double instr = double(c.n_tiles) * elems * chain.ops_per_element;
    if (c.strategy == RowStrategy::Stash || c.strategy == RowStrategy::GlobalReread)  // write once, read per later stage
      instr += double(c.n_tiles - 1) * values * elems * chain.stages_in_chain;
    double epi = instr * tun.epilogue_cpi / dev.clock_hz * 1e6;
    double round = chain.reductions > 0 ? lookup(dev.cluster_allreduce_us, c.cluster) : 0.0;
    if (c.agg == AggregationMode::LeaderFollower) round *= tun.leader_follower_penalty;
    epi += chain.reductions * round;
    const double ml = double(c.n_tiles) * t_tile;

    const int size = c.cluster * c.cluster_m;
    const int resident_max = dev.clusters_resident.count(size) ? dev.clusters_resident.at(size) : 0;
    c.resident = static_cast<int>(std::min<int64_t>(resident_max, c.jobs));
    const int64_t q = ceil_div(c.jobs, resident_max);
    const double t_cluster = ml + epi + double(q - 1) * std::max(ml, (ml + epi) / 2.0);
    c.est.mainloop_us = double(q) * ml;
    c.est.epilogue_us = t_cluster - c.est.mainloop_us;

    double dram = double(p.m) * p.k * ab_bytes + double(p.n) * p.k * ab_bytes;
    if (chain.has_tile_output) dram += double(p.m) * p.n * chain.max_out_bytes;
    c.est.dram_floor_us = dram / dev.dram_bytes_per_s * 1e6;

    c.workspace = 0;
    c.est.reread_us = 0;
    if (c.strategy == RowStrategy::GlobalReread) {
      // Scratch for every job in flight: each CTA's two WGs hold one job each.
      c.workspace = int64_t{c.resident} * c.cluster * kConsumerWGs * (c.n_tiles - 1) * c.tile_m * c.tile_n * values *
                    c.stash_elem;
      const bool in_l2 = double(c.workspace) <= tun.l2_workspace_fraction * double(dev.l2_bytes);
      const double per_job =
          double(c.n_tiles - 1) * c.tile_m * c.tile_n * values * c.stash_elem * chain.stages_in_chain;
      c.est.reread_us = double(c.jobs) * c.cluster * per_job /
                        (in_l2 ? dev.l2_bytes_per_s : dev.dram_bytes_per_s) * 1e6;
    }
    c.est.total_us = std::max(t_cluster, c.est.dram_floor_us) + c.est.reread_us;
  }

  std::vector<Candidate> run(const PlanOptions& opt) {
    std::vector<Candidate> out;
    const int tile_k = 128 / ab_bytes;  // one 128-byte swizzled TMA row
    for (int tm : kTileMs) {
      if (opt.tile_m && *opt.tile_m != tm) continue;
      for (int tn : kTileNs) {
        if (opt.tile_n && *opt.tile_n != tn) continue;
        // The kernel keeps one consumer WG's whole tile in registers (PingPong): at most
        // kMaxAccumulatorsPerThread fp32 accumulators a thread (fused_gemm_sm90.cuh).
        if (tm * tn / kThreadsPerWG > kMaxAccumulatorsPerThread) {
          reject("registers", fmt::format("{}x{} tile: {} accumulators/thread exceed the kernel's {}", tm, tn,
                                          tm * tn / kThreadsPerWG, kMaxAccumulatorsPerThread));
          continue;
        }
        const int regs = chain.live_tile_values * tm * tn / kThreadsPerWG + tun.reg_overhead;
        if (regs > dev.consumer_regs_per_thread) {
          reject("registers", fmt::format("{}x{} tile: ~{} registers/thread for {} live tile value(s) exceed {}", tm,
                                        tn, regs, chain.live_tile_values, dev.consumer_regs_per_thread));
          continue;
        }
        for (int cn : kClusters) {
          if (opt.cluster_n && *opt.cluster_n != cn) continue;
          if (cn > dev.max_cluster || !dev.clusters_resident.count(cn)) continue;
          Candidate c;
          c.tile_m = tm, c.tile_n = tn, c.tile_k = tile_k, c.cluster = cn, c.regs = regs;
          c.tiles_m = ceil_div(p.m, tm);
          c.tiles_n = ceil_div(p.n, tn);
          // CTAs with no columns at all; a row reduction still takes the smallest power of two
          // that covers the row (its extra CTAs add identities).
          const bool covers_tight = chain.reductions > 0 && cn / 2 < c.tiles_n;
          if (cn > c.tiles_n && !covers_tight && !opt.cluster_n) continue;
          std::vector<std::pair<RowStrategy, int>> variants;
          if (chain.reductions == 0) {
            c.n_tiles = 1;
            c.jobs = c.tiles_m * ceil_div(c.tiles_n, cn);
            variants = {{RowStrategy::NoReduction, 0}};
          } else {
            c.n_tiles = ceil_div(c.tiles_n, cn);
            c.jobs = c.tiles_m;
            c.agg = opt.aggregation ? *opt.aggregation
                                    : (cn <= tun.p2p_max_cluster ? AggregationMode::PeerToPeer
                                                                 : AggregationMode::LeaderFollower);
            if (c.n_tiles > 1 && !dev.multi_tile_rows) {
              reject("device", fmt::format("N = {} needs {} N-tiles per CTA at {}x{} C_N={}: the device templates "
                                           "do not walk several N-tiles per CTA yet (stash / global-reread), so a "
                                           "row must fit one cluster: N <= C_N x tile_n <= 16 x 256",
                                           p.n, c.n_tiles, tm, tn, cn));
              continue;
            }
            if (c.n_tiles == 1) {
              variants = {{RowStrategy::OnChip, 0}};
            } else if (chain.stash_nodes.empty()) {
              variants = {{RowStrategy::Stash, 4}};  // nothing tile-sized to keep
            } else {
              variants = {{RowStrategy::Stash, 4}, {RowStrategy::GlobalReread, 4}};
              if (tun.allow_bf16_stash || opt.stash_bytes == 2) {
                variants.push_back({RowStrategy::Stash, 2});
                variants.push_back({RowStrategy::GlobalReread, 2});
              }
            }
          }
          for (auto [strategy, elem] : variants) {
            if (opt.strategy && *opt.strategy != strategy) continue;
            if (opt.stash_bytes && elem != 0 && elem != *opt.stash_bytes) continue;
            Candidate v = c;
            v.strategy = strategy;
            v.stash_elem = elem;
            if (!budget(v)) continue;
            estimate(v);
            if (v.workspace > tun.max_workspace_bytes) {
              reject("workspace", fmt::format("global-reread needs {} of workspace (limit max_workspace_bytes {})",
                                            plan_detail::fmt_bytes(v.workspace),
                                            plan_detail::fmt_bytes(tun.max_workspace_bytes)));
              continue;
            }
            out.push_back(v);
          }
        }
      }
    }
    return out;
  }
};

// The cheapest, except that within near_tie of it the model is not trusted to tell
// candidates apart: prefer the simpler strategy (on-chip, then stash, then re-read; fp32
// before bf16: no workspace, exact intermediates), then the smaller cluster.
int simplicity(const Candidate& c) {
  int rank = c.strategy == RowStrategy::Stash ? 2 : c.strategy == RowStrategy::GlobalReread ? 4 : 0;
  return rank + (c.stash_elem == 2 ? 1 : 0);
}

const Candidate* pick(const std::vector<Candidate>& cs, double near_tie) {
  const Candidate* best = nullptr;
  for (const Candidate& c : cs)
    if (!best || c.est.total_us < best->est.total_us) best = &c;
  const Candidate* chosen = best;
  auto key = [](const Candidate* c) { return std::make_tuple(simplicity(*c), c->cluster, c->est.total_us); };
  for (const Candidate& c : cs)
    if (c.est.total_us <= best->est.total_us * (1 + near_tie) && key(&c) < key(chosen)) chosen = &c;
  return chosen;
}

// Elementwise epilogues (no row reduction): the configurations measured fastest on the
// H200, per shape class (bench/NOTES.md, run 3: ncu + same-power-state timing against
// cuBLAS). The cost model above is not calibrated for the mainloop; measurement wins.
struct MeasuredConfig {
  int tile_m, tile_n, wgs_per_tile, cluster_m, cluster_n, max_stages, raster_group;
  bool raster_along_n;
  std::string why;
};
MeasuredConfig measured_elementwise_config(const Problem& p) {
  const int64_t tiles_128 = ceil_div(p.m, 128) * ceil_div(p.n, 128);
  if (p.m <= 256)  // few row blocks: small tiles, pairs along N share A; L2-bound without split-K
    return {64, 128, 1, 1, 2, 8, 8, true, "M <= 256: PingPong 64x128, C_N = 2, raster along N (0.80x cuBLAS, run 3)"};
  if (tiles_128 >= 3000)  // >= ~8 waves of 128x128 tiles: cooperative 128x256, B shared along M
    return {128, 256, 2, 2, 1, 4, 8, false,
            "large (>= ~8 waves): cooperative 128x256, cluster 2 along M (B multicast), tensor pipe ~91% like cuBLAS"};
  if (tiles_128 >= 1500)
    return {128, 128, 1, 2, 1, 5, 4, false,
            "medium: PingPong 128x128 hides the epilogue behind the other WG's mainloop, cluster 2 along M"};
  // ~4 waves: with an epilogue, B shared along M measured 1.015x cuBLAS (plain GEMM alone
  // preferred no cluster by 3%, but a fused kernel always has an epilogue).
  return {128, 128, 1, 2, 1, 5, 8, false, "~4 waves: PingPong 128x128, cluster 2 along M, raster 8 M-blocks"};
}

void validate(const FusionSpec& s, const Problem& p, const DeviceModel& dev, const PlanOptions& opt) {
  try {
    check_problem_size(p.m, p.n, p.k, dim_label(s.m, "M"), dim_label(s.n, "N"), dim_label(s.k, "K"));
    check_device_limits(s);
  } catch (const Error& e) {
    throw Error(fmt::format("plan: {}", e.what()));
  }
  const int64_t eb = static_cast<int64_t>(size_of(p.ab_dtype));
  if ((p.k * eb) % 16 != 0)
    throw Error(fmt::format("plan: K = {} is not a multiple of {}: TMA needs 16-byte aligned rows of {} A and B "
                            "(pad K)", p.k, 16 / eb, name_of(p.ab_dtype)));
  if (s.b_layout == BLayout::KN && (p.n * eb) % 16 != 0)
    throw Error(fmt::format("plan: N = {} is not a multiple of {}: B is K x N (layout=kn) and TMA needs 16-byte "
                            "aligned rows", p.n, 16 / eb));
  for (const RuntimeArg& a : s.args)
    if (a.role == ArgRole::Output && a.value_class == ValueClass::Tile && (p.n * int64_t(size_of(a.dtype))) % 16 != 0)
      throw Error(fmt::format("plan: output '{}' ({} x {} {}) has rows of {} bytes; the TMA store needs a multiple "
                              "of 16 (N a multiple of {})", a.name, p.m, p.n, name_of(a.dtype),
                              p.n * int64_t(size_of(a.dtype)), 16 / size_of(a.dtype)));
  if (opt.cluster_n) {
    const int c = *opt.cluster_n;
    if (std::find(std::begin(kClusters), std::end(kClusters), c) == std::end(kClusters) || c > dev.max_cluster)
      throw Error(fmt::format("plan: cluster_n = {} is not one of 1, 2, 4, 8, 16 (max {} on this device)", c,
                              dev.max_cluster));
  }
  if (opt.tile_n && std::find(std::begin(kTileNs), std::end(kTileNs), *opt.tile_n) == std::end(kTileNs))
    throw Error(fmt::format("plan: tile_n = {} is not one of 64, 128, 192, 256", *opt.tile_n));
  if (opt.tile_m && *opt.tile_m != 64 && *opt.tile_m != 128)
    throw Error(fmt::format("plan: tile_m = {} is not 64 or 128 (rows per consumer warp group)", *opt.tile_m));
  const bool rg = plan_detail::row_groups_forced(opt);
  const bool rg_only = opt.row_group || (opt.aggregation && *opt.aggregation == AggregationMode::Global);
  if ((rg_only || opt.stash_bytes) && s.reduction_count() == 0)
    throw Error("plan: row_group, stash_bytes and aggregation global shape row reductions; this epilogue has none");
  if (opt.cluster_m && *opt.cluster_m > 1 && s.reduction_count() == 0) {
    if (opt.cluster_n && *opt.cluster_n > 1)
      throw Error("plan: clusters along M (cluster_m) or along N (cluster_n), not both");
    const int tn = opt.tile_n.value_or(128);
    if (s.b_layout == BLayout::KN && tn / 64 < *opt.cluster_m)
      throw Error(fmt::format("plan: B is K x N: a cluster of {} along M multicasts B in 64-column boxes, one per "
                              "CTA at least, so tile_n must be >= {} (got {})",
                              *opt.cluster_m, 64 * *opt.cluster_m, tn));
  }
  if (rg && s.reduction_count() > 0 && (opt.cluster_n || opt.strategy))
    throw Error("plan: row groups (cluster_m, row_group, aggregation global) do not combine with a forced cluster_n or "
                "strategy (those pick the DSMEM search)");
  if (opt.cluster_m && *opt.cluster_m != 1 && *opt.cluster_m != 2)
    throw Error(fmt::format("plan: cluster_m = {} is not 1 or 2", *opt.cluster_m));
  if (opt.row_group && (*opt.row_group < 1 || *opt.row_group > 64 || (*opt.row_group & (*opt.row_group - 1))))
    throw Error(fmt::format("plan: row_group = {} is not a power of two in 1..64", *opt.row_group));
  if (opt.stash_bytes && *opt.stash_bytes != 2 && *opt.stash_bytes != 4)
    throw Error(fmt::format("plan: stash_bytes = {} is not 2 (bf16) or 4 (fp32)", *opt.stash_bytes));
  if (opt.strategy && s.reduction_count() == 0 && *opt.strategy != RowStrategy::NoReduction)
    throw Error(fmt::format("plan: strategy {} asked for, but the epilogue has no reduction", name_of(*opt.strategy)));
  if (opt.strategy && s.reduction_count() > 0 && *opt.strategy == RowStrategy::NoReduction)
    throw Error("plan: strategy no-reduction asked for, but the epilogue has reductions");
}

}  // namespace

Plan make_plan(const FusionSpec& s, const Problem& p, const DeviceModel& dev, const PlannerTunables& tun,
               const PlanOptions& opt) {
  validate(s, p, dev, opt);
  const ChainInfo chain = plan_detail::analyze_chain(s);
  Search search{s, p, dev, tun, chain, static_cast<int>(size_of(p.ab_dtype)), {}};
  std::vector<Candidate> cands = search.run(opt);
  const bool forced = opt.cluster_n || opt.tile_n || opt.tile_m || opt.strategy || opt.aggregation || opt.cluster_m ||
                      opt.row_group || opt.stash_bytes;
  std::string measured_why;
  // Elementwise epilogue with clusters along M forced: the general search enumerates clusters
  // along N only, so the forced configuration stands in for the measured one (PingPong).
  const bool elementwise_cm = chain.reductions == 0 && opt.cluster_m.has_value();
  if (chain.reductions == 0 && (!forced || elementwise_cm)) {
    MeasuredConfig mc = measured_elementwise_config(p);
    if (elementwise_cm) {
      const int tm = opt.tile_m.value_or(128), tn = opt.tile_n.value_or(128);
      mc = {tm, tn, 1, *opt.cluster_m, 1, kMaxStages, 8, false,
            fmt::format("forced: PingPong {}x{}, clusters of {} along M (B multicast)", tm, tn, *opt.cluster_m)};
    }
    Candidate m;
    m.tile_m = mc.tile_m, m.tile_n = mc.tile_n, m.tile_k = 128 / search.ab_bytes, m.cluster = mc.cluster_n;
    m.wgs_per_tile = mc.wgs_per_tile, m.cluster_m = mc.cluster_m, m.max_stages = mc.max_stages;
    m.raster_group = mc.raster_group, m.raster_along_n = mc.raster_along_n;
    m.tiles_m = ceil_div(p.m, m.tile_m), m.tiles_n = ceil_div(p.n, m.tile_n);
    m.jobs = ceil_div(m.tiles_m, m.cluster_m) * ceil_div(m.tiles_n, m.cluster);  // one job = one cluster tile
    m.regs = m.tile_m / m.wgs_per_tile * m.tile_n / kThreadsPerWG + tun.reg_overhead;
    if (search.budget(m)) {
      search.estimate(m);
      cands.insert(cands.begin(), m);
      measured_why = mc.why;
    } else if (elementwise_cm) {
      throw Error(fmt::format("plan: {}: the SMEM budget does not fit two pipeline stages", mc.why));
    }
  }
  if (cands.empty()) {
    std::string why;
    for (const auto& [kind, ex] : search.rejections)
      why += ex.second > 1 ? fmt::format("\n  - {} (and {} more like it)", ex.first, ex.second - 1)
                           : "\n  - " + ex.first;
    if (why.empty()) why = "\n  - no candidate matches the forced options";
    throw Error(fmt::format("plan: nothing fits for {} x {} x {} ({} reductions):{}", p.m, p.n, p.k,
                            chain.reductions, why));
  }
  const Candidate* chosen = measured_why.empty() ? pick(cands, tun.near_tie) : &cands.front();

  // Row reductions, unless a DSMEM-specific option was forced: row groups of clusters along M
  // (row_groups.cpp), the cheapest division of the work whose SMEM budget fits. They replace
  // the DSMEM rule measured before (PingPong 64x256 in clusters of 2 along N: 1.2-2.0x cuBLAS,
  // its mainloop L2-bound because only A was multicast; bench/NOTES.md).
  Candidate red;
  const bool dsmem_forced = opt.cluster_n || opt.strategy ||
                            (opt.aggregation && *opt.aggregation != AggregationMode::Global);
  if (chain.reductions > 0 && chain.live_tile_values <= 1 && dev.multi_tile_rows && tun.use_row_groups && !dsmem_forced) {
    for (const plan_detail::RowGroupChoice& g : plan_detail::row_group_candidates(p, chain, dev, tun, opt)) {
      Candidate c;
      c.tile_m = g.tile_m, c.tile_n = g.tile_n, c.tile_k = 128 / search.ab_bytes, c.cluster = 1;
      c.cluster_m = g.cluster_m, c.row_group = g.row_group;
      c.tiles_m = ceil_div(p.m, c.tile_m), c.tiles_n = ceil_div(p.n, c.tile_n);
      c.n_tiles = g.n_tiles, c.jobs = g.jobs;
      c.agg = g.row_group > 1 ? AggregationMode::Global : AggregationMode::None;
      c.stash_elem = g.stash_elem;
      c.regs = c.tile_m * c.tile_n / kThreadsPerWG + tun.reg_overhead;
      c.strategy = c.n_tiles == 1 ? RowStrategy::OnChip : RowStrategy::Stash;
      bool ok = search.budget(c);
      if (!ok && c.strategy == RowStrategy::Stash) {  // not on chip: a global workspace, mostly L2
        c.smem = {};
        c.strategy = RowStrategy::GlobalReread;
        ok = search.budget(c);
      }
      if (!ok) continue;
      search.estimate(c);  // the DRAM floor; the times below are the row-group model's
      c.resident = static_cast<int>(g.groups * g.row_group);
      c.workspace = c.strategy == RowStrategy::GlobalReread
                        ? int64_t{c.resident} * c.cluster_m * kConsumerWGs * (c.n_tiles - 1) * c.tile_m * c.tile_n *
                              static_cast<int64_t>(chain.stash_nodes.size()) * c.stash_elem
                        : 0;
      c.est.mainloop_us = g.mainloop_us;
      c.est.epilogue_us = g.tail_us + g.exchange_us;
      c.est.reread_us = 0;
      c.est.total_us = std::max(g.est_us, c.est.dram_floor_us);
      red = c;
      chosen = &red;
      measured_why = "row reduction over a row group (src/plan/row_groups.cpp): " + g.describe() +
                     "; PingPong tiles with B multicast along M run at cuBLAS parity, the row's CTAs meet in L2";
      break;
    }
  }
  if (chain.reductions > 0 && plan_detail::row_groups_forced(opt) && chosen != &red)
    throw Error(fmt::format("plan: no row-group plan (PingPong 64x256, 128x128 or 64x128; clusters of 1 or 2 along M; "
                            "row groups of 1..64 clusters resident at once; <= 64 N-tiles per CTA) fits the forced "
                            "options for {} x {} x {}", p.m, p.n, p.k));
  const Candidate& c = *chosen;

  // When an option was forced, say what the model alone would have picked.
  std::string unforced;
  if (forced) {
    Search free_search{s, p, dev, tun, chain, search.ab_bytes, {}};
    std::vector<Candidate> all = free_search.run({});
    if (!all.empty()) unforced = pick(all, tun.near_tie)->describe();
  }

  Plan plan;
  plan.problem = p;
  plan.tile_m = c.tile_m, plan.tile_n = c.tile_n, plan.tile_k = c.tile_k;
  plan.stages = c.stages;
  plan.consumer_warp_groups = kConsumerWGs;
  plan.cluster_m = c.cluster_m, plan.cluster_n = c.cluster;
  plan.row_group = c.row_group;
  const int64_t groups = std::max<int64_t>(1, c.resident / std::max(1, c.row_group));
  plan.fused_pairs =
      plan_detail::fuse_pairs(chain, opt, c.n_tiles, ceil_div(c.jobs, groups), c.agg, c.cluster * c.row_group);
  plan.wgs_per_tile = c.wgs_per_tile;
  plan.measured_config = measured_why;
  plan.raster_group = c.raster_group;
  plan.raster_along_n = c.raster_along_n;
  plan.n_tiles_per_cta = static_cast<int>(c.n_tiles);
  plan.multicast_a = c.cluster > 1;
  plan.aggregation = c.agg;
  plan.strategy = c.strategy;
  plan.reductions = chain.reductions;
  plan.stages_in_chain = chain.stages_in_chain;
  plan.smem = c.smem;
  plan.smem_limit = dev.smem_per_cta_bytes;
  plan.tiles_m = c.tiles_m, plan.tiles_n = c.tiles_n;
  const int cluster_size = c.cluster * c.cluster_m;
  plan.clusters_resident = dev.clusters_resident.count(cluster_size) ? dev.clusters_resident.at(cluster_size) : 0;
  plan.ctas_busy = plan.clusters_resident * cluster_size;
  if (c.strategy == RowStrategy::Stash || c.strategy == RowStrategy::GlobalReread) {
    plan.stash_elem_bytes = c.stash_elem;
    plan.stashed = chain.stash_names;
  }
  plan.live_tile_values = chain.live_tile_values;
  plan.regs_per_thread = c.regs;
  plan.store_subtile_n = chain.has_tile_output ? std::min(c.tile_n, tun.store_subtile_n) : 0;
  plan.jobs = c.jobs;
  plan.grid_ctas = int64_t{c.resident} * c.cluster * c.cluster_m;
  plan.workspace_bytes = c.workspace;
  plan.estimate = c.est;

  // Runner-ups: the best candidate of each other (cluster, strategy) pair, cheapest first.
  std::vector<const Candidate*> others;
  std::set<std::pair<int, int>> seen{{c.cluster, static_cast<int>(c.strategy) * 8 + c.stash_elem}};
  std::vector<const Candidate*> sorted;
  for (const Candidate& x : cands) sorted.push_back(&x);
  std::sort(sorted.begin(), sorted.end(),
            [](const Candidate* a, const Candidate* b) { return a->est.total_us < b->est.total_us; });
  for (const Candidate* x : sorted)
    if (seen.insert({x->cluster, static_cast<int>(x->strategy) * 8 + x->stash_elem}).second && others.size() < 5)
      others.push_back(x);
  for (const Candidate* x : others) plan.alternatives.push_back(x->describe());

  plan_detail::add_reasons(plan, chain, dev, tun, opt, unforced);
  return plan;
}

}  // namespace comfuse
