// The H200's measured configuration tables (calibration.h has the constants).
#include "calibration.h"

namespace comfuse {

// Elementwise epilogues by shape class: each row measured fastest on the H200 (bench/NOTES.md:
// ncu and same-power-state timing against cuBLAS).
MeasuredConfig measured_elementwise_config(const Problem& p, const DeviceModel& dev) {
  const int64_t tiles_128 = (p.m + 127) / 128 * ((p.n + 127) / 128);
  const int64_t tiles_64x128 = (p.m + 63) / 64 * ((p.n + 127) / 128);
  // Few row blocks and few columns: 64x128 tiles leave most SMs idle, each streaming its share
  // of B at what one SM pulls; 64x64 tiles put twice the SMs on B. Measured 7-14% faster at 8,
  // 24, 32 and 64 tiles of 64x128 (FFN GEMMs of 64 and 128 rows, 256 x 2048 x 4096, decode
  // 32 x 4096 x 1024), 4-5% slower at 96 and 128 (bench/sweeps/one_wave_tiles.txt,
  // one_wave_rule.txt; bench/NOTES.md Stop 29).
  if (p.m <= 256 && tiles_64x128 <= dev.sm_count / 2)
    return {64, 64, 1, 1, 1, 8, 8, true,
            "M <= 256 with 64x128 tiles for at most half the SMs: PingPong 64x64, no cluster (7-14% faster "
            "measured: B spread over twice the SMs)"};
  if (p.m <= 256)  // few row blocks: small tiles, pairs along N share A; L2-bound without split-K
    return {64, 128, 1, 1, 2, 8, 8, true, "M <= 256: PingPong 64x128, C_N = 2, raster along N (0.80x cuBLAS measured)"};
  if (tiles_128 >= 3000)  // >= ~8 waves of 128x128 tiles: cooperative 128x256, B shared along M
    return {128, 256, 2, 2, 1, 4, 8, false,
            "large (>= ~8 waves): cooperative 128x256, cluster 2 along M (B multicast), tensor pipe ~91% like cuBLAS"};
  if (tiles_128 >= 1500)
    return {128, 128, 1, 2, 1, 5, 4, false,
            "medium: PingPong 128x128 hides the epilogue behind the other WG's mainloop, cluster 2 along M"};
  // ~4 waves: with an epilogue, B shared along M measured 1.015x cuBLAS (plain GEMM alone
  // preferred no cluster by 3%, but a fused kernel always has an epilogue).
  return {128, 128, 1, 2, 1, 5, 8, false, "~4 waves: PingPong 128x128, cluster 2 along M, raster 8 M-blocks"};
}

}  // namespace comfuse
