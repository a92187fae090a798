// comfuse/epilogue/stash.cuh: the Stash of the multi-tile row reduction ("Stash" strategy).
//
// With NTiles = T > 1 a consumer warp group walks T N-tiles of one row block (a job, see
// scheduler/tile_scheduler.cuh). The one tile-shaped value a stage hands to the next stage
// (the stage's kTileBypass, epilogue/stage.cuh) cannot stay in the accumulator registers for
// T tiles: tiles 0..T-2 keep it in slots 0..T-2 of the warp group's Stash, the last tile keeps
// it in the accumulator registers (T - 1 slots, not T: one tile of storage saved).
//
// Layout: thread-private. Each thread reads back exactly what it wrote itself, so no barrier,
// fence or parity is needed, in SMEM or in global memory (same-thread program order). A slot
// holds the warp group's Rows x BN values as fragments (8 accumulator values of one thread,
// nodes.cuh's Frag); fragment f of thread th is kChunks 16-byte chunks at
//   slot * kSlotBytes + ((f * kChunks + h) * 128 + th) * 16        (h < kChunks)
// so the 32 lanes of a warp touch 512 contiguous bytes per access (bank-conflict free in
// SMEM, coalesced in global). T = float: 2 chunks (4 floats each); T = bf16: 1 chunk of 8
// (uncentered, a bf16 stash rounds the bypassed value like an unfused bf16 intermediate would).
// kSlotBytes = Rows * BN * sizeof(T).
//
// Centered (a 16-bit stash under the root stage's online pair, KernelConfig::stash_centers): a
// slot holds x - c rounded, c the thread's running statistic of the row after that tile (the
// running max of a softmax's pair, the running mean of LayerNorm's), and load() adds c back. The
// rounding then falls on the distance from the row's center, not on x: at most 2^-8 (typically
// 2^-9) of |x - mean| for LayerNorm (a mean far from 0 costs nothing, where rounding x itself lost
// the row at mean / std = 1000), and for softmax of (max - x), small exactly for the values that
// carry the sum. Each slot's centers, MBlocks x 2 floats a thread, follow the slots:
//   Slots * kSlotBytes + ((slot * 128 + th) * MBlocks + mi) * 8     (float2: the row slots h = 0, 1)
#pragma once
#include "nodes.cuh"

namespace comfuse::epi {

// kSmem: the region is SMEM, accessed with ld/st.shared.v4 (a generic pointer to SMEM compiled
// to generic LD/ST.E.128); else global memory (LDG/STG.128).
template <class T, int Rows, int BN, int Slots, bool kSmem, bool Centered = false> struct Stash {
  static_assert(sizeof(T) == 4 || sizeof(T) == 2, "stash type: float, bf16 or f16");
  // bf16, not f16: x - c keeps fp32's range (an f16 difference could overflow).
  static_assert(!Centered || cute::is_same_v<T, cutlass::bfloat16_t>, "a centered stash is bf16; fp32 keeps x exactly");
  static constexpr bool kCentered = Centered;
  static constexpr int kMBlocks = Rows / 64;
  static constexpr int kFrags = Rows * BN / (kWarpGroupThreads * kFrag);
  static constexpr int kFragsPerMBlock = kFrags / kMBlocks;
  static constexpr int kChunks = kFrag * int(sizeof(T)) / 16;
  static constexpr int kSlotBytes = Rows * BN * int(sizeof(T));
  static constexpr int kCenterSlotBytes = Centered ? kWarpGroupThreads * kMBlocks * 8 : 0;
  static constexpr int kBytes = Slots * (kSlotBytes + kCenterSlotBytes);
  static constexpr int kSlots = Slots;

  char* base = nullptr;     // this thread's chunk 0 of fragment 0 of slot 0 (generic: SMEM or global)
  char* centers = nullptr;  // Centered: this thread's centers of slot 0

  // region: the warp group's kBytes (SMEM or global), t: thread in the warp group.
  COMFUSE_DEVICE void bind(void* region, int t) {
    base = static_cast<char*>(region) + 16 * t;
    centers = static_cast<char*>(region) + Slots * kSlotBytes + t * kMBlocks * 8;
  }

  COMFUSE_DEVICE uint4* chunk(int slot, int f, int h) const {
    return reinterpret_cast<uint4*>(base + size_t(slot) * kSlotBytes + size_t((f * kChunks + h) * kWarpGroupThreads) * 16);
  }
  COMFUSE_DEVICE void put(int slot, int f, int h, uint4 u) const {
    if constexpr (kSmem) {
      asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_u32(chunk(slot, f, h))), "r"(u.x), "r"(u.y),
                   "r"(u.z), "r"(u.w) : "memory");
    } else {
      *chunk(slot, f, h) = u;
    }
  }
  COMFUSE_DEVICE uint4 get(int slot, int f, int h) const {
    uint4 u;
    if constexpr (kSmem) {
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
                   : "r"(smem_u32(chunk(slot, f, h))) : "memory");
    } else {
      u = *chunk(slot, f, h);
    }
    return u;
  }
  // x as the stash gives it back (a 16-bit stash rounds it; a centered one takes store_centered).
  static COMFUSE_DEVICE float stored(float x) {
    static_assert(!Centered, "a centered stash rounds x - c: store_centered");
    return DType<T>::round(x);
  }

  COMFUSE_DEVICE float2* center_at(int slot, int mi) const {
    return reinterpret_cast<float2*>(centers + (size_t(slot) * kWarpGroupThreads * kMBlocks + mi) * 8);
  }
  COMFUSE_DEVICE float2 center(int slot, int mi) const {
    static_assert(Centered, "centers: a centered stash");
    if constexpr (kSmem) {
      float2 c;
      asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(c.x), "=f"(c.y) : "r"(smem_u32(center_at(slot, mi))) : "memory");
      return c;
    } else {
      return *center_at(slot, mi);
    }
  }

  // Centered: a whole tile (the thread's accumulator registers, fragment f in registers
  // 8f .. 8f + 7, as the epilogue's bodies lay them out) into slot `slot` about c[mi][h]. The
  // registers stay unrounded: the tile's statistics are taken from them (stage.cuh
  // online_second), so a statistic carries none of the stash's rounding.
  template <class FragC, int MB>
  COMFUSE_DEVICE void store_centered(int slot, FragC const& accum, float const (&c)[MB][2]) const {
    static_assert(Centered && MB == kMBlocks, "store_centered: a centered stash, one center a row slot");
    CUTE_UNROLL
    for (int f = 0; f < kFrags; ++f) {
      int const mi = f / kFragsPerMBlock;
      uint32_t w[4];
      CUTE_UNROLL
      for (int q = 0; q < 4; ++q) {  // pair q: registers 2q, 2q + 1, row slot q & 1
        float const cq = c[mi][q & 1];
        w[q] = DType<T>::pack2(accum(8 * f + 2 * q) - cq, accum(8 * f + 2 * q + 1) - cq);
      }
      put(slot, f, 0, make_uint4(w[0], w[1], w[2], w[3]));
    }
    CUTE_UNROLL
    for (int mi = 0; mi < kMBlocks; ++mi) {
      if constexpr (kSmem) {
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(smem_u32(center_at(slot, mi))), "f"(c[mi][0]),
                     "f"(c[mi][1]) : "memory");
      } else {
        *center_at(slot, mi) = make_float2(c[mi][0], c[mi][1]);
      }
    }
  }
  COMFUSE_DEVICE void store(int slot, int f, Frag const& v) const {
    static_assert(!Centered, "a centered stash stores whole tiles about their centers: store_centered");
    if constexpr (sizeof(T) == 4) {
      CUTE_UNROLL
      for (int h = 0; h < kChunks; ++h)
        put(slot, f, h, make_uint4(__float_as_uint(v[4 * h]), __float_as_uint(v[4 * h + 1]),
                                        __float_as_uint(v[4 * h + 2]), __float_as_uint(v[4 * h + 3])));
    } else {
      put(slot, f, 0, make_uint4(DType<T>::pack2(v[0], v[1]), DType<T>::pack2(v[2], v[3]),
                                 DType<T>::pack2(v[4], v[5]), DType<T>::pack2(v[6], v[7])));
    }
  }
  // A centered stash's centers of one slot, one float2 a row block (the row slots h = 0, 1), read
  // once a tile (kRead) and handed to each fragment's load(); empty where the stash has none.
  struct Centers {
    float2 c[Centered ? kMBlocks : 1];
  };
  template <bool kRead>
  COMFUSE_DEVICE Centers centers_of(int slot) const {
    Centers cs{};
    if constexpr (Centered && kRead) {
      CUTE_UNROLL
      for (int mi = 0; mi < kMBlocks; ++mi) cs.c[mi] = center(slot, mi);
    }
    return cs;
  }
  // Fragment f of slot `slot` (cs: centers_of(slot)).
  COMFUSE_DEVICE void load(int slot, int f, Frag& v, Centers const& cs) const {
    if constexpr (sizeof(T) == 4) {
      CUTE_UNROLL
      for (int h = 0; h < kChunks; ++h) {
        uint4 u = get(slot, f, h);
        v[4 * h] = __uint_as_float(u.x); v[4 * h + 1] = __uint_as_float(u.y);
        v[4 * h + 2] = __uint_as_float(u.z); v[4 * h + 3] = __uint_as_float(u.w);
      }
    } else {
      uint4 u = get(slot, f, 0);
      uint32_t const w[4] = {u.x, u.y, u.z, u.w};
      CUTE_UNROLL
      for (int q = 0; q < 4; ++q) {
        v[2 * q] = DType<T>::unpack_lo(w[q]);
        v[2 * q + 1] = DType<T>::unpack_hi(w[q]);
      }
      if constexpr (Centered) {  // pair q: row slot q & 1
        float2 const c = cs.c[f / kFragsPerMBlock];
        CUTE_UNROLL
        for (int e = 0; e < kFrag; ++e) v[e] += ((e >> 1) & 1) ? c.y : c.x;
      }
    }
  }
};

// NTiles == 1: no stash (every value stays in registers, today's path).
struct NoStash {
  static constexpr int kBytes = 0, kSlots = 0;
  static constexpr bool kCentered = false;
  static COMFUSE_DEVICE float stored(float x) { return x; }
  COMFUSE_DEVICE void bind(void*, int) {}
  struct Centers {};
  template <bool>
  COMFUSE_DEVICE Centers centers_of(int) const { return {}; }
  COMFUSE_DEVICE void store(int, int, Frag const&) const {}
  COMFUSE_DEVICE void load(int, int, Frag&, Centers const&) const {}
};

}  // namespace comfuse::epi
