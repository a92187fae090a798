// comfuse/b2b/decode_attention.cuh: the B2B kernel for attention at a decode step
// (B2bConfig::decode_rows > 0): O = softmax(logit_scale * Q K^T [+ mask]) V for batches of at
// most decode_rows query rows (a decode step's one row a head; a few with speculative tokens).
//
// Why not the wgmma pipeline: its jobs are 64 rows, so at one query row a 64-row wgmma does one
// useful row in 64 and a job's fixed path (Q's load, the ring's fill, the hand-over) is the time
// (bench/NOTES.md, Stop 44: 1.1-2x SDPA's time). A decode step reads every key and value once
// for 2 x D FLOPs a key and row: memory-bound, so this kernel streams K and V through CUDA cores
// with as many bytes in flight as the SM holds, and splits each batch's keys over the CTAs of a
// cluster (flash-decoding), whose partial results merge over DSMEM in rank order (deterministic).
//
// Layout (kThreads = 4 warps): a key's row of D elements is held by kLanes = D / kVec consecutive
// lanes, kVec = 8 or 16 elements each (B2bConfig::decode_vec), for K and V alike (D = DV); a warp
// holds 32 / kLanes keys at once, the CTA kGroups. A lane's elements are 16-byte chunks c of 8,
// at (c kLanes + li) 8: each load instruction reads kLanes x 16 contiguous bytes of a key. Group g
// of the CTA walks keys start + g, start + g + kGroups, ... of the CTA's contiguous range,
// kUnroll keys a step (B2bConfig::decode_unroll), all their loads issued before any is used.
// Why 16 elements a lane at D >= 128: the scores' shuffles and the softmax's scalar work run once
// a lane for its key, so the fewer lanes a key, the fewer instructions a byte (SASS at D 128, one
// row: 41 warp-instructions a key at 8 a lane, 30 at 16 with the loads below unpredicated).
// Per key and row: s = q . k (a partial dot over the lane's kVec elements, summed over the group's
// lanes by shuffles), x = scale s [+ mask], the group's online softmax (running max m and sum l
// in the log2 domain, O's kVec elements of the lane rescaled when m moves), O += exp(x - m) v.
// Then the CTA's groups merge through SMEM, and the cluster's CTAs over DSMEM: rank r finishes
// the r-th slice of the batch's rows x D outputs from every rank's (m, l, O), O / l stored.
// A row with no unmasked key gives 0 (l = 0), as the wgmma kernel and torch's SDPA.
#pragma once
#include "../common.cuh"
#include "../params.cuh"
#include "../cluster/dsmem.cuh"
#include "../epilogue/ops.cuh"

namespace comfuse::b2b {

// C: the kernel's description; Element: Q's, K's, V's and O's type; MaskT: the additive mask's
// element type ([batches, M, N1], Params::tile_in[kMaskSlot]), void for none.
template <B2bConfig C, class Element, class MaskT = void, int kMaskSlot = -1>
struct DecodeAttention {
  static_assert(check(C) == nullptr, "ComFuse: B2bConfig refused by check() (config.cuh); the host planner names the reason");
  static_assert(C.decode_rows > 0, "ComFuse: DecodeAttention is the decode kernel (B2bConfig::decode_rows > 0)");
  static constexpr int D = C.tile_n2;  // head dim of Q, K, V and O
  static constexpr int kRows = C.decode_rows;
  static constexpr int kLanes = C.decode_lanes();
  static constexpr int kVec = C.decode_vec();
  static constexpr int kChunks = kVec / 8;  // 16-byte loads a lane a row
  static constexpr int kGroupsPerWarp = 32 / kLanes;
  static constexpr int kThreads = B2bConfig::kDecodeWarps * 32;
  static constexpr int kGroups = C.decode_groups();
  static constexpr int kSplit = C.cluster_n1;
  static constexpr int kUnroll = C.decode_unroll();
  static constexpr bool kMasked = !cute::is_same_v<MaskT, void>;
  static constexpr float kScale2 = C.logit_scale * epi::kLog2e;  // x in the log2 domain
  static constexpr float kMaskScale2 = epi::kLog2e;
  static_assert(kLanes >= 1 && 32 % kLanes == 0 && kLanes * kVec == D, "ComFuse: decode head dim D / kVec must divide a warp");

  // Each group's (m, l) a row and its O, then the CTA's (m, l, O) that the cluster reads.
  struct SharedStorage {
    float group_o[kRows][kGroups][D];
    float group_ml[kRows][kGroups][2];
    float cta_o[kRows][D];
    float cta_ml[kRows][2];
  };
  static_assert(int(sizeof(SharedStorage)) <= C.smem_bytes(), "ComFuse: decode SMEM exceeds B2bConfig::smem_bytes()");

  static COMFUSE_DEVICE float neg_inf() { return -__int_as_float(0x7f800000); }
  // A reference for exp2(x - ref) that is never -inf: a row masked so far keeps 0 (its x are -inf).
  static COMFUSE_DEVICE float ref_of(float m) { return m == neg_inf() ? 0.f : m; }

  template <class T> static COMFUSE_DEVICE T const* at(void const* base, long long off) {
    return reinterpret_cast<T const*>(base) + off;
  }
  // The lane's kVec elements of a row from its kChunks 16-byte pieces.
  static COMFUSE_DEVICE void unpack(uint4 const (&w)[kChunks], float (&f)[kVec]) {
    CUTE_UNROLL
    for (int c = 0; c < kChunks; ++c) {
      uint32_t const u[4] = {w[c].x, w[c].y, w[c].z, w[c].w};
      CUTE_UNROLL
      for (int i = 0; i < 4; ++i)
        f[c * 8 + 2 * i] = DType<Element>::unpack_lo(u[i]), f[c * 8 + 2 * i + 1] = DType<Element>::unpack_hi(u[i]);
    }
  }
  // Element e of the lane's kVec: its column in the row.
  static COMFUSE_DEVICE int column(int li, int e) { return (e / 8 * kLanes + li) * 8 + e % 8; }
  static COMFUSE_DEVICE void load_row(Element const* row, int li, uint4 (&w)[kChunks]) {
    CUTE_UNROLL
    for (int c = 0; c < kChunks; ++c) w[c] = __ldg(reinterpret_cast<uint4 const*>(row + (c * kLanes + li) * 8));
  }

  static COMFUSE_DEVICE void run(Params const& p, char* smem_raw) {
    SharedStorage& ss = smem_base<SharedStorage>(smem_raw);
    int const tid = int(threadIdx.x), lane = tid % 32;
    int const g = tid / 32 * kGroupsPerWarp + lane / kLanes;  // this thread's group
    int const li = lane % kLanes;                             // its elements: column(li, e)
    int const rank = kSplit > 1 ? int(cluster::cluster_rank()) : 0;
    int const batch = int(blockIdx.x) / kSplit;
    BatchCoord const bc = batch_coord(p, batch);
    auto offset = [&](MatrixRef const& r, long long row) {
      return bc.outer * r.batch_stride + bc.head * r.head_stride + row * r.ld;
    };
    // The CTA's keys: a contiguous 1/kSplit of N1 (the last ranks may hold fewer, or none).
    int const n1 = p.N1;
    int const per = (n1 + kSplit - 1) / kSplit;
    int const k0 = min(n1, rank * per), k1 = min(n1, k0 + per);

    wait_for_previous_grid();  // nothing global before this (common.cuh)
    allow_next_grid();

    float q[kRows][kVec];
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      uint4 w[kChunks];  // a row past M computes row M - 1's (never stored)
      load_row(at<Element>(p.b2b_x.data, offset(p.b2b_x, min(r, p.M - 1))), li, w);
      unpack(w, q[r]);
    }
    float m[kRows], l[kRows], o[kRows][kVec];
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      m[r] = neg_inf(), l[r] = 0.f;
      CUTE_UNROLL
      for (int e = 0; e < kVec; ++e) o[r][e] = 0.f;
    }

    for (int base = k0; base < k1; base += kGroups * kUnroll) {
      // Every load of the step issued before any is used, the mask's too (one round trip a step).
      // A key past the range loads the last one (its x is set to -inf below), and a row past M
      // row M - 1 (never stored): no predicated loads, no registers zeroed.
      uint4 kw[kUnroll][kChunks], vw[kUnroll][kChunks];
      float mk[kMasked ? kRows : 1][kUnroll];
      CUTE_UNROLL
      for (int u = 0; u < kUnroll; ++u) {
        int const j = min(base + u * kGroups + g, k1 - 1);
        load_row(at<Element>(p.b2b_w1.data, offset(p.b2b_w1, j)), li, kw[u]);
        load_row(at<Element>(p.b2b_w2.data, offset(p.b2b_w2, j)), li, vw[u]);
        if constexpr (kMasked) {
          MatrixRef const& mr = p.tile_in[kMaskSlot];
          CUTE_UNROLL
          for (int r = 0; r < kRows; ++r) mk[r][u] = DType<MaskT>::load(mr.data, offset(mr, min(r, p.M - 1)) + j);
        }
      }
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        float x[kUnroll];
        CUTE_UNROLL
        for (int u = 0; u < kUnroll; ++u) {
          float kf[kVec];
          unpack(kw[u], kf);
          float s = 0.f;
          CUTE_UNROLL
          for (int e = 0; e < kVec; ++e) s = fmaf(q[r][e], kf[e], s);
          CUTE_UNROLL
          for (int off = 1; off < kLanes; off <<= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
          x[u] = s * kScale2;
          if constexpr (kMasked) x[u] = fmaf(mk[r][u], kMaskScale2, x[u]);
          if (base + u * kGroups + g >= k1) x[u] = neg_inf();
        }
        float mx = m[r];
        CUTE_UNROLL
        for (int u = 0; u < kUnroll; ++u) mx = fmaxf(mx, x[u]);
        float const ref = ref_of(mx);
        float const alpha = epi::fast_exp2(m[r] - ref);  // 0 from -inf; 1 when m stays
        float sum = 0.f;
        CUTE_UNROLL
        for (int e = 0; e < kVec; ++e) o[r][e] *= alpha;
        CUTE_UNROLL
        for (int u = 0; u < kUnroll; ++u) {
          float const pu = epi::fast_exp2(x[u] - ref);
          float vf[kVec];
          unpack(vw[u], vf);
          sum += pu;
          CUTE_UNROLL
          for (int e = 0; e < kVec; ++e) o[r][e] = fmaf(pu, vf[e], o[r][e]);
        }
        l[r] = fmaf(l[r], alpha, sum);
        m[r] = mx;
      }
    }

    // The CTA's groups merged: each group's state to SMEM, then one thread an output element.
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      CUTE_UNROLL
      for (int e = 0; e < kVec; ++e) ss.group_o[r][g][column(li, e)] = o[r][e];
      if (li == 0) ss.group_ml[r][g][0] = m[r], ss.group_ml[r][g][1] = l[r];
    }
    __syncthreads();
    for (int i = tid; i < kRows * D; i += kThreads) {
      int const r = i / D, d = i % D;
      float mx = neg_inf();
      CUTE_UNROLL
      for (int gg = 0; gg < kGroups; ++gg) mx = fmaxf(mx, ss.group_ml[r][gg][0]);
      float const ref = ref_of(mx);
      float acc = 0.f, sum = 0.f;
      CUTE_UNROLL
      for (int gg = 0; gg < kGroups; ++gg) {
        float const w = epi::fast_exp2(ss.group_ml[r][gg][0] - ref);
        acc = fmaf(w, ss.group_o[r][gg][d], acc);
        sum = fmaf(w, ss.group_ml[r][gg][1], sum);
      }
      ss.cta_o[r][d] = acc;
      if (d == 0) ss.cta_ml[r][0] = mx, ss.cta_ml[r][1] = sum;
    }

    // The cluster's CTAs merged in rank order: rank r finishes its slice of the rows x D outputs.
    constexpr int kOuts = kRows * D;
    constexpr int kSlice = kOuts / kSplit;
    static_assert(kOuts % kSplit == 0, "ComFuse: a rank's slice of the decode outputs");
    if constexpr (kSplit > 1) cute::cluster_sync();  // every rank's cta_o and cta_ml written
    else __syncthreads();
    for (int i = rank * kSlice + tid; i < (rank + 1) * kSlice; i += kThreads) {
      int const r = i / D, d = i % D;
      float mr[kSplit], acc = 0.f, sum = 0.f, mx = neg_inf();
      CUTE_UNROLL
      for (int c = 0; c < kSplit; ++c) {
        mr[c] = kSplit > 1 ? cluster::ld_cluster_f32(cluster::mapa(smem_u32(&ss.cta_ml[r][0]), uint32_t(c))) : ss.cta_ml[r][0];
        mx = fmaxf(mx, mr[c]);
      }
      float const ref = ref_of(mx);
      CUTE_UNROLL
      for (int c = 0; c < kSplit; ++c) {
        float const w = epi::fast_exp2(mr[c] - ref);
        float const oc = kSplit > 1 ? cluster::ld_cluster_f32(cluster::mapa(smem_u32(&ss.cta_o[r][d]), uint32_t(c))) : ss.cta_o[r][d];
        float const lc = kSplit > 1 ? cluster::ld_cluster_f32(cluster::mapa(smem_u32(&ss.cta_ml[r][1]), uint32_t(c))) : ss.cta_ml[r][1];
        acc = fmaf(w, oc, acc);
        sum = fmaf(w, lc, sum);
      }
      if (r < p.M) {
        Element* out = const_cast<Element*>(at<Element>(p.b2b_out.data, offset(p.b2b_out, r))) + d;
        *out = Element(sum > 0.f ? acc / sum : 0.f);
      }
    }
    // No CTA leaves while a peer may still read its SMEM.
    if constexpr (kSplit > 1) cute::cluster_sync();
  }
};

}  // namespace comfuse::b2b
