#pragma once
// Typed views of the operator vocabulary in ops.def.
#include <optional>
#include <string_view>

namespace comfuse {

enum class UnaryOp {
#define COMFUSE_UNARY_OP(E, name, expr, dev) E,
#include "comfuse/ops.def"
#undef COMFUSE_UNARY_OP
};

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

}  // namespace comfuse
