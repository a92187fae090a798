// The planner's storage step: the SMEM an epilogue needs, as the kernel lays it out, and the
// deepest ring of A/B k-blocks that fits beside it (KernelConfig::smem_bytes() is the total).
#include <fmt/format.h>

#include <algorithm>

#include "plan_internal.h"

namespace comfuse::plan_detail {

// One consumer WG's epilogue storage (kernels/comfuse/epilogue/stage.cuh, Exec::SharedStorage):
// per stage, its nodes' storage in one 1024-aligned block (TMA-store staging: rows x 64 columns
// of each output's dtype, KernelConfig::store_stages of them, none for a later stage's output that
// writes through a root output's staging, FusionSpec::staging_borrows; a RowBroadcast: tile_n
// floats; a TileInput keeps nothing of its own: it reads L2 or a mainloop ring slot), none for a
// stage without; then the channel's
// storage (KernelConfig::channel_smem_bytes: one per WG, shared by every reduction of the chain),
// the whole rounded to the blocks' 1024-byte alignment.
int epilogue_smem_bytes(const ChainInfo& chain, const KernelConfig& k) {
  const int rows = k.epi_rows();
  int tree = 0;
  for (const ChainInfo::StageStorage& st : chain.stage_storage)
    tree += align_up(k.store_stages * rows * st.store_bytes_per_row_of_64 + st.row_broadcasts * k.tile_n * 4, 1024);
  const int channel = k.channel_smem_bytes();
  return tree > 0 ? align_up(tree + channel, 1024) : channel;
}

bool deepest_ring(KernelConfig& k, int smem_bytes, int at_most) {
  for (int stages = at_most; stages >= 2; --stages) {
    k.ring_stages = stages;
    if (k.smem_bytes() <= smem_bytes) return true;
  }
  return false;
}

bool fit_ring(Candidate& c, const ChainInfo& chain, const DeviceModel& dev, std::optional<int> at_most) {
  c.k.epilogue_smem_bytes = epilogue_smem_bytes(chain, c.k);
  return deepest_ring(c.k, dev.smem_per_cta_bytes, at_most.value_or(c.max_ring_stages));
}

int ring_input_bytes(const FusionSpec& s, const KernelConfig& k, const PlanOptions& opt, std::string* why_not) {
  auto no = [&](std::string why) {
    if (why_not) *why_not = std::move(why);
    return 0;
  };
  if (opt.ring_inputs && !*opt.ring_inputs) return no("forced off (tile inputs l2)");
  const std::vector<int> inputs = s.root_tile_inputs();
  if (inputs.empty()) return no("the epilogue's first stage reads no [M, N] tile input");
  int bytes = 0;
  for (int arg : inputs) bytes += k.tile_input_bytes(static_cast<int>(size_of(s.args.at(static_cast<size_t>(arg)).dtype)));
  KernelConfig with = k;
  with.ring_input_bytes = bytes;
  // Only the ring's own conditions: a configuration check() refuses anyway is refused without it.
  if (const char* refused = check(with); refused && !check(k)) return no(refused);
  return bytes;
}

SmemBudget smem_budget(const KernelConfig& k) {
  SmemBudget b;
  b.mainloop_ring = k.ring_bytes();
  const int channel = k.channel_smem_bytes();
  // The channel's share of the WG's 1024-aligned epilogue block.
  const int tree_and_pad = k.epilogue_smem_bytes - channel;
  b.reduction_buffer = k.consumer_wgs * channel;
  b.store_buffer = k.consumer_wgs * tree_and_pad;
  b.stash = k.stash_space == StashSpace::Smem ? k.consumer_wgs * k.stash_bytes_per_wg() : 0;
  b.split_hand_over = k.consumer_wgs * k.split_hand_over_bytes();
  b.split_gather = k.consumer_wgs * k.split_gather_bytes();
  b.barriers = k.smem_bytes() - b.mainloop_ring - b.reduction_buffer - b.store_buffer - b.stash - b.split_hand_over -
               b.split_gather;
  return b;
}

}  // namespace comfuse::plan_detail
