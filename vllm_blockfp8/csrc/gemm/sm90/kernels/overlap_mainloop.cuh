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
// mma() is also offered in two halves (issue_first_block, mma_after_first_block) for the issue-ahead kernel
// (issue_ahead_kernel.cuh), which issues a tile's first block before the previous tile's epilogue; the
// halves run mma()'s instructions in its order, with the fragments in the kernel's scope.
//
// The scale layouts (unswapped: per-row SFA; swap-AB: per-column SFB), their partition like the
// accumulators, the scale product, the per-block wgmma issue and the promotion are
// ConsumerLoopParts (consumer_loop.cuh); this file is the schedule. Everything else (producer, scale loads, pipeline, shared storage, TMA, epilogue,
// schedulers) is the CUTLASS collective this derives from; only mma/mma_tail differ, and load() for a cluster's
// padding tile (below).
//
// Numerics: bitwise the same as the base collective by construction (for the unswapped 128x128
// row and the 128x64 swap-AB row checked on the H200 against their CUTLASS-loop rows before those
// were deleted, the unswapped one also in SASS): same wgmma
// sequence per block (zeroing first K slice, 4 x K=32), same scale product (the base's operand
// order: per-row/column scale times the tile's scale), same FFMA per element in the same block
// order; the base's first promotion compiles to FFMA with +0 (RZ) for its never-initialized
// accumulator (both the c2x1 and the swap rows' SASS), which the explicit clear reproduces.
//
// Supported (static_assert, here and in ConsumerLoopParts): exactly one of SFA / SFB with one
// scale per accumulator row / column (granularity 1 along M with ScaleMsPerTile = tile M, or along
// N with ScaleNsPerTile = tile N) and the other with one scale per tile (ScaleNsPerTile = 1, resp.
// ScaleMsPerTile = 1); exactly one scale block per pipeline stage (ScaleGranularityK = tile K); at
// most 64 accumulators per thread (three fragments in the 232 consumer registers). Any scheduler
// whose kernel calls mma with k_tile_count >= 1 and advances its own pipeline state by
// k_tile_count after mma_tail (persistent, stream-K and ping-pong kernels: gemm/NOTES.md;
// k_tile_count <= 0 returns acc = 0 without touching the pipeline).
#pragma once

#include <cuda_runtime_api.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/collective/collective_builder.hpp"

#include "consumer_loop.cuh"

namespace blockfp8::gemm::sm90 {

template <class Base>
struct OverlapPromotionMainloop : Base {
  using Parts = ConsumerLoopParts<Base>;
  using typename Base::MainloopPipeline;
  using typename Base::Params;
  using typename Base::PipelineState;
  using typename Base::TensorStorage;
  using typename Base::TiledMma;
  using Scale = typename Parts::Scale;

  static_assert(Parts::kAccPerThread <= 64,
                "acc + two temporary fragments must fit the 232 consumer registers");

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

    TiledMma tiled_mma;
    auto operands = Parts::operand_fragments(tiled_mma, thread_idx, shared_tensors);
    Tensor tCsScale = Parts::partition_scales(shared_tensors, thread_idx);  // (MMA, MMA_M, MMA_N, PIPE)
    CUTE_STATIC_ASSERT_V(shape(tCsScale(_, _, _, 0)) == shape(accum));

    Tensor tmp0 = make_fragment_like(accum);
    Tensor tmp1 = make_fragment_like(accum);
    // Stride 0 kept: 2 registers per fragment at the 128x128 tile (rows), 8 / 16 at the 128x32 /
    // 128x64 swap tiles (columns).
    Tensor scale0 = make_tensor_like<Scale>(tCsScale(_, _, _, 0));
    Tensor scale1 = make_tensor_like<Scale>(tCsScale(_, _, _, 0));

    clear(accum);  // the first promotion then adds to +0, as the base's does
    if (k_tile_count <= 0) return;

    pipeline.consumer_wait(smem_pipe_read);
    issue_block(tiled_mma, operands, tCsScale, shared_tensors, tmp0, scale0, smem_pipe_read.index());
    PipelineState first = smem_pipe_read;
    ++smem_pipe_read;
    walk_after_first_block(pipeline, smem_pipe_read, first, k_tile_count - 1, accum, tmp0, tmp1, scale0, scale1,
                           tiled_mma, operands, tCsScale, shared_tensors);
  }

  // mma() released every stage of the tile (the base leaves the last one for this call).
  CUTLASS_DEVICE void mma_tail(MainloopPipeline, PipelineState, int) {}

  // Producer side: the base's loads, except for the padding tile of a cluster along M (2x1 clusters with an odd
  // number of M tiles: the scheduler hands the second CTA of the last cluster a tile wholly past M). Its A and
  // token-scale boxes would lie wholly out of bounds, and such a tile measured slower than a real one (gemm/NOTES.md
  // twenty-eighth session, E29); it loads its cluster partner's rows instead (the same lines, at the same time).
  // Its results are never stored: the epilogue masks the tile by the kernel's own, unclamped coordinate.
  template <class LoadInputs, class BlockCoord, class KTileIterator>
  CUTLASS_DEVICE void load(Params const& params, MainloopPipeline pipeline, PipelineState smem_pipe_write,
                           LoadInputs const& load_inputs, BlockCoord const& blk_coord, KTileIterator k_tile_iter,
                           int k_tile_count, int thread_idx, uint32_t block_rank_in_cluster,
                           TensorStorage& shared_tensors) {
    using namespace cute;
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord;
    const int m_tiles = size<2>(get<0>(load_inputs));  // A's tiles of M: (BLK_M, BLK_K, m, k, l)
    const auto m_load = m_coord < m_tiles ? m_coord : m_tiles - 1;
    Base::load(params, pipeline, smem_pipe_write, load_inputs, make_tuple(m_load, n_coord, k_coord, l_coord),
               k_tile_iter, k_tile_count, thread_idx, block_rank_in_cluster, shared_tensors);
  }

  // mma() in two halves, for a kernel that issues a tile's first K block before the previous tile's
  // epilogue (issue_ahead_kernel.cuh). The fragments live in the caller's scope: tmp0 and scale0 carry
  // the first block from issue_first_block to mma_after_first_block; the caller's accum stays untouched
  // until mma_after_first_block clears it. Together they run mma()'s instructions in mma()'s order, so the
  // results are the same bits.
  template <class FrgTensorC>
  CUTLASS_DEVICE static auto make_scale_fragment(FrgTensorC const& accum, int thread_idx, TensorStorage& shared_tensors) {
    using namespace cute;
    Tensor tCsScale = Parts::partition_scales(shared_tensors, thread_idx);
    CUTE_STATIC_ASSERT_V(shape(tCsScale(_, _, _, 0)) == shape(accum));
    return make_tensor_like<Scale>(tCsScale(_, _, _, 0));
  }

  // Waits for block `first` and issues its wgmma into tmp0 (the zeroing first K slice), its scales into scale0.
  template <class FrgTensorC, class ScaleFrg>
  CUTLASS_DEVICE void issue_first_block(MainloopPipeline pipeline, PipelineState first, FrgTensorC& tmp0,
                                        ScaleFrg& scale0, int thread_idx, TensorStorage& shared_tensors) {
    TiledMma tiled_mma;
    auto operands = Parts::operand_fragments(tiled_mma, thread_idx, shared_tensors);
    auto tCsScale = Parts::partition_scales(shared_tensors, thread_idx);
    pipeline.consumer_wait(first);
    issue_block(tiled_mma, operands, tCsScale, shared_tensors, tmp0, scale0, first.index());
  }

  // The rest of the tile whose first block (state `first`) issue_first_block put into tmp0: accum cleared,
  // then k_tile_count - 1 more blocks; every stage of the tile released on return.
  template <class FrgTensorC, class ScaleFrg>
  CUTLASS_DEVICE void mma_after_first_block(MainloopPipeline pipeline, PipelineState first, FrgTensorC& accum,
                                            FrgTensorC& tmp0, FrgTensorC& tmp1, ScaleFrg& scale0, ScaleFrg& scale1,
                                            int k_tile_count, int thread_idx, TensorStorage& shared_tensors) {
    TiledMma tiled_mma;
    auto operands = Parts::operand_fragments(tiled_mma, thread_idx, shared_tensors);
    auto tCsScale = Parts::partition_scales(shared_tensors, thread_idx);
    cute::clear(accum);
    PipelineState next = first;
    ++next;
    walk_after_first_block(pipeline, next, first, k_tile_count - 1, accum, tmp0, tmp1, scale0, scale1, tiled_mma,
                           operands, tCsScale, shared_tensors);
  }

 private:
  // Scales are read right after the stage's wait and before its wgmma is issued: a stage is
  // released only after that wgmma completed, and every thread of the warpgroup issues it after
  // its scale reads (the base orders them the same way). Reading them after the wait<1> instead
  // would race with the release on a 2-CTA cluster, where one thread per warpgroup arrives.
  template <class Operands, class ScaleSmem, class Frag, class ScaleFrg>
  CUTLASS_DEVICE static void issue_block(TiledMma& tiled_mma, Operands const& operands, ScaleSmem const& tCsScale,
                                         TensorStorage& shared_tensors, Frag& frag, ScaleFrg& scale, int stage) {
    Parts::load_scales(scale, tCsScale, shared_tensors, stage);
    Parts::issue_k_block(tiled_mma, cute::get<0>(operands), cute::get<1>(operands), frag, stage);
  }

  // The K loop after a tile's first block (state `first`, issued into tmp0): `unissued` more blocks from
  // smem_pipe_read on; block k goes into one temporary fragment while block k-1 (in the other) is promoted.
  template <class FrgTensorC, class ScaleFrg, class Operands, class ScaleSmem>
  CUTLASS_DEVICE static void walk_after_first_block(MainloopPipeline& pipeline, PipelineState smem_pipe_read,
                                                    PipelineState smem_pipe_release, int unissued, FrgTensorC& accum,
                                                    FrgTensorC& tmp0, FrgTensorC& tmp1, ScaleFrg& scale0,
                                                    ScaleFrg& scale1, TiledMma& tiled_mma, Operands const& operands,
                                                    ScaleSmem const& tCsScale, TensorStorage& shared_tensors) {
    using namespace cute;
    auto issue_next = [&](auto& frag, auto& scale) {
      issue_block(tiled_mma, operands, tCsScale, shared_tensors, frag, scale, smem_pipe_read.index());
      ++smem_pipe_read;
      --unissued;
    };
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
      Parts::promote_and_fence_acc(accum, prev, prev_scale);
    };
    auto drain = [&](auto& last, auto const& last_scale) {
      warpgroup_wait<0>();
      pipeline.consumer_release(smem_pipe_release);
      Parts::promote_and_fence_acc(accum, last, last_scale);
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
};

}  // namespace blockfp8::gemm::sm90
