// SM90 (sm_90a) W8A8 block-FP8 GEMM that quantizes its own activations: the full linear in one launch.
//
// Math: q[m, k] = e4m3(x[m, k] / s[m, kb]), s[m, kb] = max(amax over the 128 values of group kb, 1e-10) / 448,
// bit for bit what the standalone quantizer writes (quant/token_group.cuh), then D = the GEMM of sm90_kernel.cuh
// on (q, s). x bf16/fp16 [m, k] (the output's type), rows 16-byte aligned; q fp8 [m, k] and s fp32 M-major
// (s[kb * s_ld + m]) are written to the caller's buffers, which the GEMM's TMA and scale copies then read.
//
// Why: a separate quantizer pass reads x once and writes q, a memory-bound launch that costs 2-24% of a
// compute-bound prefill GEMM's time (500 / N of it at the FP8 rate, gemm/NOTES.md). Here two otherwise idle warps
// of the producer warpgroup (CUTLASS's cooperative kernel leaves warps 1 and 2 without work when the epilogue
// reads no C) quantize while the consumers compute, so that traffic overlaps the tensor-core work.
//
// Schedule. The unit of work is 8 rows x one 128-wide K block of one 128-row M block (2 KiB of x). Each quant
// warp walks its CTA's own tile list (the persistent scheduler's order) and, for each tile's M block, claims that
// block's units in K order from a per-M-block counter (atomicAdd) until none are left, then moves on to its next
// tile's M block. Every CTA working on an M block therefore helps quantize it, the blocks the current wave needs
// come first, and no unit is quantized twice. A unit's x rows go into shared memory by cp.async (a ring of
// kQuantRing units per warp, so up to that many are in flight without holding registers), then each 16-lane half
// warp turns one row's group into 8 bytes per lane and one scale. When a unit is written, its warp releases it
// (fences, then one atomicAdd on done[mb][kb] and one on the M block's total).
// The TMA producer warp and the scale-copy warp wait, before each K block of a tile, until done[mb][kb] counts all
// of that block's units (ld.volatile of 8 counters at once, then an acquire fence and a generic-to-async proxy
// fence before the TMA reads q). Once an M block's total is complete the tile's K loop runs without polling.
// Progress: a producer waits only for units that are claimed (their warp finishes them without waiting on
// anything) or unclaimed (the waiting CTA's own quant warps reach that M block, since they walk the same tiles and
// never wait), so the kernel cannot deadlock.
//
// s_ld % 32 == 0 and s 128-byte aligned: each 128-byte line of s then holds scales of one (M block, K block) pair
// only, so the scale-copy warp (cp.async through L1) never caches a line of s before all of it is written.
// Counters (claims, totals, done) live in the caller's workspace and must be zero at launch: the launcher
// clears them on the stream before each launch (a memset node in a CUDA graph).
//
// Supported: unswapped cooperative rows on the persistent (data-parallel) scheduler, C-less epilogue (the
// kernel asserts both). Unsupported: swap-AB, stream-K, K slices, fp32 output.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cute/tensor.hpp"
#include "cutlass/arch/grid_dependency_control.h"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

#include "../common/convert.cuh"
#include "../quant/token_group.cuh"

namespace blockfp8::gemm::sm90 {

constexpr int kQuantRows = 8;                                         // rows of x per unit
constexpr int kQuantUnitBytes = kQuantRows * quant::kGroup * 2;       // 16-bit x: 2 KiB
constexpr int kQuantRing = 3;                                         // units in flight per quant warp
constexpr int kQuantWarps = 2;                                        // producer warps 1 and 2
constexpr int kQuantMBlock = 128;                                     // the cooperative rows' tile M
constexpr int kDonePoll = 8;                                          // done counters read per poll

// Diagnosis bits (BLOCKFP8_FQ_PROBE, read per launch): what each part of the scheme costs.
constexpr int kProbeNoReaderProxyFence = 1;
constexpr int kProbeNoWriterProxyFence = 2;
constexpr int kProbeNoGate = 4;              // results not guaranteed
constexpr int kProbeNoQuant = 8;             // no gate either; results not guaranteed
constexpr int kProbeAcqRelFences = 16;       // fence.acq_rel.gpu in place of __threadfence (fence.sc)

// Device view of the fused quantizer's operands and counters (kernel parameter).
struct FusedQuantArgs {
  const void* x = nullptr;
  int64_t x_stride = 0;  // elements
  uint8_t* q = nullptr;  // fp8 [m, k_blocks * 128]
  float* s = nullptr;    // s[kb * s_ld + row]
  int64_t s_ld = 0;
  int32_t m = 0, k_blocks = 0, m_blocks = 0;
  uint32_t* counters = nullptr;  // fused_counter_words(m_blocks, k_blocks) words, zero at launch
  int32_t probe = 0;             // diagnosis bits (kProbe*), 0 in the product

  CUTLASS_HOST_DEVICE static int32_t done_row(int32_t k_blocks) { return (k_blocks + kDonePoll - 1) / kDonePoll * kDonePoll; }
  CUTLASS_HOST_DEVICE static int32_t done_offset(int32_t m_blocks) { return (2 * m_blocks + kDonePoll - 1) / kDonePoll * kDonePoll; }
  CUTLASS_DEVICE uint32_t* claims() const { return counters; }
  CUTLASS_DEVICE uint32_t* totals() const { return counters + m_blocks; }
  CUTLASS_DEVICE uint32_t* done(int32_t mb) const { return counters + done_offset(m_blocks) + mb * done_row(k_blocks); }
  // Units of one K block of M block mb (its rows / kQuantRows, rounded up).
  CUTLASS_DEVICE int32_t slices(int32_t mb) const {
    const int32_t rows = min(kQuantMBlock, m - mb * kQuantMBlock);
    return (rows + kQuantRows - 1) / kQuantRows;
  }
};

inline int64_t fused_counter_words(int64_t m_blocks, int64_t k_blocks) {
  return FusedQuantArgs::done_offset(int32_t(m_blocks)) + m_blocks * FusedQuantArgs::done_row(int32_t(k_blocks));
}

// A producer warp's wait for the quantized K blocks of an M block (all 32 lanes run it alike).
struct QuantGate {
  const FusedQuantArgs* args;
  int32_t mb = -1;
  int32_t ready = 0;  // K blocks [0, ready) of mb are quantized and visible

  CUTLASS_DEVICE static uint4 load_volatile(const uint32_t* p) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
  }
  CUTLASS_DEVICE static uint32_t load_volatile1(const uint32_t* p) {
    uint32_t v;
    asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
  }
  // What another warp released is visible to this thread's later loads, TMA (async proxy) included.
  CUTLASS_DEVICE void acquire() const {
    if (args->probe & kProbeAcqRelFences) {
      asm volatile("fence.acq_rel.gpu;" ::: "memory");
    } else {
      __threadfence();
    }
    if (!(args->probe & kProbeNoReaderProxyFence)) asm volatile("fence.proxy.async.global;" ::: "memory");
  }

  CUTLASS_DEVICE void wait(int32_t m_block, int32_t k_block) {
    const FusedQuantArgs& a = *args;
    if (a.probe & (kProbeNoGate | kProbeNoQuant)) return;
    if (m_block != mb) {
      mb = m_block;
      ready = 0;
      if (mb >= a.m_blocks) {  // a padding tile of a partial cluster: its loads are out of bounds
        ready = a.k_blocks;
        return;
      }
      if (load_volatile1(a.totals() + mb) == uint32_t(a.slices(mb) * a.k_blocks)) {
        ready = a.k_blocks;
        acquire();
        return;
      }
    }
    if (k_block < ready) return;
    const uint32_t need = uint32_t(a.slices(mb));
    const uint32_t* done = a.done(mb);
    while (k_block >= ready) {
      const int32_t base = ready / kDonePoll * kDonePoll;
      const uint4 lo = load_volatile(done + base), hi = load_volatile(done + base + 4);
      const uint32_t complete = uint32_t(lo.x >= need) | uint32_t(lo.y >= need) << 1 | uint32_t(lo.z >= need) << 2 |
                                uint32_t(lo.w >= need) << 3 | uint32_t(hi.x >= need) << 4 |
                                uint32_t(hi.y >= need) << 5 | uint32_t(hi.z >= need) << 6 | uint32_t(hi.w >= need) << 7;
      // Leading complete blocks from `ready` on (bit 8 stops the count at the end of the poll).
      const uint32_t pending = ~(complete >> (ready - base)) | (1u << (kDonePoll - (ready - base)));
      const int32_t advance = __ffs(pending) - 1;
      if (advance > 0) {
        ready = min(ready + advance, a.k_blocks);
        acquire();
      } else {
        __nanosleep(64);
      }
    }
  }
};

// The collective with K-block-gated loads: the base's load / load_auxiliary one K block at a time, each after
// the gate lets that block through.
template <class Base>
struct GatedLoadMainloop : Base {
  using typename Base::MainloopPipeline;
  using typename Base::Params;
  using typename Base::PipelineState;
  using typename Base::TensorStorage;

  template <class LoadInputs, class BlockCoord, class KTileIterator>
  CUTLASS_DEVICE void load_gated(QuantGate& gate, int32_t m_block, int32_t k_block, Params const& params,
                                 MainloopPipeline pipeline, PipelineState state, LoadInputs const& inputs,
                                 BlockCoord const& blk, KTileIterator k_iter, int k_tile_count, int lane,
                                 uint32_t rank, TensorStorage& storage) {
    for (; k_tile_count > 0; --k_tile_count, ++k_block, ++k_iter, ++state) {
      gate.wait(m_block, k_block);
      Base::load(params, pipeline, state, inputs, blk, k_iter, 1, lane, rank, storage);
    }
  }

  template <class LoadInputs, class BlockCoord, class KTileIterator>
  CUTLASS_DEVICE void load_auxiliary_gated(QuantGate& gate, int32_t m_block, int32_t k_block, Params const& params,
                                           MainloopPipeline pipeline, PipelineState state, LoadInputs const& inputs,
                                           BlockCoord const& blk, KTileIterator k_iter, int k_tile_count, int lane,
                                           uint32_t rank, TensorStorage& storage) {
    for (; k_tile_count > 0; --k_tile_count, ++k_block, ++k_iter, ++state) {
      gate.wait(m_block, k_block);
      Base::load_auxiliary(params, pipeline, state, inputs, blk, k_iter, 1, lane, rank, storage);
    }
  }
};

// One quant warp's claims: the next unclaimed unit of the M blocks of this CTA's tiles, in tile order.
template <class Scheduler, class WorkTile, class ClusterShape>
struct UnitSource {
  const FusedQuantArgs& args;
  Scheduler scheduler;
  WorkTile work;
  int32_t mb = -1;  // M block being claimed from; -1 before the first tile
  int32_t units = 0;

  CUTLASS_DEVICE UnitSource(const FusedQuantArgs& a, Scheduler s) : args(a), scheduler(s) {
    work = scheduler.initial_work_tile_info(ClusterShape{});
  }

  // Claims kQuantRing consecutive units at a time, in two halves so that the atomic's round trip overlaps other
  // work: start_claim() sends it (lane 0), finish_claim() reads it and returns (mb, first unit, count), count = 0
  // when this CTA's tiles have no units left. Warp-uniform.
  CUTLASS_DEVICE uint32_t start_claim(int lane) const {
    uint32_t ticket = 0;
    if (mb >= 0 && lane == 0) ticket = atomicAdd(args.claims() + mb, uint32_t(kQuantRing));
    return ticket;
  }
  CUTLASS_DEVICE int3 finish_claim(uint32_t ticket, int lane) {
    while (true) {
      if (mb >= 0) {
        const int32_t u = int32_t(__shfl_sync(0xffffffffu, ticket, 0));
        if (u < units) return make_int3(mb, u, min(kQuantRing, units - u));
      }
      // This M block is fully claimed: the next tile whose M block differs.
      while (work.is_valid() && (int32_t(work.M_idx) == mb || int32_t(work.M_idx) >= args.m_blocks))
        work = cute::get<0>(scheduler.fetch_next_work(work));
      if (!work.is_valid()) {
        mb = -1;
        return make_int3(-1, 0, 0);
      }
      mb = int32_t(work.M_idx);
      units = args.slices(mb) * args.k_blocks;
      ticket = start_claim(lane);
    }
  }
};

template <class T>
struct QuantWarp {
  const FusedQuantArgs& a;
  uint32_t smem;  // this warp's ring, shared-space address
  int lane;

  CUTLASS_DEVICE uint32_t slot_addr(int slot) const { return smem + uint32_t(slot * kQuantUnitBytes); }

  // Unit u of M block mb: K block u / slices, rows slice * 8 .. + 8 of the M block (K-major order, so the K blocks
  // the GEMM reads first are quantized first). Lane l copies 16 bytes of rows 2p + l / 16, p < 4.
  CUTLASS_DEVICE void issue(int2 unit, int slot) const {
    const int32_t slices = a.slices(unit.x);
    const int32_t kb = unit.y / slices, row0 = unit.x * kQuantMBlock + (unit.y % slices) * kQuantRows;
    const T* x = static_cast<const T*>(a.x);
#pragma unroll
    for (int p = 0; p < kQuantRows / 2; ++p) {
      const int32_t row = row0 + 2 * p + lane / 16;
      if (row < a.m) {
        const T* src = x + int64_t(row) * a.x_stride + kb * quant::kGroup + (lane % 16) * 8;
        const uint32_t dst = slot_addr(slot) + uint32_t((p * 32 + lane) * 16);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
      }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  }

  // Quantizes the unit in `slot` (its copies complete).
  CUTLASS_DEVICE void convert(int2 unit, int slot) const {
    const int32_t slices = a.slices(unit.x);
    const int32_t kb = unit.y / slices, row0 = unit.x * kQuantMBlock + (unit.y % slices) * kQuantRows;
    const int64_t k = int64_t(a.k_blocks) * quant::kGroup;
#pragma unroll 1
    for (int p = 0; p < kQuantRows / 2; ++p) {
      const int32_t row = row0 + 2 * p + lane / 16;
      const bool active = row < a.m;  // rows past M still take part in the shuffles
      float v[8];
      if (active) {
        uint4 raw;
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(raw.x), "=r"(raw.y), "=r"(raw.z), "=r"(raw.w)
                     : "r"(slot_addr(slot) + uint32_t((p * 32 + lane) * 16)));
        const T* h = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = to_float(h[i]);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = 0.0f;
      }
      const float scale = quant::group_scale(quant::group_amax(v));
      if (active) {
        *reinterpret_cast<uint2*>(a.q + int64_t(row) * k + kb * quant::kGroup + (lane % 16) * 8) = quant::quantize8(v, scale);
        if (lane % 16 == 0) a.s[int64_t(kb) * a.s_ld + row] = scale;
      }
    }
  }

  // Releases a converted batch: this lane's writes, then (after the warp's) the counters other CTAs poll. One
  // fence per batch: it waits for the batch's stores, and a fence per unit serialized the warp (E26, call 3: the
  // quant warps then moved ~0.1 TB/s over the GPU).
  CUTLASS_DEVICE void publish(int3 batch) const {
    if (!(a.probe & kProbeNoWriterProxyFence)) asm volatile("fence.proxy.async.global;" ::: "memory");
    __syncwarp();
    if (lane == 0) {
      if (a.probe & kProbeAcqRelFences) {
        asm volatile("fence.acq_rel.gpu;" ::: "memory");
      } else {
        __threadfence();
      }
      const int32_t slices = a.slices(batch.x);
      for (int i = 0; i < batch.z; ++i) atomicAdd(a.done(batch.x) + (batch.y + i) / slices, 1u);
      atomicAdd(a.totals() + batch.x, uint32_t(batch.z));
    }
  }

  // Claims and quantizes batches of up to kQuantRing units until this CTA's tiles have none left: all of a batch's
  // copies in flight at once (one ring slot each), then its conversions, then one release; the next batch's claim
  // travels meanwhile.
  template <class Source>
  CUTLASS_DEVICE void run(Source& source) const {
    int3 batch = source.finish_claim(source.start_claim(lane), lane);
    while (batch.z > 0) {
#pragma unroll 1
      for (int i = 0; i < batch.z; ++i) issue(make_int2(batch.x, batch.y + i), i);
      const uint32_t ticket = source.start_claim(lane);
      asm volatile("cp.async.wait_all;" ::: "memory");
#pragma unroll 1
      for (int i = 0; i < batch.z; ++i) convert(make_int2(batch.x, batch.y + i), i);
      publish(batch);
      batch = source.finish_claim(ticket, lane);
    }
  }
};

// The cooperative persistent kernel with the quantizer in producer warps 1 and 2 (header comment). Everything but
// operator() and the quantizer's parameters is the CUTLASS kernel's; operator() runs the same roles in the same
// order, with the producer's loads gated and without the epilogue's C-load warp (the epilogue reads no C).
template <class Base, class XType>
struct FusedQuantKernel : Base {
  using typename Base::ClusterShape;
  using typename Base::CollectiveEpilogue;
  using typename Base::CollectiveMainloop;
  using typename Base::SharedStorage;
  using typename Base::TiledMma;
  using typename Base::TileScheduler;
  using typename Base::TileShape;
  using Base::LoadRegisterRequirement;
  using Base::MmaRegisterRequirement;
  using Base::NumMMAThreads;
  using Base::NumProducerThreads;

  static_assert(std::is_same_v<typename CollectiveEpilogue::ElementC, void>, "the epilogue must read no C");
  static_assert(!TileScheduler::IsDynamicPersistent, "the static persistent scheduler only");
  static_assert(cute::size<0>(TileShape{}) == kQuantMBlock, "M blocks of the quantizer are the tile's M");

  static constexpr int kQuantSmemOffset = (Base::SharedStorageSize + 127) / 128 * 128;
  static constexpr int SharedStorageSize = kQuantSmemOffset + kQuantWarps * kQuantRing * kQuantUnitBytes;
  static_assert(SharedStorageSize <= 232448, "the quantizer's ring must fit the SM90 shared memory beside the stages");

  struct Arguments : Base::Arguments {
    FusedQuantArgs quant;
  };
  struct Params : Base::Params {
    FusedQuantArgs quant;
  };

  static Params to_underlying_arguments(Arguments const& args, void* workspace) {
    Params params;
    static_cast<typename Base::Params&>(params) = Base::to_underlying_arguments(args, workspace);
    params.quant = args.quant;
    return params;
  }

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
    const int warp_group = cutlass::canonical_warp_group_idx();
    const int mma_thread_idx = thread_idx % NumMMAThreads;
    const bool producer_group = warp_group == 0;
    const bool tma_warp = producer_group && warp_in_group == 0;
    const bool scale_warp = producer_group && warp_in_group == 3;
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

    // The epilogue's load pipeline carries no data (no C), but its store path takes one.
    typename EpiLoadPipeline::Params epi_load_pipeline_params;
    if (producer_group && warp_in_group == 2) epi_load_pipeline_params.role = EpiLoadPipeline::ThreadCategory::Producer;
    if (!producer_group) epi_load_pipeline_params.role = EpiLoadPipeline::ThreadCategory::Consumer;
    epi_load_pipeline_params.dst_blockid = cute::block_rank_in_cluster();
    epi_load_pipeline_params.producer_arv_count = cutlass::NumThreadsPerWarp;
    epi_load_pipeline_params.consumer_arv_count = NumMMAThreads;
    if constexpr (CollectiveEpilogue::RequiresTransactionBytes) {
      epi_load_pipeline_params.transaction_bytes = params.epilogue.tma_transaction_bytes;
    }
    EpiLoadPipeline epi_load_pipeline(shared_storage.pipelines.epi_load, epi_load_pipeline_params);

    typename EpiStorePipeline::Params epi_store_pipeline_params;
    epi_store_pipeline_params.always_wait = true;
    EpiStorePipeline epi_store_pipeline(epi_store_pipeline_params);

    typename CollectiveMainloop::PipelineState mainloop_pipe_consumer_state;
    typename CollectiveEpilogue::LoadPipelineState epi_load_pipe_consumer_state;
    PipelineState mainloop_pipe_producer_state = cutlass::make_producer_start_state<MainloopPipeline>();
    auto epi_store_pipe_producer_state = cutlass::make_producer_start_state<EpiStorePipeline>();

    // Barrier initialization must be visible cluster-wide (CTA-wide without a cluster) before any use.
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
        cutlass::arch::wait_on_dependent_grids();
        QuantGate gate{&params.quant};
        while (work_tile_info.is_valid()) {
          auto m_coord = idx2crd(work_tile_info.M_idx, shape<2>(gA_mkl));
          auto n_coord = idx2crd(work_tile_info.N_idx, shape<2>(gB_nkl));
          auto l_coord = idx2crd(work_tile_info.L_idx, shape<4>(gB_nkl));
          auto blk_coord = make_coord(m_coord, n_coord, _, l_coord);
          const int k_tile_count = TileScheduler::get_work_k_tile_count(work_tile_info, problem_shape_MNKL, blk_shape);
          const int k_tile_start = TileScheduler::get_work_k_tile_start(work_tile_info);
          auto k_tile_iter = cute::make_coord_iterator(idx2crd(k_tile_start, shape<3>(gA_mkl)), shape<3>(gA_mkl));
          if (tma_warp) {
            collective_mainloop.load_gated(gate, int32_t(work_tile_info.M_idx), k_tile_start, params.mainloop,
                                           mainloop_pipeline, mainloop_pipe_producer_state, load_inputs, blk_coord,
                                           k_tile_iter, k_tile_count, lane_idx, block_rank_in_cluster,
                                           shared_storage.tensors.mainloop);
          } else {
            collective_mainloop.load_auxiliary_gated(gate, int32_t(work_tile_info.M_idx), k_tile_start,
                                                     params.mainloop, mainloop_pipeline, mainloop_pipe_producer_state,
                                                     load_inputs, blk_coord, k_tile_iter, k_tile_count, lane_idx,
                                                     block_rank_in_cluster, shared_storage.tensors.mainloop);
          }
          mainloop_pipe_producer_state.advance(k_tile_count);
          work_tile_info = get<0>(scheduler.fetch_next_work(work_tile_info));
        }
        // The TMA warp waits for the consumers to release every stage before the CTA may leave its cluster.
        if (tma_warp) collective_mainloop.load_tail(mainloop_pipeline, mainloop_pipe_producer_state);
      } else {
        // Quant warps 1 and 2: x is the previous kernel's output.
        cutlass::arch::wait_on_dependent_grids();
        const int quant_warp = warp_in_group - 1;
        const uint32_t ring = static_cast<uint32_t>(__cvta_generic_to_shared(smem_buf + kQuantSmemOffset)) +
                              uint32_t(quant_warp * kQuantRing * kQuantUnitBytes);
        if (!(params.quant.probe & kProbeNoQuant)) {
          UnitSource<TileScheduler, decltype(work_tile_info), ClusterShape> source(params.quant, scheduler);
          QuantWarp<XType>{params.quant, ring, lane_idx}.run(source);
        }
      }
    } else {
      auto work_tile_info = scheduler.initial_work_tile_info(ClusterShape{});
      cutlass::arch::warpgroup_reg_alloc<MmaRegisterRequirement>();
      CollectiveEpilogue collective_epilogue(params.epilogue, shared_storage.tensors.epilogue);
      bool do_store_tail = false;
      while (work_tile_info.is_valid()) {
        auto m_coord = idx2crd(work_tile_info.M_idx, shape<2>(gA_mkl));
        auto n_coord = idx2crd(work_tile_info.N_idx, shape<2>(gB_nkl));
        auto l_coord = idx2crd(work_tile_info.L_idx, shape<4>(gB_nkl));
        auto blk_coord = make_coord(m_coord, n_coord, _, l_coord);
        const int k_tile_count = TileScheduler::get_work_k_tile_count(work_tile_info, problem_shape_MNKL, blk_shape);
        auto accumulators = partition_fragment_C(tiled_mma, take<0, 2>(blk_shape));
        collective_mainloop.mma(mainloop_pipeline, mainloop_pipe_consumer_state, accumulators, k_tile_count,
                                mma_thread_idx, shared_storage.tensors.mainloop, params.mainloop);
        collective_mainloop.mma_tail(mainloop_pipeline, mainloop_pipe_consumer_state, k_tile_count);
        mainloop_pipe_consumer_state.advance(k_tile_count);
        auto [epi_load_next, epi_store_next] = collective_epilogue.store(
            epi_load_pipeline, epi_load_pipe_consumer_state, epi_store_pipeline, epi_store_pipe_producer_state,
            problem_shape_MNKL, blk_shape, blk_coord, accumulators, tiled_mma, mma_thread_idx,
            shared_storage.tensors.epilogue, work_tile_info.reduction_subtile_idx());
        epi_load_pipe_consumer_state = epi_load_next;
        epi_store_pipe_producer_state = epi_store_next;
        do_store_tail = true;
        work_tile_info = get<0>(scheduler.fetch_next_work(work_tile_info));
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
