// SM90 (sm_90a) block-FP8: the building blocks of our consumer loop (overlap_mainloop.cuh,
// which derives from CUTLASS 4.2's blockwise-FP8 collective `Base` and replaces only its
// mma/mma_tail). The schedule (which wgmma is in flight during a promotion) stays in that file;
// here, as static helpers of ConsumerLoopParts<Base>:
//   operand_fragments  this warpgroup's A/B shared-memory descriptors over all stages
//   partition_scales   the stage's per-row (SFA) or per-column (SFB) scales cut like the accumulators
//   load_scales        fl(per-row-or-column scale * the tile's one scale of the other operand)
//   issue_k_block      one 128-deep K block: 4 wgmma of K = 32, the first zeroing, one commit group
//   promote            acc = fma(frag, scale, acc) per element (promote_and_fence_acc: then fences acc)
// Per element this is the base's arithmetic: the same wgmma sequence per block, the same scale
// product in the base's operand order, one FFMA per element per block.
//
// Layouts (cutlass_gemm.cuh). Unswapped: SFA per token per 128 K, granularity (1, 128, 128), so
// ScaleMsPerTile = tile M (TMA-loaded), ScaleNsPerTile = 1 (cp.async). Swap-AB: granularity
// (128, 1, 128), ScaleMsPerTile = 1 (the weight block, cp.async), ScaleNsPerTile = tile N (the
// tokens, TMA-loaded).
#pragma once

#include <cuda_runtime_api.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/collective/collective_builder.hpp"

namespace blockfp8::gemm::sm90 {

template <class Base>
struct ConsumerLoopParts {
  using SmemLayoutA = typename Base::SmemLayoutA;
  using SmemLayoutB = typename Base::SmemLayoutB;
  using SmemLayoutSFA = typename Base::SmemLayoutSFA;
  using SmemLayoutSFB = typename Base::SmemLayoutSFB;
  using TensorStorage = typename Base::TensorStorage;
  using TileShape = typename Base::TileShape;
  using TiledMma = typename Base::TiledMma;
  using Scale = typename Base::ElementBlockScale;

  static constexpr int kTileM = cute::size<0>(TileShape{});
  static constexpr int kTileN = cute::size<1>(TileShape{});
  static constexpr int kTileK = cute::size<2>(TileShape{});
  static constexpr int kWarpGroupThreads = cutlass::NumThreadsPerWarpGroup;
  static constexpr int kAccPerThread = kTileM * kTileN / cute::size(TiledMma{});

  // Which operand carries the per-accumulator scales: SFA one per tile row (unswapped rows: the
  // tokens) or SFB one per tile column (swap-AB rows: the tokens); the other gives one per tile.
  static constexpr bool kRowScales =
      Base::ScaleGranularityM == 1 && Base::ScaleMsPerTile == kTileM && Base::ScaleNsPerTile == 1;
  static constexpr bool kColScales =
      Base::ScaleGranularityN == 1 && Base::ScaleNsPerTile == kTileN && Base::ScaleMsPerTile == 1;
  static_assert(kRowScales || kColScales,
                "one of SFA / SFB must give one scale per tile row / column (granularity 1) and the other "
                "one scale per tile");
  static_assert(Base::ScaleGranularityK == kTileK, "exactly one scale block per pipeline stage");

  // This warpgroup's A and B operands (wgmma shared-memory descriptors) over all stages:
  // (MMA, MMA_M, MMA_K, PIPE) and (MMA, MMA_N, MMA_K, PIPE). Descriptors are per warpgroup; a
  // warp-uniform warpgroup index keeps them in uniform registers.
  CUTLASS_DEVICE static auto operand_fragments(TiledMma const& tiled_mma, int thread_idx,
                                               TensorStorage& smem) {
    using namespace cute;
    Tensor sA = make_tensor(make_smem_ptr(smem.smem_A.data()), SmemLayoutA{});  // (BLK_M, BLK_K, PIPE)
    Tensor sB = make_tensor(make_smem_ptr(smem.smem_B.data()), SmemLayoutB{});  // (BLK_N, BLK_K, PIPE)
    const int wg = __shfl_sync(0xffffffff, thread_idx / kWarpGroupThreads, 0);
    auto wg_mma = tiled_mma.get_slice(wg * kWarpGroupThreads);
    return make_tuple(wg_mma.make_fragment_A(wg_mma.partition_A(sA)),
                      wg_mma.make_fragment_B(wg_mma.partition_B(sB)));
  }

  // The stage's per-row (SFA) or per-column (SFB) scales seen as a (TileM, TileN, PIPE) tensor
  // (stride 0 along the other mode), cut like the accumulators (the tiled MMA's C partition of
  // this thread): (MMA, MMA_M, MMA_N, PIPE), so element i is the scale of accumulator i's row
  // (column), and a warpgroup's m64 slabs are the MMA_M mode as for the accumulators. Each thread
  // thus reads only the distinct rows (columns) of its accumulators. The tile's one scale of the
  // other operand is read directly in load_scales.
  CUTLASS_DEVICE static auto partition_scales(TensorStorage& smem, int thread_idx) {
    using namespace cute;
    if constexpr (kRowScales) {
      constexpr auto l = SmemLayoutSFA{};  // ((1, TileM), (128, 1), PIPE)
      Tensor s = make_tensor(make_smem_ptr(smem.smem_SFA.data()),
                             make_layout(make_shape(get<0>(shape(l)), Int<kTileN>{}, get<2>(shape(l))),
                                         make_stride(get<0>(stride(l)), _0{}, get<2>(stride(l)))));
      return TiledMma{}.get_slice(thread_idx).partition_C(s);
    } else {
      constexpr auto l = SmemLayoutSFB{};  // ((1, TileN), (128, 1), PIPE)
      Tensor s = make_tensor(make_smem_ptr(smem.smem_SFB.data()),
                             make_layout(make_shape(Int<kTileM>{}, get<0>(shape(l)), get<2>(shape(l))),
                                         make_stride(_0{}, get<0>(stride(l)), get<2>(stride(l)))));
      return TiledMma{}.get_slice(thread_idx).partition_C(s);
    }
  }

  // Reads block `stage`'s scales into `scale` (compact: the thread's distinct rows or columns
  // only) as the product the base forms before its FFMA: fl(sfa[row] * sfb) unswapped,
  // fl(sfb[col] * sfa) swapped (the base's operand order in each case).
  template <class ScaleRegs, class ScaleSmem>
  CUTLASS_DEVICE static void load_scales(ScaleRegs& scale, ScaleSmem const& tCsScale, TensorStorage& smem,
                                         int stage) {
    using namespace cute;
    Tensor src = filter_zeros(tCsScale(_, _, _, stage));
    Tensor dst = filter_zeros(scale);
    static_assert(decltype(size(src))::value == decltype(size(dst))::value);
    if constexpr (kRowScales) {
      const Scale sfb = smem.smem_SFB[SmemLayoutSFB{}(_0{}, _0{}, stage)];
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(dst); ++i) dst(i) = src(i) * sfb;
    } else {
      const Scale sfa = smem.smem_SFA[SmemLayoutSFA{}(_0{}, _0{}, stage)];
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(dst); ++i) dst(i) = src(i) * sfa;
    }
  }

  // One K block (4 wgmma of K = 32) of the rows in `tCrA` into `frag`, the first overwriting it,
  // committed as one group. The fences keep the compiler from moving accesses to `frag` across the
  // asynchronous wgmma.
  template <class Frag, class FragA, class FragB>
  CUTLASS_DEVICE static void issue_k_block(TiledMma& mma, FragA const& tCrA, FragB const& tCrB, Frag& frag,
                                           int stage) {
    using namespace cute;
    mma.accumulate_ = GMMA::ScaleOut::Zero;
    warpgroup_fence_operand(frag);
    warpgroup_arrive();
    CUTLASS_PRAGMA_UNROLL
    for (int kk = 0; kk < size<2>(tCrA); ++kk) {
      cute::gemm(mma, tCrA(_, _, kk, stage), tCrB(_, _, kk, stage), frag);
      mma.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
    warpgroup_fence_operand(frag);
  }

  // acc(i) = fma(frag(i), scale(i), acc(i)) for a `frag` whose wgmma a preceding wait completed.
  // The FFMAs read `frag`, so the next issue_k_block into `frag` (its first fence) keeps them ahead
  // of that wgmma.
  template <class Acc, class Frag, class ScaleRegs>
  CUTLASS_DEVICE static void promote(Acc&& acc, Frag& frag, ScaleRegs const& scale) {
    using namespace cute;
    static_assert(decltype(size(acc))::value == decltype(size(frag))::value);
    warpgroup_fence_operand(frag);  // after the wait that completed it
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(acc); ++i) acc(i) = fmaf(frag(i), scale(i), acc(i));
  }

  // promote, then fence `acc`: for a loop whose next wgmma writes another fragment (the overlap
  // loop), where nothing else keeps the FFMAs from sinking below the next block's barrier wait and
  // wgmma issue.
  template <class Acc, class Frag, class ScaleRegs>
  CUTLASS_DEVICE static void promote_and_fence_acc(Acc&& acc, Frag& frag, ScaleRegs const& scale) {
    promote(acc, frag, scale);
    cute::warpgroup_fence_operand(acc);
  }
};

}  // namespace blockfp8::gemm::sm90
