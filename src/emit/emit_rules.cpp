// Ψ's expansion rules: each NodeCategory maps to one device template family of
// kernels/comfuse/epilogue/nodes.cuh. An op's device functor name comes from the
// vocabulary (ops.def; the causal mask's from CausalMaskOp in ops.h), so a new op needs no
// change here.
#include <fmt/format.h>

#include <cmath>

#include "emit_rules.h"

namespace comfuse::emit_detail {

std::string cpp_type(DType t) {
  switch (t) {
    case DType::BF16: return "cutlass::bfloat16_t";
    case DType::F16: return "cutlass::half_t";
    case DType::F32: return "float";
  }
  return "float";
}

namespace {

// A float constant expression NVRTC and nvcc both accept in `static constexpr float value = ...`.
// NVRTC knows neither __builtin_inff nor __builtin_huge_valf, and __int_as_float is not
// constexpr; __builtin_bit_cast of the IEEE bits is.
std::string float_literal(double v) {
  const float f = static_cast<float>(v);
  if (std::isnan(f)) return "__builtin_bit_cast(float, 0x7fc00000u)";
  if (std::isinf(f)) return f > 0 ? "__builtin_bit_cast(float, 0x7f800000u)" : "__builtin_bit_cast(float, 0xff800000u)";
  // Shortest text that reads back as the same float.
  return fmt::format("{}f", f).find_first_of(".en") == std::string::npos ? fmt::format("{}.0f", f) : fmt::format("{}f", f);
}

const SpecNode& node_at(const Spec& s, int i) { return s.nodes.at(static_cast<size_t>(i)); }

std::string operands(const SpecNode& n) {
  std::string out;
  for (int o : n.operands) out += fmt::format(", {}", o);
  return out;
}

int slot(EmitContext& ctx, int arg, const std::string& path) {
  auto it = ctx.slot_of_arg.find(arg);
  if (it == ctx.slot_of_arg.end()) throw Error(fmt::format("{}: argument a{} has no kernel slot", path, arg));
  return it->second;
}

// A gated acc entry (A x Gate) is the B2B kernel's second GEMM1 accumulator (EpiCtx::gate).
std::string acc_entry(EmitContext&, const Spec& st, int i, const std::string&) {
  return node_at(st, i).arg >= 0 ? "comfuse::epi::GateEntry" : "comfuse::epi::AccEntry";
}

std::string broadcast(EmitContext& ctx, const Spec& st, int i, const std::string& path) {
  const SpecNode& n = node_at(st, i);
  if (n.arg < 0) return fmt::format("comfuse::epi::ScalarLiteral<{}>", ctx.literal_struct(n.literal));
  const RuntimeArg& a = ctx.spec.args.at(static_cast<size_t>(n.arg));
  switch (n.broadcast) {
    case BroadcastKind::Scalar: return fmt::format("comfuse::epi::ScalarArg<{}>", slot(ctx, n.arg, path));
    case BroadcastKind::Row:
      // A periodic row (spec.h periodic_arg) reads element j mod segment for column j.
      return fmt::format("comfuse::epi::RowBroadcast<{}, {}{}>", slot(ctx, n.arg, path), cpp_type(a.dtype),
                         periodic_arg(ctx.spec, a) ? fmt::format(", {}", ctx.spec.segment) : "");
    case BroadcastKind::Col: return fmt::format("comfuse::epi::ColBroadcast<{}, {}>", slot(ctx, n.arg, path), cpp_type(a.dtype));
    case BroadcastKind::Tile: {
      const auto ring = ctx.ring_box_of_arg.find(n.arg);
      if (&st == &ctx.spec.root && ring != ctx.ring_box_of_arg.end())
        return fmt::format("comfuse::epi::TileInput<{}, {}, {}>", slot(ctx, n.arg, path), cpp_type(a.dtype),
                           ring->second);
      // A periodic tile input (spec.h periodic_arg: rotary cos and sin) reads column j mod segment.
      return fmt::format("comfuse::epi::TileInput<{}, {}{}>", slot(ctx, n.arg, path), cpp_type(a.dtype),
                         periodic_arg(ctx.spec, a) ? fmt::format(", -1, {}", ctx.spec.segment) : "");
    }
  }
  return "";
}

std::string compute(EmitContext& ctx, const Spec& st, int i, const std::string&) {
  const SpecNode& n = node_at(st, i);
  switch (n.compute) {
    case ComputeKind::Unary:
      return fmt::format("comfuse::epi::Compute<comfuse::epi::{}{}>", device_functor_of(n.unary), operands(n));
    case ComputeKind::Binary:
      if (const int e = literal_int_exponent(st, n); e > 0)
        return fmt::format("comfuse::epi::Compute<comfuse::epi::PowInt<{}>, {}>", e, n.operands.at(0));
      // The tanh it reads is then unread and the compiler drops it.
      if (const int u = one_plus_tanh_operand(st, n); u >= 0)
        return fmt::format("comfuse::epi::Compute<comfuse::epi::OnePlusTanh, {}>", u);
      return fmt::format("comfuse::epi::Compute<comfuse::epi::{}{}>", device_functor_of(n.binary), operands(n));
    case ComputeKind::Cast:
      return fmt::format("comfuse::epi::Cast<{}{}>", cpp_type(n.cast_to), operands(n));
    case ComputeKind::CausalMask:
      return fmt::format("comfuse::epi::{}<{}>", CausalMaskOp::device_node, n.operands.at(0));
    case ComputeKind::RotateHalf:
      return fmt::format("comfuse::epi::{}<{}, {}{}>", RotateHalfOp::device_node, n.operands.at(0), ctx.spec.segment,
                         rotate_in_place(st, i) ? ", true" : "");
    case ComputeKind::RotatePairs:
      return fmt::format("comfuse::epi::{}<{}>", RotatePairsOp::device_node, n.operands.at(0));
  }
  return "";
}

// A reduction carries its PostOp stage as a template argument: structural induction.
std::string reduction(EmitContext& ctx, const Spec& st, int i, const std::string& path) {
  const SpecNode& n = node_at(st, i);
  // Pairs (epilogue/reduce.cuh): kPairMeanM2 (1) or kPairMaxExpSum (3) on the first
  // reduction, kPairGiven (2) on its PostStage's reduction, or kPairGivenKept (4) where the
  // first stage keeps the exp in place.
  int pair = ctx.pair_child == &st ? (ctx.pair_child_keeps_exp ? 4 : 2) : 0;
  std::string post = "void";
  if (n.post >= 0) {
    const Spec& child = st.children.at(static_cast<size_t>(n.post));
    const PairKind kind = pair == 0 ? pair_kind(st, i) : PairKind::None;
    if (ctx.fuse_pairs.has(kind)) {
      pair = kind == PairKind::MeanVariance ? 1 : 3;
      ctx.pair_child = &child;
      ctx.pair_child_keeps_exp = ctx.fuse_pairs.kept_exp && pair_keeps_exp(st, i);
    }
    post = render_stage(ctx, child, fmt::format("{} > post of n{}", path, i));
  }
  // A per-segment reduction (FusionSpec::segment) finalizes over its segment's columns.
  const std::string tail = ctx.spec.segment > 0 ? fmt::format(", {}, {}", pair, ctx.spec.segment)
                           : pair               ? fmt::format(", {}", pair)
                                                : "";
  return fmt::format("comfuse::epi::Reduction<comfuse::epi::{}, {}, {}{}>", device_functor_of(n.reduce), n.operands.at(0),
                     post, tail);
}

std::string placeholder(EmitContext&, const Spec& st, int i, const std::string&) {
  const SpecNode& n = node_at(st, i);
  if (n.placeholder == PlaceholderKind::Stat) return "comfuse::epi::Stat";
  return fmt::format("comfuse::epi::Bypass<{}>", n.source);
}

std::string store(EmitContext& ctx, const Spec& st, int i, const std::string& path) {
  const SpecNode& n = node_at(st, i);
  const RuntimeArg& a = ctx.spec.args.at(static_cast<size_t>(n.arg));
  if (n.arg == ctx.operand_arg) return fmt::format("comfuse::epi::ToOperand<{}>", n.operands.at(0));
  if (a.value_class == ValueClass::Col)
    return fmt::format("comfuse::epi::StoreCol<{}, {}{}>", slot(ctx, n.arg, path), cpp_type(a.dtype), operands(n));
  // A PostStage store through a root store's staging (FusionSpec::staging_borrows): that store's slot.
  if (const auto b = ctx.borrows.find({&st, i}); b != ctx.borrows.end())
    return fmt::format("comfuse::epi::Store<{}, {}{}, {}>", slot(ctx, n.arg, path), cpp_type(a.dtype), operands(n),
                       slot(ctx, node_at(ctx.spec.root, b->second).arg, path));
  return fmt::format("comfuse::epi::Store<{}, {}{}>", slot(ctx, n.arg, path), cpp_type(a.dtype), operands(n));
}

}  // namespace

std::string EmitContext::literal_struct(double v) {
  const std::string body = fmt::format("{{ static constexpr float value = {}; }};", float_literal(v));
  for (size_t i = 0; i < literals.size(); ++i)
    if (literals[i].find(body) != std::string::npos) return fmt::format("Lit{}", i);
  literals.push_back(fmt::format("struct Lit{} {}", literals.size(), body));
  return fmt::format("Lit{}", literals.size() - 1);
}

Rule rule_for(NodeCategory c) {
  switch (c) {
    case NodeCategory::AccEntry: return acc_entry;
    case NodeCategory::Broadcast: return broadcast;
    case NodeCategory::Compute: return compute;
    case NodeCategory::Reduction: return reduction;
    case NodeCategory::Placeholder: return placeholder;
    case NodeCategory::Store: return store;
  }
  return nullptr;
}

std::string render_stage(EmitContext& ctx, const Spec& stage, const std::string& path) {
  std::string out = "comfuse::epi::Stage<";
  for (size_t i = 0; i < stage.nodes.size(); ++i) {
    const std::string node = rule_for(stage.nodes[i].category)(ctx, stage, static_cast<int>(i), path);
    out += fmt::format("{}\n    /* n{} */ {}", i ? "," : "", i, node);
  }
  return out + ">";
}

}  // namespace comfuse::emit_detail
