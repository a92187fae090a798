#include "comfuse/ops.h"

#include <cmath>
#include <limits>

namespace comfuse {

std::string_view name_of(UnaryOp op) {
  switch (op) {
#define COMFUSE_UNARY_OP(E, name, expr, dev) case UnaryOp::E: return name;
#include "comfuse/ops.def"
#undef COMFUSE_UNARY_OP
  }
  return "?";
}
std::string_view name_of(BinaryOp op) {
  switch (op) {
#define COMFUSE_BINARY_OP(E, name, expr, dev) case BinaryOp::E: return name;
#include "comfuse/ops.def"
#undef COMFUSE_BINARY_OP
  }
  return "?";
}
std::string_view name_of(ReduceOp op) {
  switch (op) {
#define COMFUSE_REDUCE_OP(E, name, identity, combine, finalize, dev) case ReduceOp::E: return name;
#include "comfuse/ops.def"
#undef COMFUSE_REDUCE_OP
  }
  return "?";
}
std::string_view device_functor_of(UnaryOp op) {
  switch (op) {
#define COMFUSE_UNARY_OP(E, name, expr, dev) case UnaryOp::E: return #dev;
#include "comfuse/ops.def"
#undef COMFUSE_UNARY_OP
  }
  return "?";
}
std::string_view device_functor_of(BinaryOp op) {
  switch (op) {
#define COMFUSE_BINARY_OP(E, name, expr, dev) case BinaryOp::E: return #dev;
#include "comfuse/ops.def"
#undef COMFUSE_BINARY_OP
  }
  return "?";
}
std::string_view device_functor_of(ReduceOp op) {
  switch (op) {
#define COMFUSE_REDUCE_OP(E, name, identity, combine, finalize, dev) case ReduceOp::E: return #dev;
#include "comfuse/ops.def"
#undef COMFUSE_REDUCE_OP
  }
  return "?";
}

std::optional<UnaryOp> unary_op_from_name(std::string_view n) {
#define COMFUSE_UNARY_OP(E, name, expr, dev) if (n == name) return UnaryOp::E;
#include "comfuse/ops.def"
#undef COMFUSE_UNARY_OP
  return std::nullopt;
}
std::optional<BinaryOp> binary_op_from_name(std::string_view n) {
#define COMFUSE_BINARY_OP(E, name, expr, dev) if (n == name) return BinaryOp::E;
#include "comfuse/ops.def"
#undef COMFUSE_BINARY_OP
  return std::nullopt;
}
std::optional<ReduceOp> reduce_op_from_name(std::string_view n) {
#define COMFUSE_REDUCE_OP(E, name, identity, combine, finalize, dev) if (n == name) return ReduceOp::E;
#include "comfuse/ops.def"
#undef COMFUSE_REDUCE_OP
  return std::nullopt;
}

double apply(UnaryOp op, double x) {
  switch (op) {
#define COMFUSE_UNARY_OP(E, name, expr, dev) case UnaryOp::E: return expr;
#include "comfuse/ops.def"
#undef COMFUSE_UNARY_OP
  }
  return std::numeric_limits<double>::quiet_NaN();
}
double apply(BinaryOp op, double a, double b) {
  switch (op) {
#define COMFUSE_BINARY_OP(E, name, expr, dev) case BinaryOp::E: return expr;
#include "comfuse/ops.def"
#undef COMFUSE_BINARY_OP
  }
  return std::numeric_limits<double>::quiet_NaN();
}
double reduce_identity(ReduceOp op) {
  switch (op) {
#define COMFUSE_REDUCE_OP(E, name, identity, combine, finalize, dev) case ReduceOp::E: return identity;
#include "comfuse/ops.def"
#undef COMFUSE_REDUCE_OP
  }
  return 0.0;
}
double reduce_combine(ReduceOp op, double acc, double x) {
  switch (op) {
#define COMFUSE_REDUCE_OP(E, name, identity, combine, finalize, dev) case ReduceOp::E: return combine;
#include "comfuse/ops.def"
#undef COMFUSE_REDUCE_OP
  }
  return acc;
}
double reduce_finalize(ReduceOp op, double acc, long long n) {
  (void)n;
  switch (op) {
#define COMFUSE_REDUCE_OP(E, name, identity, combine, finalize, dev) case ReduceOp::E: return finalize;
#include "comfuse/ops.def"
#undef COMFUSE_REDUCE_OP
  }
  return acc;
}

}  // namespace comfuse
