// A B2B pair as single-GEMM kernels (plan.h unfused_pair): the path choose_b2b weighs the one
// B2B kernel against, and what FusedKernel runs where it does not pay.
#include <fmt/format.h>

#include "comfuse/plan.h"

namespace comfuse {

namespace {

bool names_an_arg(const FusionSpec& s, const std::string& name) {
  for (const RuntimeArg& a : s.args)
    if (a.name == name) return true;
  return false;
}

// The gated GEMM1 split in two: `up` stores X W3^T as `product`; `gate` is the first spec with
// W3's argument replaced by `product` read as a tile input, and every gated entry (A x W3) by a
// read of it. Node and argument indices are unchanged, so F's spec is untouched otherwise.
std::pair<FusionSpec, FusionSpec> split_gated(const FusionSpec& first, int gate_arg, const RuntimeArg& product) {
  const RuntimeArg& x = first.args.at(static_cast<size_t>(first.arg_index(ArgRole::OperandA)));
  FusionSpec up;
  up.name = first.name + "_x_w3";
  up.b_layout = first.b_layout;
  up.m = first.m, up.n = first.n, up.k = first.k;
  up.user_names = first.user_names;
  up.args = {x, first.args.at(static_cast<size_t>(gate_arg)), product};
  up.args[1].role = ArgRole::OperandB;
  up.args[2].role = ArgRole::Output;
  SpecNode acc;
  acc.category = NodeCategory::AccEntry;
  acc.value_class = ValueClass::Tile;
  acc.origin = product.name;
  SpecNode store;
  store.category = NodeCategory::Store;
  store.value_class = ValueClass::Tile;
  store.operands = {0};
  store.arg = 2;
  store.origin = product.name;
  up.root.nodes = {acc, store};
  up.root.terminal = 1;

  FusionSpec gate = first;
  RuntimeArg& read = gate.args.at(static_cast<size_t>(gate_arg));
  read = product;
  read.role = ArgRole::TileInput;
  for (SpecNode& n : gate.root.nodes)
    if (n.category == NodeCategory::AccEntry && n.arg == gate_arg) {
      n.category = NodeCategory::Broadcast;
      n.broadcast = BroadcastKind::Tile;
    }
  return {std::move(up), std::move(gate)};
}

}  // namespace

UnfusedPair unfused_pair(const FusionSpec& first, const FusionSpec& second, const PlanOptions& opt) {
  if (first.batched())
    throw Error(fmt::format("'{}': a batched pair has no unfused path (the single-GEMM kernels take no batch dim)",
                            first.name));
  UnfusedPair out;
  const int gate_arg = first.arg_index(ArgRole::OperandGate);
  if (gate_arg < 0 || opt.gated_gemm.value_or(true)) {  // one GEMM1 kernel: plain, or gated (W1 and W3 sharing X's tiles)
    out.kernels = {first, second};
  } else {
    // The product takes the graph's name for X W3^T (the gated entry's origin: SwiGLU's `up`).
    std::string name;
    for (const SpecNode& n : first.root.nodes)
      if (n.category == NodeCategory::AccEntry && n.arg == gate_arg) name = n.origin;
    while (name.empty() || names_an_arg(first, name) || names_an_arg(second, name)) name += "'";
    RuntimeArg product;
    product.name = name;
    product.dtype = first.args.at(static_cast<size_t>(first.arg_index(ArgRole::OperandA))).dtype;
    product.shape = {first.m, first.n};
    product.value_class = ValueClass::Tile;
    auto [up, gate] = split_gated(first, gate_arg, product);
    out.intermediates.push_back(product);
    out.kernels = {std::move(up), std::move(gate), second};
  }
  out.intermediates.push_back(first.args.at(static_cast<size_t>(b2b_intermediate_arg(first, second))));
  for (const FusionSpec& k : out.kernels) verify(k);
  return out;
}

}  // namespace comfuse
