// The `comfuse` command line: parse arguments, call the library, print. No logic of its
// own beyond binding dims and formatting; every decision lives in the layers.
//
//   comfuse lower   FILE                         regions, fallbacks, the Fusion Spec of each
//   comfuse explain FILE --shape M,N,K [...]     the plan of each region (text, or --dot)
//   comfuse emit    FILE --shape M,N,K [...]     the CUDA C++ Ψ renders for each region
//   comfuse compile FILE --shape M,N,K [...]     emit + JIT-compile (no GPU needed)
//   comfuse run     FILE --shape M,N,K [...]     GPU: fused kernel vs fp64 reference, timed
//                                                against cuBLAS; --reference: the CPU check
//                                                of the lowering (two fp64 executors)
// explain, emit, compile and run (not run --reference) take the plan overrides (--cluster-n,
// --tile-n, --tile-m, --aggregation p2p|leader|l2, --strategy on-chip|smem-stash|workspace-stash;
// row groups: --cluster-m, --row-group, --k-splits, --split-k-partials dsmem|l2, --split-k-gather
// smem|registers, --stash fp32|bf16;
// --pairs one-round|two-rounds; --pair-exp kept|again;
// a B2B pair: --b2b auto|force|off, one kernel where it pays, always, or never).
// Errors: `comfuse: error: <msg>` on stderr, exit 1 (graph files: FILE:line:col:);
// command-line usage errors (an option value outside its choices too) exit 2.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <vector>

#include "comfuse/error.h"
#include "comfuse/interp.h"
#include "comfuse/lower.h"
#include "comfuse/plan.h"
#include "comfuse/harness.h"
#include "comfuse/runtime.h"
#include "comfuse/spec.h"
#include "comfuse/text.h"

namespace {

using namespace comfuse;

// A located error about FILE as `FILE:line:col: msg` plus the offending line (a window of it,
// escaped: a file's bytes never reach the terminal raw).
Error located(const std::string& path, const Error& e) {
  const int line = e.loc().line, col = e.loc().column;
  std::string msg = e.what();
  for (const std::string& prefix : {fmt::format("line {}, column {}: ", line, col), printable(path) + ": "})
    if (msg.rfind(prefix, 0) == 0) msg.erase(0, prefix.size());
  std::ifstream in(path);
  std::string text;
  for (int i = 0; i < line && std::getline(in, text); ++i) {
  }
  std::string shown;
  if (in || !text.empty()) shown = "\n" + excerpt(text, col);
  return Error(fmt::format("{}:{}:{}: {}{}", printable(path), line, col, msg, shown));
}

Graph load_graph(const std::string& path) {
  try {
    return parse_graph_file(path);
  } catch (const Error& e) {
    if (!e.loc().known()) throw;
    throw located(path, e);
  }
}

// Lowers, and shows what the kernels will compute differently from the graph.
LoweringResult lower_and_warn(const Graph& g, const std::string& path) {
  try {
    LoweringResult r = lower(g);
    for (const std::string& w : r.warnings) std::cerr << "comfuse: warning: " << w << "\n";
    return r;
  } catch (const Error& e) {
    if (!e.loc().known()) throw;
    throw located(path, e);
  }
}

struct DimArgs {
  std::string shape;              // "M,N,K"
  std::vector<std::string> dims;  // "NAME=V"
};

int64_t parse_int(const std::string& s, const std::string& what) {
  try {
    size_t used = 0;
    long long v = std::stoll(s, &used);
    if (used == s.size()) return v;
  } catch (const std::exception&) {
  }
  throw Error(fmt::format("{}: '{}' is not an integer", what, s));
}

// Every symbolic dim the graph names.
std::set<std::string> graph_dims(const Graph& g) {
  std::set<std::string> dims;
  for (const Node& n : g.nodes())
    for (const Dim& d : n.shape)
      if (!d.sym.empty()) dims.insert(d.sym);
  return dims;
}

// --shape binds the first region's GEMM dims (whatever the file calls them), so
// `--shape 8192,4096,4096` works on any file; --dim binds the graph's other symbols. A value
// that contradicts the file (a dim it fixes, one symbol given two values) or a --dim the graph
// does not have is refused by name: nothing is ignored silently.
Bindings bindings(const DimArgs& a, const Graph& g, const LoweringResult& r) {
  Bindings b;
  std::map<std::string, std::string> from;   // symbol -> which option bound it
  std::map<std::string, std::string> label;  // symbol -> that option with the graph's name where it differs
  auto bind = [&](const std::string& sym, int64_t v, const std::string& what, const std::string& named) {
    auto [it, fresh] = b.emplace(sym, v);
    if (!fresh && it->second != v)
      throw Error(fmt::format("{} = {} contradicts {} = {} (both are the graph's dimension '{}')", what, v, from[sym],
                              it->second, sym));
    from.emplace(sym, what);
    label.emplace(sym, named);
  };
  if (!a.shape.empty()) {
    std::vector<int64_t> v;
    size_t start = 0;
    for (;;) {
      size_t comma = a.shape.find(',', start);
      v.push_back(parse_int(a.shape.substr(start, comma - start), "--shape"));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    if (v.size() != 3) throw Error(fmt::format("--shape wants M,N,K (three integers), got '{}'", a.shape));
    const FusionSpec& s = r.regions.at(0).spec;
    const Dim* d[] = {&s.m, &s.n, &s.k};
    const char* role[] = {"M", "N", "K"};
    for (int i = 0; i < 3; ++i) {
      const int64_t value = v[static_cast<size_t>(i)];
      const std::string what = fmt::format("--shape's {}", role[i]);
      if (d[i]->sym.empty()) {
        if (value != d[i]->size)
          throw Error(fmt::format("{} = {}, but the graph fixes {} = {} (GEMM '{}')", what, value, role[i],
                                  d[i]->size, g.node(r.regions[0].matmul_node).name));
      } else {
        bind(d[i]->sym, value, what, d[i]->sym == role[i] ? what : fmt::format("{} ({})", what, d[i]->sym));
      }
    }
  }
  const std::set<std::string> known = graph_dims(g);
  for (const std::string& kv : a.dims) {
    size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) throw Error(fmt::format("--dim wants NAME=VALUE, got '{}'", kv));
    const std::string name = kv.substr(0, eq);
    if (!known.count(name))
      throw Error(fmt::format("--dim {}: the graph has no dimension '{}' (its dimensions: {})", printable(name, 64),
                              printable(name, 64), known.empty() ? "none" : fmt::format("{}", fmt::join(known, ", "))));
    bind(name, parse_int(kv.substr(eq + 1), "--dim " + name), "--dim " + name, "--dim " + name);
  }
  // Every bound dim in the graph's own name, used or not (the planners check M, N, K and the
  // batch again in their roles).
  for (const auto& [sym, v] : b) check_dim_size(label[sym], v);
  return b;
}

void add_dim_options(CLI::App* sub, DimArgs& a) {
  sub->add_option("--shape", a.shape, "M,N,K of the (first) GEMM, e.g. 8192,4096,4096");
  sub->add_option("--dim", a.dims, "bind another symbolic dim, NAME=VALUE (repeatable)")->allow_extra_args(false);
}

// Where the graph is one B2B pair: one kernel or two, and why (choose_b2b, the planner's rule).
std::optional<B2bChoice> pair_choice(const LoweringResult& r, const Bindings& b, const PlanOptions& opt) {
  const B2BCandidate* pair = one_b2b_kernel(r);
  if (!pair) return std::nullopt;
  const FusionSpec &f = r.regions[static_cast<size_t>(pair->first_region)].spec,
                   &e = r.regions[static_cast<size_t>(pair->second_region)].spec;
  return choose_b2b(f, e, b2b_problem_of(f, e, b), opt);
}

// The single-GEMM kernels `explain` and `emit` show: the lowering's regions, or a pair's
// unfused kernels where choose_b2b did not make it one kernel (a gated pair's gated GEMM, or
// its three kernels with --gated-gemm off).
std::vector<FusionSpec> kernel_specs(const LoweringResult& r, const std::optional<B2bChoice>& choice,
                                     const PlanOptions& opt) {
  if (const B2BCandidate* pair = one_b2b_kernel(r); pair && choice && !choice->one_kernel)
    return unfused_pair(r.regions[static_cast<size_t>(pair->first_region)].spec,
                        r.regions[static_cast<size_t>(pair->second_region)].spec, opt)
        .kernels;
  std::vector<FusionSpec> out;
  for (const FusedRegion& region : r.regions) out.push_back(region.spec);
  return out;
}

int cmd_lower(const std::string& file) {
  Graph g = load_graph(file);
  LoweringResult r = lower_and_warn(g, file);
  std::cout << describe(g, r);
  for (size_t i = 0; i < r.regions.size(); ++i) std::cout << "\n# region " << i << "\n" << print(r.regions[i].spec);
  return 0;
}

struct ExplainArgs {
  bool dot = false;
  std::optional<int> cluster_n, tile_n, tile_m, cluster_m, row_group, k_splits, b2b_job_rows, ring_stages, fma_exp_every,
      b2b_x_buffers, consumer_wgs, turn_lead, store_stages;
  std::string b2b_overlap, b2b_x_resident, b2b_chain_jobs, b2b_decode, gated_gemm, poll_pause;  // on / off (empty: the planner's)
  std::string aggregation, strategy, stash, pairs, pair_exp, b2b;
  std::string tile_inputs;  // ring / l2 (empty: the planner's)
  std::string split_k_partials;  // dsmem / l2 (empty: the planner's)
  std::string split_k_gather;    // smem / registers (empty: the planner's)
  std::string gpu;               // h200 / h100 (empty: this machine's GPU, else the H200)
};

// The spellings CLI11 accepts (IsMember below), mapped onto the planner's options.
PlanOptions plan_options(const ExplainArgs& a) {
  PlanOptions o;
  o.cluster_n = a.cluster_n;
  o.tile_n = a.tile_n;
  o.tile_m = a.tile_m;
  o.cluster_m = a.cluster_m;
  o.row_group = a.row_group;
  o.k_splits = a.k_splits;
  o.b2b_job_rows = a.b2b_job_rows;
  o.ring_stages = a.ring_stages;
  o.consumer_wgs = a.consumer_wgs;
  o.turn_lead = a.turn_lead;
  o.store_stages = a.store_stages;
  o.fma_exp_every = a.fma_exp_every;
  o.b2b_x_buffers = a.b2b_x_buffers;
  if (!a.b2b_overlap.empty()) o.b2b_overlap = a.b2b_overlap == "on";
  if (!a.b2b_x_resident.empty()) o.b2b_x_resident = a.b2b_x_resident == "on";
  if (!a.b2b_chain_jobs.empty()) o.b2b_chain_jobs = a.b2b_chain_jobs == "on";
  if (!a.b2b_decode.empty()) o.b2b_decode = a.b2b_decode == "on";
  if (!a.gated_gemm.empty()) o.gated_gemm = a.gated_gemm == "on";
  if (!a.poll_pause.empty()) o.poll_backoff = a.poll_pause == "on";
  if (!a.pairs.empty()) o.fuse_pairs = a.pairs == "one-round";
  if (!a.pair_exp.empty()) o.keep_pair_exp = a.pair_exp == "kept";
  if (!a.tile_inputs.empty()) o.ring_inputs = a.tile_inputs == "ring";
  if (!a.split_k_partials.empty()) o.splits_in_cluster = a.split_k_partials == "dsmem";
  if (!a.split_k_gather.empty()) o.split_gather_in_smem = a.split_k_gather == "smem";
  if (!a.stash.empty()) o.stash_bytes = a.stash == "bf16" ? 2 : 4;
  if (!a.aggregation.empty()) o.aggregation = aggregation_of_word(a.aggregation);
  if (a.b2b == "force") o.b2b = PlanOptions::B2b::Force;
  else if (a.b2b == "off") o.b2b = PlanOptions::B2b::Off;
  if (a.strategy == "on-chip") o.strategy = RowStrategy::OnChip;
  else if (a.strategy == "smem-stash") o.strategy = RowStrategy::SmemStash;
  else if (a.strategy == "workspace-stash") o.strategy = RowStrategy::WorkspaceStash;
  if (!a.gpu.empty()) o.gpu = gpu_named(a.gpu);
  return planned_for_this_device(o);
}

// The whole numbers a numeric option takes: every one from lo to hi, or only those listed. One
// description serves both the check and its message, in plain words with the option's name
// ("--ring-stages: 'abc' is not a whole number from 2 to 16"); CLI11's own checks print
// "Value abc not in range 2 to 16" or the bare value. Runs as a transform: it writes the number
// back in decimal, since CLI11's conversion (strtoll / strtoull, base 0) reads "010" as 8 and
// saturates a seed past 2^64 silently. `takes`: whether n is one of them; `range` says which.
CLI::Validator whole_number_in(std::function<bool(uint64_t)> takes, std::string range, std::string shown) {
  return CLI::Validator(
      [takes = std::move(takes), range = std::move(range)](std::string& v) -> std::string {
        uint64_t n = 0;
        const bool digits = !v.empty() && v.find_first_not_of("0123456789") == std::string::npos;
        const bool fits = digits && std::from_chars(v.data(), v.data() + v.size(), n).ec == std::errc();
        if (!fits || !takes(n)) return fmt::format("'{}' is not {}", printable(v, 64), range);
        v = std::to_string(n);
        return "";
      },
      std::move(shown));
}
CLI::Validator whole_number(uint64_t lo, uint64_t hi) {
  return whole_number_in([lo, hi](uint64_t n) { return lo <= n && n <= hi; },
                         fmt::format("a whole number from {} to {}", lo, hi), fmt::format("{}..{}", lo, hi));
}
CLI::Validator whole_number(std::vector<uint64_t> only) {
  const std::string range = fmt::format("one of {}", fmt::join(only, ", ")), shown = fmt::format("{{{}}}", fmt::join(only, ","));
  return whole_number_in([only](uint64_t n) { return std::find(only.begin(), only.end(), n) != only.end(); }, range,
                         shown);
}
std::vector<uint64_t> powers_of_two_to(uint64_t most) {
  std::vector<uint64_t> v;
  for (uint64_t x = 1; x <= most; x *= 2) v.push_back(x);
  return v;
}

// The plan overrides every planning subcommand takes (debugging, and forcing e.g. the
// aggregation mode to test both). A value outside the listed ones is a usage error (exit 2).
std::vector<CLI::Option*> add_plan_options(CLI::App* cmd, ExplainArgs& ex) {
  return {
      cmd->add_option("--gpu-model", ex.gpu,
                      "plan for this GPU (h200, h100: the planner's measured numbers differ, src/plan/calibration.cpp "
                      "device_model); default: the GPU of this machine, else the H200")
          ->check(CLI::Validator(
              [](std::string& v) { return gpu_named(v) ? std::string() : "not a GPU the planner models (h200, h100): " + v; },
              "h200|h100")),
      cmd->add_option("--cluster-n", ex.cluster_n, "force the cluster size C_N (1, 2, 4, 8, 16)")
          ->transform(whole_number({1, 2, 4, 8, 16})),
      cmd->add_option("--tile-n", ex.tile_n, "force tile_n (64, 128, 192, 256)")->transform(whole_number({64, 128, 192, 256})),
      cmd->add_option("--tile-m", ex.tile_m, "force tile_m, a tile's rows (64, 128): one warp group's on PingPong; 128 x 256 tiles (and gated 128-row "
                      "ones) are cooperative, 64 rows a warp group")->transform(whole_number({64, 128})),
      cmd->add_option("--aggregation", ex.aggregation,
                      "force p2p or leader (DSMEM, one cluster along N) or l2 (row groups exchanging through L2)")
          ->check(CLI::IsMember({std::string(option_word(Aggregation::PeerToPeer)),
                                 std::string(option_word(Aggregation::LeaderFollower)),
                                 std::string(option_word(Aggregation::L2Exchange))})),
      cmd->add_option("--strategy", ex.strategy, "force on-chip, smem-stash or workspace-stash (DSMEM search)")
          ->check(CLI::IsMember({"on-chip", "smem-stash", "workspace-stash"})),
      cmd->add_option("--cluster-m", ex.cluster_m,
                      "clusters of 1 or 2 along M (B multicast): row groups with a reduction (with --cluster-n: a "
                      "2-D DSMEM cluster), else a PingPong elementwise plan")
          ->transform(whole_number({1, 2})),
      cmd->add_option("--b2b-chain-jobs", ex.b2b_chain_jobs,
                      "a B2B online softmax beside GEMM2: each job's first GEMM1 issued with the previous job's last "
                      "GEMM2, X in two buffers (on), or each job alone (off, the default)")
          ->check(CLI::IsMember({"on", "off"})),
      cmd->add_option("--b2b-decode", ex.b2b_decode,
                      "attention at a few query rows a batch: the decode kernel (CUDA cores, keys split over a "
                      "cluster; on) or the wgmma pipeline (off); the planner's default takes the faster estimate")
          ->check(CLI::IsMember({"on", "off"})),
      cmd->add_option("--poll-pause", ex.poll_pause,
                      "row groups meeting in L2: the exchange's polls pause 100 ns between tries (on) or not (off); "
                      "the planner's default pauses where every CTA is in its round at once and a row spans 16 or "
                      "more CTAs")
          ->check(CLI::IsMember({"on", "off"})),
      cmd->add_option("--turn-lead", ex.turn_lead,
                      fmt::format("PingPong jobs of several N-tiles: two jobs' tiles in turn on the tensor "
                                  "cores, consumer 0's first L and consumer 1's last L alone (1..{}), or a job at a "
                                  "time (0); `explain` names the planner's",
                                  Sm90::kMaxNTiles))
          ->transform(whole_number(0, Sm90::kMaxNTiles)),
      cmd->add_option("--gated-gemm", ex.gated_gemm,
                      "a gated pair (SwiGLU) unfused: W1 and W3 in one gated GEMM sharing X's tiles (on, the "
                      "default), or X W3^T stored first and read back by GEMM1's epilogue (off: three kernels)")
          ->check(CLI::IsMember({"on", "off"})),
      cmd->add_option("--row-group", ex.row_group,
                      fmt::format("row groups: G clusters share each row (power of two, 1..{})", Sm90::kMaxRowGroup))
          ->transform(whole_number(powers_of_two_to(Sm90::kMaxRowGroup))),
      cmd->add_option("--k-splits", ex.k_splits,
                      fmt::format("split-K: S clusters share each tile's K (1..{}; 1: none), over row groups (any "
                                  "epilogue)", Sm90::kMaxKSplits))
          ->transform(whole_number(1, Sm90::kMaxKSplits)),
      cmd->add_option("--split-k-partials", ex.split_k_partials,
                      "split-K's partial tiles to the owner: over DSMEM, a tile's K-splits one hardware cluster "
                      "(dsmem; no multicast along M), or through the L2 workspace (l2)")
          ->check(CLI::IsMember({"dsmem", "l2"})),
      cmd->add_option("--split-k-gather", ex.split_k_gather,
                      "split-K through L2: the owner's warp group sums the partial rows (decode rows, or the whole "
                      "tile) in SMEM, their loads in flight together (smem; the default where they fit beside "
                      "the ring; forced, the ring gives up stages for them) or each thread loads its own "
                      "accumulators' partials (registers)")
          ->check(CLI::IsMember({"smem", "registers"})),
      cmd->add_option("--stash", ex.stash, "row groups: stash element, fp32 or bf16")->check(CLI::IsMember({"fp32", "bf16"})),
      cmd->add_option("--pairs", ex.pairs,
                      "paired reductions (LayerNorm's mean and variance, softmax's max and sum of exp) in one-round "
                      "(default where it pays) or two-rounds")
          ->check(CLI::IsMember({"one-round", "two-rounds"})),
      cmd->add_option("--pair-exp", ex.pair_exp,
                      "a softmax pair in one round over one N-tile: keep the exp it sums in the registers, one exp a "
                      "value (kept, the default), or make it again after the round (again)")
          ->check(CLI::IsMember({"kept", "again"})),
      cmd->add_option("--b2b", ex.b2b,
                      "a B2B pair (two chained GEMMs): one kernel where the planner expects it to pay (auto, the "
                      "default), always (force), or never (off: two kernels, S through memory)")
          ->check(CLI::IsMember({"auto", "force", "off"})),
      cmd->add_option("--b2b-job-rows", ex.b2b_job_rows,
                      "a B2B kernel's job rows: 64 (each consumer warp group its own jobs and ring) or 128 (both "
                      "consumer warp groups on one job, sharing its W1/W2 tiles)")
          ->transform(whole_number({64, 128})),
      cmd->add_option("--ring-stages", ex.ring_stages,
                      fmt::format("a single-GEMM or B2B plan: at most this many mainloop ring stages (2..{}; fewer "
                                  "where the epilogue's SMEM leaves less; the planner's own: at most {}, or for a "
                                  "single GEMM's 64x64 tiles of M <= 256 as many as fit)",
                                  Sm90::kMaxRingStages, Sm90::kRingStagesDefault))
          ->transform(whole_number(2, Sm90::kMaxRingStages)),
      cmd->add_option("--store-stages", ex.store_stages,
                      "a single-GEMM plan's TMA-store staging buffers per tile output: 2 (a subtile's store reads "
                      "one while the next is written; the planner's where they fit beside the ring, and forced, "
                      "the ring gives up stages for them) or 1")
          ->transform(whole_number({1, 2})),
      cmd->add_option("--consumer-wgs", ex.consumer_wgs,
                      fmt::format("a single-GEMM plan's consumer warp groups: {} (the default), or {} on PingPong "
                                  "64-row tiles, each its own job in turn, so that their epilogues overlap (fewer "
                                  "registers each: tile_n <= 128)",
                                  Sm90::kConsumerWGs, Sm90::kMaxConsumerWGs))
          ->transform(whole_number(Sm90::kConsumerWGs, Sm90::kMaxConsumerWGs)),
      cmd->add_option("--tile-inputs", ex.tile_inputs,
                      "a single-GEMM plan's [M, N] epilogue inputs (a residual) read by the first stage: loaded by TMA "
                      "into one more mainloop ring slot per tile (ring) or read from L2 by each fragment (l2); default: "
                      "the planner prices both where the kernel can carry them")
          ->check(CLI::IsMember({"ring", "l2"})),
      cmd->add_option("--fma-exp-every", ex.fma_exp_every,
                      "a B2B online softmax: every Nth exponential as a polynomial on the FMA pipe, the rest on the "
                      "MUFU (0: all on the MUFU; default: the planner's, one in 4 with F between the GEMMs unmasked, "
                      "else none)")
          ->transform(whole_number({0, 2, 4, 8, 16})),
      cmd->add_option("--b2b-overlap", ex.b2b_overlap,
                      "a B2B online softmax (attention): X resident and each chunk's F beside the previous chunk's "
                      "GEMM2 (on, the default where K <= 256), or F between the GEMMs (off)")
          ->check(CLI::IsMember({"on", "off"})),
      cmd->add_option("--b2b-x-resident", ex.b2b_x_resident,
                      "a B2B kernel with K <= 256: X resident in SMEM for its job, the ring's slots carrying W1 and "
                      "W2 only (on; the default with the overlap), or X's k-block in every GEMM1 slot (off: no overlap "
                      "either)")
          ->check(CLI::IsMember({"on", "off"})),
      cmd->add_option("--b2b-x-buffers", ex.b2b_x_buffers,
                      "a B2B kernel with X resident: 2 buffers, so the next job's X loads while this job's chunks "
                      "run, at the cost of ring stages (default 1)")
          ->transform(whole_number({1, 2})),
  };
}

int cmd_explain(const std::string& file, const DimArgs& d, const ExplainArgs& a) {
  Graph g = load_graph(file);
  LoweringResult r = lower_and_warn(g, file);
  const Bindings b = bindings(d, g, r);
  const PlanOptions opt = plan_options(a);
  const std::optional<B2bChoice> c = pair_choice(r, b, opt);
  if (c) {  // one B2B kernel, or unfused kernels: which and why
    if (!a.dot) std::cout << "b2b pair: " << c->reason << "\n";
    if (c->one_kernel) {
      const B2BCandidate* pair = one_b2b_kernel(r);
      std::cout << explain(r.regions[static_cast<size_t>(pair->first_region)].spec,
                           r.regions[static_cast<size_t>(pair->second_region)].spec, *c->plan);
      return 0;
    }
    if (!a.dot) std::cout << "\n";
  }
  const std::vector<FusionSpec> specs = kernel_specs(r, c, opt);
  for (size_t i = 0; i < specs.size(); ++i) {
    const FusionSpec& s = specs[i];
    Plan p;
    try {
      p = make_plan(s, problem_of(s, b), opt);
    } catch (const Error& e) {
      throw Error(fmt::format("region {} ({}): {}", i, s.name, e.what()));
    }
    if (a.dot) {
      std::cout << to_dot(s, p);
    } else {
      if (i) std::cout << "\n";
      std::cout << "# region " << i << " (of " << specs.size() << ")\n" << explain(s, p);
    }
  }
  return 0;
}

std::string sample(const Tensor& t, int64_t i) {
  const int64_t c = t.cols();
  if (t.shape.size() == 3) return fmt::format("[{},{},{}]", i / (t.shape[1] * c), i / c % t.shape[1], i % c);
  return t.shape.size() == 2 ? fmt::format("[{},{}]", i / c, i % c) : fmt::format("[{}]", i);
}

// GPU path: one fused kernel, random inputs, NaN-poisoned outputs, compared with the fp64
// graph executor; bf16 outputs pass at rel_l2 <= 1e-2 (the bf16 bound).

int run_gpu(const Graph& g, const Bindings& b, const PlanOptions& plan, uint64_t seed, const std::string& trace_csv) {
  CompileOptions opt;
  opt.plan = plan;
  opt.trace = !trace_csv.empty();
  if (const std::optional<B2bChoice> c = pair_choice(lower(g), b, plan)) std::cout << "b2b pair: " << c->reason << "\n";
  DeviceRunReport rep = run_and_check(g, b, seed, opt, /*timing_reps=*/20, /*input_offset=*/0.0,
                                      /*cublas_baseline=*/true);
  const Plan& p = rep.plan;
  const KernelConfig& kc = p.kernel;
  std::string shape;
  int stages = kc.ring_stages;
  int64_t ctas = p.grid_ctas;
  if (rep.b2b_plan.jobs > 0) {  // a B2B kernel
    const B2bConfig& bc = rep.b2b_plan.kernel;
    shape = bc.decode() ? fmt::format("b2b decode kernel: up to {} query rows a batch, head dim {}, keys over clusters of {}",
                                      bc.decode_rows, bc.tile_n2, bc.cluster_n1)
                        : fmt::format("b2b {} rows x {} of O per warp group, N1 chunks of {}, F {}, GEMM1 x{}", bc.tile_m,
                                      bc.tile_n2, bc.chunk_n1, name_of(rep.b2b_plan.intermediate), rep.b2b_plan.gemm1_passes);
    stages = bc.ring_stages, ctas = rep.b2b_plan.grid_ctas;
  } else {
    shape = fmt::format("{}x{} tile{}, {}, cluster {}x{}", kc.tile_m, kc.tile_n, kc.gated ? " (gated)" : "",
                        kc.schedule(), kc.cluster_m, kc.cluster_n);
    if (kc.row_group > 1) shape += fmt::format(", row group {}", kc.row_group);
    if (kc.k_splits > 1) shape += fmt::format(", split-K {}{}", kc.k_splits, kc.splits_in_cluster ? " in a cluster" : "");
    if (kc.n_tiles > 1)
      shape += fmt::format(", {} N-tiles/CTA ({} {} stash)", kc.n_tiles, kc.stash_elem_bytes == 2 ? "bf16" : "fp32",
                           kc.stash_space == StashSpace::Workspace ? "workspace" : "SMEM");
    if (rep.kernels > 1)
      shape = fmt::format("{} kernels ({}GEMM1 + F storing S, then GEMM2), the first: {}", rep.kernels,
                          rep.kernels > 2 ? "X W3^T stored, " : kc.gated ? "the gated " : "", shape);
  }
  std::cout << fmt::format("kernel: {}, {} ring stages, {} CTAs; JIT {} ({:.2f} s{})\n", shape, stages, ctas,
                           rep.compiled.compiler, rep.compiled.elapsed_seconds, rep.compiled.cache_hit ? ", cache hit" : "");
  bool ok = true;
  for (const auto* checks : {&rep.outputs, &rep.outputs_after_timing})
    for (const OutputCheck& o : *checks) {
      const bool pass = output_passes(o);
      ok = ok && pass;
      std::cout << fmt::format("output {} {}{}: max_abs {:.3g}  max_rel {:.3g}  rel_l2 {:.3g} (tolerance {:.0e})  "
                               "unwritten {}  nonfinite {}{}  {}\n",
                               o.name, name_of(o.dtype), checks == &rep.outputs ? "" : " (after the timed launches)",
                               o.cmp.max_abs, o.cmp.max_rel, o.cmp.rel_l2, gpu_result_tolerance(o.dtype), o.unwritten,
                               o.cmp.nonfinite,
                               o.nonfinite_anywhere != o.cmp.nonfinite
                                   ? fmt::format(" ({} in all rows)", o.nonfinite_anywhere)
                                   : std::string(),
                               pass ? "OK" : "MISMATCH");
    }
  std::cout << fmt::format("time: fused {:.4f} ms ({:.1f} TFLOP/s), cuBLAS GEMM alone {:.4f} ms, fused / cuBLAS = "
                           "{:.3f}x (rounds {:.3f}-{:.3f}; medians of {} alternating rounds of 20 back-to-back launches, "
                           "GPU time; cuBLAS = cublasLt, fastest of its heuristic's candidates; a B2B kernel's: GEMM1 "
                           "and GEMM2 back to back)\n",
                           rep.kernel_ms, rep.tflops, rep.cublas_ms, rep.ratio, rep.ratio_lo, rep.ratio_hi,
                           kTimingRounds);
  if (opt.trace) {
    std::string csv;
    std::cout << (rep.b2b_plan.jobs > 0 ? summarize_b2b_trace(rep.trace, rep.b2b_plan, &csv)
                                        : summarize_trace(rep.trace, p, &csv));
    std::ofstream(trace_csv) << csv;
    std::cout << fmt::format("trace: every stamp in {}\n", trace_csv);
  }
  if (!ok) throw Error("run: GPU result differs from the fp64 reference beyond tolerance");
  return 0;
}

// ptxas's stack frame and spills of a compiled kernel, for `compile`'s line ("spills 0 B": none).
std::string ptxas_usage(const CompiledKernel& c) {
  if (c.spill_bytes < 0) return "ptxas usage not reported";
  return fmt::format("stack {} B, spills {} B", c.stack_bytes, c.spill_bytes);
}

int cmd_emit(const std::string& file, const DimArgs& d, const PlanOptions& plan, bool compile, bool trace = false) {
  CompileOptions opt;
  opt.plan = plan;
  opt.trace = trace;
  Graph g = load_graph(file);
  LoweringResult r = lower_and_warn(g, file);
  const Bindings b = bindings(d, g, r);
  const B2BCandidate* pair = one_b2b_kernel(r);
  const std::optional<B2bChoice> choice = pair_choice(r, b, plan);
  if (choice) std::cout << (compile ? "" : "// ") << "b2b pair: " << choice->reason << "\n";
  if (pair && choice->one_kernel) {  // one B2B kernel for the pair
    const FusionSpec &f = r.regions[static_cast<size_t>(pair->first_region)].spec,
                     &e = r.regions[static_cast<size_t>(pair->second_region)].spec;
    const B2bProblem pr = b2b_problem_of(f, e, b);
    if (!compile) {
      std::cout << emit_b2b(f, e, make_b2b_plan(f, e, pr, plan)).source;
      return 0;
    }
    EmittedKernel k;
    CompiledKernel c = compile_only_b2b(f, e, pr, opt, &k);
    std::cout << fmt::format("b2b pair ({} -> {}): {} cubin {} bytes, {} in {:.2f} s{}, {}, key {}\n", f.name, e.name,
                             k.entry, c.cubin.size(), c.compiler, c.cache_hit ? c.elapsed_seconds : c.compile_seconds,
                             c.cache_hit ? " (cache hit)" : "", ptxas_usage(c), c.key);
    return 0;
  }
  const std::vector<FusionSpec> specs = kernel_specs(r, choice, plan);
  for (size_t i = 0; i < specs.size(); ++i) {
    const FusionSpec& s = specs[i];
    if (!compile) {
      std::cout << emit(s, make_plan(s, problem_of(s, b), plan)).source;
      continue;
    }
    EmittedKernel k;
    CompiledKernel c = compile_only(s, problem_of(s, b), opt, &k);
    std::cout << fmt::format("region {} ({}): {} cubin {} bytes, {} in {:.2f} s{}, {}, key {}\n", i, s.name, k.entry,
                             c.cubin.size(), c.compiler, c.cache_hit ? c.elapsed_seconds : c.compile_seconds,
                             c.cache_hit ? " (cache hit)" : "", ptxas_usage(c), c.key);
  }
  return 0;
}

int cmd_run(const std::string& file, const DimArgs& d, const PlanOptions& plan, bool reference, uint64_t seed,
            const std::string& trace_csv) {
  Graph g = load_graph(file);
  LoweringResult r = lower_and_warn(g, file);
  if (!reference) {
    std::string why;
    if (!gpu_available(&why)) throw Error("run: no usable GPU (" + why + "); use --reference for the CPU check");
    return run_gpu(g, bindings(d, g, r), plan, seed, trace_csv);
  }
  Bindings b = bindings(d, g, r);
  check_sizes(g, b);
  // Every op row-local in M: a few rows check those rows exactly, as the GPU check does.
  const FusionSpec& first = r.regions.at(0).spec;
  std::string rows_note;
  if (row_local(g, first.m.sym)) {
    const int64_t m = b.at(first.m.sym);
    const int64_t batches = first.batched() ? resolve(first.batch, b) : 1;  // the same rows of every batch
    const int64_t rows = static_cast<int64_t>(
        reference_rows(m, resolve(first.n, b), resolve(first.k, b) * batches).size());
    if (rows < m) {
      b[first.m.sym] = rows;
      rows_note = fmt::format(" ({} of {} rows: every op is row-local in {})", rows, m, first.m.sym);
    }
  }
  check_reference_memory(g, b);
  std::mt19937_64 rng(seed);
  TensorMap inputs = random_inputs(g, b, rng);

  std::string dims;
  for (const auto& [k, v] : b) dims += fmt::format("{}{}={}", dims.empty() ? "" : " ", k, v);
  std::cout << fmt::format("{}: {} fused region(s), {} fallback(s); {}{}; seed {}\n", file, r.regions.size(),
                           r.fallbacks.size(), dims, rows_note, seed);
  std::cout << "reference check of the lowering (CPU, fp64 on both sides): run_graph, every node as written, vs "
               "run_lowered, each fused region through its Fusion Spec. No kernel runs: `comfuse run` without "
               "--reference, on a GPU, judges the kernel.\n";
  TensorMap ref = run_graph(g, b, inputs);
  TensorMap low = run_lowered(g, r, b, inputs);
  bool ok = true;
  for (const GraphOutput& out : g.outputs()) {
    auto rt = ref.find(out.name), lt = low.find(out.name);
    if (rt == ref.end() || lt == low.end()) throw Error(fmt::format("run: output '{}' missing from a result", out.name));
    const Tensor &want = rt->second, &got = lt->second;
    if (want.shape != got.shape) throw Error(fmt::format("run: output '{}' has different shapes", out.name));
    const Comparison c = compare(got, want);
    const double tol = reference_tolerance(g, r, out);
    const bool pass = c.nonfinite == 0 && c.rel_l2 <= tol;
    ok = ok && pass;
    std::string shape;
    for (int64_t e : want.shape) shape += fmt::format("{}{}", shape.empty() ? "" : " x ", e);
    std::cout << fmt::format("output {} [{}] {}: max_abs {:.3g}  max_rel {:.3g}  rel_l2 {:.3g} (tolerance {:.0e})  "
                             "nonfinite {}  {}\n",
                             out.name, shape, name_of(out.dtype), c.max_abs, c.max_rel, c.rel_l2, tol, c.nonfinite,
                             pass ? "OK" : "MISMATCH");
    const int64_t n = want.numel();
    std::string line = "  samples (graph | lowered):";
    for (int64_t i : {int64_t{0}, n / 3, 2 * n / 3, n - 1})
      if (i >= 0 && i < n)
        line += fmt::format("  {} {:.6g} | {:.6g}", sample(want, i), want.data[static_cast<size_t>(i)],
                            got.data[static_cast<size_t>(i)]);
    std::cout << line << "\n";
  }
  if (!ok)
    throw Error("run: the lowered result differs from the graph beyond tolerance, or is NaN or inf (nonfinite)");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ComFuse: fuse a GEMM with its epilogue (elementwise, broadcasts, row reductions) into one "
               "Hopper kernel"};
  app.require_subcommand(1);
  std::string file;
  DimArgs dims;
  ExplainArgs ex;
  bool reference = false, gpu = false;
  uint64_t seed = 1;

  CLI::App* lower_cmd = app.add_subcommand("lower", "show fused regions, fallbacks and each Fusion Spec");
  lower_cmd->add_option("file", file, "graph file (.cf)")->required();

  CLI::App* explain_cmd = app.add_subcommand("explain", "plan each region and explain the choices");
  explain_cmd->add_option("file", file, "graph file (.cf)")->required();
  add_dim_options(explain_cmd, dims);
  explain_cmd->add_flag("--dot", ex.dot, "print Graphviz DOT of the stage chain instead of text");
  add_plan_options(explain_cmd, ex);

  CLI::App* emit_cmd = app.add_subcommand("emit", "print the CUDA C++ that backend Psi renders for each region");
  emit_cmd->add_option("file", file, "graph file (.cf)")->required();
  add_dim_options(emit_cmd, dims);
  add_plan_options(emit_cmd, ex);
  CLI::App* compile_cmd = app.add_subcommand("compile", "emit and JIT-compile each region (no GPU needed)");
  compile_cmd->add_option("file", file, "graph file (.cf)")->required();
  add_dim_options(compile_cmd, dims);
  add_plan_options(compile_cmd, ex);
  bool compile_trace = false;
  compile_cmd->add_flag("--trace", compile_trace, "compile the traced build that `run --trace` launches");

  CLI::App* run_cmd = app.add_subcommand("run", "execute on random inputs and check against the reference");
  run_cmd->add_option("file", file, "graph file (.cf)")->required();
  add_dim_options(run_cmd, dims);
  CLI::Option* reference_flag = run_cmd->add_flag(
      "--reference", reference,
      "CPU: check the lowering (the graph executor vs the lowered executor, both fp64); no kernel, no plan options");
  CLI::Option* gpu_flag = run_cmd->add_flag("--gpu", gpu, "GPU: run the fused kernel and check it (the default)");
  run_cmd->add_option("--seed", seed, "random input seed (default 1)")
      ->transform(whole_number(0, std::numeric_limits<uint64_t>::max()));
  std::string trace_csv;
  CLI::Option* trace_opt = run_cmd->add_option(
      "--trace", trace_csv,
      "GPU: build the kernel with its per-job timeline (kernels/comfuse/debug/trace.cuh), print where the time went "
      "and write every stamp to this CSV file");
  // The CPU check runs no kernel: a GPU-only option beside --reference would be ignored.
  reference_flag->excludes(gpu_flag);
  reference_flag->excludes(trace_opt);
  for (CLI::Option* o : add_plan_options(run_cmd, ex)) reference_flag->excludes(o);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // No command found: CLI11 says only "A subcommand is required", even of a misspelt one. The
    // command is the first word (the app takes no option of its own but --help).
    if (e.get_exit_code() != 0 && app.get_subcommands().empty()) {
      std::vector<std::string> names;
      for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) names.push_back(sub->get_name());
      const std::string first = argc > 1 ? printable(argv[1], 64) : "";
      std::cerr << fmt::format("{} (commands: {})\nRun with --help for more information.\n",
                               argc < 2         ? std::string("a command is required")
                               : first[0] == '-' ? fmt::format("'{}' before a command: a command comes first, its "
                                                               "options after it", first)
                                                 : fmt::format("unknown command '{}'", first),
                               fmt::join(names, ", "));
      return 2;
    }
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    if (lower_cmd->parsed()) return cmd_lower(file);
    if (explain_cmd->parsed()) return cmd_explain(file, dims, ex);
    if (emit_cmd->parsed()) return cmd_emit(file, dims, plan_options(ex), /*compile=*/false);
    if (compile_cmd->parsed()) return cmd_emit(file, dims, plan_options(ex), /*compile=*/true, compile_trace);
    if (run_cmd->parsed()) return cmd_run(file, dims, plan_options(ex), reference, seed, trace_csv);
  } catch (const Error& e) {
    std::cout.flush();
    std::cerr << "comfuse: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cout.flush();
    std::cerr << "comfuse: error: internal: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
