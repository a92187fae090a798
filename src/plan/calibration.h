#pragma once
// What the planner knows about the GPU it plans for (the H200 unless PlanOptions::gpu says the
// H100: device_model below): measured numbers, each with the measurement it came from
// (bench/NOTES.md has the runs), and the guesses that still await one, marked GUESS. The
// hardware limits the kernel is built against are not here but in kernels/comfuse/config.cuh
// (Sm90); this file holds what only measurement settles.
//
// Tests build variants of these (a device without multi-tile rows, a smaller SMEM) and call
// the make_plan overload below.
#include <cstdint>
#include <map>
#include <string>

#include "comfuse/plan.h"

namespace comfuse {

// Shape classes of the elementwise epilogues' measured table (calibration.cpp
// measured_elementwise_config), in 128x128 tiles of the output: from kMediumTiles128 (~4 waves)
// PingPong 128x128 walks 4 M-blocks a raster band; from kLargeTiles128 (~8 waves) every epilogue
// takes cooperative 128x256.
constexpr int64_t kMediumTiles128 = 1500;
constexpr int64_t kLargeTiles128 = 3000;

struct DeviceModel {
  Gpu gpu = Gpu::H200;
  int sm_count = 132;
  int smem_per_cta_bytes = Sm90::kSmemCapacity;
  int max_cluster = Sm90::kMaxClusterSize;
  // Clusters resident at once when each CTA fills an SM (384 threads, ~200 KB SMEM):
  // MEASURED, cudaOccupancyMaxActiveClusters on the lent H200 (DESIGN.md's table).
  std::map<int, int> clusters_resident = {{1, 132}, {2, 66}, {4, 30}, {8, 15}, {16, 7}};
  // Clusters of `size` CTAs resident at once; 0 for a size the table does not hold.
  int resident(int size) const {
    const auto r = clusters_resident.find(size);
    return r == clusters_resident.end() ? 0 : r->second;
  }
  // MEASURED: a 128x256x4096 bf16 tile's mainloop takes ~45 us on one SM (DESIGN.md),
  // i.e. 2*128*256*4096 / 45e-6 = 5.96 TFLOP/s per SM.
  double sm_flops_per_s = 5.96e12;
  // GUESS: H200 HBM3e peak is 4.8 TB/s; ~85% of it is what streaming kernels reach (a
  // device-to-device copy measured 4.3 TB/s counting both directions).
  double dram_bytes_per_s = 4.0e12;
  // GUESS: L2 bandwidth available to epilogue re-reads (WorkspaceStash), whole chip.
  double l2_bytes_per_s = 6.0e12;
  // FACT (datasheet; the card reports 60 MB of which ~50 serve one partition pair well).
  int64_t l2_bytes = 50ll << 20;
  // GUESS: SM clock under sustained tensor load (boost is 1.98 GHz; ~1.3 GHz at the power
  // cap in the large GEMMs' per-job timelines, bench/NOTES.md).
  double clock_hz = 1.755e9;
  // MEASURED: one DSMEM all-reduce round, peer-to-peer, TMA bulk + mbarrier, 64 floats per
  // CTA (bench/dsmem_allreduce.cu on the H200), by C_N; C_N = 1 is quad shuffles only (GUESS).
  std::map<int, double> cluster_allreduce_us = {{1, 0.05}, {2, 0.18}, {4, 0.27}, {8, 0.39}, {16, 0.61}};
  // MEASURED (bench/RESULTS.md, B2B rows; bench/NOTES.md "paired jobs"): a B2B kernel's two
  // GEMMs as a fraction of sm_flops_per_s on an SM whose two consumer warp groups are busy, by ring
  // depth (4: 4 or more). Paired and unpaired jobs alike at one depth: attention 16384^2, d 128,
  // 0.55 unpaired and 0.53 paired (6 stages); FFN 8192 x 1024 -> 4096 (chunks of 64, tile_n2 256)
  // 0.30 at 2 stages (unpaired), 0.41 at 3 and 0.55 at 4 (paired): a GEMM1 k-block's loads are
  // exposed behind a shallow ring. What the rings load from L2 did not bind at any of them
  // (up to 64 GB/s an SM), so pairing pays only where it buys ring stages or balance.
  std::map<int, double> b2b_efficiency_by_stages = {{2, 0.30}, {3, 0.41}, {4, 0.55}};
  // MEASURED (bench/NOTES.md "paired jobs"): an online-softmax chunk of 64 rows x 128 columns takes
  // a consumer warp group at least this long on an SM whose two warp groups are busy, us, whatever
  // the head dim: attention 4096^2 walks 1.16-1.2 us a warp-group chunk at d 64 (half d 128's
  // GEMM work) as 16384^2 does at d 128 (1.27-1.32): F (max, exp, sums, O's rescale) and its
  // waits, not the GEMMs, set the pace at d 64.
  double b2b_softmax_chunk_us = 1.2;
  // MEASURED (bench/sweeps/attention_overlap_pairing.txt; bench/NOTES.md Stop 25): the same floor
  // with each chunk's F beside the previous chunk's GEMM2 (B2bConfig::f_beside_gemm2), paired
  // jobs, us: batched S 2048, d 64 walks 0.77 us a warp-group chunk (F still binds there; unpaired
  // 0.87, as without the overlap, so the constant above is the older F's at d 64), while d 128
  // drops to its GEMMs' pace (b2b_overlap_efficiency).
  double b2b_softmax_beside_gemm2_chunk_us = 0.79;
  // MEASURED (bench/sweeps/attention_overlap_pairing.txt): with F beside GEMM2, unpaired jobs'
  // warp-group chunks take this many times paired jobs' (1.07-1.14 at every attention row, head
  // dims 64 and 128, causal or not): paired, the two warp groups' ordered turns put one's F
  // against the other's GEMMs, and their one ring is deeper (8 stages against 5-6) beyond the
  // four k-blocks a turn holds in flight.
  double b2b_overlap_unpaired_chunk_factor = 1.10;
  // MEASURED (bench/sweeps/attention_overlap_pairing.txt): the same fraction with F beside GEMM2,
  // paired jobs of head dim 128 (the ring 8 stages deep): warp-group chunks of 0.93-1.06 us at
  // 16384^2, batched S 4096 and S 1024, against 1.28 us at the 0.55 above.
  double b2b_overlap_efficiency = 0.70;
  // A B2B consumer warp group left alone on its SM (its partner out of jobs) runs at this share
  // of the SM's two-warp-group rate: more than half, as its GEMMs no longer wait behind the
  // partner's, less than all, as its own F (softmax) leaves the tensor cores idle. GUESS; it
  // reproduces the unbalanced causal schedule's measured tie with non-causal at 16384^2, d 128
  // (0.3355 vs 0.3265 ms: each SM then held two equally long jobs), whatever its value.
  double b2b_single_wg_share = 0.6;
  // MEASURED (bench/NOTES.md, B2B N1 split): one piece of the partial-O hand-over of a B2B kernel
  // with N1 split over a cluster (b2b/partial_sum.cuh), us: 0.55 + 0.42 per follower (FFN
  // 8192 x 1024 -> 4096 -> 256 at C = 2 and 4, M = 64 at C = 8: 1.0, 2.1, 3.3 us a piece of 8 fp32
  // a thread). The owner's barrier takes 128 remote arrivals from each follower a piece, one at a
  // time: arrivals, not bytes, set it, so a larger piece costs about the same.
  double b2b_piece_base_us = 0.55;
  double b2b_piece_per_follower_us = 0.42;
  // The decode kernel (b2b/decode_attention.cuh), MEASURED (bench/decode_attention.py, bench/
  // NOTES.md Stops 45 and 46): its streams of K and V reach dram_bytes_per_s (4.1 TB/s beside the
  // launch's fixed part at B8 x H16, N 4096, head dim 128, clusters of 2; 3.9 at B32 x H16, N 1024,
  // head dim 64, one CTA a batch), and each CTA at most its loads in flight per dram_latency_us
  // (Little's law: B1 x H16, N 4096 by cluster size 1 to 16 within 4%; one CTA a batch at B8 x H16,
  // N 4096, head dim 128 ran 90 us against this 84); a launch pays decode_fixed_us beyond them
  // (the grid's start, the groups' merge in SMEM, O's stores: 3.5 us at 16 CTAs over 64 keys), a
  // split over a cluster its DSMEM merge on top (cluster_allreduce_us).
  double decode_fixed_us = 2.5;
  double dram_latency_us = 1.3;
  // MEASURED: the decode kernel's useful FMAs (q . k and p v) a second, chip-wide, with the
  // shuffles, exponentials and conversions around them: 4 query rows at B1 x H16, N 4096, head dim
  // 64 took ~8 us beside the launch for 34 M FMAs (4.2e12); at head dim 128, 16 elements a lane,
  // B32 x H8, N 1024: 50 us for 268 M (5.4e12). The lower rate is taken; 5 to 8 rows (8 elements
  // a lane, 195-250 registers) are priced at it unmeasured.
  double decode_fma_per_s = 4.2e12;
  // The decode kernel's CTAs an SM can hold, from ptxas's registers (SASS of the emitted kernels):
  // up to 2 rows 126-174 a thread (3 CTAs of 128 threads), 3 to 8 rows 192-255 (2 CTAs). The
  // loads in flight that Little's law counts are those of the CTAs resident at once.
  static constexpr int decode_ctas_per_sm(int rows) { return rows <= 2 ? 3 : 2; }
  // MEASURED: the wgmma pipeline's jobs of a few useful rows (a decode step) run 1.4-12.5 us above
  // its estimate (one row a batch, N 64 to 4096, heads of 64 and 128: Q's load, the ring's fill,
  // the hand-over of a job, which its per-chunk model does not price); the decode kernel is
  // weighed against the pipeline's estimate plus this.
  double pipeline_few_rows_us = 5.0;
  // Whether the device templates walk several N-tiles per CTA for a row reduction (a stash).
  // Off: rows must fit one cluster (tests plan for such a device).
  bool multi_tile_rows = true;

  // How this GPU's mainloops differ from the H200's, which PlannerTunables' tables were measured
  // on (device_model() sets them for the H100; the H200 keeps these defaults).
  // A PingPong tile's mainloop rate against the H200 table's (row_group_mainloop_efficiency), by
  // tile (tile_m * 1000 + the wgmma's columns); cooperative 128x256, cuBLAS's tile, runs at
  // cuBLAS's rate on both GPUs. 1 where absent. The row-group model's (decide_row_groups.cpp);
  // the elementwise deciders choose from measured tables (calibration.cpp) and the DSMEM search
  // prices its own clusters (cluster_efficiency), neither with it.
  std::map<int, double> pingpong_rate = {};
  // A short epilogue (a cast, a bias) behind long K takes cooperative 128x256 below this many
  // 128x128 tiles (calibration.cpp measured_elementwise_config; measured on the H200 to
  // kMediumTiles128, from kLargeTiles128 on every epilogue takes it).
  int64_t cooperative_short_epilogue_max_tiles = kMediumTiles128;
  double pingpong(int tile_key) const {
    const auto r = pingpong_rate.find(tile_key);
    return r == pingpong_rate.end() ? 1.0 : r->second;
  }
};

// The model of `gpu`: the H200's as above (also where unset: PlanOptions::gpu's default), or the
// H100's (what was measured on an H100 80GB HBM3 SXM, bench/NOTES.md Stop 54, over the H200's
// numbers).
DeviceModel device_model(std::optional<Gpu> gpu);


struct PlannerTunables {
  // MEASURED (bench/dsmem_allreduce.cu): peer-to-peer won at every C_N in 2..16 (0.18-0.61 us
  // vs 0.34-0.76 us a round), so there is no crossover below 16: leader-follower only when forced.
  int p2p_max_cluster = 16;
  // MEASURED 1.2-1.9x a round, leader-follower over peer-to-peer (bench/NOTES.md).
  double leader_follower_penalty = 1.5;
  int max_stash_bytes = 96 * 1024;  // POLICY: SMEM a CTA may spend keeping earlier N-tiles

  // Cost-model knobs of the DSMEM search. GUESSES unless noted.
  double tile_fixed_us = 0.3;      // GUESS: per-tile pipeline fill / store drain not hidden
  // GUESS: issue cycles per epilogue instruction per warp in the DSMEM search's and the
  // elementwise plans' estimate (decide_cluster.cpp). Not row_group_epilogue_cycles below: that
  // table, fitted to a six-stage chain of five reductions, overprices one-stage epilogues (GEMM +
  // bias + gelu_new 8192x4096x1024: ~200 us estimated with it, 123 us measured, 108 us with this).
  double epilogue_cpi = 1.5;
  // The share of a job's epilogue (its time above: instructions x epilogue_cpi) that the other
  // warp group's MMAs lose while it runs: PingPong does not hide an epilogue shorter than the
  // mainloop beside it. MEASURED (bench/NOTES.md Stop 32, 128x128 PingPong, 2x1, against a plain
  // cast in the same call): 8192x4096x1024 erf-GELU, gelu_new, bias + tanh-GELU +1.87 / +1.63 /
  // +0.62 us a job against 3.5 / 3.2 / 1.3 us modeled: 0.53 / 0.51 / 0.48; 8192x4096x4096
  // bias + GELU +0.5 us a job: 0.37. The same share at K = 1024 and 4096: a tax on the tensor
  // pipe, not an epilogue left exposed.
  double epilogue_mma_interference = 0.5;
  int reg_overhead = 48;           // GUESS: consumer registers besides live tile values
  // An elementwise epilogue at most this many instructions an element (chain.cpp: a store 2, a
  // cast 1, a bias 1.5), with no tile inputs, is short enough for a cooperative tile to leave it
  // exposed behind a long-K mainloop (calibration.cpp measured_elementwise_config). POLICY: a
  // cast and a bias qualify, an activation (tanh-GELU 10) does not.
  double short_epilogue_ops = 5.0;
  // GUESS: mainloop efficiency by ring depth (depth >= 4 is full speed).
  std::map<int, double> stage_efficiency = {{2, 0.85}, {3, 0.95}, {4, 1.0}};
  // GUESS: mainloop efficiency by tile_n (SMEM operand traffic per MMA grows as tiles shrink).
  std::map<int, double> tile_n_efficiency = {{64, 0.75}, {128, 0.90}, {192, 0.95}, {256, 1.0}};
  // Mainloop efficiency of clusters along N (only A multicast: 64x256 tiles go L2-bound, and
  // multicast A waits for the slowest CTA). C_N 8 and 16 MEASURED on the H200 (bench/NOTES.md
  // Stop 27, forced DSMEM plans, the model's mainloop against the time less its epilogue and
  // re-read): LayerNorm 8192x4096x4096 C_N 8 0.70, 16 0.63; softmax 8192x2048x4096 C_N 8 0.74;
  // LayerNorm 256x4096x4096 C_N 16 0.57 (the guesses were 0.97 and 0.96: estimates 1.3-1.6x
  // short). C_N 2 and 4 stay GUESSES (untuned CUTLASS 1x2-along-N ran at 0.77x of 2x1-along-M,
  // DESIGN.md); a second multicast along M (2-D clusters) measured 0.84-1.0 at C_N 8, which this
  // table, by C_N alone, does not credit.
  std::map<int, double> cluster_efficiency = {{1, 1.0}, {2, 1.0}, {4, 0.98}, {8, 0.72}, {16, 0.60}};
  int store_subtile_n = 64;        // FACT of the epilogue: 64-column TMA-store sub-tiles
  // A bf16 stash of x itself rounds x before x - mean, which |mean| >> std turns into wrong rows
  // (MEASURED: rel_l2 0.44 on LayerNorm with a 1000 offset): the DSMEM search offers it only where
  // PlanOptions::stash_bytes = 2.
  bool allow_bf16_stash = false;
  // POLICY: where the root stage's pair runs online over several N-tiles a CTA (softmax's max and
  // sum of exp, LayerNorm's mean and variance) and every output read from it is bf16, the stash is bf16
  // about each tile's running max or mean (epilogue/stash.cuh Centered: the rounding falls on
  // x - center, about one ulp of the bf16 output; a mean far from 0 costs nothing). MEASURED (H100,
  // bench/NOTES.md Stop 68, against fp32 in the same call): LayerNorm 1152 x 32768 x 1024 0.248
  // against 0.279 ms, softmax 0.234 / 0.266, residual LayerNorm 0.296 / 0.333 (Stop 69), LayerNorm 4096 x
  // 16384 x 4096 0.990 / 1.097, log-softmax 256 x 128256 x 4096 0.634 / 0.665, the vocabulary
  // softmax (bf16 out) 0.487 / 0.495; every output within 1e-2 (y rel-L2 2e-3 against 3e-5). The
  // root pair's statistics come from the values unrounded, so f32 ones of them (residual
  // LayerNorm's mean and rstd: rstd rel-L2 2.8e-7, as with fp32) take the bf16 stash too; an f32
  // [M, N] output keeps fp32.
  bool centered_bf16_stash = true;
  // GUESS: share of L2 a WorkspaceStash workspace may fill and still be re-read from L2; the
  // mainloop's operand tiles need the rest. Beyond it the re-read is charged at DRAM speed.
  double l2_workspace_fraction = 0.5;
  // POLICY: the most global scratch a WorkspaceStash plan may ask the runtime for. It bounds
  // N: about 4M columns for a one-value stash at C_N = 16.
  int64_t max_workspace_bytes = 8ll << 30;
  double near_tie = 0.02;  // POLICY: within 2% of the best, prefer the simpler strategy, smaller cluster

  // Row groups (the L2 exchange, decide_row_groups.cpp).
  // Mainloop speed of a PingPong tile (key tile_m * 1000 + tile_n) with B multicast along M,
  // relative to sm_flops_per_s. MEASURED (bench/NOTES.md, row groups): 128x128 1.0 (parity with
  // cuBLAS); 64x256 0.95 (LayerNorm 8192x4096x4096 at one tile per CTA: 1.125x and 1.090x cuBLAS
  // in two runs vs 0.989x and 1.092x for 128x128); 64x128 0.66 (K = 1024: LayerNorm, softmax
  // and RMSNorm at 2048x2048, 1024x4096 and 4096x1024 ran 1.12-1.20x slower at 64x128 than at
  // 128x128 with their short epilogues hidden, ~4.3 us a 64x128 job against 5.65 us a 128x128
  // one; the chain's trace: 3.17 us against 4.8 us with the other consumer in an epilogue).
  // Cooperative 128x256 (both warp groups on one tile, its epilogue not hidden): cuBLAS's tile,
  // 1.00-1.02x cuBLAS as an elementwise plan (bench/NOTES.md Stop 40).
  std::map<int, double> row_group_mainloop_efficiency = {
      {64128, 0.66}, {64256, 0.95}, {128128, 1.0}, {128256, 1.0}};
  // The same where A's rows miss 128-byte lines (rows_off_128_byte_lines: K not a multiple of 64):
  // every TMA box row straddles two lines, and the tiles that read more rows a MAC slow down
  // most. MEASURED on the H200 (bench/sweeps/ragged_k_pingpong.txt and cooperative_row_groups.txt,
  // K = 4104 against 4096 / 4160): 128x128 0.64 (RMSNorm 8192x4096 in row groups of 32, 1.557x
  // cuBLAS against 1.001x) and ~0.7 (elementwise: a cast 1.54x against 1.07-1.12x, bias + GELU
  // 1.40-1.47x against 1.01x); 64x256 0.68 (RMSNorm and LayerNorm 8192x4096 in row groups of 16,
  // 577.5-583.4 us against the 487 its aligned rate predicts); cooperative 128x256 0.94-0.95 (a
  // cast 1.07x against 1.02x; RMSNorm 1.077x against 1.078x at K = 4096). 64x128 a GUESS (more
  // rows a MAC than 128x128).
  std::map<int, double> unaligned_rows_efficiency = {{64128, 0.6}, {64256, 0.68}, {128128, 0.64}, {128256, 0.94}};
  // A cooperative tile's epilogue (arithmetic, tile inputs, stores; not its exchange rounds)
  // against the one-warp-group model above: both warp groups run theirs at once, two warps on
  // every SM sub-partition hiding each other's latencies, no mainloop beside them. MEASURED (the
  // row-group times less the modeled mainloop and rounds, bench/sweeps/cooperative_row_groups.txt):
  // 0.39-0.70 of the modeled epilogue over RMSNorm, LayerNorm, softmax, residual RMSNorm at
  // 8192x4096x4104 and LayerNorm and the chain at 1024x4096x1000, 0.45 at LayerNorm 8000x4000x1000.
  double row_group_cooperative_epilogue_share = 0.5;
  // A job's epilogue (rounds included) with three consumer warp groups (KernelConfig::
  // consumer_wgs, 64-row PingPong tiles), two of them in epilogues beside the third's mainloop,
  // against the two-warp-group model: they slow each other's arithmetic and stretch the row
  // group's rounds (the peers' publishes spread). MEASURED (`comfuse run --trace`, bench/sweeps/
  // consumer_wgs_trace.txt, the same 64x128 tiles with two and three): 1.72x per job on the
  // softmax > LayerNorm > RMSNorm chain at 4096x4096x1024 (28.6 against 16.6 us), 1.63x on
  // residual LayerNorm at 8192x1024x1024 (10.1 against 6.2), so a third warp group bought no time.
  double three_consumer_epilogue_stretch = 1.7;
  // The same mainloop by ring depth, where the epilogue's SMEM (TMA-store staging per output, a
  // TileInput's whole tile) leaves fewer k-blocks in flight than a TMA round trip needs.
  // MEASURED on the H200 (PingPong 128x128, clusters 2x1, row groups; bench/NOTES.md): 2
  // stages 2.57-2.70x cuBLAS (residual RMSNorm 8192x4096x4096 and x14336, residual LayerNorm
  // 8192x1024x4096); 3 stages 1.60-1.71x (the same norms with one output less, in the models
  // benchmark); 4 stages 1.185x (residual RMSNorm 8192x4096x4096 with its residual read from
  // global, against 1.03-1.07x for RMSNorm/LayerNorm at 5) and 1.075x at K = 14336; 5 stages
  // 1.03-1.05x.
  // Counted in those PingPong 128x128 stages: a cooperative 128x256 stage feeds both warp groups,
  // twice the MACs, so its 4 stages hold as much time in flight as 8 (the plain GEMM ran at
  // cuBLAS's rate with 4 on both GPUs, bench/NOTES.md Stops 40 and 54; its 2 and 3 stages, as 4
  // and 6, are GUESSES).
  std::map<int, double> row_group_ring_efficiency = {{2, 0.385}, {3, 0.6}, {4, 0.9}, {5, 1.0}};
  // A cooperative tile (128 accumulators a thread) whose chain has more stages than this begins in
  // the epilogue, not before its mainloop: held through the mainloop, the vectors of the 6-stage
  // chain (examples/gemm_chain.cf) made ptxas spill 426 B at 1024 x 4096 x 1024, 52 B without;
  // LayerNorm's and softmax's 2-3 stages spill nothing either way (NVRTC 13.0, sm_90a).
  int cooperative_begin_early_max_stages = 3;
  // Share of a multi-tile job's stash traffic (write once, read per later stage) that the
  // mainloops do not hide. MEASURED-ish: T = 2 cost 2-3% over T = 1 at 8192x4096x4096.
  double row_group_stash_exposed = 0.5;
  // Without B multicast (clusters of 1). MEASURED-ish: PingPong 128x128 alone ran 0.86x of the
  // multicast version (L2-bound in ncu), PingPong 64x256 with A multicast only 0.65x.
  double row_group_no_multicast_efficiency = 0.8;
  // One exchange round through L2 among G clusters, microseconds, by G. MEASURED for G <= 32
  // (bench/dsmem_allreduce.cu, LL protocol, 64 rows per CTA, idle GPU). 64: what a round costs
  // inside the kernel, MEASURED indirectly (4096x8192x4096 LayerNorm, 128 CTAs in one group:
  // 1.34x cuBLAS vs 1.26x at G = 32 with two tiles per CTA: the slowest of 128 CTAs sets every
  // round; RMSNorm there 1.23x): 30 us keeps G = 64 a last resort.
  std::map<int, double> row_group_exchange_us = {{1, 0.05}, {2, 0.89}, {4, 0.98}, {8, 1.03}, {16, 1.08}, {32, 1.44}, {64, 30.0}};
  // Issue cycles per epilogue instruction (chain.cpp's ops_per_element) of one consumer warp
  // group, by values a thread holds (tile elements / 128), with PingPong's other consumer
  // beside it. MEASURED (`comfuse run --trace`, the softmax > LayerNorm > RMSNorm chain
  // 4096x4096x1024, row groups of 32, 53 ops/element): a job's epilogue less its exchange
  // polls, 12.2 us at 64x128 (64 values, 1.88 GHz), 33.1 us at 128x128 and 32.0 us at 64x256
  // (128 values, 1.90 GHz): 128 values a thread cost 1.35x per element (fewer registers for
  // the stages' temporaries).
  std::map<int, double> row_group_epilogue_cycles = {{64, 6.75}, {128, 9.1}};
  // What a consumer warp group's epilogue spends reading an [M, N] tile input (a residual) from
  // L2, per 64-column subtile of a full tile: a pair of elements per load in the accumulator
  // layout, the subtile's loads in flight at once and then waited for, behind the other
  // consumer's mainloop traffic, so a pass costs about one loaded L2 round trip whatever its
  // rows. MEASURED with `comfuse run --trace` (bench/NOTES.md, prefill residual norms;
  // 8192x1024x1024, 128x128, row groups of 8): the bf16 residual added 3.0 us to the root
  // stage's body and 0.8 us to its begin, 4.9 us to the job's epilogue against LayerNorm without
  // it (13.3 vs 8.4), of which the model's arithmetic already had 1.65: 3.25 us over 2 passes.
  // Scaled by the tile's rows below M: the decode epilogues (1 and 32 rows) measured no such cost.
  double row_group_tile_input_pass_us = 1.63;
  // The same pass where the tile input rides the mainloop's ring (KernelConfig::ring_input_bytes):
  // its TMA load lands under the mainloop and the pass reads SMEM, but the tile's consumer holds
  // the slot through its first stage's body, a stage less for the other consumer's mainloop
  // meanwhile. MEASURED (bench/sweeps/ring_inputs.txt, 8192x1024x1024 residual LayerNorm, 128x128
  // row groups of 8): 46.8 us against 48.2 from L2, a fifth of what SMEM reads alone would save;
  // this fit prices it so (64x128: 51.3 against a measured 49.2; Llama's residual RMSNorm
  // 4096x4096x1024: 77.2 against 78.3).
  double row_group_ring_input_pass_us = 1.37;
  // And what holding that slot costs the other consumer (decide_row_groups.cpp Division::priced):
  // the slot stays taken from the tile's last MMA through its first stage's body, while the
  // producer refills only the other stages - 1, so the other consumer's mainloop starves for
  // what the hold outlasts their k-blocks. It counts only where the mainloop, not the epilogue,
  // paces the jobs (long K); at K = 1024 the epilogue's own wait is the longer one and the ring
  // still pays. MEASURED (bench/sweeps/tile_inputs_ring_or_l2.txt; residual RMSNorm
  // 8192x4096x4096, 128x128, 6 stages, 16 jobs a CTA): 0.4606 ms in the ring against 0.4351 from
  // L2, 1.6 us a job, plus the 5 k-blocks of the model's 0.352 us the other stages cover. The
  // choices it then makes, measured the same way: K = 14336 from L2 0.992x cuBLAS (ring 1.011x),
  // residual LayerNorm 8192x1024x4096 1.256x (1.271x), 8192x4096x4096 a tie (1.17-1.18x both);
  // at 4096x4096x1024 it keeps the ring (1.606x against 1.682x from L2).
  double row_group_ring_input_hold_us = 3.36;
  bool use_row_groups = true;  // rows with a reduction go to row groups (else the DSMEM search)

  // One wave of jobs (decode and small M; decide_row_groups.cpp), MEASURED on the H200 with
  // `comfuse run --trace` (bench/NOTES.md, split-K): what one SM pulls from DRAM through an
  // 8-stage ring (RMSNorm M=1, N=2048, K=4096: 0.5 MiB per CTA in 10.7 us, 32 CTAs), and what
  // the DRAM gives a kernel of a few microseconds, all of B, by cluster (not the 4.8 TB/s of long
  // streams). MEASURED (bench/NOTES.md, decode split-K owners; mainloops of the CTAs that only
  // hand partials over, and per-launch times less the traced gather, epilogue and launch):
  // clusters of 1 2.5-3.4 TB/s (8 MiB in 3.0-3.3 us at S = 16, 16 MiB in ~6.2 and 4.9 us at
  // S = 4 and 8); clusters of 2 along M (B multicast) 1.5-2.0 TB/s (8 MiB in 5.7 and 4.1 us at
  // S = 6 and 4, 16 MiB in ~9.9 us at S = 2). The one rate of 1.9 TB/s this replaces came from
  // the slowest jobs' stamps (16 MiB in 9.0 us at S = 8), which held a split-K owner's gather.
  double sm_stream_bytes_per_s = 47e9;
  // The longest share of B per CTA that rate was measured on (0.5 MiB: RMSNorm M=1, N=2048,
  // K=4096, 32 CTAs) and the measured decode shapes stay within, bytes.
  double sm_stream_measured_bytes = 1 << 20;
  // The clusters-of-2 rate was measured at decode (M <= 32): one row block, so each cluster's
  // second CTA holds no rows and the pair streams B for one tile. Where both CTAs hold rows the
  // pair reads each panel of B once for two row blocks: MEASURED 128 MiB in ~42 us (3.0 TB/s;
  // 128 x 4096 x 16384, 64x64 tiles in clusters of 2 along M, 48.1 us less the launch and the
  // epilogue; bench/NOTES.md Stop 29).
  double one_wave_dram_bytes_per_s = 2.7e12;
  double one_wave_multicast_dram_bytes_per_s = 1.8e12;
  double one_wave_shared_b_dram_bytes_per_s = 3.0e12;
  // shares_b: every CTA of a cluster along M holds rows (the problem has cluster_m row blocks or
  // more), so the pair reads each panel of B once for two row blocks.
  double one_wave_dram(int cluster_m, bool shares_b) const {
    if (cluster_m <= 1) return one_wave_dram_bytes_per_s;
    return shares_b ? one_wave_shared_b_dram_bytes_per_s : one_wave_multicast_dram_bytes_per_s;
  }
  // Split-K (KernelConfig::k_splits, kernels/comfuse/scheduler/split_k.cuh), where a problem
  // has fewer tiles than SMs. The owner's gather (split_k.cuh SplitK::gather), microseconds a
  // job: base + (S - 1) x rounds x per_split + the partials' bytes at the owner SM's L2 read rate,
  // where rounds are the dependent L2 round trips of the partials' loads (decide_row_groups.cpp
  // gather_rounds): summed in SMEM by the whole warp group, one per Sm90::kSplitGatherLoadsInFlight
  // 16-byte loads a thread (KernelConfig::split_gather_rounds); else one per row slot of the
  // busiest warp. Where the rows travel as tagged words (KernelConfig::split_words_tagged) their
  // bytes count twice; the flag's round trip they skip is not priced apart (measured 0.1-0.5 us a
  // launch, bench/NOTES.md Stop 38).
  // MEASURED (bench/NOTES.md, decode split-K owners: per-owner traces of bias + residual +
  // LayerNorm, N = 1024): 2.2 us at S = 4 and 7.5 at S = 16 with one row slot (M = 1), 3.6 and
  // 13.7 with two (M = 32), with the tags then polled one acquire after another: 0.43 a split and
  // round. Polled in flight together, without an SC fence before the release: 0.5 us less a
  // launch at S = 4, 1.2-1.3 at S = 8 (bench/NOTES.md Stop 37, whole launches), ~0.17 a split:
  // 0.26. The SMEM sum's one round at 16 rows, S = 4, measured 0.4-0.6 us less than two rounds of
  // registers (0.78 here). Without the bytes' term this model moved M = 32 and 64 to more splits
  // (or clusters of 1), which measured slower (bench/sweeps/decode_gather_model_plans.txt: RMSNorm
  // 64 x 1024 x 3072, S = 4 11.8 us against S = 3 11.2; 32 x 1024 x 4096 clusters of 1, S = 8
  // 11.7 against pairs, S = 4 10.8): at 64 rows the owner pulls (S - 1) x 32 KiB.
  double split_k_gather_base_us = 0.9;
  double split_k_gather_per_split_us = 0.26;
  // GUESS: what one SM reads from L2 (~64 bytes a clock at 1.75 GHz).
  double split_k_gather_sm_bytes_per_s = 110e9;
  // Split-K over DSMEM (KernelConfig::splits_in_cluster, kernels/comfuse/cluster/
  // split_hand_over.cuh): the S CTAs of a tile are one hardware cluster, and the owner's hand-over
  // takes, a job, pieces x (piece_us + steps x step_us): per piece (one warp's rows: one at
  // M <= 16) a remote arrival and its wait, then rounds of remote loads of every follower
  // (KernelConfig::split_hand_over_steps). GUESS: ~0.3 us an arrival's round trip across the
  // cluster, ~0.1 us a round of DSMEM loads. MEASURED (bench/sweeps/decode_split_k_dsmem.txt,
  // traces in bench/NOTES.md Stop 31): the owners' accumulators ready 0.33 us sooner than
  // through L2 (residual LayerNorm 1 x 1024 x 4096, S = 4), but no launch faster (RMSNorm
  // 1 x 2048 x 4096 S = 4 13.6 us against 13.1; S = 8 at 64x256 16.0 against 15.0; residual
  // LayerNorm 32 x 1024 x 4096 S = 8 18.0 against the planner's 15.2): the owners' epilogues
  // ran longer behind it (why is NOT known). So it is not proposed unforced (split_k_in_cluster).
  double split_k_hand_over_piece_us = 0.3;
  double split_k_hand_over_step_us = 0.1;
  bool split_k_in_cluster = false;
  // What a one-wave launch (each CTA one job: decode, small M) costs besides its CTAs' work:
  // launch, prologue (barriers, PDL wait) and the grid's drain, with nothing to overlap them.
  // MEASURED (bench/NOTES.md, decode split-K owners): back-to-back launches less the traced span
  // (first turn to last epilogue), 2.3-3.0 us (mean 2.7) in eight decode traces with PDL on (~4 us
  // without, bench/NOTES.md PDL). Kernels of several jobs a CTA leave it out: there it is within
  // the error of the tables fitted to them.
  double one_wave_launch_us = 2.7;
  // How far this model prices a one-wave split-K plan (decode) above its measured launches: the
  // most among the measured rows, where estimate / measured spans 1.17-1.76 (bench/RESULTS.md,
  // Stops 38-48: softmax 8 x 4096 x 4096 21.2 us against 12.05, RMSNorm 1 x 2048 x 4096 14.5
  // against 8.5, bias + GELU 1 x 4096 x 4096 18.1 against 10.85, residual RMSNorm 1 x 4096 x
  // 14336 52.0 against 36.1, residual LayerNorm 32 x 1024 x 4096 16.3 against 13.9). The
  // candidates are ranked on the estimate as it is (a refit of the one-wave rates moved plans at
  // M = 32-128 to slower ones, bench/NOTES.md Stop 37); PlanEstimate::low_us carries the bound, so
  // that the frontend measures a region that may pay instead of refusing it on the estimate.
  double one_wave_split_overestimate = 1.76;
  // One-wave long streams: one wave of single CTAs whose B runs to tens of MB streams at the
  // DRAM's long-stream rate (DeviceModel::dram_bytes_per_s), not at one_wave_dram_bytes_per_s,
  // which was fitted on kernels of a few microseconds (8-16 MiB): MEASURED, the gated GEMM
  // 1 x 8192 x 3072 (Phi-3-mini's gate_up at decode, 100.7 MB over 128 CTAs) 27.5 us against 40.2
  // estimated, 4.1 TB/s after the launch (bench/sweeps/gated_split_k.txt). The estimate keeps the fitted rate (the ranking, as
  // above) and PlanEstimate::low_us takes the long-stream rate (decide_cluster.cpp), so that a
  // frontend measures such a region instead of refusing it on the estimate. Only for more of B
  // than the fitted kernels streamed (and single CTAs: no cluster, as measured).
  double one_wave_long_stream_min_bytes = 32.0 * (1 << 20);
  // Fewest k-blocks a split's mainloop takes (a shorter one is mostly ring fill). GUESS.
  int split_k_min_k_blocks = 4;
};

// Elementwise epilogues (no row reduction): the configurations measured fastest on the H200,
// per shape class (bench/NOTES.md: ncu and same-power-state timing against cuBLAS). The
// cost model is not calibrated for the mainloop; measurement wins.
struct MeasuredConfig {
  int tile_m, tile_n, wgs_per_tile, cluster_m, cluster_n, max_ring_stages, raster_group;
  bool raster_along_n;
  std::string why;
  int k_splits = 1;  // > 1: K split over that many CTAs a tile, the owner gathering (row-group plan)
};
// One row block (M <= 64) with long K: K split over this many CTAs a 64x128 tile, as measured
// fastest with and without a row reduction; 0 where the unsplit plans measured faster.
int single_row_block_k_splits(const Problem& p, const DeviceModel& dev);
// One row block (M <= 64) at mid K with an elementwise epilogue: K split over this many CTAs a
// 64x64 tile; 0 where unmeasured or the unsplit plan measured faster.
int narrow_tile_k_splits(const Problem& p, const DeviceModel& dev);
// Decode rows with a row reduction whose 64-column tiles keep the row within 32 CTAs: the K split
// of 64x64 tiles in L2 row groups (calibration.cpp), or 0.
int narrow_row_group_k_splits(const Problem& p, const DeviceModel& dev);
// KernelConfig::poll_backoff: the L2 exchange's polls pause between tries where every CTA of the
// grid is in its round at once (one job a CTA) and a row spans at least 16 CTAs, whose re-polls of
// the last peer's words flood its L2 lines. MEASURED (bench/NOTES.md Stops 59-61): with the pause,
// one wave at 32 peers, LayerNorm 256 x 4096 x 4096 24.5-24.7 -> 24.0 us and softmax 23.2 ->
// 22.5-22.7 (H100), decode rows and the chain at 16 peers within the spread; with several jobs a
// CTA the rounds do not all fall at once (staggered over the jobs; PingPong: beside the other warp
// group's mainloop) and it only delays the round's end: LayerNorm 8192 x 4096 x 4096
// (cooperative, 16 peers) 1.130-1.131x cuBLAS with it against 1.099-1.103x without (H100, two
// alternated pairs), 0.4416 against 0.4360 ms (H200, 32 peers); residual LayerNorm 8192 x 1024 x
// 1024 (4 peers) 47.7 against 47.2-47.3 us (H200).
inline constexpr int kPollBackoffMinPeers = 16;
// KernelConfig::store_stages, where a second staging buffer of each output fits beside the ring
// as planned (never at a ring stage's cost). With one buffer a warp group waits, before each
// 64-column subtile, for the TMA store of the subtile before to have read it: the store's whole
// SMEM read on the epilogue's path, four times on a 256-column tile. MEASURED (H100, one call,
// bench/sweeps/store_stages.txt, bench/NOTES.md Stop 71): RMSNorm 4096 x 1024 x 1024 (cooperative,
// one job a CTA) 16.4 -> 16.0 us, bias + GELU 2048 x 2048 x 1024 (PingPong 128x128) 1.340x ->
// 1.331x, the cast there unchanged (1.183x / 1.181x); where it costs a ring stage (forced),
// LayerNorm 2048 x 2048 x 1024 18.1 -> 17.8 us at 3 stages, 1024 x 4096 x 1024 a tie: one call,
// too little to trade a ring stage for it by default. Large shapes not measured.
inline constexpr int kStoreStagesWhereFree = 2;
inline bool poll_backoff_wanted(int row_peers, bool one_job_a_cta) {
  return one_job_a_cta && row_peers >= kPollBackoffMinPeers;
}
// PingPong jobs of kTileTurnsMinTiles or more N-tiles (KernelConfig::turn_lead,
// scheduler/turn_order.cuh): two jobs' tiles in turn on the tensor cores, a tile each (lead 1),
// which puts each tile's body beside the other consumer's mainloop instead of between two of its
// own. MEASURED (H100, bench/NOTES.md Stop 65), softmax with f32 out at 1024 x 32768 x 4096 (8
// N-tiles a job in row groups of 32): a tile at a time 0.520-0.522 ms against a job at a time
// 0.544-0.552 (2% in the same call's cuBLAS ratio, cuBLAS moving 4% between the rounds), though
// both consumers' epilogues then end the kernel (its exposed tail 105 against 72 us); measured as
// an untracked copy of the kernels in this order; the tree's order at lead 1 (Stop 66, H100, one
// call) 0.5217 ms against 0.5339 a job at a time, and leads 2, 3 and 4 0.5385, 0.5374 and 0.5384
// (one epilogue's tail under the other's last mainloops measured no better than both epilogues
// side by side). At 2 N-tiles a job (LayerNorm 4096 x 8192 x 4096 on 128x128 tiles) a tile at a
// time 0.510 against 0.504 ms, a tie: from 8 tiles a job (no length between measured). And one pair a CTA only, as measured: where a CTA walks several pairs, each
// pair's two epilogues would end together with no mainloop beside them (a job at a time hides all
// but the last; not measured). The planner takes the lead only where the plan can alternate
// (KernelConfig::tile_turns).
inline constexpr int kTurnLead = 1;
inline constexpr int kTileTurnsMinTiles = 8;
inline int turn_lead_wanted(const KernelConfig& k, int64_t jobs_a_cta) {
  return k.n_tiles >= kTileTurnsMinTiles && jobs_a_cta <= 2 ? kTurnLead : 0;
}
// Stash plans (a tile value carried over several N-tiles a job) of several jobs a CTA do not take
// PingPong 64x256 tiles. MEASURED (H100, bench/NOTES.md Stop 66, one call, the model then taking
// 64x256 at each): softmax with bf16 out at 1024 x 32768 x 4096, 64x256 with 4 N-tiles a job
// 0.610 ms (1.657x cuBLAS) against 128x128 with 8 (and its tiles in turn) 0.499 ms (1.218x);
// LayerNorm 1152 x 32768 x 1024 0.434 ms against 64x128's 0.367 (128x128 0.485); softmax at that
// shape 0.284 against 64x128's 0.268 (128x128 0.273). Without 64x256 the model takes the fastest
// of these three each time. The 64x256 kernels there hold 128 accumulators a thread beside the
// L2 exchange's polled words and spill (168-244 B, PlannerKernelsDoNotSpill); the model prices
// neither. One job a CTA (256 rows of a vocabulary: 64x256 measured 1.566x for log-softmax, Stop
// 62) keeps them: its alternatives were not measured.
inline bool stash_tile_refused(const KernelConfig& k, int64_t jobs_a_cta) {
  return k.tile_m == 64 && k.tile_n == 256 && k.wgs_per_tile == 1 && k.stash_elem_bytes > 0 && jobs_a_cta > 1;
}
// LayerNorm's mean and variance in one round over several N-tiles a job (stage.cuh online_second,
// Chan's merge of each tile's squares) where a thread's registers hold it: 64 accumulators a
// thread (64x128 tiles), or row groups of up to 16. MEASURED (bench/NOTES.md Stop 67, H100, each
// pair in one call): LayerNorm 1152 x 32768 x 1024 on 64x128 in row groups of 32, 0.276 ms in one
// round against 0.361 in two (residual LayerNorm 0.332 against 0.421), no spill either way;
// 128x128 with 4 N-tiles in row groups of 16 (4096 x 8192 x 4096) 0.486 against 0.568 (16 B of
// spill against 288). But 128 accumulators a thread beside the pair round's words of 32 peers
// spill (NVRTC 13.0): 128x128 in row groups of 32 264 B (56 in two), 64x256 652 B (168 in two),
// around the round and the tile bodies, none in the k-loop; there one round measured 1.091 ms
// against 1.105 at 4096 x 16384 x 4096 (its cuBLAS rounds 0.785 against 0.805: within the
// spread), so those plans keep two rounds unless forced (--pairs one-round).
inline bool online_mean_variance_fits(const KernelConfig& k) {
  return k.n_tiles == 1 || k.accumulators() <= 64 || k.row_peers() <= 16;
}
// Cooperative 128x256 jobs of several N-tiles (each warp group keeping its 64 rows' earlier tiles
// in its stash), unforced, where both of these hold:
// - the row is longer than 32 of its tiles (N > 8192), where one 256-column tile a CTA would need
//   row groups of more than 32 CTAs. MEASURED (H100, bench/NOTES.md Stop 70, two passes each, the
//   planner's plan of the time against this one): softmax over 32768 columns (1024 x 32768 x 4096,
//   row groups of 16, 8 N-tiles) 1.142x / 1.160x against PingPong 128x128's 1.162x / 1.153x;
//   log-softmax 1.162x / 1.173x against 1.211x / 1.256x (both bf16 out); LayerNorm 4096 x 16384 x
//   4096 in row groups of 8 1.227x against 1.256x. At N = 8192, against cooperative tiles of one
//   N-tile a CTA in row groups of 32: LayerNorm 1.153x / 1.221x against 1.225x / 1.223x, RMSNorm
//   1.225x / 1.204x against 1.137x / 1.134x, softmax 1.191x against 1.199x: no gain there. At
//   K = 1024 (1152 x 32768) they lost: LayerNorm 2.772x against 64x128's 2.226x, softmax in row
//   groups of 32 2.215x against 2.085x (the model keeps 64x128 there).
// - the kernel keeps within 32 B of spill: 128 accumulators a thread beside the L2 exchange's
//   polled words. Compiled with NVRTC 13.0 over row groups of 4 to 64 and 2 to 8 N-tiles a job,
//   up to 16 peers they do (softmax 0 B, log-softmax 24, RMSNorm 8) and beyond they spill 56-256
//   B; LayerNorm's mean and variance in one round spills 108-256 B at 16 peers, 0-48 at 8.
// - no fp32 stash: with f32 outputs (softmax and log-softmax over 32768 columns) the kernels
//   spill 60 and 44 B, and were not measured.
// - at most 8 N-tiles a job: the range compiled and measured (a vocabulary of 128256 columns in
//   row groups of 16 would be 32).
inline constexpr int64_t kCooperativeOneTileRowMaxTiles = 32;  // rows up to this many tiles: one N-tile a CTA
inline constexpr int kCooperativeStashMaxNTiles = 8;
inline bool cooperative_stash_taken(const KernelConfig& k, int64_t tiles_n, bool mean_variance_in_one_round) {
  return tiles_n > kCooperativeOneTileRowMaxTiles && k.n_tiles <= kCooperativeStashMaxNTiles &&
         k.stash_elem_bytes != 4 && k.row_peers() <= (mean_variance_in_one_round ? 8 : 16);
}
// A's rows (M x K, and an N x K B's) start off 128-byte lines where K is not a multiple of 64
// elements: each TMA box row then straddles two (PlannerTunables::unaligned_rows_efficiency).
inline bool rows_off_128_byte_lines(const Problem& p) { return p.k * Sm90::kAbBytes % 128 != 0; }
// A 64-row tile's mainloop rate against the 128-row tile of the same wgmma columns where the MACs
// pace the grid (several waves): it reads B's share from L2 twice as often a MAC, so it runs at
// row_group_mainloop_efficiency's rate for its shape against that tile's, and slower again
// without B multicast (row_group_no_multicast_efficiency). 1 for 128-row tiles (PingPong, or
// cooperative: both warp groups share B). MEASURED on the H100, the plain GEMM 8192x4096x4096
// (bench/sweeps/head_norm_rope.txt): 64x128 1.56x cuBLAS in pairs along M and 1.85x alone,
// against 1.04-1.18x for 128x128 (the model: 0.66 and 0.53).
double row_tile_rate(const PlannerTunables& tun, int tile_m, int mma_cols, int cluster_m);
// short_epilogue: a cast or a bias, a few instructions an element and no tile inputs
// (short_epilogue_ops). may_split_k false: the row measured best without split-K (where a split
// row cannot be built).
MeasuredConfig measured_elementwise_config(const Problem& p, const DeviceModel& dev, bool short_epilogue = false,
                                           bool may_split_k = true);
// The same for a gated GEMM (KernelConfig::gated: each tile's wgmma twice its columns, 64 rows a
// warp group; unsplit: split-K measured no faster at decode, bench/NOTES.md Stop 50).
MeasuredConfig gated_elementwise_config(const Problem& p, const DeviceModel& dev);

// make_plan with an explicit device and tunables (tests; the public overload passes
// device_model(opt.gpu), the H200's where unset).
Plan make_plan(const FusionSpec& s, const Problem& p, const DeviceModel& dev, const PlannerTunables& tun = {},
               const PlanOptions& opt = {});

}  // namespace comfuse
