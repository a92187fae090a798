#pragma once
// Lowering Φ: graph -> one FusionSpec per fusable region (paper, Sec. on Φ).
#include <string>
#include <vector>

#include "comfuse/graph.h"
#include "comfuse/spec.h"

namespace comfuse {

struct FusedRegion {
  FusionSpec spec;
  int matmul_node = -1;
  std::vector<int> fused_nodes;  // graph node ids executed inside this region's kernel
};

// A graph node that no region fuses, and why. Inputs and constants never appear here.
struct Fallback {
  int node = -1;
  std::string reason;
};

// A second matmul whose A operand is an epilogue output of the first: O = F(X W1^T) W2^T, the
// pair the B2B kernel family fuses into one kernel with S = F(...) in registers
// (kernels/comfuse/b2b/; plan.h's make_b2b_plan decides how, or says why not).
struct B2BCandidate {
  int first_matmul = -1;
  int second_matmul = -1;
  int via_node = -1;       // the epilogue value feeding the second matmul (S)
  int first_region = -1;   // regions[first_region] computes S; regions[second_region] consumes it
  int second_region = -1;
  int gate_matmul = -1;    // a gated first region (GatePair): its X W3^T matmul, else -1
  std::string blocker;     // empty: one kernel can hold both; else why S must go through memory
};

// Two matmuls that share their A operand and whose epilogue values meet in one elementwise F:
// SwiGLU's silu(X W1^T) * (X W3^T). Φ merges them into ONE region, a gated GEMM (the first
// matmul is its AccEntry, the second a gated AccEntry reading OperandGate W3) whose epilogue is
// elementwise: the first GEMM of a B2B pair (the B2B kernel holds both accumulators:
// B2bConfig::gated), or a gated single-GEMM kernel (KernelConfig::gated: one wgmma over W1's
// and W3's tiles). Where they cannot merge, the two stay apart and `blocker` says why.
struct GatePair {
  int first_matmul = -1;  // X W1^T: the region's root
  int gate_matmul = -1;   // X W3^T: its second accumulator
  int meet_node = -1;     // the first elementwise node that reads both
  int region = -1;        // the merged region, -1 when not merged
  std::string blocker;    // empty: merged; else why not
};

struct LoweringResult {
  std::vector<FusedRegion> regions;
  std::vector<Fallback> fallbacks;
  std::vector<B2BCandidate> b2b_candidates;
  std::vector<GatePair> gate_pairs;
  std::vector<int> dead_nodes;  // computed but reaching no output
  // What the kernels will compute differently from the fp64 graph, e.g. a constant that
  // rounds to inf or 0 in the epilogue's f32 (one line each, in the user's names).
  std::vector<std::string> warnings;
};

// Throws Error when there is nothing to fuse (no outputs, or no matmul reaches one) and when
// an output is a graph input or a constant itself (no kernel computes it).
LoweringResult lower(const Graph& g);

// The B2B pair when the lowering is exactly two regions that one B2B kernel holds (and nothing
// falls back); nullptr otherwise.
const B2BCandidate* one_b2b_kernel(const LoweringResult& r);

// Human-readable account of what was fused, what fell back and why.
std::string describe(const Graph& g, const LoweringResult& r);

}  // namespace comfuse
