// What the device templates (kernels/comfuse/) cannot express, refused before a plan is
// made, in the user's names (FusionSpec::describe), with what is supported instead. emit()
// keeps its own checks as a backstop; these are the ones a user meets.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "plan_internal.h"

namespace comfuse {
namespace {

std::string gemm_name(const FusionSpec& s) {
  for (const SpecNode& n : s.root.nodes)
    if (n.category == NodeCategory::AccEntry && !n.origin.empty()) return s.describe(n.origin);
  return "'" + s.name + "'";
}

// The tensor cores read bf16 or f16 A and B, both alike (kernels/comfuse/mainloop).
void check_operands(const FusionSpec& s) {
  const int ia = s.arg_index(ArgRole::OperandA), ib = s.arg_index(ArgRole::OperandB);
  if (ia < 0 || ib < 0) throw Error(fmt::format("GEMM {} has no operand {}", gemm_name(s), ia < 0 ? "A" : "B"));
  const RuntimeArg& a = s.args[static_cast<size_t>(ia)];
  const RuntimeArg& b = s.args[static_cast<size_t>(ib)];
  for (const RuntimeArg* x : {&a, &b})
    if (x->dtype == DType::F32)
      throw Error(fmt::format("GEMM {} reads operand {} {} in f32; the tensor cores take bf16 or f16 operands: {}",
                              gemm_name(s), x == &a ? "A" : "B", s.describe(x->name),
                              made_up_name(x->name)
                                  ? "cast it to bf16 or f16 where it is computed"
                                  : fmt::format("declare it bf16 or f16, or cast it (e.g. cast({}, bf16))", x->name)));
  if (a.dtype != b.dtype)
    throw Error(fmt::format("GEMM {} reads A {} as {} and B {} as {}: both operands must be bf16 or both f16",
                            gemm_name(s), s.describe(a.name), name_of(a.dtype), s.describe(b.name), name_of(b.dtype)));
}

// A stage takes at most one tile-shaped value across the reduction before it: it travels in
// the accumulator registers (epilogue/stage.cuh). Φ already recomputes what it can.
void check_tile_bypass(const FusionSpec& s) {
  const std::vector<plan_detail::StageRef> stages = plan_detail::collect_stages(s);
  for (const plan_detail::StageRef& st : stages) {
    std::vector<std::string> names;
    for (const SpecNode& n : st.spec->nodes)
      if (n.category == NodeCategory::Placeholder && n.placeholder == PlaceholderKind::Bypass &&
          n.value_class == ValueClass::Tile)
        names.push_back(s.describe(n.origin));
    if (names.size() <= 1 || st.parent < 0) continue;
    const Spec& parent = *stages[static_cast<size_t>(st.parent)].spec;
    const std::string red = s.describe(parent.nodes.at(static_cast<size_t>(st.parent_reduction)).origin);
    throw Error(fmt::format("{} tile-shaped values cross the reduction {}: {}; the device carries one "
                            "(in the accumulator registers): compute the others from that one, or split the "
                            "epilogue there",
                            names.size(), red, fmt::join(names, "; ")));
  }
}

// The kernel's Params slots (config.cuh, Sm90): vectors, scalars, [M, N] inputs, tile outputs,
// per-row outputs.
void check_capacities(const FusionSpec& s) {
  std::vector<std::string> vectors, scalars, tile_inputs, outputs, col_outputs;
  for (const RuntimeArg& a : s.args) {
    if (a.role == ArgRole::RowVector || a.role == ArgRole::ColVector) vectors.push_back(s.describe(a.name));
    if (a.role == ArgRole::Scalar) scalars.push_back(s.describe(a.name));
    if (a.role == ArgRole::TileInput) tile_inputs.push_back(s.describe(a.name));
    if (a.role == ArgRole::Output) (a.value_class == ValueClass::Col ? col_outputs : outputs).push_back(s.describe(a.name));
  }
  auto limit = [&](const std::vector<std::string>& v, int most, const char* verb, const char* what) {
    if (static_cast<int>(v.size()) > most)
      throw Error(fmt::format("the epilogue of GEMM {} {} {} {} ({}); the kernel takes at most {}", gemm_name(s), verb,
                              v.size(), what, fmt::join(v, "; "), most));
  };
  limit(vectors, Sm90::kMaxVectors, "reads", "row/column vectors");
  limit(scalars, Sm90::kMaxScalars, "reads", "runtime scalars");
  limit(tile_inputs, Sm90::kMaxTileInputs, "reads", "[M, N] tensors");
  limit(outputs, Sm90::kMaxOutputs, "stores", "tile outputs");
  limit(col_outputs, Sm90::kMaxColOutputs, "stores", "per-row [M, 1] outputs");
}

}  // namespace

void check_compile_size(const FusionSpec& s) {
  if (s.reduction_count() > Sm90::kMaxReductions)
    throw Error(fmt::format("the epilogue of GEMM {} holds {} row reductions; one kernel takes at most {} (each nests "
                            "a stage its templates must compile): split the epilogue, or compute the rest outside",
                            gemm_name(s), s.reduction_count(), Sm90::kMaxReductions));
  for (const plan_detail::StageRef& st : plan_detail::collect_stages(s)) {
    const std::vector<SpecNode>& nodes = st.spec->nodes;
    if (static_cast<int>(nodes.size()) <= Sm90::kMaxStageNodes) continue;
    std::string first, last;
    for (const SpecNode& n : nodes)
      if (!n.origin.empty() && n.origin != first) (first.empty() ? first : last) = n.origin;
    throw Error(fmt::format("the epilogue of GEMM {} holds {} nodes (ops, their operands and stores) in one stage{}; "
                            "one kernel's stage takes at most {} (each is a template its JIT must compile): split the "
                            "epilogue, or compute the rest outside",
                            gemm_name(s), nodes.size(),
                            first.empty() || last.empty()
                                ? std::string()
                                : fmt::format(" (from {} to {})", s.describe(first), s.describe(last)),
                            Sm90::kMaxStageNodes));
  }
}

void check_device_limits(const FusionSpec& s) {
  check_operands(s);
  check_tile_bypass(s);
  check_capacities(s);
  check_compile_size(s);
}

}  // namespace comfuse
