// comfuse/scheduler/grid.cuh: the persistent tile scheduler's shape, for host and device: how a
// problem divides into jobs, the grid a launch takes, and the workspaces sized for that grid.
// scheduler/tile_scheduler.cuh walks the same jobs on the device; the runtime launches with
// launch_grid(). Host and device, NVRTC-compatible.
//
// A job is cluster_m row blocks x one N group: the row_peers() * n_tiles column blocks that the
// CTAs sharing those rows walk together (a cluster along N, or a row group of clusters).
// With split-K every job is run by k_splits such groups of clusters, one per share of K: a
// "split group" of row_group * k_splits clusters walks the jobs together.
#pragma once
#include "../config.cuh"

namespace comfuse {

COMFUSE_HOST_DEVICE constexpr int job_rows(KernelConfig const& c, int M) { return ceil_div(ceil_div(M, c.tile_m), c.cluster_m); }
COMFUSE_HOST_DEVICE constexpr int job_cols(KernelConfig const& c, int N) {
  return ceil_div(ceil_div(N, c.tile_n), c.row_peers() * c.n_tiles);
}
COMFUSE_HOST_DEVICE constexpr int job_count(KernelConfig const& c, int M, int N) { return job_rows(c, M) * job_cols(c, N); }

struct LaunchGrid {
  int grid_x = 0, grid_y = 0;        // grid (z = 1)
  int cluster_x = 1, cluster_y = 1;  // cluster dims (z = 1)
  int clusters = 0;                  // clusters launched
  char const* error = nullptr;       // why there is no grid
};

// Clusters that walk the same jobs: a row group of each K-split.
COMFUSE_HOST_DEVICE constexpr int split_group_clusters(KernelConfig const& c) { return c.row_group * c.k_splits; }

// One cluster per resident cluster slot (persistent), at most one split group per job. A split
// group's clusters must all be resident at once (the L2 exchange and the owner of a split tile
// wait on them), so the grid holds whole split groups only: clusters past the last whole group
// would get no jobs. Clusters along N: grid (clusters, cluster_n), along M: grid
// (clusters * cluster_m, 1).
COMFUSE_HOST_DEVICE constexpr LaunchGrid launch_grid(KernelConfig const& c, int M, int N, int max_active_clusters) {
  LaunchGrid g;
  int const groups_max = max_active_clusters / split_group_clusters(c);
  if (groups_max < 1) {
    g.error = "a row group's clusters (times its K-splits) do not fit on the GPU at once: plan a smaller row group or "
              "fewer K-splits";
    return g;
  }
  int const jobs = job_count(c, M, N);
  int const groups = jobs < groups_max ? (jobs > 0 ? jobs : 1) : groups_max;
  g.clusters = groups * split_group_clusters(c);
  g.grid_x = g.clusters * c.cluster_m;
  g.grid_y = c.cluster_n;
  g.cluster_x = c.cluster_m;
  g.cluster_y = c.cluster_n;
  return g;
}

// Workspaces for a grid of at most max_active_clusters clusters (bytes; 0: none).
// The global stash: one region per CTA (the CTA index blockIdx.x * gridDim.y + blockIdx.y).
COMFUSE_HOST_DEVICE constexpr long long stash_workspace_bytes(KernelConfig const& c, int max_active_clusters) {
  return (long long)c.stash_workspace_bytes_per_cta() * max_active_clusters * c.cluster_size();
}
// The exchange workspace (Params::exchange), laid out for a grid of at most
// max_active_clusters clusters (Params::workspace_clusters: every launch of a kernel uses the
// one layout its workspace was made with):
//   the header (ExchangeHeader, config.cuh: the launch counter);
//   the L2 row exchange: one slot per (split group, rank along M, consumer warp group)
//     (TileScheduler::exchange_slot; cluster/global_exchange.cuh);
//   split-K tags: k_splits words per owner warp group (TileScheduler::split_slot;
//     scheduler/split_k.cuh);
//   split-K partial tiles: k_splits - 1 per owner warp group.
// The header and the tagged words are zeroed once after allocation (init_exchange_workspace)
// and again by the kernel where the tags' epoch bits wrap (ExchangeHeader::slot_bytes: the
// tagged bytes); the partial tiles are read only after their tag says they were written.
struct ExchangeLayout {
  long long split_flags = 0;     // offset of the split-K tags
  long long split_partials = 0;  // offset of the split-K partial tiles
  long long tagged_bytes = 0;    // after the header: the exchange slots and the split-K tags
  long long total_bytes = 0;     // 0: no workspace
};
COMFUSE_HOST_DEVICE constexpr long long split_owner_slots(KernelConfig const& c, int max_active_clusters) {
  return (long long)(max_active_clusters / split_group_clusters(c)) * c.row_group * c.cluster_size() *
         Sm90::kConsumerWGs;
}
COMFUSE_HOST_DEVICE constexpr ExchangeLayout exchange_layout(KernelConfig const& c, int max_active_clusters) {
  ExchangeLayout l;
  if (!c.uses_exchange_workspace()) return l;
  long long const groups = max_active_clusters / split_group_clusters(c);
  long long const slots = (long long)c.exchange_slot_bytes() * groups * c.cluster_m * Sm90::kConsumerWGs;
  long long const owners = split_owner_slots(c, max_active_clusters);
  long long const flags = (owners * c.split_flag_bytes() + 127) / 128 * 128;
  l.split_flags = kExchangeHeaderBytes + slots;
  l.split_partials = l.split_flags + flags;
  l.tagged_bytes = slots + flags;
  l.total_bytes = l.split_partials + owners * (c.k_splits - 1) * (long long)c.split_partial_bytes();
  return l;
}
COMFUSE_HOST_DEVICE constexpr long long exchange_workspace_bytes(KernelConfig const& c, int max_active_clusters) {
  return exchange_layout(c, max_active_clusters).total_bytes;
}

// ---- B2B kernels (b2b/b2b_gemm_sm90.cuh): a job is one consumer warp group's tile_m rows x
// tile_n2 columns of O in one batch; each warp group walks its own jobs (persistent).
struct B2bJob {
  int batch, m_block, n2_block;
  bool valid;
};

COMFUSE_HOST_DEVICE constexpr int b2b_job_count(B2bConfig const& c, int batches, int M, int N2) {
  return batches * ceil_div(M, c.tile_m) * ceil_div(N2, c.tile_n2);
}

// Job j. With a causal mask the row blocks run last-first: their jobs walk the most chunks, and
// a persistent grid should start the long ones first.
COMFUSE_HOST_DEVICE constexpr B2bJob b2b_job(B2bConfig const& c, int j, int batches, int M, int N2) {
  int const mb = ceil_div(M, c.tile_m), nb = ceil_div(N2, c.tile_n2);
  if (j >= batches * mb * nb) return {0, 0, 0, false};
  int const n2_block = j % nb, rest = j / nb;
  int const m_rev = rest % mb, batch = rest / mb;
  return {batch, c.causal ? mb - 1 - m_rev : m_rev, n2_block, true};
}

// N1 chunks a job walks: all of N1, or with a causal mask only those that reach its rows.
COMFUSE_HOST_DEVICE constexpr int b2b_chunks(B2bConfig const& c, int m_block, int M, int N1) {
  int const last_row = (m_block + 1) * c.tile_m;
  int const cols = c.causal ? (last_row < N1 ? last_row : N1) : N1;
  return ceil_div(cols, c.chunk_n1);
}

// One CTA per SM at most, two consumer warp groups each walking their own jobs.
COMFUSE_HOST_DEVICE constexpr int b2b_grid(B2bConfig const& c, int batches, int M, int N2, int max_active_ctas) {
  int const ctas = ceil_div(b2b_job_count(c, batches, M, N2), Sm90::kConsumerWGs);
  return ctas < max_active_ctas ? (ctas > 0 ? ctas : 1) : max_active_ctas;
}

}  // namespace comfuse
