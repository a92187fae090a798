// The B2B planner's decode kernel (B2bConfig::decode_rows, kernels/comfuse/b2b/decode_attention.cuh):
//   form      the pair is attention it runs: F = softmax(scale x [+ an additive [M, N1] mask]) of
//             the raw scores, no causal mask, one GEMM1, GEMM2's epilogue a plain store of O in
//             X's type; batched, at most kMaxDecodeRows query rows a batch, head dim D = DV of
//             64, 128 or 256
//   split     each batch's keys over the CTAs of a cluster (flash-decoding): every cluster size
//             whose CTAs keep at least one step of keys priced, the smallest within 3% of the
//             fastest taken
//   estimate  K's, V's, the mask's, Q's and O's bytes at DRAM's rate and each CTA's
//             loads in flight (or the CUDA cores' FMAs where rows make it compute-bound), plus
//             a fixed cost (MEASURED: calibration.h)
// make_b2b_plan (decide_b2b.cpp) weighs it against the wgmma pipeline.
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "plan_internal.h"

namespace comfuse::plan_detail {

namespace {

// GEMM2's epilogue is O stored (maybe through a cast) and nothing else.
std::string plain_store_of_o(const FusionSpec& second) {
  if (second.reduction_count() > 0 || !second.root.children.empty()) return "GEMM2's epilogue reduces";
  int stores = 0;
  for (const SpecNode& n : second.root.nodes) {
    if (n.category == NodeCategory::Store) ++stores;
    else if (n.category == NodeCategory::Compute && n.compute == ComputeKind::Cast) continue;
    else if (n.category != NodeCategory::AccEntry) return fmt::format("GEMM2's epilogue computes '{}'", n.origin);
  }
  if (stores != 1) return "GEMM2's epilogue stores more than O";
  return "";
}

}  // namespace

DecodeForm decode_form(const FusionSpec& first, const FusionSpec& second, const B2bProblem& p, B2bIntermediate kind) {
  DecodeForm f;
  auto refuse = [&](std::string why) {
    f.refused = "the decode kernel runs attention at a few query rows: " + std::move(why);
    return f;
  };
  if (kind != B2bIntermediate::OnlineSoftmax) return refuse("F is not a softmax over N1");
  if (!first.batched()) return refuse("the pair is not batched");
  if (first.arg_index(ArgRole::OperandGate) >= 0) return refuse("GEMM1 is gated");
  if (first.b_layout != BLayout::NK || second.b_layout != BLayout::KN)
    return refuse("K is not [N1, K] or V not [N1, N2] (layout=kn)");
  if (const std::string c = causal_mask_in(first.root); !c.empty())
    return refuse(fmt::format("F applies the causal mask {}", first.describe(c)));
  if (p.m > B2bConfig::kMaxDecodeRows)
    return refuse(fmt::format("M = {} query rows a batch (at most {})", p.m, B2bConfig::kMaxDecodeRows));
  if (p.k != p.n2 || (p.k != 64 && p.k != 128 && p.k != 256))
    return refuse(fmt::format("head dims K = {} and N2 = {} (one of 64, 128 or 256 for both)", p.k, p.n2));
  if (const std::string why = plain_store_of_o(second); !why.empty()) return refuse(why);
  const RuntimeArg& x = first.args.at(static_cast<size_t>(first.arg_index(ArgRole::OperandA)));
  for (const RuntimeArg& a : second.args)
    if (a.role == ArgRole::Output && a.dtype != x.dtype)
      return refuse(fmt::format("O '{}' is {}, not X's {}", a.name, name_of(a.dtype), name_of(x.dtype)));
  // The softmax's operand: scale (Q K^T), or that plus an [M, N1] input (either side of the add).
  const Spec& st = first.root;
  int from = st.nodes.at(static_cast<size_t>(st.terminal)).operands.at(0);
  const SpecNode& n = st.nodes.at(static_cast<size_t>(from));
  if (n.category == NodeCategory::Compute && n.compute == ComputeKind::Binary && n.binary == BinaryOp::Add) {
    for (int side = 0; side < 2 && f.mask_arg < 0; ++side) {
      const SpecNode& m = st.nodes.at(static_cast<size_t>(n.operands.at(static_cast<size_t>(side))));
      if (m.category == NodeCategory::Broadcast && m.broadcast == BroadcastKind::Tile && m.arg >= 0) {
        f.mask_arg = m.arg;
        from = n.operands.at(static_cast<size_t>(1 - side));
      }
    }
  }
  f.scale = scale_of_scores(st, from, false);
  if (!(f.scale > 0.f)) {
    f.mask_arg = -1;
    return refuse(fmt::format("the softmax's input {} is not a positive scale times Q K^T plus at most one [M, N1] mask",
                              first.describe(value_name(st, st.nodes.at(static_cast<size_t>(st.terminal)).operands.at(0)))));
  }
  return f;
}

B2bPlan decode_plan(const FusionSpec& first, const B2bProblem& p, const DecodeForm& form, const PlanOptions& opt,
                    const DeviceModel& dev) {
  B2bPlan plan;
  plan.gpu = dev.gpu;
  plan.problem = p;
  plan.intermediate = B2bIntermediate::OnlineSoftmax;
  plan.decode_mask_arg = form.mask_arg;
  B2bConfig& k = plan.kernel;
  k.w1_kmajor = true, k.w2_kmajor = false, k.batched = true, k.online_softmax = true;
  k.logit_scale = form.scale;
  k.tile_n2 = static_cast<int>(p.n2);
  k.decode_rows = static_cast<int>(p.m);
  if (opt.cluster_n && (*opt.cluster_n < 1 || *opt.cluster_n > Sm90::kMaxClusterSize || (*opt.cluster_n & (*opt.cluster_n - 1))))
    throw Error(fmt::format("b2b: --cluster-n {}: the decode kernel splits keys over 1, 2, 4, 8 or 16 CTAs", *opt.cluster_n));
  if (const char* why = check(k)) throw Error(fmt::format("b2b: the decode kernel cannot be built: {}", why));

  // Bytes (the pair's X, W1, W2 and O: Q, K, V and O; and the mask), FMAs, and what a CTA keeps in
  // flight (its step of keys, K and V).
  const int lanes = k.decode_lanes(), groups = k.decode_groups(), unroll = k.decode_unroll();
  const int64_t step = k.decode_step_keys();
  const double in_flight = double(step) * 2.0 * double(p.k) * 2.0;
  const double bt = static_cast<double>(p.batches);
  const B2bBytes pair = b2b_bytes(p, false);
  const double mask_bytes =
      form.mask_arg >= 0 ? size_of(first.args.at(static_cast<size_t>(form.mask_arg)).dtype) * bt * p.m * p.n1 : 0.0;
  const double bytes = pair.x + pair.w1 + pair.w2 + pair.o + mask_bytes;
  const double fmas = bt * p.m * p.n1 * (p.k + p.n2);
  plan.dram_floor_us = bytes / dev.dram_bytes_per_s * 1e6;
  // Split: each cluster size priced (the smallest within 3% of the fastest taken), the CTAs'
  // loads in flight against DRAM's rate; a CTA keeps at least one step of keys.
  struct Priced {
    int c;
    double us, stream_us, fma_us, merge_us;
  };
  std::vector<Priced> priced;
  for (int c = 1; c <= Sm90::kMaxClusterSize; c *= 2) {
    if (opt.cluster_n ? c != *opt.cluster_n : c > 1 && p.n1 < c * step) continue;
    const double ctas = bt * c;
    const double resident = std::min(ctas, double(DeviceModel::decode_ctas_per_sm(k.decode_rows) * dev.sm_count));
    const double rate = std::min(dev.dram_bytes_per_s, resident * in_flight / (dev.dram_latency_us * 1e-6));
    const double stream_us = bytes / rate * 1e6;
    // The FMAs' rate wants two CTAs an SM too (8 warps to hide the dependent shuffles and
    // exponentials: 4 rows at B1 x H16, N 4096 ran 18.8 us on 128 CTAs, 13.5 on 256, Stop 45's
    // kernel).
    const double fma_us = fmas / (dev.decode_fma_per_s * std::min(1.0, ctas / (2.0 * dev.sm_count))) * 1e6;
    const double merge_us = c > 1 ? lookup(dev.cluster_allreduce_us, c) : 0.0;
    priced.push_back({c, dev.decode_fixed_us + merge_us + std::max(stream_us, fma_us), stream_us, fma_us, merge_us});
  }
  const Priced* best = &priced.front();
  for (const Priced& q : priced)
    if (q.us < best->us * 0.97) best = &q;
  k.cluster_n1 = best->c;
  plan.jobs = p.batches;
  plan.grid_ctas = p.batches * best->c;
  plan.fused_us = best->us;
  plan.unfused_us = b2b_roofline_unfused_us(p, false, dev);
  plan.unfused_from = "GEMM1 and GEMM2 each at the measured rate or its DRAM traffic, S written and read back";
  for (const Priced& q : priced)
    if (&q != best)
      plan.alternatives.push_back(fmt::format("the decode kernel, keys over clusters of {}: {:.1f} us ({} CTAs)", q.c,
                                              q.us, p.batches * q.c));
  const int c = k.cluster_n1;
  auto& r = plan.reasons;
  r.push_back(fmt::format(
      "decode kernel: M = {} query row(s) a batch (at most {}), so Q K^T and P V run on CUDA cores: a 64-row wgmma "
      "would do {} useful row(s) in 64. A key's row of D = {} is held by {} lanes ({} elements each), {} keys a CTA at "
      "once, each group {} keys ahead (K and V: {} in flight a CTA)",
      p.m, B2bConfig::kMaxDecodeRows, p.m, p.k, lanes, k.decode_vec(), groups, unroll, fmt_bytes(static_cast<int64_t>(in_flight))));
  r.push_back(fmt::format(
      "F: softmax({:g} x{}) of the raw scores x, online: each group's running max and sum in the log2 domain, its "
      "O rescaled when the max moves; the CTA's groups merged in SMEM",
      form.scale,
      form.mask_arg >= 0 ? fmt::format(" + the mask {} ({})", first.describe(first.args[static_cast<size_t>(form.mask_arg)].name),
                                       name_of(first.args[static_cast<size_t>(form.mask_arg)].dtype))
                         : std::string()));
  r.push_back(c > 1 ? fmt::format("keys split over clusters of {} CTAs (flash-decoding, the partition along N1): "
                                  "rank r walks its 1/{} of a batch's N1 = {} keys; the cluster's partial (max, sum, "
                                  "O) merge over DSMEM in rank order, rank r finishing its 1/{} of the batch's "
                                  "outputs{}",
                                  c, c, p.n1, c, opt.cluster_n ? " (forced)" : "")
                    : fmt::format("keys not split: one CTA walks a batch's N1 = {} keys{}", p.n1,
                                  opt.cluster_n ? " (forced)" : " (a split does not beat it by 3%: the alternatives)"));
  r.push_back(fmt::format("grid: {} CTAs of {} threads{}, SMEM {} each", plan.grid_ctas, k.threads(),
                          c > 1 ? fmt::format(" in clusters of {}", c) : "", fmt_bytes(k.smem_bytes())));
  r.push_back(fmt::format(
      "estimate {:.1f} us: {} of K, V{}, Q and O streamed in {:.1f} us (at most DRAM's rate, and {} in "
      "flight a CTA a {:.1f} us round trip, {} CTAs an SM resident), the FMAs {:.1f} us, plus {:.1f} us a launch{} "
      "(measured: calibration.h)",
      plan.fused_us, fmt_bytes(static_cast<int64_t>(bytes)), form.mask_arg >= 0 ? ", the mask" : "", best->stream_us,
      fmt_bytes(static_cast<int64_t>(in_flight)), dev.dram_latency_us,
      DeviceModel::decode_ctas_per_sm(k.decode_rows), best->fma_us,
      dev.decode_fixed_us, c > 1 ? fmt::format(" and {:.2f} us the cluster's merge", best->merge_us) : ""));
  return plan;
}

std::string explain_decode(const FusionSpec& first, const FusionSpec& second, const B2bPlan& p) {
  const B2bConfig& k = p.kernel;
  std::string o = fmt::format("b2b plan for '{}' -> '{}' (the decode kernel: one kernel, S never stored)\n", first.name,
                              second.name);
  o += fmt::format("  problem      M={} K={} N1={} N2={} x {} batches, {}\n", p.problem.m, p.problem.k, p.problem.n1,
                   p.problem.n2, p.problem.batches, name_of(p.problem.ab_dtype));
  o += fmt::format("  gpu          {}\n", name_of(p.gpu));
  o += fmt::format("  kernel       CUDA cores, up to {} query rows a batch, head dim {}\n", k.decode_rows, k.tile_n2);
  o += fmt::format("  N1 split     {}\n", k.cluster_n1 > 1 ? fmt::format("over clusters of {} CTAs, merged over DSMEM", k.cluster_n1)
                                                         : std::string("none (one CTA a batch)"));
  o += fmt::format("  grid         {} CTAs, {} batches\n", p.grid_ctas, p.jobs);
  o += fmt::format("  SMEM         {}\n", fmt_bytes(k.smem_bytes()));
  o += fmt::format("  estimate     {:.1f} us fused, {:.1f} us unfused\n", p.fused_us, p.unfused_us);
  return o + reason_lists(p.reasons, p.alternatives, "alternatives (estimated)");
}

}  // namespace comfuse::plan_detail
