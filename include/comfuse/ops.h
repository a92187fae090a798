#pragma once
// Typed views of the operator vocabulary in ops.def, and the one position-dependent op.
#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>

namespace comfuse {

enum class UnaryOp {
#define COMFUSE_UNARY_OP(E, name, expr, dev) E,
#include "comfuse/ops.def"
#undef COMFUSE_UNARY_OP
};

// How many unary ops ops.def names (tests walk them all).
inline constexpr int kUnaryOpCount = 0
#define COMFUSE_UNARY_OP(E, name, expr, dev) +1
#include "comfuse/ops.def"
#undef COMFUSE_UNARY_OP
    ;

enum class BinaryOp {
#define COMFUSE_BINARY_OP(E, name, expr, dev) E,
#include "comfuse/ops.def"
#undef COMFUSE_BINARY_OP
};

enum class ReduceOp {
#define COMFUSE_REDUCE_OP(E, name, identity, combine, finalize, dev) E,
#include "comfuse/ops.def"
#undef COMFUSE_REDUCE_OP
};

std::string_view name_of(UnaryOp op);
std::string_view name_of(BinaryOp op);
std::string_view name_of(ReduceOp op);
std::string_view device_functor_of(UnaryOp op);
std::string_view device_functor_of(BinaryOp op);
std::string_view device_functor_of(ReduceOp op);

std::optional<UnaryOp> unary_op_from_name(std::string_view name);
std::optional<BinaryOp> binary_op_from_name(std::string_view name);
std::optional<ReduceOp> reduce_op_from_name(std::string_view name);

// fp64 reference semantics (the CPU executors' arithmetic).
double apply(UnaryOp op, double x);
double apply(BinaryOp op, double a, double b);
double reduce_identity(ReduceOp op);
double reduce_combine(ReduceOp op, double acc, double x);
double reduce_finalize(ReduceOp op, double acc, long long n);

// The causal mask of attention: the one op whose value depends on the element's position
// (its row and column in the GEMM's [M, N] output) and not on its operand alone, so it is not
// an ops.def row but its own kind (OpKind::CausalMask in graph.h, ComputeKind::CausalMask in
// spec.h). Its one description, as ops.def's rows are for the others: the name (graph text,
// spec text, messages), the fp64 semantics (every CPU executor) and the device node Psi
// instantiates (kernels/comfuse/epilogue/nodes.cuh, CausalMask<Src>).
struct CausalMaskOp {
  static constexpr std::string_view name = "causal_mask";
  static constexpr std::string_view device_node = "CausalMask";
  // -inf where the key (column) lies past the query (row): top-left aligned, row r attends to
  // columns 0..r, as torch's is_causal. `row` and `col` index the whole [M, N] output.
  static double apply(double x, int64_t row, int64_t col) {
    return col > row ? -std::numeric_limits<double>::infinity() : x;
  }
};

// rotate_half within runs of `segment` columns of the last dim (rotary position embeddings,
// transformers' rotate_half applied to each head of S columns): column j of the result reads
// column partner(j) of its operand, negated in each run's first half. Not an ops.def row: it
// reads another column of its operand (OpKind::RotateHalf, ComputeKind::RotateHalf). The device
// node (nodes.cuh, RotateHalf<Src, Segment>) reads the partner from the same thread's
// accumulator fragment S/2 columns away, so a kernel's tile spans whole runs.
struct RotateHalfOp {
  static constexpr std::string_view name = "rotate_half";
  static constexpr std::string_view device_node = "RotateHalf";
  // The column of the operand that column `col` reads, and whether it is negated.
  static int64_t partner(int64_t col, int64_t segment) {
    return col % segment < segment / 2 ? col + segment / 2 : col - segment / 2;
  }
  static bool negated(int64_t col, int64_t segment) { return col % segment < segment / 2; }
  static double apply(double partner_value, int64_t col, int64_t segment) {
    return negated(col, segment) ? -partner_value : partner_value;
  }
};

// The interleaved rotation of rotary embeddings (GPT-J's rotate_every_two, Cohere's rotate_half,
// complex-number RoPE over (even, odd) pairs): column 2i of the result reads -x[2i + 1], column
// 2i + 1 reads x[2i]. Its own kind (OpKind::RotatePairs, ComputeKind::RotatePairs); the device
// node (nodes.cuh, RotatePairs<Src>) reads the partner from the same fragment: a thread holds
// columns 2i and 2i + 1 side by side in the wgmma accumulator layout.
struct RotatePairsOp {
  static constexpr std::string_view name = "rotate_pairs";
  static constexpr std::string_view device_node = "RotatePairs";
  static int64_t partner(int64_t col) { return col ^ 1; }
  static double apply(double partner_value, int64_t col) { return col % 2 == 0 ? -partner_value : partner_value; }
};

}  // namespace comfuse
