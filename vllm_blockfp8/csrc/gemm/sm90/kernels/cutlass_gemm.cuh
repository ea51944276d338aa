// SM90 (sm_90a) W8A8 block-scaled FP8 GEMM from CUTLASS 3.x collectives.
//
// Math and layouts: see gemm.h. Kernel: TMA + wgmma warp-specialized cooperative mainloop with
// blockwise scaling (CUTLASS KernelTmaWarpSpecializedCooperativeFP8BlockScaledAccum): each
// 128-deep K block is accumulated by wgmma into a fresh fp32 fragment, then promoted into the
// fp32 accumulator as acc += partial * SFA * SFB in fp32, which confines the tensor cores' reduced
// FP8 accumulation precision to one 128-deep block (NOTES.md, Numerics). The epilogue converts once
// to bf16/fp16 and stores through TMA. Out-of-range rows/columns of ragged tiles are zero-filled by TMA loads and
// clipped by the TMA store; the weight-scale loader predicates the scale block past ceil(n / 128).
// Rows with Config::kConsumer == kOverlap keep this collective but run the consumer loop of
// overlap_mainloop.cuh (promotion of block k-1 under block k's wgmma; the same arithmetic),
// unswapped or swapped, under either scheduler. Rows with Config::kIssueAhead (persistent, unswapped in the table)
// run CUTLASS's kernel with the math warpgroups' order changed: each tile's first K block is issued before the
// previous tile's epilogue (issue_ahead_kernel.cuh; the same bits).
//
// Operand roles. Unswapped: kernel-A = activations (M = m), kernel-B = weights (N = n); scale
// granularity (1, 128, 128): SFA per token and M-major, SFB per 128x128 block and K-major.
// Swapped (small m): kernel-A = weights (M = n), kernel-B = activations (N = m), granularity
// (128, 1, 128), SFA K-major (weight blocks), SFB MN-major (per token), D^T stored column-major.
// Both layouts are the caller's buffers as they are: no scale repacking for any row.
//
// K slices (Config::kSliceK, swap rows; Plan::slices > 1): the same mainloop runs
// as a batched GEMM over s K slices (batch l = columns [l*k/s, (l+1)*k/s) of both operands and
// their scales, strided views, no copies) into s fp32 partial outputs in the workspace, and a
// second kernel sums them in slice order and converts: the split without CUTLASS's stream-K fixup.
//
// Stream-K and split-K (Schedule::kCooperativeStreamK rows): CUTLASS's stream-K scheduler in the decomposition the
// plan names (data-parallel, stream-K, or split-K into Plan::splits). The plan (../plan.cpp) also names the tile
// order (raster, swizzle) and the launch mode; this file only runs it.
//
// Programmatic dependent launch (Plan::pdl): the GEMM (and the K-slice sum after it) may launch while
// the previous kernel on the stream runs (where that one triggers it early, as the quantizer does); every
// CTA sets up, then waits (griddepcontrol.wait) before its first global read. Results are the same bit
// for bit; only the launch gap and the prologue move (gemm/NOTES.md twelfth session).
//
// Unsupported: k % 128 != 0, n % 8 != 0 (rejected by plan.cpp), bias, batched problems.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cutlass/arch/grid_dependency_control.h"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/dispatch_policy.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler_params.h"
#include "cutlass/numeric_types.h"

#include "issue_ahead_kernel.cuh"
#include "config.h"
#include "overlap_mainloop.cuh"

namespace blockfp8::gemm::sm90 {

// out[i] = sum over l < slices of partials[l * count + i] (in slice order), converted; four
// elements per thread (count % 4 == 0: plan.cpp's rejects() checks n % 8 == 0).
template <class Out>
__global__ void sum_k_slices(const float4* __restrict__ partials, int64_t count4, int slices, Out* __restrict__ out) {
  // Launched programmatically after the GEMM that writes the partials: wait for it to end (a no-op in
  // plain stream order).
  cutlass::arch::wait_on_dependent_grids();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count4; i += int64_t(gridDim.x) * blockDim.x) {
    float4 acc = partials[i];
    for (int l = 1; l < slices; ++l) {
      const float4 v = partials[l * count4 + i];
      acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
    }
    uint2 packed;
    if constexpr (std::is_same_v<Out, __nv_bfloat16>) {
      const __nv_bfloat162 lo = __floats2bfloat162_rn(acc.x, acc.y), hi = __floats2bfloat162_rn(acc.z, acc.w);
      packed.x = reinterpret_cast<const uint32_t&>(lo), packed.y = reinterpret_cast<const uint32_t&>(hi);
    } else {
      const __half2 lo = __floats2half2_rn(acc.x, acc.y), hi = __floats2half2_rn(acc.z, acc.w);
      packed.x = reinterpret_cast<const uint32_t&>(lo), packed.y = reinterpret_cast<const uint32_t&>(hi);
    }
    reinterpret_cast<uint2*>(out)[i] = packed;
  }
}

// Bytes of fp32 partial outputs for s slices, rounded so the kernel's own workspace after them
// stays aligned.
inline size_t slice_partials_bytes(const Problem& p, int slices) {
  return (size_t(slices) * size_t(p.m) * size_t(p.n) * sizeof(float) + 255) / 256 * 256;
}

// Programmatic dependent launch (Plan::pdl) on the warp that copies the scales with cp.async
// (load_auxiliary, once per tile): CUTLASS 4.2's cooperative kernel runs griddepcontrol.wait in its TMA
// producer warp but not in this one (the ping-pong kernel does), which could otherwise read scales before
// the previous kernel's writes are visible; so it waits before its first tile's copies, once: the
// previous grid has ended when the wait returns. (Measured: with the PDL launch off, this build and the
// one before any grid-dependency code took the same time at prefill M, gemm/NOTES.md twelfth session.)
// The kernel does not trigger its own dependents early: a GEMM after it launches as its CTAs exit
// (an early trigger, with the next GEMM's CTAs placed as ours left, ran 5% slower at two points).
template <class Base>
struct PdlScaleCopies : Base {
  bool waited_for_previous_grid = false;

  template <class... Args>
  CUTLASS_DEVICE void load_auxiliary(Args&&... args) {
    if (!waited_for_previous_grid) {
      cutlass::arch::wait_on_dependent_grids();
      waited_for_previous_grid = true;
    }
    Base::load_auxiliary(static_cast<Args&&>(args)...);
  }
};

// The collective the builder made, with its weight-scale layout type replaced (the builder asks for
// depth-2 scale layouts; the collective's loads index whatever layout it is given).
template <class Collective, class LayoutSFA>
struct WithLayoutSFA;
template <class Policy, class Tile, class EA, class PairA, class EB, class PairB, class... Rest, class LayoutSFA>
struct WithLayoutSFA<cutlass::gemm::collective::CollectiveMma<Policy, Tile, EA, PairA, EB, PairB, Rest...>, LayoutSFA> {
  using type = cutlass::gemm::collective::CollectiveMma<
      Policy, Tile, EA, cute::tuple<cute::tuple_element_t<0, PairA>, LayoutSFA>, EB, PairB, Rest...>;
};

// The epilogue the builder made, with kStoreStages subtile buffers in place of its min(subtiles, 2). The
// fusion callbacks keep the builder's type: they do not depend on the buffer count.
template <class Epilogue, int kStoreStages>
struct WithStoreStages;
template <int kLoadStages, int kBuiltStages, int kFragment, bool kReuseC, bool kDelayStore, class... Rest,
          int kStoreStages>
struct WithStoreStages<cutlass::epilogue::collective::CollectiveEpilogue<
                           cutlass::epilogue::Sm90TmaWarpSpecialized<kLoadStages, kBuiltStages, kFragment, kReuseC, kDelayStore>,
                           Rest...>,
                       kStoreStages> {
  using type = cutlass::epilogue::collective::CollectiveEpilogue<
      cutlass::epilogue::Sm90TmaWarpSpecialized<kLoadStages, kStoreStages, kFragment, kReuseC, kDelayStore>, Rest...>;
};

template <class Cfg, class ElementD>
struct Gemm {
  using ElementAB = cutlass::float_e4m3_t;
  using ElementAcc = float;
  static constexpr bool kSwap = Cfg::kSwapAB;

  using TileShape = cute::Shape<cute::Int<Cfg::kTileM>, cute::Int<Cfg::kTileN>, cute::Int<Cfg::kTileK>>;
  using ClusterShape = cute::Shape<cute::Int<Cfg::kClusterM>, cute::Int<Cfg::kClusterN>, cute::_1>;

  // Both operands are K-major in memory. Kernel-A is [M, K] row-major; kernel-B is [N, K] row-major,
  // which CUTLASS calls a column-major K x N matrix.
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;
  // D [m, n] row-major is the column-major [n, m] result of the swapped product.
  using LayoutD = std::conditional_t<kSwap, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  static constexpr int kAlignAB = 128 / cutlass::sizeof_bits<ElementAB>::value;
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<ElementD>::value;

  static constexpr int kScaleBlock = 128;
  // Weight rows per scale entry as the collective sees them: the checkpoint's 128, or 64 on the
  // 64-row weight tiles of the ping-pong rows (CUTLASS's collective wants whole scale blocks per
  // tile). Then row block r of 64 reads scale block r / 2 through a nested layout (below): no copy.
  static constexpr int kWeightScaleRows = kSwap ? std::min(Cfg::kTileM, kScaleBlock) : kScaleBlock;
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<
      kSwap ? kWeightScaleRows : 1, kSwap ? 1 : kScaleBlock, kScaleBlock,
      kSwap ? cute::GMMA::Major::K : cute::GMMA::Major::MN,
      kSwap ? cute::GMMA::Major::MN : cute::GMMA::Major::K>;
  using BuiltLayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

  // Weight block scales [nb, row_len] row-major: ((R, nb), (128, kb), batches) : ((0, row_len),
  // (0, 1), batch_stride) with R = 128 rows per scale; kb = row_len for one batch, row_len /
  // slices for K slices (batch_stride kb). With 64-row tiles the row mode is ((64, (2, nb))) :
  // ((0, (0, row_len))): a 64-row block index b decomposes as (b % 2, b / 2), so both halves of a
  // 128-row block read its one scale.
  static auto block_scale_layout(int32_t nb, int32_t kb, int32_t row_len, int32_t batches, int32_t batch_stride) {
    using namespace cute;
    if constexpr (kWeightScaleRows == kScaleBlock) {
      return make_layout(
          make_shape(make_shape(Int<kScaleBlock>{}, nb), make_shape(Int<kScaleBlock>{}, kb), batches),
          make_stride(make_stride(_0{}, row_len), make_stride(_0{}, _1{}), batch_stride));
    } else {
      static_assert(2 * kWeightScaleRows == kScaleBlock);
      return make_layout(make_shape(make_shape(Int<kWeightScaleRows>{}, make_shape(_2{}, nb)),
                                    make_shape(Int<kScaleBlock>{}, kb), batches),
                         make_stride(make_stride(_0{}, make_stride(_0{}, row_len)), make_stride(_0{}, _1{}), batch_stride));
    }
  }
  static constexpr bool kNestedSFA = kWeightScaleRows != kScaleBlock;
  using LayoutSFA = std::conditional_t<kNestedSFA, decltype(block_scale_layout(0, 0, 0, 0, 0)), BuiltLayoutSFA>;

  // Cooperative by default: one warpgroup's per-block promotion FMAs overlap the other's wgmma
  // (ping-pong 64x128 measured 30-60% slower at M >= 512 with CUTLASS's loop, 1.0-1.28x with ours
  // except at K = 512), and only it takes stream-K. Ping-pong where a row wants 64-row weight
  // tiles (more CTAs at small M).
  static constexpr bool kStreamK = Cfg::kSchedule == Schedule::kCooperativeStreamK;
  static constexpr bool kPingpong = Cfg::kSchedule == Schedule::kPingpong;
  using MainloopSchedule = std::conditional_t<kPingpong, cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8BlockScaledAccum,
                                              cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8BlockScaledAccum>;
  using EpilogueSchedule = std::conditional_t<kPingpong, cutlass::epilogue::TmaWarpSpecialized,
                                              cutlass::epilogue::TmaWarpSpecializedCooperative>;
  using Fusion = cutlass::epilogue::fusion::LinearCombination<ElementD, float, void, float>;

  // Config::kEpilogueN / kStoreStages (config.h): the subtile and its buffers, else CUTLASS's choice (the
  // 16 only keeps the unused branch a valid shape).
  using EpilogueTile = std::conditional_t<Cfg::kEpilogueN == 0, cutlass::epilogue::collective::EpilogueTileAuto,
                                          cute::Shape<cute::Int<Cfg::kTileM>, cute::Int<Cfg::kEpilogueN ? Cfg::kEpilogueN : 16>>>;
  using BuiltEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      EpilogueTile, ElementAcc, float,
      void, LayoutD, kAlignD, ElementD, LayoutD, kAlignD,
      EpilogueSchedule, Fusion>::CollectiveOp;
  using CollectiveEpilogue =
      std::conditional_t<Cfg::kStoreStages == 0, BuiltEpilogue,
                         typename WithStoreStages<BuiltEpilogue, std::max(Cfg::kStoreStages, 1)>::type>;

  using BuiltMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      ElementAB, cute::tuple<LayoutA, BuiltLayoutSFA>, kAlignAB,
      ElementAB, cute::tuple<LayoutB, LayoutSFB>, kAlignAB,
      ElementAcc, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<
          static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;
  // The same collective with our consumer loop (Config::kConsumer); only mma/mma_tail differ, so
  // shared storage, stages, the kernel and both schedulers (persistent, stream-K with its fixup)
  // are unchanged. The loop static_asserts the layouts and tiles it supports.
  using ScaledMainloop = PdlScaleCopies<
      std::conditional_t<kNestedSFA, typename WithLayoutSFA<BuiltMainloop, LayoutSFA>::type, BuiltMainloop>>;
  using CollectiveMainloop = std::conditional_t<Cfg::kConsumer == Consumer::kOverlap,
                                                OverlapPromotionMainloop<ScaledMainloop>, ScaledMainloop>;

  using Scheduler = std::conditional_t<kStreamK, cutlass::gemm::StreamKScheduler,
                                       cutlass::gemm::PersistentScheduler>;
  using CutlassKernel = cutlass::gemm::kernel::GemmUniversal<
      cute::Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue, Scheduler>;
  // Config::kIssueAhead: the same kernel with each tile's first K block issued before the previous tile's
  // epilogue (issue_ahead_kernel.cuh); shared storage, parameters and launch are CUTLASS's.
  using Kernel = std::conditional_t<Cfg::kIssueAhead, IssueAheadKernel<CutlassKernel>, CutlassKernel>;
  using Adapter = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using Arguments = typename Kernel::Arguments;

  // Per-token scales: ((1, rows), (128, kb), batches) : ((0, 1), (0, ld), batch_stride). The row
  // extent is the true m (not round_up(m, 4)): the TMA descriptor only needs 16-byte column
  // strides, and a partial last tile is zero-filled instead of reading the quantizer's padding
  // rows. One batch, or K slices of kb blocks each (batch_stride = ld * kb).
  static auto token_scale_layout(int32_t rows, int32_t kb, int32_t ld, int32_t batches, int32_t batch_stride) {
    using namespace cute;
    return make_layout(make_shape(make_shape(_1{}, rows), make_shape(Int<kScaleBlock>{}, kb), batches),
                       make_stride(make_stride(_0{}, _1{}), make_stride(_0{}, ld), batch_stride));
  }

  // slices > 1: the K-slice batched problem (header comment), D = fp32 partials [slices, m, n].
  static Arguments arguments(const Problem& p, const Plan& plan, int slices = 1) {
    const int32_t m = static_cast<int32_t>(p.m);
    const int32_t n = static_cast<int32_t>(p.n);
    const int32_t k = static_cast<int32_t>(p.k);
    const int32_t kb = k / kScaleBlock;
    const int32_t ks = k / slices, kbs = kb / slices;  // one slice's K and K blocks
    const int32_t nb = (n + kScaleBlock - 1) / kScaleBlock;
    const int32_t ld = static_cast<int32_t>(p.a_scale_ld);
    const auto* act = static_cast<const ElementAB*>(p.a);
    const auto* wgt = static_cast<const ElementAB*>(p.b);

    Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
    args.hw_info.device_id = 0;  // only read when sm_count <= 0, which plan.cpp rejects
    args.hw_info.sm_count = p.sm_count;

    auto& ml = args.mainloop;
    auto& ep = args.epilogue;
    ep.thread.alpha = 1.0f;
    ep.thread.beta = 0.0f;
    ep.ptr_C = nullptr;
    ep.ptr_D = static_cast<ElementD*>(p.d);
    if constexpr (kSwap) {
      // Batch l of a K-sliced problem starts ks columns (kbs scale columns) further along every
      // row of both operands: strided views of the caller's buffers.
      args.problem_shape = {n, m, ks, slices};
      ml.ptr_A = wgt;
      ml.dA = {int64_t(k), cute::_1{}, slices > 1 ? int64_t(ks) : int64_t(n) * k};
      ml.ptr_B = act;
      ml.dB = {int64_t(k), cute::_1{}, slices > 1 ? int64_t(ks) : int64_t(m) * k};
      ml.ptr_SFA = p.b_scale;
      ml.layout_SFA = block_scale_layout(nb, kbs, kb, slices, slices > 1 ? kbs : nb * kb);
      ml.ptr_SFB = p.a_scale;
      ml.layout_SFB = token_scale_layout(m, kbs, ld, slices, ld * kbs);
      ep.dC = {cute::_1{}, int64_t(n), int64_t(n) * m};
      ep.dD = {cute::_1{}, int64_t(n), int64_t(n) * m};
    } else {
      args.problem_shape = {m, n, k, 1};
      ml.ptr_A = act;
      ml.dA = {int64_t(k), cute::_1{}, int64_t(m) * k};
      ml.ptr_B = wgt;
      ml.dB = {int64_t(k), cute::_1{}, int64_t(n) * k};
      ml.ptr_SFA = p.a_scale;
      ml.layout_SFA = token_scale_layout(m, kb, ld, 1, ld * kb);
      ml.ptr_SFB = p.b_scale;
      ml.layout_SFB = block_scale_layout(nb, kb, kb, 1, nb * kb);
      ep.dC = {int64_t(n), cute::_1{}, int64_t(m) * n};
      ep.dD = {int64_t(n), cute::_1{}, int64_t(m) * n};
    }

    // Tile order of the persistent grid: which tiles run in the same wave decides how much of A
    // and B the L2 serves once both exceed it (M = 8192 on the large shapes, gemm/NOTES.md).
    using RasterOptions = cutlass::gemm::kernel::detail::RasterOrderOptions;
    args.scheduler.raster_order = plan.raster == 1   ? RasterOptions::AlongM
                                  : plan.raster == 2 ? RasterOptions::AlongN
                                                     : RasterOptions::Heuristic;
    args.scheduler.max_swizzle_size = plan.swizzle;
    if constexpr (kStreamK) {
      using Params = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90StreamKParams;
      // The K-slice batches run data-parallel.
      const bool stream_k = slices == 1 && plan.stream_k;
      const int splits = slices == 1 ? plan.splits : 1;
      args.scheduler.decomposition_mode = stream_k     ? Params::DecompositionMode::StreamK
                                          : splits > 1 ? Params::DecompositionMode::SplitK
                                                       : Params::DecompositionMode::DataParallel;
      args.scheduler.splits = stream_k ? 1 : splits;
      // Turnstile reduction: partial tiles are summed in K order, so results are bitwise
      // reproducible run to run (Nondeterministic was up to 25% faster on few-tile shapes).
      args.scheduler.reduction_mode = plan.nondeterministic_reduction ? Params::ReductionMode::Nondeterministic
                                                                      : Params::ReductionMode::Deterministic;
    }
    return args;
  }

  static size_t workspace(const Problem& p, const Plan& plan, int slices = 1) {
    return Kernel::get_workspace_size(arguments(p, plan, slices));
  }

  static cudaError_t launch(const Problem& p, const Plan& plan, cudaStream_t stream, int slices = 1) {
    const Arguments args = arguments(p, plan, slices);
    if (Kernel::get_workspace_size(args) > p.workspace_size) return cudaErrorInvalidValue;
    // can_implement() is not called: its scale-layout check asks for a row extent divisible by 4,
    // which the TMA descriptor does not need (plan.cpp's rejects() checks what the kernel does need).
    Adapter op;
    cutlass::Status status = op.initialize(args, p.workspace, stream);
    // plan.pdl: programmatic dependent launch (gemm.h); the kernel's griddepcontrol instructions come from
    // CUTLASS_GDC_ENABLED (setup.py) and PdlScaleCopies.
    if (status == cutlass::Status::kSuccess) status = op.run(stream, nullptr, plan.pdl);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return status == cutlass::Status::kSuccess ? cudaSuccess : cudaErrorLaunchFailure;
  }
};

// A K-sliced launch: the fp32 partials at the start of the workspace, the sliced kernel's own
// workspace after them, then the slice sum writing p.d.
template <class Cfg>
cudaError_t launch_k_slices(const Problem& p, const Plan& plan, cudaStream_t stream) {
  const int slices = plan.slices;
  const size_t partials = slice_partials_bytes(p, slices);
  if (p.workspace_size < partials) return cudaErrorInvalidValue;
  Problem q = p;
  q.d = p.workspace;
  q.workspace = static_cast<char*>(p.workspace) + partials;
  q.workspace_size = p.workspace_size - partials;
  if (const cudaError_t err = Gemm<Cfg, float>::launch(q, plan, stream, slices); err != cudaSuccess) return err;
  const int64_t count4 = p.m * p.n / 4;
  const int blocks = int(std::min<int64_t>((count4 + 255) / 256, int64_t(p.sm_count) * 8));
  const auto* src = static_cast<const float4*>(p.workspace);
  cudaLaunchAttribute pdl;
  pdl.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(256);
  cfg.stream = stream;
  cfg.attrs = &pdl;
  cfg.numAttrs = plan.pdl ? 1 : 0;
  const cudaError_t err =
      p.out_bf16 ? cudaLaunchKernelEx(&cfg, sum_k_slices<__nv_bfloat16>, src, count4, slices, static_cast<__nv_bfloat16*>(p.d))
                 : cudaLaunchKernelEx(&cfg, sum_k_slices<__half>, src, count4, slices, static_cast<__half*>(p.d));
  return err != cudaSuccess ? err : cudaGetLastError();
}

template <class Cfg>
cudaError_t launch_config(const Problem& p, const Plan& plan, cudaStream_t stream) {
  if constexpr (Cfg::kSliceK) {
    if (plan.slices > 1) return launch_k_slices<Cfg>(p, plan, stream);
  }
  return p.out_bf16 ? Gemm<Cfg, cutlass::bfloat16_t>::launch(p, plan, stream)
                    : Gemm<Cfg, cutlass::half_t>::launch(p, plan, stream);
}

template <class Cfg>
size_t workspace_config(const Problem& p, const Plan& plan) {
  if constexpr (Cfg::kSliceK) {
    if (plan.slices > 1)
      return slice_partials_bytes(p, plan.slices) + Gemm<Cfg, float>::workspace(p, plan, plan.slices);
  }
  return p.out_bf16 ? Gemm<Cfg, cutlass::bfloat16_t>::workspace(p, plan)
                    : Gemm<Cfg, cutlass::half_t>::workspace(p, plan);
}

}  // namespace blockfp8::gemm::sm90

// The body of a row unit that setup.py generates from table.h (one per `cutlass_kernel()` row): that row's entry points
// for its Config (bf16 and fp16 out, and the fp32-output kernel of its K slices where it has them).
#define BLOCKFP8_SM90_ROW_UNIT(row_name)                                                                     \
  namespace blockfp8::gemm::sm90 {                                                                           \
  static_assert(row_index(row_name) >= 0 && kRows[row_index(row_name)].kernel.kind == KernelKind::kCutlass, \
                "a generated unit names a CUTLASS row of table.h");                                          \
  template cudaError_t launch_config<RowConfig<row_index(row_name)>>(const Problem&, const Plan&, cudaStream_t); \
  template size_t workspace_config<RowConfig<row_index(row_name)>>(const Problem&, const Plan&);             \
  }
