// SM120 block-FP8 GEMM: a row's kernel configuration as a type, and its two entry points. Light on purpose (no
// CUTLASS): RowConfig<i> is built from table.h's named fields of row i; each generated unit (setup.py) instantiates
// the entry points of one row from cutlass_gemm.cuh, and dispatch.cpp takes their addresses. A row that no unit
// instantiates fails to link, so the table and the built kernels cannot drift apart.
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

#include "../../gemm.h"
#include "../table.h"

namespace blockfp8::gemm::sm120 {

// The kernel's template parameters (cutlass_gemm.cuh reads them), in the kernel's operand order (weights x tokens
// when swapped). The asserts state what CUTLASS 4.2's SM120 blockwise collective supports for our scale blocks.
template <bool kSwapAB_, int kTileM_, int kTileN_>
struct Config {
  static constexpr bool kSwapAB = kSwapAB_;
  static constexpr int kTileM = kTileM_;
  static constexpr int kTileN = kTileN_;
  static constexpr int kTileK = 128;  // one K scale block per pipeline stage (the collective asserts TileK == 128)
  // The weight side of the tile holds whole 128-row scale blocks (TileM/N % ScaleGranularityM/N == 0).
  static_assert((kSwapAB ? kTileM : kTileN) % 128 == 0, "weight tiles hold whole 128-row scale blocks");
  // The cooperative tiled MMA is 4x2 warps of m16n8k32: the tile covers 64 x 16 at least.
  static_assert(kTileM % 64 == 0 && kTileN % 16 == 0, "tile must cover the 4x2-warp cooperative MMA layout");
};

template <int I>
using RowConfig = Config<kRows[I].kernel.swap_ab, kRows[I].kernel.tile_m, kRows[I].kernel.tile_n>;

// Defined in cutlass_gemm.cuh, instantiated once per row in its generated unit.
template <class Cfg>
cudaError_t launch_config(const Problem& p, const Plan& plan, cudaStream_t stream);

template <class Cfg>
size_t workspace_config(const Problem& p, const Plan& plan);

}  // namespace blockfp8::gemm::sm120
