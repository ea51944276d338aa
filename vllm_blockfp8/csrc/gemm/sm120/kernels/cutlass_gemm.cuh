// SM120 (sm_120a: RTX 5090, RTX PRO 6000 Blackwell) W8A8 block-scaled FP8 GEMM from CUTLASS 4.2's SM120
// blockwise-scaled collective. Compile-checked only: never run on SM120 hardware (gemm/sm120/NOTES.md).
//
// Math and layouts: gemm.h.
//   D[m, n] = sum_kb (sum_{k in block kb} A[m, k] * B[n, k]) * SFA[m, kb] * SFB[n / 128, kb]
// Kernel: CollectiveBuilder<Sm120, OpClassTensorOp, ...> with KernelScheduleAuto (-> the cooperative
// KernelTmaWarpSpecializedCooperativeBlockwiseScalingSm120 kernel: one TMA producer warp, two math warpgroups
// sharing one tile as 4x2 warps of mma.sync m16n8k32 e4m3 x e4m3 -> fp32 with register operands). Per 128-deep K
// stage the MMAs accumulate into a fresh fp32 fragment that is then promoted, acc += partial * SFA * SFB, in fp32
// (the collective's rescale()), so reduced-precision accumulation never spans two scale blocks. Operand tiles come
// by TMA (zero-filled past m / n); the scales by cp.async, one fp32 per 4-byte copy, predicated past the last scale
// row (the scale tensors need no 16-byte alignment and may be of any stride). Epilogue: CUTLASS's SM120 TMA
// epilogue, one conversion to bf16/fp16, clipped at m / n. Persistent scheduler, 1x1x1 cluster, K whole.
//
// Operand roles (table.h):
//   unswapped: kernel-A = activations (M = m), kernel-B = weights (N = n); scale granularity (1, 128, 128):
//     SFA per token, M-major with leading dimension a_scale_ld: ((1, m), (128, kb)) : ((0, 1), (0, ld)) -- the
//     caller's buffer as it is; SFB per 128x128 block, K-major: ((128, nb), (128, kb)) : ((0, kb), (0, 1)).
//   swap-AB (small m): kernel-A = weights (M' = n), kernel-B = activations (N' = m); granularity (128, 1, 128):
//     SFA = the weight blocks, K-major; SFB = the token scales, M-major with ld; D^T stored column-major with
//     ld = n, which is D row-major.
// CUTLASS's Sm120BlockwiseScaleConfig takes either major per operand (it reads the major from the stride), so our
// M-major token scales need no conversion and no extra pass; both layouts are the caller's buffers as they are.
//
// can_implement() is not called: it asks for M % ScaleGranularityM == 0 and N % ScaleGranularityN == 0 (whole
// scale blocks in the problem), which ragged n (weights) does not meet and the kernel does not need: the scale
// loads are predicated at ceil(n / 128) rows and the operand TMA zero-fills. What the kernel needs is in
// plan.cpp's rejects(): k % 128 == 0, n % 8 == 0 (16-byte rows of D, and of D^T's columns, for the TMA store),
// 16-byte aligned a, b, d (TMA), int32 sizes.
//
// Unsupported: k % 128 != 0, n % 8 != 0, bias, batched problems, stream-K / split-K (K runs whole: SM120 parts have
// 170-188 SMs and no measurement yet says a split pays), programmatic dependent launch.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include "cute/tensor.hpp"
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

#include "config.h"

namespace blockfp8::gemm::sm120 {

template <class Cfg, class ElementD>
struct Gemm {
  static constexpr bool kSwap = Cfg::kSwapAB;
  static constexpr int kScaleBlock = 128;

  using ElementAB = cutlass::float_e4m3_t;
  using ElementAcc = float;
  // Both operands K-major (the collective supports TN only): A row-major M x K, B column-major K x N.
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;
  // D row-major [m, n]; swapped, the kernel writes D^T [n, m] column-major, the same bytes.
  using LayoutD = std::conditional_t<kSwap, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  static constexpr int kAlignAB = 16;                    // 16 bytes of fp8 (TMA)
  static constexpr int kAlignD = 16 / sizeof(ElementD);  // 16 bytes of output (TMA store)

  using TileShape = cute::Shape<cute::Int<Cfg::kTileM>, cute::Int<Cfg::kTileN>, cute::Int<Cfg::kTileK>>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;  // GeForce SM120: no multicast clusters

  // Scale granularity and major per kernel operand: the token side is (1 row, 128 K), M-major; the weight side
  // (128 rows, 128 K), K-major.
  using ScaleConfig = cutlass::detail::Sm120BlockwiseScaleConfig<
      kSwap ? kScaleBlock : 1, kSwap ? 1 : kScaleBlock, kScaleBlock,
      kSwap ? cute::UMMA::Major::K : cute::UMMA::Major::MN,
      kSwap ? cute::UMMA::Major::MN : cute::UMMA::Major::K>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

  using Fusion = cutlass::epilogue::fusion::LinearCombination<ElementD, float, void, float>;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm120, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, float,
      void, LayoutD, kAlignD, ElementD, LayoutD, kAlignD,
      cutlass::epilogue::collective::EpilogueScheduleAuto, Fusion>::CollectiveOp;

  // Stages: what is left of SM120's shared memory after the epilogue's (StageCountAutoCarveout).
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm120, cutlass::arch::OpClassTensorOp,
      ElementAB, cute::tuple<LayoutA, LayoutSFA>, kAlignAB,
      ElementAB, cute::tuple<LayoutB, LayoutSFB>, kAlignAB,
      ElementAcc, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<
          static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::gemm::collective::KernelScheduleAuto>::CollectiveOp;
  static_assert(CollectiveMainloop::ScaleGranularityK == kScaleBlock, "one K scale block per stage");

  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, CollectiveMainloop,
                                                      CollectiveEpilogue, cutlass::gemm::PersistentScheduler>;
  static_assert(Kernel::SharedStorageSize <= cutlass::arch::sm120_smem_capacity_bytes,
                "the row must fit SM120's shared memory");
  using Adapter = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using Arguments = typename Kernel::Arguments;

  // Per-token scales, M-major: ((1, rows), (128, kb), 1) : ((0, 1), (0, ld), ld * kb). The row extent is the true
  // m: the loads past it are predicated off (the quantizer's padding rows up to a_scale_ld are never read).
  template <class Layout>
  static Layout token_scales(int32_t rows, int32_t kb, int32_t ld) {
    using namespace cute;
    return Layout(make_shape(make_shape(_1{}, rows), make_shape(Int<kScaleBlock>{}, kb), int32_t(1)),
                  make_stride(make_stride(_0{}, _1{}), make_stride(_0{}, ld), int32_t(ld * kb)));
  }
  // Weight block scales [nb, kb] row-major, K-major: ((128, nb), (128, kb), 1) : ((0, kb), (0, 1), nb * kb).
  template <class Layout>
  static Layout block_scales(int32_t nb, int32_t kb) {
    using namespace cute;
    return Layout(make_shape(make_shape(Int<kScaleBlock>{}, nb), make_shape(Int<kScaleBlock>{}, kb), int32_t(1)),
                  make_stride(make_stride(_0{}, kb), make_stride(_0{}, _1{}), int32_t(nb * kb)));
  }

  static Arguments arguments(const Problem& p) {
    const int32_t m = static_cast<int32_t>(p.m);
    const int32_t n = static_cast<int32_t>(p.n);
    const int32_t k = static_cast<int32_t>(p.k);
    const int32_t kb = k / kScaleBlock;
    const int32_t nb = (n + kScaleBlock - 1) / kScaleBlock;
    const int32_t ld = static_cast<int32_t>(p.a_scale_ld);
    const auto* act = static_cast<const ElementAB*>(p.a);
    const auto* wgt = static_cast<const ElementAB*>(p.b);

    Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
    args.hw_info.device_id = 0;  // only read when sm_count <= 0, which rejects() refuses
    args.hw_info.sm_count = p.sm_count;

    auto& ml = args.mainloop;
    auto& ep = args.epilogue;
    ep.thread.alpha = 1.0f;
    ep.thread.beta = 0.0f;
    ep.ptr_C = nullptr;
    ep.ptr_D = static_cast<ElementD*>(p.d);
    if constexpr (kSwap) {
      args.problem_shape = {n, m, k, 1};
      ml.ptr_A = wgt;
      ml.dA = {int64_t(k), cute::_1{}, int64_t(n) * k};
      ml.ptr_B = act;
      ml.dB = {int64_t(k), cute::_1{}, int64_t(m) * k};
      ml.ptr_SFA = p.b_scale;
      ml.layout_SFA = block_scales<LayoutSFA>(nb, kb);
      ml.ptr_SFB = p.a_scale;
      ml.layout_SFB = token_scales<LayoutSFB>(m, kb, ld);
      ep.dC = {cute::_1{}, int64_t(n), int64_t(n) * m};
      ep.dD = {cute::_1{}, int64_t(n), int64_t(n) * m};
    } else {
      args.problem_shape = {m, n, k, 1};
      ml.ptr_A = act;
      ml.dA = {int64_t(k), cute::_1{}, int64_t(m) * k};
      ml.ptr_B = wgt;
      ml.dB = {int64_t(k), cute::_1{}, int64_t(n) * k};
      ml.ptr_SFA = p.a_scale;
      ml.layout_SFA = token_scales<LayoutSFA>(m, kb, ld);
      ml.ptr_SFB = p.b_scale;
      ml.layout_SFB = block_scales<LayoutSFB>(nb, kb);
      ep.dC = {int64_t(n), cute::_1{}, int64_t(m) * n};
      ep.dD = {int64_t(n), cute::_1{}, int64_t(m) * n};
    }
    // CUTLASS's tile order (heuristic raster, no swizzle): no SM120 measurement says otherwise yet.
    using RasterOptions = cutlass::gemm::kernel::detail::RasterOrderOptions;
    args.scheduler.raster_order = RasterOptions::Heuristic;
    args.scheduler.max_swizzle_size = 1;
    return args;
  }

  static size_t workspace(const Problem& p) { return Kernel::get_workspace_size(arguments(p)); }

  static cudaError_t launch(const Problem& p, cudaStream_t stream) {
    const Arguments args = arguments(p);
    if (Kernel::get_workspace_size(args) > p.workspace_size) return cudaErrorInvalidValue;
    Adapter op;
    cutlass::Status status = op.initialize(args, p.workspace, stream);
    if (status == cutlass::Status::kSuccess) status = op.run(stream);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return status == cutlass::Status::kSuccess ? cudaSuccess : cudaErrorLaunchFailure;
  }
};

template <class Cfg>
cudaError_t launch_config(const Problem& p, const Plan&, cudaStream_t stream) {
  return p.out_bf16 ? Gemm<Cfg, cutlass::bfloat16_t>::launch(p, stream) : Gemm<Cfg, cutlass::half_t>::launch(p, stream);
}

template <class Cfg>
size_t workspace_config(const Problem& p, const Plan&) {
  return p.out_bf16 ? Gemm<Cfg, cutlass::bfloat16_t>::workspace(p) : Gemm<Cfg, cutlass::half_t>::workspace(p);
}

}  // namespace blockfp8::gemm::sm120

// The body of a row unit that setup.py generates from table.h (one per row): that row's entry points for its Config
// (bf16 and fp16 out).
#define BLOCKFP8_SM120_ROW_UNIT(row_name)                                                                     \
  namespace blockfp8::gemm::sm120 {                                                                           \
  static_assert(row_index(row_name) >= 0, "a generated unit names a row of table.h");                         \
  template cudaError_t launch_config<RowConfig<row_index(row_name)>>(const Problem&, const Plan&, cudaStream_t); \
  template size_t workspace_config<RowConfig<row_index(row_name)>>(const Problem&, const Plan&);             \
  }
