#pragma once
// The planner: the kernel configuration for one FusionSpec at one problem shape, with the
// reason for every choice. The configuration itself is a KernelConfig (kernels/comfuse/
// config.cuh), the one description that Ψ writes into the kernel and the runtime launches
// from; Plan adds what the planner knew and why it chose (explain). How it decides is
// src/plan/planner.cpp (named steps); what it was calibrated with is src/plan/calibration.h.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comfuse/config.cuh"
#include "comfuse/dtype.h"
#include "comfuse/spec.h"

namespace comfuse {

struct Problem {
  int64_t m = 0, n = 0, k = 0;
  DType ab_dtype = DType::BF16;  // GEMM operand dtype (A and B)
};
// Resolves the spec's M, N, K and operand dtype against bindings.
Problem problem_of(const FusionSpec& s, const Bindings& dims);

// How the CTAs that share a row hold it, derived from the KernelConfig (Plan::strategy()).
enum class RowStrategy {
  NoReduction,     // elementwise epilogue only: any tile may finish alone
  OnChip,          // the row's CTAs cover the row, one N-tile each: every value stays in registers
  SmemStash,       // several N-tiles per CTA; earlier tiles' bypassed value stays in SMEM
  WorkspaceStash,  // several N-tiles per CTA; earlier tiles' bypassed value goes to a global
                   // workspace (mostly L2-resident) and is re-read by each later stage
};
std::string_view name_of(Aggregation a);
// The word that forces a mode (`comfuse explain --aggregation`, the Python backend's option):
// p2p, leader, l2; "" for None, which no option forces.
std::string_view option_word(Aggregation a);
std::optional<Aggregation> aggregation_of_word(std::string_view word);
std::string_view name_of(RowStrategy s);

// The GPU a plan is made for: the planner's measured numbers (src/plan/calibration.h
// device_model) differ between the two Hopper parts it was measured on. H200 is the default
// (the most measured); the runtime plans for the GPU it runs on (runtime.h gpu_of_this_device).
enum class Gpu { H200, H100 };
std::string_view name_of(Gpu g);
// "h200" / "h100" (case-insensitive) as the CLI and the Python options spell them; nullopt otherwise.
std::optional<Gpu> gpu_named(std::string_view name);

// KernelConfig::smem_bytes() broken down for explain: total() is exactly what a launch asks for.
struct SmemBudget {
  int mainloop_ring = 0;     // ring_stages x (A tile + B tile)
  int reduction_buffer = 0;  // the DSMEM channels: ONE per consumer WG, shared by every reduction
  int stash = 0;             // earlier N-tiles kept on chip (RowStrategy::SmemStash)
  int store_buffer = 0;      // the epilogue's node storage: TMA-store staging, row vectors
  int split_hand_over = 0;   // split-K's partials over DSMEM (KernelConfig::splits_in_cluster)
  int split_gather = 0;      // split-K's summed partial rows, decode rows or whole tiles (KernelConfig::split_gather_rows)
  int barriers = 0;          // ring mbarriers and the alignment the kernel's layout pads to
  int total() const { return mainloop_ring + reduction_buffer + stash + store_buffer + split_hand_over + split_gather + barriers; }
};

struct PlanOptions {
  // The GPU to plan for; unset: the H200 (see Gpu). The runtime fills it with the GPU it runs on.
  std::optional<Gpu> gpu;
  std::optional<int> cluster_n;               // force C_N (a DSMEM plan when reducing)
  std::optional<int> tile_n;                  // force the CTA tile's N
  std::optional<int> tile_m;                  // force rows per consumer warp group (64 or 128)
  std::optional<Aggregation> aggregation;     // force a mode (PeerToPeer/LeaderFollower: DSMEM; L2Exchange: row groups)
  std::optional<RowStrategy> strategy;        // force a row strategy (a DSMEM plan)
  std::optional<int> cluster_m;               // force clusters along M (B multicast); with a reduction: row groups
  std::optional<int> row_group;               // force a row group of G clusters (L2 exchange)
  std::optional<int> k_splits;                // force split-K: K-splits per tile (1: none)
  // Force split-K's partial tiles over DSMEM, the K-splits of a tile in one hardware cluster
  // (true), or through the L2 workspace (false).
  std::optional<bool> splits_in_cluster;
  // Split-K through L2: the owner's warp group sums the partial rows (decode rows, or the whole
  // tile) in SMEM (true; KernelConfig::split_gather_rows: the default where they fit beside the
  // ring as planned; forced, the ring gives up stages for them) or each thread loads its own
  // accumulators' partials (false).
  std::optional<bool> split_gather_in_smem;
  // KernelConfig::store_stages: 1 or 2 TMA-store staging buffers per output (unset: 2 where
  // they fit beside the ring as planned and a tile has several 64-column subtiles, calibration.h
  // kStoreStagesWhereFree; forced 2, the ring gives up the stages they need).
  std::optional<int> store_stages;
  std::optional<int> stash_bytes;             // force the stash element: 4 (fp32) or 2 (bf16)
  std::optional<bool> fuse_pairs;             // true / false: every pair in one round / two (A/B)
  // Unset or true (the default): a softmax pair in one round over one N-tile keeps the exp it sums
  // (OneRoundPairs::kept_exp); false: makes it again after the round (an A/B).
  std::optional<bool> keep_pair_exp;
  // Force KernelConfig::poll_backoff where the plan's rows meet in L2 (an A/B of the poll's pause;
  // unset: calibration.h poll_backoff_wanted); no effect on other plans.
  std::optional<bool> poll_backoff;
  // Force KernelConfig::turn_lead (0: a job at a time; 1..n_tiles) where a PingPong job holds
  // several N-tiles (unset: calibration.h turn_lead_wanted); no effect on other plans.
  std::optional<int> turn_lead;
  std::optional<int> ring_stages;             // at most this many mainloop ring stages (2..Sm90::kMaxRingStages; A/B)
  // Force KernelConfig::consumer_wgs: 2, or 3 PingPong consumer warp groups on 64-row tiles
  // (row groups and elementwise plans), whose epilogues then overlap one another's.
  std::optional<int> consumer_wgs;
  // Force the root stage's [M, N] tile inputs into the mainloop's ring (true) or to L2 reads
  // (false); the planner's default: the ring wherever the kernel can carry them.
  std::optional<bool> ring_inputs;
  // A B2B pair (lower.h): one kernel where it pays (Auto, choose_b2b below), always (Force: to
  // benchmark or test the B2B kernel), or never (Off: two single-GEMM kernels, S through memory).
  enum class B2b { Auto, Force, Off } b2b = B2b::Auto;
  // Force a B2B job's rows: 64 (one consumer warp group, its own ring) or 128 (both, paired:
  // B2bConfig::paired, sharing W1/W2 tiles).
  std::optional<int> b2b_job_rows;
  // Force B2bConfig::fma_exp_every (an online softmax's exponentials on the FMA pipe; 0: none).
  std::optional<int> fma_exp_every;
  // Force B2bConfig::f_beside_gemm2 with X resident (an online softmax's F beside the previous
  // chunk's GEMM2; the planner's default wherever X fits resident, K <= 256) on or off.
  std::optional<bool> b2b_overlap;
  // Force B2bConfig::x_k_blocks > 0 (X resident for its job, K <= 256) on or off.
  std::optional<bool> b2b_x_resident;
  // Force B2bConfig::x_buffers: 1, or 2 (a resident X double-buffered across jobs).
  std::optional<int> b2b_x_buffers;
  // Force B2bConfig::chain_jobs (each job's first GEMM1 with the previous job's last GEMM2; X in
  // two buffers) on or off.
  std::optional<bool> b2b_chain_jobs;
  // Force the decode kernel (B2bConfig::decode_rows: attention at a few query rows a batch on CUDA
  // cores, keys split over a cluster) on, or off (the wgmma pipeline); the planner's default
  // takes the faster estimate where the pair is attention the decode kernel runs.
  std::optional<bool> b2b_decode;
  // A gated pair's unfused path (unfused_pair): W1 and W3 in one gated GEMM sharing X's tiles
  // (true, the default), or X W3^T stored first and read back by GEMM1's F (false: three kernels).
  std::optional<bool> gated_gemm;
};

// The cost model's estimate for one candidate, microseconds.
struct PlanEstimate {
  double mainloop_us = 0;    // mainloop at the resident SM count (wave-quantized)
  double epilogue_us = 0;    // epilogue + reduce rounds exposed beyond PingPong overlap
  double reread_us = 0;      // WorkspaceStash L2 traffic
  double dram_floor_us = 0;  // unique DRAM bytes / bandwidth (the time cannot be below this)
  double total_us = 0;
  // The least this plan's launch measured against such an estimate: total_us, or for a one-wave
  // split-K plan total_us / calibration.h's one_wave_split_overestimate, or for a one-wave plan of
  // single CTAs B at the DRAM's long-stream rate (calibration.h, "one-wave long streams"), not below
  // the DRAM floor (what a frontend measures before it refuses a region on the estimate).
  double low_us = 0;
};

struct Plan {
  Problem problem;
  KernelConfig kernel;  // THE kernel description: Ψ writes it, the kernel is built from it,
                        // the runtime sizes SMEM, workspaces and grid from it
  // Epilogue: paired reductions (pair_kind in spec.h) exchanged in ONE round: a mean and the
  // variance about it (LayerNorm: Chan's merge of per-CTA sums and M2), a max and the sum of
  // exp about it (softmax: the online-softmax merge). One N-tile per CTA, the row's CTAs meet
  // in L2 or are one CTA.
  OneRoundPairs fused_pairs;
  // Launch-time scheduling (Params): the tile scheduler walks raster_group N-cluster-blocks
  // (raster_along_n) or M-blocks together, to keep B (or A) panels hot in L2.
  bool raster_along_n = false;
  int raster_group = 8;

  // What the planner knew and derived (explain, reasons, tests).
  Gpu gpu = Gpu::H200;           // the GPU planned for (PlanOptions::gpu)
  RowStrategy strategy() const;
  std::string measured_config;   // non-empty: the configuration came from a measured table
  int reductions = 0;            // reduction nodes in the chain
  int stages_in_chain = 1;       // the epilogue's stages (reductions + 1 along the deepest nest)
  SmemBudget smem;
  int smem_limit = 0;
  int64_t tiles_m = 0, tiles_n = 0;
  int clusters_resident = 0;     // measured residency at this cluster size
  int ctas_busy = 0;             // SMs that hold a CTA at this cluster size
  std::vector<std::string> stashed;  // stage-1 values kept for earlier N-tiles (a stash)
  int live_tile_values = 1;      // tile-sized register values alive across a stage boundary
  int regs_per_thread = 0;       // consumer register estimate
  int store_subtile_n = 0;       // columns per TMA-store sub-tile
  int64_t jobs = 0;              // cluster work units: one row block (x one N group)
  int64_t grid_ctas = 0;         // persistent grid: CTAs launched
  int64_t workspace_bytes = 0;   // WorkspaceStash: global scratch the runtime allocates
  PlanEstimate estimate;
  std::vector<std::string> reasons;       // one line per choice, why it was made
  std::vector<std::string> alternatives;  // the best rejected candidates, with estimates
};

// Which paired reductions can share one round (Plan::fused_pairs): the row's CTAs meet in L2 or
// are one CTA (the DSMEM channel has no pair round). Over several N-tiles a CTA both kinds
// accumulate their second statistic online, tile by tile (stage.cuh online_second: the squares
// about each tile's mean merged by Chan's formula, the exp about a running max), the root
// stage's pair only (ChainInfo's pairs below the root); a max-and-sum-of-exp pair keeps that exp
// in the registers only where they hold the whole job (one N-tile: kept_exp).
inline OneRoundPairs one_round_pairs_possible(int64_t n_tiles_per_cta, Aggregation agg, int row_peers) {
  const bool channel = agg == Aggregation::L2Exchange || row_peers == 1;
  return {channel, channel, channel && n_tiles_per_cta == 1};
}
inline OneRoundPairs one_round_pairs_possible(const Plan& p) {
  return one_round_pairs_possible(p.kernel.n_tiles, p.kernel.aggregation, p.kernel.row_peers());
}

// Why a plan's bf16 stash cannot be centered (KernelConfig::stash_centers: the root stage's pair
// must run online over the N-tiles, no later stage writing a tile value back), or nullptr: the
// kernel's static_asserts, checked before the JIT for plans made or edited by hand.
const char* stash_centers_refused(const FusionSpec& s, const Plan& p);

// What the device templates cannot express (operand dtypes, more than one tile-shaped value
// across a reduction, the kernel's argument slots): throws Error naming the values in the
// user's terms and what is supported instead. make_plan calls it first.
void check_device_limits(const FusionSpec& s);
// The part of it every kernel family shares: an epilogue the JIT can compile in bounded time
// (Sm90::kMaxReductions reductions, Sm90::kMaxStageNodes nodes a stage). make_b2b_plan calls it
// on both GEMMs' specs.
void check_compile_size(const FusionSpec& s);

// Plans `s` at `p` for opt.gpu (default the H200; src/plan/calibration.h). Throws Error with the reason when
// nothing fits (e.g. N beyond what any plan covers) or an option cannot be honoured.
Plan make_plan(const FusionSpec& s, const Problem& p, const PlanOptions& opt = {});
// The DRAM bandwidth the planner prices streaming traffic at (its device model's), bytes/s: the
// frontend prices an unfused GEMM's operand stream at decode rows with the same number.
double planned_dram_bytes_per_s(Gpu gpu = Gpu::H200);

std::string explain(const FusionSpec& s, const Plan& p);  // text, for `comfuse explain`
std::string to_dot(const FusionSpec& s, const Plan& p);   // Graphviz: stages, reductions, bypass edges

// ---- Back-to-back GEMMs (the B2B kernel family, kernels/comfuse/b2b/) -------------------------
// Two regions that Φ paired (lower.h, B2BCandidate): `first` is GEMM1 (X W1^T [, X W3^T]) with
// the intermediate epilogue F, storing S; `second` is GEMM2 (S W2^T) with its epilogue. The
// B2B kernel keeps S in registers.
struct B2bProblem {
  int64_t batches = 1;
  int64_t m = 0, k = 0, n1 = 0, n2 = 0;
  DType ab_dtype = DType::BF16;
};
B2bProblem b2b_problem_of(const FusionSpec& first, const FusionSpec& second, const Bindings& dims);
// The size rule (graph.h's check_problem_size) for both GEMMs, and the batch count: the planner
// and FusedKernel::run_b2b refuse a size the same way.
void check_b2b_problem_size(const B2bProblem& p);

// How F runs per chunk of N1: elementwise (FFN's gelu, SwiGLU's silu(P) * P3), or softmax over
// all of N1 with its running max and sum (attention: online softmax, O rescaled per chunk).
enum class B2bIntermediate { Elementwise, OnlineSoftmax };
std::string_view name_of(B2bIntermediate f);

struct B2bPlan {
  Gpu gpu = Gpu::H200;  // the GPU planned for (PlanOptions::gpu)
  B2bProblem problem;
  B2bConfig kernel;  // THE kernel description (config.cuh), as KernelConfig for the single GEMM
  B2bIntermediate intermediate = B2bIntermediate::Elementwise;
  int64_t jobs = 0;        // consumer warp-group jobs: tile_m rows x tile_n2 columns of O, per batch
  int64_t grid_ctas = 0;   // persistent grid (two consumer warp groups a CTA)
  int gemm1_passes = 1;    // GEMM1 runs once per tile_n2 block of O: ceil(N2 / tile_n2)
  double fused_us = 0;     // the model's estimate of the B2B kernel
  double unfused_us = 0;   // ... and of GEMM1 + its epilogue, S through DRAM, GEMM2 + epilogue
  double dram_floor_us = 0;  // the fused kernel's DRAM traffic alone (X, W1 [W3], W2 read, O written)
  std::string unfused_from;  // how unfused_us was priced (the planner's unfused kernels, or a roofline)
  int decode_mask_arg = -1;  // the decode kernel's additive mask (an index into the first spec's args); -1: none
  std::vector<std::string> reasons;
  std::vector<std::string> alternatives;
};

// F as the B2B kernel renders it: the first spec, or for an online softmax its prologue only
// (the root stage, its max replaced by the Store of S of the max's operand; the kernel runs
// the max, the sum and the division along the chunks). `s_arg`: the first spec's output S.
// logit_scale > 0 (B2bConfig::logit_scale, from b2b_logit_scale): the Store takes the
// accumulator itself, the kernel applying the scale and the causal mask.
FusionSpec b2b_intermediate(const FusionSpec& first, int s_arg, B2bIntermediate kind, float logit_scale = 0.f);
// The positive scale s where the softmax's operand (the first spec's max operand) is s times the
// raw scores, through causal masks (where `causal`) and multiplications or divisions by positive
// literals only (attention's logits); 0 where it is anything else.
float b2b_logit_scale(const FusionSpec& first, bool causal);
int b2b_intermediate_arg(const FusionSpec& first, const FusionSpec& second);  // S in first.args

// Throws Error with the reason when the pair cannot be one B2B kernel (F's reductions other
// than a softmax over N1, GEMM2's reductions over more columns than a job holds, dtypes).
B2bPlan make_b2b_plan(const FusionSpec& first, const FusionSpec& second, const B2bProblem& p,
                      const PlanOptions& opt = {});
std::string explain(const FusionSpec& first, const FusionSpec& second, const B2bPlan& p);

// A pair as single-GEMM kernels, run one after the other, each intermediate through DRAM: GEMM1
// and F storing S, then GEMM2 and its epilogue reading S. A gated GEMM1 is one gated GEMM
// (KernelConfig::gated: W1's and W3's tiles beside each other, sharing X's), or, with
// gated_gemm false, two kernels: X W3^T stored first, in X's 16-bit type as an unfused
// framework rounds it, then X W1^T with F reading that product as an [M, N1] tile input where
// the gated entry was (PlanOptions::gated_gemm, read here only). Every kernel's spec verifies;
// its args name the intermediates as `intermediates` does (a name no graph tensor has).
struct UnfusedPair {
  std::vector<FusionSpec> kernels;        // in launch order; the last is the pair's second spec
  std::vector<RuntimeArg> intermediates;  // stored by one kernel, read by a later one, in that order
};
UnfusedPair unfused_pair(const FusionSpec& first, const FusionSpec& second, const PlanOptions& opt = {});

// One kernel for the pair, or its unfused kernels (unfused_pair), decided here and nowhere else:
// Force takes the pair (a refusal is an Error), Off the unfused kernels, Auto the pair where
// make_b2b_plan accepts it and its estimate is no slower than the unfused kernels'
// (B2bPlan::unfused_us). A batched pair has no unfused path (the single-GEMM kernels take no
// batch dim): Auto keeps it one kernel, saying so; Off refuses it.
struct B2bChoice {
  bool one_kernel = false;
  std::optional<B2bPlan> plan;  // the pair's plan, where make_b2b_plan accepted it
  std::string reason;           // one line: which and why, with the estimates
};
B2bChoice choose_b2b(const FusionSpec& first, const FusionSpec& second, const B2bProblem& p,
                     const PlanOptions& opt = {});

}  // namespace comfuse
