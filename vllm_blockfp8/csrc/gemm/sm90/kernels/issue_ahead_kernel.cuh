// SM90 (sm_90a) block-FP8: CUTLASS's cooperative persistent kernel with the next tile's first K block issued
// before the current tile's epilogue, so that the tensor cores have work while the math warpgroups convert
// and store (the tile change; gemm/NOTES.md twenty-seventh session, E27).
//
// Math, layouts, producer warps, pipelines, shared storage, tile scheduler and epilogue are those of the
// kernel cutlass_gemm.cuh builds (CUTLASS's KernelTmaWarpSpecializedCooperativeFP8BlockScaledAccum with our
// overlap consumer loop, overlap_mainloop.cuh); only the math warpgroups' order differs. Per tile t:
//   mma_after_first_block   accum cleared, blocks 1.. of t issued and every block promoted into accum
//   issue_first_block       block 0 of the warpgroup's next tile t' into the temporary fragment tmp0 (async)
//   epilogue                accum of t converted and stored while block 0 of t' runs on the tensor cores
// The first tile's block 0 is issued before the loop. Per tile the wgmma, scale products and FFMAs are
// mma()'s, in its order: the results are the same bits. accum and tmp0 (64 + 64 fp32 a thread at the 128x128
// tile) are live through the epilogue, fewer than the loop's three fragments.
// The producer side (TMA warp, scale-copy warp; PDL wait in each) does what CUTLASS's does; the epilogue's load
// warp has nothing to do (no C) and is left idle, as CUTLASS leaves it.
//
// Supported: the persistent data-parallel scheduler and an epilogue that reads no C (static_assert here), our
// overlap consumer loop (Config's static_assert; the halves exist only on it), at least one K block per tile
// (plan.cpp rejects k < 128). Unsupported: stream-K and split-K (a unit's k_tile_count and fixup), the dynamic
// persistent scheduler, ping-pong.
#pragma once

#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/arch/grid_dependency_control.h"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/sm90_tile_scheduler.hpp"

namespace blockfp8::gemm::sm90 {

template <class Base>
struct IssueAheadKernel : Base {
  using typename Base::ClusterShape;
  using typename Base::CollectiveEpilogue;
  using typename Base::CollectiveMainloop;
  using typename Base::Params;
  using typename Base::SharedStorage;
  using typename Base::TiledMma;
  using typename Base::TileScheduler;
  using typename Base::TileShape;
  using Base::LoadRegisterRequirement;
  using Base::MmaRegisterRequirement;
  using Base::NumMMAThreads;
  using Base::NumProducerThreads;

  static_assert(std::is_same_v<TileScheduler, cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90>,
                "the persistent data-parallel scheduler only");
  static_assert(std::is_same_v<typename CollectiveEpilogue::ElementC, void>, "the epilogue must read no C");
  static_assert(NumMMAThreads == 256, "two math warpgroups on one tile (cooperative)");

  CUTLASS_DEVICE void operator()(Params const& params, char* smem_buf) {
    using namespace cute;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using MainloopPipeline = typename CollectiveMainloop::MainloopPipeline;
    using PipelineState = typename CollectiveMainloop::PipelineState;
    using EpiLoadPipeline = typename CollectiveEpilogue::LoadPipeline;
    using EpiStorePipeline = typename CollectiveEpilogue::StorePipeline;

    SharedStorage& shared_storage = *reinterpret_cast<SharedStorage*>(smem_buf);
    const int thread_idx = int(threadIdx.x);
    const int lane_idx = cutlass::canonical_lane_idx();
    const int warp_idx = cutlass::canonical_warp_idx_sync();
    const int warp_in_group = warp_idx % cutlass::NumWarpsPerWarpGroup;
    const int mma_thread_idx = thread_idx % NumMMAThreads;
    const bool producer_group = cutlass::canonical_warp_group_idx() == 0;
    const bool tma_warp = producer_group && warp_in_group == 0;
    const bool scale_warp = producer_group && warp_in_group == 3;  // CUTLASS's MainloopAux warp
    const uint32_t block_rank_in_cluster = cute::block_rank_in_cluster();

    if (warp_idx == 0 && cute::elect_one_sync()) {
      CollectiveMainloop::prefetch_tma_descriptors(params.mainloop);
      CollectiveEpilogue::prefetch_tma_descriptors(params.epilogue);
    }

    typename MainloopPipeline::Params mainloop_pipeline_params;
    if (tma_warp || scale_warp) mainloop_pipeline_params.role = MainloopPipeline::ThreadCategory::Producer;
    if (!producer_group) mainloop_pipeline_params.role = MainloopPipeline::ThreadCategory::Consumer;
    mainloop_pipeline_params.is_leader = thread_idx % cutlass::NumThreadsPerWarpGroup == 0;
    mainloop_pipeline_params.num_consumers = NumMMAThreads;
    mainloop_pipeline_params.num_producers = NumProducerThreads;
    mainloop_pipeline_params.transaction_bytes = params.mainloop.tma_transaction_bytes;
    MainloopPipeline mainloop_pipeline(shared_storage.pipelines.mainloop, mainloop_pipeline_params, ClusterShape{});

    // The epilogue's load pipeline is initialized as CUTLASS does (its barriers live in shared storage) but
    // carries nothing: with no C the store never waits on it.
    typename EpiLoadPipeline::Params epi_load_pipeline_params;
    if (producer_group && warp_in_group == 2) epi_load_pipeline_params.role = EpiLoadPipeline::ThreadCategory::Producer;
    if (!producer_group) epi_load_pipeline_params.role = EpiLoadPipeline::ThreadCategory::Consumer;
    epi_load_pipeline_params.dst_blockid = block_rank_in_cluster;
    epi_load_pipeline_params.producer_arv_count = cutlass::NumThreadsPerWarp;
    epi_load_pipeline_params.consumer_arv_count = NumMMAThreads;
    if constexpr (CollectiveEpilogue::RequiresTransactionBytes) {
      epi_load_pipeline_params.transaction_bytes = params.epilogue.tma_transaction_bytes;
    }
    EpiLoadPipeline epi_load_pipeline(shared_storage.pipelines.epi_load, epi_load_pipeline_params);

    typename EpiStorePipeline::Params epi_store_pipeline_params;
    epi_store_pipeline_params.always_wait = true;
    EpiStorePipeline epi_store_pipeline(epi_store_pipeline_params);

    PipelineState mainloop_pipe_consumer_state;
    typename CollectiveEpilogue::LoadPipelineState epi_load_pipe_consumer_state;
    PipelineState mainloop_pipe_producer_state = cutlass::make_producer_start_state<MainloopPipeline>();
    auto epi_store_pipe_producer_state = cutlass::make_producer_start_state<EpiStorePipeline>();

    constexpr bool kCluster = size(ClusterShape{}) > 1;
    if constexpr (kCluster) {
      cute::cluster_arrive_relaxed();
    } else {
      __syncthreads();
    }

    auto problem_shape_MNKL = append<4>(params.problem_shape, Int<1>{});
    TiledMma tiled_mma;
    auto blk_shape = TileShape{};
    TileScheduler scheduler{params.scheduler};
    CollectiveMainloop collective_mainloop;
    auto load_inputs = collective_mainloop.load_init(problem_shape_MNKL, params.mainloop);
    Tensor gA_mkl = get<0>(load_inputs);
    Tensor gB_nkl = get<1>(load_inputs);

    if constexpr (kCluster) cute::cluster_wait();

    if (producer_group) {
      auto work_tile_info = scheduler.initial_work_tile_info(ClusterShape{});
      cutlass::arch::warpgroup_reg_dealloc<LoadRegisterRequirement>();
      if (tma_warp || scale_warp) {
        // The scale-copy warp's wait is in PdlScaleCopies::load_auxiliary (cutlass_gemm.cuh).
        if (tma_warp) cutlass::arch::wait_on_dependent_grids();
        while (work_tile_info.is_valid()) {
          auto m_coord = idx2crd(work_tile_info.M_idx, shape<2>(gA_mkl));
          auto n_coord = idx2crd(work_tile_info.N_idx, shape<2>(gB_nkl));
          auto l_coord = idx2crd(work_tile_info.L_idx, shape<4>(gB_nkl));
          auto blk_coord = make_coord(m_coord, n_coord, _, l_coord);
          const int k_tile_count = TileScheduler::get_work_k_tile_count(work_tile_info, problem_shape_MNKL, blk_shape);
          const int k_tile_start = TileScheduler::get_work_k_tile_start(work_tile_info);
          auto k_tile_iter = cute::make_coord_iterator(idx2crd(k_tile_start, shape<3>(gA_mkl)), shape<3>(gA_mkl));
          if (tma_warp) {
            collective_mainloop.load(params.mainloop, mainloop_pipeline, mainloop_pipe_producer_state, load_inputs,
                                     blk_coord, k_tile_iter, k_tile_count, lane_idx, block_rank_in_cluster,
                                     shared_storage.tensors.mainloop);
          } else {
            collective_mainloop.load_auxiliary(params.mainloop, mainloop_pipeline, mainloop_pipe_producer_state,
                                               load_inputs, blk_coord, k_tile_iter, k_tile_count, lane_idx,
                                               block_rank_in_cluster, shared_storage.tensors.mainloop);
          }
          mainloop_pipe_producer_state.advance(k_tile_count);
          work_tile_info = get<0>(scheduler.fetch_next_work(work_tile_info));
        }
        if (tma_warp) collective_mainloop.load_tail(mainloop_pipeline, mainloop_pipe_producer_state);
      }
    } else {
      auto work_tile_info = scheduler.initial_work_tile_info(ClusterShape{});
      cutlass::arch::warpgroup_reg_alloc<MmaRegisterRequirement>();
      CollectiveEpilogue collective_epilogue(params.epilogue, shared_storage.tensors.epilogue);
      auto accum = partition_fragment_C(tiled_mma, take<0, 2>(blk_shape));
      auto tmp0 = make_fragment_like(accum);
      auto tmp1 = make_fragment_like(accum);
      auto scale0 = CollectiveMainloop::make_scale_fragment(accum, mma_thread_idx, shared_storage.tensors.mainloop);
      auto scale1 = CollectiveMainloop::make_scale_fragment(accum, mma_thread_idx, shared_storage.tensors.mainloop);

      // The loop body has one path per outcome of "is there a next tile?", each straight-line from the issue of
      // the next tile's first block to the back edge: ptxas then tracks the wgmma in flight through the epilogue
      // (an issue under a condition that joins the path without it made it serialize every wgmma, C7518).
      bool do_store_tail = false;
      if (work_tile_info.is_valid()) {
        collective_mainloop.issue_first_block(mainloop_pipeline, mainloop_pipe_consumer_state, tmp0, scale0,
                                              mma_thread_idx, shared_storage.tensors.mainloop);
        do_store_tail = true;
        auto store = [&](auto const& work) {
          auto m_coord = idx2crd(work.M_idx, shape<2>(gA_mkl));
          auto n_coord = idx2crd(work.N_idx, shape<2>(gB_nkl));
          auto l_coord = idx2crd(work.L_idx, shape<4>(gB_nkl));
          auto blk_coord = make_coord(m_coord, n_coord, _, l_coord);
          auto [epi_load_next, epi_store_next] = collective_epilogue.store(
              epi_load_pipeline, epi_load_pipe_consumer_state, epi_store_pipeline, epi_store_pipe_producer_state,
              problem_shape_MNKL, blk_shape, blk_coord, accum, tiled_mma, mma_thread_idx,
              shared_storage.tensors.epilogue, work.reduction_subtile_idx());
          epi_load_pipe_consumer_state = epi_load_next;
          epi_store_pipe_producer_state = epi_store_next;
        };
        while (true) {
          const int k_tile_count = TileScheduler::get_work_k_tile_count(work_tile_info, problem_shape_MNKL, blk_shape);
          collective_mainloop.mma_after_first_block(mainloop_pipeline, mainloop_pipe_consumer_state, accum, tmp0,
                                                    tmp1, scale0, scale1, k_tile_count, mma_thread_idx,
                                                    shared_storage.tensors.mainloop);
          mainloop_pipe_consumer_state.advance(k_tile_count);
          const auto next_work_tile_info = get<0>(scheduler.fetch_next_work(work_tile_info));
          if (!next_work_tile_info.is_valid()) {
            store(work_tile_info);
            break;
          }
          collective_mainloop.issue_first_block(mainloop_pipeline, mainloop_pipe_consumer_state, tmp0, scale0,
                                                mma_thread_idx, shared_storage.tensors.mainloop);
          store(work_tile_info);
          work_tile_info = next_work_tile_info;
        }
      }
      if (do_store_tail) {
        collective_epilogue.store_tail(epi_load_pipeline, epi_load_pipe_consumer_state, epi_store_pipeline,
                                       epi_store_pipe_producer_state);
      }
    }
#endif
  }
};

}  // namespace blockfp8::gemm::sm90
