// comfuse/b2b/ring.cuh: one consumer warp group's SMEM ring of k-blocks (the B2B kernel gives
// each consumer warp group its own ring and its own producer warp, so the two consumers never
// wait on each other's loads).
//
// Stages slots, each guarded by a `full` mbarrier (one arrival: the producer's arrive.expect_tx
// with the slot's TMA bytes, which may differ per slot: an X/W1 k-block or a W2 k-block) and an
// `empty` mbarrier (one arrival: an elected consumer thread, after the warp group's wgmmas that
// read the slot completed). Phase parity: a freshly initialized barrier is in phase 0; waiting
// for parity P returns once the phase of parity P completed. The producer starts at parity 1 on
// `empty` (every slot starts free), the consumer at parity 0 on `full`.
#pragma once
#include "../common.cuh"
#include <cutlass/arch/barrier.h>

namespace comfuse::b2b {

template <int Stages>
struct Ring {
  struct Storage {
    uint64_t full[Stages];
    uint64_t empty[Stages];
  };

  struct State {
    int index = 0;
    uint32_t phase = 0;
    COMFUSE_DEVICE void advance() {
      if (++index == Stages) index = 0, phase ^= 1;
    }
  };
  static COMFUSE_DEVICE State producer_start() { return {0, 1}; }
  static COMFUSE_DEVICE State consumer_start() { return {0, 0}; }

  // One thread, before the kernel's first barrier.
  static COMFUSE_DEVICE void init(Storage& s) {
    for (int i = 0; i < Stages; ++i) {
      cutlass::arch::ClusterBarrier::init(&s.full[i], 1);
      cutlass::arch::ClusterBarrier::init(&s.empty[i], 1);
    }
  }

  // Producer: wait until slot `st` is free, then arm it for `bytes` of TMA; returns the barrier
  // the loads complete on.
  static COMFUSE_DEVICE uint64_t* acquire(Storage& s, State const& st, uint32_t bytes) {
    cutlass::arch::ClusterBarrier::wait(&s.empty[st.index], st.phase);
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&s.full[st.index], bytes);
    return &s.full[st.index];
  }

  // Consumer: wait until slot `st` holds its data.
  static COMFUSE_DEVICE void wait(Storage& s, State const& st) { cutlass::arch::ClusterBarrier::wait(&s.full[st.index], st.phase); }
  // Consumer: the warp group's wgmmas that read slot `st` completed (the caller waited for them).
  static COMFUSE_DEVICE void release(Storage& s, State const& st, int t) {
    if (t == 0) cutlass::arch::ClusterBarrier::arrive(&s.empty[st.index]);
  }
};

}  // namespace comfuse::b2b
