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
// and, where the epilogue exchanges a row reduction, the first round's two ends (kPublished:
// its partials are out; kRoundDone: every peer's are in), which the host lines up across the
// row's CTAs; it sums the time it spends in L2 exchange polls (cluster/global_exchange.cuh).
// The B2B kernel (b2b/b2b_gemm_sm90.cuh) stamps the same four events per job (its turn is the
// job's start, kIssued the last chunk's GEMM2 issued, kAccReady O complete, kEpiDone after
// Epi2) and sums, per warp group, the time of its per-chunk stages: ML1 (GEMM1 issued and
// waited for), Epi1 (F) and ML2's issue. Every Stage-Stream epilogue (epilogue/stage.cuh; the B2B kernel's
// Epi2 too) sums its parts in slots of their own: the root stage's begin (vector loads, the
// wait for the previous job's stores), its body (inputs, compute, stores), the reduce phase to
// the round's end (of it, until its partials are published), and the later stages. The sums
// count clock64 cycles and are updated with reductions the thread does not wait for. The
// single-GEMM kernel also stamps, per CTA, its entry (before the barriers' init), its release
// from the previous grid's wait (griddepcontrol.wait: under PDL a CTA may enter long before) and
// each consumer warp group's exit (after its last stores completed and it retired from the
// exchange): what a launch spends outside the job stamps (the previous grid's wait, the begin,
// the last stores).
// The host reads `comfuse_trace` (runtime: FusedKernel::trace) after a launch; the last
// launch's stamps stay there (each launch overwrites the same slots). Jobs past kMaxJobs and
// CTAs past kMaxCtas are not recorded.
#pragma once
#include "../config.cuh"

namespace comfuse::trace {

inline constexpr int kWGs = Sm90::kMaxConsumerWGs;  // consumer warp groups a record has room for
inline constexpr int kMaxCtas = 160, kMaxJobs = 64, kEvents = 6, kStages = 3, kEpiParts = 5;
enum Event : int { kTurn = 0, kIssued = 1, kAccReady = 2, kEpiDone = 3,
                   // a row reduction's exchange (epilogue/stage.cuh): this CTA's partials published,
                   // and every peer's seen (the round's end); absent without an exchange
                   kPublished = 4, kRoundDone = 5 };
inline constexpr int kCoreEvents = 4;  // every job stamps kTurn..kEpiDone
// The host's CSV (`comfuse run --trace FILE`) lists a CTA's own stamps as job -1 with these events.
enum CsvCtaEvent : int { kCsvEntry = kEvents, kCsvReleased = kEvents + 1, kCsvExit = kEvents + 2 };
// The B2B kernel's per-chunk stages.
enum Stage : int { kGemm1 = 0, kF = 1, kGemm2Issue = 2 };
// The epilogue's parts (epilogue/stage.cuh), summed per warp group.
// kEpiRound holds kEpiPublish (the CTA's own statistics reduced and published) and the wait.
enum EpiPart : int { kEpiBegin = 0, kEpiRootBody = 1, kEpiRound = 2, kEpiPost = 3, kEpiPublish = 4 };
// Per CTA: [wg 0..kWGs-1][job][event][globaltimer, clock64]; then [wg][cycles its thread 0 spent
// in L2 exchange polls (from issuing the loads to seeing every tag), their count]; then
// [wg][stage] cycles (B2B); then [wg][epilogue part] cycles; then the CTA's entry, its release
// and [wg] exit, globaltimer ns (0: not stamped); then one word: the SM id + 1.
inline constexpr int kPollBase = kWGs * kMaxJobs * kEvents * 2;
inline constexpr int kStageBase = kPollBase + 2 * kWGs;
inline constexpr int kEpiBase = kStageBase + kWGs * kStages;
inline constexpr int kCtaBase = kEpiBase + kWGs * kEpiParts;
inline constexpr int kEntryWord = kCtaBase, kReleasedWord = kCtaBase + 1, kExitBase = kCtaBase + 2;
inline constexpr int kWordsPerCta = kExitBase + kWGs + 1;
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

// This SM's clock64 when tracing, else 0 (and the hooks below compile to nothing): the sums
// below count cycles, exact intervals on one SM like the job stamps' clock64.
__device__ __forceinline__ unsigned long long now() {
#ifdef COMFUSE_TRACE
  unsigned long long c;
  asm volatile("mov.u64 %0, %%clock64;\n" : "=l"(c));
  return c;
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

// A sum's update: a reduction the thread does not wait for (RED), where `+=` would stall it for
// an L2 round trip per update, inside the intervals it measures.
__device__ __forceinline__ void add(unsigned long long* word, unsigned long long v) { atomicAdd(word, v); }
#endif

// Thread t (0..127) of consumer warp group wg stamps event ev of its job-th job.
__device__ __forceinline__ void mark(int t, int wg, int job, Event ev) {
#ifdef COMFUSE_TRACE
  unsigned long long* rec = record();
  if (t != 0 || !rec || job >= kMaxJobs) return;
  unsigned sm;
  unsigned long long const g = global_timer_ns(), c = now();
  asm volatile("mov.u32 %0, %%smid;\n" : "=r"(sm));
  rec[((wg * kMaxJobs + job) * kEvents + ev) * 2] = g;
  rec[((wg * kMaxJobs + job) * kEvents + ev) * 2 + 1] = c;
  rec[kWordsPerCta - 1] = sm + 1;
#else
  (void)t, (void)wg, (void)job, (void)ev;
#endif
}

// Thread t of consumer warp group wg zeroes the warp group's sums (each launch reuses the
// record) before anything of its first job is counted: a job's epilogue begin may run ahead of
// its turn (KernelConfig::begin_early), which a reset at the turn would drop from the sums.
__device__ __forceinline__ void reset_sums(int t, int wg) {
#ifdef COMFUSE_TRACE
  unsigned long long* rec = record();
  if (t != 0 || !rec) return;
  rec[kPollBase + 2 * wg] = rec[kPollBase + 2 * wg + 1] = 0;
  for (int s = 0; s < kStages; ++s) rec[kStageBase + wg * kStages + s] = 0;
  for (int s = 0; s < kEpiParts; ++s) rec[kEpiBase + wg * kEpiParts + s] = 0;
#else
  (void)t, (void)wg;
#endif
}

// Thread 0 of the CTA stamps its entry.
__device__ __forceinline__ void mark_entry() {
#ifdef COMFUSE_TRACE
  unsigned long long* rec = record();
  if (threadIdx.x == 0 && rec) rec[kEntryWord] = global_timer_ns();
#endif
}

// Thread 0 of the CTA stamps its release from the previous grid's wait.
__device__ __forceinline__ void mark_released() {
#ifdef COMFUSE_TRACE
  unsigned long long* rec = record();
  if (threadIdx.x == 0 && rec) rec[kReleasedWord] = global_timer_ns();
#endif
}

// Thread t of consumer warp group wg stamps the warp group's exit.
__device__ __forceinline__ void mark_exit(int t, int wg) {
#ifdef COMFUSE_TRACE
  unsigned long long* rec = record();
  if (t == 0 && rec) rec[kExitBase + wg] = global_timer_ns();
#else
  (void)t, (void)wg;
#endif
}

// The calling consumer warp group's thread 0 stamps event ev of its job-th job.
__device__ __forceinline__ void mark_here(int job, Event ev) {
  mark(int(threadIdx.x) % 128, int(threadIdx.x) / 128 - 1, job, ev);
}

// An exchange poll that started at now() == since has seen every tag.
__device__ __forceinline__ void add_poll(unsigned long long since) {
#ifdef COMFUSE_TRACE
  int const wg = int(threadIdx.x) / 128 - 1;
  unsigned long long* rec = record();
  if (threadIdx.x % 128 != 0 || wg < 0 || !rec) return;
  add(rec + kPollBase + 2 * wg, now() - since);
  add(rec + kPollBase + 2 * wg + 1, 1);
#else
  (void)since;
#endif
}

// Thread t of consumer warp group wg adds the time since `since` (a now()) to stage st's sum.
__device__ __forceinline__ void add_stage(int t, int wg, Stage st, unsigned long long since) {
#ifdef COMFUSE_TRACE
  unsigned long long* rec = record();
  if (t != 0 || !rec) return;
  add(rec + kStageBase + wg * kStages + st, now() - since);
#else
  (void)t, (void)wg, (void)st, (void)since;
#endif
}

// The calling consumer warp group's thread 0 adds the time since `since` to epilogue part pt.
__device__ __forceinline__ void add_epi(EpiPart pt, unsigned long long since) {
#ifdef COMFUSE_TRACE
  int const wg = int(threadIdx.x) / 128 - 1;
  unsigned long long* rec = record();
  if (threadIdx.x % 128 != 0 || wg < 0 || !rec) return;
  add(rec + kEpiBase + wg * kEpiParts + pt, now() - since);
#else
  (void)pt, (void)since;
#endif
}

}  // namespace comfuse::trace
#endif  // device code
