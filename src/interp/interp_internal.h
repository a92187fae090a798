#pragma once
// Helpers shared by the CPU executors (src/interp only).
#include <optional>
#include <string>
#include <vector>

#include "comfuse/interp.h"

namespace comfuse::interp_detail {

std::string shape_str(const std::vector<int64_t>& s);
std::vector<int64_t> concrete_shape(const Shape& s, const Bindings& b);  // throws on unbound dims
std::optional<int64_t> try_resolve(const Dim& d, const Bindings& b);
Tensor filled(std::vector<int64_t> shape, double v = 0.0);
Tensor rounded(Tensor t, DType d);

// acc = A x B in fp64, k ascending (the one order both executors use).
Tensor matmul(const Tensor& a, const Tensor& b, BLayout layout);

// The graph input `n`, checked against its declared shape (Error naming it otherwise).
Tensor take_input(const Node& n, const Bindings& dims, const TensorMap& inputs);

// Evaluates a non-Input node from its operand values (in `n.inputs` order).
Tensor eval_node(const Node& n, const Bindings& dims, const std::vector<const Tensor*>& in);

}  // namespace comfuse::interp_detail
