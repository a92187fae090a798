// comfuse/scheduler/tile_scheduler.cuh: persistent, cluster-aware tile scheduler (device half;
// scheduler/grid.cuh is the host half: the job counts and the grid it launches with).
//
// Grid: dim3(num_clusters, ClusterN, 1), cluster dims (1, ClusterN, 1). A cluster walks
// "cluster tiles": one BM-row block times ClusterN adjacent BN-column blocks. The CTA of rank
// r along N (blockIdx.y) takes column block ct.n * ClusterN + r of the SAME rows, so every
// CTA of a cluster row holds the same M rows at the same time (the cross-CTA row reductions
// and the multicast of A rely on this; with ClusterM > 1, below, a cluster has ClusterM
// rows). Cluster c takes cluster tiles c, c + num_clusters, c + 2 num_clusters, ...; all CTAs
// of a cluster see the same sequence, the k-th one of which goes to consumer warp group
// k % consumer_wgs (PingPong).
//
// Raster: cluster tiles are numbered in bands of `group` M-blocks (raster_along_n == 0;
// inside a band M moves fastest, so a wave of tiles shares few B panels and few A panels),
// or in bands of `group` N-cluster-blocks (raster_along_n != 0). Column blocks past N (when
// the N-block count is no multiple of ClusterN) still run: their CTA loads its A slice
// for the peers; TMA zero-fills their B and clips their stores.
//
// ClusterM > 1: grid dim3(num_clusters * ClusterM, ClusterN, 1), cluster dims (ClusterM,
// ClusterN, 1); a cluster tile is ClusterM adjacent BM-row blocks times ClusterN column blocks
// (the CTAs of a column share B, those of a row share A: multicasts); CTA rank_m
// (blockIdx.x % ClusterM) takes row block ct.m * ClusterM + rank_m. Row blocks past M still
// run, as above (their B slice feeds the peers). Both > 1 serves a row reduction over DSMEM
// along N (config.cuh check()).
// NTiles > 1 (the Stash, kernel/fused_gemm_sm90.cuh): a cluster tile ("job") spans
// ClusterN * NTiles column blocks; tile(k) gives the job's first column block of this CTA,
// ct.n * ClusterN * NTiles + rank, and the CTA's tile t of the job is that + t * ClusterN
// (interleaved: at every tile the cluster covers ClusterN adjacent column blocks). All CTAs of
// a cluster see the same jobs; PingPong consumer k % consumer_wgs takes job k.
// RowGroup = G > 1 (row reductions across clusters, cluster/global_exchange.cuh): G consecutive
// clusters form a row group that walks jobs together, like one cluster of G x ClusterN CTAs along
// N: the job's column blocks are spread over G * ClusterN CTAs, CTA (cluster g*G + i, rank r)
// taking rank_n = i * ClusterN + r. Group j takes jobs j, j + groups, ...: every CTA of a group
// sees the same job sequence (the exchange's liveness argument needs it). The host launches
// whole groups; clusters past the last whole group get no jobs.
// KSplits = S > 1 (split-K, scheduler/split_k.cuh): a split group of G * S consecutive clusters
// walks the jobs together; its S row groups (split s: clusters s*G .. s*G + G-1 of the split
// group) hold the same columns and run the mainloop over k-blocks [s kt / S, (s+1) kt / S).
// Split 0 owns the tiles: it adds the other splits' partials and runs the epilogue (and the
// row exchange among its row group); the other splits only run mainloops. With the splits in
// one hardware cluster (KernelConfig::splits_in_cluster) the split varies fastest instead: CTA i
// of a split group is split i % S of the row group's member i / S, so each hardware cluster (S
// consecutive CTAs) holds one tile's splits, its cluster rank the split.
#pragma once
#include "../common.cuh"
#include "../params.cuh"
#include "grid.cuh"

namespace comfuse {

struct TileCoord {
  int m_block;  // in units of BM
  int n_block;  // in units of BN
  bool valid;
};

template <KernelConfig C>
struct TileScheduler {
  static constexpr int ClusterN = C.cluster_n, ClusterM = C.cluster_m, NTiles = C.n_tiles, RowGroup = C.row_group;
  static constexpr int KSplits = C.k_splits, SplitGroup = RowGroup * KSplits;
  static constexpr int PeersN = C.row_peers();  // CTAs that hold the same rows
  int tiles_m, cl_tiles_n, num_cluster_tiles;  // tiles_m: in cluster tiles (ClusterM row blocks)
  int group, along_n;
  int cluster_id, num_clusters, rank, rank_m;
  int group_id, num_groups, rank_n;  // split groups of SplitGroup clusters (1: a group is a cluster)
  int split, in_group;               // this cluster's K-split, its cluster index within its row group
  int k_begin, k_count;              // the k-blocks of K this CTA's mainloops take

  COMFUSE_DEVICE explicit TileScheduler(Params const& p) {
    tiles_m = job_rows(C, p.M);
    cl_tiles_n = job_cols(C, p.N);
    num_cluster_tiles = tiles_m * cl_tiles_n;
    group = p.raster_group > 0 ? p.raster_group : 1;
    along_n = p.raster_along_n;
    cluster_id = ClusterM > 1 ? int(blockIdx.x) / ClusterM : int(blockIdx.x);
    num_clusters = ClusterM > 1 ? int(gridDim.x) / ClusterM : int(gridDim.x);
    rank = blockIdx.y;
    rank_m = ClusterM > 1 ? int(blockIdx.x) % ClusterM : 0;
    group_id = cluster_id / SplitGroup;
    num_groups = num_clusters / SplitGroup;
    // Splits in one hardware cluster (C.splits_in_cluster, cluster_m = 1): a tile's KSplits CTAs
    // are consecutive (the hardware cluster's ranks are the splits); else a split is a row group.
    split = C.splits_in_cluster ? cluster_id % KSplits : (cluster_id % SplitGroup) / RowGroup;
    in_group = C.splits_in_cluster ? (cluster_id / KSplits) % RowGroup : cluster_id % RowGroup;
    rank_n = in_group * ClusterN + rank;
    int const kt = ceil_div(p.K, Sm90::kTileK);
    k_begin = split * kt / KSplits;
    k_count = (split + 1) * kt / KSplits - k_begin;
  }

  // Split-K: this CTA runs the epilogue of its tiles (split 0), or only passes partials on.
  COMFUSE_DEVICE bool owns_tiles() const { return split == 0; }
  // Split-K: the owner warp group's slot of tags and partial tiles that every split of the
  // same tile, rank and warp group uses (grid.cuh's exchange_layout sizes them).
  COMFUSE_DEVICE int split_slot(int wg) const {
    return ((group_id * RowGroup + in_group) * (ClusterM * ClusterN) + rank_m * ClusterN + rank) * C.consumer_wgs + wg;
  }

  // The exchange slot of consumer warp group wg (cluster/global_exchange.cuh): one per
  // (row group, rank along M, warp group); grid.cuh's exchange_workspace_bytes sizes the workspace to match.
  COMFUSE_DEVICE int exchange_slot(int wg) const { return (group_id * ClusterM + rank_m) * C.consumer_wgs + wg; }

  // The k-th tile of this CTA (k = 0, 1, 2, ...).
  COMFUSE_DEVICE TileCoord tile(int k) const {
    if (group_id >= num_groups) return {0, 0, false};
    int t = group_id + k * num_groups;
    if (t >= num_cluster_tiles) return {0, 0, false};
    // Bands of `group` blocks along the major axis; the other axis is walked inside.
    int major = along_n ? cl_tiles_n : tiles_m;
    int minor = along_n ? tiles_m : cl_tiles_n;
    int band_size = group * minor;
    int band = t / band_size;
    int r = t - band * band_size;
    int in_band = min(group, major - band * group);
    int a = band * group + r % in_band;  // along the banded axis
    int b = r / in_band;                 // along the other axis
    int m = along_n ? b : a;
    int ncl = along_n ? a : b;
    return {m * ClusterM + rank_m, ncl * PeersN * NTiles + rank_n, true};
  }
};

}  // namespace comfuse
