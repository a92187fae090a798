// Stage-chain analysis shared by the planner and its printers: which stages exist, what
// stays live across a reduce phase, what a multi-tile CTA must keep, how much epilogue
// work a tile costs, and short labels for nodes (node names follow the spec text: nK).
#include <fmt/format.h>

#include <algorithm>

#include "plan_internal.h"

namespace comfuse::plan_detail {
namespace {

// Collects stages in walk order and links each to its parent reduction.
class StageCollector : public SpecVisitor {
 public:
  std::vector<StageRef> stages;
  void enter_stage(const Spec& stage, int depth) override {
    StageRef r{&stage, depth, -1, -1};
    if (!open_.empty()) {
      r.parent = open_.back();
      r.parent_reduction = last_reduction_[static_cast<size_t>(r.parent)];
    }
    open_.push_back(static_cast<int>(stages.size()));
    last_reduction_.push_back(-1);
    stages.push_back(r);
  }
  void leave_stage(const Spec&, int) override { open_.pop_back(); }
  void visit(const Spec&, int index, const SpecNode& node, int) override {
    // walk() descends into a reduction's PostOp right after visiting it.
    if (node.category == NodeCategory::Reduction) last_reduction_[static_cast<size_t>(open_.back())] = index;
  }

 private:
  std::vector<int> open_;
  std::vector<int> last_reduction_;
};

// SASS instructions per element of a unary function (each compiled alone for sm_90a and
// counted with cuobjdump, less a copy kernel's; epilogue/ops.cuh): erf-GELU ~13 (its normal
// tail's seven FMAs and EX2, the clamp, a NaN-keeping max and one FFMA), tanh-GELU ~10 (fast_exp and
// __fdividef), tanhf ~18, logf ~20, fast_exp 2 (FMUL + MUFU.EX2), silu / sigmoid ~5 (fast_exp,
// an add, __fdividef), IEEE reciprocal ~8, rsqrt / sqrt ~4, plain ALU 1. erf-GELU is priced
// 18: at 14 the chain (examples/gemm_chain.cf) at 8192x4096x1024 takes 64x256 tiles over
// 64x128, measured 4% slower (325 against 312 us; 4096x4096x1024 2%), while 8192x1024x4096's
// move to 128x128 (136 against 141 us) holds at 18 too: the model favours wide tiles for long
// epilogues more than the GPU does (bench/NOTES.md Stop 33).
double unary_cost(UnaryOp op) {
  switch (op) {
    case UnaryOp::Relu: case UnaryOp::Square: case UnaryOp::Abs: case UnaryOp::Neg: return 1.0;
    case UnaryOp::GeluErf: return 18.0;  // not its ~13: see above
    case UnaryOp::GeluTanh: return 10.0;
    case UnaryOp::Tanh: return 18.0;
    case UnaryOp::Log: return 20.0;
    case UnaryOp::Exp: return 2.0;
    case UnaryOp::Silu: case UnaryOp::Sigmoid: return 5.0;
    case UnaryOp::Rsqrt: case UnaryOp::Sqrt: return 4.0;
    // Counted against relu in a 128x128 kernel's unrolled epilogue (cuobjdump): softplus ~36 a
    // value, expm1f ~28, log1pf ~29, erff ~21, where logf counts ~26: scaled to logf's 20 above.
    case UnaryOp::Softplus: return 28.0;
    case UnaryOp::Expm1: case UnaryOp::Log1p: return 22.0;
    case UnaryOp::Erf: return 16.0;
    default: return 8.0;
  }
}

// Instructions per element of a Tile-class node (node i of st) in the compute phase: unary
// functions as above, a division ~4, plain ALU 1 (GUESSES beside them); 1 + tanh(u) as Ψ
// renders it (2 sigmoid(2u)) a sigmoid's 5, and a tanh only such adds read 0 (never computed).
double node_cost(const FusionSpec& s, const Spec& st, int i) {
  const SpecNode& n = st.nodes.at(static_cast<size_t>(i));
  if (n.value_class != ValueClass::Tile) return 0.0;  // per-row or per-column: negligible
  switch (n.category) {
    case NodeCategory::AccEntry: return 0.0;
    case NodeCategory::Placeholder: return 0.0;  // a register rename (Stash adds SMEM cost apart)
    case NodeCategory::Broadcast: return 0.5;   // row/col vector: one shared load per 2 elements
    case NodeCategory::Reduction: return 1.0;   // thread-local combine
    case NodeCategory::Store: return 2.0;       // convert + st.shared for the TMA store
    case NodeCategory::Compute:
      if (n.compute == ComputeKind::Cast) return 1.0;
      if (n.compute == ComputeKind::CausalMask) return 2.0;  // compare the position, select
      if (n.compute == ComputeKind::RotateHalf || n.compute == ComputeKind::RotatePairs)
        return 1.0;  // the partner's registers, a negation
      if (n.compute == ComputeKind::Unary)
        return only_one_plus_tanh_users(st, i) ? 0.0 : unary_cost(n.unary);
      if (one_plus_tanh_operand(st, n) >= 0) return unary_cost(UnaryOp::Sigmoid);
      if (n.binary == BinaryOp::Div) return 4.0;
      if (n.binary == BinaryOp::Pow) return literal_int_exponent(st, n) > 0 ? 2.0 : 80.0;  // powf: ~80 SASS
      return 1.0;
  }
  (void)s;
  return 1.0;
}

// The root stage's pairs of a kind (over several N-tiles a CTA, only the root's runs in one round:
// stage.cuh kPairOnline) whose second reduction's PostStage is the chain's last stage (no
// reduction) and takes the second's stage's tile value: those two stages stream together
// (stage.cuh kFusedStream).
int root_pairs_streamed_together(const Spec& root, PairKind kind) {
  int n = 0;
  for (size_t i = 0; i < root.nodes.size(); ++i) {
    if (pair_kind(root, static_cast<int>(i)) != kind) continue;
    const Spec& second = root.children.at(static_cast<size_t>(root.nodes[i].post));
    const SpecNode& sum = second.nodes.at(static_cast<size_t>(second.terminal));
    if (sum.post < 0) continue;
    const Spec& last = second.children.at(static_cast<size_t>(sum.post));
    const bool takes_tile = std::any_of(last.nodes.begin(), last.nodes.end(), [](const SpecNode& n) {
      return n.category == NodeCategory::Placeholder && n.placeholder == PlaceholderKind::Bypass &&
             n.value_class == ValueClass::Tile;
    });
    if (takes_tile && last.nodes.at(static_cast<size_t>(last.terminal)).category != NodeCategory::Reduction) ++n;
  }
  return n;
}

// The pairs of a kind whose first reduction is in the root stage.
int root_pairs(const Spec& root, PairKind kind) {
  int n = 0;
  for (size_t i = 0; i < root.nodes.size(); ++i) n += pair_kind(root, static_cast<int>(i)) == kind;
  return n;
}

// The max-and-sum-of-exp pairs of any stage whose PostStage takes the exp from the registers in
// one round over one N-tile (spec.h pair_keeps_exp).
int pairs_keeping_exp(const Spec& st) {
  int n = 0;
  for (size_t i = 0; i < st.nodes.size(); ++i) n += pair_keeps_exp(st, static_cast<int>(i));
  for (const Spec& c : st.children) n += pairs_keeping_exp(c);
  return n;
}

// The root pairs whose two stages after the round stream the stash together (one read, no
// write-back between them): only in one round over several N-tiles a CTA.
int streamed_together(const ChainInfo& chain, const OneRoundPairs& fused, int64_t n_tiles) {
  if (n_tiles == 1) return 0;
  return (fused.mean_variance ? chain.mean_variance_pairs_streamed_together : 0) +
         (fused.max_exp_sum ? chain.max_exp_sum_pairs_streamed_together : 0);
}

}  // namespace

int stash_reads_after_round(const ChainInfo& chain, const OneRoundPairs& fused, int64_t n_tiles) {
  return std::max(1, chain.stages_in_chain - 1 - streamed_together(chain, fused, n_tiles));
}

int stash_write_backs_after_round(const ChainInfo& chain, const OneRoundPairs& fused, int64_t n_tiles) {
  return std::max(0, chain.stash_write_backs - streamed_together(chain, fused, n_tiles));
}

std::vector<StageRef> collect_stages(const FusionSpec& s) {
  StageCollector c;
  c.walk(s.root);
  return c.stages;
}

ChainInfo analyze_chain(const FusionSpec& s) {
  ChainInfo info;
  info.segment = s.segment;
  info.reductions = s.segment > 0 ? 0 : s.reduction_count();
  info.stages_in_chain = std::max(1, s.stage_count());
  info.mean_variance_pairs = s.segment > 0 ? 0 : s.pair_count(PairKind::MeanVariance);
  info.max_exp_sum_pairs = s.segment > 0 ? 0 : s.pair_count(PairKind::MaxExpSum);
  info.mean_variance_pairs_streamed_together =
      s.segment > 0 ? 0 : root_pairs_streamed_together(s.root, PairKind::MeanVariance);
  info.max_exp_sum_pairs_streamed_together = s.segment > 0 ? 0 : root_pairs_streamed_together(s.root, PairKind::MaxExpSum);
  info.mean_variance_pairs_below_root =
      info.mean_variance_pairs - (s.segment > 0 ? 0 : root_pairs(s.root, PairKind::MeanVariance));
  info.max_exp_sum_pairs_below_root = info.max_exp_sum_pairs - (s.segment > 0 ? 0 : root_pairs(s.root, PairKind::MaxExpSum));
  info.max_exp_sum_pairs_keeping_exp = s.segment > 0 ? 0 : pairs_keeping_exp(s.root);
  if (s.segment == 0 && s.root.terminal >= 0) info.root_pair = pair_kind(s.root, s.root.terminal);
  for (const RuntimeArg& a : s.args)
    if (a.role == ArgRole::TileInput) {
      info.tile_input_bytes_per_element += static_cast<int64_t>(size_of(a.dtype));
      ++info.tile_inputs;
    }
  const std::vector<StageRef> stages = collect_stages(s);
  const auto borrows = s.staging_borrows();
  for (const StageRef& st : stages) {
    int bypass_tiles = 0;
    ChainInfo::StageStorage storage;
    for (size_t idx = 0; idx < st.spec->nodes.size(); ++idx) {
      const SpecNode& n = st.spec->nodes[idx];
      info.ops_per_element += node_cost(s, *st.spec, static_cast<int>(idx));
      if (n.category == NodeCategory::Placeholder && n.placeholder == PlaceholderKind::Bypass &&
          n.value_class == ValueClass::Tile)
        ++bypass_tiles;
      if (n.category == NodeCategory::Store && n.arg >= 0 && n.arg < static_cast<int>(s.args.size())) {
        const RuntimeArg& out = s.args[static_cast<size_t>(n.arg)];
        const bool tile = out.value_class == ValueClass::Tile;
        bool& bf16 = tile ? info.tile_outputs_bf16 : info.row_outputs_bf16;
        bf16 = bf16 && out.dtype == DType::BF16;
        if (tile) {
          const int bytes = static_cast<int>(size_of(out.dtype));
          info.has_tile_output = true;
          info.max_out_bytes = std::max(info.max_out_bytes, bytes);
          // A PostStage store that borrows a root store's staging keeps none of its own.
          if (!borrows.count({st.spec, static_cast<int>(idx)})) storage.store_bytes_per_row_of_64 += 64 * bytes;
        }
      }
      if (n.category == NodeCategory::Broadcast && n.broadcast == BroadcastKind::Row) ++storage.row_broadcasts;
    }
    info.live_tile_values = std::max(info.live_tile_values, bypass_tiles);
    info.carries_tile = info.carries_tile || bypass_tiles > 0;
    // A tile value taken from a PostStage (not the root): that stage writes it back to the stash.
    if (bypass_tiles > 0 && st.parent > 0) ++info.stash_write_backs;
    info.stage_storage.push_back(storage);
    // Stage-1 values that stage 2 takes by bypass: the stash set. Anything later stages
    // need is an elementwise function of these, the statistics and broadcasts.
    if (st.depth == 1 && st.parent == 0) {
      for (const SpecNode& n : st.spec->nodes) {
        if (n.category != NodeCategory::Placeholder || n.placeholder != PlaceholderKind::Bypass ||
            n.value_class != ValueClass::Tile)
          continue;
        if (std::find(info.stash_nodes.begin(), info.stash_nodes.end(), n.source) != info.stash_nodes.end())
          continue;
        info.stash_nodes.push_back(n.source);
        info.stash_names.push_back(value_name(s.root, n.source));
      }
    }
  }
  return info;
}

std::string value_name(const Spec& stage, int index) {
  if (index >= 0 && index < static_cast<int>(stage.nodes.size())) {
    const std::string& o = stage.nodes[static_cast<size_t>(index)].origin;
    if (!o.empty()) return o;
  }
  return fmt::format("n{}", index);
}

std::string node_label(const FusionSpec& s, const Spec& stage, int index) {
  const SpecNode& n = stage.nodes.at(static_cast<size_t>(index));
  auto ops = [&] {
    std::string out;
    for (size_t i = 0; i < n.operands.size(); ++i) out += fmt::format("{}n{}", i ? ", " : "", n.operands[i]);
    return out;
  };
  auto arg_name = [&](int a) {
    return (a >= 0 && a < static_cast<int>(s.args.size())) ? s.args[static_cast<size_t>(a)].name
                                                            : fmt::format("a{}", a);
  };
  switch (n.category) {
    case NodeCategory::AccEntry: return "acc";
    case NodeCategory::Broadcast:
      if (n.arg < 0) return fmt::format("{:g}", n.literal);
      return fmt::format("{}[{}]", arg_name(n.arg),
                         n.broadcast == BroadcastKind::Row    ? "row"
                         : n.broadcast == BroadcastKind::Col  ? "col"
                         : n.broadcast == BroadcastKind::Tile ? "tile"
                                                              : "scalar");
    case NodeCategory::Compute:
      if (n.compute == ComputeKind::Cast) return fmt::format("cast<{}>({})", name_of(n.cast_to), ops());
      if (n.compute == ComputeKind::CausalMask) return fmt::format("{}({})", CausalMaskOp::name, ops());
      if (n.compute == ComputeKind::RotateHalf) return fmt::format("{}({})", RotateHalfOp::name, ops());
      if (n.compute == ComputeKind::RotatePairs) return fmt::format("{}({})", RotatePairsOp::name, ops());
      if (n.compute == ComputeKind::Unary) return fmt::format("{}({})", name_of(n.unary), ops());
      return fmt::format("{}({})", name_of(n.binary), ops());
    case NodeCategory::Reduction: return fmt::format("{}({})", name_of(n.reduce), ops());
    case NodeCategory::Placeholder:
      if (n.placeholder == PlaceholderKind::Stat) return "stat";
      return fmt::format("bypass n{}", n.source);
    case NodeCategory::Store: return fmt::format("store {} <- {}", arg_name(n.arg), ops());
  }
  return "?";
}

std::string fmt_bytes(int64_t bytes) {
  if (bytes < 1024) return fmt::format("{} B", bytes);
  if (bytes < (int64_t{1} << 20)) return fmt::format("{:.1f} KiB", static_cast<double>(bytes) / 1024.0);
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
}

}  // namespace comfuse::plan_detail
