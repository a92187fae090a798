// Summary of a traced launch (kernels/comfuse/debug/trace.cuh): where each CTA's time went.
//
// Within a CTA, intervals use clock64 (exact, this SM's cycles), converted to microseconds
// with the CTA's own measured clock (cycles / globaltimer ns over its span); across CTAs only
// %globaltimer is comparable. PingPong: the tensor cores serve the two consumers' jobs in
// turn order, so the idle time between jobs is next turn - previous accumulators ready (> 0),
// and it is "behind an epilogue" when the next job's warp group was still in its previous
// epilogue then. Cooperative: both WGs take every job; WG0's sequence is the CTA's.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <tuple>

#include "comfuse/debug/trace.cuh"
#include "comfuse/harness.h"
#include "comfuse/runtime.h"

namespace comfuse {

namespace {

struct Stamp {
  uint64_t ns = 0, cyc = 0;
};
struct Job {
  int wg = 0, index = 0;
  Stamp ev[trace::kEvents];
};
struct Cta {
  int sm = -1, peers_key = 0;
  double poll_us = 0, polls = 0;  // every consumer WG's thread 0, in L2 exchange polls
  double stage_us[trace::kWGs][trace::kStages] = {};  // B2B: per consumer WG, its jobs' per-chunk stages
  double epi_us[trace::kWGs][trace::kEpiParts] = {};  // per consumer WG, its jobs' epilogue parts
  std::vector<Job> jobs;  // by turn
  double ghz = 0;         // cycles per ns over the CTA's span
  // The CTA's entry, its release from the previous grid's wait, its consumers' last exit (0: not stamped).
  uint64_t entry_ns = 0, released_ns = 0, exit_ns = 0;
};

struct Stats {
  std::vector<double> v;
  void add(double x) { v.push_back(x); }
  double mean() const { return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / double(v.size()); }
  double pct(double q) const {
    if (v.empty()) return 0;
    std::vector<double> s = v;
    std::sort(s.begin(), s.end());
    return s[std::min(s.size() - 1, size_t(q * double(s.size())))];
  }
  double max() const { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }
  std::string str() const {
    return fmt::format("mean {:.2f}, p50 {:.2f}, p90 {:.2f}, max {:.2f}", mean(), pct(0.5), pct(0.9), max());
  }
};

// Every CTA that recorded a job: its jobs (of both warp groups, or WG0's only when
// `both_wgs` is false: a cooperative tile), sorted by start; the CSV of every stamp.
// peers_key(c): which set of row peers CTA c belongs to.
template <class PeersKey>
std::vector<Cta> parse_ctas(const std::vector<uint64_t>& w, bool both_wgs, PeersKey peers_key, std::string* csv) {
  if (csv) *csv = "cta,sm,wg,job,event,globaltimer_ns,clock64\n";
  std::vector<Cta> ctas;
  for (int c = 0; c < trace::kMaxCtas; ++c) {
    const uint64_t* rec = w.data() + size_t(c) * trace::kWordsPerCta;
    if (rec[trace::kWordsPerCta - 1] == 0) continue;
    Cta cta;
    cta.sm = int(rec[trace::kWordsPerCta - 1]) - 1;
    cta.peers_key = peers_key(c);
    for (int wg = 0; wg < trace::kWGs; ++wg)
      for (int j = 0; j < trace::kMaxJobs; ++j) {
        Job job{wg, j, {}};
        bool ok = true;
        for (int e = 0; e < trace::kEvents; ++e) {
          const size_t at = size_t((wg * trace::kMaxJobs + j) * trace::kEvents + e) * 2;
          job.ev[e] = {rec[at], rec[at + 1]};
          if (e < trace::kCoreEvents)  // the exchange's stamps are optional
            ok = ok && rec[at] != 0 && (e == 0 || job.ev[e].cyc >= job.ev[e - 1].cyc);
          if (csv && rec[at] != 0)
            *csv += fmt::format("{},{},{},{},{},{},{}\n", c, cta.sm, wg, j, e, rec[at], rec[at + 1]);
        }
        if (ok && (both_wgs || wg == 0)) cta.jobs.push_back(job);
      }
    if (cta.jobs.empty()) continue;
    cta.entry_ns = rec[trace::kEntryWord];
    cta.released_ns = rec[trace::kReleasedWord];
    for (int wg = 0; wg < trace::kWGs; ++wg) cta.exit_ns = std::max(cta.exit_ns, rec[trace::kExitBase + wg]);
    if (csv) {  // the CTA's own stamps: job -1, events trace::kCsvEntry.. (globaltimer only)
      if (cta.entry_ns) *csv += fmt::format("{},{},-1,-1,{},{},0\n", c, cta.sm, int(trace::kCsvEntry), cta.entry_ns);
      if (cta.released_ns)
        *csv += fmt::format("{},{},-1,-1,{},{},0\n", c, cta.sm, int(trace::kCsvReleased), cta.released_ns);
      for (int wg = 0; wg < trace::kWGs; ++wg)
        if (rec[trace::kExitBase + wg])
          *csv += fmt::format("{},{},{},-1,{},{},0\n", c, cta.sm, wg, int(trace::kCsvExit), rec[trace::kExitBase + wg]);
    }
    std::sort(cta.jobs.begin(), cta.jobs.end(),
              [](const Job& a, const Job& b) { return a.ev[trace::kTurn].cyc < b.ev[trace::kTurn].cyc; });
    const Stamp& a = cta.jobs.front().ev[trace::kTurn];
    Stamp b = a;
    for (const Job& j : cta.jobs) b = j.ev[trace::kEpiDone].cyc > b.cyc ? j.ev[trace::kEpiDone] : b;
    cta.ghz = b.ns > a.ns ? double(b.cyc - a.cyc) / double(b.ns - a.ns) : 0;
    // The sums count this SM's cycles.
    const double us = cta.ghz > 0 ? 1e-3 / cta.ghz : 0;
    for (int wg = 0; wg < trace::kWGs; ++wg) {
      cta.poll_us += double(rec[trace::kPollBase + 2 * wg]) * us;
      cta.polls += double(rec[trace::kPollBase + 2 * wg + 1]);
      for (int st = 0; st < trace::kStages; ++st)
        cta.stage_us[wg][st] = double(rec[trace::kStageBase + wg * trace::kStages + st]) * us;
      for (int pt = 0; pt < trace::kEpiParts; ++pt)
        cta.epi_us[wg][pt] = double(rec[trace::kEpiBase + wg * trace::kEpiParts + pt]) * us;
    }
    ctas.push_back(std::move(cta));
  }
  return ctas;
}

// The launch's first start and last done, globaltimer ns.
std::pair<uint64_t, uint64_t> launch_window(const std::vector<Cta>& ctas) {
  uint64_t t0 = UINT64_MAX, t1 = 0;
  for (const Cta& c : ctas) {
    t0 = std::min(t0, c.jobs.front().ev[trace::kTurn].ns);
    for (const Job& j : c.jobs) t1 = std::max(t1, j.ev[trace::kEpiDone].ns);
  }
  return {t0, t1};
}

// Per set of row peers, warp group and job: the first and last globaltimer stamp of event ev
// among the peers (jobs that did not stamp it are left out).
using PeerWindows = std::map<std::tuple<int, int, int>, std::pair<uint64_t, uint64_t>>;
PeerWindows peer_windows(const std::vector<Cta>& ctas, trace::Event ev) {
  PeerWindows w;
  for (const Cta& c : ctas)
    for (const Job& j : c.jobs) {
      const uint64_t t = j.ev[ev].ns;
      if (t == 0) continue;
      auto [it, fresh] = w.try_emplace({c.peers_key, j.wg, j.index}, UINT64_MAX, 0);
      it->second.first = std::min(it->second.first, t);
      it->second.second = std::max(it->second.second, t);
    }
  return w;
}

}  // namespace

std::string summarize_trace(const std::vector<uint64_t>& w, const Plan& plan, std::string* csv) {
  if (w.size() < size_t(trace::kWords)) return "trace: none (build with CompileOptions::trace / --trace)\n";
  const bool pingpong = plan.kernel.wgs_per_tile == 1;
  const int cn = std::max(1, plan.kernel.cluster_n), cm = std::max(1, plan.kernel.cluster_m), g = std::max(1, plan.kernel.row_group);
  const int ks = std::max(1, plan.kernel.k_splits);
  // The CTAs that exchange a row's partials (scheduler/tile_scheduler.cuh): one cluster along
  // N, or a row group of clusters per rank along M; with split-K only the owners (split 0) of a
  // split group exchange, so every other split's CTA is a set of its own.
  const std::vector<Cta> ctas = parse_ctas(w, pingpong, [&](int c) {
    const int bx = c / cn, cluster = bx / cm, rank_m = bx % cm, in_group = cluster % (g * ks);
    const int split = plan.kernel.splits_in_cluster ? in_group % ks : in_group / g;
    return split == 0 ? (cluster / (g * ks)) * cm + rank_m : -1 - c;
  }, csv);
  if (ctas.empty()) return "trace: no CTA recorded a job\n";

  const auto [t0, t1] = launch_window(ctas);
  Stats mainloop, epilogue, idle, idle_epi, span, head, tail, ghz, jobs, poll_per_job, polls_per_job,
      part[trace::kEpiParts], before_turn, after_done;
  uint64_t first_entry = UINT64_MAX, last_exit = 0;
  for (const Cta& c : ctas) {
    const double us = c.ghz > 0 ? 1e-3 / c.ghz : 0;  // microseconds per cycle
    double gaps = 0, behind_epi = 0;
    for (size_t i = 0; i < c.jobs.size(); ++i) {
      const Job& j = c.jobs[i];
      mainloop.add(double(j.ev[trace::kAccReady].cyc - j.ev[trace::kTurn].cyc) * us);
      epilogue.add(double(j.ev[trace::kEpiDone].cyc - j.ev[trace::kAccReady].cyc) * us);
      if (i + 1 == c.jobs.size()) continue;
      const Job& n = c.jobs[i + 1];
      const double gap = double(int64_t(n.ev[trace::kTurn].cyc - j.ev[trace::kAccReady].cyc));
      if (gap <= 0) continue;
      gaps += gap;
      // The next job's warp group's previous epilogue (PingPong), or this job's (cooperative).
      const Job* prev = nullptr;
      for (size_t k = i + 1; k-- > 0;)
        if (c.jobs[k].wg == n.wg) { prev = &c.jobs[k]; break; }
      if (prev) {
        const double busy = double(int64_t(prev->ev[trace::kEpiDone].cyc - j.ev[trace::kAccReady].cyc));
        behind_epi += std::clamp(busy, 0.0, gap);
      }
    }
    idle.add(gaps * us);
    idle_epi.add(behind_epi * us);
    const Job& last = c.jobs.back();
    uint64_t done = 0;
    for (const Job& j : c.jobs) done = std::max(done, j.ev[trace::kEpiDone].ns);
    span.add(double(done - c.jobs.front().ev[trace::kTurn].ns) * 1e-3);
    head.add(double(c.jobs.front().ev[trace::kTurn].ns - t0) * 1e-3);
    tail.add(double(last.ev[trace::kEpiDone].cyc - last.ev[trace::kAccReady].cyc) * us);
    if (c.entry_ns != 0 && c.exit_ns >= done) {
      before_turn.add((double(c.jobs.front().ev[trace::kTurn].ns) - double(c.entry_ns)) * 1e-3);
      after_done.add(double(c.exit_ns - done) * 1e-3);
      first_entry = std::min(first_entry, c.entry_ns);
      last_exit = std::max(last_exit, c.exit_ns);
    }
    ghz.add(c.ghz);
    jobs.add(double(c.jobs.size()));
    const double njobs = double(c.jobs.size()) * (pingpong ? 1 : 2);  // polls come from both WGs
    poll_per_job.add(c.poll_us / njobs);
    polls_per_job.add(c.polls / njobs);
    for (int pt = 0; pt < trace::kEpiParts; ++pt) part[pt].add((c.epi_us[0][pt] + c.epi_us[1][pt]) / njobs);
  }
  // Skew inside each set of row peers: per (warp group, job), how far apart their
  // accumulators became ready (the earliest then waits for the latest in the exchange).
  const PeerWindows ready = peer_windows(ctas, trace::kAccReady);
  Stats skew;
  size_t peer_sets = 0;
  for (const auto& [k, mm] : ready)
    if (std::get<0>(k) >= 0) {  // not a split-K follower alone
      skew.add(double(mm.second - mm.first) * 1e-3);
      ++peer_sets;
    }
  // The exchange, where the kernel stamped it: how far apart the peers published, and how long
  // after the last peer's publish each CTA saw every value (the L2's visibility and the poll).
  const PeerWindows published = peer_windows(ctas, trace::kPublished);
  Stats pub_skew, seen_after;
  for (const auto& [k, mm] : published) pub_skew.add(double(mm.second - mm.first) * 1e-3);
  for (const Cta& c : ctas)
    for (const Job& j : c.jobs) {
      if (j.ev[trace::kPublished].ns == 0 || j.ev[trace::kRoundDone].ns == 0) continue;
      const uint64_t last = published.at({c.peers_key, j.wg, j.index}).second;
      seen_after.add((double(j.ev[trace::kRoundDone].ns) - double(last)) * 1e-3);
    }

  std::string s = fmt::format(
      "trace: {} CTAs, {} jobs each ({}), launch {:.1f} us from the first turn to the last epilogue; SM clock {:.2f} GHz\n",
      ctas.size(), jobs.mean(), pingpong ? "PingPong, both consumers' jobs in turn order" : "cooperative",
      double(t1 - t0) * 1e-3, ghz.mean());
  s += fmt::format("  mainloop per job (turn -> accumulators ready), us: {}\n", mainloop.str());
  s += fmt::format("  epilogue per job (accumulators ready -> done, rounds included), us: {}\n", epilogue.str());
  if (part[trace::kEpiRootBody].max() > 0) {
    s += fmt::format("    of it per job: root stage's begin (vectors; the previous job's stores read; an early begin "
                     "runs before the turn, outside the interval above), us: {}\n",
                     part[trace::kEpiBegin].str());
    s += fmt::format("      root stage's body (tile inputs, compute, stores), us: {}\n", part[trace::kEpiRootBody].str());
    s += fmt::format("      reduce phase to the round's end (second statistic, exchange), us: {}\n",
                     part[trace::kEpiRound].str());
    s += fmt::format("        of it until published (quad reduce, second statistic, stores), us: {}\n",
                     part[trace::kEpiPublish].str());
    s += fmt::format("      later stages (bodies, stores, their rounds), us: {}\n", part[trace::kEpiPost].str());
  }
  s += fmt::format("  tensor idle between jobs per CTA (next turn - accumulators ready), us: {}\n", idle.str());
  s += fmt::format("    of it while the next job's warp group was still in an epilogue, us: {}\n", idle_epi.str());
  if (polls_per_job.max() > 0)
    s += fmt::format("    L2 exchange polls of a job ({:.1f} polls, loads issued -> every tag seen), us: {}\n",
                     polls_per_job.mean(), poll_per_job.str());
  s += fmt::format("  CTA span (first turn -> last done), us: {}\n", span.str());
  s += fmt::format("  start skew (first turn - earliest CTA's), us: {}; last epilogue (exposed tail), us: {}\n",
                   head.str(), tail.str());
  if (last_exit > 0) {
    s += fmt::format("  CTA entry -> its first turn (barriers' init, the previous grid's wait, the begin), us: {}\n",
                     before_turn.str());
    s += fmt::format("  its last epilogue's end -> its exit (the last stores completed, the exchange's retire), us: {}\n",
                     after_done.str());
    s += fmt::format("  first CTA entry -> last CTA exit, us: {:.2f} (a launch's time beyond it is outside every CTA)\n",
                     double(last_exit - first_entry) * 1e-3);
  }
  if (ks > 1) {
    // Split-K: the owners (split 0) run the epilogue after every split's partials are in, so a
    // late owner, or a late follower, delays its tile's epilogue.
    uint64_t first_release = UINT64_MAX;
    for (const Cta& c : ctas)
      if (c.released_ns) first_release = std::min(first_release, c.released_ns);
    Stats rel[2], turn[2];  // [0]: followers, [1]: owners
    for (const Cta& c : ctas) {
      const int own = c.peers_key >= 0;
      if (c.released_ns) rel[own].add(double(c.released_ns - first_release) * 1e-3);
      turn[own].add(double(c.jobs.front().ev[trace::kTurn].ns - t0) * 1e-3);
    }
    for (int own = 1; own >= 0; --own)
      s += fmt::format("  split-K {}: release from the previous grid's wait after the first CTA's, us: {}; first turn "
                       "after the earliest, us: {}\n",
                       own ? "owners" : "followers", rel[own].str(), turn[own].str());
  }
  s += fmt::format("  row peers' accumulators-ready spread per job ({} peer sets x jobs), us: {}\n", peer_sets,
                   skew.str());
  if (!published.empty()) {
    s += fmt::format("  row peers' publish spread per job, us: {}\n", pub_skew.str());
    s += fmt::format("  round's end after the last peer published (every value seen and merged), us: {}\n",
                     seen_after.str());
  }
  return s;
}

std::string summarize_b2b_trace(const std::vector<uint64_t>& w, const B2bPlan& plan, std::string* csv) {
  if (w.size() < size_t(trace::kWords)) return "trace: none (build with CompileOptions::trace / --trace)\n";
  const std::vector<Cta> ctas = parse_ctas(w, /*both_wgs=*/true, [](int c) { return c; }, csv);
  if (ctas.empty()) return "trace: no CTA recorded a job\n";
  const auto [t0, t1] = launch_window(ctas);
  Stats job, epi2, span, head, tail, ghz, jobs, stage[trace::kStages];
  for (const Cta& c : ctas) {
    const double us = c.ghz > 0 ? 1e-3 / c.ghz : 0;
    int per_wg[trace::kWGs] = {};
    for (const Job& j : c.jobs) {
      job.add(double(j.ev[trace::kAccReady].cyc - j.ev[trace::kTurn].cyc) * us);
      epi2.add(double(j.ev[trace::kEpiDone].cyc - j.ev[trace::kAccReady].cyc) * us);
      ++per_wg[j.wg];
    }
    for (int wg = 0; wg < trace::kWGs; ++wg)
      for (int st = 0; st < trace::kStages; ++st)
        if (per_wg[wg] > 0) stage[st].add(c.stage_us[wg][st] / per_wg[wg]);
    uint64_t done = 0;
    const Job* last = &c.jobs.front();
    for (const Job& j : c.jobs)
      if (j.ev[trace::kEpiDone].ns >= done) done = j.ev[trace::kEpiDone].ns, last = &j;
    span.add(double(done - c.jobs.front().ev[trace::kTurn].ns) * 1e-3);
    head.add(double(c.jobs.front().ev[trace::kTurn].ns - t0) * 1e-3);
    tail.add(double(last->ev[trace::kEpiDone].cyc - last->ev[trace::kAccReady].cyc) * us);
    ghz.add(c.ghz);
    jobs.add(double(c.jobs.size()));
  }
  const B2bConfig& k = plan.kernel;
  std::string s = fmt::format(
      "trace: {} CTAs, {} jobs each ({} of {} rows x {} of O, N1 in chunks "
      "of {}{}), launch {:.1f} us from the first job's start to the last store; SM clock {:.2f} GHz\n",
      ctas.size(), jobs.mean(),
      k.paired ? "both consumer warp groups on each job, ordered turns where they fit the ring: halves"
               : "two consumer warp groups on their own jobs",
      k.tile_m, k.tile_n2, k.chunk_n1,
      k.cluster_n1 > 1 ? fmt::format(" split over clusters of {}", k.cluster_n1) : std::string(),
      double(t1 - t0) * 1e-3, ghz.mean());
  s += fmt::format("  job (start -> O complete: every chunk's ML1, Epi1, ML2), us: {}\n", job.str());
  s += fmt::format("    of it per job, summed over its chunks: ML1 (GEMM1 issued and waited for), us: {}\n",
                   stage[trace::kGemm1].str());
  s += fmt::format("      Epi1 (F on the chunk, S into registers), us: {}\n", stage[trace::kF].str());
  s += fmt::format("      ML2 issue (GEMM2's wgmmas issued; they run behind the next chunk's ML1), us: {}\n",
                   stage[trace::kGemm2Issue].str());
  s += fmt::format("  Epi2 per job ({}), us: {}\n",
                   k.cluster_n1 > 1 ? fmt::format("O complete -> the owner summed the cluster's {} partial O over DSMEM "
                                                  "and stored GEMM2's epilogue, or a follower handed its partial over",
                                                  k.cluster_n1)
                                    : std::string("O complete -> GEMM2's epilogue stored"),
                   epi2.str());
  s += fmt::format("  CTA span (first start -> last store), us: {}\n", span.str());
  s += fmt::format("  start skew (first start - earliest CTA's), us: {}; last job's Epi2 (exposed tail), us: {}\n",
                   head.str(), tail.str());
  return s;
}

}  // namespace comfuse
