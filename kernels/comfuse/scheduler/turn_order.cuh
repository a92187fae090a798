// comfuse/scheduler/turn_order.cuh: the order in which a PingPong CTA's two consumer warp groups
// take the tensor cores when a job holds several N-tiles (KernelConfig::tile_turns()).
//
// The CTA's jobs go in pairs, consumer 0's and consumer 1's. Taking the tensor cores a job at a
// time leaves each tile's body (the root stage between two of the job's mainloops: its
// statistic's partial, the stash store) on the tensor cores' timeline, T - 1 of them a job, each
// with the tensor pipe drained before it and refilled after. Taking them a tile at a time hides
// every body under the other consumer's mainloop, but both jobs then end together and both
// epilogues (the round, the stream over the stash) run after the last mainloop. TurnOrder takes
// the middle way: consumer 0's first Lead tiles alone, then the two consumers' tiles in turn,
// then consumer 1's last Lead tiles alone. Consumer 0's epilogue runs under consumer 1's last
// Lead mainloops, consumer 1's (the CTA's last) is exposed as it is a job at a time, and only
// the bodies of the solo stretches stay on the tensor cores' timeline. Lead = 1: a tile at a
// time; Lead = T: a job at a time. The planner's lead: src/plan/calibration.h turn_lead_wanted.
//
// The producer loads the two jobs' tiles in this order; a consumer syncs on its turn where the tile
// before its own is the other's (or its tile starts the pair) and hands the turn on where the
// next one is the other's (or its tile ends the pair).
#pragma once

namespace comfuse {

template <int T, int Lead>
struct TurnOrder {
  static_assert(T >= 1 && Lead >= 1 && Lead <= T, "TurnOrder: 1 <= Lead <= T");
  static constexpr int kTiles = 2 * T;    // the two jobs' tiles
  static constexpr int kSolo = Lead - 1;  // consumer 0's tiles before the alternation (consumer 1's after)
  // The consumer whose tile is at ring position i (in tiles from the pair's first).
  static constexpr int consumer(int i) { return i < kSolo ? 0 : i >= kTiles - kSolo ? 1 : (i - kSolo) % 2; }
  // Which of that consumer's tiles is at position i.
  static constexpr int tile(int i) {
    if (i < kSolo) return i;
    if (i >= kTiles - kSolo) return i - T;
    return (i - kSolo) / 2 + (consumer(i) == 0 ? kSolo : 0);
  }
  // The position of consumer w's tile nt (tile(pos(w, nt)) == nt).
  static constexpr int pos(int w, int nt) {
    if (w == 0) return nt < kSolo ? nt : kSolo + 2 * (nt - kSolo);
    return nt < T - kSolo ? kSolo + 2 * nt + 1 : nt + T;
  }
  // Whether the tile at position i waits for the turn, and whether the turn goes on after it.
  static constexpr bool takes_turn(int i) { return i == 0 || consumer(i - 1) != consumer(i); }
  static constexpr bool hands_turn(int i) { return i == kTiles - 1 || consumer(i + 1) != consumer(i); }
};

}  // namespace comfuse
