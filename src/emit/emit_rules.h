#pragma once
// The expansion rules of Ψ, one per NodeCategory. Private to src/emit.
#include <map>
#include <string>
#include <vector>

#include "comfuse/emit.h"

namespace comfuse::emit_detail {

// State shared by the rules while one FusionSpec is rendered.
struct EmitContext {
  explicit EmitContext(const FusionSpec& s) : spec(s), borrows(s.staging_borrows()) {}
  const FusionSpec& spec;
  // PostStage stores that write through a root store's staging (FusionSpec::staging_borrows).
  std::map<std::pair<const Spec*, int>, int> borrows;
  std::map<int, int> slot_of_arg;       // FusionSpec arg -> Params slot (vectors/scalars/outputs)
  std::vector<std::string> literals;    // struct definitions, in first-use order
  std::string literal_struct(double v); // name of the struct holding v as a float
  // The plan lets paired reductions (pair_kind: mean + variance, max + sum of exp) share one
  // exchange round (the L2 exchange or none; over several N-tiles a CTA the root stage's only):
  // Reduction<..., Pair> on both (epilogue/reduce.cuh).
  OneRoundPairs fuse_pairs;
  const Spec* pair_child = nullptr;  // the PostStage whose reduction takes the merged statistic
  // fuse_pairs.kept_exp: a max-and-sum-of-exp pair whose PostStage reads its operand only through
  // the exp (pair_keeps_exp) keeps exp(x - the CTA's max) in place (reduce.cuh kPairGivenKept).
  bool pair_child_keeps_exp = false;
  // A B2B kernel's F: the Store of this arg (the intermediate S) renders as ToOperand (S stays in
  // registers as GEMM2's A operand); -1: none.
  int operand_arg = -1;
  // KernelConfig::ring_input_bytes: the root stage's tile inputs (arg) -> their first box in the
  // ring slot (TileInput's Box0); empty: every tile input reads L2.
  std::map<int, int> ring_box_of_arg;
};

// Params slots over every spec a kernel renders (emit.cpp).
std::vector<ArgSlot> assign_slots(const std::vector<const FusionSpec*>& specs);
// The kernel's `// Params binding:` comment.
std::string slot_comment(const std::vector<const FusionSpec*>& specs, const std::vector<ArgSlot>& slots);


// Renders one node as a template type; `path` locates it for error messages.
using Rule = std::string (*)(EmitContext&, const Spec& stage, int index, const std::string& path);
Rule rule_for(NodeCategory c);

// Renders a whole stage: comfuse::epi::Stage<node types...>.
std::string render_stage(EmitContext& ctx, const Spec& stage, const std::string& path);

std::string cpp_type(DType t);  // cutlass::bfloat16_t, cutlass::half_t, float

}  // namespace comfuse::emit_detail
