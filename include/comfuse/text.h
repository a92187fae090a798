#pragma once
// The graph text format: one statement per line.
//
//   # comment                           (also after a statement)
//   input x: bf16[M, K]                 tensor, vector ([N]), column ([M, 1]) or scalar ([])
//   acc = matmul(x, w)                  B given N x K (Linear layout); layout=kn for K x N
//   y = add(acc, bias)                  every op of ops.def by name; numbers are constants
//   z = layer_norm(y, gamma, beta, eps=1e-5)
//   s = sum(z)                          reductions over the last dim (dim=0 for the first)
//   c = cast(z, bf16)
//   output z: bf16                      stored outputs, rounded to the dtype given
//
// Errors name line and column. The parser never crashes or hangs on any input.
#include <string>

#include "comfuse/graph.h"

namespace comfuse {

Graph parse_graph(const std::string& text);       // throws Error(SourceLoc, ...)
Graph parse_graph_file(const std::string& path);  // throws Error naming the file
std::string print_graph(const Graph& g);          // parse_graph(print_graph(g)) rebuilds g

}  // namespace comfuse
