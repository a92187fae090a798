// The measured configuration tables and the device models (calibration.h has the constants).
#include "calibration.h"
#include "plan_internal.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cctype>

namespace comfuse {

// The shortest K at which the small-M split-K row below pays (see there).
constexpr int64_t kSmallMSplitKMinK = 8192;
// The shortest K at which a short epilogue's cooperative 128x256 tile measured faster (below).
constexpr int64_t kCooperativeMinK = 4096;

namespace {

// M <= 256 is bound by B's stream. Where 64x128 tiles would cover at most half the SMs, 64x64
// puts B on twice the SMs.
bool narrow(const Problem& p, int64_t row_blocks, const DeviceModel& dev) {
  return row_blocks * ((p.n + 127) / 128) <= dev.sm_count / 2;
}

// The most K-splits S, a power of two from 2 to up_to, for which fits(S) holds; 0 if none.
template <class Fits>
int most_splits(int up_to, Fits fits) {
  int splits = 0;
  for (int s = 2; s <= up_to; s *= 2)
    if (fits(s)) splits = s;
  return splits;
}

// Pairs of row blocks along M (clusters of 2 sharing B) where every SM gets a column block: each
// round of clusters streams tile_n columns of B (a gated tile twice that, for every width alike),
// so the time goes as rounds x tile_n.
int64_t pair_rounds_x_columns(const Problem& p, int64_t row_blocks, const DeviceModel& dev, int64_t tile_n) {
  const int64_t slots = std::max(1, dev.resident(2)), row_pairs = (row_blocks + 1) / 2;
  return (row_pairs * ((p.n + tile_n - 1) / tile_n) + slots - 1) / slots * tile_n;
}

// The tile width for such pairs: 192 where it takes fewer rounds x columns (Llama-2-7B's N =
// 11008 at M = 128: 86 blocks of 128 for 66 clusters, two rounds, against 58 of 192 in one); 128
// otherwise, as measured (256 only ever ties).
int pair_tile_n(const Problem& p, int64_t row_blocks, const DeviceModel& dev) {
  return pair_rounds_x_columns(p, row_blocks, dev, 192) < pair_rounds_x_columns(p, row_blocks, dev, 128) ? 192 : 128;
}

// The ring an M <= 256 plan may take: as deep as SMEM holds. Its stream of B is paced by the
// bytes in flight an SM, which the ring's depth sets (bench/sweeps/weight_stream_m128.txt: 64x64
// pairs at 128 x 8448 x 4096 27.8 us with 8 stages, 24.8 with 12; 128 x 11008 x 4096 38.7 and
// 35.1; 64x128 with 4, 6, 8 stages 27.1, 23.2, 22.0). Only 64x64 tiles (16 KiB a stage) reach
// past 8 (12-13); the wider tiles meet SMEM's limit at 8 or fewer.
constexpr int kStreamRing = Sm90::kMaxRingStages;

}  // namespace

// One row block (M <= 64) with long K: the 64x64 tiles alone put B on only N / 64 SMs (64 at N =
// 4096), each streaming all of K; 64x128 tiles with K split over S CTAs a tile put B on
// N / 128 x S SMs, each streaming K / S, and the owner adds the partials through L2
// (bench/sweeps/decode_long_k_split.txt, bias + GELU unless said): 1 x 4096 x 11008 54.6 ->
// 29.8 us (S = 4), 1 x 4096 x 14336 68.5 -> 37.1 (S = 2: 41.3, S = 8 with 64x256: 40.2), a plain
// GEMM 32 x 4096 x 14336 45.6 -> 37.4; at K = 4096 it pays only for the fewest rows (1 x 4096
// 19.5 -> 14.7, 16 x 4096 16.4 -> 15.3, 32 x 4096 13.5 -> 15.8 slower; 1 x 2048 12.3 -> 11.7 with
// S = 8), and at K = 1024 never (decode_elementwise_split_k.txt). S: the most splits, up to 8 and
// at least 8 k-blocks each, whose CTAs fit the SMs (4 at N = 4096, 8 at N = 2048). 0: no split.
// With a row reduction the row-group model ties such splits (all of B over the DRAM at one
// rate) and takes the cheapest gather, fewer CTAs; measured (decode_split_residual.txt), the
// most CTAs win there too: residual + RMSNorm 1 x 4096 x 14336 S = 2 45.1 us, S = 4 39.4;
// RMSNorm 1 x 4096 x 4096 19.2 and 15.4; 1 x 2048 x 4096 S = 4 12.7, S = 8 12.0.
int single_row_block_k_splits(const Problem& p, const DeviceModel& dev) {
  if (p.m > 64 || p.k < 4096 || (p.k < 8192 && p.m > 16)) return 0;
  const int64_t tiles = (p.n + 127) / 128;
  return most_splits(8, [&](int s) { return tiles * s <= dev.sm_count && p.k / s >= 8 * Sm90::kTileK; });
}

// Decode rows (M <= 16) with a row reduction whose 64-column tiles keep the row within a group of
// 32 CTAs (N <= 2048), K >= 4096: 64x64 tiles in L2 row groups with K split over the most CTAs a
// tile, up to 8, that fit the SMs (up to 128 CTAs: 8 at N <= 1024, 4 at N = 2048), against
// single_row_block_k_splits' 64x128 (B over up to twice the SMs, as the elementwise split below
// measured, and a quarter of the partial bytes to gather). MEASURED
// (bench/sweeps/decode_norm_narrow_split_k.txt, against the 64x128 split over 8, H100 unless said):
// residual LayerNorm 1 x 1024 x 4096 1.366x -> 1.182x cuBLAS, 16 x 1024 x 4096 1.830x -> 1.227x;
// RMSNorm 1 x 2048 x 4096, S = 4: 8.5 against 8.8 us, 8.0 against 8.5-8.6 in two passes (H200);
// rows of several reductions at N = 2048, S = 4 (Stop 61): LayerNorm 1 x 2048 x 4096 9.0 against
// 9.9 us in two passes, 8 x 2048 9.0 / 10.1, 16 x 2048 9.7 / 12.7, residual LayerNorm 16 x 2048
// 10.4 / 13.6, softmax 16 x 2048 9.6 / 10.6, log-softmax 1 x 2048 8.6 / 9.6, the five-round chain
// 16 x 2048 15.2-15.3 / 18.9 in two passes. At 64 CTAs a row it loses (LayerNorm 8 x 4096 x 4096
// 1.324x -> 1.415x, softmax 16 x 4096 x 4096 1.386x -> 1.492x), hence N <= 2048.
int narrow_row_group_k_splits(const Problem& p, const DeviceModel& dev) {
  const int64_t tiles = (p.n + 63) / 64;
  if (p.m > 16 || p.k < 4096 || tiles > 32) return 0;
  const int64_t group = std::bit_ceil(static_cast<uint64_t>(tiles));  // the row group: a power of two
  return most_splits(8, [&](int s) { return group * s <= dev.sm_count; });
}

// One row block at mid K, an elementwise epilogue: 64x64 tiles put B on only
// N / 64 SMs, each streaming all of K; with K split over S CTAs a tile, N / 64 x S SMs stream
// K / S each, and the owner's warp group sums S - 1 partial 64x64 tiles (16 KiB each) in SMEM
// (KernelConfig::split_gather_rows). Where 64x128 tiles split the same way, the owner's gather of
// 32 KiB partials costs more than the SMs it adds. MEASURED on the H100, against 64x64 alone
// (bench/sweeps/split_gather_whole_tiles.txt, narrow_tile_split_k.txt; a cast unless said, us):
// the small FFN's GEMM2 64 x 1024 x 3072 9.4 -> 7.5 (S = 4; S = 8 on 128 CTAs 8.2; 64x128 with
// S = 8 10.6, S = 16 27.3), with bias + GELU 9.9 -> 7.9; 32 x 1024 x 3072 10.3 -> 7.0;
// 64 x 768 x 3072 9.3 -> 7.6; 64 x 1024 x 4096 11.8 -> 8.1; 64 x 2048 x 4096 11.9 -> 10.2 (S = 2);
// at K = 2048 it loses (48 x 2048 x 2048, S = 2: 7.7 -> 8.0). At decode rows, where only M rows
// of each partial travel (`decode_narrow_split_k.txt`), below K = 4096's own rule
// (single_row_block_k_splits): 1 x 768 x 3072 10.2 -> 6.2 us (0.92x cuBLAS), 8 x 1024 x 3072
// 10.3 -> 6.3, 16 x 2048 x 3072 (S = 2) 10.3 -> 8.7, bias + GELU 4 x 1024 x 3072 10.8 -> 6.7.
// S: the most splits, up to 4, whose CTAs take at most half the SMs, at least 12 k-blocks each,
// where K >= 3072. Measured on the H100 only; the H200 model takes it too, unmeasured there.
int narrow_tile_k_splits(const Problem& p, const DeviceModel& dev) {
  if (p.m > 64 || p.k < 3072) return 0;
  const int64_t tiles = (p.n + 63) / 64;
  return most_splits(4, [&](int s) { return tiles * s <= dev.sm_count / 2 && p.k / s >= 12 * Sm90::kTileK; });
}

DeviceModel device_model(std::optional<Gpu> gpu) {
  DeviceModel d;
  d.gpu = gpu.value_or(Gpu::H200);
  if (d.gpu == Gpu::H200) return d;
  // The H100 80GB HBM3 (SXM), MEASURED in bench/sweeps/h100_long_k.txt and wide_n_cooperative.txt
  // (bench/NOTES.md Stop 54), each plan against cuBLAS GEMM alone in alternating rounds:
  // - PingPong tiles run behind cooperative 128x256, which keeps cuBLAS's rate there as on the H200
  //   (plain GEMM, us): 128x128 in pairs along M 412 against 392 at 8192 x 4096 x 4096, 1327
  //   against 1164 at 8192 x 4096 x 12288, 415 against 384 at 4096 x 8192 x 4096 (0.88-0.95 of it,
  //   mean 0.92; the row groups take 0.90, for LayerNorm 8192 x 4096 x 4096's first pair below,
  //   where this model gives cooperative's unhidden epilogue 44); 64x256
  //   in pairs 460 against 384 (0.835, against the H200 table's 0.95). 64x128 as 128x128 (a
  //   GUESS: Stop 53's 64x128 pairs ran 0.67-0.80 of 128x128's rate, the H200's 0.66).
  d.pingpong_rate = {{64128, 0.90}, {64256, 0.88}, {128128, 0.90}};
  // - With these rates the row groups take cooperative tiles at prefill, measured (us, PingPong
  //   against cooperative): LayerNorm 8192 x 4096 x 4096 444 / 393 and 434 / 434 in two calls;
  //   4096 x 8192 x 4096 LayerNorm 580 / 473, RMSNorm 525 / 424, softmax 598 / 460; residual
  //   RMSNorm 8192 x 4096 x 12288 1396 / 1189 (at K = 4096, where PingPong stays, a tie: 457 / 459).
  // - And a cast takes cooperative at 8192 x 4096 (2048 tiles of 128x128): 1.003-1.008x cuBLAS
  //   against PingPong's 1.079-1.109x at K = 4096 and 12288.
  d.cooperative_short_epilogue_max_tiles = kLargeTiles128;
  // - HBM3 at 3.35 TB/s peak (the H200's 4.8), at the H200's measured share of it (GUESS).
  d.dram_bytes_per_s = 2.8e12;
  return d;
}

std::string_view name_of(Gpu g) { return g == Gpu::H100 ? "H100" : "H200"; }
std::optional<Gpu> gpu_named(std::string_view name) {
  const auto same = [&](std::string_view known) {
    return std::equal(name.begin(), name.end(), known.begin(), known.end(),
                      [](char a, char b) { return std::tolower(static_cast<unsigned char>(a)) == std::tolower(static_cast<unsigned char>(b)); });
  };
  for (Gpu g : {Gpu::H200, Gpu::H100})
    if (same(name_of(g))) return g;
  return std::nullopt;
}

double row_tile_rate(const PlannerTunables& tun, int tile_m, int mma_cols, int cluster_m) {
  if (tile_m != 64) return 1.0;
  // Within the row class (the floor lookup would cross it): 64-column tiles at the table's narrowest, 128.
  const int cols = std::clamp(mma_cols, 128, 256);
  const auto rate = [&](int rows) { return plan_detail::lookup(tun.row_group_mainloop_efficiency, rows * 1000 + cols); };
  return rate(64) / rate(128) * (cluster_m > 1 ? 1.0 : tun.row_group_no_multicast_efficiency);
}

// Elementwise epilogues by shape class: each row measured fastest on the H200 (bench/NOTES.md:
// ncu and same-power-state timing against cuBLAS).
MeasuredConfig measured_elementwise_config(const Problem& p, const DeviceModel& dev, bool short_epilogue,
                                           bool may_split_k) {
  const int64_t tiles_128 = (p.m + 127) / 128 * ((p.n + 127) / 128);
  // M <= 256 (bench/NOTES.md Stop 29; bench/sweeps/one_wave_tiles.txt, one_wave_rule.txt,
  // small_m_b_reuse.txt). These problems are bound by B's stream, so the two choices are how
  // many SMs pull B and how often each panel of it is read:
  // - the tile: 64x64 where 64x128 tiles would cover at most half the SMs (twice the SMs on
  //   B: 7-14% faster at 8 to 64 such tiles, 4-5% slower at 96 and 128), else 64x128, or 64x192
  //   for pairs along M where that takes fewer rounds of clusters (pair_tile_n: 128 x 11008 x
  //   4096 bias + GELU 30.5 us, 1.12x cuBLAS; the SwiGLU FFN's three kernels 99.5 -> 89.8 us,
  //   bench/NOTES.md Stop 33);
  // - the cluster: with two or more row blocks of 64, pairs along M share B (multicast, one read
  //   of each panel for two row blocks): 128 x 16384 x 4096 52.1 -> 40.9 us, 256 x 4096 x 4096
  //   24.4 -> 17.7, 256 x 2048 x 4096 13.8 -> 13.0 (64x64), 128 x 4096 x 16384 52.8 -> 48.1
  //   (64x64), 192 x 4096 x 4096 23.3 -> 22.5; with one row block, 64x128 pairs along N share A,
  //   64x64 tiles run alone;
  // - long K (bench/NOTES.md Stop 30, bench/sweeps/small_m_split_k.txt): where 64x64 pairs along
  //   M would fill the SMs, 64x128 pairs with K split in two put as many CTAs on B while each
  //   reads half as much of A (A is re-read once per column block): 128 x 4096 x 16384 48.2 ->
  //   43.8 us, 192 x 2048 x 16384 60.6 -> 47.3; a tie at K = 8192 (27.0 vs 26.7, 23.5 vs 23.7);
  //   slower at 4096 (15.1 vs 13.4, 14.7 vs 13.0): the owner's gather through L2 pays only
  //   behind a long mainloop.
  if (p.m <= 256) {
    const int64_t row_blocks = (p.m + 63) / 64;
    const bool few_tiles = narrow(p, row_blocks, dev);
    if (may_split_k && few_tiles && row_blocks >= 2 && p.k >= kSmallMSplitKMinK)
      return {64, 128, 1, 2, 1, kStreamRing, 8, false,
              fmt::format("M <= 256, {} row blocks, K = {} >= {}: PingPong 64x128 in pairs along M (B multicast), "
                          "K split in two (as many CTAs as 64x64 tiles, half of A's re-reads; measured 9-22% faster "
                          "at K = 16384, a tie at 8192)",
                          row_blocks, p.k, kSmallMSplitKMinK),
              2};
    if (row_blocks >= 2) {
      const int tile_n = few_tiles ? 64 : pair_tile_n(p, row_blocks, dev);
      return {64, tile_n, 1, 2, 1, kStreamRing, 8, false,
              fmt::format("M <= 256, {} row blocks: PingPong 64x{}, pairs along M share B (multicast; measured "
                          "1.04-1.38x faster than pairs along N sharing A){}",
                          row_blocks, tile_n,
                          tile_n == 192 ? "; 192 columns: the column blocks fill the SMs in one round, where 128 would "
                                          "leave a partial second"
                                        : "")};
    }
    // One row block with K split over `splits` CTAs a 64 x tile_n tile, no cluster.
    const auto row_block_split = [&](int tile_n, int splits, std::string_view measured) {
      return MeasuredConfig{64, tile_n, 1, 1, 1, kStreamRing, 8, false,
                            fmt::format("M <= 64, one row block, K = {}: PingPong 64x{} with K split over {} CTAs a "
                                        "tile ({} CTAs on B where 64x64 alone puts {}; {})",
                                        p.k, tile_n, splits, (p.n + tile_n - 1) / tile_n * splits, (p.n + 63) / 64,
                                        measured),
                            splits};
    };
    if (const int splits = single_row_block_k_splits(p, dev); may_split_k && few_tiles && splits > 1)
      return row_block_split(128, splits, "measured 1.1-1.8x faster at K >= 11008, 1.07-1.33x at K = 4096 with M <= 16");
    if (const int splits = narrow_tile_k_splits(p, dev); may_split_k && few_tiles && splits > 1)
      return row_block_split(64, splits,
                             "the owner gathers 64x64 partial tiles, a third of 64x128's bytes; measured 1.2-1.7x "
                             "faster at K = 3072-4096 on the H100");
    if (few_tiles)
      return {64, 64, 1, 1, 1, kStreamRing, 8, true,
              "M <= 64 with 64x128 tiles for at most half the SMs: PingPong 64x64, no cluster (7-14% faster "
              "measured: B spread over twice the SMs)"};
    return {64, 128, 1, 1, 2, kStreamRing, 8, true, "M <= 64: PingPong 64x128, C_N = 2 (A multicast), raster along N"};
  }
  if (tiles_128 >= kLargeTiles128)  // >= ~8 waves of 128x128 tiles: cooperative 128x256, B shared along M
    return {128, 256, 2, 2, 1, 4, 8, false,
            "large (>= ~8 waves): cooperative 128x256, cluster 2 along M (B multicast), tensor pipe ~91% like cuBLAS"};
  // Rows of A and B not 128-byte aligned (K not a multiple of 64): each TMA box row straddles two
  // L2 lines, and PingPong 128x128, which reads a third more from L2 a MAC than cooperative
  // 128x256, runs ~1.5x cuBLAS (bench/sweeps/ragged_k_pingpong.txt: a plain cast 8192x1536x4104
  // 214.0 us against 149.0 cooperative, where K = 4160, 65 k-blocks on aligned rows, runs 147.4 and
  // 142.7; bias + GELU 8192x4096x4104 575.0 against 456.3, where K = 4096 runs 407.8 PingPong).
  // A short epilogue (a cast, a bias) behind long K, one to four waves: cooperative 128x256 as on
  // the large shapes. Its epilogue, not overlapped, is a sliver of a 128x256 tile's K >= 4096
  // mainloop, and it reads less from L2 a MAC (bench/sweeps/cooperative_128x256.txt,
  // cooperative_short_epilogue.txt, a plain cast: 8192x1024x4096 88.0-90.4 against 96.9-98.0 us,
  // 1.02x cuBLAS against 1.10-1.11x in four passes; 4096x4096x4096 185.1-188.5 against
  // 187.5-191.1, 1-2%). At K = 1024 the exposed epilogue loses: a cast 95.9 against 94.1 us, bias +
  // GELU 118.0 against 104.0. Under a wave of 128x256 tiles, fewer CTAs: PingPong's smaller tiles
  // keep more SMs busy.
  const bool rows_unaligned = rows_off_128_byte_lines(p);
  const bool long_k_short_epilogue =
      short_epilogue && p.k >= kCooperativeMinK && tiles_128 < dev.cooperative_short_epilogue_max_tiles;
  if ((rows_unaligned || long_k_short_epilogue) && tiles_128 >= 2 * dev.sm_count)
    return {128, 256, 2, 2, 1, 4, 8, false,
            rows_unaligned
                ? fmt::format("K = {} leaves A's rows (and an N x K B's) off 128-byte lines: cooperative 128x256, cluster 2 along "
                              "M (B multicast), the tile that reads least from L2 a MAC (measured 1.07-1.08x cuBLAS "
                              "against PingPong 128x128's 1.47-1.54x at K = 4104)",
                              p.k)
                : fmt::format("a short epilogue behind K = {} >= {}: cooperative 128x256, cluster 2 along M (B "
                              "multicast); measured 1.02x cuBLAS against PingPong 128x128's 1.10x at 8192x1024x4096",
                              p.k, kCooperativeMinK)};
  if (tiles_128 >= kMediumTiles128)
    return {128, 128, 1, 2, 1, 5, 4, false,
            "medium: PingPong 128x128 hides the epilogue behind the other WG's mainloop, cluster 2 along M"};
  // ~4 waves: with an epilogue, B shared along M measured 1.015x cuBLAS (plain GEMM alone
  // preferred no cluster by 3%, but a fused kernel always has an epilogue).
  return {128, 128, 1, 2, 1, 5, 8, false, "~4 waves: PingPong 128x128, cluster 2 along M, raster 8 M-blocks"};
}

// A gated GEMM's tile holds its columns twice (B's and the gate's: KernelConfig::gated), so its
// wgmma is the plain GEMM's of twice tile_n and a warp group keeps 64 rows (one m64 block):
// - large M: cooperative 128x128, cluster 2 along M: the mainloop of the plain GEMM's
//   cooperative 128x256 (the tensor pipe's best shape), the short epilogue (an activation and
//   a product) not hidden;
// - M <= 256 (bound by B's stream, as above): pairs along M share both B tiles, 64 x tile_n with
//   tile_n 64 or 128, whichever takes fewer rounds x columns streamed a CTA (128 x 11008 x 4096:
//   64x64, 56.5 us, 1.011x cuBLAS's two GEMMs; 64x128 59.7); one row block: 64x64 alone, B spread
//   over the most SMs (32 x 11008 x 4096: 54.9 us against 61.9 for 64x128 in clusters along N
//   sharing A, bench/NOTES.md Stop 34).
MeasuredConfig gated_elementwise_config(const Problem& p, const DeviceModel& dev) {
  if (p.m > 256)
    return {128, 128, 2, 2, 1, 8, 8, false,
            "a gated GEMM: cooperative 128x128 (a 128x256 wgmma over B's and the gate's columns), cluster 2 along M "
            "(both multicast)"};
  const int64_t row_blocks = (p.m + 63) / 64;
  if (row_blocks >= 2) {
    const int tile_n = narrow(p, row_blocks, dev) || pair_rounds_x_columns(p, row_blocks, dev, 64) <
                                                         pair_rounds_x_columns(p, row_blocks, dev, 128)
                           ? 64
                           : 128;
    return {64, tile_n, 1, 2, 1, kStreamRing, 8, false,
            fmt::format("a gated GEMM, M <= 256, {} row blocks: PingPong 64x{} (a {}-column wgmma), pairs along M "
                        "share B and the gate (multicast)",
                        row_blocks, tile_n, 2 * tile_n)};
  }
  return {64, 64, 1, 1, 1, kStreamRing, 8, true,
          "a gated GEMM, M <= 64: PingPong 64x64 (a 128-column wgmma), no cluster: B spread over the most SMs "
          "(measured 11% faster than 64x128 in clusters along N)"};
}

}  // namespace comfuse
