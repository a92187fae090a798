// comfuse/mainloop/wgmma.cuh: the operands of the mainloops' wgmmas on 128B-swizzled SMEM
// tiles, written out instead of derived through CuTe's layout algebra (tile_to_shape, TiledMMA
// partition_A/B, make_fragment_A/B, partition_fragment_C). Instantiating that algebra was most
// of a JIT compile: ~2.5 s of a ~6 s NVRTC compile of a fused kernel (--fdevice-time-trace),
// and cute/algorithm/gemm.hpp, which it needs, another ~0.4 s of header parsing. What is
// written here are the same CuTe types (descriptor tensors, register fragments) and the same
// calls (mma_unpack, in CuTe's traversal order), so the generated code is unchanged: the SASS
// of every kernel the planner builds is identical, and tests/cpu/test_emit.cpp checks these
// types and descriptor fields against CuTe's own derivation at compile time.
//
// Tiles: 16-bit elements, GMMA::Layout_K_SW128_Atom (K-major: rows of 64 elements = 128 B,
// 8-row atoms 1024 B apart) or GMMA::Layout_MN_SW128_Atom (MN-major: 64 MN-contiguous
// elements per K row, 8-K-row atoms 1024 B apart, the K rows of one 64-wide atom contiguous).
// Descriptor units are 16 bytes.
#pragma once
#include "../common.cuh"

namespace comfuse::wgmma {

using Major = cute::SM90::GMMA::Major;
using ScaleOut = cute::SM90::GMMA::ScaleOut;

// Descriptor fields, in 16-byte units, of one wgmma operand (m64/nN x k16) of a tile whose
// other extent is `rows` (M or N): what cute::GMMA::make_gmma_desc derives from the layout.
//   K-major:  SBO = one 8-row atom (1024 B), LBO unused (1).
//   MN-major: SBO = one 8-K-row atom (1024 B), LBO = one 64-wide MN atom with all 64 K rows
//             (8 KB); a single atom (rows == 64) has LBO 0.
template <Major M>
struct Sw128 {
  static constexpr uint16_t kSbo = 64;
  template <int Rows>
  static constexpr uint16_t lbo() { return M == Major::K ? 1 : Rows == 64 ? 0 : 512; }
  // Step to the next k16 slice within a 64-wide K block.
  static constexpr int kK16 = M == Major::K ? 2 : 128;
};

// cute::GMMA::make_gmma_desc for a 128B-swizzled 16-bit tile starting at `smem` (the same
// field writes in the same order: the descriptor's code is the same).
template <Major M, int Rows>
COMFUSE_DEVICE cute::GmmaDescriptor sw128_desc(void const* smem) {
  cute::GmmaDescriptor desc;
  desc.bitfield.layout_type_ = uint8_t(cute::SM90::GMMA::LayoutType::B128);
  uint32_t start_address = cute::cast_smem_ptr_to_uint(smem);
  desc.bitfield.start_address_ = static_cast<uint16_t>(start_address >> 4);
  constexpr uint8_t base_offset = 0;
  desc.bitfield.base_offset_ = base_offset;
  desc.bitfield.stride_byte_offset_ = Sw128<M>::kSbo;
  desc.bitfield.leading_byte_offset_ = Sw128<M>::template lbo<Rows>();
  return desc;
}

// The operand tensors of one warp group's SS wgmmas over a ring of Stages tiles, as CuTe's
// ThrMMA::make_fragment_A/B(partition_A/B(smem)) builds them (shapes and strides written out;
// tests/cpu/test_emit.cpp compares them with CuTe's): descriptor iterators over
//   A: (MMA, MMA_M, MMA_K, PIPE), B: (MMA, MMA_N, MMA_K, (1, PIPE)),
// and the fp32 accumulators ((2, 2, N/8), MMA_M, MMA_N), compact.
// Rows: the warp group's rows of A; ARows: all rows of an A stage (a cooperative tile's two
// warp groups share one); N: the columns of B.
template <int Rows, int ARows, int N, int Stages, Major MB>
struct SsFragments {
  static constexpr int kMBlocks = Rows / 64;
  using LayoutA = cute::Layout<cute::Shape<cute::_1, cute::Int<kMBlocks>, cute::_4, cute::Int<Stages>>,
                               cute::Stride<cute::_0, cute::Int<kMBlocks == 1 ? 0 : 512>, cute::_2, cute::Int<ARows * 8>>>;
  using LayoutB = cute::Layout<cute::Shape<cute::_1, cute::_1, cute::_4, cute::Shape<cute::_1, cute::Int<Stages>>>,
                               cute::Stride<cute::_0, cute::_0, cute::Int<Sw128<MB>::kK16>, cute::Stride<cute::_0, cute::Int<N * 8>>>>;
  using LayoutC = cute::Layout<cute::Shape<cute::Shape<cute::_2, cute::_2, cute::Int<N / 8>>, cute::Int<kMBlocks>, cute::_1>,
                               cute::Stride<cute::Stride<cute::_1, cute::_2, cute::_4>, cute::Int<kMBlocks == 1 ? 0 : N / 2>, cute::_0>>;
  using FragC = decltype(cute::make_tensor<float>(LayoutC{}));
};

// One k-block (64 columns) of an operand tile in SMEM as CuTe's make_fragment_A/B(partition_A/B)
// gives it for a tile that one wgmma covers along M or N: (MMA, MMA_M|N, MMA_K) descriptors.
template <Major M>
using KBlockDescLayout = cute::Layout<cute::Shape<cute::_1, cute::_1, cute::_4>,
                                      cute::Stride<cute::_0, cute::_0, cute::Int<Sw128<M>::kK16>>>;
template <Major M, int Rows, class Element>
COMFUSE_DEVICE auto kblock_descs(Element const* tile) {
  return cute::make_tensor(cute::SM90::GMMA::DescriptorIterator{sw128_desc<M, Rows>(tile)}, KBlockDescLayout<M>{});
}

// fp32 accumulators of one m64 x N wgmma per thread, CuTe's ((2, 2, N/8), 1, 1) fragment.
template <int N>
using AccumM64 = decltype(cute::make_tensor<float>(
    cute::Layout<cute::Shape<cute::Shape<cute::_2, cute::_2, cute::Int<N / 8>>, cute::_1, cute::_1>,
                 cute::Stride<cute::Stride<cute::_1, cute::_2, cute::_4>, cute::_0, cute::_0>>{}));

// The register A operand of an RS wgmma over K columns (K = 64 or 128), as CuTe's
// partition_fragment_A of a K-major 64 x K SMEM tile gives it: ((2, 2, 2), 1, K/16) values
// (K = 128: the k16 mode is (4, 2), from the tile's two 64-column atoms).
template <class Element, int K>
using RegsA64 = decltype(cute::make_tensor<Element>(
    cute::Layout<cute::Shape<cute::Shape<cute::_2, cute::_2, cute::_2>, cute::_1,
                             cute::conditional_t<K == 64, cute::_4, cute::Shape<cute::_4, cute::_2>>>,
                 cute::Stride<cute::Stride<cute::_1, cute::_2, cute::_4>, cute::_0,
                              cute::conditional_t<K == 64, cute::_8, cute::Stride<cute::_8, cute::_32>>>>{}));

// cute::gemm(mma, A, B, C) for one wgmma k16 step, (V,M) x (V,N) => (V,M,N), without
// cute/algorithm/gemm.hpp, whose MMA_Atom pulls in every architecture's MMA and copy traits
// (~0.5 s of each JIT compile): the same traversal as CuTe's dispatch (serpentine, row-major
// when both operands are 64-bit descriptors, else column-major) and the same call
// (MMA_Atom::call is mma_unpack on its traits). Traits: cute::MMA_Traits<Op>, whose
// accumulate_ is the wgmma's scale-D.
template <class Traits, class TA, class LA, class TB, class LB, class TC, class LC>
COMFUSE_DEVICE void gemm(Traits const& mma, cute::Tensor<TA, LA> const& A, cute::Tensor<TB, LB> const& B,
                         cute::Tensor<TC, LC>& C) {
  using cute::_;
  static_assert(LA::rank == 2 && LB::rank == 2 && LC::rank == 3, "(V,M) x (V,N) => (V,M,N)");
  auto M = cute::size<1>(A);
  auto N = cute::size<1>(B);
  if constexpr (decltype(cute::size<0>(A))::value * sizeof(typename TA::value_type) == 8 &&
                decltype(cute::size<0>(B))::value * sizeof(typename TB::value_type) == 8) {
    CUTE_UNROLL
    for (int m = 0; m < M; ++m) {
      CUTE_UNROLL
      for (int n = 0; n < N; ++n) {
        int ns = (m & 1) ? N - 1 - n : n;
        auto D = C(_, m, ns);
        cute::SM90::GMMA::mma_unpack(mma, D, A(_, m), B(_, ns), C(_, m, ns));
      }
    }
  } else {
    static_assert(!(decltype(cute::size<0>(A))::value * sizeof(typename TA::value_type) == 4 ||
                    decltype(cute::size<0>(B))::value * sizeof(typename TB::value_type) == 4),
                  "CuTe traverses 32-bit operands otherwise");
    CUTE_UNROLL
    for (int n = 0; n < N; ++n) {
      CUTE_UNROLL
      for (int m = 0; m < M; ++m) {
        int ms = (n & 1) ? M - 1 - m : m;
        auto D = C(_, ms, n);
        cute::SM90::GMMA::mma_unpack(mma, D, A(_, ms), B(_, n), C(_, ms, n));
      }
    }
  }
}

}  // namespace comfuse::wgmma
