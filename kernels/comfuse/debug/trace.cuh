// comfuse/debug/trace.cuh: an opt-in timeline of the consumer warp groups, to see where a
// fused kernel's time goes beyond what ncu's totals say (bench/NOTES.md has what it showed).
//
// Built only with -DCOMFUSE_TRACE (CompileOptions::trace, `comfuse run --trace`); otherwise
// every hook is empty and the kernel is unchanged (same SASS). Thread 0 of each consumer warp
// group stamps four events per job, both as %globaltimer (ns, comparable across SMs: cross-CTA
// skew) and clock64 (cycles of this SM: exact intervals):
//   kTurn        the warp group may issue its mainloop (PingPong: it holds the MmaTurn)
//   kIssued      all of the job's wgmmas are issued (PingPong: the turn goes to the other WG)
//   kAccReady    the accumulators are complete (mma_tail)
//   kEpiDone     the job's epilogue, cluster/L2 rounds included, has returned
// and sums the time it spends in L2 exchange polls (cluster/global_exchange.cuh). The B2B
// kernel (b2b/b2b_gemm_sm90.cuh) stamps the same four events per job (its turn is the job's
// start, kIssued the last chunk's GEMM2 issued, kAccReady O complete, kEpiDone after Epi2) and
// sums, per warp group, the time of its per-chunk stages: ML1 (GEMM1 issued and waited for),
// Epi1 (F) and ML2's issue.
// The host reads `comfuse_trace` (runtime: FusedKernel::trace) after a launch; the last
// launch's stamps stay there (each launch overwrites the same slots). Jobs past kMaxJobs and
// CTAs past kMaxCtas are not recorded.
#pragma once

namespace comfuse::trace {

inline constexpr int kMaxCtas = 160, kMaxJobs = 64, kEvents = 4, kStages = 3;
enum Event : int { kTurn = 0, kIssued = 1, kAccReady = 2, kEpiDone = 3 };
// The B2B kernel's per-chunk stages.
enum Stage : int { kGemm1 = 0, kF = 1, kGemm2Issue = 2 };
// Per CTA: [wg 0..1][job][event][globaltimer, clock64]; then [wg 0..1][ns its thread 0 spent
// in L2 exchange polls (from issuing the loads to seeing every tag), their count]; then
// [wg 0..1][stage] ns (B2B); then one word: the SM id + 1.
inline constexpr int kPollBase = 2 * kMaxJobs * kEvents * 2;
inline constexpr int kStageBase = kPollBase + 4;
inline constexpr int kWordsPerCta = kStageBase + 2 * kStages + 1;
inline constexpr int kWords = kMaxCtas * kWordsPerCta;

}  // namespace comfuse::trace

// The rest is device code (the host runtime includes this header for the layout above).
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#include "../common.cuh"

#ifdef COMFUSE_TRACE
extern "C" {
__device__ unsigned long long comfuse_trace[comfuse::trace::kWords];  // one JIT unit: defined here
}
#endif

namespace comfuse::trace {

// global_timer_ns() when tracing, else 0 (and the hooks below compile to nothing).
__device__ __forceinline__ unsigned long long now() {
#ifdef COMFUSE_TRACE
  return global_timer_ns();
#else
  return 0;
#endif
}

#ifdef COMFUSE_TRACE
// This CTA's record, or nullptr past kMaxCtas.
__device__ __forceinline__ unsigned long long* record() {
  int const cta = int(blockIdx.x * gridDim.y + blockIdx.y);
  return cta < kMaxCtas ? comfuse_trace + size_t(cta) * kWordsPerCta : nullptr;
}
#endif

// Thread t (0..127) of consumer warp group wg stamps event ev of its job-th job.
__device__ __forceinline__ void mark(int t, int wg, int job, Event ev) {
#ifdef COMFUSE_TRACE
  unsigned long long* rec = record();
  if (t != 0 || !rec || job >= kMaxJobs) return;
  unsigned long long c;
  unsigned sm;
  unsigned long long const g = now();
  asm volatile("mov.u64 %0, %%clock64;\n" : "=l"(c));
  asm volatile("mov.u32 %0, %%smid;\n" : "=r"(sm));
  if (job == 0 && ev == kTurn) {
    rec[kPollBase + 2 * wg] = rec[kPollBase + 2 * wg + 1] = 0;
    for (int s = 0; s < kStages; ++s) rec[kStageBase + wg * kStages + s] = 0;
  }
  rec[((wg * kMaxJobs + job) * kEvents + ev) * 2] = g;
  rec[((wg * kMaxJobs + job) * kEvents + ev) * 2 + 1] = c;
  rec[kWordsPerCta - 1] = sm + 1;
#else
  (void)t, (void)wg, (void)job, (void)ev;
#endif
}

// An exchange poll that started at now() == since has seen every tag.
__device__ __forceinline__ void add_poll(unsigned long long since) {
#ifdef COMFUSE_TRACE
  int const wg = int(threadIdx.x) / 128 - 1;
  unsigned long long* rec = record();
  if (threadIdx.x % 128 != 0 || wg < 0 || !rec) return;
  rec[kPollBase + 2 * wg] += now() - since;
  rec[kPollBase + 2 * wg + 1] += 1;
#else
  (void)since;
#endif
}

// Thread t of consumer warp group wg adds the time since `since` (a now()) to stage st's sum.
__device__ __forceinline__ void add_stage(int t, int wg, Stage st, unsigned long long since) {
#ifdef COMFUSE_TRACE
  unsigned long long* rec = record();
  if (t != 0 || !rec) return;
  rec[kStageBase + wg * kStages + st] += now() - since;
#else
  (void)t, (void)wg, (void)st, (void)since;
#endif
}

}  // namespace comfuse::trace
#endif  // device code
