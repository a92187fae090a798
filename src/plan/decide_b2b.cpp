// The B2B decider: plans a pair of regions (lower.h's B2BCandidate) as one back-to-back GEMM
// kernel (kernels/comfuse/b2b/), the planner's steps for the second kernel family:
//   check     F (the first region's epilogue) runs per chunk of N1: elementwise, or softmax over
//             all of N1 (online: running max and sum), maybe of causally masked scores (then a
//             job skips the chunks past its rows); GEMM2's epilogue reduces only what one job
//             holds (N2 <= tile_n2); S, X, W1 and W2 are one 16-bit type
//   layout    tile_m 64 rows per consumer warp group; tile_n2 the smallest that covers N2 (one
//             pass of GEMM1), else 256 with GEMM1 repeated per block of O; chunk_n1 128 unless
//             the registers need 64
//   storage   F's and GEMM2's epilogue storage, then the deepest ring that fits (<= 8)
//   launch    jobs (batch x row blocks x O blocks), two consumer warp groups a CTA, one CTA an SM;
//             with a causal mask a CTA's two warp groups take a row block and its mirror
//   estimate  the busiest SM's chunks (the grid's slots walked as the kernel walks them) at the
//             measured per-SM rate and B2B efficiency (MEASURED), against the unfused path (the
//             two GEMMs and S through DRAM)
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "comfuse/scheduler/grid.cuh"
#include "plan_internal.h"

namespace comfuse {

std::string_view name_of(B2bIntermediate f) {
  return f == B2bIntermediate::OnlineSoftmax ? "online softmax over N1" : "elementwise per chunk";
}

B2bProblem b2b_problem_of(const FusionSpec& first, const FusionSpec& second, const Bindings& dims) {
  B2bProblem p;
  p.m = resolve(first.m, dims);
  p.k = resolve(first.k, dims);
  p.n1 = resolve(first.n, dims);
  p.n2 = resolve(second.n, dims);
  // A batched pair (attention over B x H): both GEMMs share the batch (Φ: S is [B, M, N1]).
  if (first.batched() != second.batched() || first.batch != second.batch)
    throw Error(fmt::format("b2b: the two GEMMs are batched differently ({} and {})",
                            first.batched() ? first.batch.str() : "no batch",
                            second.batched() ? second.batch.str() : "no batch"));
  p.batches = first.batched() ? resolve(first.batch, dims) : 1;
  const int a = first.arg_index(ArgRole::OperandA);
  if (a >= 0) p.ab_dtype = first.args[static_cast<size_t>(a)].dtype;
  return p;
}

void check_b2b_problem_size(const B2bProblem& p) {
  check_dim_size("batches", p.batches);
  check_problem_size(p.m, p.n1, p.k, "M", "N1", "K");   // GEMM1: P = X W1^T
  check_problem_size(p.m, p.n2, p.n1, "M", "N2", "N1");  // GEMM2: O = S W2^T
  // The kernel numbers its job slots in 32 bits (scheduler/grid.cuh: up to two per job, plus a
  // grid's stride past the last: kMaxTiles64's margin).
  const double slots = 2.0 * double(p.batches) * double((p.m + 63) / 64) * double((p.n2 + 63) / 64);
  if (slots > double(kMaxTiles64))
    throw Error(fmt::format("b2b: {} batches of {} x {} outputs make {:.0f} jobs of 64 x 64; the kernel numbers them "
                            "in 32 bits (at most {})",
                            p.batches, p.m, p.n2, slots / 2, kMaxTiles64 / 2));
}

std::string plan_detail::causal_mask_in(const Spec& st) {
  for (const SpecNode& n : st.nodes)
    if (n.category == NodeCategory::Compute && n.compute == ComputeKind::CausalMask) return n.origin;
  for (const Spec& c : st.children)
    if (std::string o = causal_mask_in(c); !o.empty()) return o;
  return "";
}

namespace {

using plan_detail::fmt_bytes;

// F = softmax over N1 of a prologue x, as Φ lowers softmax(x) (then maybe a cast) into S: a root
// stage ending in max(x), whose PostOp sums exp(x - max), whose PostOp divides that by the sum
// (or multiplies by its reciprocal) and stores S. Returns why not, or "".
std::string online_softmax_shape(const FusionSpec& f) {
  const Spec& root = f.root;
  const SpecNode& t0 = root.nodes.at(static_cast<size_t>(root.terminal));
  if (t0.category != NodeCategory::Reduction || pair_kind(root, root.terminal) != PairKind::MaxExpSum)
    return "its first reduction is not the max of a softmax (then the sum of exp(x - max))";
  const Spec& s1 = root.children.at(static_cast<size_t>(t0.post));
  const SpecNode& t1 = s1.nodes.at(static_cast<size_t>(s1.terminal));
  if (t1.post < 0) return "the softmax's sum has no stage after it";
  const Spec& s2 = s1.children.at(static_cast<size_t>(t1.post));
  if (!s2.children.empty()) return "a reduction follows the softmax";
  int stores = 0;
  for (const SpecNode& n : s2.nodes) {
    switch (n.category) {
      case NodeCategory::Placeholder: break;
      case NodeCategory::Store: ++stores; break;
      case NodeCategory::Compute:
        if (n.compute == ComputeKind::Cast) break;
        if (n.compute == ComputeKind::Binary && n.binary == BinaryOp::Div) break;
        if (n.compute == ComputeKind::Binary && n.binary == BinaryOp::Mul) break;
        if (n.compute == ComputeKind::Unary && n.unary == UnaryOp::Reciprocal) break;
        return fmt::format("after the softmax's sum F computes {} (only e / sum feeds S)", n.origin);
      default: return fmt::format("after the softmax's sum F has '{}'", n.origin);
    }
  }
  if (stores != 1) return "F stores more than S";
  return "";
}

void check_pair(const FusionSpec& first, const FusionSpec& second, const B2bProblem& p, B2bIntermediate* kind) {
  const int s_arg = second.arg_index(ArgRole::OperandA);
  const RuntimeArg& s = second.args.at(static_cast<size_t>(s_arg));
  const RuntimeArg& w2 = second.args.at(static_cast<size_t>(second.arg_index(ArgRole::OperandB)));
  const RuntimeArg& x = first.args.at(static_cast<size_t>(first.arg_index(ArgRole::OperandA)));
  if (s.dtype != x.dtype || w2.dtype != x.dtype || x.dtype == DType::F32)
    throw Error(fmt::format("b2b: S '{}' ({}), X '{}' ({}) and W2 '{}' ({}) must be one 16-bit type (cast S to {})",
                            s.name, name_of(s.dtype), x.name, name_of(x.dtype), w2.name, name_of(w2.dtype),
                            name_of(x.dtype)));
  if (const int gate = first.arg_index(ArgRole::OperandGate); gate >= 0) {
    const RuntimeArg& w3 = first.args.at(static_cast<size_t>(gate));
    if (w3.dtype != x.dtype)
      throw Error(fmt::format("b2b: the gated GEMM reads W3 '{}' as {} and X '{}' as {}: one 16-bit type", w3.name,
                              name_of(w3.dtype), x.name, name_of(x.dtype)));
  }
  int outputs = 0;
  for (const RuntimeArg& a : first.args)
    if (a.role == ArgRole::Output) {
      ++outputs;
      if (a.name != s.name) throw Error(fmt::format("b2b: the first GEMM's epilogue also stores '{}'", a.name));
    }
  if (outputs != 1) throw Error("b2b: the first GEMM's epilogue must store S and nothing else");
  *kind = B2bIntermediate::Elementwise;
  if (first.reduction_count() > 0) {
    const std::string why = online_softmax_shape(first);
    if (!why.empty())
      throw Error(fmt::format("b2b: F reduces over N1 and {}: a B2B kernel holds one chunk of N1 at a time, so "
                              "only a softmax over N1 runs online (running max and sum)", why));
    *kind = B2bIntermediate::OnlineSoftmax;
  }
  if (second.reduction_count() > 0 && p.n2 > 256)
    throw Error(fmt::format("b2b: GEMM2's epilogue reduces rows of N2 = {} columns; one B2B job holds at most 256",
                            p.n2));
  // TMA rows must be 16 bytes apart: K (X and a K-major W1 are rows of K) and N2 (O and an
  // [N1, N2] W2) always; N1 only where a tensor has rows of N1 elements: W1 given as [K, N1],
  // W2 as [N2, N1], or an [M, N1] input of F. Attention's K [N1, K] and V [N1, N2] have none,
  // so any sequence length runs (the last chunk's columns past N1 are masked).
  if (p.k % 8 != 0 || p.n2 % 8 != 0)
    throw Error(fmt::format("b2b: K = {} and N2 = {} must be multiples of 8 (16-byte TMA rows)", p.k, p.n2));
  if (p.n1 % 8 != 0) {
    std::string rows_of_n1;
    const RuntimeArg& w1 = first.args.at(static_cast<size_t>(first.arg_index(ArgRole::OperandB)));
    if (first.b_layout == BLayout::KN) rows_of_n1 = fmt::format("W1 '{}' is [K, N1]", w1.name);
    else if (second.b_layout == BLayout::NK) rows_of_n1 = fmt::format("W2 '{}' is [N2, N1]", w2.name);
    for (const RuntimeArg& a : first.args)
      if (rows_of_n1.empty() && a.role == ArgRole::TileInput) rows_of_n1 = fmt::format("F reads '{}' [M, N1]", a.name);
    if (!rows_of_n1.empty())
      throw Error(fmt::format("b2b: N1 = {} must be a multiple of 8: {} (rows of N1 elements, 16-byte TMA rows)", p.n1,
                              rows_of_n1));
  }
}

using plan_detail::causal_mask_in;

// Whether node k of `st` is a finite literal (positive, where asked).
bool is_literal(const Spec& st, int k, bool positive) {
  const SpecNode& b = st.nodes.at(static_cast<size_t>(k));
  return b.category == NodeCategory::Broadcast && b.arg < 0 && std::isfinite(b.literal) && (!positive || b.literal > 0.0);
}

// Whether node i of `st` is -inf wherever a causal mask made it -inf: the mask, or the mask
// through ops that keep -inf (a cast, adding or subtracting a finite literal, multiplying or
// dividing by a positive finite one: attention's scale). The online softmax weighs such columns
// exp(-inf) = 0, so a job may skip the chunks that hold nothing else.
bool masked_to_neg_inf(const Spec& st, int i) {
  const SpecNode& n = st.nodes.at(static_cast<size_t>(i));
  if (n.category != NodeCategory::Compute) return false;
  auto literal = [&](int k, bool positive) { return is_literal(st, k, positive); };
  switch (n.compute) {
    case ComputeKind::CausalMask: return true;
    case ComputeKind::Cast: return masked_to_neg_inf(st, n.operands.at(0));
    case ComputeKind::Unary: case ComputeKind::RotateHalf: case ComputeKind::RotatePairs: return false;
    case ComputeKind::Binary: {
      const int a = n.operands.at(0), b = n.operands.at(1);
      // x op literal (either side where op commutes), the literal finite, and positive to scale.
      auto through = [&](bool positive, bool commutes) {
        return (literal(b, positive) && masked_to_neg_inf(st, a)) ||
               (commutes && literal(a, positive) && masked_to_neg_inf(st, b));
      };
      switch (n.binary) {
        case BinaryOp::Add: return through(false, true);
        case BinaryOp::Sub: return through(false, false);
        case BinaryOp::Mul: return through(true, true);
        case BinaryOp::Div: return through(true, false);
        default: return false;
      }
    }
  }
  return false;
}

// The share of GEMM work a causal job walks (b2b_chunks over every row block, scheduler/grid.cuh):
// about half at M = N1, less when M < N1 (top-left aligned: the rows reach only their columns).
double causal_share(const B2bConfig& k, int64_t m, int64_t n1) {
  B2bConfig full = k;
  full.causal = false;
  const int64_t rows = k.job_rows(), blocks = (m + rows - 1) / rows;
  const int64_t all = b2b_chunks(full, 0, static_cast<int>(m), static_cast<int>(n1));
  // Blocks from ceil(N1 / rows) - 1 on reach every column: only the ones before differ.
  const int64_t partial = std::min<int64_t>(blocks, (n1 + rows - 1) / rows);
  int64_t walked = (blocks - partial) * all;
  for (int64_t b = 0; b < partial; ++b)
    walked += b2b_chunks(k, static_cast<int>(b), static_cast<int>(m), static_cast<int>(n1));
  return double(walked) / (double(blocks) * double(all));
}

// The busiest CTA's time in chunks (one chunk of one job: GEMM1 over K and GEMM2 over the chunk,
// at the SM's rate with both consumer warp groups busy), walking the grid's slots as the kernel
// does (b2b_job, scheduler/grid.cuh). Two warp groups share an SM's tensor cores: while both
// run, each goes at half the SM's rate; the one left alone at `single_share` of it (F no longer
// hides behind the other's GEMMs). Per CTA, over its whole run: 2 * short + (long - short) /
// single_share, where short and long are its warp groups' chunk totals.
// With N1 split over clusters (k.cluster_n1 > 1), `ctas` counts clusters and a job's chunks are
// those of its cluster's rank 0 (b2b_rank_chunks: the most any rank walks). Paired, each warp
// group walks every chunk of the CTA's jobs (its half of the rows).
double busiest_cta_chunks(const B2bConfig& k, const B2bProblem& p, int ctas, double single_share) {
  const int batches = static_cast<int>(p.batches), m = static_cast<int>(p.m), n1 = static_cast<int>(p.n1),
            n2 = static_cast<int>(p.n2);
  const int64_t slots = b2b_slot_count(k, batches, m, n2, ctas);
  auto time = [&](double a, double b) { return 2.0 * std::min(a, b) + std::fabs(a - b) / single_share; };
  auto walks = [&](int m_block) { return b2b_rank_chunks(k, b2b_chunks(k, m_block, m, n1), 0); };
  if (!k.causal) {  // every job alike; CTA 0 holds the most slots
    const double chunks = walks(0);
    if (k.paired) {
      const double jobs = double((slots + ctas - 1) / ctas);
      return time(jobs * chunks, jobs * chunks);
    }
    const int64_t round = 2 * int64_t{ctas}, full = slots / round, left = slots % round;
    return time(double(full + (left > 0)) * chunks, double(full + (left > 1)) * chunks);
  }
  if (slots > (int64_t{1} << 22)) {  // thousands of rounds: even per CTA to well under 1%; bound the walk
    B2bConfig full = k;
    full.causal = false;
    const double all = b2b_rank_chunks(k, b2b_chunks(full, 0, m, n1), 0);
    return std::max(causal_share(k, p.m, p.n1) * double(b2b_job_count(k, batches, m, n2)) * k.wgs_per_job() * all / ctas,
                    all / single_share);
  }
  std::vector<double> wg(2 * static_cast<size_t>(ctas), 0.0);
  for (int64_t j = 0; j < slots; ++j) {
    const B2bJob job = b2b_job(k, static_cast<int>(j), batches, m, n2, ctas);
    if (!job.valid) continue;
    if (k.paired) {  // unit j % ctas, both warp groups
      const size_t u = static_cast<size_t>(j % ctas);
      wg[2 * u] += walks(job.m_block);
      wg[2 * u + 1] += walks(job.m_block);
    } else {
      wg[static_cast<size_t>(j % (2 * int64_t{ctas}))] += walks(job.m_block);
    }
  }
  double worst = 0;
  for (size_t c = 0; c < static_cast<size_t>(ctas); ++c) worst = std::max(worst, time(wg[2 * c], wg[2 * c + 1]));
  return worst;
}

// The spec with S's Store removed: what F keeps in SMEM (S itself stays in registers).
FusionSpec without_store_of(FusionSpec f, int s_arg) {
  struct Strip {
    static void stage(Spec& st, int arg) {
      for (SpecNode& n : st.nodes)
        if (n.category == NodeCategory::Store && n.arg == arg) n.category = NodeCategory::Placeholder;
      for (Spec& c : st.children) stage(c, arg);
    }
  };
  Strip::stage(f.root, s_arg);
  return f;
}

// The measured B2B efficiency (calibration.h) at the kernel's ring depth, or with F beside GEMM2.
double b2b_efficiency(const B2bConfig& k, const DeviceModel& dev) {
  if (k.f_beside_gemm2) return dev.b2b_overlap_efficiency;
  return dev.b2b_efficiency_by_stages.at(std::clamp(k.ring_stages, 2, 4));
}

// One warp group's chunk (GEMM1 over K, then GEMM2 over the chunk) on an SM whose two consumer
// warp groups are busy, us: its wgmmas at the measured B2B efficiency, never below an online
// softmax's measured pace.
double wg_chunk_us(const B2bConfig& k, const B2bProblem& p, int gemm1_passes, const DeviceModel& dev) {
  const double flops = 2.0 * k.tile_m * k.chunk_n1 * (double(p.k) * (k.gated ? 2 : 1) + double(p.n2) / gemm1_passes);
  const double f_chunk_us = k.f_beside_gemm2 ? dev.b2b_softmax_beside_gemm2_chunk_us : dev.b2b_softmax_chunk_us;
  const double f = k.online_softmax ? f_chunk_us * k.chunk_n1 / 128.0 : 0.0;
  const double unpaired = k.f_beside_gemm2 && !k.paired ? dev.b2b_overlap_unpaired_chunk_factor : 1.0;
  return unpaired * std::max(flops / (dev.sm_flops_per_s * b2b_efficiency(k, dev)) * 1e6, f);
}

struct SplitCandidate {
  B2bConfig kernel;
  int64_t grid_ctas = 0;
  double busiest = 0, chunk_us = 0, handover_us = 0, fused_us = 0;
  const char* refused = nullptr;  // check()'s reason where this cluster size cannot be built
};

// One way to run the pair: unpaired or paired (base.paired), N1 split over `cluster` CTAs or
// not: the deepest ring beside the partial-O hand-over, the hand-over's pieces as large as the
// SMEM left allows (each piece is a round trip), the grid at the measured cluster residency, and
// the estimate: the busiest CTA's warp-group chunks (wg_chunk_us) plus its jobs' hand-overs.
SplitCandidate price_split(const B2bConfig& base, const B2bProblem& p, int gemm1_passes, int cluster, bool double_x,
                           int max_stages, const DeviceModel& dev) {
  SplitCandidate c;
  c.kernel = base;
  B2bConfig& kc = c.kernel;
  kc.cluster_n1 = cluster;
  for (kc.ring_stages = max_stages; kc.ring_stages > 2 && kc.smem_bytes() > dev.smem_per_cta_bytes; --kc.ring_stages) {
  }
  while (cluster > 1 && kc.xfer_floats < kc.tile_n2 / 2) {
    B2bConfig wider = kc;
    wider.xfer_floats *= 2;
    if (check(wider) || wider.smem_bytes() > dev.smem_per_cta_bytes) break;
    kc = wider;
  }
  if ((c.refused = check(kc))) return c;
  const int batches = static_cast<int>(p.batches), m = static_cast<int>(p.m), n2 = static_cast<int>(p.n2);
  c.grid_ctas = b2b_grid(kc, batches, m, n2, dev.resident(cluster) * cluster);
  const int units = static_cast<int>(c.grid_ctas) / cluster;
  // A second resident X buffer (the next job's X loads during this job's chunks) where a warp
  // group walks more than one job and it costs no ring stage: 2.4% at batched S 1024 d 128, 1% at
  // S 2048 d 64, level at S 4096 (bench/sweeps/attention_x_buffers.txt). Not priced: the chunk
  // model has no term for a job's start.
  if (double_x && kc.x_k_blocks > 0 && kc.x_buffers == 1 &&
      b2b_slot_count(kc, batches, m, n2, units) > int64_t{kc.jobs_per_unit()} * units) {
    B2bConfig two = kc;
    two.x_buffers = 2;
    if (!check(two) && two.smem_bytes() <= dev.smem_per_cta_bytes) kc = two;
  }
  c.busiest = busiest_cta_chunks(kc, p, units, dev.b2b_single_wg_share);
  c.chunk_us = wg_chunk_us(kc, p, gemm1_passes, dev);
  if (cluster > 1) {  // every job of the busiest warp group hands its O over, piece by piece
    const int64_t slots = b2b_slot_count(kc, batches, m, n2, units), round = int64_t{kc.jobs_per_unit()} * units;
    const int64_t turns = (slots + round - 1) / round;
    c.handover_us = double(turns) * kc.xfer_pieces() * (dev.b2b_piece_base_us + dev.b2b_piece_per_follower_us * (cluster - 1));
  }
  c.fused_us = c.busiest * c.chunk_us + c.handover_us;
  return c;
}

// The ways to price: unpaired and paired jobs (or the forced one), each with the cluster sizes:
// the forced one, else the portable ones (8 at most) that leave no CTA without a chunk of a full
// job.
std::vector<SplitCandidate> split_candidates(const B2bConfig& base, const B2bProblem& p, int gemm1_passes,
                                             int job_chunks, const PlanOptions& opt, const DeviceModel& dev) {
  std::vector<SplitCandidate> tried;
  for (bool paired : {false, true}) {
    if (opt.b2b_job_rows && (*opt.b2b_job_rows == 2 * base.tile_m) != paired) continue;
    B2bConfig k = base;
    k.paired = paired;
    for (int cluster : {1, 2, 4, 8, 16}) {
      if (opt.cluster_n && *opt.cluster_n != cluster) continue;
      if (!opt.cluster_n && (cluster > 8 || cluster > job_chunks)) continue;
      tried.push_back(price_split(k, p, gemm1_passes, cluster, !opt.b2b_x_buffers, opt.ring_stages.value_or(Sm90::kRingStagesDefault), dev));
    }
  }
  return tried;
}

}  // namespace

int b2b_intermediate_arg(const FusionSpec& first, const FusionSpec& second) {
  const std::string& s = second.args.at(static_cast<size_t>(second.arg_index(ArgRole::OperandA))).name;
  for (size_t i = 0; i < first.args.size(); ++i)
    if (first.args[i].role == ArgRole::Output && first.args[i].name == s) return static_cast<int>(i);
  throw Error(fmt::format("b2b: '{}' does not store the intermediate '{}'", first.name, s));
}

float b2b_logit_scale(const FusionSpec& first, bool causal) {
  const Spec& st = first.root;
  const SpecNode& max = st.nodes.at(static_cast<size_t>(st.terminal));
  if (max.category != NodeCategory::Reduction) return 0.f;
  return plan_detail::scale_of_scores(st, max.operands.at(0), causal);
}

float plan_detail::scale_of_scores(const Spec& st, int from, bool causal) {
  auto positive_literal = [&](int k) { return is_literal(st, k, true); };
  double scale = 1.0;
  for (int i = from;;) {
    const SpecNode& n = st.nodes.at(static_cast<size_t>(i));
    if (n.category == NodeCategory::AccEntry) {
      const auto f = static_cast<float>(scale);
      return std::isfinite(f) && f > 0.f ? f : 0.f;
    }
    if (n.category != NodeCategory::Compute) return 0.f;
    if (n.compute == ComputeKind::CausalMask && causal) {
      i = n.operands.at(0);
    } else if (n.compute == ComputeKind::Binary && (n.binary == BinaryOp::Mul || n.binary == BinaryOp::Div)) {
      const int a = n.operands.at(0), b = n.operands.at(1);
      if (positive_literal(b)) {
        const double v = st.nodes.at(static_cast<size_t>(b)).literal;
        scale = n.binary == BinaryOp::Mul ? scale * v : scale / v;
        i = a;
      } else if (n.binary == BinaryOp::Mul && positive_literal(a)) {
        scale *= st.nodes.at(static_cast<size_t>(a)).literal;
        i = b;
      } else {
        return 0.f;
      }
    } else {
      return 0.f;
    }
  }
}

FusionSpec b2b_intermediate(const FusionSpec& first, int s_arg, B2bIntermediate kind, float logit_scale) {
  FusionSpec f = first;
  if (kind != B2bIntermediate::OnlineSoftmax) return f;
  SpecNode& t = f.root.nodes.at(static_cast<size_t>(f.root.terminal));
  SpecNode to;
  to.category = NodeCategory::Store;
  to.value_class = ValueClass::Tile;
  // The raw scores where the kernel applies the logits' scale and mask (B2bConfig::logit_scale);
  // the nodes between are left unused.
  int operand = t.operands.at(0);
  if (logit_scale > 0.f)
    for (int i = 0; i < static_cast<int>(f.root.nodes.size()); ++i)
      if (f.root.nodes[static_cast<size_t>(i)].category == NodeCategory::AccEntry) operand = i;
  to.operands = {operand};
  to.arg = s_arg;
  to.origin = first.args.at(static_cast<size_t>(s_arg)).name;
  t = to;
  f.root.children.clear();
  return f;
}

namespace {

// The B2B options a user forced, as a refusal names them (" (forced: --b2b-job-rows 64, ...)").
std::string forced_b2b_options(const PlanOptions& o) {
  std::vector<std::string> f;
  if (o.tile_n) f.push_back(fmt::format("--tile-n {}", *o.tile_n));
  if (o.ring_stages) f.push_back(fmt::format("--ring-stages {}", *o.ring_stages));
  if (o.b2b_job_rows) f.push_back(fmt::format("--b2b-job-rows {}", *o.b2b_job_rows));
  if (o.fma_exp_every) f.push_back(fmt::format("--fma-exp-every {}", *o.fma_exp_every));
  if (o.b2b_overlap) f.push_back(fmt::format("--b2b-overlap {}", *o.b2b_overlap ? "on" : "off"));
  if (o.b2b_x_resident) f.push_back(fmt::format("--b2b-x-resident {}", *o.b2b_x_resident ? "on" : "off"));
  if (o.b2b_x_buffers) f.push_back(fmt::format("--b2b-x-buffers {}", *o.b2b_x_buffers));
  if (o.b2b_chain_jobs) f.push_back(fmt::format("--b2b-chain-jobs {}", *o.b2b_chain_jobs ? "on" : "off"));
  return f.empty() ? std::string() : fmt::format(" (forced: {})", fmt::join(f, ", "));
}

// Forced values outside what any B2B kernel takes, refused by the option's name before planning
// (where they would otherwise surface as a kernel check's reason, or, for the job rows, pick the
// unpaired kernel silently), by check()'s own field limits (config.cuh).
void check_b2b_options(const PlanOptions& o) {
  constexpr int rows = B2bConfig{}.tile_m;  // a consumer warp group's rows
  if (o.b2b_job_rows && *o.b2b_job_rows != rows && *o.b2b_job_rows != 2 * rows)
    throw Error(fmt::format("b2b: --b2b-job-rows {}: a job is {} rows (one consumer warp group) or {} (both, paired)",
                            *o.b2b_job_rows, rows, 2 * rows));
  if (o.tile_n)
    if (const char* why = check_b2b_tile_n2(*o.tile_n)) throw Error(fmt::format("b2b: --tile-n {}: {}", *o.tile_n, why));
  if (o.b2b_x_buffers && *o.b2b_x_buffers != 1 && *o.b2b_x_buffers != 2)
    throw Error(fmt::format("b2b: --b2b-x-buffers {}: a resident X has 1 or 2 buffers", *o.b2b_x_buffers));
  if (o.ring_stages && (*o.ring_stages < 2 || *o.ring_stages > Sm90::kMaxRingStages))
    throw Error(fmt::format("b2b: --ring-stages {}: 2..{} stages", *o.ring_stages, Sm90::kMaxRingStages));
  // As for an online softmax; an elementwise F refuses any but 0 once F is known (make_b2b_plan).
  if (o.fma_exp_every)
    if (const char* why = check_b2b_fma_exp_every(*o.fma_exp_every, /*online_softmax=*/true))
      throw Error(fmt::format("b2b: --fma-exp-every {}: {}", *o.fma_exp_every, why));
}

// One in how many of the online softmax's exponentials runs as a polynomial on the FMA pipe
// (0: all on the MUFU), unless forced. A chunk's 64 exponentials a thread hold the MUFU 512
// cycles a warp, as long as its two GEMMs at a head dim of 64: with F between the GEMMs one in
// four on the FMA pipe measured 4.5% faster there and 1-2% at 128, but 2-4% slower with the
// causal mask (bench/sweeps/attention_softmax_f.txt). With F beside GEMM2 the MUFU's latency
// hides behind the GEMMs and the polynomial's FMAs only add to the warp group's issue: all on
// the MUFU measured 4-5% faster there (batched S 1024 d 128 paired, S 2048 d 64;
// attention_overlap_pairing.txt).
int fma_exp_every_for(const B2bConfig& k, const PlanOptions& opt) {
  return opt.fma_exp_every.value_or(k.causal || k.f_beside_gemm2 ? 0 : 4);
}

}  // namespace

plan_detail::B2bBytes plan_detail::b2b_bytes(const B2bProblem& p, bool gated) {
  const double eb = 2.0, bt = double(p.batches);
  return {eb * bt * p.m * p.k, eb * bt * p.n1 * p.k * (gated ? 2 : 1), eb * bt * p.m * p.n1, eb * bt * p.n1 * p.n2,
          eb * bt * p.m * p.n2};
}

double plan_detail::b2b_roofline_unfused_us(const B2bProblem& p, bool gated, const DeviceModel& dev) {
  const double gemm1 = 2.0 * p.batches * p.m * p.k * p.n1 * (gated ? 2 : 1);
  const double gemm2 = 2.0 * p.batches * p.m * p.n1 * p.n2;
  const double rate = dev.sm_count * dev.sm_flops_per_s;
  const plan_detail::B2bBytes b = plan_detail::b2b_bytes(p, gated);
  const double us_per_byte = 1e6 / dev.dram_bytes_per_s;
  return std::max(gemm1 / rate * 1e6, (b.x + b.w1 + b.s) * us_per_byte) +
         std::max(gemm2 / rate * 1e6, (b.s + b.w2 + b.o) * us_per_byte);
}

namespace {

// The wgmma pipeline's plan (b2b/b2b_gemm_sm90.cuh) of a checked pair whose F is `kind`.
B2bPlan pipeline_plan(const FusionSpec& first, const FusionSpec& second, const B2bProblem& p, const PlanOptions& opt,
                      B2bIntermediate kind, const DeviceModel& dev) {
  B2bPlan plan;
  plan.gpu = dev.gpu;
  plan.problem = p;
  plan.intermediate = kind;

  // Layout.
  B2bConfig& k = plan.kernel;
  k.w1_kmajor = first.b_layout == BLayout::NK;
  k.w2_kmajor = second.b_layout == BLayout::NK;
  k.gated = first.arg_index(ArgRole::OperandGate) >= 0;
  // The spec's batch (a batched graph binds 3-D tensors even at one batch), or a count asked for.
  k.batched = first.batched() || p.batches > 1;
  k.online_softmax = plan.intermediate == B2bIntermediate::OnlineSoftmax;
  // A causal mask in F (attention's masked scores): the kernel skips a job's chunks past its rows
  // with the online softmax only (check(): -inf weighs 0 there; elementwise F would read it).
  const std::string mask = causal_mask_in(first.root);
  if (!mask.empty() && !k.online_softmax)
    throw Error(fmt::format("b2b: F applies the causal mask {} but is not a softmax over N1 ({}): a B2B kernel takes a "
                            "causal mask with the online softmax only, which weighs the masked columns 0 and skips "
                            "the chunks past a job's rows",
                            first.describe(mask), name_of(plan.intermediate)));
  if (!mask.empty()) {
    const SpecNode& max = first.root.nodes.at(static_cast<size_t>(first.root.terminal));  // the softmax's max
    k.causal = masked_to_neg_inf(first.root, max.operands.at(0));
  }
  if (k.online_softmax) {
    k.logit_scale = b2b_logit_scale(first, k.causal);
  } else if (opt.b2b_overlap.value_or(false)) {
    throw Error(fmt::format("b2b: --b2b-overlap on runs an online softmax's F beside GEMM2; this pair's F is {}",
                            name_of(plan.intermediate)));
  }
  // F beside the previous chunk's GEMM2 (FlashAttention-3's overlap: the exponentials written in
  // place into GEMM1's accumulator between its wait and GEMM2's) needs X resident, so K <= 256.
  // Taken wherever it fits: 8-13% faster at head dim 128, 0-8% at 64, 3% with the causal mask
  // (bench/sweeps/attention_overlap.txt). X resident without it, forced only: -3% to +9%.
  const int x_k_blocks = ceil_div(static_cast<int>(p.k), Sm90::kTileK);
  const bool x_fits = x_k_blocks <= B2bConfig::kMaxXKBlocks;
  k.f_beside_gemm2 =
      k.online_softmax && opt.b2b_overlap.value_or(x_fits && opt.b2b_x_resident.value_or(true));
  if (opt.b2b_x_resident.value_or(k.f_beside_gemm2)) {
    if (!x_fits)
      throw Error(fmt::format("b2b: {} keeps X resident, for K <= {} only (K = {})",
                              k.f_beside_gemm2 ? "--b2b-overlap on" : "--b2b-x-resident on",
                              B2bConfig::kMaxXKBlocks * Sm90::kTileK, p.k));
    k.x_k_blocks = x_k_blocks;
  } else if (k.f_beside_gemm2) {
    throw Error("b2b: --b2b-overlap on runs F beside GEMM2 with X resident: not with --b2b-x-resident off");
  }
  if (opt.b2b_x_buffers) {
    if (*opt.b2b_x_buffers == 2 && k.x_k_blocks == 0)
      throw Error(fmt::format("b2b: --b2b-x-buffers 2 double-buffers a resident X, and this plan keeps X in the ring's "
                              "slots (X resident needs K <= {}, here {}; --b2b-overlap off without --b2b-x-resident on "
                              "keeps it there)",
                              B2bConfig::kMaxXKBlocks * Sm90::kTileK, p.k));
    k.x_buffers = *opt.b2b_x_buffers;
  }
  if (opt.b2b_chain_jobs.value_or(false)) {
    if (!k.f_beside_gemm2)
      throw Error("b2b: --b2b-chain-jobs on chains jobs of F beside GEMM2 (attention's online softmax, K <= 256, "
                  "--b2b-overlap not off)");
    if (opt.b2b_x_buffers.value_or(2) != 2)
      throw Error("b2b: --b2b-chain-jobs on loads the next job's X during this one: two X buffers, not --b2b-x-buffers 1");
    if (second.arg_index(ArgRole::TileInput) >= 0)
      throw Error(fmt::format("b2b: --b2b-chain-jobs on runs a job's epilogue after the next job started, and GEMM2's "
                              "epilogue reads the tile input '{}' (its prefetch would overwrite the previous job's)",
                              second.args.at(static_cast<size_t>(second.arg_index(ArgRole::TileInput))).name));
    if (opt.cluster_n.value_or(1) != 1)
      throw Error(fmt::format("b2b: --b2b-chain-jobs on takes one CTA per job, not N1 over clusters of {}",
                              *opt.cluster_n));
    k.x_buffers = 2;
    k.chain_jobs = true;
  }
  if (k.online_softmax) {
    k.fma_exp_every = fma_exp_every_for(k, opt);
  } else if (opt.fma_exp_every.value_or(0) != 0) {
    throw Error(fmt::format("b2b: --fma-exp-every {} places an online softmax's exponentials; this pair's F is {}",
                            *opt.fma_exp_every, name_of(plan.intermediate)));
  }
  k.tile_n2 = p.n2 <= 64 ? 64 : p.n2 <= 128 ? 128 : p.n2 <= 192 ? 192 : 256;
  if (opt.tile_n) k.tile_n2 = *opt.tile_n;
  k.chunk_n1 = 128;
  if (k.live_values() > B2bConfig::kMaxLiveValues) k.chunk_n1 = 64;
  if (k.online_softmax && k.chunk_n1 == 128 && k.tile_n2 > 128) k.chunk_n1 = 64;
  // A gated GEMM1 holds two accumulators (P and P3): O's block narrows to what still fits.
  while (!opt.tile_n && k.tile_n2 > 64 && k.live_values() > B2bConfig::kMaxLiveValues) k.tile_n2 -= 64;
  plan.gemm1_passes = static_cast<int>((p.n2 + k.tile_n2 - 1) / k.tile_n2);
  if (second.reduction_count() > 0 && p.n2 > k.tile_n2)
    throw Error(fmt::format("b2b: GEMM2's epilogue reduces rows of N2 = {} columns; one job of this pair holds {} "
                            "(a gated GEMM1's two accumulators leave O fewer registers)",
                            p.n2, k.tile_n2));

  // Storage: F's and GEMM2's epilogue storage, then the ring.
  const int s_arg = b2b_intermediate_arg(first, second);
  const plan_detail::ChainInfo f_chain =
      plan_detail::analyze_chain(without_store_of(b2b_intermediate(first, s_arg, plan.intermediate, k.logit_scale), s_arg));
  const plan_detail::ChainInfo e_chain = plan_detail::analyze_chain(second);
  KernelConfig fk, ek;  // the epilogue model's view of each: rows, tile width, no exchange
  fk.tile_m = ek.tile_m = k.tile_m;
  fk.tile_n = k.chunk_n1, ek.tile_n = k.tile_n2;
  fk.row_reduction = false, ek.row_reduction = second.reduction_count() > 0;
  const int f_bytes = plan_detail::epilogue_smem_bytes(f_chain, fk);
  const int e_bytes = plan_detail::epilogue_smem_bytes(e_chain, ek);
  k.epilogue_smem_bytes = align_up(f_bytes, 1024) + align_up(e_bytes, 1024);

  // N1 split, launch and estimate: each cluster size priced (price_split), the fastest taken,
  // against the unfused path (below). A causal mask leaves the fused kernel the chunks that
  // reach each job's rows (about half the GEMM work at M = N1), which the mirror pairs spread
  // evenly over the SMs; the unfused kernels compute every column and mask afterwards.
  const plan_detail::B2bBytes bytes = plan_detail::b2b_bytes(p, k.gated);
  plan.unfused_us = plan_detail::b2b_roofline_unfused_us(p, k.gated, dev);
  plan.dram_floor_us = (bytes.x + bytes.w1 + bytes.w2 + bytes.o) * 1e6 / dev.dram_bytes_per_s;
  // Where the unfused path exists (no batch), it is priced as the planner plans its kernels
  // (unfused_pair: a gated GEMM1's X W3^T stored; GEMM1 with F storing S, a softmax over N1 a row
  // reduction over many N-tiles; GEMM2 with its epilogue), the roofline above where one cannot be
  // planned.
  plan.unfused_from = "GEMM1 and GEMM2 each at the measured rate or its DRAM traffic, S written and read back";
  if (!k.batched) {
    try {
      const UnfusedPair parts = unfused_pair(first, second, opt);
      double total = 0;
      std::string each;
      for (size_t i = 0; i < parts.kernels.size(); ++i) {
        const bool last = i + 1 == parts.kernels.size();
        PlanOptions on;  // the unfused kernels as build_unfused plans them: unforced, on the same GPU
        on.gpu = opt.gpu;
        const Plan one = make_plan(parts.kernels[i], last ? Problem{p.m, p.n2, p.n1, p.ab_dtype}
                                                          : Problem{p.m, p.n1, p.k, p.ab_dtype}, on);
        total += one.estimate.total_us;
        each += fmt::format("{}{} {:.1f} us", i ? ", " : "",
                            last ? "GEMM2 + its epilogue"
                                 : i + 2 == parts.kernels.size() ? "GEMM1 + F storing S"
                                                                 : fmt::format("{} stored", parts.intermediates[i].name),
                            one.estimate.total_us);
      }
      plan.unfused_us = total;
      plan.unfused_from = fmt::format("the planner's {} kernels: {}", parts.kernels.size() == 2 ? "two" : "three", each);
    } catch (const Error&) {  // a kernel the single-GEMM planner refuses: the roofline stands
    }
  }
  B2bConfig unsplit = k;
  unsplit.causal = false;
  const int job_chunks = b2b_chunks(unsplit, 0, static_cast<int>(p.m), static_cast<int>(p.n1));
  std::vector<SplitCandidate> tried = split_candidates(k, p, plan.gemm1_passes, job_chunks, opt, dev);
  auto fastest = [&] {
    const SplitCandidate* best = nullptr;
    for (const SplitCandidate& c : tried)
      if (!c.refused && (!best || c.fused_us < best->fused_us * 0.97)) best = &c;  // pairing, a larger cluster: by 3%
    return best;
  };
  const SplitCandidate* best = fastest();
  std::string overlap_dropped;
  if (!best && k.f_beside_gemm2 && !opt.b2b_overlap.value_or(false) && !opt.b2b_x_resident.value_or(false) &&
      opt.b2b_x_buffers.value_or(1) == 1 && !opt.b2b_chain_jobs.value_or(false)) {
    // The overlap by default (nothing forced that needs it), where its resident Q and the two
    // chunks' slots in flight leave no ring (a head dim of 256 with 256 columns of O: 32 KiB
    // slots): F between the GEMMs, Q in the ring's slots, as with --b2b-overlap off.
    overlap_dropped = tried.empty() ? "no cluster size" : tried.front().refused;
    k.f_beside_gemm2 = false, k.x_k_blocks = 0, k.x_buffers = 1;
    k.fma_exp_every = fma_exp_every_for(k, opt);
    tried = split_candidates(k, p, plan.gemm1_passes, job_chunks, opt, dev);
    best = fastest();
  }
  if (!best) {
    if (opt.cluster_n && !tried.empty() && tried.front().refused)
      throw Error(fmt::format("b2b: --cluster-n {} (CTAs splitting N1): {}", *opt.cluster_n, tried.front().refused));
    if (opt.cluster_n) throw Error(fmt::format("b2b: --cluster-n {}: CTAs along N1 are 1, 2, 4, 8 or 16", *opt.cluster_n));
    throw Error(fmt::format("b2b: no kernel fits: {}{}", tried.empty() ? "no cluster size" : tried.front().refused,
                            forced_b2b_options(opt)));
  }
  k = best->kernel;
  plan.jobs = int64_t{b2b_job_count(k, static_cast<int>(p.batches), static_cast<int>(p.m), static_cast<int>(p.n2))};
  const double causal = k.causal ? causal_share(k, p.m, p.n1) : 1.0;
  plan.grid_ctas = best->grid_ctas;
  plan.fused_us = std::max(best->fused_us, plan.dram_floor_us);
  const double busiest = best->busiest;
  const double efficiency = b2b_efficiency(k, dev);
  auto jobs_of = [](const B2bConfig& c) { return fmt::format("{}jobs of {} rows", c.paired ? "paired " : "", c.job_rows()); };
  for (const SplitCandidate& c : tried)
    if (&c != best)
      plan.alternatives.push_back(
          c.refused ? fmt::format("{}, N1 over clusters of {}: refused ({})", jobs_of(c.kernel), c.kernel.cluster_n1,
                                  c.refused)
                    : fmt::format("{}, N1 over clusters of {}: {:.1f} us ({} ring stages, {} CTAs, busiest SM {:.0f} "
                                  "warp-group chunks of {:.2f} us, hand-overs {:.1f} us)",
                                  jobs_of(c.kernel), c.kernel.cluster_n1, c.fused_us, c.kernel.ring_stages, c.grid_ctas,
                                  c.busiest, c.chunk_us, c.handover_us));
  // The work the grid's SMs do on average, in the busiest one's time: 1 = perfectly even.
  const double walked = causal * double(plan.jobs) * k.wgs_per_job() * job_chunks;
  const double balance = walked / (busiest * double(plan.grid_ctas));

  auto& r = plan.reasons;
  if (!overlap_dropped.empty())
    r.push_back(fmt::format("F between the GEMMs, X in the ring's slots: with X resident and F beside GEMM2 no kernel "
                            "fits ({})",
                            overlap_dropped));
  r.push_back(fmt::format("F: {} (chunks of {} columns of N1 = {}){}{}{}", name_of(plan.intermediate), k.chunk_n1, p.n1,
                          k.logit_scale > 0.f
                              ? fmt::format("; of the raw scores times {:g}: the scale rides in the exponent's FFMA{}",
                                            k.logit_scale,
                                            k.causal ? ", the causal mask applies in the chunks that cross the diagonal only"
                                                     : "")
                              : std::string(),
                          k.fma_exp_every > 0
                              ? fmt::format("; one exponential in {} as a polynomial on the FMA pipe, the rest on the "
                                            "MUFU (measured; --fma-exp-every)",
                                            k.fma_exp_every)
                              : std::string(),
                          k.f_beside_gemm2
                              ? fmt::format("; X resident ({} k-blocks{}), each chunk's F beside the previous chunk's "
                                            "GEMM2 (--b2b-overlap)",
                                            k.x_k_blocks, k.x_buffers > 1 ? ", 2 buffers" : "")
                              : std::string()));
  r.push_back(fmt::format("jobs: {} rows x {} columns of O {}; {} job(s) ({} batch(es) x {} row blocks x {} block(s) "
                          "of O) on {} CTAs (two consumer warp groups each); the busiest SM walks {:.0f} warp-group "
                          "chunks, the SMs' average is {:.0f}% of that",
                          k.job_rows(), k.tile_n2,
                          k.paired ? "shared by both consumer warp groups (64 rows each)" : "per consumer warp group",
                          plan.jobs, p.batches, (p.m + k.job_rows() - 1) / k.job_rows(), (p.n2 + k.tile_n2 - 1) / k.tile_n2,
                          plan.grid_ctas, busiest, balance * 100));
  {
    const int turn_blocks = k.turn_k_blocks(static_cast<int>(p.k));
    const SplitCandidate* other = nullptr;  // the best of the other job shape, for the reason
    for (const SplitCandidate& c : tried)
      if (!c.refused && c.kernel.paired != k.paired && (!other || c.fused_us < other->fused_us)) other = &c;
    r.push_back(fmt::format(
        "{}: a warp-group chunk {:.2f} us (wgmmas at {:.0f}% of the SM's rate with {} ring stages, measured; the "
        "ring loads {} from L2 a chunk{}){}",
        k.paired ? fmt::format("paired: both consumer warp groups read each W1/W2 k-block of one ring; {}",
                               k.ordered_turns(static_cast<int>(p.k))
                                   ? fmt::format("ordered tensor-core turns (a turn's {} k-blocks fit the {} stages)",
                                                 turn_blocks, k.ring_stages)
                                   : fmt::format("unordered (a turn's {} k-blocks exceed the {} stages)", turn_blocks,
                                                 k.ring_stages))
                 : std::string("unpaired: each consumer warp group its own jobs and ring"),
        best->chunk_us, efficiency * 100, k.ring_stages,
        fmt_bytes(static_cast<int64_t>(k.chunk_fill_bytes(static_cast<int>(p.k)))), k.paired ? ", half of it each" : "",
        other ? fmt::format(" against {:.2f} us {}", other->chunk_us, other->kernel.paired ? "paired" : "unpaired")
              : std::string()));
  }
  r.push_back(plan.gemm1_passes == 1
                  ? fmt::format("GEMM1 runs once: one job holds all N2 = {} columns of O", p.n2)
                  : fmt::format("GEMM1 runs {} times: O's N2 = {} columns need {} blocks of {} (its registers "
                                "hold at most {} columns a warp group{}), and each block rebuilds S",
                                plan.gemm1_passes, p.n2, plan.gemm1_passes, k.tile_n2, k.gated ? 192 : 256,
                                k.gated ? " beside the gated GEMM1's two accumulators" : ""));
  r.push_back(k.cluster_n1 > 1
                  ? fmt::format("N1 split over clusters of {} CTAs (the partition along N1): rank r walks chunks r, "
                                "r + {}, ... of each of the cluster's jobs; the job's owner (the CTAs take turns) sums the {} partial O "
                                "over DSMEM in rank order ({} pieces of {} fp32 a thread, ~{:.1f} us a job, measured) "
                                "and runs GEMM2's epilogue",
                                k.cluster_n1, k.cluster_n1, k.cluster_n1, k.xfer_pieces(), k.xfer_floats,
                                k.xfer_pieces() * (dev.b2b_piece_base_us + dev.b2b_piece_per_follower_us * (k.cluster_n1 - 1)))
                  : fmt::format("N1 not split: each CTA walks all {} chunks of its jobs{}", job_chunks,
                                opt.cluster_n ? " (forced)"
                                : job_chunks < 2 ? " (one chunk: nothing to split)"
                                                 : " (clusters along N1 do not beat it by 3%: the alternatives)"));
  r.push_back(fmt::format("registers per consumer thread: P {} (x{}), S {}, O {} fp32 / 16-bit pairs", k.chunk_n1 / 2,
                          k.gated ? 2 : 1, k.chunk_n1 / 4, k.tile_n2 / 2));
  r.push_back(fmt::format("ring: {} stages of {} {} ({}a {}-row B region that holds W1{}'s k-block or a W2 k-block){}; "
                          "SMEM {} of {}",
                          k.ring_stages, fmt_bytes(k.slot_a_bytes() + k.slot_b_bytes()),
                          k.paired ? "shared by both consumer warp groups" : "per consumer warp group",
                          k.x_k_blocks > 0 ? "" : fmt::format("an X k-block of {} rows and ", k.job_rows()),
                          k.b_region_rows(), k.gated ? " and W3" : "",
                          k.x_k_blocks > 0 ? fmt::format(", beside X's {} k-blocks of {} rows, resident for the job{}",
                                                         k.x_k_blocks, k.job_rows(),
                                                         k.x_buffers > 1 ? " (two buffers: the next job's X loads during "
                                                                           "this one's chunks; --b2b-x-buffers)"
                                                                         : "")
                                           : std::string(),
                          fmt_bytes(k.smem_bytes()), fmt_bytes(dev.smem_per_cta_bytes)));
  if (k.causal)
    r.push_back(fmt::format("causal mask {}: a job walks only the chunks of N1 that reach its rows ({:.0f}% of the "
                            "GEMM work); a CTA takes a row block and its mirror (i and {} - i: {}), so every SM "
                            "walks about as much",
                            first.describe(mask), causal * 100, (p.m + k.job_rows() - 1) / k.job_rows() - 1,
                            k.paired ? "in two consecutive rounds" : "its two warp groups at once"));
  else if (!mask.empty())
    r.push_back(fmt::format("causal mask {}: the softmax's input is not the mask (or the mask through a cast, a finite "
                            "shift or a positive scale), so masked columns need not weigh 0: every job walks all of N1",
                            first.describe(mask)));
  r.push_back(fmt::format("estimate {:.1f} us fused ({:.0f}% of the per-SM rate on {} of {} SMs, measured; its DRAM "
                          "floor {:.1f} us) against {:.1f} us unfused ({}){}",
                          plan.fused_us, efficiency * 100, std::min<int64_t>(plan.grid_ctas, dev.sm_count), dev.sm_count,
                          plan.dram_floor_us, plan.unfused_us, plan.unfused_from,
                          plan.fused_us > plan.unfused_us ? ": fusion is NOT expected to pay at this shape" : ""));
  return plan;
}

}  // namespace

B2bPlan make_b2b_plan(const FusionSpec& first, const FusionSpec& second, const B2bProblem& p, const PlanOptions& opt) {
  check_b2b_problem_size(p);
  check_b2b_options(opt);
  try {
    check_compile_size(first);
    check_compile_size(second);
  } catch (const Error& e) {
    throw Error(fmt::format("b2b: {}", e.what()));
  }
  B2bIntermediate kind = B2bIntermediate::Elementwise;
  check_pair(first, second, p, &kind);
  // The B2B family's own numbers were measured on the H200 only; the H100's model (calibration.h
  // device_model) changes its DRAM here and the single-GEMM plans of its two-kernel path.
  const DeviceModel dev = device_model(opt.gpu);
  // The decode kernel where the pair is attention it runs (a few query rows a batch) and nothing
  // of the wgmma pipeline is forced: the faster estimate of the two, the other an alternative.
  const std::string forced = forced_b2b_options(opt);
  plan_detail::DecodeForm form;
  if (opt.b2b_decode.value_or(true)) form = plan_detail::decode_form(first, second, p, kind);
  if (opt.b2b_decode.value_or(false)) {
    if (!form.refused.empty()) throw Error(fmt::format("b2b: --b2b-decode on: {}", form.refused));
    if (!forced.empty()) throw Error(fmt::format("b2b: --b2b-decode on runs no wgmma pipeline{}", forced));
  }
  if (!opt.b2b_decode.value_or(forced.empty()) || !form.refused.empty())
    return pipeline_plan(first, second, p, opt, kind, dev);
  B2bPlan dec = plan_detail::decode_plan(first, p, form, opt, dev);
  if (opt.b2b_decode.value_or(false)) {
    dec.alternatives.push_back("the wgmma pipeline: not priced (--b2b-decode on)");
    return dec;
  }
  B2bPlan pipe;
  try {
    pipe = pipeline_plan(first, second, p, opt, kind, dev);
  } catch (const Error& e) {
    dec.alternatives.push_back(fmt::format("the wgmma pipeline: refused ({})", e.what()));
    return dec;
  }
  // The pipeline's estimate misses a few-row job's fixed path (calibration.h): weighed with it.
  const B2bConfig& pk = pipe.kernel;
  const double pipe_us = pipe.fused_us + dev.pipeline_few_rows_us;
  const std::string pipe_line = fmt::format(
      "the wgmma pipeline: {:.1f} us with the {:.1f} us its few-row jobs measured above its model ({}jobs of {} rows, N1 "
      "over clusters of {}, {} CTAs; --b2b-decode off)",
      pipe_us, dev.pipeline_few_rows_us, pk.paired ? "paired " : "", pk.job_rows(), pk.cluster_n1, pipe.grid_ctas);
  if (dec.fused_us <= pipe_us) {
    dec.alternatives.push_back(pipe_line);
    return dec;
  }
  pipe.alternatives.push_back(fmt::format("the decode kernel: {:.1f} us against this plan's {:.1f} with the {:.1f} us "
                                          "its few-row jobs measured above its model ({} CTAs in clusters of {}; "
                                          "--b2b-decode on)",
                                          dec.fused_us, pipe_us, dev.pipeline_few_rows_us, dec.grid_ctas,
                                          dec.kernel.cluster_n1));
  return pipe;
}

B2bChoice choose_b2b(const FusionSpec& first, const FusionSpec& second, const B2bProblem& p, const PlanOptions& opt) {
  using Mode = PlanOptions::B2b;
  // A batched pair has no unfused path (the single-GEMM kernels take no batch dim).
  const char* one_only =
      first.batched() ? "a batched pair has no unfused path (the single-GEMM kernels take no batch dim)" : nullptr;
  // A gated pair unfused: one gated GEMM1 (W1 and W3 sharing X's tiles), or X W3^T stored first
  // (unfused_pair says which).
  const bool split_gate = !one_only && unfused_pair(first, second, opt).kernels.size() == 3;
  const char* kernels = split_gate ? "three kernels" : "two kernels";
  const char* how = split_gate       ? "X W3^T stored, GEMM1 and F store S, GEMM2 reads it"
                    : first.gated() ? "the gated GEMM1 (W1 and W3 share X's tiles) and F store S, GEMM2 reads it"
                                    : "GEMM1 and F store S, GEMM2 reads it";
  B2bChoice c;
  if (opt.b2b == Mode::Off) {
    if (one_only)
      throw Error(fmt::format("b2b off: {}; run it as one B2B kernel (--b2b auto or force)", one_only));
    c.reason = fmt::format("{} (b2b off): {}", kernels, how);
    return c;
  }
  try {
    c.plan = make_b2b_plan(first, second, p, opt);
  } catch (const Error& e) {
    if (opt.b2b == Mode::Force || one_only) throw;
    c.reason = fmt::format("{}: the pair cannot be one B2B kernel ({}); {}", kernels, e.what(), how);
    return c;
  }
  const std::string estimate =
      fmt::format("estimate {:.1f} us as one kernel, {:.1f} us as {}", c.plan->fused_us, c.plan->unfused_us,
                  split_gate ? "three" : "two");
  const bool pays = c.plan->fused_us <= c.plan->unfused_us;
  c.one_kernel = opt.b2b == Mode::Force || pays || one_only;
  c.reason = opt.b2b == Mode::Force ? fmt::format("one B2B kernel (b2b force; {})", estimate)
             : pays                 ? fmt::format("one B2B kernel: {}", estimate)
             : one_only ? fmt::format("one B2B kernel although it is not expected to pay ({}): {}", estimate, one_only)
                     : fmt::format("{}: the B2B kernel is not expected to pay ({}); {} (--b2b force builds the pair)",
                                   kernels, estimate, how);
  return c;
}

std::string explain(const FusionSpec& first, const FusionSpec& second, const B2bPlan& p) {
  const B2bConfig& k = p.kernel;
  if (k.decode()) return plan_detail::explain_decode(first, second, p);
  std::string o = fmt::format("b2b plan for '{}' -> '{}' (one kernel, S in registers)\n", first.name, second.name);
  o += fmt::format("  problem      M={} K={} N1={} N2={}{}, {} {}\n", p.problem.m, p.problem.k, p.problem.n1, p.problem.n2,
                   p.problem.batches > 1 ? fmt::format(" x {} batches", p.problem.batches) : "",
                   name_of(p.problem.ab_dtype), k.gated ? "(gated: X W1^T and X W3^T)" : "");
  o += fmt::format("  gpu          {}\n", name_of(p.gpu));
  o += fmt::format("  tiles        {} rows x {} of O per job ({}), N1 in chunks of {}\n", k.job_rows(), k.tile_n2,
                   k.paired ? "paired: both consumer warp groups, 64 rows each" : "one consumer warp group",
                   k.chunk_n1);
  o += fmt::format("  pipeline     ML1 (GEMM1, SS wgmma) -> Epi1 (F: {}) -> ML2 (GEMM2, RS wgmma: S from "
                   "registers) per chunk{}, Epi2 after the last; {}\n",
                   name_of(p.intermediate),
                   k.f_beside_gemm2 ? (k.chain_jobs ? " (ML1 of chunk c issued with ML2 of c - 1, Epi1 of c beside that ML2; jobs "
                                                   "chained: a job's first ML1 with the previous job's last ML2, its Epi2 "
                                                   "after that; --b2b-chain-jobs)"
                                                 : " (ML1 of chunk c issued with ML2 of c - 1, Epi1 of c beside that ML2)")
                                   : "",
                   k.paired ? "two consumer warp groups on the same jobs, taking turns on the tensor cores"
                            : "two consumer warp groups on their own jobs");
  o += fmt::format("  ring         {} stages {}, {}\n", k.ring_stages,
                   k.paired ? "shared by both consumer warp groups" : "per consumer warp group",
                   k.x_k_blocks > 0 ? "W1 and W2 k-blocks in the same slots, X resident beside them"
                                    : "X/W1 and W2 k-blocks in the same slots");
  o += fmt::format("  N1 split     {}\n", k.cluster_n1 > 1
                                             ? fmt::format("over clusters of {} CTAs (rank r walks chunks r, r + {}, ... of a "
                                                           "job; partial O summed over DSMEM into the job's owner)",
                                                           k.cluster_n1, k.cluster_n1)
                                             : std::string("none (one CTA walks all of a job's N1)"));
  o += fmt::format("  grid         {} CTAs, {} jobs\n", p.grid_ctas, p.jobs);
  o += fmt::format("  SMEM         {} (rings {}, epilogues {}{})\n", fmt_bytes(k.smem_bytes()),
                   fmt_bytes(int64_t{k.rings()} * k.ring_bytes()), fmt_bytes(2 * k.epilogue_smem_bytes),
                   k.cluster_n1 > 1 ? fmt::format(", partial-O hand-over {}", fmt_bytes(2 * k.xfer_bytes())) : "");
  o += fmt::format("  estimate     {:.1f} us fused, {:.1f} us unfused{}\n", p.fused_us, p.unfused_us,
                   p.fused_us > p.unfused_us ? " (fusion is NOT expected to pay: see the last reason)" : "");
  return o + plan_detail::reason_lists(p.reasons, p.alternatives, "alternatives (estimated)");
}

}  // namespace comfuse
