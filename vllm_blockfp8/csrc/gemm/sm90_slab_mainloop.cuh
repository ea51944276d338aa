// SM90 (sm_90a) block-FP8 consumer loop for tiles whose warpgroups own several m64 slabs each
// (the 256x128 cooperative tile: 2 warpgroups x 2 slabs of 64x128), unswapped layout only.
//
// Math (the same per element as sm90_overlap_mainloop.cuh): acc[i, j] = sum_kb fma(P_kb[i, j],
// S_kb[i], acc), acc cleared to +0 first, P_kb the fp32 wgmma result of one 128-deep K block
// (4 wgmma of K = 32, the first zeroing), S_kb[i] = fl(SFA[i, kb] * SFB_tile[kb]) (per-token scale
// of row i times the tile's one weight-block scale, in that operand order).
//
// Why a loop of our own. CUTLASS's blockwise consumer keeps a temporary fragment as large as the
// whole accumulator: at 256x128 each consumer thread would hold 128 + 128 fp32 registers, more
// than the 232 setmaxnreg gives it (gemm/NOTES.md: "256-wide tiles spill"). Here the temporary
// covers ONE slab (64 registers), and the slabs of a K block are issued and promoted one after the
// other:
//
//   clear(acc)
//   for each K block:  wait for the stage; read its scales (2 rows per slab per thread) and form
//                      fl(sfa * sfb);
//     slab 0:          4 wgmma -> tmp (first zeroing); commit; wait<0>; acc[slab 0] = fma(tmp, s, acc)
//     ...
//     last slab:       4 wgmma -> tmp; commit; wait<0>; release the stage; test the next stage's
//                      barrier; acc[last slab] = fma(tmp, s, acc)
//
// Shared with sm90_overlap_mainloop.cuh (ConsumerLoopParts, sm90_consumer_loop.cuh): the scale
// partition and product, the K-block wgmma issue (given here one slab's view of the A operand) and
// the promotion. This file: the slab views (slab<S>) and the schedule.
//
// Registers per consumer thread: acc 128 + tmp 64 + 4 scales + pipeline state / addressing; ptxas
// (nvcc 13.0) uses up to R204 of the 232 setmaxnreg gives a consumer, 0 spill (gemm/NOTES.md has
// the SASS: 4 QGMMA.64x128x32 + WARPGROUP.DEPBAR.LE gsb0, 0x0 + 64 FFMA per slab).
//
// Design choice: (a) one temporary, each slab drained (wait<0>) before its promotion. The other
// warpgroup's wgmma fills this warpgroup's drain + promotion on the tensor cores, as in CUTLASS's
// cooperative loop and DeepGEMM's 256x128 kernel. Rejected:
//   (b) two one-slab temporaries with the next slab's (or next block's slab 0's) wgmma in flight
//       while the previous slab is promoted (wait<1>, as sm90_overlap_mainloop.cuh does per block):
//       128 + 2 x 64 = 256 accumulator registers > 232 before any addressing; ptxas would spill
//       accumulators of in-flight wgmma.
//   (b') one temporary but the next slab issued before the current one is promoted: the next
//       slab's wgmma needs a destination distinct from the temporary being promoted, i.e. (b).
//       The only registers free of live data are the final accumulator's own, and only before a
//       tile's first block (a prologue trick worth one drain per tile, ~1/32 of them at K = 4096;
//       not done).
//   A narrower temporary (64x64 wgmma, 32 registers, two in flight) changes the wgmma shape, so
//       bitwise equality with the 128x128 row would no longer follow from construction, and it
//       doubles the B-operand shared-memory reads per FLOP.
//
// Pipeline contract (as sm90_overlap_mainloop.cuh): mma() releases every stage it reads (the last
// slab's wait<0> is the last read of the stage's A/B; its scales were read before any of its
// wgmma was issued, so every thread of the warpgroup is past them when the warpgroup-collective
// wgmma completes); mma_tail() is a no-op; the kernel passes k_tile_count >= 1 (persistent
// scheduler: the tile's K blocks) and advances its own pipeline state by k_tile_count after
// mma_tail; k_tile_count <= 0 returns acc = +0 without touching the pipeline.
//
// Numerics: bitwise equal to the 128x128 row sm90_coop_128x128x128_c2x1_ovl by construction.
// Slab s of warpgroup w covers tile rows 128 s + 64 w .. + 63, a 64-row group at a multiple of 64
// in the output, as the 128x128 tile's warpgroups do; each output element therefore gets the same
// m64n128k32 wgmma sequence over the same A row and B column (same K slices, same order, first
// zeroing), the same fl(sfa * sfb) and the same FFMA chain from +0 in K-block order. The epilogue
// (alpha = 1, no C) converts the same fp32 value. tests/test_gemm.py compares the two rows bit for
// bit.
//
// Supported (static_assert, here and in ConsumerLoopParts): per-token SFA (granularity 1 along M,
// ScaleMsPerTile = tile M), one SFB per tile (ScaleNsPerTile = 1), one scale block per stage
// (ScaleGranularityK = tile K), two warpgroups along M, tile N = the wgmma atom's N (one wgmma per
// slab per K = 32 slice), at least one slab per warpgroup, acc + one slab within 192 registers.
#pragma once

#include <cuda_runtime_api.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/collective/collective_builder.hpp"

#include "sm90_consumer_loop.cuh"

namespace blockfp8::gemm::sm90 {

template <class Base>
struct SlabPromotionMainloop : Base {
  using Parts = ConsumerLoopParts<Base>;
  using typename Base::MainloopPipeline;
  using typename Base::Params;
  using typename Base::PipelineState;
  using typename Base::TensorStorage;
  using typename Base::TiledMma;
  using Scale = typename Parts::Scale;

  static constexpr int kWarpGroups = cute::size(TiledMma{}) / Parts::kWarpGroupThreads;
  static constexpr int kAtomM = cute::size<0>(typename TiledMma::AtomShape_MNK{});
  static constexpr int kAtomN = cute::size<1>(typename TiledMma::AtomShape_MNK{});
  // m64 slabs per warpgroup: the MMA_M mode of the C partition (the tiled MMA stacks the
  // warpgroups' atoms along M and repeats that over the tile).
  static constexpr int kSlabs = Parts::kTileM / (kAtomM * kWarpGroups);
  static constexpr int kSlabPerThread = kAtomM * kAtomN / Parts::kWarpGroupThreads;

  static_assert(Parts::kRowScales,
                "per-token SFA (one scale per tile row) and one weight-block SFB per tile: unswapped rows only");
  static_assert(kWarpGroups == 2 &&
                    cute::size<0>(typename TiledMma::AtomLayoutC_TV{}) == Parts::kWarpGroupThreads,
                "two consumer warpgroups, one wgmma atom per warpgroup");
  static_assert(Parts::kTileN == kAtomN, "one wgmma per slab per K slice: tile N must be the atom's N");
  static_assert(Parts::kTileM % (kAtomM * kWarpGroups) == 0 && kSlabs >= 1, "whole m64 slabs per warpgroup");
  static_assert(Parts::kAccPerThread + kSlabPerThread <= 192,
                "acc + a one-slab temporary must leave room for addressing in the 232 consumer registers");

  // The slab S (compile-time) of a tensor whose mode 1 is the warpgroup's MMA_M mode, with that
  // mode kept as size 1 so cute::gemm still sees (V, M) x (V, N) => (V, M, N) with M = 1.
  template <int S, class T>
  CUTLASS_DEVICE static auto slab(T&& t) {
    using namespace cute;
    using L = typename remove_cvref_t<T>::layout_type;
    static_assert(L::rank == 3 || L::rank == 4, "(V, M, N) or (V, M, K, PIPE)");
    if constexpr (L::rank == 3) {
      auto vn = t(_, Int<S>{}, _);  // (V, N)
      return make_tensor(vn.data(), make_layout(layout<0>(vn), Layout<_1, _0>{}, layout<1>(vn)));
    } else {
      auto vkp = t(_, Int<S>{}, _, _);  // (V, K, PIPE)
      return make_tensor(vkp.data(),
                         make_layout(layout<0>(vkp), Layout<_1, _0>{}, layout<1>(vkp), layout<2>(vkp)));
    }
  }

  // Consumer side; contract in the header comment.
  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum,
                          int k_tile_count, int thread_idx, TensorStorage& shared_tensors, Params const&) {
    using namespace cute;
    static_assert(is_rmem<FrgTensorC>::value, "accumulators must live in registers");

    TiledMma tiled_mma;
    auto operands = Parts::operand_fragments(tiled_mma, thread_idx, shared_tensors);
    Tensor tCrA = get<0>(operands);  // (MMA, MMA_M = slabs, MMA_K, PIPE)
    Tensor tCrB = get<1>(operands);  // (MMA, MMA_N = 1, MMA_K, PIPE)
    static_assert(decltype(size<1>(tCrA))::value == kSlabs && decltype(size<1>(tCrB))::value == 1);
    static_assert(decltype(size<1>(accum))::value == kSlabs && decltype(size<2>(accum))::value == 1,
                  "accumulators (MMA, slabs, 1)");
    static_assert(decltype(size(accum))::value == Parts::kAccPerThread);

    Tensor tCsScale = Parts::partition_scales(shared_tensors, thread_idx);  // (MMA, MMA_M = slabs, MMA_N, PIPE)
    CUTE_STATIC_ASSERT_V(shape(tCsScale(_, _, _, 0)) == shape(accum));

    Tensor tmp = make_fragment_like(slab<0>(accum));  // (MMA, 1, 1): one slab
    static_assert(decltype(size(tmp))::value == kSlabPerThread);
    // Stride 0 along N kept: 2 registers per slab.
    Tensor scale = make_tensor_like<Scale>(tCsScale(_, _, _, 0));
    static_assert(decltype(size(filter_zeros(scale)))::value == 2 * kSlabs,
                  "two rows per thread per m64 slab");

    clear(accum);  // the first promotion then adds to +0, as in the 128x128 rows
    if (k_tile_count <= 0) return;

    auto barrier_token = pipeline.consumer_try_wait(smem_pipe_read);
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count > 0; --k_tile_count) {
      pipeline.consumer_wait(smem_pipe_read, barrier_token);
      const int stage = smem_pipe_read.index();
      // All of the stage's scales before any of its wgmma (see the release contract above).
      Parts::load_scales(scale, tCsScale, shared_tensors, stage);
      for_each(make_seq<kSlabs>{}, [&](auto s) {
        constexpr int S = decltype(s)::value;
        Parts::issue_k_block(tiled_mma, slab<S>(tCrA), tCrB, tmp, stage);
        warpgroup_wait<0>();
        if constexpr (S == kSlabs - 1) {
          // The stage's last wgmma has completed: hand it back, and test the next stage now so the
          // barrier's latency hides behind the promotion (skipped past the last block).
          pipeline.consumer_release(smem_pipe_read);
          ++smem_pipe_read;
          barrier_token = pipeline.consumer_try_wait(smem_pipe_read, k_tile_count == 1);
        }
        Parts::promote(slab<S>(accum), tmp, slab<S>(scale));
      });
    }
    warpgroup_fence_operand(accum);
  }

  // mma() released every stage of the tile.
  CUTLASS_DEVICE void mma_tail(MainloopPipeline, PipelineState, int) {}
};

}  // namespace blockfp8::gemm::sm90
