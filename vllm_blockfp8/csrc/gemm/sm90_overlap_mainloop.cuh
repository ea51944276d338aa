// SM90 (sm_90a) block-FP8 mainloop whose promotion overlaps the next K block's wgmma.
//
// Math: acc[i, j] = sum_kb fma(P_kb[i, j], S_kb[i, j], acc), P_kb the fp32 wgmma result of one
// 128-deep K block (fresh fragment per block), acc cleared to +0 first, S_kb the block's scale of
// accumulator (row i, column j) in the kernel's operand order:
//   unswapped rows: S = fl(SFA[i] * SFB_tile)  (SFA per token = per row, one weight-block SFB per tile)
//   swap-AB rows:   S = fl(SFB[j] * SFA_tile)  (SFB per token = per column, one weight-block SFA per tile)
// CUTLASS's blockwise-FP8 consumer waits for every block's wgmma (warpgroup_wait<0>) before it
// promotes, so a warpgroup issues no tensor-core work during its promotion (only the other
// warpgroup can fill the gap). Here block k's wgmma goes into one of
// two temporary fragments while block k-1's fragment is promoted (wait<1>): 3 fp32 fragments per
// thread, 192 of the 232 registers setmaxnreg gives a consumer at the 128x128 cooperative tile
// (48 at the 128x32 swap tile, 96 at 128x64).
//
// Layouts (sm90_kernel.cuh). Unswapped: SFA per token per 128 K, granularity (1, 128, 128), so
// ScaleMsPerTile = tile M (TMA-loaded), ScaleNsPerTile = 1 (cp.async). Swap-AB: granularity
// (128, 1, 128), ScaleMsPerTile = 1 (the weight block, cp.async), ScaleNsPerTile = tile N (the
// tokens, TMA-loaded). The per-row or per-column scales are read through the tiled MMA's C
// partition of a (TileM, TileN) view of the stage's scale smem (stride 0 along the other mode), so
// each thread reads only the distinct rows (columns) of its accumulators. Everything else
// (producer, scale loads, pipeline, shared storage, TMA, epilogue, schedulers) is the CUTLASS
// collective this derives from; only mma/mma_tail differ.
//
// Numerics: bitwise the same as the base collective by construction (for the unswapped 128x128
// row checked in SASS and on the H200 against the CUTLASS-loop row before that row was deleted;
// for the swap-AB rows by tests/test_gemm.py's bitwise test, not yet run on a GPU): same wgmma sequence per block (zeroing
// first K slice, 4 x K=32), same scale product (the base's operand order: per-row/column scale
// times the tile's scale), same FFMA per element in the same block order; the base's first
// promotion compiles to FFMA with +0 (RZ) for its never-initialized accumulator (both the c2x1
// and the swap rows' SASS), which the explicit clear reproduces.
//
// Supported (static_assert): exactly one of SFA / SFB with one scale per accumulator row /
// column (granularity 1 along M with ScaleMsPerTile = tile M, or along N with ScaleNsPerTile =
// tile N) and the other with one scale per tile (ScaleNsPerTile = 1, resp. ScaleMsPerTile = 1);
// exactly one scale block per pipeline stage (ScaleGranularityK = tile K); at most 64 accumulators
// per thread (three fragments in the 232 consumer registers). Any scheduler whose kernel calls
// mma with k_tile_count >= 1 and advances its own pipeline state by k_tile_count after mma_tail
// (persistent and stream-K: gemm/NOTES.md; k_tile_count <= 0 returns acc = 0 without touching
// the pipeline).
#pragma once

#include <cuda_runtime_api.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/collective/collective_builder.hpp"

namespace blockfp8::gemm::sm90 {

template <class Base>
struct OverlapPromotionMainloop : Base {
  using typename Base::MainloopPipeline;
  using typename Base::Params;
  using typename Base::PipelineState;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  using typename Base::SmemLayoutSFA;
  using typename Base::SmemLayoutSFB;
  using typename Base::TensorStorage;
  using typename Base::TileShape;
  using typename Base::TiledMma;
  using Scale = typename Base::ElementBlockScale;

  static constexpr int kTileM = cute::size<0>(TileShape{});
  static constexpr int kTileN = cute::size<1>(TileShape{});
  static constexpr int kTileK = cute::size<2>(TileShape{});
  static constexpr int kWarpGroupThreads = cutlass::NumThreadsPerWarpGroup;

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
  static_assert(kTileM * kTileN / cute::size(TiledMma{}) <= 64,
                "acc + two temporary fragments must fit the 232 consumer registers");

  // The stage's per-row (SFA) or per-column (SFB) scales seen as a (TileM, TileN, PIPE) tensor
  // (stride 0 along the other mode), cut like the accumulators (the tiled MMA's C partition of
  // this thread): (MMA, MMA_M, MMA_N, PIPE), so element i is the scale of accumulator i's row
  // (column). The tile's one scale of the other operand is read directly in load_scales.
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

  // One K block (4 wgmma of K = 32) into `frag`, the first overwriting it, committed as one group.
  // The fences keep the compiler from moving accesses to `frag` across the asynchronous wgmma.
  template <class Frag, class FragA, class FragB>
  CUTLASS_DEVICE static void issue_block(TiledMma& mma, FragA const& tCrA, FragB const& tCrB, Frag& frag,
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

  template <class Acc, class Frag, class ScaleRegs>
  CUTLASS_DEVICE static void promote(Acc& acc, Frag& frag, ScaleRegs const& scale) {
    using namespace cute;
    warpgroup_fence_operand(frag);  // after the wait that completed it
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(acc); ++i) acc(i) = fmaf(frag(i), scale(i), acc(i));
    warpgroup_fence_operand(acc);  // keeps the promotion ahead of the next wgmma batch
  }

  // Consumer side. Called by the kernel with the work unit's first pipeline state and its
  // k_tile_count (>= 1: the persistent scheduler passes the tile's K blocks, the stream-K scheduler
  // a unit's share of one output tile, and the kernel calls mma only for valid units, i.e. with
  // k_tile_count > 0); the kernel advances its own state by k_tile_count after mma_tail. Every
  // stage this call reads it also releases, so mma_tail has nothing left to do.
  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum,
                          int k_tile_count, int thread_idx, TensorStorage& shared_tensors, Params const&) {
    using namespace cute;
    static_assert(is_rmem<FrgTensorC>::value, "accumulators must live in registers");

    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});  // (BLK_M, BLK_K, PIPE)
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});  // (BLK_N, BLK_K, PIPE)

    TiledMma tiled_mma;
    // Operand descriptors are per warpgroup; a warp-uniform index keeps them in uniform registers.
    const int wg = __shfl_sync(0xffffffff, thread_idx / kWarpGroupThreads, 0);
    auto wg_mma = tiled_mma.get_slice(wg * kWarpGroupThreads);
    Tensor tCrA = wg_mma.make_fragment_A(wg_mma.partition_A(sA));  // (MMA, MMA_M, MMA_K, PIPE)
    Tensor tCrB = wg_mma.make_fragment_B(wg_mma.partition_B(sB));  // (MMA, MMA_N, MMA_K, PIPE)

    Tensor tCsScale = partition_scales(shared_tensors, thread_idx);  // (MMA, MMA_M, MMA_N, PIPE)
    CUTE_STATIC_ASSERT_V(shape(tCsScale(_, _, _, 0)) == shape(accum));

    Tensor tmp0 = make_fragment_like(accum);
    Tensor tmp1 = make_fragment_like(accum);
    // Stride 0 kept: 2 registers per fragment at the 128x128 tile (rows), 8 / 16 at the 128x32 /
    // 128x64 swap tiles (columns).
    Tensor scale0 = make_tensor_like<Scale>(tCsScale(_, _, _, 0));
    Tensor scale1 = make_tensor_like<Scale>(tCsScale(_, _, _, 0));

    clear(accum);  // the first promotion then adds to +0, as the base's does
    if (k_tile_count <= 0) return;

    PipelineState smem_pipe_release = smem_pipe_read;
    int unissued = k_tile_count;

    // Scales are read right after the stage's wait and before its wgmma is issued: a stage is
    // released only after that wgmma completed, and every thread of the warpgroup issues it after
    // its scale reads (the base orders them the same way). Reading them after the wait<1> instead
    // would race with the release on a 2-CTA cluster, where one thread per warpgroup arrives.
    auto issue_next = [&](auto& frag, auto& scale) {
      const int stage = smem_pipe_read.index();
      load_scales(scale, tCsScale, shared_tensors, stage);
      issue_block(tiled_mma, tCrA, tCrB, frag, stage);
      ++smem_pipe_read;
      --unissued;
    };

    pipeline.consumer_wait(smem_pipe_read);
    issue_next(tmp0, scale0);
    auto barrier_token = pipeline.consumer_try_wait(smem_pipe_read, unissued == 0);

    // Block k into `next` while block k-1 (in `prev`) is promoted.
    auto step = [&](auto& next, auto& next_scale, auto& prev, auto const& prev_scale) {
      pipeline.consumer_wait(smem_pipe_read, barrier_token);
      issue_next(next, next_scale);
      warpgroup_wait<1>();  // block k-1 complete, block k may still run
      pipeline.consumer_release(smem_pipe_release);
      ++smem_pipe_release;
      // Tested now so the barrier's latency hides behind the promotion; skipped past the last block.
      barrier_token = pipeline.consumer_try_wait(smem_pipe_read, unissued == 0);
      promote(accum, prev, prev_scale);
    };
    auto drain = [&](auto& last, auto const& last_scale) {
      warpgroup_wait<0>();
      pipeline.consumer_release(smem_pipe_release);
      promote(accum, last, last_scale);
    };

    // Unrolled by two so that each fragment is a compile-time register set.
    CUTLASS_PRAGMA_NO_UNROLL
    while (true) {
      if (unissued == 0) {
        drain(tmp0, scale0);
        break;
      }
      step(tmp1, scale1, tmp0, scale0);
      if (unissued == 0) {
        drain(tmp1, scale1);
        break;
      }
      step(tmp0, scale0, tmp1, scale1);
    }
  }

  // mma() released every stage of the tile (the base leaves the last one for this call).
  CUTLASS_DEVICE void mma_tail(MainloopPipeline, PipelineState, int) {}
};

}  // namespace blockfp8::gemm::sm90
