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
// would get no jobs. Grid (clusters * cluster_m, cluster_n), cluster dims (cluster_m, cluster_n),
// or (k_splits, 1) with the splits in one hardware cluster (max_active_clusters then counts the
// scheduler's one-CTA clusters: hardware clusters x k_splits, runtime prepare()).
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
  g.cluster_x = c.hw_cluster_x();  // a split group's clusters are whole hardware clusters either way
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
// tagged bytes); fp32 partial tiles are read only after their tag says they were written, and
// tagged partial words carry their own.
struct ExchangeLayout {
  long long split_flags = 0;     // offset of the split-K tags
  long long split_partials = 0;  // offset of the split-K partial tiles
  long long tagged_bytes = 0;    // after the header: the exchange slots, the split-K tags and
                                 // tagged partial words (KernelConfig::split_words_tagged)
  long long total_bytes = 0;     // 0: no workspace
};
COMFUSE_HOST_DEVICE constexpr long long split_owner_slots(KernelConfig const& c, int max_active_clusters) {
  return (long long)(max_active_clusters / split_group_clusters(c)) * c.row_group * c.cluster_size() *
         c.consumer_wgs;
}
COMFUSE_HOST_DEVICE constexpr ExchangeLayout exchange_layout(KernelConfig const& c, int max_active_clusters) {
  ExchangeLayout l;
  if (!c.uses_exchange_workspace()) return l;
  long long const groups = max_active_clusters / split_group_clusters(c);
  long long const slots = (long long)c.exchange_slot_bytes() * groups * c.cluster_m * c.consumer_wgs;
  long long const owners = split_owner_slots(c, max_active_clusters);
  long long const flags = (owners * c.split_flag_bytes() + 127) / 128 * 128;
  l.split_flags = kExchangeHeaderBytes + slots;
  l.split_partials = l.split_flags + flags;
  long long const partials = owners * (c.k_splits - 1) * (long long)c.split_partial_bytes();
  l.tagged_bytes = slots + flags + (c.split_words_tagged() ? partials : 0);
  l.total_bytes = l.split_partials + partials;
  return l;
}
COMFUSE_HOST_DEVICE constexpr long long exchange_workspace_bytes(KernelConfig const& c, int max_active_clusters) {
  return exchange_layout(c, max_active_clusters).total_bytes;
}

// ---- B2B kernels (b2b/b2b_gemm_sm90.cuh): a job is job_rows() rows x tile_n2 columns of O in
// one batch, run by one consumer warp group (or, paired, by both: each its tile_m rows). A
// scheduling unit (a CTA, or a cluster splitting N1) runs jobs_per_unit() jobs at once; unit u
// walks slots j = jobs_per_unit() * u + (its warp group, unpaired), then j + stride, ... with
// stride = jobs_per_unit() * units (one round gives every warp group one slot).
struct B2bJob {
  int batch, m_block, n2_block;
  bool valid;  // a job in this slot (a causal pair's empty half has none: skip it)
  bool done;   // past the last slot: the warp group stops
};

COMFUSE_HOST_DEVICE constexpr int b2b_job_count(B2bConfig const& c, int batches, int M, int N2) {
  return batches * ceil_div(M, c.job_rows()) * ceil_div(N2, c.tile_n2);
}

// With a causal mask, row blocks go in pairs (below): a pair's two jobs, the middle block of an
// odd count alone in its pair.
COMFUSE_HOST_DEVICE constexpr int b2b_causal_pairs(B2bConfig const& c, int batches, int M, int N2) {
  return batches * ceil_div(N2, c.tile_n2) * ceil_div(ceil_div(M, c.job_rows()), 2);
}

// Slots: one per job; with a causal mask two per pair of row blocks, and, paired, whole rounds
// of `units` pairs (the last one partly empty).
COMFUSE_HOST_DEVICE constexpr int b2b_slot_count(B2bConfig const& c, int batches, int M, int N2, int units) {
  if (!c.causal) return b2b_job_count(c, batches, M, N2);
  int const pairs = b2b_causal_pairs(c, batches, M, N2), u = units > 0 ? units : 1;
  return c.paired ? 2 * u * ceil_div(pairs, u) : 2 * pairs;
}

// The job in slot j of a grid of `units` units. Without a mask every job walks all of N1: batch
// major (a batch's W1 and W2 stay hot in L2 while its row blocks run), then row blocks, then O
// blocks. With a causal mask, row block r walks r + 1 blocks' worth of N1 (b2b_chunks), and a
// persistent grid is only as fast as its busiest SM. So a unit takes a PAIR of row blocks of one
// batch, i and its mirror mb - 1 - i: every pair walks about mb + 1 blocks' worth. Unpaired, the
// CTA's two warp groups take the pair's two jobs at once and share the SM's tensor cores (one's
// F beside the other's GEMMs) until the short job ends; the warp group that takes the long one
// alternates by round, so that over two rounds each walks as much as the other. Paired, the CTA
// takes the pair's long job in one round and its short one in the next. Pairs are batch major,
// as the jobs without a mask.
COMFUSE_HOST_DEVICE constexpr B2bJob b2b_job(B2bConfig const& c, int j, int batches, int M, int N2, int units) {
  int const mb = ceil_div(M, c.job_rows()), nb = ceil_div(N2, c.tile_n2);
  int const u = units > 0 ? units : 1;
  if (j >= b2b_slot_count(c, batches, M, N2, u)) return {0, 0, 0, false, true};
  if (!c.causal) {
    int const n2_block = j % nb, rest = j / nb;
    return {rest / mb, rest % mb, n2_block, true, false};
  }
  int q = 0;
  bool takes_long = false;
  if (c.paired) {  // rounds of `u` slots: pair q's long job in an even round, its short one in the next
    int const round = j / u;
    q = round / 2 * u + j % u;
    takes_long = round % 2 == 0;
    if (q >= b2b_causal_pairs(c, batches, M, N2)) return {0, 0, 0, false, false};
  } else {
    q = j / 2;
    takes_long = (j % 2) == (q / u % 2);
  }
  int const n2_block = q % nb, rest = q / nb, half = ceil_div(mb, 2);
  int const i = rest % half, batch = rest / half;
  if (takes_long) return {batch, mb - 1 - i, n2_block, true, false};
  if (i == mb - 1 - i) return {batch, 0, 0, false, false};  // the middle block: its pair has one job
  return {batch, i, n2_block, true, false};
}

// N1 chunks a job walks: all of N1, or with a causal mask only those that reach its rows.
COMFUSE_HOST_DEVICE constexpr int b2b_chunks(B2bConfig const& c, int m_block, int M, int N1) {
  int const last_row = (m_block + 1) * c.job_rows();
  int const cols = c.causal ? (last_row < N1 ? last_row : N1) : N1;
  return ceil_div(cols, c.chunk_n1);
}

// With N1 split over a cluster (B2bConfig::cluster_n1 = C), the CTA of rank r walks a job's
// chunks r, r + C, r + 2C, ...: as many as the others or one fewer, none where the job has
// fewer chunks than the cluster has CTAs. Interleaved, so a causal job's short walk still
// spreads over the whole cluster.
COMFUSE_HOST_DEVICE constexpr int b2b_rank_chunks(B2bConfig const& c, int chunks, int rank) {
  return rank < chunks ? (chunks - rank + c.cluster_n1 - 1) / c.cluster_n1 : 0;
}

// Scheduling units: CTAs, or clusters of cluster_n1 CTAs that take each job together (`units`
// in b2b_job counts clusters then). One CTA per SM at most. Enough units that each takes one
// round of slots (paired and causal: one pair over two rounds), no more than fit at once.
// Returns CTAs.
COMFUSE_HOST_DEVICE constexpr int b2b_grid(B2bConfig const& c, int batches, int M, int N2, int max_active_ctas) {
  int const units = c.causal && c.paired ? b2b_causal_pairs(c, batches, M, N2)
                                         : ceil_div(b2b_slot_count(c, batches, M, N2, 1), c.jobs_per_unit());
  int const fit = max_active_ctas / c.cluster_n1;
  return (units < fit ? (units > 0 ? units : 1) : (fit > 0 ? fit : 1)) * c.cluster_n1;
}

}  // namespace comfuse
