#pragma once
// The planner: kernel configuration for one FusionSpec at one problem shape, with the
// reason for every choice. Constants only the GPU can settle are named, in
// DeviceModel / PlannerTunables, with where their current values come from.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "comfuse/dtype.h"
#include "comfuse/spec.h"

namespace comfuse {

struct Problem {
  int64_t m = 0, n = 0, k = 0;
  DType ab_dtype = DType::BF16;  // GEMM operand dtype (A and B)
};
// Resolves the spec's M, N, K and operand dtype against bindings.
Problem problem_of(const FusionSpec& s, const Bindings& dims);

// Facts about the target GPU (H200 / sm_90a defaults; measured values noted in plan.cpp).
struct DeviceModel {
  int sm_count = 132;
  int smem_per_cta_bytes = 232448;  // 227 KB opt-in dynamic SMEM per CTA
  int max_cluster = 16;             // non-portable limit
  // Clusters resident at once when each CTA fills an SM (measured on the lent H200).
  std::map<int, int> clusters_resident = {{1, 132}, {2, 66}, {4, 30}, {8, 15}, {16, 7}};
};

// Knobs to be measured on the GPU (issues 3 and 4); defaults are today's best guesses.
struct PlannerTunables {
  int p2p_max_cluster = 4;  // peer-to-peer at C_N <= this, leader-follower above
  int max_stash_bytes = 96 * 1024;  // SMEM a CTA may spend keeping earlier N-tiles
};

enum class AggregationMode { None, PeerToPeer, LeaderFollower };
enum class RowStrategy {
  NoReduction,   // elementwise epilogue only: any tile may finish alone
  OnChip,        // the cluster covers the row, one N-tile per CTA
  Stash,         // several N-tiles per CTA; earlier tiles' values stay in SMEM
  GlobalReread,  // row too long for SMEM: earlier tiles' values go to global (L2) and come back
};
std::string_view name_of(AggregationMode m);
std::string_view name_of(RowStrategy s);

struct SmemBudget {
  int mainloop_ring = 0;     // stages x (A tile + B tile)
  int reduction_buffer = 0;  // ONE buffer shared by every reduction of the chain
  int stash = 0;             // earlier N-tiles kept on chip (RowStrategy::Stash)
  int store_buffer = 0;      // epilogue staging for the TMA store
  int barriers = 0;          // mbarriers and pipeline state
  int total() const { return mainloop_ring + reduction_buffer + stash + store_buffer + barriers; }
};

struct PlanOptions {
  std::optional<int> cluster_n;               // force C_N
  std::optional<int> tile_n;                  // force the CTA tile's N
  std::optional<AggregationMode> aggregation; // debug: force a mode
};

struct Plan {
  Problem problem;
  int tile_m = 0, tile_n = 0, tile_k = 0;
  int stages = 0;
  bool pingpong = true;          // two consumer warp groups alternate mainloop/epilogue
  int consumer_warp_groups = 2;
  int cluster_m = 1, cluster_n = 1;
  int n_tiles_per_cta = 1;       // N-tiles one CTA walks for one row block
  bool multicast_a = false;      // TMA multicast of the shared A tile across the cluster
  AggregationMode aggregation = AggregationMode::None;
  RowStrategy strategy = RowStrategy::NoReduction;
  int reductions = 0;            // reduction nodes in the chain
  int stages_in_chain = 1;
  SmemBudget smem;
  int smem_limit = 0;
  int64_t tiles_m = 0, tiles_n = 0;
  int clusters_resident = 0;     // from DeviceModel, at this cluster size
  int ctas_busy = 0;             // SMs that can hold a CTA at this cluster size
  std::vector<std::string> reasons;  // one line per choice, why it was made
};

// Throws Error with the reason when nothing fits (e.g. N beyond what any plan covers).
Plan make_plan(const FusionSpec& s, const Problem& p, const DeviceModel& dev = {},
               const PlannerTunables& tun = {}, const PlanOptions& opt = {});

std::string explain(const FusionSpec& s, const Plan& p);  // text, for `comfuse explain`
std::string to_dot(const FusionSpec& s, const Plan& p);   // Graphviz: stages, reductions, bypass edges

}  // namespace comfuse
