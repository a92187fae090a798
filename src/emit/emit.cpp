// Ψ: assemble the translation unit around the rendered epilogue (emit_rules.cpp).
#include "comfuse/emit.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <functional>

#include "emit_rules.h"

namespace comfuse {

using emit_detail::EmitContext;

// Params slots of the kernel's runtime arguments, over every spec the kernel renders (a B2B
// kernel: GEMM1's and GEMM2's): one counter per slot kind. A B2B kernel's intermediate S (the
// first spec's output that the second reads as A) takes none.
std::vector<ArgSlot> emit_detail::assign_slots(const std::vector<const FusionSpec*>& specs) {
  std::vector<ArgSlot> slots;
  int vectors = 0, scalars = 0, tile_inputs = 0, outputs = 0, col_outputs = 0;
  const std::string intermediate =
      specs.size() > 1 ? specs[1]->args.at(static_cast<size_t>(specs[1]->arg_index(ArgRole::OperandA))).name : "";
  const std::string name = specs[0]->name;
  for (size_t si = 0; si < specs.size(); ++si)
  for (size_t i = 0; i < specs[si]->args.size(); ++i) {
    const RuntimeArg& a = specs[si]->args[i];
    if (!intermediate.empty() && a.name == intermediate) continue;
    ArgSlot sl;
    sl.spec = static_cast<int>(si);
    sl.arg = static_cast<int>(i);
    switch (a.role) {
      case ArgRole::OperandA: sl.kind = SlotKind::OperandA; break;
      case ArgRole::OperandB: sl.kind = si == 0 ? SlotKind::OperandB : SlotKind::OperandB2; break;
      case ArgRole::OperandGate: sl.kind = SlotKind::OperandGate; break;
      case ArgRole::RowVector:
      case ArgRole::ColVector: sl.kind = SlotKind::Vector; sl.slot = vectors++; break;
      case ArgRole::Scalar: sl.kind = SlotKind::Scalar; sl.slot = scalars++; break;
      case ArgRole::TileInput: sl.kind = SlotKind::TileInput; sl.slot = tile_inputs++; break;
      case ArgRole::Output:
        if (a.value_class == ValueClass::Col) sl.kind = SlotKind::ColOutput, sl.slot = col_outputs++;
        else sl.kind = SlotKind::Output, sl.slot = outputs++;
        break;
    }
    slots.push_back(sl);
  }
  if (vectors > Sm90::kMaxVectors)
    throw Error(fmt::format("spec '{}' reads {} row/column vectors; the kernel takes at most {}", name, vectors, Sm90::kMaxVectors));
  if (scalars > Sm90::kMaxScalars)
    throw Error(fmt::format("spec '{}' reads {} runtime scalars; the kernel takes at most {}", name, scalars, Sm90::kMaxScalars));
  if (outputs > Sm90::kMaxOutputs)
    throw Error(fmt::format("spec '{}' stores {} outputs; the kernel writes at most {}", name, outputs, Sm90::kMaxOutputs));
  if (tile_inputs > Sm90::kMaxTileInputs)
    throw Error(fmt::format("spec '{}' reads {} [M, N] tensors in its epilogue; the kernel takes at most {}", name,
                            tile_inputs, Sm90::kMaxTileInputs));
  if (col_outputs > Sm90::kMaxColOutputs)
    throw Error(fmt::format("spec '{}' stores {} per-row [M, 1] outputs; the kernel writes at most {}", name,
                            col_outputs, Sm90::kMaxColOutputs));
  return slots;
}

namespace {

}  // namespace

std::string emit_detail::slot_comment(const std::vector<const FusionSpec*>& specs, const std::vector<ArgSlot>& slots) {
  std::string doc;
  for (const ArgSlot& sl : slots) {
    const RuntimeArg& arg = specs.at(static_cast<size_t>(sl.spec))->args[static_cast<size_t>(sl.arg)];
    const char* where = sl.kind == SlotKind::OperandA      ? "tma_a"
                        : sl.kind == SlotKind::OperandB    ? "tma_b"
                        : sl.kind == SlotKind::OperandGate ? "tma_b3"
                        : sl.kind == SlotKind::OperandB2   ? "tma_b2"
                        : sl.kind == SlotKind::Vector      ? "vectors"
                        : sl.kind == SlotKind::Scalar      ? "scalars"
                        : sl.kind == SlotKind::TileInput   ? "tma_in"
                        : sl.kind == SlotKind::ColOutput   ? "col_outputs"
                                                           : "tma_out";
    const bool operand = sl.kind == SlotKind::OperandA || sl.kind == SlotKind::OperandB ||
                         sl.kind == SlotKind::OperandGate || sl.kind == SlotKind::OperandB2;
    doc += operand ? fmt::format("//   {:<12} {} {}\n", where, arg.name, name_of(arg.dtype))
                   : fmt::format("//   {}[{}]{:<4} {} {}\n", where, sl.slot, "", arg.name, name_of(arg.dtype));
  }
  return doc;
}

namespace {

EmitContext make_context(const FusionSpec& s, const std::vector<ArgSlot>& slots) {
  EmitContext ctx{s};
  for (const ArgSlot& sl : slots)
    if (sl.spec == 0) ctx.slot_of_arg[sl.arg] = sl.slot;
  return ctx;
}



// What the device templates cannot express is refused by the planner (check() of the
// KernelConfig, and the spec-level limits in its first step); emit re-checks the config so a
// hand-made Plan cannot reach the JIT with a template error deep inside its log.
void check_renderable(const FusionSpec& s, const Plan& p) {
  if (const char* why = check(p.kernel)) throw Error(fmt::format("spec '{}': the plan's kernel cannot be built: {}", s.name, why));
  if (s.gated() != p.kernel.gated)
    throw Error(fmt::format("spec '{}' {} a gated GEMM but its plan's kernel {}", s.name, s.gated() ? "is" : "is not",
                            p.kernel.gated ? "is (KernelConfig::gated)" : "is not (KernelConfig::gated)"));
  const OneRoundPairs can = one_round_pairs_possible(p);
  if ((p.fused_pairs.mean_variance && !can.mean_variance) || (p.fused_pairs.max_exp_sum && !can.max_exp_sum))
    throw Error(fmt::format("spec '{}': the plan fuses paired reductions into one round, which needs the L2 exchange or "
                            "a single CTA per row", s.name));
  if (const char* why = stash_centers_refused(s, p))
    throw Error(fmt::format("spec '{}': the plan's kernel cannot be built: {}", s.name, why));
  if (p.fused_pairs.kept_exp && (!p.fused_pairs.max_exp_sum || !can.kept_exp))
    throw Error(fmt::format("spec '{}': the plan keeps a pair's exp in the registers, which needs its max and sum of exp "
                            "in one round over one N-tile a CTA", s.name));
}

const char* aggregation_name(Aggregation a) {
  switch (a) {
    case Aggregation::None: return "None";
    case Aggregation::PeerToPeer: return "PeerToPeer";
    case Aggregation::LeaderFollower: return "LeaderFollower";
    case Aggregation::L2Exchange: return "L2Exchange";
  }
  return "None";
}
const char* stash_space_name(StashSpace s) {
  switch (s) {
    case StashSpace::None: return "None";
    case StashSpace::Smem: return "Smem";
    case StashSpace::Workspace: return "Workspace";
  }
  return "None";
}

}  // namespace

std::string emit_epilogue_type(const FusionSpec& s, OneRoundPairs fuse_pairs, const KernelConfig* config) {
  EmitContext ctx = make_context(s, emit_detail::assign_slots({&s}));
  ctx.fuse_pairs = fuse_pairs;
  if (config && config->ring_input_bytes > 0) {  // the slot's TMA boxes, in first-read order
    int box = 0;
    for (int arg : s.root_tile_inputs()) {
      ctx.ring_box_of_arg[arg] = box;
      box += config->tile_input_bytes(static_cast<int>(size_of(s.args.at(static_cast<size_t>(arg)).dtype))) /
             config->ring_box_bytes();
    }
  }
  const std::string stage = emit_detail::render_stage(ctx, s.root, "stage 0");
  std::string out;
  for (const std::string& l : ctx.literals) out += l + "\n";
  return out + "using Epilogue = " + stage + ";\n";
}

std::string kernel_config_source(const KernelConfig& c) {
  return fmt::format(
      "constexpr comfuse::KernelConfig kConfig{{\n"
      "    .b_kmajor = {}, .tile_m = {}, .tile_n = {}, .ring_stages = {}, .wgs_per_tile = {}, .mma_depth = {},{}\n"
      "    .cluster_m = {}, .cluster_n = {}, .n_tiles = {},{} .row_group = {}, .k_splits = {}, .splits_in_cluster = {},\n"
      "    .row_reduction = {}, .aggregation = comfuse::Aggregation::{},\n"
      "    .stash_space = comfuse::StashSpace::{}, .stash_elem_bytes = {},{} .epilogue_smem_bytes = {},\n"
      "    .begin_early = {},{} .ring_input_bytes = {}{}{}{}{}{}{}}};\n",
      c.b_kmajor, c.tile_m, c.tile_n, c.ring_stages, c.wgs_per_tile, c.mma_depth,
      c.consumer_wgs != Sm90::kConsumerWGs ? fmt::format(" .consumer_wgs = {},", c.consumer_wgs) : "", c.cluster_m, c.cluster_n, c.n_tiles,
      c.turn_lead > 0 ? fmt::format(" .turn_lead = {},", c.turn_lead) : "", c.row_group, c.k_splits,
      c.splits_in_cluster, c.row_reduction, aggregation_name(c.aggregation), stash_space_name(c.stash_space),
      c.stash_elem_bytes, c.stash_centers ? " .stash_centers = true," : "", c.epilogue_smem_bytes, c.begin_early,
      c.store_stages != 1 ? fmt::format(" .store_stages = {},", c.store_stages) : "", c.ring_input_bytes, c.gated ? ", .gated = true" : "",
      c.a_box_rows > 0 ? fmt::format(", .a_box_rows = {}", c.a_box_rows) : "",
      c.split_gather_rows > 0 ? fmt::format(", .split_gather_rows = {}", c.split_gather_rows) : "",
      c.pair_hand_over ? ", .pair_hand_over = true" : "", c.poll_backoff ? ", .poll_backoff = true" : "",
      c.row_segment > 0 ? fmt::format(", .row_segment = {}", c.row_segment) : "");
}

EmittedKernel emit(const FusionSpec& s, const Plan& p) {
  check_renderable(s, p);
  EmittedKernel k;
  k.entry = "comfuse_fused_gemm";
  k.slots = emit_detail::assign_slots({&s});
  const RuntimeArg& a = s.args.at(static_cast<size_t>(s.arg_index(ArgRole::OperandA)));

  const std::string slot_doc = emit_detail::slot_comment({&s}, k.slots);
  k.source = fmt::format(
      "// Generated by ComFuse (backend Psi) from fusion spec '{name}'. Do not edit: regenerate.\n"
      "// Params binding:\n{slots}"
      "#include \"comfuse/kernel/fused_gemm_sm90.cuh\"\n"
      "\n"
      "namespace {{\n"
      "{epilogue}"
      "{config}"
      "using Kernel = comfuse::FusedGemmSm90<kConfig, {elem}, Epilogue>;\n"
      "}}  // namespace\n"
      "\n"
      "COMFUSE_DEFINE_KERNEL({entry}, Kernel)\n",
      fmt::arg("name", s.name), fmt::arg("slots", slot_doc), fmt::arg("epilogue", emit_epilogue_type(s, p.fused_pairs, &p.kernel)),
      fmt::arg("config", kernel_config_source(p.kernel)), fmt::arg("elem", emit_detail::cpp_type(a.dtype)),
      fmt::arg("entry", k.entry));
  return k;
}

}  // namespace comfuse
