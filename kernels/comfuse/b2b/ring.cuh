// comfuse/b2b/ring.cuh: an SMEM ring of k-blocks, fed by one producer thread. Unpaired, the B2B
// kernel gives each consumer warp group its own ring and producer warp (the two consumers never
// wait on each other's loads); paired, both read every slot of one ring.
//
// Stages slots, each guarded by a `full` mbarrier (one arrival: the producer's arrive.expect_tx
// with the slot's TMA bytes, which may differ per slot: an X/W1 k-block or a W2 k-block) and an
// `empty` mbarrier (one arrival per consumer warp group reading it: its thread 0, after the
// warp group's wgmmas that read the slot completed: Taken). Phase parity: a freshly initialized barrier is in phase 0; waiting
// for parity P returns once the phase of parity P completed. The producer starts at parity 1 on
// `empty` (every slot starts free), the consumer at parity 0 on `full`.
//
// Beside the slots, each resident X buffer's pair (B2bConfig::x_k_blocks, x_buffers): x_full,
// armed for a job's X by the producer, and x_empty, one arrival per reader after its job's last
// GEMM1. Both sides count the jobs they loaded or read X for; job j takes buffer j % XBuffers, and
// its parity is the low bit of j / XBuffers, that buffer's use count, as a slot's.
#pragma once
#include "../common.cuh"
#include <cutlass/arch/barrier.h>

namespace comfuse::b2b {

template <int Stages, int Readers, int XBuffers = 1>
struct Ring {
  struct Storage {
    uint64_t full[Stages];
    uint64_t empty[Stages];
    uint64_t x_full[XBuffers], x_empty[XBuffers];
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
      cutlass::arch::ClusterBarrier::init(&s.empty[i], Readers);
    }
    for (int b = 0; b < XBuffers; ++b) {
      cutlass::arch::ClusterBarrier::init(&s.x_full[b], 1);
      cutlass::arch::ClusterBarrier::init(&s.x_empty[b], Readers);
    }
  }

  // Resident X, job number `job` of this ring (counted alike by producer and consumers): its
  // buffer, and that buffer's phase parity.
  static COMFUSE_DEVICE int x_buffer(int job) { return job % XBuffers; }
  static COMFUSE_DEVICE uint32_t x_parity(int job) { return uint32_t(job / XBuffers) & 1u; }
  static COMFUSE_DEVICE uint64_t* acquire_x(Storage& s, int job, uint32_t bytes) {
    cutlass::arch::ClusterBarrier::wait(&s.x_empty[x_buffer(job)], x_parity(job) ^ 1u);
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&s.x_full[x_buffer(job)], bytes);
    return &s.x_full[x_buffer(job)];
  }
  static COMFUSE_DEVICE void wait_x(Storage& s, int job) {
    cutlass::arch::ClusterBarrier::wait(&s.x_full[x_buffer(job)], x_parity(job));
  }
  // After the job's last GEMM1 completed.
  static COMFUSE_DEVICE void release_x(Storage& s, int job, int t) {
    if (t == 0) cutlass::arch::ClusterBarrier::arrive(&s.x_empty[x_buffer(job)]);
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
  // Consumer: the slots it took, in order, whose wgmmas may still run. Each k-block is one
  // wgmma commit group reading one slot, and commit groups complete in order, so after
  // warpgroup_wait<N> every slot but the last N taken is free again. Releasing as the groups
  // complete (not once per chunk) keeps the ring turning whatever K and N1 are: a consumer
  // holds at most two slots (one in flight, one awaited), so two stages never deadlock.
  struct Taken {
    State rel = consumer_start();
    int pending = 0;
    // All but the last N commit groups completed (the caller waited with warpgroup_wait<N>).
    template <int N>
    COMFUSE_DEVICE void release_all_but(Storage& s, int t) {
      for (; pending > N; --pending) {
        if (t == 0) cutlass::arch::ClusterBarrier::arrive(&s.empty[rel.index]);
        rel.advance();
      }
    }
    // A slot's wgmmas committed (one group), not waited for.
    COMFUSE_DEVICE void issued() { ++pending; }
    // Wait until all but the last N groups completed, free their slots.
    template <int N>
    COMFUSE_DEVICE void completed_but(Storage& s, int t) {
      cute::warpgroup_wait<N>();
      release_all_but<N>(s, t);
    }
    // After committing a slot's wgmmas: wait for every earlier group, free their slots.
    COMFUSE_DEVICE void completed_but_one(Storage& s, int t) {
      issued();
      completed_but<1>(s, t);
    }
    // Every wgmma completed (warpgroup_wait<0>): every slot free.
    COMFUSE_DEVICE void all_completed(Storage& s, int t) { completed_but<0>(s, t); }
  };
};

}  // namespace comfuse::b2b
