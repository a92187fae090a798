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
#include <string_view>

#include "comfuse/graph.h"

namespace comfuse {

Graph parse_graph(const std::string& text);       // throws Error(SourceLoc, ...)
// Throws Error naming the file: not a regular file (a directory, a FIFO: never blocks on
// one), unreadable (with the OS's reason), over 16 MiB, or a parse error (line and column).
Graph parse_graph_file(const std::string& path);

// User text as a message may show it: bytes outside printable ASCII as \xNN (no terminal
// control sequence gets through), at most `max_bytes` of it.
std::string printable(std::string_view s, size_t max_bytes = 256);
// Two lines for a located error: about `width` bytes of `line` around `column` (1-based),
// escaped, and a caret under the column.
std::string excerpt(std::string_view line, int column, size_t width = 120);
std::string print_graph(const Graph& g);          // parse_graph(print_graph(g)) rebuilds g

}  // namespace comfuse
