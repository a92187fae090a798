#pragma once
// Shared by the planner's steps (planner.cpp and the files it names): what the planner knows
// about a spec's stage chain, the candidate a decider proposes, and the printers' helpers.
#include <optional>
#include <string>
#include <vector>

#include "calibration.h"
#include "comfuse/plan.h"
#include "comfuse/spec.h"

namespace comfuse::plan_detail {

// The single-GEMM kernel's tile widths and cluster lengths along N that plans take (and forced
// options are checked against): one list for the deciders and the request's checks.
inline constexpr int kTileNs[] = {64, 128, 192, 256};
inline constexpr int kClusterNs[] = {1, 2, 4, 8, 16};

// One stage of the nest, in SpecVisitor::walk order (depth first; the root is stage 0).
struct StageRef {
  const Spec* spec = nullptr;
  int depth = 0;
  int parent = -1;            // index into the stage list, -1 for the root
  int parent_reduction = -1;  // node index (in the parent) of the reduction whose PostOp this is
};
std::vector<StageRef> collect_stages(const FusionSpec& s);

struct ChainInfo {
  // Reductions across the row: what rounds of exchange cost. A per-segment spec's reductions
  // (FusionSpec::segment) finish inside a tile: they count in ops_per_element, not here.
  int reductions = 0;
  int64_t segment = 0;  // FusionSpec::segment: tiles of this many columns, no exchange
  int stages_in_chain = 1;
  // Reduction pairs that can share one exchange round (pair_kind in spec.h, Plan::fused_pairs).
  int mean_variance_pairs = 0;
  int max_exp_sum_pairs = 0;
  int pairs() const { return mean_variance_pairs + max_exp_sum_pairs; }
  // The root stage's pairs (of each kind) where the second reduction's PostStage is the chain's
  // last stage (no reduction) and takes a tile value from the second's stage: in one round over
  // several N-tiles a CTA, those two stages stream the stash together, one read instead of a
  // read, a write-back and a read (stage.cuh kFusedStream). LayerNorm's, softmax's.
  int mean_variance_pairs_streamed_together = 0;
  int max_exp_sum_pairs_streamed_together = 0;
  // Pairs below the root stage: over several N-tiles a CTA they keep two rounds, and so does
  // every pair of their kind (only the root's second statistic runs online, tile by tile:
  // stage.cuh kPairOnline; emit fuses a kind whole).
  int mean_variance_pairs_below_root = 0;
  int max_exp_sum_pairs_below_root = 0;
  // The kind of pair whose first reduction ends the root stage (None: no pair there): over several
  // N-tiles a CTA in one round, its running statistic centers a bf16 stash (stash_type).
  PairKind root_pair = PairKind::None;
  // Every [M, N] output is bf16: a centered bf16 stash then rounds the values the later stages
  // read about as finely as they are stored (stash_type).
  bool tile_outputs_bf16 = true;
  // Every other output (row statistics) is bf16. The root pair's statistics are taken from the
  // values unrounded (stage.cuh online_second), so an f32 one of them is as exact with the stash;
  // a later reduction reads the stashed values.
  bool row_outputs_bf16 = true;
  // Max-and-sum-of-exp pairs whose PostStage reads the operand only through the exp (spec.h
  // pair_keeps_exp): in one round over one N-tile, one exp a value (reduce.cuh kPairGivenKept).
  int max_exp_sum_pairs_keeping_exp = 0;
  // PostStages whose own PostStage takes a tile value from them: over several N-tiles a CTA each
  // writes that value back into the stash for the earlier tiles (stage.cuh body, kTileBypass).
  int stash_write_backs = 0;
  // Largest number of Tile-class Bypass placeholders entering any stage: tile-sized
  // register values that must survive a reduce phase (the accumulator counts as one).
  int live_tile_values = 1;
  // Whether any stage boundary carries a tile-shaped value: a job of several N-tiles then
  // keeps it for its earlier tiles (a stash).
  bool carries_tile = false;
  // Tile-class values of stage 1 bypassed into stage 2: what a CTA walking several
  // N-tiles keeps for its earlier tiles (later stages recompute from these).
  std::vector<int> stash_nodes;  // node indices in the root stage
  std::vector<std::string> stash_names;
  // Epilogue instructions per tile element, summed over every stage (cost model).
  double ops_per_element = 0;
  bool has_tile_output = false;
  int max_out_bytes = 0;  // widest stored Tile output element
  // What each stage keeps in SMEM per consumer WG (kernels/comfuse/epilogue/nodes.cuh): each
  // Store node a rows x 64 staging subtile of its dtype, each RowBroadcast tile_n floats.
  struct StageStorage {
    int store_bytes_per_row_of_64 = 0;  // sum over Store nodes of 64 * sizeof(dtype)
    int row_broadcasts = 0;
  };
  int64_t tile_input_bytes_per_element = 0;  // the [M, N] inputs the kernel reads, once each (DRAM model)
  int tile_inputs = 0;                        // how many [M, N] inputs (each its own epilogue loads)
  std::vector<StageStorage> stage_storage;
};
ChainInfo analyze_chain(const FusionSpec& s);
// Passes over a stash after the first round: one a later stage, one for a root pair's two stages
// that stream together (ChainInfo::max_exp_sum_pairs_streamed_together, fused over several N-tiles).
int stash_reads_after_round(const ChainInfo& chain, const OneRoundPairs& fused, int64_t n_tiles);
// Writes into the stash after the first round: one a PostStage that passes a tile value on
// (ChainInfo::stash_write_backs), none for a root pair's stages that stream together.
int stash_write_backs_after_round(const ChainInfo& chain, const OneRoundPairs& fused, int64_t n_tiles);

// "add(%1, %2)", "mean(%4)", "bias[row]", "2.5", ... (no stage prefix).
std::string node_label(const FusionSpec& s, const Spec& stage, int index);
// The origin name when the lowering recorded one, else "%index".
std::string value_name(const Spec& stage, int index);

std::string fmt_bytes(int64_t bytes);  // "40.0 KiB"
// An explanation's closing lists: "reasons:" and, where any, the alternatives under their title
// (explain.cpp; the single-GEMM, B2B and decode plans alike).
std::string reason_lists(const std::vector<std::string>& reasons, const std::vector<std::string>& alternatives,
                         const char* alternatives_title);

// The positive scale s where node `from` of stage `st` is s times the accumulator (the raw
// scores), through causal masks (where `causal`) and multiplications or divisions by positive
// literals only; 0 where it is anything else (decide_b2b.cpp).
float scale_of_scores(const Spec& st, int from, bool causal);
// The origin of a causal mask in the spec nest, or "" when it has none (decide_b2b.cpp).
std::string causal_mask_in(const Spec& st);

// The decode kernel (B2bConfig::decode_rows, kernels/comfuse/b2b/decode_attention.cuh;
// decide_decode.cpp): whether a pair is the attention it runs, its plan and its explanation.
struct DecodeForm {
  float scale = 0.f;    // F's scores x = scale (Q K^T) [+ mask]
  int mask_arg = -1;    // the additive [M, N1] mask (an index into the first spec's args); -1: none
  std::string refused;  // why the decode kernel cannot run the pair ("": it can)
};
DecodeForm decode_form(const FusionSpec& first, const FusionSpec& second, const B2bProblem& p, B2bIntermediate kind);
B2bPlan decode_plan(const FusionSpec& first, const B2bProblem& p, const DecodeForm& form, const PlanOptions& opt,
                    const DeviceModel& dev);
std::string explain_decode(const FusionSpec& first, const FusionSpec& second, const B2bPlan& p);
// A pair's DRAM bytes (16-bit operands; small M streams only weights): GEMM1 reads X and W1 (W3)
// and writes S, GEMM2 reads S and W2 and writes O; the fused kernel (and the decode kernel: Q, K,
// V, O) reads X, W1 (W3) and W2 and writes O (decide_b2b.cpp).
struct B2bBytes {
  double x, w1, s, w2, o;
};
B2bBytes b2b_bytes(const B2bProblem& p, bool gated);
// A B2B pair's unfused path where the planner prices no kernels (a batched pair): GEMM1 and
// GEMM2 each at the measured rate or its DRAM traffic, S written and read back.
double b2b_roofline_unfused_us(const B2bProblem& p, bool gated, const DeviceModel& dev);

inline int64_t ceil_div64(int64_t a, int64_t b) { return (a + b - 1) / b; }
// A calibration table's value at `key`: the largest entry <= key, else the smallest.
inline double lookup(const std::map<int, double>& m, int key) {
  if (m.empty()) return 1.0;
  auto it = m.upper_bound(key);
  if (it == m.begin()) return it->second;
  return std::prev(it)->second;
}

// A configuration a decider proposes: the kernel it would build and what the planner knows
// about running it.
struct Candidate {
  KernelConfig k;
  int max_ring_stages = Sm90::kRingStagesDefault;
  int raster_group = 8;
  bool raster_along_n = false;
  int regs = 0;                 // consumer register estimate
  int64_t tiles_m = 0, tiles_n = 0, jobs = 0;
  int resident = 0;             // clusters the grid holds
  int64_t workspace = 0;        // WorkspaceStash: bytes of the global stash
  PlanEstimate est;
  std::string why;              // a measured or model-specific account, for the reasons
  // The row-group model priced the root stage's tile inputs from L2 below the ring that could
  // carry them (Division::priced): assemble() leaves them there.
  bool ring_inputs_declined = false;
  RowStrategy strategy() const;
  std::string describe() const;
};

// Step "storage": one consumer WG's epilogue SMEM as the kernel lays it out (every stage's node
// storage, 1024-aligned blocks, then the DSMEM channel), and the deepest ring that fits beside
// it and the stash. False (with the reason recorded by the caller) when not even two ring
// stages fit.
int epilogue_smem_bytes(const ChainInfo& chain, const KernelConfig& k);
// The deepest ring of at most `at_most` stages (and at least 2) whose whole SMEM fits `smem_bytes`
// beside what else `k` holds; false (k at 2 stages) where none does.
bool deepest_ring(KernelConfig& k, int smem_bytes, int at_most);
// The deepest ring that fits beside the epilogue: at most c.max_ring_stages, or at most `at_most`
// (PlanOptions::ring_stages, forced: it may ask for more than the planner's own cap).
bool fit_ring(Candidate& c, const ChainInfo& chain, const DeviceModel& dev, std::optional<int> at_most);
// KernelConfig::smem_bytes() broken down for explain.
SmemBudget smem_budget(const KernelConfig& k);
// KernelConfig::ring_input_bytes for k (its tile, schedule, split-K): the root stage's [M, N]
// tile inputs (FusionSpec::root_tile_inputs) in one slot of the mainloop's ring where the kernel
// can carry them (check()) and PlanOptions::ring_inputs allows; 0: they are read from L2.
// `why_not` (optional): why not, when it returns 0.
int ring_input_bytes(const FusionSpec& s, const KernelConfig& k, const PlanOptions& opt,
                     std::string* why_not = nullptr);

// Why candidates died, for the error when nothing fits: per kind, the first example and a count.
struct Rejections {
  std::vector<std::pair<std::string, std::pair<std::string, int>>> kinds;
  void add(const std::string& kind, std::string why);
  std::string str() const;
};

struct Request {
  const FusionSpec& spec;
  const Problem& p;
  const DeviceModel& dev;
  const PlannerTunables& tun;
  const PlanOptions& opt;
  const ChainInfo& chain;
};

// Step "decide": one decider per plan kind proposes candidates (with storage fitted and their
// estimate), cheapest first where the kind has a model of its own.
//   elementwise  (decide_elementwise.cpp)  no row reduction: measured configurations per shape class
//   row groups   (decide_row_groups.cpp)   the row's CTAs are clusters along M meeting in L2
//   DSMEM        (decide_cluster.cpp)      one cluster along N covers the row (the paper's path)
std::vector<Candidate> decide_elementwise(const Request& r, Rejections& why);
std::vector<Candidate> decide_row_groups(const Request& r, Rejections& why);
std::vector<Candidate> decide_cluster(const Request& r, Rejections& why);
// A measured split-K row (calibration.cpp) as the row-group decider builds it (its division of K
// and its gather) with exactly this tile, cluster and split count forced; its why is the model's
// terms. None where that division fits nothing.
std::optional<Candidate> measured_split_row(const Request& r, int tile_m, int tile_n, int cluster_m, int k_splits);
// The DSMEM search's cost model, also the DRAM floor of every kind (decide_cluster.cpp).
void estimate_cluster(Candidate& c, const Request& r);

// Whether the options ask for a row-group plan (cluster_m without cluster_n, row_group,
// k_splits, aggregation L2Exchange).
bool row_groups_forced(const PlanOptions& opt);
// One job a CTA (one wave: decode, small M; c.jobs and c.resident set): every CTA's epilogue
// runs at once and nothing overlaps it.
bool one_job_a_cta(const Candidate& c);
// The jobs a CTA of the persistent grid walks (the most any does).
int64_t jobs_a_cta(const Candidate& c);
// One job a CTA of one N-tile: its vectors load ahead of the mainloop (KernelConfig::begin_early).
bool begins_early(const Candidate& c);
// Which paired reductions share one exchange round: where the row meets in L2 or in one CTA
// (over several N-tiles a CTA, a chain whose pairs of the kind are all the root stage's), every
// pair when forced (PlanOptions::fuse_pairs), else every pair where a round is saved (row_peers
// > 1; over several N-tiles, in row groups of up to kOnlinePairMaxRowPeers).
OneRoundPairs fuse_pairs(const ChainInfo& chain, const PlanOptions& opt, const KernelConfig& k);
// The stash's element (KernelConfig::stash_elem_bytes) and centers (stash_centers) for a
// candidate of several N-tiles a CTA that carries a tile value (decide_row_groups.cpp), its pairs
// fused as fuse_pairs says.
struct StashType {
  int elem_bytes = 4;
  bool centers = false;
};
StashType stash_type(const ChainInfo& chain, const PlanOptions& opt, const PlannerTunables& tun,
                     const OneRoundPairs& fused, int64_t n_tiles);
// Whether a bf16 stash can be centered (epilogue/stash.cuh Centered): the root stage's pair runs
// online over the N-tiles (its running statistic is the center) and no later stage writes a tile
// value back into the stash (only the root's values have centers).
bool stash_centers_possible(const ChainInfo& chain, const OneRoundPairs& fused, int64_t n_tiles);
// What the stash holds, in words: "fp32", "bf16", or "bf16 about each tile's row centers".
inline const char* stash_type_name(const KernelConfig& k) {
  return k.stash_elem_bytes == 4 ? "fp32" : k.stash_centers ? "bf16 about each tile's row centers" : "bf16";
}
// The widest row group whose max-and-sum-of-exp pair over several N-tiles a CTA takes one round
// unforced (fuse_pairs, decide_row_groups.cpp says what was measured).
inline constexpr int kOnlinePairMaxRowPeers = 32;
// KernelConfig::pair_hand_over: pairs in one round over the L2 exchange of warp groups that hand
// them over (l2_exchange_smem_bytes), and a run of the plan (any M up to its own) may hold a job of
// 9 to 32 rows.
bool pair_hand_over(const OneRoundPairs& fused, int64_t m, const KernelConfig& k);
// Whether row group g is passed over for a smaller one that runs a root max-and-sum-of-exp pair in
// one round (decide_row_groups.cpp); never where the row group or the pairs are forced.
bool two_round_pair_group(const ChainInfo& chain, const PlanOptions& opt, int64_t m, int64_t tiles_n, int g,
                          int64_t jobs, int64_t groups_max);
// The fewest rows two_round_pair_group applies to: it was measured at 256 and 1024.
inline constexpr int64_t kOnePairGroupMinRows = 256;

// Fills plan.reasons: one line per choice (reasons.cpp). `unforced` describes what the
// model would have picked without the forced options ("" when nothing was forced).
void add_reasons(Plan& plan, const ChainInfo& chain, const DeviceModel& dev, const PlannerTunables& tun,
                 const PlanOptions& opt, const std::string& unforced);

}  // namespace comfuse::plan_detail
