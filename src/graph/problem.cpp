// The problem-size rule (graph.h): the planner and the CPU executors call these, so a size
// is refused the same way, with the same words, wherever it enters.
#include <fmt/format.h>

#include "comfuse/graph.h"

namespace comfuse {

std::string dim_label(const Dim& d, const std::string& role) {
  return d.sym.empty() || d.sym == role ? role : fmt::format("{} ({})", role, d.sym);
}

void check_dim_size(const std::string& name, int64_t v) {
  if (dim_size_ok(v)) return;
  if (v < 1) throw Error(fmt::format("{} = {}: a dimension must be at least 1", name, v));
  if (v > kMaxDimSize)
    throw Error(fmt::format("{} = {} exceeds {} (2^31 - 256): the kernel holds M, N and K in 32-bit integers and "
                            "rounds them up to whole tiles of up to 256",
                            name, v, kMaxDimSize));
}

void check_problem_size(int64_t m, int64_t n, int64_t k, const std::string& m_name, const std::string& n_name,
                        const std::string& k_name) {
  check_dim_size(m_name, m);
  check_dim_size(n_name, n);
  check_dim_size(k_name, k);
  const int64_t tiles = ((m + 63) / 64) * ((n + 63) / 64);  // < 2^50: no overflow after the checks above
  if (tiles > kMaxTiles64)
    throw Error(fmt::format("{} x {} = {} x {} is {} tiles of 64 x 64; the kernel numbers tiles in 32-bit integers "
                            "(at most {})",
                            m_name, n_name, m, n, tiles, kMaxTiles64));
}

}  // namespace comfuse
