#pragma once
// Backend Ψ: FusionSpec + Plan -> one CUDA C++ translation unit instantiating the device
// templates in kernels/comfuse/. Deterministic: the same inputs give the same text (it is
// the JIT cache key). One expansion rule per node category (emit_rules.cpp); a nested
// spec (a reduction's PostOp) expands recursively inside its reduction's rule.
#include <string>
#include <vector>

#include "comfuse/plan.h"
#include "comfuse/spec.h"

namespace comfuse {

// Where each runtime argument of the spec lands in the kernel's Params.
// B2B kernels: OperandA is X, OperandB W1, OperandGate W3, OperandB2 W2 (tma_a, tma_b, tma_b3,
// tma_b2); the intermediate S has no slot (it stays in registers).
enum class SlotKind { OperandA, OperandB, OperandGate, OperandB2, Vector, Scalar, TileInput, Output, ColOutput };
struct ArgSlot {
  int spec = 0;  // which spec's args: 0 the kernel's (a B2B kernel's first), 1 a B2B kernel's second
  int arg = -1;  // index into FusionSpec::args
  SlotKind kind = SlotKind::Vector;
  int slot = 0;  // index into Params::vectors / scalars / tma_in and tile_in / tma_out / col_outputs
};

struct EmittedKernel {
  std::string entry;   // extern "C" kernel symbol
  std::string source;  // the translation unit
  std::vector<ArgSlot> slots;
};

// Throws Error naming the node when the spec uses something the device templates
// cannot express yet (the message says what and why).
EmittedKernel emit(const FusionSpec& s, const Plan& p);

// The B2B kernel of a pair Φ found (lower.h's B2BCandidate): `first` is GEMM1 and F, storing the
// intermediate S; `second` is GEMM2 (A = S) and its epilogue.
EmittedKernel emit_b2b(const FusionSpec& first, const FusionSpec& second, const B2bPlan& p);

// The KernelConfig as the generated source's `constexpr comfuse::KernelConfig kConfig{...};`.
std::string kernel_config_source(const KernelConfig& c);

// The epilogue type alone (e.g. for tests and `comfuse emit --epilogue`).
// fuse_pairs: the kinds of paired reductions (pair_kind in spec.h) that share one exchange
// round (emit() passes Plan::fused_pairs: row groups or one CTA per row; over several N-tiles a
// CTA, the root stage's pair).
// config: the plan's kernel carries the root stage's tile inputs in the mainloop's ring
// (KernelConfig::ring_input_bytes > 0; its tile_n places their boxes).
std::string emit_epilogue_type(const FusionSpec& s, OneRoundPairs fuse_pairs = {}, const KernelConfig* config = nullptr);

}  // namespace comfuse
