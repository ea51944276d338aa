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
// The scale layouts (unswapped: per-row SFA; swap-AB: per-column SFB), their partition like the
// accumulators, the scale product, the per-block wgmma issue and the promotion are
// ConsumerLoopParts (sm90_consumer_loop.cuh); this file is the schedule. Everything else (producer, scale loads, pipeline, shared storage, TMA, epilogue,
// schedulers) is the CUTLASS collective this derives from; only mma/mma_tail differ.
//
// Numerics: bitwise the same as the base collective by construction (for the unswapped 128x128
// row and the 128x64 swap-AB row checked on the H200 against their CUTLASS-loop rows before those
// were deleted, the unswapped one also in SASS): same wgmma
// sequence per block (zeroing first K slice, 4 x K=32), same scale product (the base's operand
// order: per-row/column scale times the tile's scale), same FFMA per element in the same block
// order; the base's first promotion compiles to FFMA with +0 (RZ) for its never-initialized
// accumulator (both the c2x1 and the swap rows' SASS), which the explicit clear reproduces.
//
// Weight tiles narrower than a scale block (unswapped, tile N % 128 != 0, e.g. 48 columns so that a
// problem's tile count can match the SM count): a tile's columns then lie in one or two 128-column
// weight blocks, which no affine scale layout maps (CUTLASS's loader tiles the SFB layout, and a
// nested 16-column layout does not cut at width 48). The collective is built with one SFB entry per
// tile and a stride-0 SFB layout (its cp.async loads are unused); NarrowWeightTiles records each
// tile's first column and last weight block in a shared-memory ring as the producer starts the
// tile (the consumers take them after the tile's first full-barrier wait, which orders them), and
// the consumers read the tile's two block scales per K block from global memory (L2-resident) when
// they issue the block: S = fl(SFA[i] * SFB[block of column j]), as the reference.
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

#include "sm90_consumer_loop.cuh"
#include "sm90_kernel.h"

namespace blockfp8::gemm::sm90 {

// Unswapped rows whose tile N is not a multiple of the 128-column weight block (header comment).
template <class Base>
constexpr bool kNarrowWeightTiles = ConsumerLoopParts<Base>::kRowScales && ConsumerLoopParts<Base>::kTileN % 128 != 0;

// The producer side of narrow weight tiles and the arguments they add: the weight-scale tensor's
// rows (checkpoint blocks, ceil(n / 128)) and row length (k / 128), for the consumers' own loads.
template <class Base>
struct NarrowWeightTiles : Base {
  using Scale = typename Base::ElementBlockScale;
  static constexpr int kTileN = ConsumerLoopParts<Base>::kTileN;
  static_assert(kTileN < 128 && kTileN % 8 == 0, "a narrow tile lies in at most two weight blocks");
  // CUTE picks a wgmma as wide as the tile only for the widths in its extended set (40, 48, 56, ...)
  // when CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED is defined before the first CUTE include; otherwise
  // 48 becomes three 16-wide and 40 / 56 five / seven 8-wide wgmmas per K slice (1.4x / 2.0x / 2.2x
  // the selected row's time on the H200: gemm/NOTES.md).
  static_assert(cute::size<1>(typename Base::TiledMma::AtomShape_MNK{}) == kTileN,
                "narrow tile split into several wgmmas: define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED in its unit");
  // Tiles between the producer's start of a tile and the consumers' read of its entry: the producer
  // is at most a pipeline's worth of K blocks (>= 1 per tile) ahead.
  static constexpr int kRing = kNarrowTileRing;
  static_assert(Base::DispatchPolicy::Stages + 2 <= kRing, "ring shorter than the tiles in flight");

  struct TensorStorage : Base::TensorStorage {
    cute::array<int32_t, 2 * kRing> tile_columns;  // per tile: first column, last weight block
  };
  struct Arguments : Base::Arguments {
    int32_t weight_scale_rows = 0;
    int32_t weight_scale_cols = 0;
  };
  struct Params : Base::Params {
    Scale const* weight_scale;
    int32_t weight_scale_rows;
    int32_t weight_scale_cols;
  };
  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const& problem_shape, Arguments const& args,
                                                  void* workspace) {
    return {Base::to_underlying_arguments(problem_shape, args, workspace), args.ptr_SFB, args.weight_scale_rows,
            args.weight_scale_cols};
  }

  int tiles_started_ = 0;

  // Lane 0 writes the entry before Base::load: it is the pipeline's leader (thread_idx is the lane,
  // and the kernel makes warp-group thread 0 the leader), whose arrive_and_expect_tx on the tile's
  // first full barrier (a release) publishes it. The other lanes' arrivals are cp.async arrivals,
  // which do not order their plain stores: racecheck reported every lane writing as a hazard.
  template <class Pipeline, class State, class Inputs, class BlockCoord, class KTileIterator>
  CUTLASS_DEVICE void load(Params const& params, Pipeline pipeline, State smem_pipe_write, Inputs const& load_inputs,
                           BlockCoord const& blk_coord, KTileIterator k_tile_iter, int k_tile_count, int thread_idx,
                           uint32_t block_rank_in_cluster, TensorStorage& shared_tensors) {
    const int32_t first = int32_t(cute::get<1>(blk_coord)) * kTileN;
    const int slot = tiles_started_++ % kRing;
    if (thread_idx == 0) {
      shared_tensors.tile_columns[2 * slot] = first;
      shared_tensors.tile_columns[2 * slot + 1] = cute::min((first + kTileN - 1) / 128, params.weight_scale_rows - 1);
    }
    Base::load(params, pipeline, smem_pipe_write, load_inputs, blk_coord, k_tile_iter, k_tile_count, thread_idx,
               block_rank_in_cluster, shared_tensors);
  }
};

template <class Base>
struct OverlapPromotionMainloop : std::conditional_t<kNarrowWeightTiles<Base>, NarrowWeightTiles<Base>, Base> {
  using Parent = std::conditional_t<kNarrowWeightTiles<Base>, NarrowWeightTiles<Base>, Base>;
  using Parts = ConsumerLoopParts<Base>;
  using typename Base::MainloopPipeline;
  using typename Parent::Params;
  using typename Base::PipelineState;
  using typename Parent::TensorStorage;
  using typename Base::TiledMma;
  using Scale = typename Parts::Scale;
  static constexpr bool kNarrow = kNarrowWeightTiles<Base>;
  int tiles_done_ = 0;

  static_assert(Parts::kAccPerThread <= 64,
                "acc + two temporary fragments must fit the 232 consumer registers");

  // Consumer side. Called by the kernel with the work unit's first pipeline state and its
  // k_tile_count (>= 1: the persistent scheduler passes the tile's K blocks, the stream-K scheduler
  // a unit's share of one output tile, and the kernel calls mma only for valid units, i.e. with
  // k_tile_count > 0); the kernel advances its own state by k_tile_count after mma_tail. Every
  // stage this call reads it also releases, so mma_tail has nothing left to do.
  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum,
                          int k_tile_count, int thread_idx, TensorStorage& shared_tensors, Params const& params) {
    using namespace cute;
    static_assert(is_rmem<FrgTensorC>::value, "accumulators must live in registers");

    TiledMma tiled_mma;
    auto operands = Parts::operand_fragments(tiled_mma, thread_idx, shared_tensors);
    Tensor tCrA = get<0>(operands);  // (MMA, MMA_M, MMA_K, PIPE)
    Tensor tCrB = get<1>(operands);  // (MMA, MMA_N, MMA_K, PIPE)

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

    PipelineState smem_pipe_release = smem_pipe_read;
    int unissued = k_tile_count;

    // Narrow weight tiles: the tile's two weight blocks and, per accumulator, which one its column
    // lies in (columns from `split` on are in the second). A block's two scales are loaded from
    // global memory when the block before it is issued (w_next), handed to the fragment's own pair
    // when it is issued, and used at its promotion: two blocks' time to cover an L2 load under the
    // kernel's own traffic (one block's was measured too little: gemm/NOTES.md eleventh session).
    const Scale* weight_scale = nullptr;
    int32_t block_first = 0, block_last = 0, split = Parts::kTileN;
    Scale w0[2] = {}, w1[2] = {}, w_next[2] = {};
    // Takes the params as a generic argument so that the narrow fields are looked up only where it
    // is called, under `if constexpr (kNarrow)` (the other rows' Params lack them).
    auto load_weight_scales = [&](auto const& narrow_params, int64_t k) {
      w_next[0] = __ldg(weight_scale + int64_t(block_first) * narrow_params.weight_scale_cols + k);
      w_next[1] = __ldg(weight_scale + int64_t(block_last) * narrow_params.weight_scale_cols + k);
    };
    auto columns = [&] {
      Tensor coord = make_identity_tensor(make_shape(Int<Parts::kTileM>{}, Int<Parts::kTileN>{}));
      return TiledMma{}.get_slice(thread_idx).partition_C(coord);  // (MMA, MMA_M, MMA_N) -> (row, col)
    }();

    // Scales are read right after the stage's wait and before its wgmma is issued: a stage is
    // released only after that wgmma completed, and every thread of the warpgroup issues it after
    // its scale reads (the base orders them the same way). Reading them after the wait<1> instead
    // would race with the release on a 2-CTA cluster, where one thread per warpgroup arrives.
    auto issue_next = [&](auto& frag, auto& scale, Scale (&w)[2]) {
      const int stage = smem_pipe_read.index();
      if constexpr (kNarrow) {
        const int64_t k = k_tile_count - unissued;
        w[0] = w_next[0];
        w[1] = w_next[1];
        if (k + 1 < k_tile_count) load_weight_scales(params, k + 1);
      }
      Parts::template load_scales<!kNarrow>(scale, tCsScale, shared_tensors, stage);
      Parts::issue_k_block(tiled_mma, tCrA, tCrB, frag, stage);
      ++smem_pipe_read;
      --unissued;
    };
    auto promote = [&](auto& frag, auto const& scale, Scale const (&w)[2]) {
      if constexpr (kNarrow) {
        Parts::promote_columns_and_fence_acc(accum, frag, scale, columns, split, w);
      } else {
        Parts::promote_and_fence_acc(accum, frag, scale);
      }
    };

    pipeline.consumer_wait(smem_pipe_read);
    if constexpr (kNarrow) {
      const int slot = tiles_done_++ % Parent::kRing;
      const int32_t first = shared_tensors.tile_columns[2 * slot];
      block_last = shared_tensors.tile_columns[2 * slot + 1];
      block_first = first / 128;
      split = 128 - first % 128;
      weight_scale = params.weight_scale;
      load_weight_scales(params, 0);
    }
    issue_next(tmp0, scale0, w0);
    auto barrier_token = pipeline.consumer_try_wait(smem_pipe_read, unissued == 0);

    // Block k into `next` while block k-1 (in `prev`) is promoted.
    auto step = [&](auto& next, auto& next_scale, Scale (&next_w)[2], auto& prev, auto const& prev_scale,
                    Scale const (&prev_w)[2]) {
      pipeline.consumer_wait(smem_pipe_read, barrier_token);
      issue_next(next, next_scale, next_w);
      warpgroup_wait<1>();  // block k-1 complete, block k may still run
      pipeline.consumer_release(smem_pipe_release);
      ++smem_pipe_release;
      // Tested now so the barrier's latency hides behind the promotion; skipped past the last block.
      barrier_token = pipeline.consumer_try_wait(smem_pipe_read, unissued == 0);
      promote(prev, prev_scale, prev_w);
    };
    auto drain = [&](auto& last, auto const& last_scale, Scale const (&last_w)[2]) {
      warpgroup_wait<0>();
      pipeline.consumer_release(smem_pipe_release);
      promote(last, last_scale, last_w);
    };

    // Unrolled by two so that each fragment is a compile-time register set.
    CUTLASS_PRAGMA_NO_UNROLL
    while (true) {
      if (unissued == 0) {
        drain(tmp0, scale0, w0);
        break;
      }
      step(tmp1, scale1, w1, tmp0, scale0, w0);
      if (unissued == 0) {
        drain(tmp1, scale1, w1);
        break;
      }
      step(tmp0, scale0, w0, tmp1, scale1, w1);
    }
  }

  // mma() released every stage of the tile (the base leaves the last one for this call).
  CUTLASS_DEVICE void mma_tail(MainloopPipeline, PipelineState, int) {}
};

}  // namespace blockfp8::gemm::sm90
