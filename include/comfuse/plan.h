#pragma once
// The planner: kernel configuration for one FusionSpec at one problem shape, with the
// reason for every choice. Constants only the GPU can settle are named, in
// DeviceModel / PlannerTunables, with where their current values come from.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "comfuse/dtype.h"
#include "comfuse/spec.h"

namespace comfuse {

struct Problem {
  int64_t m = 0, n = 0, k = 0;
  DType ab_dtype = DType::BF16;  // GEMM operand dtype (A and B)
};
// Resolves the spec's M, N, K and operand dtype against bindings.
Problem problem_of(const FusionSpec& s, const Bindings& dims);

// Facts about the target GPU (H200 / sm_90a defaults; measured values noted in plan.cpp).
struct DeviceModel {
  int sm_count = 132;
  int smem_per_cta_bytes = 232448;  // 227 KB opt-in dynamic SMEM per CTA
  int max_cluster = 16;             // non-portable limit
  // Clusters resident at once when each CTA fills an SM (measured on the lent H200).
  std::map<int, int> clusters_resident = {{1, 132}, {2, 66}, {4, 30}, {8, 15}, {16, 7}};

  // Cost-model inputs (additive to the interface above; see src/plan/planner.cpp).
  // MEASURED: a 128x256x4096 bf16 tile's mainloop takes ~45 us on one SM (DESIGN.md),
  // i.e. 2*128*256*4096 / 45e-6 = 5.96 TFLOP/s per SM.
  double sm_flops_per_s = 5.96e12;
  // GUESS: H200 HBM3e peak is 4.8 TB/s; ~85% of it is what streaming kernels reach.
  double dram_bytes_per_s = 4.0e12;
  // GUESS: L2 bandwidth available to epilogue re-reads (GlobalReread), whole chip.
  double l2_bytes_per_s = 6.0e12;
  // FACT (spec sheet): H100/H200 L2 is 50 MB.
  int64_t l2_bytes = 50ll << 20;
  // GUESS: SM clock under sustained tensor load (boost is 1.98 GHz).
  double clock_hz = 1.755e9;
  // MEASURED (naive DSMEM stores + full cluster barriers, 128 floats per CTA) for C_N >= 2:
  // one cluster all-reduce round, microseconds. C_N = 1 (warp shuffles only) is a GUESS.
  // The TMA-bulk/mbarrier version should beat these; they are upper bounds until re-measured.
  // One DSMEM all-reduce round, peer-to-peer, TMA bulk + mbarrier, 64 floats per CTA
  // (bench/dsmem_allreduce.cu on the H200, bench/NOTES.md); C_N = 1 is quad shuffles only.
  std::map<int, double> cluster_allreduce_us = {{1, 0.05}, {2, 0.18}, {4, 0.27}, {8, 0.39}, {16, 0.61}};
  // Whether the device templates walk several N-tiles per CTA for a row reduction (the
  // Stash strategy keeps earlier tiles' bypass value in SMEM, GlobalReread in an L2-resident
  // global workspace: kernels/comfuse/epilogue/stash.cuh). Off: rows must fit one cluster.
  bool multi_tile_rows = true;
  // FACT of the PingPong register split (setmaxnreg 240 for consumers, 40 for the producer).
  int consumer_regs_per_thread = 240;
};

// Knobs to be measured on the GPU (issues 3 and 4); defaults are today's best guesses.
struct PlannerTunables {
  // Peer-to-peer at C_N <= this, leader-follower above. MEASURED: peer-to-peer won at every
  // C_N in 2..16 (0.18-0.61 us vs 0.34-0.76 us a round), so there is no crossover below 16.
  int p2p_max_cluster = 16;
  int max_stash_bytes = 96 * 1024;  // SMEM a CTA may spend keeping earlier N-tiles

  // Cost-model knobs (additive). Each is a GUESS awaiting GPU measurement unless noted.
  // MEASURED (naive form): leader-follower was 5-10% slower than peer-to-peer.
  double leader_follower_penalty = 1.5;  // MEASURED 1.2-1.9x a round (bench/NOTES.md)
  double tile_fixed_us = 0.3;      // GUESS: per-tile pipeline fill / store drain not hidden
  double epilogue_cpi = 1.5;       // GUESS: issue cycles per epilogue instruction per warp
  int reg_overhead = 48;           // GUESS: consumer registers besides live tile values
  // GUESS: mainloop efficiency by pipeline depth (depth >= 4 is full speed).
  std::map<int, double> stage_efficiency = {{2, 0.85}, {3, 0.95}, {4, 1.0}};
  // GUESS: mainloop efficiency by tile_n (SMEM operand traffic per MMA grows as tiles shrink).
  std::map<int, double> tile_n_efficiency = {{64, 0.75}, {128, 0.90}, {192, 0.95}, {256, 1.0}};
  // GUESS: lock-step cost of clusters along N (multicast A waits for the slowest CTA).
  // Untuned CUTLASS 1x2-along-N ran at 0.77x of 2x1-along-M (DESIGN.md); we assume tuning
  // recovers most of that and charge only a few percent.
  std::map<int, double> cluster_efficiency = {{1, 1.0}, {2, 1.0}, {4, 0.98}, {8, 0.97}, {16, 0.96}};
  int reduce_buffer_phases = 2;    // parity double-buffering of the unified reduction buffer
  int store_subtile_n = 64;        // epilogue TMA-store sub-tile width (columns)
  // Stash (and GlobalReread workspace) in bf16 when cheaper. Off by default: a bf16 stash rounds
  // x before x - mean, which |mean| >> std turns into wrong rows (MEASURED: rel_l2 0.44 on
  // LayerNorm with a 1000 offset); PlanOptions::stash_bytes = 2 opts in.
  bool allow_bf16_stash = false;
  // GUESS: share of L2 a GlobalReread workspace may fill and still be re-read from L2; the
  // mainloop's operand tiles need the rest. Beyond it the re-read is charged at DRAM speed.
  double l2_workspace_fraction = 0.5;
  // GUESS (a policy, not a measurement): the most global scratch a GlobalReread plan may ask
  // the runtime for. It bounds N: about 4M columns for a one-value stash at C_N = 16.
  int64_t max_workspace_bytes = 8ll << 30;
  double near_tie = 0.02;          // within 2% of the best: prefer the simpler strategy, smaller cluster

  // Row groups (AggregationMode::Global, src/plan/row_groups.cpp).
  // Mainloop speed of a PingPong tile (key tile_m * 1000 + tile_n) with B multicast along M,
  // relative to sm_flops_per_s. MEASURED (bench/NOTES.md, row groups): 128x128 1.0 (parity with
  // cuBLAS, also run 3); 64x256 0.95 (LayerNorm 8192x4096x4096 at one tile per CTA: 1.125x and
  // 1.090x cuBLAS in two runs vs 0.989x and 1.092x for 128x128); 64x128 0.9 (GUESS).
  std::map<int, double> row_group_mainloop_efficiency = {{64128, 0.9}, {64256, 0.95}, {128128, 1.0}};
  // Share of a multi-tile job's stash traffic (write once, read per later stage) that the
  // mainloops do not hide. MEASURED-ish: T = 2 cost 2-3% over T = 1 at 8192x4096x4096.
  double row_group_stash_exposed = 0.5;
  // Without B multicast (clusters of 1). MEASURED-ish: pp 128x128 alone ran 0.86x of the
  // multicast version (L2-bound in ncu), pp 64x256 with A multicast only 0.65x.
  double row_group_no_multicast_efficiency = 0.8;
  // One exchange round through L2 among G clusters, microseconds, by G. MEASURED for G <= 32
  // (bench/dsmem_allreduce.cu, LL protocol, 64 rows per CTA, idle GPU). 64: what a round
  // costs inside the kernel, MEASURED indirectly (4096x8192x4096 LayerNorm, 128 CTAs in one
  // group: 1.34x cuBLAS vs 1.26x at G = 32 with two tiles per CTA: the slowest of 128 CTAs
  // sets every round; RMSNorm there 1.23x): 30 us keeps G = 64 a last resort).
  std::map<int, double> row_group_exchange_us = {{1, 0.05}, {2, 0.89}, {4, 0.98}, {8, 1.03}, {16, 1.08}, {32, 1.44}, {64, 30.0}};
  bool use_row_groups = true;      // rows with many row blocks go to row groups (else the DSMEM rule)
};

// Global: the CTAs that share a row are a row group of clusters exchanging through L2
// (kernels/comfuse/cluster/global_exchange.cuh); the others: one cluster, over DSMEM.
enum class AggregationMode { None, PeerToPeer, LeaderFollower, Global };
enum class RowStrategy {
  NoReduction,   // elementwise epilogue only: any tile may finish alone
  OnChip,        // the cluster covers the row, one N-tile per CTA
  Stash,         // several N-tiles per CTA; earlier tiles' values stay in SMEM
  GlobalReread,  // row too long for SMEM: earlier tiles' values go to global (L2) and come back
};
std::string_view name_of(AggregationMode m);
std::string_view name_of(RowStrategy s);

struct SmemBudget {
  int mainloop_ring = 0;     // stages x (A tile + B tile)
  int reduction_buffer = 0;  // ONE buffer shared by every reduction of the chain
  int stash = 0;             // earlier N-tiles kept on chip (RowStrategy::Stash)
  int store_buffer = 0;      // epilogue staging for the TMA store
  int barriers = 0;          // mbarriers and pipeline state
  int total() const { return mainloop_ring + reduction_buffer + stash + store_buffer + barriers; }
};

struct PlanOptions {
  std::optional<int> cluster_n;               // force C_N
  std::optional<int> tile_n;                  // force the CTA tile's N
  std::optional<int> tile_m;                  // force rows per consumer warp group (64 or 128)
  std::optional<AggregationMode> aggregation; // debug: force a mode
  std::optional<RowStrategy> strategy;        // force a row strategy (e.g. test GlobalReread)
  std::optional<int> cluster_m;               // force clusters along M (B multicast); with a reduction: row groups
  std::optional<int> row_group;               // force a row group of G clusters (Aggregation Global)
  std::optional<int> stash_bytes;             // force the stash element: 4 (fp32) or 2 (bf16)
  std::optional<bool> fuse_pairs;             // true / false: every pair in one round / two (A/B)
};

// The cost model's estimate for one candidate, microseconds.
struct PlanEstimate {
  double mainloop_us = 0;  // mainloop at the resident SM count (wave-quantized)
  double epilogue_us = 0;  // epilogue + reduce rounds exposed beyond PingPong overlap
  double reread_us = 0;    // GlobalReread L2 traffic
  double dram_floor_us = 0;  // unique DRAM bytes / bandwidth (the time cannot be below this)
  double total_us = 0;
};

struct Plan {
  Problem problem;
  int tile_m = 0, tile_n = 0, tile_k = 0;
  int stages = 0;
  int consumer_warp_groups = 2;
  int wgs_per_tile = 1;          // 1: PingPong (each WG owns a tile, they alternate mainloop and
                                 // epilogue); 2: cooperative (both WGs share one tile)
  int cluster_m = 1, cluster_n = 1;  // cluster_m > 1 (B multicast): no reduction, or row groups
  // Paired reductions (pair_kind in spec.h) exchanged in ONE round: a mean and the variance
  // about it (LayerNorm: Chan's merge of per-CTA sums and M2), a max and the sum of exp about
  // it (softmax: the online-softmax merge). One N-tile per CTA, the row's CTAs meet in L2 or
  // are one CTA.
  OneRoundPairs fused_pairs;
  int row_group = 1;             // clusters whose CTAs share a row (AggregationMode::Global); the
                                 // row's CTAs: cluster_n * row_group
  bool raster_along_n = false;   // tile scheduler: walk raster_group N-blocks (else M-blocks) together
  int raster_group = 8;
  std::string measured_config;   // non-empty: the configuration came from the measured table
  int n_tiles_per_cta = 1;       // N-tiles one CTA walks for one row block
  bool multicast_a = false;      // TMA multicast of the shared A tile across the cluster
  AggregationMode aggregation = AggregationMode::None;
  RowStrategy strategy = RowStrategy::NoReduction;
  int reductions = 0;            // reduction nodes in the chain
  int stages_in_chain = 1;
  SmemBudget smem;
  int smem_limit = 0;
  int64_t tiles_m = 0, tiles_n = 0;
  int clusters_resident = 0;     // from DeviceModel, at this cluster size
  int ctas_busy = 0;             // SMs that can hold a CTA at this cluster size
  std::vector<std::string> reasons;  // one line per choice, why it was made

  // Additive fields (planner detail the emitter and runtime need).
  int stash_elem_bytes = 0;          // 4 (fp32) or 2 (bf16) for Stash; 4 for GlobalReread
  std::vector<std::string> stashed;  // stage-1 values kept for earlier N-tiles (Stash/GlobalReread)
  int live_tile_values = 1;          // tile-sized register values alive across a stage boundary
  int regs_per_thread = 0;           // consumer register estimate
  int store_subtile_n = 0;           // columns per TMA-store sub-tile
  int64_t jobs = 0;                  // cluster work units: one row block (x one N group)
  int64_t grid_ctas = 0;             // persistent grid: CTAs launched
  int64_t workspace_bytes = 0;       // GlobalReread: global scratch the runtime allocates
  PlanEstimate estimate;
  std::vector<std::string> alternatives;  // the best rejected candidates, with estimates
};

// Whether paired reductions can share one round (Plan::fused_pairs): each CTA holds its row
// values in registers (one N-tile) and the row's CTAs meet in L2 or are one CTA (the DSMEM
// channel has no pair round).
inline bool one_round_pairs_possible(int64_t n_tiles_per_cta, AggregationMode agg, int row_peers) {
  return n_tiles_per_cta == 1 && (agg == AggregationMode::Global || row_peers == 1);
}
inline bool one_round_pairs_possible(const Plan& p) {
  return one_round_pairs_possible(p.n_tiles_per_cta, p.aggregation, p.cluster_n * p.row_group);
}

// What the device templates cannot express (operand dtypes, per-row [M, 1] outputs, more than
// one tile-shaped value across a reduction, the kernel's argument slots): throws Error naming
// the values in the user's terms and what is supported instead. make_plan calls it first.
void check_device_limits(const FusionSpec& s);

// Throws Error with the reason when nothing fits (e.g. N beyond what any plan covers).
Plan make_plan(const FusionSpec& s, const Problem& p, const DeviceModel& dev = {},
               const PlannerTunables& tun = {}, const PlanOptions& opt = {});

std::string explain(const FusionSpec& s, const Plan& p);  // text, for `comfuse explain`
std::string to_dot(const FusionSpec& s, const Plan& p);   // Graphviz: stages, reductions, bypass edges

}  // namespace comfuse
