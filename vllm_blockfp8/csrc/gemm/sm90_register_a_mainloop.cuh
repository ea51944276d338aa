// SM90 (sm_90a) block-FP8 consumer loop for 128x256 unswapped tiles with A (the activations) in
// registers: each 32-deep K slice of a warpgroup's 64 rows is read from shared memory once and feeds
// four 64x64x32 register-A wgmmas (one per 64-column quarter of the tile), instead of one 64x256 wgmma
// per slice whose fp32 result would need a 128-register fragment on top of the 128 of the accumulator.
//
// Math (as sm90_overlap_mainloop.cuh): acc[i, j] = sum_kb fma(P_kb[i, j], S_kb[i, j], acc), P_kb the
// fp32 wgmma result of one 128-deep K block, S_kb = fl(SFA[i] * SFB_kb[j / 128]) (per-token scale
// times the weight block's), acc cleared to +0 first. Quarter q of block kb (4 wgmma of K = 32) goes
// into one of two 32-register temporaries while quarter q - 1 is promoted (wait<1>); block kb's
// quarter 3 is promoted while block kb+1's quarter 0 runs. Quarter 3 is issued one K slice per commit
// group, and as each slice completes, block kb+1's slice is loaded into the same registers
// (ldmatrix), so the warpgroup's wgmma stop only for the last slice's load. The first version drained
// every block after a full reload and took ~1650 cycles a block against 1024 of wgmma, which run at
// the tensor rate on their own (gemm/NOTES.md thirteenth session).
//
// Why: a 128x256 tile moves 2/3 of the 128x128 tile's global bytes per output (A once per 256
// columns, B once per 128 rows), which matters at prefill occupancy, where the 128x128 row's time
// per K block grows ~30% with the CTA count (gemm/NOTES.md thirteenth session); its 64x256 fragment
// per warpgroup leaves no registers for a 64x256 wgmma result, hence four 64-wide ones from
// register-held A.
//
// Layouts: the base collective's (CUTLASS 4.2 blockwise FP8, unswapped, granularity (1, 128, 128)):
// A [128 x 128] and B [256 x 128] K-major swizzled tiles per stage, SFA 128 per-token scales per
// stage (TMA), SFB the tile's two weight-block scales per stage (cp.async). The accumulator is the
// kernel's fragment of the base's 64x256 wgmma (128 values per thread), whose values 32q..32q+31 are
// exactly quarter q's 64x64 fragment (value i of an m64nN fragment is column 8 (i / 4) + ..., so a
// 64-column quarter is 8 consecutive groups of 4), which the epilogue then takes as it is.
//
// Unsupported (static_assert): anything but 128x256x128 tiles, per-token scales along M and 128-wide
// weight blocks along N. Contract with the kernel as in the overlap loop: k_tile_count >= 1 (<= 0
// returns acc = 0 without touching the pipeline), every stage read is released here, mma_tail does
// nothing.
#pragma once

#include <cuda_runtime_api.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/collective/collective_builder.hpp"

namespace blockfp8::gemm::sm90 {

template <class Base>
struct RegisterAMainloop : Base {
  using typename Base::MainloopPipeline;
  using typename Base::Params;
  using typename Base::PipelineState;
  using typename Base::TensorStorage;
  using typename Base::TileShape;
  using SmemLayoutA = typename Base::SmemLayoutA;
  using SmemLayoutB = typename Base::SmemLayoutB;
  using SmemLayoutSFA = typename Base::SmemLayoutSFA;
  using SmemLayoutSFB = typename Base::SmemLayoutSFB;
  using Scale = typename Base::ElementBlockScale;
  using ElementA = typename Base::ElementA;

  static constexpr int kTileM = cute::size<0>(TileShape{});
  static constexpr int kTileN = cute::size<1>(TileShape{});
  static constexpr int kTileK = cute::size<2>(TileShape{});
  static constexpr int kQuarterN = 64;
  static constexpr int kQuarters = kTileN / kQuarterN;
  static constexpr int kWeightBlock = 128;
  static_assert(kTileM == 128 && kTileN == 256 && kTileK == 128, "written for 128x256x128 tiles");
  static_assert(Base::ScaleGranularityM == 1 && Base::ScaleMsPerTile == kTileM,
                "per-token scales along M (unswapped rows)");
  static_assert(Base::ScaleGranularityN == kWeightBlock && Base::ScaleGranularityK == kTileK,
                "128x128 weight blocks, one scale block per stage");
  // The weight scales are read at column 0 and 128 of the stage's (TileN, TileK) scale layout.
  static_assert(decltype(cute::size<0>(SmemLayoutSFB{}))::value == kTileN &&
                decltype(cute::size(cute::filter_zeros(SmemLayoutSFB{})))::value == 2 * Base::DispatchPolicy::Stages,
                "two weight-block scales per stage");

  // Two warpgroups along M, each 64 rows; one 64x64x32 register-A atom per quarter and K slice.
  using RsTiledMma = decltype(cute::make_tiled_mma(cute::SM90::GMMA::MMA_64x64x32_F32E4M3E4M3_RS_TN<>{},
                                                   cute::Layout<cute::Shape<cute::_2, cute::_1, cute::_1>>{}));

  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum,
                          int k_tile_count, int thread_idx, TensorStorage& shared_tensors, Params const&) {
    using namespace cute;
    static_assert(is_rmem<FrgTensorC>::value, "accumulators must live in registers");
    static_assert(decltype(size(accum))::value == kQuarters * 32, "the base's 64x256 fragment: 128 values");

    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});  // (BLK_M, BLK_K, PIPE)
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});  // (BLK_N, BLK_K, PIPE)

    RsTiledMma tiled_mma;
    auto thr_mma = tiled_mma.get_thread_slice(thread_idx);
    Tensor tCrA = thr_mma.partition_fragment_A(sA(_, _, 0));  // (MMA, MMA_M, MMA_K) registers
    Tensor tCsB = thr_mma.partition_B(sB);                     // (MMA, MMA_N, MMA_K, PIPE)
    Tensor tCrB = thr_mma.make_fragment_B(tCsB);               // descriptors
    CUTE_STATIC_ASSERT_V(size<1>(tCrA) == _1{});
    CUTE_STATIC_ASSERT_V(size<1>(tCrB) == Int<kQuarters>{});

    // ldmatrix (x4, 8x8 b16 matrices): a thread's 4 registers of one K slice of an FP8 register-A
    // fragment are rows g and g + 8, bytes 4t..4t+3 and 16 + 4t.., the four matrices' layout; one
    // shared-memory instruction per slice instead of 4 generic 32-bit loads (call 2's SASS).
    auto a_copy = make_tiled_copy_A(Copy_Atom<SM75_U32x4_LDSM_N, ElementA>{}, tiled_mma);
    auto a_thr = a_copy.get_thread_slice(thread_idx);
    Tensor tAsA = a_thr.partition_S(sA);    // (CPY, CPY_M, CPY_K, PIPE)
    Tensor tArA = a_thr.retile_D(tCrA);     // (CPY, CPY_M, CPY_K)
    constexpr int kSteps = decltype(size<2>(tCrA))::value;  // K slices of 32 per block
    static_assert(kSteps == 4, "the loop below refills 4 slices");
    static_assert(decltype(size<2>(tAsA))::value == kSteps && decltype(size<2>(tArA))::value == kSteps,
                  "one ldmatrix.x4 per K slice");

    // The stage's per-token scales seen as a (TileM, 64, PIPE) tensor (stride 0 along N), cut like a
    // quarter's accumulators: element i is the scale of accumulator value i's row.
    constexpr auto sfa = SmemLayoutSFA{};  // ((1, TileM), (128, 1), PIPE)
    Tensor sRowScales = make_tensor(
        make_smem_ptr(shared_tensors.smem_SFA.data()),
        make_layout(make_shape(get<0>(shape(sfa)), Int<kQuarterN>{}, get<2>(shape(sfa))),
                    make_stride(get<0>(stride(sfa)), _0{}, get<2>(stride(sfa)))));
    Tensor tCsRow = thr_mma.partition_C(sRowScales);  // (MMA, MMA_M, MMA_N, PIPE)

    Tensor tmp0 = partition_fragment_C(tiled_mma, Shape<Int<kTileM>, Int<kQuarterN>>{});  // (MMA, 1, 1)
    Tensor tmp1 = make_fragment_like(tmp0);
    CUTE_STATIC_ASSERT_V(size(tmp0) == Int<32>{});
    CUTE_STATIC_ASSERT_V(shape(tCsRow(_, _, _, 0)) == shape(tmp0));
    // Per weight block: fl(per-token scale * weight-block scale) for the rows of a quarter's values
    // (stride 0 kept along the columns: 2 registers each).
    Tensor scale0 = make_tensor_like<Scale>(tCsRow(_, _, _, 0));
    Tensor scale1 = make_tensor_like<Scale>(tCsRow(_, _, _, 0));

    clear(accum);  // the first promotion adds to +0, as the base's does
    if (k_tile_count <= 0) return;

    // fl(per-token scale * the stage's scale of weight block `wb`) (the base's operand order).
    auto load_scales = [&](auto& dst, int stage, auto wb) {
      Tensor src = filter_zeros(tCsRow(_, _, _, stage));
      Tensor d = filter_zeros(dst);
      const Scale sfb = shared_tensors.smem_SFB[SmemLayoutSFB{}(Int<decltype(wb)::value * kWeightBlock>{}, 0, stage)];
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(d); ++i) d(i) = src(i) * sfb;
    };
    // K slice kk of the stage's activation rows into registers; the wgmma that read the slice before
    // have completed (the callers' waits).
    auto load_slice = [&](int kk, int stage) {
      warpgroup_fence_operand(tCrA);
      copy(a_copy, tAsA(_, _, kk, stage), tArA(_, _, kk));
      warpgroup_fence_operand(tCrA);
    };
    // The wgmma of quarter q (64 columns) and K slice kk, the first slice overwriting `frag`.
    auto gemm_step = [&](int q, int kk, auto& frag, int stage) {
      tiled_mma.accumulate_ = kk == 0 ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
      cute::gemm(tiled_mma, tCrA(_, 0, kk), tCrB(_, q, kk, stage), frag(_, 0, 0));
    };
    // A whole quarter as one commit group.
    auto issue_quarter = [&](int q, auto& frag, int stage) {
      warpgroup_fence_operand(frag);
      warpgroup_arrive();
      CUTLASS_PRAGMA_UNROLL
      for (int kk = 0; kk < kSteps; ++kk) gemm_step(q, kk, frag, stage);
      warpgroup_commit_batch();
      warpgroup_fence_operand(frag);
    };
    // One K slice of a quarter as its own commit group.
    auto issue_step = [&](int q, int kk, auto& frag, int stage) {
      warpgroup_fence_operand(frag);
      warpgroup_arrive();
      gemm_step(q, kk, frag, stage);
      warpgroup_commit_batch();
      warpgroup_fence_operand(frag);
    };
    // acc values 32q..32q+31 += frag * scale (quarter q's weight block is q / 2).
    auto promote_quarter = [&](auto q, auto& frag, auto const& scale) {
      constexpr int kFirst = decltype(q)::value * 32;  // a constant, so the accumulators stay registers
      warpgroup_fence_operand(frag);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(frag); ++i) accum(kFirst + i) = fmaf(frag(i), scale(i), accum(kFirst + i));
      warpgroup_fence_operand(accum);
    };

    // The first block's scale0 and slices; quarter 3 of "block -1" is a zero fragment with zero scales.
    pipeline.consumer_wait(smem_pipe_read);
    int stage = smem_pipe_read.index();
    load_scales(scale0, stage, Int<0>{});
    CUTLASS_PRAGMA_UNROLL
    for (int kk = 0; kk < kSteps; ++kk) load_slice(kk, stage);
    clear(tmp1);
    clear(scale1);

    // Block b: quarter 0 first, then block b-1's quarter 3 promoted while it runs; quarter q promoted
    // while q + 1 runs; quarter 3 issued one K slice per commit group, and as each of its slices
    // completes, block b+1's slice is loaded into the same registers (ldmatrix), so the warpgroup's
    // wgmma stop only for the last slice's load. No wgmma is in flight across the loop's back edge:
    // with one there, ptxas serialized every wgmma of the kernel (C7514, call 4's SASS). The last
    // block loads its own stage again as "next" (no branch around the waits).
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count > 0; --k_tile_count) {
      const bool has_next = k_tile_count > 1;
      issue_quarter(0, tmp0, stage);
      // Nothing but quarter 0 is in flight here; the wait tells ptxas that block b-1's quarter 3 has
      // completed (without it ptxas injected a full wait here, C7517: it does not carry that across
      // the back edge).
      warpgroup_wait<1>();
      promote_quarter(Int<3>{}, tmp1, scale1);  // block b-1's (zero before the first block)
      load_scales(scale1, stage, Int<1>{});
      issue_quarter(1, tmp1, stage);
      warpgroup_wait<1>();
      promote_quarter(Int<0>{}, tmp0, scale0);
      issue_quarter(2, tmp0, stage);
      warpgroup_wait<1>();
      promote_quarter(Int<1>{}, tmp1, scale0);
      CUTLASS_PRAGMA_UNROLL
      for (int kk = 0; kk < kSteps; ++kk) issue_step(3, kk, tmp1, stage);
      warpgroup_wait<kSteps>();
      promote_quarter(Int<2>{}, tmp0, scale1);
      PipelineState next = smem_pipe_read;
      if (has_next) {
        ++next;
        pipeline.consumer_wait(next);
      }
      const int next_stage = next.index();
      load_scales(scale0, next_stage, Int<0>{});
      warpgroup_wait<kSteps - 1>();
      load_slice(0, next_stage);
      warpgroup_wait<kSteps - 2>();
      load_slice(1, next_stage);
      warpgroup_wait<kSteps - 3>();
      load_slice(2, next_stage);
      warpgroup_wait<0>();
      load_slice(3, next_stage);
      pipeline.consumer_release(smem_pipe_read);  // every wgmma of block b has completed
      smem_pipe_read = next;
      stage = next_stage;
    }
    promote_quarter(Int<3>{}, tmp1, scale1);
  }

  // mma() released every stage of the tile.
  CUTLASS_DEVICE void mma_tail(MainloopPipeline, PipelineState, int) {}
};

}  // namespace blockfp8::gemm::sm90
