// SM120 (sm_120a: RTX 5090, RTX PRO 6000 Blackwell) W8A8 block-FP8 GEMM: the one row list. setup.py generates one
// translation unit per row from this list at build time (kernels/cutlass_gemm.cuh instantiated for the row's
// Config, bf16 and fp16 out); plan.cpp picks the row by M. Compile-checked only: no row has run on SM120 hardware
// (NOTES.md), so each checks itself against the reference on its first use (gemm.cpp / ops.cpp).
//
// Row names, read left to right (a public contract: tables, logs, benchmark JSON):
//   sm120_        the arch
//   swapab_       D^T = B A^T: weight rows on the kernel's M side (128), tokens on the narrow N side
//   coop_         unswapped: 128 tokens x 128 weight rows
//   AxBx128       the CTA tile in the kernel's operand order (weights x tokens when swapped), 128 deep in K
// Every row: CUTLASS 4.2's SM120 blockwise-scaled collective (MainloopSm120TmaWarpSpecializedBlockwiseScaling,
// KernelTmaWarpSpecializedBlockwiseCooperativeSm120), one CTA per cluster, the persistent scheduler, K whole.
//
// SM120 constraints every row follows (CUTLASS 4.2 headers):
//   - ~99 KiB of shared memory per CTA (sm120_smem_capacity_bytes = 101376; SM90: 227 KiB), so a 128x128x128 fp8
//     stage (32 KiB) leaves room for two stages beside the epilogue; narrower tiles get more stages.
//   - mma.sync (warp-level, register operands read by ldmatrix), no wgmma; TMA loads, but no multicast worth a
//     cluster (GeForce parts: 1x1x1 clusters only), so no 2x1 rows.
//   - The collective needs whole scale blocks per tile (TileM % ScaleGranularityM == 0, TileN % ScaleGranularityN
//     == 0) and one K scale block per stage (TileK == 128): the weight side of a tile is 128 rows (the checkpoint's
//     128x128 blocks), the token side any multiple of the 8-wide MMA N (32, 64, 128 here).
//   - A and B both K-major (the collective supports TN only), which is our layout.
#pragma once

#include <cstdint>

#include "../../common/tile_row.h"

namespace blockfp8::gemm::sm120 {

// A row's kernel, with named fields (kernel operand order: weights x tokens when swapped).
struct Kernel {
  bool swap_ab = false;  // tokens on the kernel's N side
  int tile_m = 128, tile_n = 128;

  constexpr Kernel swapped() const { Kernel k = *this; k.swap_ab = true; return k; }
  constexpr Kernel tile(int m, int n) const { Kernel k = *this; k.tile_m = m, k.tile_n = n; return k; }
};
constexpr Kernel cutlass_kernel() { return Kernel{}; }

// Row ids in table order.
enum RowId : int { kSwap128x32, kSwap128x64, kCoop128x128, kNumRows };

struct Row {
  RowId id;
  TileRow info;  // name, max_m (the largest M plan.cpp gives it), one-line reason
  Kernel kernel;
};

// clang-format off
inline constexpr Row kRows[kNumRows] = {
  {kSwap128x32, {"sm120_swapab_128x32x128", 32,
      "M <= 32: tokens on the 32-wide N side, weights on the 128-row side (the collective needs whole 128-row weight "
      "scale blocks per tile); 20 KiB stages, 4 of them in SM120's ~99 KiB"},
   cutlass_kernel().swapped().tile(128, 32)},
  {kSwap128x64, {"sm120_swapab_128x64x128", 64,
      "M in (32, 64]: one 64-token tile per 128-row weight tile, half the padding of a 128-token tile; 24 KiB stages, "
      "3 in ~99 KiB"},
   cutlass_kernel().swapped().tile(128, 64)},
  {kCoop128x128, {"sm120_coop_128x128x128", kUnboundedM,
      "every other M: 128x128 tiles (the widest whose 32 KiB stages still double-buffer in SM120's ~99 KiB beside "
      "the epilogue), per-token scales on the 128-token side"},
   cutlass_kernel()},
};
// clang-format on

static_assert(blockfp8::rows_in_id_order(kRows), "kRows must list the rows in RowId order");
static_assert(kRows[kNumRows - 1].info.max_m == kUnboundedM, "the last row takes every M");

// The index of the row named `name`, -1 if none (generated units find their row by name).
constexpr int row_index(const char* name) { return blockfp8::row_index(kRows, name); }

}  // namespace blockfp8::gemm::sm120
