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
// (a bf16 stash rounds the bypassed value like an unfused bf16 intermediate would).
// kSlotBytes = Rows * BN * sizeof(T).
#pragma once
#include "nodes.cuh"

namespace comfuse::epi {

// kSmem: the region is SMEM, accessed with ld/st.shared.v4 (a generic pointer to SMEM compiled
// to generic LD/ST.E.128); else global memory (LDG/STG.128).
template <class T, int Rows, int BN, int Slots, bool kSmem> struct Stash {
  static_assert(sizeof(T) == 4 || sizeof(T) == 2, "stash type: float, bf16 or f16");
  static constexpr int kFrags = Rows * BN / (kWarpGroupThreads * kFrag);
  static constexpr int kChunks = kFrag * int(sizeof(T)) / 16;
  static constexpr int kSlotBytes = Rows * BN * int(sizeof(T));
  static constexpr int kBytes = Slots * kSlotBytes;
  static constexpr int kSlots = Slots;

  char* base = nullptr;  // this thread's chunk 0 of fragment 0 of slot 0 (generic: SMEM or global)

  // region: the warp group's kBytes (SMEM or global), t: thread in the warp group.
  COMFUSE_DEVICE void bind(void* region, int t) { base = static_cast<char*>(region) + 16 * t; }

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
  // x as the stash gives it back (a 16-bit stash rounds it).
  static COMFUSE_DEVICE float stored(float x) { return DType<T>::round(x); }
  COMFUSE_DEVICE void store(int slot, int f, Frag const& v) const {
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
  COMFUSE_DEVICE void load(int slot, int f, Frag& v) const {
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
    }
  }
};

// NTiles == 1: no stash (every value stays in registers, today's path).
struct NoStash {
  static constexpr int kBytes = 0, kSlots = 0;
  static COMFUSE_DEVICE float stored(float x) { return x; }
  COMFUSE_DEVICE void bind(void*, int) {}
  COMFUSE_DEVICE void store(int, int, Frag const&) const {}
  COMFUSE_DEVICE void load(int, int, Frag&) const {}
};

}  // namespace comfuse::epi
