// comfuse/config.cuh: ONE description of a fused-GEMM kernel (KernelConfig), and the sm_90
// limits every layer checks against (Sm90).
//
// The planner fills a KernelConfig; Ψ writes it into the generated source once, as the kernel
// template's argument (`constexpr comfuse::KernelConfig kConfig{...}`); the kernel is built from
// it; the runtime sizes the dynamic SMEM, the workspaces and the grid from the same value with
// the functions below (scheduler/grid.cuh for the grid). Nothing is read back from a compiled
// kernel. check() is the one place that says why a configuration cannot be built (what CUTLASS
// collectives call can_implement): the kernel static_asserts it, the planner filters with it.
//
// Host and device, NVRTC-compatible: no CUDA, CuTe or standard-library headers.
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define COMFUSE_HOST_DEVICE __host__ __device__
#else
#define COMFUSE_HOST_DEVICE
#endif

namespace comfuse {

// sm_90 facts and the kernel's fixed split of them.
struct Sm90 {
  static constexpr int kWarpGroupThreads = 128;
  static constexpr int kRegisters = 64 * 1024;  // the SM's register file (one CTA per SM)
  // The default split: a producer WG and 2 consumer WGs (the B2B kernels' always; a single-GEMM
  // kernel's KernelConfig::consumer_wgs may ask for more, with fewer registers each).
  static constexpr int kConsumerWGs = 2;
  static constexpr int kMaxConsumerWGs = 3;  // 4 would leave 112 registers each (below): spills
  static constexpr int kThreads = (1 + kConsumerWGs) * kWarpGroupThreads;  // producer WG + 2 consumer WGs
  // setmaxnreg split of the SM's 64K registers (one CTA per SM): 40 * 128 + 232 * 256 = 64512.
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;
  static constexpr int kSmemCapacity = 227 * 1024;  // dynamic SMEM one block may opt into
  // The kernels declare their dynamic SMEM this aligned (extern __shared__ __align__, as the
  // 128-byte swizzle atoms need: they repeat every 1024 bytes) and check it at entry
  // (smem_base): no bytes are budgeted to realign a base.
  static constexpr int kSmemAlign = 1024;
  static constexpr int kMaxClusterSize = 16;        // non-portable cluster size limit
  static constexpr int kAbBytes = 2;                // A and B are 16-bit (bf16 or f16)
  static constexpr int kTileK = 128 / kAbBytes;     // one 128-byte swizzled row of A or B per TMA box
  static constexpr int kMaxAccumulatorsPerThread = 128;  // one consumer WG's fp32 tile in registers
  static constexpr int kMaxNTiles = 64;             // N-tiles one CTA walks per job
  static constexpr int kMaxRowGroup = 64;           // clusters of one row group
  static constexpr int kMaxKSplits = 16;            // K-splits of one tile (split-K)
  static constexpr int kSplitGatherLoadsInFlight = 14;  // 16-byte loads a thread keeps in flight beside its
                                                        // accumulators when the owner sums partial rows in SMEM:
                                                        // 56 registers (twice that spills, SASS)
  static constexpr int kRingStagesDefault = 8;      // the planner's deepest mainloop ring, but for M <= 256's
                                                    // stream-bound plans (calibration.cpp kStreamRing)
  static constexpr int kMaxRingStages = 16;         // the deepest ring a forced plan may ask for (SMEM permitting)
  // Params slots (params.cuh).
  static constexpr int kMaxOutputs = 4;  // Store nodes (output tensors) of an epilogue
  static constexpr int kMaxVectors = 8;  // RowBroadcast / ColBroadcast operands
  static constexpr int kMaxScalars = 8;  // ScalarArg operands
  static constexpr int kMaxTileInputs = 4;  // TileInput operands ([M, N] tensors read by TMA)
  static constexpr int kMaxColOutputs = 4;  // StoreCol nodes ([M, 1] outputs)
  // What one kernel's epilogue templates may hold and still JIT-compile (stage.cuh): each
  // reduction nests a stage, each node is a tuple element, and both recurse at instantiation.
  // Measured with NVRTC 13.0: 16 reductions 10 s, 128 nodes in a stage 17 s, 182 nodes 28 s;
  // 242 nodes, or a few hundred reductions, exceed its instantiation depth (and nvcc's retry ran
  // minutes). Real epilogues stay far below: 5 reductions, 17 nodes in a stage.
  static constexpr int kMaxReductions = 16;
  static constexpr int kMaxStageNodes = 128;
};

// How the CTAs that share a row finish a row reduction.
//   PeerToPeer / LeaderFollower: the row's CTAs are one cluster along N and exchange over DSMEM
//     (cluster/dsmem.cuh): every CTA pushes its partials to every peer, or to a leader that
//     reduces and pushes the result back.
//   L2Exchange: the row's CTAs are a row group of clusters of the persistent grid and exchange
//     through an L2 workspace (cluster/global_exchange.cuh).
//   None: no reduction crosses a CTA.
enum class Aggregation : int { None = 0, PeerToPeer = 1, LeaderFollower = 2, L2Exchange = 3 };

// Where a CTA walking several N-tiles of a row block keeps the earlier tiles' bypassed value
// (epilogue/stash.cuh): nowhere (one N-tile, or nothing tile-shaped crosses a reduction), in
// SMEM beside the ring, or in a global workspace the L2 mostly holds.
enum class StashSpace : int { None = 0, Smem = 1, Workspace = 2 };

COMFUSE_HOST_DEVICE constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }
COMFUSE_HOST_DEVICE constexpr int align_up(int v, int a) { return (v + a - 1) / a * a; }

// Bytes of one consumer WG's DSMEM channel (cluster/dsmem.cuh, RowAllReduce::Storage): two
// round-parity buffers of one fp32 per row and peer, and two mbarriers; 128-byte aligned.
COMFUSE_HOST_DEVICE constexpr int dsmem_channel_bytes(int rows, int cluster_n) {
  return align_up(2 * cluster_n * rows * 4 + 16, 128);
}

// A job of a 64-row warp group whose rows all sit in warps 0 and 1 while warp 0's second row slot
// holds some (the wgmma layout: warp w holds rows 16 w + lane / 4 + 8 h): warps 2 and 3 are free to
// take warps 0 and 1's second row slots of a pair round (cluster/global_exchange.cuh).
COMFUSE_HOST_DEVICE constexpr bool pair_hand_over_rows(int rows) { return rows > 8 && rows <= 32; }

// Bytes of one consumer WG's SMEM for the L2 exchange's pair rounds (cluster/global_exchange.cuh,
// GlobalRowAllReduce::PairHandOver): where a 64-row warp group's two row slots of a pair round do
// not fit one poll (more than 16 peers), warps 2 and 3 merge warps 0 and 1's second slots at
// decode rows and hand them over: two round parities x 2 warps x 8 rows x 2 fp32 statistics.
COMFUSE_HOST_DEVICE constexpr int l2_exchange_smem_bytes(int rows, int peers) {
  return rows == 64 && peers > 16 ? 2 * 2 * 8 * 2 * 4 : 0;
}

// Split-K over DSMEM (KernelConfig::splits_in_cluster, cluster/split_hand_over.cuh): a job's
// hand-over takes one piece per warp whose rows start below the job's rows_left (warp w holds
// rows 16 w.. of each m64 block), so one at decode (M <= 16).
COMFUSE_HOST_DEVICE constexpr int split_hand_over_pieces(int rows_left) {
  return rows_left >= 64 ? 4 : (rows_left + 15) / 16;
}

struct KernelConfig {
  // Mainloop.
  bool b_kmajor = true;   // B is N x K (K contiguous: the Linear weight); else K x N
  int tile_m = 128;       // rows of a CTA tile
  int tile_n = 128;       // columns of a CTA tile
  int ring_stages = 4;    // depth of the SMEM ring of A/B k-blocks (not the epilogue's stages)
  int wgs_per_tile = 1;   // 1: PingPong (each consumer WG owns a tile); 2: cooperative (both share one)
  int mma_depth = 1;      // k-blocks of wgmma a consumer leaves in flight
  // Consumer warp groups of a CTA. PingPong with 3 (64-row tiles, fewer registers each): the
  // tensor cores still serve one consumer at a time, in turn, while two run their epilogues
  // beside it. Forced only: MEASURED slower wherever tried (three epilogues at once each ran
  // 1.6-1.7x as long, their row group's rounds stretched; bench/NOTES.md Stop 41).
  int consumer_wgs = Sm90::kConsumerWGs;
  int cluster_m = 1;      // clusters along M share the B tile (TMA multicast)
  int cluster_n = 1;      // clusters along N share the A tile (TMA multicast) and a row's reduction
                          // (both > 1: a 2-D cluster, CTA rank rank_m + cluster_m * rank_n)
  // Work division.
  int n_tiles = 1;        // N-tiles one CTA walks per job (a row too long for the row's CTAs)
  // PingPong with several N-tiles a job: the two consumers' jobs go in pairs, their tiles taking
  // the tensor cores in TurnOrder (scheduler/turn_order.cuh): consumer 0's first turn_lead tiles
  // alone, then the two in turn, then consumer 1's last turn_lead alone. 0: a job at a time (as is
  // n_tiles, the planner writes 0).
  int turn_lead = 0;
  int row_group = 1;      // clusters whose CTAs share a row (Aggregation::L2Exchange)
  int k_splits = 1;       // clusters that each take 1/k_splits of K of the same tiles (split-K, below)
  bool splits_in_cluster = false;  // a tile's k_splits CTAs form one hardware cluster and hand their
                                   // partial tiles to the owner over DSMEM (split-K, below)
  // Epilogue.
  bool row_reduction = false;              // some stage of the epilogue ends in a row reduction
  Aggregation aggregation = Aggregation::None;
  StashSpace stash_space = StashSpace::None;
  int stash_elem_bytes = 0;                // 4: fp32, 2: bf16, 0: nothing stashed
  bool stash_centers = false;              // bf16 values about each tile's row centers (epilogue/
                                           // stash.cuh Centered: the root stage's online pair)
  int epilogue_smem_bytes = 0;             // one consumer WG's epilogue SMEM: every stage's node storage
                                           // and the channel's (the planner's model; the kernel
                                           // static_asserts that it is exact)
  bool begin_early = false;                // a warp group's first job issues its begin's loads
                                           // (its vectors, into registers) before its mainloop:
                                           // one-wave plans, whose epilogue is the critical path
                                           // (one N-tile a job)
  // TMA-store staging buffers of each tile output (epilogue/nodes.cuh Store): with 2, a subtile's
  // store reads one while the next subtile is written into the other, and the warp group waits
  // only for the store before last; with 1 it waits for each subtile's store to have read the
  // buffer before it writes the next (the store's whole SMEM read on the epilogue's path).
  int store_stages = 1;
  int ring_input_bytes = 0;                // > 0: the root stage's [M, N] tile inputs ride the
                                           // mainloop's ring, one extra slot after each tile's
                                           // k-blocks (this many bytes of it), read from SMEM by
                                           // the epilogue; 0: each fragment reads them from L2
  // A gated GEMM (SwiGLU's up and gate projections): a second B operand (Params::tma_b3) shares
  // A's tiles. Each ring slot's B tile is tile_n rows of B then tile_n rows of B3 at the same
  // columns, one wgmma of 2 x tile_n columns computes both, and the epilogue's tile of tile_n
  // columns reads A B^T from the accumulator's first half (AccEntry) and A B3^T from its second
  // (GateEntry): in the wgmma layout a thread holds column j of both halves.
  bool gated = false;
  // All of M fewer rows than one tile (decode, one row block, no A multicast): A's TMA box holds
  // this many rows (M rounded up to the 8-row swizzle atom), 0: tile_m. TMA spends time on the
  // rows a box holds past M, zero-filled all the same (bench/NOTES.md, "A boxes past M"), so they
  // are not loaded; their SMEM keeps stale values, which reach only accumulator rows >= M, which
  // nothing stores or reduces with rows < M. A compile-time choice: a runtime one cost full-box
  // plans 15% (a 64x64 stream of B, same call).
  int a_box_rows = 0;
  // Split-K through L2: the owner's warp group sums the other splits' partial rows in SMEM, every
  // thread a share of them, their loads in flight together (scheduler/split_k.cuh SplitK::gather):
  // this many rows, A's box at decode (a_box_rows > 0), else the warp group's whole tile
  // (epi_rows()); 0: each thread loads its own accumulators' partials, a row slot at a time, which
  // leaves the loads to the one or two warps holding rows < M at decode.
  int split_gather_rows = 0;
  // Some pair of row reductions (a mean and variance, a max and sum of exp) merges in one round
  // (Plan::fused_pairs) and a run may hold a job of 9 to 32 rows (pair_hand_over_rows): the L2
  // exchange then hands such a job's pair rounds between warps in SMEM (l2_exchange_smem_bytes).
  bool pair_hand_over = false;
  // The L2 exchange's polls pause between tries (cluster/global_exchange.cuh kPollBackoffNs):
  // where every CTA of the grid is in its round at once (one job a CTA) and a row's peers are many,
  // their re-polls of the last peer's words flood its L2 lines; elsewhere the pause only delays
  // the round's end (bench/NOTES.md Stops 59-61).
  bool poll_backoff = false;
  // Columns each row reduction spans (FusionSpec::segment: per-head norms): 0 the whole row;
  // else one tile's (tile_n == row_segment), which its CTA finishes alone: no exchange.
  int row_segment = 0;

  COMFUSE_HOST_DEVICE constexpr int epi_rows() const { return tile_m / wgs_per_tile; }  // one WG's rows
  // Threads a CTA launches with, and the setmaxnreg split of its registers between the producer
  // WG (one thread issues TMA) and each consumer WG. setmaxnreg moves registers within the CTA's
  // pool, what the launch gave it (launch_regs() a thread, __launch_bounds__' share of the 64K):
  // what the producer releases is all the consumers may add. 40 + 2 x 232 (of 3 x 168), 32 +
  // 3 x 160 (of 4 x 128); 4 consumers would get 112 (of 5 x 96).
  COMFUSE_HOST_DEVICE constexpr int threads() const { return (1 + consumer_wgs) * Sm90::kWarpGroupThreads; }
  COMFUSE_HOST_DEVICE constexpr int launch_regs() const { return Sm90::kRegisters / threads() / 8 * 8; }
  COMFUSE_HOST_DEVICE constexpr int producer_regs() const { return consumer_wgs <= 2 ? Sm90::kProducerRegs : 32; }
  COMFUSE_HOST_DEVICE constexpr int consumer_regs() const {
    return ((consumer_wgs + 1) * launch_regs() - producer_regs()) / consumer_wgs / 8 * 8;
  }
  // Whether two jobs' tiles alternate on the tensor cores (turn_lead above).
  COMFUSE_HOST_DEVICE constexpr bool tile_turns() const {
    return wgs_per_tile == 1 && consumer_wgs == 2 && turn_lead > 0 && turn_lead < n_tiles;
  }
  // The schedule's name (explain, the planner's reasons and runners-up, the CLI).
  COMFUSE_HOST_DEVICE constexpr char const* schedule() const { return wgs_per_tile == 1 ? "PingPong" : "cooperative"; }
  // Columns of the mainloop's B tile and accumulator: tile_n, or both halves of a gated tile.
  COMFUSE_HOST_DEVICE constexpr int mma_n() const { return gated ? 2 * tile_n : tile_n; }
  // fp32 accumulators a consumer thread holds (one warp group's tile over its 128 threads).
  COMFUSE_HOST_DEVICE constexpr int accumulators() const { return epi_rows() * mma_n() / Sm90::kWarpGroupThreads; }
  COMFUSE_HOST_DEVICE constexpr int cluster_size() const { return cluster_m * cluster_n; }
  // The hardware cluster along x: cluster_m CTAs along M, or a tile's K-splits (splits_in_cluster,
  // where cluster_m is 1). The scheduler's "cluster" (cluster_size() CTAs that share a multicast)
  // is then one CTA of it.
  COMFUSE_HOST_DEVICE constexpr int hw_cluster_x() const { return splits_in_cluster ? k_splits : cluster_m; }
  COMFUSE_HOST_DEVICE constexpr int hw_cluster_size() const { return hw_cluster_x() * cluster_n; }
  COMFUSE_HOST_DEVICE constexpr int row_peers() const { return cluster_n * row_group; }  // CTAs sharing a row
  // CTAs that reduce the same rows together: a per-segment reduction finishes in each tile alone.
  COMFUSE_HOST_DEVICE constexpr int reduce_peers() const { return row_segment > 0 ? 1 : row_peers(); }
  COMFUSE_HOST_DEVICE constexpr bool cross_cta_reduction() const { return row_reduction && reduce_peers() > 1; }
  // A slices of the multicast along N (each >= 8 rows: one swizzle atom), B slices along M.
  COMFUSE_HOST_DEVICE constexpr int a_slices() const { return cluster_n < tile_m / 8 ? cluster_n : tile_m / 8; }
  // Rows of A's TMA box: a short box (a_box_rows), else one multicast slice (the whole tile).
  COMFUSE_HOST_DEVICE constexpr int a_box() const { return a_box_rows > 0 ? a_box_rows : tile_m / a_slices(); }
  COMFUSE_HOST_DEVICE constexpr int b_slices() const { return cluster_m < mma_n() / 8 ? cluster_m : mma_n() / 8; }
  COMFUSE_HOST_DEVICE constexpr int ring_stage_bytes() const { return (tile_m + mma_n()) * Sm90::kTileK * Sm90::kAbBytes; }
  COMFUSE_HOST_DEVICE constexpr int ring_bytes() const { return ring_stages * ring_stage_bytes(); }
  // A ring slot as TMA boxes of a tile input (128 bytes of columns x tile_m rows, 128-byte
  // swizzle: mainloop_sm90.cuh slot_box): the slot's A part is one, its B part mma_n / tile_m.
  COMFUSE_HOST_DEVICE constexpr int ring_slot_boxes() const { return 1 + mma_n() / tile_m; }
  COMFUSE_HOST_DEVICE constexpr int ring_box_bytes() const { return tile_m * 128; }
  // One warp group's tile of an [M, N] input of elem_bytes elements (what it takes of the slot).
  COMFUSE_HOST_DEVICE constexpr int tile_input_bytes(int elem_bytes) const { return epi_rows() * tile_n * elem_bytes; }
  // Columns one job of the row's CTAs covers: a row reduction needs N <= this.
  COMFUSE_HOST_DEVICE constexpr int row_cover() const { return row_peers() * tile_n * n_tiles; }
  // One stashed tile of `rows` rows: its values and, centered (stash_centers), its centers, two
  // floats a thread per 64 rows.
  COMFUSE_HOST_DEVICE constexpr int stash_tile_bytes(int rows) const {
    return rows * tile_n * stash_elem_bytes + (stash_centers ? rows * 16 : 0);
  }
  // Stash of one consumer WG: the job's earlier n_tiles - 1 tiles of its rows.
  COMFUSE_HOST_DEVICE constexpr int stash_bytes_per_wg() const {
    return n_tiles > 1 ? (n_tiles - 1) * stash_tile_bytes(epi_rows()) : 0;
  }
  // The kernel's SMEM without a stash: the ring (A and B 1024-aligned), every consumer WG's
  // epilogue storage and the ring's full/empty mbarriers, rounded to the 1024-byte alignment of
  // the ring.
  COMFUSE_HOST_DEVICE constexpr int smem_bytes_without_stash() const {
    return align_up(ring_bytes() + consumer_wgs * (epilogue_smem_bytes + split_hand_over_bytes() + split_gather_bytes()) +
                        16 * ring_stages,
                    1024);
  }
  // Dynamic SMEM a launch asks for (fused_gemm_sm90.cuh's SharedStorage).
  COMFUSE_HOST_DEVICE constexpr int smem_bytes() const {
    return stash_space == StashSpace::Smem
               ? align_up(smem_bytes_without_stash() + consumer_wgs * stash_bytes_per_wg(), 1024)
               : smem_bytes_without_stash();
  }
  // Global workspaces the runtime allocates (scheduler/grid.cuh sizes them for the grid).
  COMFUSE_HOST_DEVICE constexpr int stash_workspace_bytes_per_cta() const {
    return stash_space == StashSpace::Workspace ? consumer_wgs * stash_bytes_per_wg() : 0;
  }
  // One consumer WG's on-chip channel storage (epilogue/stage.cuh, SharedStorage::chan): the DSMEM
  // channel, or the L2 exchange's pair rounds' hand-over between warps; none without a cross-CTA
  // reduction.
  COMFUSE_HOST_DEVICE constexpr int channel_smem_bytes() const {
    if (!cross_cta_reduction()) return 0;
    if (aggregation != Aggregation::L2Exchange) return dsmem_channel_bytes(epi_rows(), cluster_n);
    return pair_hand_over ? l2_exchange_smem_bytes(epi_rows(), exchange_peers()) : 0;
  }
  // Whether this configuration's warp groups can hand pair rounds over (pair_hand_over: the planner
  // sets it only where they can and the epilogue has a pair).
  COMFUSE_HOST_DEVICE constexpr bool pair_hand_over_possible() const {
    return cross_cta_reduction() && aggregation == Aggregation::L2Exchange &&
           l2_exchange_smem_bytes(epi_rows(), exchange_peers()) > 0;
  }
  // One exchange slot of the L2 channel: round parity x peers x (values, second statistics) x rows
  // of 8-byte tagged words (cluster/global_exchange.cuh; at least 2 peers).
  COMFUSE_HOST_DEVICE constexpr int exchange_peers() const { return row_peers() > 2 ? row_peers() : 2; }
  COMFUSE_HOST_DEVICE constexpr int exchange_slot_bytes() const {
    return aggregation == Aggregation::L2Exchange && cross_cta_reduction() ? 2 * exchange_peers() * 2 * epi_rows() * 8
                                                                           : 0;
  }
  // Split-K (scheduler/split_k.cuh): the k_splits clusters of a tile's K-splits each run the
  // mainloop over their share of K; the first (the tile's owner) adds the others' fp32 partial
  // tiles in a fixed order and alone runs the epilogue. What a problem with fewer tiles than SMs
  // (decode) needs to keep every SM streaming B. The partials travel through the exchange
  // workspace in L2 (each split's tile behind a tag), or, with
  // splits_in_cluster, over DSMEM inside one hardware cluster of the k_splits CTAs.
  // Through L2, per owner warp group: one partial tile per other split, and one 4-byte tag per split.
  COMFUSE_HOST_DEVICE constexpr bool splits_through_l2() const { return k_splits > 1 && !splits_in_cluster; }
  // A partial value travels as fp32 behind its split's tag, or, where the owner sums the rows in
  // SMEM (split_gather_rows > 0: decode rows or the whole tile) and their twice as many bytes take
  // no more rounds of loads, as an 8-byte word that carries the tag beside the value (split_k.cuh's
  // tagged hand-over): only those rows travel then. MEASURED (bench/NOTES.md Stop 38): a round
  // more cost 0.6-1.1 us where the tags saved 0.1-0.5.
  COMFUSE_HOST_DEVICE constexpr bool split_words_tagged() const {
    return splits_through_l2() && split_gather_rows > 0 && split_gather_rounds_at(2) == split_gather_rounds_at(1);
  }
  COMFUSE_HOST_DEVICE constexpr int split_value_bytes() const { return split_words_tagged() ? 8 : 4; }
  // A partial tile is the accumulator's: mma_n() columns (a gated tile's both products: split-K sums
  // the two before the epilogue multiplies them).
  COMFUSE_HOST_DEVICE constexpr int split_partial_bytes() const {
    return splits_through_l2() ? (split_words_tagged() ? split_gather_rows : epi_rows()) * mma_n() * split_value_bytes() : 0;
  }
  COMFUSE_HOST_DEVICE constexpr int split_flag_bytes() const { return splits_through_l2() ? k_splits * 4 : 0; }
  // Over DSMEM (splits_in_cluster), per consumer warp group (cluster/split_hand_over.cuh): one
  // warp's share of the partial tile (32 threads x their accumulators, fp32) and two mbarriers.
  COMFUSE_HOST_DEVICE constexpr int split_hand_over_bytes() const {
    return splits_in_cluster ? align_up(accumulators() * 32 * 4 + 16, 128) : 0;
  }
  // The rows the owner's warp group sums in SMEM where it does (split_gather_rows): the rows A's
  // box holds at decode, else the warp group's tile.
  COMFUSE_HOST_DEVICE constexpr int split_gather_rows_wanted() const { return a_box_rows > 0 ? a_box_rows : epi_rows(); }
  // The owner warp group's staging of the summed partial rows (split_gather_rows): fp32, mma_n() a row.
  COMFUSE_HOST_DEVICE constexpr int split_gather_bytes() const { return split_gather_rows * mma_n() * 4; }
  // Its loads (scheduler/split_k.cuh add_staged): each thread's share of the rows' runs of four
  // values (one 16-byte load of fp32, or two of tagged words), the other splits' of
  // split_gather_chunk() of them in flight together, in split_gather_rounds() dependent L2 round trips.
  COMFUSE_HOST_DEVICE constexpr int split_gather_vecs_per_thread() const {
    return (split_gather_rows * mma_n() / 4 + Sm90::kWarpGroupThreads - 1) / Sm90::kWarpGroupThreads;
  }
  // With loads_per_vec 16-byte loads a run of four values takes (1: fp32, 2: tagged words).
  COMFUSE_HOST_DEVICE constexpr int split_gather_chunk_at(int loads_per_vec) const {
    return loads_per_vec * (k_splits - 1) >= Sm90::kSplitGatherLoadsInFlight
               ? 1
               : Sm90::kSplitGatherLoadsInFlight / (loads_per_vec * (k_splits - 1));
  }
  COMFUSE_HOST_DEVICE constexpr int split_gather_rounds_at(int loads_per_vec) const {
    return (split_gather_vecs_per_thread() + split_gather_chunk_at(loads_per_vec) - 1) / split_gather_chunk_at(loads_per_vec);
  }
  COMFUSE_HOST_DEVICE constexpr int split_gather_chunk() const { return split_gather_chunk_at(split_words_tagged() ? 2 : 1); }
  COMFUSE_HOST_DEVICE constexpr int split_gather_rounds() const { return split_gather_rounds_at(split_words_tagged() ? 2 : 1); }
  // The owner loads every follower's values of step_vecs float4s a thread together, then adds
  // them: as many as the registers beside its accumulators hold (~176 - accumulators for the
  // loads in flight), a power of two dividing its accumulators / 4 (24 at tile_n 192). Its
  // hand-over of a piece then takes split_hand_over_steps() rounds of remote loads.
  COMFUSE_HOST_DEVICE constexpr int split_hand_over_step_vecs() const {
    int const vecs = accumulators() / 4;
    int const room = (176 - 4 * vecs) / 4 / (k_splits > 1 ? k_splits - 1 : 1);
    int step = 1;
    while (step * 2 <= room && vecs % (step * 2) == 0) step *= 2;
    return step;
  }
  COMFUSE_HOST_DEVICE constexpr int split_hand_over_steps() const {
    return accumulators() / 4 / split_hand_over_step_vecs();
  }
  // The exchange workspace's header (its launch counter) serves the row exchange and split-K's tags.
  COMFUSE_HOST_DEVICE constexpr bool uses_exchange_workspace() const {
    return exchange_slot_bytes() > 0 || splits_through_l2();
  }
};

// The head of the L2 exchange workspace (cluster/global_exchange.cuh), before its slots: the
// launch counter whose value tags the exchanged words. It lives on the device and the kernel
// advances it (the last consumer warp group to finish a launch), so a launch replayed from a
// CUDA graph tags its rounds anew; the host only initializes the workspace once, when it
// allocates it: all zero but slot_bytes.
struct ExchangeHeader {
  unsigned epoch;                // launches finished since the workspace was initialized
  unsigned retired;              // consumer warp groups of the running launch done with the channel
  unsigned long long slot_bytes;  // the bytes after the header (zeroed again where tags wrap)
};
inline constexpr int kExchangeHeaderBytes = 128;  // keeps the slots 128-byte aligned

// What more than the default 2 consumer warp groups need of the rest of `c` (nullptr: nothing
// missing), which the planner also applies to forced options and its candidates: fewer registers
// each (consumer_regs()) hold one 64-row warp group's tile of at most 64 fp32 accumulators a
// thread, and each consumer runs its own jobs over the ring, so no DSMEM channel or split-K
// hand-over laid out for two.
COMFUSE_HOST_DEVICE constexpr char const* check_consumer_wgs(KernelConfig const& c) {
  if (c.consumer_wgs <= Sm90::kConsumerWGs) return nullptr;
  if (c.wgs_per_tile != 1 || c.tile_m != 64 || c.accumulators() > 64)
    return "more than 2 consumer warp groups hold 64-row tiles, PingPong, of at most 64 accumulators a thread "
           "(tile_n <= 128; fewer registers each)";
  if (c.cluster_n != 1) return "more than 2 consumer warp groups take row groups or elementwise plans, not a DSMEM cluster";
  if (c.k_splits != 1) return "more than 2 consumer warp groups take no K-splits";
  return nullptr;
}
static_assert(KernelConfig{}.consumer_regs() == Sm90::kConsumerRegs,
              "the setmaxnreg split of the default 2 consumers (KernelConfig::consumer_regs) is Sm90's");

// Why `c` cannot be built, or nullptr when it can: every limit of the kernel templates and of
// sm_90 in one place. The planner skips candidates it refuses; the kernel static_asserts it.
COMFUSE_HOST_DEVICE constexpr bool is_pow2(int v) { return v > 0 && (v & (v - 1)) == 0; }

COMFUSE_HOST_DEVICE constexpr char const* check(KernelConfig const& c) {
  if (c.wgs_per_tile != 1 && c.wgs_per_tile != 2) return "wgs_per_tile: 1 (PingPong) or 2 (cooperative)";
  if (c.wgs_per_tile == 1 && c.tile_m != 64 && c.tile_m != 128) return "PingPong tile_m: 64 or 128 rows per warp group";
  if (c.wgs_per_tile == 2 && c.tile_m != 128 && c.tile_m != 256) return "cooperative tile_m: 128 or 256 (half per warp group)";
  if (c.tile_n % 64 != 0 || c.tile_n < 64 || c.tile_n > 256) return "tile_n: 64, 128, 192 or 256";
  if (c.accumulators() > Sm90::kMaxAccumulatorsPerThread)
    return "a warp group's tile exceeds 128 fp32 accumulators per thread";
  if (c.mma_depth != 1 && c.mma_depth != 2) return "mma_depth: 1 or 2";
  if (c.consumer_wgs < 2 || c.consumer_wgs > Sm90::kMaxConsumerWGs) return "consumer_wgs: 2 or 3 consumer warp groups";
  if (char const* why = check_consumer_wgs(c)) return why;
  if (c.ring_stages < 2 || c.ring_stages <= c.mma_depth) return "ring_stages: at least 2, and more than mma_depth";
  if (!is_pow2(c.cluster_n) || c.cluster_n > Sm90::kMaxClusterSize) return "cluster_n: 1, 2, 4, 8 or 16";
  if (c.cluster_m != 1 && c.cluster_m != 2 && c.cluster_m != 4) return "cluster_m: 1, 2 or 4";
  // 2-D clusters (A multicast along N, B along M) serve a row reduction over DSMEM along N.
  if (c.cluster_m > 1 && c.cluster_n > 1 &&
      !(c.cluster_m == 2 && c.cross_cta_reduction() && c.aggregation != Aggregation::L2Exchange))
    return "clusters along both M and N: 2 along M, for a row reduction over DSMEM only";
  if (c.cluster_size() > Sm90::kMaxClusterSize) return "a cluster of at most 16 CTAs";
  if (!c.b_kmajor && c.mma_n() / 64 < c.cluster_m)
    return "K x N B multicasts 64-column boxes along M: tile_n >= 64 * cluster_m";
  if (c.n_tiles < 1 || c.n_tiles > Sm90::kMaxNTiles) return "n_tiles: 1..64 N-tiles per job";
  if (c.turn_lead < 0 || c.turn_lead > c.n_tiles) return "turn_lead: 0..n_tiles (0: a job at a time)";
  // A cooperative job of several N-tiles: each warp group exchanges its own 64 rows through L2 (or
  // holds whole rows alone); the DSMEM channels pair one warp group with one tile.
  if (c.n_tiles > 1 && c.wgs_per_tile != 1 && c.aggregation != Aggregation::L2Exchange &&
      c.aggregation != Aggregation::None)
    return "several N-tiles per cooperative job: row groups through L2 only";
  if (c.turn_lead > 0 && c.turn_lead < c.n_tiles && (c.wgs_per_tile != 1 || c.consumer_wgs != 2))
    return "turn_lead: two jobs' tiles in turn need two PingPong consumer warp groups";
  if (!is_pow2(c.row_group) || c.row_group > Sm90::kMaxRowGroup) return "row_group: a power of two in 1..64";
  if (c.k_splits < 1 || c.k_splits > Sm90::kMaxKSplits) return "k_splits: 1..16 K-splits per tile";
  if (c.k_splits > 1 && c.wgs_per_tile != 1) return "split-K needs the PingPong schedule (one warp group per tile)";
  if (c.k_splits > 1 && c.n_tiles != 1) return "split-K takes one N-tile per job";
  if (c.splits_in_cluster && c.k_splits < 2) return "splits_in_cluster: at least 2 K-splits";
  if (c.splits_in_cluster && c.cluster_size() != 1)
    return "K-splits in one hardware cluster: no multicast cluster (cluster_m = cluster_n = 1)";
  if (c.hw_cluster_size() > Sm90::kMaxClusterSize) return "a cluster of at most 16 CTAs";
  if (c.begin_early && c.n_tiles != 1) return "begin_early: one N-tile per job";
  if (c.store_stages != 1 && c.store_stages != 2) return "store_stages: 1 or 2 TMA-store staging buffers per output";
  if (c.poll_backoff && c.aggregation != Aggregation::L2Exchange) return "poll_backoff: the L2 exchange's polls only";
  // The gated tile's two halves are one wgmma's columns (at most 256) and one 64-row m-block of
  // the warp group's accumulator (the epilogue finds the second half at a fixed offset).
  if (c.gated && (c.mma_n() > 256 || c.epi_rows() != 64))
    return "a gated GEMM: tile_n <= 128 (both halves one wgmma of <= 256 columns) and 64 rows a warp group "
           "(PingPong 64 or cooperative 128)";
  if (c.gated && (c.n_tiles != 1 || c.row_reduction)) return "a gated GEMM: an elementwise epilogue, one N-tile a job";
  if (c.a_box_rows != 0 && (c.a_box_rows % 8 != 0 || c.a_box_rows >= c.tile_m || c.a_slices() != 1))
    return "a_box_rows: a multiple of 8 below tile_m, without A multicast (cluster_n = 1)";
  if (c.split_gather_rows != 0 && (!c.splits_through_l2() || c.split_gather_rows != c.split_gather_rows_wanted()))
    return "split_gather_rows: split-K through L2, as many rows as A's short box (a_box_rows) or else the warp "
           "group's tile (epi_rows)";
  if (c.ring_input_bytes < 0) return "ring_input_bytes < 0";
  if (c.ring_input_bytes > 0 && c.wgs_per_tile != 1)
    return "tile inputs in the ring: the PingPong schedule (one warp group reads a tile's slot)";
  if (c.ring_input_bytes > 0 && c.k_splits != 1)
    return "tile inputs in the ring: no split-K (only a tile's owner would read them)";
  if (c.ring_input_bytes % c.ring_box_bytes() != 0 || c.ring_input_bytes / c.ring_box_bytes() > c.ring_slot_boxes())
    return "tile inputs in the ring: whole TMA boxes, no more than one ring slot holds";
  if (c.row_segment != 0 && (!c.row_reduction || c.row_segment != c.tile_n || c.n_tiles != 1))
    return "per-segment reductions: tiles of one segment's columns (tile_n == row_segment), one N-tile a job";
  if (c.row_group > 1 && c.cross_cta_reduction() && c.aggregation != Aggregation::L2Exchange)
    return "a row group of clusters exchanges through L2 (aggregation L2Exchange)";
  if (c.aggregation == Aggregation::L2Exchange && c.cluster_n != 1)
    return "the L2 exchange joins clusters of 1 along N (the row's CTAs are the row group)";
  if (c.cross_cta_reduction() && c.aggregation == Aggregation::None)
    return "a row reduction across CTAs needs an aggregation mode";
  if (c.stash_elem_bytes != 0 && c.stash_elem_bytes != 2 && c.stash_elem_bytes != 4)
    return "stash_elem_bytes: 0 (nothing), 2 (bf16) or 4 (fp32)";
  if (c.stash_centers && (c.stash_elem_bytes != 2 || c.n_tiles < 2))
    return "stash_centers: a bf16 stash over several N-tiles a job (fp32 keeps x exactly)";
  if ((c.stash_bytes_per_wg() > 0) != (c.stash_space != StashSpace::None))
    return "a stash needs a space (SMEM or workspace), and a space needs something to stash";
  if (c.epilogue_smem_bytes < 0) return "epilogue_smem_bytes < 0";
  if (c.smem_bytes() > Sm90::kSmemCapacity) return "SMEM over the 227 KiB a block may use: fewer ring stages or a smaller stash";
  return nullptr;
}

// ---- The second kernel family: back-to-back GEMMs, O = F(X W1^T [, X W3^T]) W2^T ------------
//
// One description of a B2B kernel (kernels/comfuse/b2b/), filled by the planner's B2B decider,
// written once by Ψ, launched from by the runtime, exactly as KernelConfig is for the single GEMM.
// Each consumer warp group owns a job (or, paired, half of one): tile_m rows of X (and of O) x
// tile_n2 columns of O, in one batch. It walks N1 in chunks of chunk_n1: GEMM1 (X W1^T over K, from SMEM) gives P, the
// intermediate epilogue F turns P into S in registers, GEMM2 (S from registers as the A
// operand, W2 from SMEM) accumulates O; after the last chunk GEMM2's epilogue stores O.
struct B2bConfig {
  bool w1_kmajor = true;   // W1 (and W3) is N1 x K (the Linear weight; attention's keys)
  bool w2_kmajor = true;   // W2 is N2 x N1 (the Linear weight); else N1 x N2 (attention's values)
  bool gated = false;      // a second GEMM1, X W3^T, shares X's tiles (SwiGLU's up projection)
  bool batched = false;    // X, W1 (W3), W2 and O have a leading batch dimension (B x H)
  int tile_m = 64;         // rows of one consumer warp group's share of a job
  int chunk_n1 = 128;      // N1 columns per chunk: GEMM1's N, GEMM2's K
  int tile_n2 = 128;       // O columns of a job
  int ring_stages = 4;     // depth of each SMEM ring (X/W1 and W2 k-blocks alike)
  bool online_softmax = false;  // F is softmax over N1: running max and sum, O rescaled per chunk
  bool causal = false;     // keys past the query's row are masked (top-left aligned, as torch's is_causal)
  int epilogue_smem_bytes = 0;  // one consumer WG's F and GEMM2-epilogue node storage (the planner's model)
  // CTAs of a cluster that split N1 (the paper's partition along N1): the cluster's CTAs take the
  // same job, each its share of the chunks (rank, rank + cluster_n1, ...), and sum their partial
  // O over DSMEM in rank order into the job's owner, which runs GEMM2's epilogue (b2b/
  // partial_sum.cuh). 1: a CTA walks all of N1 alone.
  int cluster_n1 = 1;
  // The partial-O hand-over (cluster_n1 > 1), per consumer warp group: two buffers of
  // xfer_floats fp32 per thread (a follower fills one while the owner reads the other; O's
  // tile_n2 / 2 values a thread go over in pieces of this many), the online softmax's row
  // statistics (4 fp32 per thread), and the buffers' full/free mbarriers.
  int xfer_floats = 8;
  // The two consumer warp groups take one job of 2 x tile_m rows together (each its tile_m rows)
  // and share one ring: each W1 (W3) and W2 k-block is loaded once for both, and the X k-blocks
  // of both halves sit side by side in the slot. The ring's loads from L2 are what bound the
  // unpaired kernel (bench/NOTES.md); pairing cuts them per chunk by the shared B tiles. The two
  // warp groups then take ordered turns on the tensor cores (NamedBarrier::MmaTurnWG0/1): one
  // issues GEMM2 of a chunk and GEMM1 of the next while the other runs F, the paper's stagger.
  bool paired = false;
  // > 0: F's prologue is attention's plain logits, softmax(logit_scale x [causal mask]) of the raw
  // scores x, and b2b_intermediate renders it as x alone: the online softmax keeps raw scores and
  // their max, puts logit_scale log2(e) into its exponent's one FFMA (no multiply per element),
  // and applies the causal mask itself, only in the chunks that cross the diagonal. 0: the
  // prologue computes the logits (any other chain).
  float logit_scale = 0.f;
  // > 0: every fma_exp_every-th exponential of the online softmax runs as a polynomial on the FMA
  // pipe (epi::fma_exp2), the others on the MUFU, whose 16 a clock per SM bound F where the head
  // dim is small (a chunk's 64 MUFU a thread against GEMMs of 64-deep k). 0: all on the MUFU.
  // The planner's choice (decide_b2b.cpp) is measured.
  int fma_exp_every = 0;
  // > 0: X stays resident for its job (attention's Q: K, the head dim, is at most x_k_blocks x 64):
  // loaded once into a buffer of its own beside the ring (its own full/empty barriers), read by
  // every chunk's GEMM1 and freed after the job's last one; the ring's slots then carry W1 and W2
  // k-blocks only, smaller, so the ring is deeper (with f_beside_gemm2, GEMM1's k-blocks are a
  // compile-time count). 0: every GEMM1 slot holds X's k-block beside W1's (K unbounded; X re-read
  // from L2 per chunk). The planner takes it with f_beside_gemm2; alone it is forced only
  // (--b2b-x-resident): measured no faster (bench/NOTES.md).
  int x_k_blocks = 0;
  static constexpr int kMaxXKBlocks = 4;  // the resident X's SMEM beside a ring: K <= 256
  // Resident X buffers, used by jobs in turn: 2 lets the producer load the next job's X while
  // this job's GEMM1s still read its own (with one, it waits for the job's last GEMM1), at the
  // cost of ring stages. Forced only (--b2b-x-buffers): NOT measured yet.
  int x_buffers = 1;
  // The online softmax's F of chunk c runs while GEMM2 of chunk c - 1 is still on the tensor cores
  // (FlashAttention-3's intra-warpgroup overlap): the producer loads W1 of c, then W2 of c - 1; the
  // warp group issues GEMM1 of c and GEMM2 of c - 1, waits for GEMM1 only, computes the chunk's
  // statistics and exponentials in place into GEMM1's accumulator P (complete by then), then
  // waits for GEMM2, rescales O and writes S. Needs X resident (a straight-line loop body: ptxas
  // serializes wgmmas whose commit groups it cannot count). The planner's choice wherever X fits
  // resident (--b2b-overlap off keeps F between the GEMMs): measured 0-13% faster (bench/NOTES.md).
  bool f_beside_gemm2 = false;
  // With F beside GEMM2: a warp group's jobs chained, each job's first GEMM1 issued in one turn
  // with the previous job's last GEMM2, and its first F beside that GEMM2 (O of the previous job
  // finished and stored after it, from the row sums saved at the boundary), so only the first and
  // the last job of the warp group pay a GEMM alone. Needs the next job's X loaded before the
  // previous job's last GEMM2 (x_buffers 2), one CTA per job (cluster_n1 1) and GEMM2's epilogue
  // without tile inputs (their prefetch would overwrite the previous job's). Forced only
  // (--b2b-chain-jobs): NOT measured yet.
  bool chain_jobs = false;
  // > 0: the decode kernel (b2b/decode_attention.cuh) instead of the wgmma pipeline, for an
  // attention whose batches hold at most decode_rows query rows (a decode step's one row a head;
  // a few with speculative tokens): F is softmax(logit_scale x [+ the additive mask operand]) of
  // the raw scores x, GEMM2's epilogue a plain store of O, and the head dim K = N2 = tile_n2.
  // It streams K and V through CUDA cores (memory-bound at a few rows: a 64-row wgmma would do one
  // useful row in 64), each batch's keys split over the cluster_n1 CTAs of a cluster whose partial
  // results merge over DSMEM in rank order. The fields of the wgmma pipeline (rings, pairing,
  // chunks) are unused.
  int decode_rows = 0;
  static constexpr int kMaxDecodeRows = 8;
  static constexpr int kDecodeWarps = 4;

  COMFUSE_HOST_DEVICE constexpr bool decode() const { return decode_rows > 0; }
  // Elements of a key's row a lane of the decode kernel holds: 16 (two 16-byte loads) at head
  // dims >= 128, so that a key's shuffles and softmax run on fewer lanes; 8 where more than 4
  // rows' q and O (2 x rows x 16 floats a lane) would take the registers.
  COMFUSE_HOST_DEVICE constexpr int decode_vec() const { return tile_n2 >= 128 && decode_rows <= 4 ? 16 : 8; }
  // Keys a group of the decode kernel loads before it uses the first: K and V of 8 keys at 8
  // elements a lane (4 at 16) are 256 bytes in flight a thread (32 KiB a CTA); half that where
  // more rows' q and O take the registers.
  COMFUSE_HOST_DEVICE constexpr int decode_unroll() const { return (decode_rows <= 2 ? 8 : 4) * 8 / decode_vec(); }
  COMFUSE_HOST_DEVICE constexpr int threads() const { return decode() ? kDecodeWarps * 32 : Sm90::kThreads; }
  // The decode kernel's groups: the lanes that hold one key's row of tile_n2 elements,
  // decode_vec() each, and the keys its CTA holds at once; a step walks decode_unroll() of each.
  COMFUSE_HOST_DEVICE constexpr int decode_lanes() const { return tile_n2 / decode_vec(); }
  COMFUSE_HOST_DEVICE constexpr int decode_groups() const { return kDecodeWarps * 32 / decode_lanes(); }
  COMFUSE_HOST_DEVICE constexpr int decode_step_keys() const { return decode_groups() * decode_unroll(); }
  // The decode kernel's SMEM (DecodeAttention::SharedStorage): each of its groups' O and (m, l) a
  // row, then the CTA's merged O and (m, l).
  COMFUSE_HOST_DEVICE constexpr int decode_smem_bytes() const {
    return align_up(decode_rows * (decode_groups() + 1) * (tile_n2 + 2) * 4, 1024);
  }

  COMFUSE_HOST_DEVICE constexpr int wgs_per_job() const { return paired ? 2 : 1; }
  // Paired, the warp groups take ordered tensor-core turns (GEMM2 of a chunk and GEMM1 of the
  // next, b2b_gemm_sm90.cuh) where one turn's k-blocks fit the ring: a warp group waiting for its
  // turn has released every slot, so the other's turn cannot starve. Else they run unordered.
  COMFUSE_HOST_DEVICE constexpr int turn_k_blocks(int k) const {
    return (k + Sm90::kTileK - 1) / Sm90::kTileK + chunk_n1 / Sm90::kTileK;
  }
  COMFUSE_HOST_DEVICE constexpr bool ordered_turns(int k) const { return paired && turn_k_blocks(k) <= ring_stages; }
  COMFUSE_HOST_DEVICE constexpr int job_rows() const { return tile_m * wgs_per_job(); }
  // Jobs a scheduling unit (a CTA, or a cluster splitting N1) runs at once, and its rings.
  COMFUSE_HOST_DEVICE constexpr int jobs_per_unit() const { return Sm90::kConsumerWGs / wgs_per_job(); }
  COMFUSE_HOST_DEVICE constexpr int rings() const { return jobs_per_unit(); }

  COMFUSE_HOST_DEVICE constexpr int xfer_pieces() const { return tile_n2 / 2 / xfer_floats; }
  COMFUSE_HOST_DEVICE constexpr int xfer_bytes() const {
    return cluster_n1 > 1 ? (2 * xfer_floats + 4) * Sm90::kWarpGroupThreads * 4 + 4 * 8 : 0;
  }

  // One ring slot: the job's X k-block (job_rows x 64) and the B region, which holds either W1's
  // (and W3's) k-block of the chunk or a W2 k-block (tile_n2 x 64 along N1).
  COMFUSE_HOST_DEVICE constexpr int gemm1_b_rows() const { return (gated ? 2 : 1) * chunk_n1; }
  COMFUSE_HOST_DEVICE constexpr int b_region_rows() const { return gemm1_b_rows() > tile_n2 ? gemm1_b_rows() : tile_n2; }
  // X's k-block of a job (job_rows x 64): in every GEMM1 slot, or x_k_blocks of them resident.
  COMFUSE_HOST_DEVICE constexpr int x_block_bytes() const { return job_rows() * Sm90::kTileK * Sm90::kAbBytes; }
  COMFUSE_HOST_DEVICE constexpr int slot_a_bytes() const { return x_k_blocks > 0 ? 0 : x_block_bytes(); }
  COMFUSE_HOST_DEVICE constexpr int slot_b_bytes() const { return b_region_rows() * Sm90::kTileK * Sm90::kAbBytes; }
  // Registers a consumer thread holds for P (and P3) in fp32, S as 16-bit pairs and O in fp32,
  // and the most it may spend on them beside the kernel's own (the FFN and attention kernels
  // within this bound compile to 168 registers without spills).
  static constexpr int kMaxLiveValues = 176;
  COMFUSE_HOST_DEVICE constexpr int live_values() const { return (gated ? 2 : 1) * chunk_n1 / 2 + chunk_n1 / 4 + tile_n2 / 2; }
  // One ring's SMEM: its slots, and X's resident k-blocks.
  COMFUSE_HOST_DEVICE constexpr int ring_bytes() const {
    return ring_stages * (slot_a_bytes() + slot_b_bytes()) + x_buffers * x_k_blocks * x_block_bytes();
  }
  // Bytes one ring loads from L2 for a chunk of its job: K / 64 X/W1 (/W3) k-blocks and
  // chunk_n1 / 64 W2 k-blocks (`explain` reports it; it did not bound the kernels measured).
  COMFUSE_HOST_DEVICE constexpr double chunk_fill_bytes(int k) const {
    return double((k + Sm90::kTileK - 1) / Sm90::kTileK) * ((x_k_blocks > 0 ? 0 : job_rows()) + gemm1_b_rows()) *
               Sm90::kTileK * Sm90::kAbBytes +
           double(chunk_n1) * tile_n2 * Sm90::kAbBytes;
  }
  // Dynamic SMEM: the rings (1024-aligned regions), both consumer WGs' epilogue storage and
  // partial-O hand-over, the rings' full/empty mbarriers (and X's), rounded to 1024.
  COMFUSE_HOST_DEVICE constexpr int smem_bytes() const {
    if (decode()) return decode_smem_bytes();
    return align_up(rings() * (ring_bytes() + 16 * (ring_stages + x_buffers)) +
                        Sm90::kConsumerWGs * (epilogue_smem_bytes + align_up(xfer_bytes(), 1024)),
                    1024);
  }
};

// Limits of single B2bConfig fields, which the planner also applies to forced options before
// planning (decide_b2b.cpp): one statement of each.
COMFUSE_HOST_DEVICE constexpr char const* check_b2b_tile_n2(int v) {
  return v % 64 != 0 || v < 64 || v > 256 ? "B2B tile_n2: 64, 128, 192 or 256" : nullptr;
}
COMFUSE_HOST_DEVICE constexpr char const* check_b2b_fma_exp_every(int v, bool online_softmax) {
  return v != 0 && (!online_softmax || v < 2 || v > 16 || !is_pow2(v))
             ? "B2B fma_exp_every: 0, or 2, 4, 8 or 16 with the online softmax"
             : nullptr;
}

COMFUSE_HOST_DEVICE constexpr char const* check(B2bConfig const& c) {
  if (c.decode()) {
    if (c.decode_rows > B2bConfig::kMaxDecodeRows) return "B2B decode kernel: at most 8 query rows a batch";
    if (!c.online_softmax || c.logit_scale <= 0.f || c.causal || c.gated)
      return "B2B decode kernel: attention's softmax of scaled scores (an additive mask allowed), no causal mask, one GEMM1";
    if (!c.batched || c.w2_kmajor || !c.w1_kmajor) return "B2B decode kernel: batched Q, K and V with V as [keys, DV]";
    if (c.tile_n2 != 64 && c.tile_n2 != 128 && c.tile_n2 != 256) return "B2B decode kernel: head dim 64, 128 or 256";
    if (!is_pow2(c.cluster_n1) || c.cluster_n1 > Sm90::kMaxClusterSize) return "B2B cluster_n1: 1, 2, 4, 8 or 16 CTAs along N1";
    if (c.smem_bytes() > Sm90::kSmemCapacity) return "B2B decode kernel: SMEM over the 227 KiB a block may use";
    return nullptr;
  }
  if (c.tile_m != 64) return "B2B tile_m: 64 rows per consumer warp group";
  if (c.chunk_n1 != 64 && c.chunk_n1 != 128) return "B2B chunk_n1: 64 or 128";
  if (char const* why = check_b2b_tile_n2(c.tile_n2)) return why;
  if (c.live_values() > B2bConfig::kMaxLiveValues)
    return "B2B registers: P, S and O of a warp group exceed what a consumer thread holds (smaller chunk_n1 or tile_n2)";
  if (c.online_softmax && c.gated) return "B2B: online softmax takes one GEMM1";
  if (c.causal && !c.online_softmax) return "B2B: a causal mask comes with the online softmax";
  if (!(c.logit_scale >= 0.f) || c.logit_scale > 3.0e38f) return "B2B logit_scale: a finite scale >= 0 (0: none folded)";
  if (c.logit_scale > 0.f && !c.online_softmax) return "B2B logit_scale: folded into the online softmax only";
  if (char const* why = check_b2b_fma_exp_every(c.fma_exp_every, c.online_softmax)) return why;
  if (c.ring_stages < 2) return "B2B ring_stages: at least 2";
  if (c.x_k_blocks < 0 || c.x_k_blocks > B2bConfig::kMaxXKBlocks)
    return "B2B x_k_blocks: 0 (X in every slot), or X resident for K <= 64 x kMaxXKBlocks";
  if (c.x_buffers < 1 || c.x_buffers > 2 || (c.x_buffers == 2 && c.x_k_blocks == 0))
    return "B2B x_buffers: 1, or 2 with X resident (x_k_blocks > 0)";
  if (c.f_beside_gemm2 && (!c.online_softmax || c.x_k_blocks == 0))
    return "B2B f_beside_gemm2: the online softmax's F with X resident (x_k_blocks > 0)";
  if (c.chain_jobs && (!c.f_beside_gemm2 || c.x_buffers != 2 || c.cluster_n1 != 1))
    return "B2B chain_jobs: F beside GEMM2, X in two buffers and one CTA per job (cluster_n1 1)";
  // Beside GEMM2, a warp group holds GEMM1's and GEMM2's slots of two chunks at once.
  if (c.f_beside_gemm2 && c.ring_stages < c.x_k_blocks + c.chunk_n1 / Sm90::kTileK)
    return "B2B f_beside_gemm2: a ring of fewer stages than one chunk's GEMM1 and GEMM2 k-blocks";
  if (c.paired && c.causal && c.chunk_n1 != c.job_rows())
    return "B2B paired with a causal mask: chunk_n1 = 2 x tile_m (a chunk of the pair's diagonal reaches both halves)";
  if (!is_pow2(c.cluster_n1) || c.cluster_n1 > Sm90::kMaxClusterSize) return "B2B cluster_n1: 1, 2, 4, 8 or 16 CTAs along N1";
  if (c.xfer_floats % 8 != 0 || c.xfer_floats < 8 || (c.tile_n2 / 2) % c.xfer_floats != 0)
    return "B2B xfer_floats: a multiple of 8 that divides O's tile_n2 / 2 values a thread";
  if (c.epilogue_smem_bytes < 0) return "B2B epilogue_smem_bytes < 0";
  if (c.smem_bytes() > Sm90::kSmemCapacity) return "B2B SMEM over the 227 KiB a block may use: fewer ring stages";
  return nullptr;
}

}  // namespace comfuse
