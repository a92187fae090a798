#pragma once
// Helpers shared by the CPU executors (src/interp only).
#include <map>
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
const Tensor& take_input(const Node& n, const Bindings& dims, const TensorMap& inputs);

// How often evaluating g's outputs reads each node's value: once per needed consumer
// operand and once per graph output; 0 for nodes no output needs (the executors skip them
// and free a value when its count reaches 0).
std::vector<int> read_counts(const Graph& g);

// run_spec on arguments held elsewhere (run_lowered's values, without copying them).
TensorMap run_spec_refs(const FusionSpec& s, const Bindings& dims, const std::map<std::string, const Tensor*>& args,
                        const ReduceTiling& t);

// Evaluates a non-Input node from its operand values (in `n.inputs` order); `sample`: the
// operands hold some rows of a larger problem (interp.h, RowSample).
Tensor eval_node(const Node& n, const Bindings& dims, const std::vector<const Tensor*>& in,
                 const RowSample& sample = {});

}  // namespace comfuse::interp_detail
