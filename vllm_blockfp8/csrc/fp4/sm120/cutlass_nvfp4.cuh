// One SM120 native NVFP4 GEMM instantiation: D[m, n] = alpha * sum_k (e2m1(a) * sfa) * (e2m1(b) * sfb),
// through CUTLASS 4.2's SM120 block-scaled collective (OpClassBlockScaledTensorOp, nv_float4_t<float_e2m1_t>:
// per-16 UE4M3 scale factors read in the Sm1xxBlockScaledConfig layout of native.h), TMA warp-specialized
// cooperative schedule (KernelScheduleAuto), cluster 1x1x1 (SM120 has no multicast), fp32 accumulation.
// a is [m, k] K-major, b is [n, k] K-major (the TN layout the collective requires). No C operand (ElementC
// void: nothing is read), D bf16 or fp16 row-major, alpha read from device memory by the epilogue (alpha_ptr).
// Built only for sm_120a; elsewhere the launchers answer cudaErrorNotSupported.
#pragma once

#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

#include "kernels.h"

namespace blockfp8::fp4::native::sm120 {

#if defined(CUTLASS_ARCH_MMA_SM120_SUPPORTED)

// A packed K-major (or N-contiguous) stride (ld, 1, batch) in elements, what CUTLASS's make_cute_packed_stride
// builds (cutlass/util is not in the nvidia-cutlass wheel).
template <typename Stride>
Stride packed_stride(int64_t ld, int64_t rows) {
  Stride s{};
  cute::get<0>(s) = static_cast<cute::remove_cvref_t<decltype(cute::get<0>(s))>>(ld);
  cute::get<2>(s) = static_cast<cute::remove_cvref_t<decltype(cute::get<2>(s))>>(ld * rows);
  return s;
}

template <int TM, int TN, int TK, typename Out>
struct Nvfp4Gemm {
  using Element = cutlass::nv_float4_t<cutlass::float_e2m1_t>;
  static constexpr int kAlignAB = 32;  // 16 bytes of packed e2m1: K % 32 == 0
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<Out>::value;
  using Tile = cute::Shape<cute::Int<TM>, cute::Int<TN>, cute::Int<TK>>;
  using Cluster = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using Arch = cutlass::arch::Sm120;
  using OpClass = cutlass::arch::OpClassBlockScaledTensorOp;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      Arch, OpClass, Tile, Cluster, cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, cutlass::layout::RowMajor, kAlignD, Out, cutlass::layout::RowMajor, kAlignD,
      cutlass::epilogue::collective::EpilogueScheduleAuto>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      Arch, OpClass, Element, cutlass::layout::RowMajor, kAlignAB, Element, cutlass::layout::ColumnMajor, kAlignAB,
      float, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::collective::KernelScheduleAuto>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop, Epilogue, void>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments arguments(const GemmProblem& p) {
    using Config = typename Kernel::CollectiveMainloop::Sm1xxBlkScaledConfig;
    const int m = int(p.m), n = int(p.n), k = int(p.k);
    const auto problem = cute::make_shape(m, n, k, 1);
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {m, n, k, 1},
        {reinterpret_cast<const typename Element::DataType*>(p.a),
         packed_stride<typename Kernel::StrideA>(k, m),
         reinterpret_cast<const typename Element::DataType*>(p.b),
         packed_stride<typename Kernel::StrideB>(k, n),
         reinterpret_cast<const typename Element::ScaleFactorType*>(p.a_sf), Config::tile_atom_to_shape_SFA(problem),
         reinterpret_cast<const typename Element::ScaleFactorType*>(p.b_sf), Config::tile_atom_to_shape_SFB(problem)},
        {{},
         nullptr,
         packed_stride<typename Kernel::StrideC>(n, m),
         static_cast<Out*>(p.d),
         packed_stride<typename Kernel::StrideD>(n, m)}};
    args.epilogue.thread.alpha_ptr = p.alpha;  // beta stays 0: no C
    return args;
  }
};

template <int TM, int TN, int TK, typename Out>
size_t workspace_t(const GemmProblem& p) {
  using G = Nvfp4Gemm<TM, TN, TK, Out>;
  return G::Gemm::get_workspace_size(G::arguments(p));
}

template <int TM, int TN, int TK, typename Out>
cudaError_t launch_t(const GemmProblem& p, cudaStream_t s) {
  using G = Nvfp4Gemm<TM, TN, TK, Out>;
  typename G::Gemm gemm;
  const auto args = G::arguments(p);
  if (G::Gemm::can_implement(args) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
  if (G::Gemm::get_workspace_size(args) > 0 && p.workspace == nullptr) return cudaErrorInvalidValue;
  // initialize sets the kernel's shared-memory attribute and builds the params; no allocation, no sync.
  if (gemm.initialize(args, p.workspace, s) != cutlass::Status::kSuccess) return cudaErrorLaunchFailure;
  if (gemm.run(s) != cutlass::Status::kSuccess) return cudaErrorLaunchFailure;
  return cudaGetLastError();
}

#define BLOCKFP8_SM120_NVFP4_UNIT(TM, TN, TK)                                                                \
  size_t workspace_##TM##x##TN##x##TK(const GemmProblem& p) {                                                 \
    return p.bf16 ? workspace_t<TM, TN, TK, cutlass::bfloat16_t>(p) : workspace_t<TM, TN, TK, cutlass::half_t>(p); \
  }                                                                                                          \
  cudaError_t launch_##TM##x##TN##x##TK(const GemmProblem& p, cudaStream_t s) {                               \
    return p.bf16 ? launch_t<TM, TN, TK, cutlass::bfloat16_t>(p, s) : launch_t<TM, TN, TK, cutlass::half_t>(p, s); \
  }

#else  // a CUDA older than 12.8: no SM120 collective

#define BLOCKFP8_SM120_NVFP4_UNIT(TM, TN, TK)                                                      \
  size_t workspace_##TM##x##TN##x##TK(const GemmProblem&) { return 0; }                             \
  cudaError_t launch_##TM##x##TN##x##TK(const GemmProblem&, cudaStream_t) { return cudaErrorNotSupported; }

#endif

}  // namespace blockfp8::fp4::native::sm120
