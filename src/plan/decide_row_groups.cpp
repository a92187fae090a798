// The row-group decider: a row reduction whose CTAs are G clusters of the persistent grid
// (Aggregation::L2Exchange); the hardware cluster runs along M (B multicast), and the row's
// partials meet in L2 (kernels/comfuse/cluster/global_exchange.cuh).
//
// Why a model of its own: the DSMEM search (decide_cluster.cpp) prices mainloops with guessed
// efficiency tables; here the mainloop configurations are few and measured (PingPong 64x256
// or 128x128 with B multicast run at cuBLAS parity, bench/NOTES.md), so what decides is
// the work division, which is exact arithmetic:
//   jobs        = ceil(row blocks / cluster_m)        a job: cluster_m row blocks x all of N
//                 (an elementwise split-K's: x ceil(N-tiles / G), one N-tile a CTA)
//   groups      = min(jobs, clusters resident / G)    row groups running at once
//   T           = ceil(N-tiles / G)                   N-tiles per CTA and job
//   per CTA     = ceil(jobs / groups) jobs x T tiles of mainloop
// A job's epilogue is its stages' arithmetic (calibration.h row_group_epilogue_cycles), its
// stash re-reads and output stores, its tile inputs' reads (row_group_tile_input_pass_us a
// 64-column subtile), and one exchange round per reduction. PingPong hides it
// behind the other consumer's next mainloop while it is the shorter of the two; a longer one
// sets the pace, each consumer running mainloop + epilogue per job with the two mainloops
// interleaved on the tensor cores (a long chain of reductions: MEASURED per-job traces, 64x128
// beats 128x128). A CTA of J jobs of mainloop ml and epilogue epi takes
//   ml + epi + (J - 1) max(ml, (ml + epi) / 2)
// (the last epilogue exposed), plus a share of the stash traffic in each mainloop (it competes
// with the operand loads). With W consumer warp groups (KernelConfig::consumer_wgs, 64-row
// PingPong tiles) the mainloops still take turns, and W - 1 epilogues run beside each one:
//   ml + epi + (J - 1) max(ml, (ml + epi) / W),
// each epilogue stretched by the others beside it (calibration.h
// three_consumer_epilogue_stretch, measured). A CTA with one job only runs its one consumer alone: every
// epilogue exposed. Candidates whose storage fits (a stash that does not fit in SMEM moves to a
// workspace) are priced again at the ring depth that storage leaves; the cheapest then wins.
// Split-K (S > 1, one N-tile per CTA, every job in one wave): S split groups of G clusters share
// each job's K, so a CTA's mainloop is 1/S of the tile's, and the owner (split 0) then gathers
// the other S - 1 partial tiles before its epilogue (split_gather_us), on the critical path,
// which is why the many splits that would keep every SM streaming B lose at decode (MEASURED,
// before the tags were polled together: S = 16 owners spent 7.5 us gathering at M = 1, 13.7 us
// at M = 32, longer than their mainloops). Where jobs * G fill the GPU already,
// splitting only adds hand-overs, so it is not proposed.
// With the splits in one hardware cluster (KernelConfig::splits_in_cluster, forced or where
// calibration.h split_k_in_cluster allows) the owner's hand-over is over DSMEM
// (split_hand_over_us) and residency is that of clusters of S CTAs (30 of 4, 15 of 8).
// A one-wave plan (each CTA one job) also pays the launch's fixed cost (calibration.h
// one_wave_launch_us): at decode it is a fifth of the time.
// An epilogue without reductions comes here for split-K (decide_elementwise.cpp): the same
// division with one N-tile a CTA, a job G of a row block's N-tiles (nothing to exchange: no
// aggregation), and the split's gather before each tile's epilogue.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "plan_internal.h"

namespace comfuse::plan_detail {
namespace {


struct TileShape {
  int tile_m, tile_n;
  int wgs = 1;  // consumer warp groups on one tile: 1 PingPong, 2 cooperative (64 rows each)
};
// Cooperative 128x256 reads the least from L2 a MAC, but its epilogue is not hidden behind the
// other warp group's mainloop: priced so (Division::priced; both warp groups' epilogues at once,
// calibration.h row_group_cooperative_epilogue_share), it wins where the PingPong tiles' mainloops
// slow down (rows off 128-byte lines, calibration.h unaligned_rows_efficiency; the H100's
// PingPong rates, calibration.cpp device_model) and where long epilogues pace the job (a chain of
// reductions at K = 1024: 2.40x cuBLAS against PingPong 64x128's 3.08x on the H100, bench/NOTES.md
// Stop 54); at the H200's prefill shapes PingPong keeps it (RMSNorm 8192x4096x4096 1.000x against
// cooperative's 1.078x).
// 64x64 for a gated GEMM (its wgmma covers 128 columns, B's and the gate's, the plain 64x128's),
// else only where forced (search_row_groups).
constexpr TileShape kTiles[] = {{64, 256}, {128, 128}, {64, 128}, {128, 256, 2}, {64, 64}};
constexpr int kClusterMs[] = {2, 1};
constexpr int kGroups[] = {1, 2, 4, 8, 16, 32, 64};
constexpr int kSplits[] = {1, 2, 3, 4, 6, 8, 12, 16};

// The model's account of one division of the work (microseconds).
struct Division {
  int64_t jobs_per_cta = 1;
  double job_mainloop_us = 0;  // one job's mainloops (T tiles), at full ring speed
  double job_epilogue_us = 0;  // one job's epilogue: arithmetic, stash and store traffic, rounds
  double exchange_us = 0;      // of it: the rounds and split-K's gather
  double gather_us = 0;        // of that: split-K's gather
  int64_t tile_input_passes = 0;  // the epilogue's read passes of its tile inputs (64 columns each)
  double tile_inputs_us = 0;       // and their time
  int gather_rounds = 0;       // the owner's dependent L2 round trips of loads (split_gather_us)
  double stream_us = 0;  // one wave: the time one SM needs to pull its share of B (a tie-break)
  bool idle_ctas = false;  // some CTA of a cluster along M has no rows (M < cluster_m row blocks)
  double launch_us = 0;  // one wave: the launch's fixed cost (in the estimate and its tail)
  // The root stage's tile inputs in the ring (KernelConfig::ring_input_bytes): how long a job's
  // consumer holds their slot once its MMAs end, and one k-block of the other consumer's MMAs.
  double ring_hold_us = 0, kblock_us = 0;
  double ring_stall_us = 0;  // priced(): what that hold costs each of the other consumer's jobs
  double mainloop_us = 0, tail_us = 0, est_us = 0;  // priced(): the CTA's time and its parts
  bool cooperative = false;  // both warp groups on each job: no epilogue under another mainloop
  int consumers = Sm90::kConsumerWGs;  // PingPong: warp groups taking the jobs in turn
  double unaligned_rows = 1.0;  // the mainloop's speed on rows off 128-byte lines (1: aligned or not charged)

  // The ring stages a consumer's mainloop keeps while the others hold their tile inputs' slots
  // (each consumer in its epilogue's first stage may hold one), and what a hold costs its job
  // (priced): the hold less the k-blocks, at `ring` of full speed, that those stages cover.
  int stages_beside_held(int stages) const { return stages - (consumers - 1); }
  double held_stall_us(double hold_us, double ring, int stages) const {
    return std::max(0.0, hold_us - double(stages_beside_held(stages)) * kblock_us / ring);
  }

  // The CTA's time with the mainloops at `ring` of full speed over `stages` ring stages (both
  // known only once the epilogue's SMEM is). The ring is a FIFO: while one consumer holds its tile
  // inputs' slot, the producer can refill only the stages - 1 others, so the other consumer's
  // mainloop starves once it has eaten those k-blocks, unless that consumer's own epilogue is
  // the longer wait anyway.
  void priced(double ring, int stages) {
    const double ml = job_mainloop_us / ring;
    ring_stall_us = held_stall_us(ring_hold_us, ring, stages);
    mainloop_us = double(jobs_per_cta) * ml;
    est_us = launch_us + (jobs_per_cta == 1 || cooperative
                              ? double(jobs_per_cta) * (ml + job_epilogue_us)
                              : ml + job_epilogue_us +
                                    double(jobs_per_cta - 1) *
                                        std::max(ml + ring_stall_us, (ml + job_epilogue_us) / consumers));
    tail_us = est_us - mainloop_us - exchange_us;
  }
};

// Split-K's hand-over on the owner's path (scheduler/split_k.cuh SplitK::gather): the owner
// adds the S - 1 other partial tiles (only rows < M travel), their loads in dependent L2 round
// trips. Summed in SMEM by the whole warp group (KernelConfig::split_gather_rows, which
// planner.cpp gives the rows wherever their staging fits beside the ring as planned: decode rows
// of at most 16 at up to 128 accumulator columns, any rows of a 64x64 tile's 64, fewer beside a
// longer epilogue's SMEM, which this ignores): KernelConfig::split_gather_rounds.
// Else each thread loads its own accumulators' partials, a row slot at a time: one round per
// slot of the busiest thread (thread 0: rows 0, 8, 64, 72 of accum_row below M).
// The staged sum's configuration (its split_gather_* terms), or none where the rows are not summed in SMEM.
// A gated tile's partials are both products (KernelConfig::mma_n columns).
std::optional<KernelConfig> staged_gather(int tile_m, int tile_n, bool gated, int64_t rows, int ks) {
  const int mma_n = tile_n * (gated ? 2 : 1);
  const bool decode = rows <= 16 && rows < tile_m && mma_n <= 128, narrow = tile_m == 64 && mma_n <= 64;
  if (ks <= 1 || !(decode || narrow)) return std::nullopt;
  KernelConfig staged;
  staged.tile_m = tile_m, staged.tile_n = tile_n, staged.gated = gated, staged.k_splits = ks;
  staged.a_box_rows = rows < tile_m ? align_up(static_cast<int>(rows), 8) : 0;
  staged.split_gather_rows = staged.split_gather_rows_wanted();
  return staged;
}
int gather_rounds(const std::optional<KernelConfig>& staged, int tile_m, int64_t rows, int ks) {
  if (ks <= 1) return 0;
  if (staged) return staged->split_gather_rounds();
  int slots = 0;
  for (int mi = 0; mi < tile_m / 64; ++mi)
    for (int h = 0; h < 2; ++h) slots += mi * 64 + 8 * h < rows ? 1 : 0;
  return slots;
}
// bytes: what the owner loads, all splits' partial rows (tagged words: 8 bytes a value).
double split_gather_us(const PlannerTunables& tun, int ks, int rounds, double bytes) {
  if (ks <= 1) return 0.0;
  return tun.split_k_gather_base_us + double(ks - 1) * rounds * tun.split_k_gather_per_split_us +
         bytes / tun.split_k_gather_sm_bytes_per_s * 1e6;
}

// Split-K over DSMEM (KernelConfig::splits_in_cluster): the owner's hand-over of a job with
// `rows` rows below M, one piece per warp holding some (cluster/split_hand_over.cuh).
double split_hand_over_us(const PlannerTunables& tun, const KernelConfig& k, int64_t rows) {
  return split_hand_over_pieces(static_cast<int>(rows)) *
         (tun.split_k_hand_over_piece_us + k.split_hand_over_steps() * tun.split_k_hand_over_step_us);
}

// One job's epilogue arithmetic on its consumer warp group(s): T tiles of (a warp group's share
// of the tile / 128 threads) values a thread, ops_per_element instructions each (chain.cpp), at
// the cycles per instruction measured for that many values a thread.
double epilogue_arithmetic_us(const ChainInfo& chain, const PlannerTunables& tun, const DeviceModel& dev, TileShape ts,
                              int64_t n_tiles) {
  const int values = ts.tile_m * ts.tile_n / ts.wgs / Sm90::kWarpGroupThreads;
  // Without a reduction (an elementwise split-K) one stage: the elementwise plans' rate
  // (calibration.h epilogue_cpi; the table was fitted on chains of reductions and overprices it).
  const double cycles = chain.reductions == 0 ? tun.epilogue_cpi : lookup(tun.row_group_epilogue_cycles, values);
  return double(n_tiles) * values * chain.ops_per_element * cycles / dev.clock_hz * 1e6;
}

}  // namespace

// The row-group model's candidates, cheapest first.
static std::vector<Candidate> search_row_groups(const Request& r, Rejections& why) {
  const Problem& p = r.p;
  const ChainInfo& chain = r.chain;
  const DeviceModel& dev = r.dev;
  const PlannerTunables& tun = r.tun;
  const PlanOptions& opt = r.opt;
  struct Option {
    Candidate c;
    Division d;
    int resident = 0;  // clusters: whole row groups at once
  };
  std::vector<Option> options;
  // More consumer warp groups only where forced: measured slower wherever tried (calibration.h
  // three_consumer_epilogue_stretch).
  const int wgs = opt.consumer_wgs.value_or(Sm90::kConsumerWGs);
  // A gated tile (KernelConfig::gated) streams B's and the gate's columns and computes both products.
  const int b_operands = r.spec.gated() ? 2 : 1;
  for (const TileShape& ts : kTiles) {
    if (opt.tile_m && *opt.tile_m != ts.tile_m) continue;
    if (opt.tile_n && *opt.tile_n != ts.tile_n) continue;
    // 64-column tiles: the gated tile's (both halves one 128-column wgmma), or an elementwise
    // epilogue's where forced (calibration.cpp narrow_tile_k_splits' split). A row reduction's
    // forced 64-column tiles are the DSMEM plans', unless row groups are forced too (decode rows
    // split over up to twice the SMs: calibration.cpp narrow_row_group_k_splits takes them where they
    // measured faster), and then with one N-tile a CTA only (the one such shape the GPU tests hold).
    const bool narrow = ts.tile_n == 64 && !r.spec.gated();
    if (narrow && !(opt.tile_n && (chain.reductions == 0 || row_groups_forced(opt)))) continue;
    for (int cm : kClusterMs) {
      if (opt.cluster_m && *opt.cluster_m != cm) continue;
      const int resident = dev.resident(cm);
      if (resident == 0) continue;
      const int64_t tiles_m = ceil_div64(p.m, ts.tile_m), tiles_n = ceil_div64(p.n, ts.tile_n);
      std::vector<int> splits(std::begin(kSplits), std::end(kSplits));
      if (opt.k_splits) splits = {*opt.k_splits};
      for (int g : kGroups)
      for (int ks : splits)
      for (bool in_cluster : {false, true})
      for (bool inputs_in_ring : {true, false}) {
        if (opt.row_group && *opt.row_group != g) continue;
        if (!opt.row_group && g > 1 && g / 2 >= tiles_n) continue;  // CTAs with no columns at all
        // The splits' hand-over over DSMEM: one hardware cluster of the ks CTAs, no multicast
        // cluster; proposed unforced only where calibration.h says it was measured to win.
        if (in_cluster && (ks < 2 || cm != 1)) continue;
        if (in_cluster && !opt.splits_in_cluster.value_or(tun.split_k_in_cluster)) continue;
        if (!in_cluster && ks > 1 && opt.splits_in_cluster.value_or(false)) continue;
        const int resident_here = in_cluster ? dev.resident(ks) * ks : resident;  // one-CTA clusters
        const int64_t groups_max = resident_here / (int64_t{g} * ks);
        if (groups_max < 1) continue;
        // A row reduction holds a row's columns in its row group (n_tiles each); an elementwise
        // epilogue (split-K) takes one N-tile a job, and its jobs walk N as well as M (grid.cuh job_count).
        const int64_t n_tiles = chain.reductions > 0 ? ceil_div64(tiles_n, g) : 1;
        if (n_tiles > Sm90::kMaxNTiles || (narrow && n_tiles > 1)) continue;
        const int64_t jobs = ceil_div64(tiles_m, cm) * ceil_div64(tiles_n, g * n_tiles);
        if (two_round_pair_group(chain, opt, p.m, tiles_n, g, jobs, groups_max)) continue;
        if (ts.wgs > 1 && ks > 1) {
          if (opt.tile_m && opt.tile_n)
            why.add("row-group division", fmt::format("cooperative 128x256 in row groups of {}: {} K-splits, where its "
                                                      "jobs take the whole of K", g, ks));
          continue;
        }
        const int64_t k_blocks = ceil_div64(p.k, Sm90::kTileK);
        if (ks > 1 && !opt.k_splits) {
          // Only where the jobs leave SMs idle, one N-tile a CTA, and each split has k-blocks to stream.
          if (n_tiles > 1 || jobs > groups_max || k_blocks < int64_t{ks} * tun.split_k_min_k_blocks)
            continue;
        }
        Option o;
        Candidate& c = o.c;
        c.k.b_kmajor = r.spec.b_layout == BLayout::NK;
        c.k.gated = r.spec.gated();
        c.k.tile_m = ts.tile_m, c.k.tile_n = ts.tile_n, c.k.wgs_per_tile = ts.wgs, c.k.cluster_m = cm, c.k.row_group = g;
        c.k.consumer_wgs = wgs;
        c.k.n_tiles = static_cast<int>(n_tiles);
        c.k.k_splits = ks;
        if (check_consumer_wgs(c.k)) continue;  // tiles and divisions more consumers cannot take
        c.k.splits_in_cluster = in_cluster;
        c.k.row_reduction = chain.reductions > 0;
        c.k.aggregation = g > 1 && chain.reductions > 0 ? Aggregation::L2Exchange : Aggregation::None;
        const OneRoundPairs fuse = fuse_pairs(chain, opt, c.k);
        if (n_tiles > 1 && chain.carries_tile) {
          const StashType st = stash_type(chain, opt, tun, fuse, c.k.n_tiles);
          c.k.stash_elem_bytes = st.elem_bytes;
          c.k.stash_centers = st.centers;
        }
        c.k.stash_space = c.k.stash_elem_bytes > 0 ? StashSpace::Smem : StashSpace::None;
        // Cooperative jobs of several N-tiles: where forced, or where they measured faster and their kernels fit.
        if (ts.wgs > 1 && n_tiles > 1 && !(opt.tile_m && opt.tile_n) &&
            !cooperative_stash_taken(c.k, tiles_n, fuse.mean_variance)) {
          why.add("row-group division", fmt::format("cooperative 128x256 with {} N-tiles a job among {} peers, rows of {} "
                                                    "tiles, a {}-byte stash: not where measured faster or its kernel "
                                                    "fits (calibration.h cooperative_stash_taken)",
                                                    n_tiles, c.k.row_peers(), tiles_n, c.k.stash_elem_bytes));
          continue;
        }
        // The root stage's tile inputs in the ring where the kernel can carry them, or from L2:
        // both priced (Division::priced), unless forced.
        const int ring_bytes = ring_input_bytes(r.spec, c.k, opt);
        if (inputs_in_ring ? ring_bytes == 0 : ring_bytes > 0 && opt.ring_inputs) continue;
        c.k.ring_input_bytes = inputs_in_ring ? ring_bytes : 0;
        c.ring_inputs_declined = !inputs_in_ring && ring_bytes > 0;
        c.tiles_m = tiles_m, c.tiles_n = tiles_n;
        c.jobs = jobs;
        const int64_t groups = std::min(c.jobs, groups_max);
        o.resident = static_cast<int>(groups * g * ks);
        c.regs = c.k.accumulators() + tun.reg_overhead;
        if (c.regs > c.k.consumer_regs()) {
          why.add("registers", fmt::format("{} consumer warp groups, {}x{} tiles: ~{} registers a thread exceed their {}",
                                           wgs, ts.tile_m, ts.tile_n, c.regs, c.k.consumer_regs()));
          continue;
        }
        const int64_t jobs_per_cta = ceil_div64(c.jobs, groups);
        if (!opt.tile_n && stash_tile_refused(c.k, jobs_per_cta)) {  // 256-column tiles asked for are given
          why.add("row-group division", fmt::format("{}x{} with a stash over {} N-tiles a job and {} jobs a CTA: slower "
                                                    "than 128x128 and 64x128 where measured (calibration.h stash_tile_refused)",
                                                    ts.tile_m, ts.tile_n, n_tiles, jobs_per_cta));
          continue;
        }
        // One job a CTA: no other consumer for the held slot to starve; the ring as measured there.
        if (c.ring_inputs_declined && jobs_per_cta == 1) continue;
        // Split-K's hand-over tags carry a warp group's job number in 16 bits (split_k.cuh).
        if (ks > 1 && ceil_div64(jobs_per_cta, wgs) >= 65535) continue;
        // Rows off 128-byte lines slow the MACs' feed, measured where the MACs pace the CTA
        // (several jobs each); a one-wave division streaming B was not measured so.
        const int tile_key = ts.tile_m * 1000 + ts.tile_n * b_operands;  // the wgmma's columns
        const double unaligned_rows = rows_off_128_byte_lines(p) && jobs_per_cta > 1
                                          ? lookup(tun.unaligned_rows_efficiency, tile_key)
                                          : 1.0;
        const double eff = lookup(tun.row_group_mainloop_efficiency, tile_key) * (ts.wgs > 1 ? 1.0 : dev.pingpong(tile_key)) *
                           (cm > 1 ? 1.0 : tun.row_group_no_multicast_efficiency) * unaligned_rows;
        // A CTA's share of a tile's MACs (all rows: the tensor cores compute the tile's rows past M too).
        const double t_tile = 2.0 * ts.tile_m * ts.tile_n * b_operands * double(p.k) / ks / (dev.sm_flops_per_s * eff) * 1e6;
        // Epilogue bytes of one tile: the stash written once, read back by each later stage and
        // written back by each that passes a tile value on (none when T == 1; a pair's two stages
        // that stream together read it once), the outputs written. At one SM's share of DRAM
        // bandwidth.
        const double elems = double(ts.tile_m) * ts.tile_n;
        const double stage1 = c.k.stash_tile_bytes(ts.tile_m);
        const int passes = stash_reads_after_round(chain, fuse, n_tiles) + stash_write_backs_after_round(chain, fuse, n_tiles);
        const double stage2 = stage1 * passes + elems * chain.max_out_bytes;
        const double per_sm_bytes_per_us = dev.dram_bytes_per_s / dev.sm_count * 1e-6;
        const double t_s1 = stage1 / per_sm_bytes_per_us, t_s2 = stage2 / per_sm_bytes_per_us;
        c.k.pair_hand_over = pair_hand_over(fuse, p.m, c.k);  // before the ring's fit: the hand-over is SMEM
        const int rounds = chain.reductions - (fuse.mean_variance ? chain.mean_variance_pairs : 0) -
                           (fuse.max_exp_sum ? chain.max_exp_sum_pairs : 0);
        Division& d = o.d;
        d.jobs_per_cta = jobs_per_cta;
        d.cooperative = ts.wgs > 1;
        d.consumers = wgs;
        d.unaligned_rows = unaligned_rows;
        // The job with the most rows sets the owner's gather: all of a tile's rows below M.
        const int64_t job_rows = std::min<int64_t>(p.m, ts.tile_m);
        const auto staged = staged_gather(ts.tile_m, ts.tile_n, c.k.gated, job_rows, ks);
        d.gather_rounds = gather_rounds(staged, ts.tile_m, job_rows, ks);
        const double gather_bytes = double(ks - 1) * double(job_rows) * ts.tile_n * b_operands *
                                    (staged ? staged->split_value_bytes() : 4);
        const double gather = in_cluster ? split_hand_over_us(tun, c.k, job_rows)
                                         : split_gather_us(tun, ks, d.gather_rounds, gather_bytes);
        d.gather_us = gather;
        d.exchange_us = rounds * lookup(tun.row_group_exchange_us, g) + gather;
        // The tile inputs: a latency-bound pass per 64-column subtile, for the tile's rows below
        // M; those in the ring (the root stage's) at SMEM's price.
        const int in_ring = c.k.ring_input_bytes > 0 ? static_cast<int>(r.spec.root_tile_inputs().size()) : 0;
        d.tile_input_passes = n_tiles * chain.tile_inputs * (ts.tile_n / 64);
        d.ring_hold_us = in_ring > 0 ? tun.row_group_ring_input_hold_us : 0.0;
        d.kblock_us = t_tile / double(ceil_div64(k_blocks, ks));
        d.tile_inputs_us = double(n_tiles * (ts.tile_n / 64)) *
                           ((chain.tile_inputs - in_ring) * tun.row_group_tile_input_pass_us *
                                (double(std::min<int64_t>(p.m, ts.tile_m)) / ts.tile_m) +
                            in_ring * tun.row_group_ring_input_pass_us);
        // Cooperative: both warp groups' epilogues at once on every SM sub-partition, with no
        // mainloop's warp group beside them (calibration.h row_group_cooperative_epilogue_share).
        const double share = ts.wgs > 1 ? tun.row_group_cooperative_epilogue_share : 1.0;
        const double arithmetic = share * (epilogue_arithmetic_us(chain, tun, dev, ts, n_tiles) + d.tile_inputs_us);
        // A CTA's share of B a job (a multicast cluster shares it), and all of B.
        const double b_cta = double(ts.tile_n) * b_operands * double(p.k) / ks * Sm90::kAbBytes / cm;
        const double b_all = double(p.n) * b_operands * double(p.k) * Sm90::kAbBytes;
        if (jobs_per_cta == 1) {  // one consumer alone: nothing overlaps its epilogue
          // One wave (decode, small M): B streams from DRAM once, and what bounds the mainloop
          // is whichever is slower of a CTA's tiles of MACs, the bytes of B one SM pulls in
          // (a multicast cluster shares them), and all of B over the DRAM, which a one-wave grid
          // pulls at a rate that depends on its clusters: single CTAs, pairs along M that share B
          // for two row blocks, or pairs whose second CTA holds no rows (calibration.h). Pairs
          // whose CTAs both hold rows run at the shared-B rate where measured so (bench/NOTES.md
          // Stop 30): without a reduction (an elementwise split-K, calibration.cpp's small-M row:
          // 128 x 4096 x 16384, 3.1 TB/s), and with one on 64x128 tiles, one N-tile a CTA (M =
          // 128, split-K 2, pairs against single CTAs: LayerNorm 4096 x 4096 22.0 -> 18.6 us,
          // RMSNorm 19.8 -> 16.0, softmax 22.3 -> 18.2, residual LayerNorm 24.5 -> 20.4,
          // LayerNorm K = 16384 62.2 -> 47.0). Elsewhere this model keeps the decode fit: priced
          // at the shared rate, RMSNorm 256 x 4096 x 4096 moved to 64x256 split-K 2 (25.5 us
          // against 20.7) and RMSNorm 128 x 16384 x 4096 to two 64x256 N-tiles a CTA (60.9
          // against 56.7), both slower (bench/sweeps/row_groups_shared_b.txt).
          const bool shares_b =
              tiles_m >= cm && (chain.reductions == 0 || (ts.tile_m == 64 && ts.tile_n <= 128 && n_tiles == 1));
          const double dram = tun.one_wave_dram(cm, shares_b);
          d.stream_us = double(n_tiles) * b_cta / tun.sm_stream_bytes_per_s * 1e6;
          d.idle_ctas = tiles_m < cm;
          d.job_mainloop_us = std::max({double(n_tiles) * t_tile, d.stream_us, b_all / dram * 1e6});
          d.job_epilogue_us = double(n_tiles) * (t_s1 + t_s2) * share + arithmetic + d.exchange_us;
          d.launch_us = tun.one_wave_launch_us;
        } else {  // the other consumer's mainloops hide all but a share of the stash traffic
          d.job_mainloop_us = double(n_tiles) * (t_tile + tun.row_group_stash_exposed * t_s1);
          // An elementwise split-K of several jobs a CTA (decode rows over more N-tiles than a row
          // group holds) is still one launch over all of B: B from DRAM once, at the one-wave grid's
          // rate, its jobs sharing that time, and the launch's fixed cost, as the one-wave branch.
          if (chain.reductions == 0) {
            d.job_mainloop_us = std::max(d.job_mainloop_us,
                                         b_all / tun.one_wave_dram(cm, tiles_m >= cm) * 1e6 / double(jobs_per_cta));
            d.idle_ctas = tiles_m < cm;
            d.launch_us = tun.one_wave_launch_us;
            // What one SM pulls over its jobs (the tie-break below: one wave over several rounds).
            d.stream_us = double(jobs_per_cta) * b_cta / tun.sm_stream_bytes_per_s * 1e6;
          }
          d.job_epilogue_us = double(n_tiles) * t_s2 * share + arithmetic + d.exchange_us;
        }
        if (wgs > Sm90::kConsumerWGs) d.job_epilogue_us *= tun.three_consumer_epilogue_stretch;
        d.priced(1.0, c.max_ring_stages);
        options.push_back(o);
      }
    }
  }
  // Where the DRAM bounds several divisions alike (decode), the one whose SMs pull the least each
  // keeps the most slack, and one without CTAs idle for want of rows (MEASURED: RMSNorm
  // 1 x 2048 x 4096, S = 4 and 8 with clusters of 1 at 1.98-2.03x cuBLAS, S = 2 with clusters of
  // 2 along M, whose second CTA has no rows, at 2.33x). An elementwise split-K's row groups of
  // every size run the same CTAs over the same tiles: the fewest jobs (a row block's N-tiles in
  // one group, as measured) where a group can cover them.
  std::stable_sort(options.begin(), options.end(), [](const Option& a, const Option& b) {
    if (a.d.est_us != b.d.est_us) return a.d.est_us < b.d.est_us;
    if (a.d.stream_us != b.d.stream_us) return a.d.stream_us < b.d.stream_us;
    if (a.d.idle_ctas != b.d.idle_ctas) return a.d.idle_ctas < b.d.idle_ctas;
    return a.c.jobs < b.c.jobs;
  });

  std::vector<Candidate> out;
  for (Option& o : options) {
    Candidate& c = o.c;
    bool ok = fit_ring(c, chain, dev, opt.ring_stages) &&
              (c.k.stash_space != StashSpace::Smem ||
               c.k.consumer_wgs * c.k.stash_bytes_per_wg() <= tun.max_stash_bytes);
    if (!ok && c.k.stash_space == StashSpace::Smem) {  // not on chip: a global workspace, mostly L2
      c.k.stash_space = StashSpace::Workspace;
      ok = fit_ring(c, chain, dev, opt.ring_stages);
    }
    if (ok && check(c.k) != nullptr) ok = false;
    if (!ok) {
      why.add("row-group storage", fmt::format("{} {}x{} clusters {}x1, row group {}, {} K-split(s): {}",
                                               c.k.schedule(), c.k.tile_m, c.k.tile_n, c.k.cluster_m, c.k.row_group, c.k.k_splits,
                                               check(c.k) ? check(c.k) : "fewer than 2 pipeline stages fit"));
      continue;
    }
    // The ring depth is known only now (what the epilogue's SMEM leaves): a shallow ring
    // starves the mainloop (a cooperative tile's stage counts twice: calibration.h).
    const int ring_as_pingpong = c.k.ring_stages * c.k.wgs_per_tile;
    const double ring = lookup(tun.row_group_ring_efficiency, ring_as_pingpong);
    o.d.priced(ring, c.k.ring_stages);
    estimate_cluster(c, r);  // the DRAM floor; the times below are the row-group model's
    c.resident = o.resident;
    // A cooperative tile (128 accumulators a thread) with a long chain begins in the epilogue
    // (calibration.h cooperative_begin_early_max_stages).
    c.k.begin_early =
        begins_early(c) && !(c.k.wgs_per_tile > 1 && chain.stages_in_chain > tun.cooperative_begin_early_max_stages);
    c.k.poll_backoff = c.k.aggregation == Aggregation::L2Exchange &&
                       opt.poll_backoff.value_or(poll_backoff_wanted(c.k.row_peers(), one_job_a_cta(c)));
    c.workspace = int64_t{c.resident} * c.k.cluster_size() * c.k.stash_workspace_bytes_per_cta();
    c.est.mainloop_us = o.d.mainloop_us;
    c.est.epilogue_us = o.d.tail_us + o.d.exchange_us;
    c.est.reread_us = 0;
    c.est.total_us = std::max(o.d.est_us, c.est.dram_floor_us);
    const bool one_wave_split = o.d.jobs_per_cta == 1 && c.k.k_splits > 1;
    c.est.low_us =
        one_wave_split ? std::max(c.est.total_us / tun.one_wave_split_overestimate, c.est.dram_floor_us) : c.est.total_us;
    c.why = chain.reductions > 0
                ? fmt::format("row reduction over a row group (src/plan/decide_row_groups.cpp): {} {}x{}, clusters "
                              "{}x1 in row groups of {}, {} N-tile(s)/CTA: est {:.1f} us (mainloop {:.1f}, tail {:.1f}, "
                              "exchange {:.1f}); {}, the row's CTAs meet in L2",
                              c.k.schedule(), c.k.tile_m, c.k.tile_n, c.k.cluster_m, c.k.row_group, c.k.n_tiles,
                              o.d.est_us, o.d.mainloop_us, o.d.tail_us, o.d.exchange_us,
                              c.k.wgs_per_tile > 1 ? "both warp groups on each 128x256 tile (64 rows each), its epilogue "
                                                     "not hidden"
                              : c.k.tile_n == 64 && !c.k.gated
                                  ? "64x64 tiles, decode rows over up to twice the SMs of 64x128 (measured faster only "
                                    "where a row takes at most 32 of them)"
                                  : "PingPong tiles with B multicast along M run at cuBLAS parity")
                : fmt::format("elementwise epilogue over the row-group division (src/plan/decide_row_groups.cpp): "
                              "{} {}x{}, clusters {}x1, {} job(s) of up to {} N-tiles, one a CTA: est {:.1f} us "
                              "(mainloop {:.1f}, tail {:.1f}, gather {:.1f}; the tail's arithmetic is the reduction "
                              "epilogues' fit, not measured for elementwise ones)",
                              c.k.schedule(), c.k.tile_m, c.k.tile_n, c.k.cluster_m, c.jobs, c.k.row_group, o.d.est_us,
                              o.d.mainloop_us, o.d.tail_us, o.d.exchange_us);
    if (c.k.splits_in_cluster)
      c.why += fmt::format("; split-K in a cluster: the {} CTAs of one hardware cluster share each tile's K ({} k-blocks "
                           "each, {} SMs busy instead of {}), and the owner adds their partial tiles over DSMEM ({:.1f} us "
                           "a job: {} piece(s) x ({:.2f} + {} round(s) of remote loads x {:.2f} us), calibration.h "
                           "split_k_hand_over_*)",
                           c.k.k_splits, ceil_div64(ceil_div64(p.k, Sm90::kTileK), c.k.k_splits), c.resident,
                           c.resident / c.k.k_splits, o.d.gather_us,
                           split_hand_over_pieces(static_cast<int>(std::min<int64_t>(p.m, c.k.tile_m))),
                           tun.split_k_hand_over_piece_us, c.k.split_hand_over_steps(), tun.split_k_hand_over_step_us);
    else if (c.k.k_splits > 1)
      c.why += fmt::format("; split-K: {} clusters share each tile's K ({} k-blocks each, {} SMs busy instead of {}), "
                           "the owner then adds their partial tiles ({:.1f} us a job = {:.1f} + {} splits x {} L2 round "
                           "trip(s) of loads x {:.2f} us + their bytes, calibration.h split_k_gather_*)",
                           c.k.k_splits, ceil_div64(ceil_div64(p.k, Sm90::kTileK), c.k.k_splits),
                           int64_t{c.resident} * c.k.cluster_size(),
                           int64_t{c.resident} * c.k.cluster_size() / c.k.k_splits, o.d.gather_us,
                           tun.split_k_gather_base_us, c.k.k_splits - 1, o.d.gather_rounds,
                           tun.split_k_gather_per_split_us);
    if (o.d.tile_inputs_us > 0)
      c.why += c.k.ring_input_bytes > 0
                   ? fmt::format("; a job's epilogue reads its {} tile input(s) in {:.1f} us ({} pass(es) of 64 columns; "
                                 "the first stage's from the mainloop's ring, calibration.h "
                                 "row_group_ring_input_pass_us)",
                                 chain.tile_inputs, o.d.tile_inputs_us, o.d.tile_input_passes)
                   : fmt::format("; a job's epilogue reads its {} tile input(s) in {:.1f} us ({} pass(es) of 64 columns, "
                                 "latency-bound: calibration.h row_group_tile_input_pass_us)",
                                 chain.tile_inputs, o.d.tile_inputs_us, o.d.tile_input_passes);
    // What a held slot of tile inputs costs the other consumer's job, and its terms.
    const auto held_slot = [&](double hold_us) {
      return fmt::format("{:.1f} us a job ({:.1f} us held against {} k-blocks of {:.2f} us in the other stages: "
                         "calibration.h row_group_ring_input_hold_us)",
                         o.d.held_stall_us(hold_us, ring, c.k.ring_stages), hold_us,
                         o.d.stages_beside_held(c.k.ring_stages), o.d.kblock_us / ring);
    };
    if (c.ring_inputs_declined)
      c.why += "; not in the ring, which could carry them: holding its slot through the first stage would starve the "
               "other consumer's mainloop " +
               held_slot(tun.row_group_ring_input_hold_us);
    if (o.d.ring_stall_us > 0)
      c.why += "; holding that slot through the first stage starves the other consumer's mainloop " +
               held_slot(o.d.ring_hold_us);
    if (o.d.unaligned_rows < 1.0)
      c.why += fmt::format("; K = {} leaves A's rows off 128-byte lines: this tile's mainloop at {:.2f} of its speed "
                           "(MEASURED, calibration.h unaligned_rows_efficiency)",
                           p.k, o.d.unaligned_rows);
    if (o.d.launch_us > 0)
      c.why += fmt::format("; one wave: the tail holds the launch's fixed cost, {:.1f} us (calibration.h one_wave_launch_us)",
                           o.d.launch_us);
    if (ring < 1.0)
      c.why += fmt::format("; but the epilogue's SMEM leaves {} ring stages{}: the mainloop runs at {:.2f} of that speed "
                           "(calibration.h row_group_ring_efficiency)",
                           c.k.ring_stages,
                           c.k.wgs_per_tile > 1 ? fmt::format(" (as {} of PingPong 128x128's)", ring_as_pingpong)
                                                : std::string(),
                           ring);
    out.push_back(c);
  }
  // The ring depth repriced the candidates: a plan whose epilogue buffers leave a shallow ring
  // (e.g. several tile outputs) can now cost more than one sorted after it. compare() takes the
  // first, so order them by their final estimate (stable: ties keep the tie-breaks above).
  std::stable_sort(out.begin(), out.end(),
                   [](const Candidate& a, const Candidate& b) { return a.est.total_us < b.est.total_us; });
  return out;
}

int64_t jobs_a_cta(const Candidate& c) {
  return ceil_div64(c.jobs * c.k.row_group * c.k.k_splits, std::max(1, c.resident));
}
bool one_job_a_cta(const Candidate& c) { return jobs_a_cta(c) <= 1; }
bool begins_early(const Candidate& c) { return c.k.n_tiles == 1 && one_job_a_cta(c); }

// cluster_m alone shapes row groups (clusters along M whose CTAs meet in L2); with cluster_n it
// makes the DSMEM search's cluster 2-D (decide_cluster.cpp).
bool row_groups_forced(const PlanOptions& opt) {
  return opt.row_group || (opt.cluster_m && !opt.cluster_n) || opt.k_splits || opt.splits_in_cluster ||
         (opt.aggregation && *opt.aggregation == Aggregation::L2Exchange) ||
         opt.consumer_wgs.value_or(Sm90::kConsumerWGs) > Sm90::kConsumerWGs;
}

// A fused pair saves a synchronization of the row's CTAs but adds a pass over the tile (for
// softmax an exp per element) and the merge arithmetic; with one CTA per row there is no round
// to save. fuse_pairs = true forces it where the device can.
// MEASURED (bench/NOTES.md), one round vs two: with several jobs a CTA (ncu cycles at base
// clock, the pair root beginning its PostStages' loads with its own, stage.cuh
// begin_phase<true>) 8192x4096x4096 LayerNorm 591.8k vs 614.8k, softmax 586.9k vs 616.4k,
// log-softmax 582.1k vs 611.9k, 4096x8192x4096 a tie; with one job a CTA (`comfuse run`, the
// exposed epilogue) residual LayerNorm 1x1024x4096 12.6 vs 13.2 us and 32x1024x4096 15.0 vs
// 15.8, softmax 16x4096x4096 17.2 vs 17.8 and 256x4096x4096 21.7 vs 21.9, LayerNorm
// 16/128/256 x4096x4096 ties: never slower, so every pair that saves a round takes one.
// A pair over several N-tiles a CTA (its second statistic online across them): only the root
// stage's can (a chain with one below it keeps two rounds for all of that kind: emit fuses a kind
// whole), and unforced only in row groups of up to kOnlinePairMaxRowPeers CTAs. MEASURED (H100,
// bench/sweeps/online_pairs_n_tiles.txt, bench/NOTES.md Stop 56), the vocabulary rows 1024 x 32768
// x 4096 f32 against two rounds at 1.772x cuBLAS: row groups of 32 (8 N-tiles a CTA) 1.496x,
// row groups of 64 (4 N-tiles) 1.717x: that kernel spills 1.1 KB (0.5 KB in two rounds: the
// 64-peer exchange), which the model does not see. The mean-and-variance pair over several
// N-tiles (Chan's merge of each tile's squares, bench/NOTES.md Stop 67) takes the same bound, and
// only where the kernel's registers hold it (calibration.h online_mean_variance_fits).
OneRoundPairs fuse_pairs(const ChainInfo& chain, const PlanOptions& opt, const KernelConfig& k) {
  const int64_t n_tiles = k.n_tiles;
  const int row_peers = k.row_peers();
  const OneRoundPairs can = one_round_pairs_possible(n_tiles, k.aggregation, row_peers);
  const bool mv = can.mean_variance && chain.mean_variance_pairs > 0 &&
                  (n_tiles == 1 || chain.mean_variance_pairs_below_root == 0);
  const bool mes = can.max_exp_sum && chain.max_exp_sum_pairs > 0 &&
                   (n_tiles == 1 || chain.max_exp_sum_pairs_below_root == 0);
  if (opt.fuse_pairs) return {*opt.fuse_pairs && mv, *opt.fuse_pairs && mes};
  const bool saves_a_round = row_peers > 1;  // one CTA per row: no round to save
  const bool online_bound = n_tiles == 1 || row_peers <= kOnlinePairMaxRowPeers;
  return {mv && saves_a_round && online_bound && online_mean_variance_fits(k), mes && saves_a_round && online_bound};
}

// A bf16 stash about each tile's row centers where the root stage's pair runs online (its running
// max or mean is the center: epilogue/stash.cuh Centered) and every output that reads the stash
// is bf16 (calibration.h centered_bf16_stash): the [M, N] outputs, and the row statistics unless
// every reduction is the root pair's (those are taken from the values unrounded); a forced bf16
// stash takes the centers wherever they exist. Elsewhere fp32 unless forced: rounding x itself
// loses LayerNorm's rows where |mean| >> std.
StashType stash_type(const ChainInfo& chain, const PlanOptions& opt, const PlannerTunables& tun,
                     const OneRoundPairs& fused, int64_t n_tiles) {
  const bool centers = stash_centers_possible(chain, fused, n_tiles);
  const bool only_root_pair_statistics = chain.reductions == 2;  // the root pair's two (centers: there is one)
  const bool outputs_bf16 = chain.tile_outputs_bf16 && (chain.row_outputs_bf16 || only_root_pair_statistics);
  const bool bf16_wanted = centers && chain.has_tile_output && outputs_bf16 && tun.centered_bf16_stash;
  StashType t;
  t.elem_bytes = opt.stash_bytes.value_or(bf16_wanted ? 2 : 4);
  t.centers = t.elem_bytes == 2 && centers;
  return t;
}

bool stash_centers_possible(const ChainInfo& chain, const OneRoundPairs& fused, int64_t n_tiles) {
  return n_tiles > 1 && chain.root_pair != PairKind::None && fused.has(chain.root_pair) &&
         stash_write_backs_after_round(chain, fused, n_tiles) == 0;
}

// A root max-and-sum-of-exp pair over several N-tiles a CTA runs in one round only in row groups of
// up to kOnlinePairMaxRowPeers (fuse_pairs); a larger group runs it in two, streaming its fp32
// stash twice more, which the model prices at one SM's share of DRAM under the other warp group's
// mainloop and so ties with the longer jobs of the smaller group. MEASURED (H100,
// bench/sweeps/online_pairs_n_tiles.txt, Stop 61): softmax with f32 out 1024 x 128256 x 4096, row
// groups of 32 in one round (32 N-tiles a CTA) 2.246 ms against the model's row groups of 64 in
// two rounds 2.840 (1.435x against 1.961x cuBLAS); at 256 x 128256 x 4096, where the smaller group
// also changes the tile (64x256 -> 64x128), 0.723 ms against 0.970 (1.676x against 2.288x; H100,
// Stop 62); at 1024 x 32768 x 4096 row groups of 32 in one round were already the pick. So where
// CTAs walk several jobs over at least kOnePairGroupMinRows rows and a group of
// kOnlinePairMaxRowPeers holds the row, larger groups are not offered. Fewer rows keep the model's
// choice, unmeasured: decode rows (one job a CTA) are paced by B's stream over the SMs.
bool two_round_pair_group(const ChainInfo& chain, const PlanOptions& opt, int64_t m, int64_t tiles_n, int g,
                          int64_t jobs, int64_t groups_max) {
  if (g <= kOnlinePairMaxRowPeers || chain.max_exp_sum_pairs == 0 || chain.max_exp_sum_pairs_below_root > 0) return false;
  if (m < kOnePairGroupMinRows) return false;
  if (opt.fuse_pairs || opt.row_group) return false;  // the pairs or the group forced: the caller's choice
  const int64_t n_tiles_at_max = ceil_div64(tiles_n, kOnlinePairMaxRowPeers);
  return ceil_div64(tiles_n, g) > 1 && n_tiles_at_max <= Sm90::kMaxNTiles && jobs > groups_max;
}

bool pair_hand_over(const OneRoundPairs& fused, int64_t m, const KernelConfig& k) {
  return fused.any() && k.pair_hand_over_possible() && pair_hand_over_rows(static_cast<int>(std::min<int64_t>(m, 32)));
}

// The measured rows (calibration.cpp) were measured with one job a row block: a row group that
// holds all of its N-tiles. Where none can (more N-tiles than kMaxRowGroup), none is offered.
std::optional<Candidate> measured_split_row(const Request& r, int tile_m, int tile_n, int cluster_m, int k_splits) {
  PlanOptions forced = r.opt;
  forced.k_splits = k_splits, forced.tile_m = tile_m, forced.tile_n = tile_n, forced.cluster_m = cluster_m;
  Rejections ignored;
  for (Candidate& c : search_row_groups(Request{r.spec, r.p, r.dev, r.tun, forced, r.chain}, ignored))
    if (c.jobs == ceil_div64(c.tiles_m, c.k.cluster_m)) return c;
  return std::nullopt;
}

// Unforced, one row block with long K (decode) takes the split measured fastest
// (calibration.cpp single_row_block_k_splits: the most CTAs on B), which the model ties with
// fewer splits; the model's own candidates follow as runners-up.
std::vector<Candidate> decide_row_groups(const Request& r, Rejections& why) {
  std::vector<Candidate> searched = search_row_groups(r, why);
  const PlanOptions& opt = r.opt;
  const bool unforced = !opt.k_splits && !opt.tile_m && !opt.tile_n && !opt.cluster_m && !opt.row_group &&
                        !opt.splits_in_cluster && !opt.stash_bytes;
  // A measured split row leads the model's candidates, its reason first.
  auto lead_with = [&](int tile_n, int splits, const std::string& why) {
    std::optional<Candidate> row = measured_split_row(r, 64, tile_n, 1, splits);
    if (!row) return false;
    row->why = fmt::format("{}; the model's terms: {}", why, row->why);
    searched.insert(searched.begin(), *row);
    return true;
  };
  // Decode rows of a short row reduction: 64x64 tiles in row groups (calibration.cpp
  // narrow_row_group_k_splits), measured faster than the 64x128 split below.
  const int narrow = unforced && !r.spec.gated() && r.chain.reductions > 0 ? narrow_row_group_k_splits(r.p, r.dev) : 0;
  if (narrow > 1 &&
      lead_with(64, narrow,
                fmt::format("M <= 16, a row within 32 CTAs of 64 columns, K = {}: PingPong "
                            "64x64 in L2 row groups with K split over {} CTAs a tile, B over up to twice the SMs of "
                            "64x128 and smaller partials to gather (measured faster: calibration.cpp "
                            "narrow_row_group_k_splits)",
                            r.p.k, narrow)))
    return searched;
  const int splits = unforced ? single_row_block_k_splits(r.p, r.dev) : 0;
  if (splits > 1)
    lead_with(128, splits,
              fmt::format("M <= 64, one row block, K = {}: PingPong 64x128 with K split over {} CTAs a tile, the most "
                          "that fit the SMs (measured faster than the model's fewer splits: calibration.cpp "
                          "single_row_block_k_splits)",
                          r.p.k, splits));
  return searched;
}

}  // namespace comfuse::plan_detail
