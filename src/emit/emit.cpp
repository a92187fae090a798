// Ψ: assemble the translation unit around the rendered epilogue (emit_rules.cpp).
#include "comfuse/emit.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <functional>

#include "emit_rules.h"

namespace comfuse {

using emit_detail::EmitContext;

namespace {

// Kernel Params capacities (kernels/comfuse/params.cuh).
constexpr int kMaxOutputs = 4, kMaxVectors = 8, kMaxScalars = 8;

std::vector<ArgSlot> assign_slots(const FusionSpec& s) {
  std::vector<ArgSlot> slots;
  int vectors = 0, scalars = 0, outputs = 0;
  for (size_t i = 0; i < s.args.size(); ++i) {
    const RuntimeArg& a = s.args[i];
    ArgSlot sl;
    sl.arg = static_cast<int>(i);
    switch (a.role) {
      case ArgRole::OperandA: sl.kind = SlotKind::OperandA; break;
      case ArgRole::OperandB: sl.kind = SlotKind::OperandB; break;
      case ArgRole::RowVector:
      case ArgRole::ColVector: sl.kind = SlotKind::Vector; sl.slot = vectors++; break;
      case ArgRole::Scalar: sl.kind = SlotKind::Scalar; sl.slot = scalars++; break;
      case ArgRole::Output: sl.kind = SlotKind::Output; sl.slot = outputs++; break;
    }
    slots.push_back(sl);
  }
  if (vectors > kMaxVectors)
    throw Error(fmt::format("spec '{}' reads {} row/column vectors; the kernel takes at most {}", s.name, vectors, kMaxVectors));
  if (scalars > kMaxScalars)
    throw Error(fmt::format("spec '{}' reads {} runtime scalars; the kernel takes at most {}", s.name, scalars, kMaxScalars));
  if (outputs > kMaxOutputs)
    throw Error(fmt::format("spec '{}' stores {} outputs; the kernel writes at most {}", s.name, outputs, kMaxOutputs));
  return slots;
}

EmitContext make_context(const FusionSpec& s, const std::vector<ArgSlot>& slots) {
  EmitContext ctx{s, {}, {}, {}, nullptr};
  for (const ArgSlot& sl : slots) ctx.slot_of_arg[sl.arg] = sl.slot;
  return ctx;
}



// What the device templates cannot express yet is refused here, by name, rather than
// surfacing as a template error deep inside a JIT log.
void check_device_support(const FusionSpec& s, const Plan& p) {
  if (p.n_tiles_per_cta > 1 && p.wgs_per_tile != 1)
    throw Error(fmt::format("spec '{}': several N-tiles per CTA need the PingPong schedule", s.name));
  if (p.n_tiles_per_cta > 64)
    throw Error(fmt::format("spec '{}': {} N-tiles per CTA exceed the kernel's 64", s.name, p.n_tiles_per_cta));
  // The device carries a tile-shaped value across a reduction in the accumulator
  // registers: one per stage boundary (kernels/comfuse/epilogue/stage.cuh).
  struct TileBypassCheck : SpecVisitor {
    std::string error;
    void enter_stage(const Spec& st, int depth) override {
      std::vector<std::string> names;
      for (const SpecNode& n : st.nodes)
        if (n.category == NodeCategory::Placeholder && n.placeholder == PlaceholderKind::Bypass &&
            n.value_class == ValueClass::Tile)
          names.push_back(n.origin);
      if (names.size() > 1 && error.empty())
        error = fmt::format("stage {} takes {} tile-shaped values across a reduction ({}); the device keeps one (in "
                            "the accumulator registers): split the epilogue or express the others through that one",
                            depth, names.size(), fmt::join(names, ", "));
    }
  } bypass_check;
  bypass_check.walk(s.root);
  if (!bypass_check.error.empty()) throw Error(fmt::format("spec '{}': {}", s.name, bypass_check.error));
  const bool global = p.aggregation == AggregationMode::Global;
  if (s.reduction_count() > 0 && p.cluster_m != 1 && p.cluster_n != 1)
    throw Error(fmt::format("spec '{}': a row reduction over DSMEM needs clusters along N only (cluster_m = {}); "
                            "with clusters along M the row's CTAs exchange through L2 (aggregation global)", s.name, p.cluster_m));
  if (p.row_group > 1 && (!global || p.cluster_n != 1))
    throw Error(fmt::format("spec '{}': a row group of {} clusters needs aggregation global and clusters of 1 along N "
                            "(plan: {}, cluster_n = {})", s.name, p.row_group, name_of(p.aggregation), p.cluster_n));
  if (p.fused_pairs.any() && !one_round_pairs_possible(p))
    throw Error(fmt::format("spec '{}': the plan fuses paired reductions (mean and variance, max and sum of exp) into one round, which needs one N-tile "
                            "per CTA and the L2 exchange or a single CTA per row (plan: {} N-tiles, {}, {} CTA(s) per row)",
                            s.name, p.n_tiles_per_cta, name_of(p.aggregation), p.cluster_n * p.row_group));
  if (p.row_group < 1 || p.row_group > 64)
    throw Error(fmt::format("spec '{}': row group {} is not in 1..64", s.name, p.row_group));
  const RuntimeArg& a = s.args.at(static_cast<size_t>(s.arg_index(ArgRole::OperandA)));
  const RuntimeArg& b = s.args.at(static_cast<size_t>(s.arg_index(ArgRole::OperandB)));
  if (a.dtype != b.dtype || a.dtype == DType::F32)
    throw Error(fmt::format("GEMM operands '{}' ({}) and '{}' ({}) must both be bf16 or both f16", a.name,
                            name_of(a.dtype), b.name, name_of(b.dtype)));
  if (p.tile_m != 64 && p.tile_m != 128 && !(p.tile_m == 256 && p.wgs_per_tile == 2))
    throw Error(fmt::format("plan tile_m {} is not 64 or 128 (or 256 cooperative)", p.tile_m));
  if (p.tile_n % 64 || p.tile_n < 64 || p.tile_n > 256) throw Error(fmt::format("plan tile_n {} is not in 64..256 step 64", p.tile_n));
}

}  // namespace

std::string emit_epilogue_type(const FusionSpec& s, OneRoundPairs fuse_pairs) {
  EmitContext ctx = make_context(s, assign_slots(s));
  ctx.fuse_pairs = fuse_pairs;
  const std::string stage = emit_detail::render_stage(ctx, s.root, "stage 0");
  std::string out;
  for (const std::string& l : ctx.literals) out += l + "\n";
  return out + "using Epilogue = " + stage + ";\n";
}

EmittedKernel emit(const FusionSpec& s, const Plan& p) {
  check_device_support(s, p);
  EmittedKernel k;
  k.entry = "comfuse_fused_gemm";
  k.slots = assign_slots(s);
  const RuntimeArg& a = s.args.at(static_cast<size_t>(s.arg_index(ArgRole::OperandA)));

  std::string slot_doc;
  for (const ArgSlot& sl : k.slots) {
    const RuntimeArg& arg = s.args[static_cast<size_t>(sl.arg)];
    const char* where = sl.kind == SlotKind::OperandA ? "tma_a" : sl.kind == SlotKind::OperandB ? "tma_b"
                        : sl.kind == SlotKind::Vector ? "vectors" : sl.kind == SlotKind::Scalar ? "scalars" : "tma_out";
    slot_doc += sl.kind == SlotKind::OperandA || sl.kind == SlotKind::OperandB
                    ? fmt::format("//   {:<12} {} {}\n", where, arg.name, name_of(arg.dtype))
                    : fmt::format("//   {}[{}]{:<4} {} {}\n", where, sl.slot, "", arg.name, name_of(arg.dtype));
  }
  k.source = fmt::format(
      "// Generated by ComFuse (backend Psi) from fusion spec '{name}'. Do not edit: regenerate.\n"
      "// Params binding:\n{slots}"
      "#include \"comfuse/kernel/fused_gemm_sm90.cuh\"\n"
      "\n"
      "namespace {{\n"
      "{epilogue}"
      "using Mainloop = comfuse::MainloopSm90<{elem}, /*BKMajor=*/{kmajor}, /*BM=*/{bm}, /*BN=*/{bn},\n"
      "                                       /*Stages=*/{stages}, /*ClusterN=*/{cn}, /*WGsPerTile=*/{wgs},\n"
      "                                       /*ClusterM=*/{cm}>;\n"
      "using Kernel = comfuse::FusedGemmSm90<Mainloop, Epilogue, comfuse::cluster::Aggregation::{agg},\n"
      "                                      /*NTiles=*/{ntiles}, /*StashT=*/{stash_t}, comfuse::epi::StashSpace::{space},\n"
      "                                      /*RowGroup=*/{row_group}>;\n"
      "}}  // namespace\n"
      "\n"
      "COMFUSE_DEFINE_KERNEL({entry}, Kernel)\n",
      fmt::arg("name", s.name), fmt::arg("slots", slot_doc), fmt::arg("epilogue", emit_epilogue_type(s, p.fused_pairs)),
      fmt::arg("elem", emit_detail::cpp_type(a.dtype)), fmt::arg("kmajor", s.b_layout == BLayout::NK ? "true" : "false"),
      fmt::arg("bm", p.tile_m), fmt::arg("bn", p.tile_n), fmt::arg("stages", p.stages), fmt::arg("cn", p.cluster_n),
      fmt::arg("wgs", p.wgs_per_tile), fmt::arg("cm", p.cluster_m),
      fmt::arg("agg", p.aggregation == AggregationMode::LeaderFollower ? "LeaderFollower"
                      : p.aggregation == AggregationMode::Global       ? "Global"
                                                                       : "PeerToPeer"),
      fmt::arg("row_group", p.row_group),
      fmt::arg("ntiles", p.n_tiles_per_cta),
      fmt::arg("stash_t", emit_detail::cpp_type(p.stash_elem_bytes == 2 ? DType::BF16 : DType::F32)),
      fmt::arg("space", p.strategy == RowStrategy::Stash ? "Smem" : p.strategy == RowStrategy::GlobalReread ? "Global" : "Auto"),
      fmt::arg("entry", k.entry));
  return k;
}

}  // namespace comfuse
