// SM89 (Ada) W8A8 block-FP8 GEMM: the one row list. Every row is the same kernel (kernel.cuh, mma.sync m16n8k32
// e4m3) at another CTA tile; rows.cu instantiates each row once (bf16 and fp16 output), so what is built and what is
// selectable cannot drift. Which row a problem gets, and whether K is cut into slices, is plan.cpp's job.
//
// Row names (a public contract: tables, logs, benchmark JSON): sm89_<BM>x<BN>x<BK>_w<warps along M>x<warps along N>
// _s<pipeline stages>. BM = tokens per CTA, BN = weight rows per CTA (always 128: one weight-scale block, so a CTA
// reads one SFB value per K block), BK = 128 (one activation-scale group: the partial sum is promoted once per stage).
//
// Shared memory per CTA = stages x (BM + BN) x 128 bytes; Ada gives a CTA at most 99 KB, so the 128-token row keeps
// 3 stages (96 KB) and the narrower rows 4.
#pragma once

#include "../../common/tile_row.h"
#include "../gemm.h"

namespace blockfp8::gemm::sm89 {

struct Kernel {
  int bm, bn, warps_m, warps_n, stages;
  constexpr int threads() const { return 32 * warps_m * warps_n; }
  constexpr int smem_bytes() const { return stages * (bm + bn) * 128; }
};

enum RowId : int { kTok32, kTok64, kTok128, kNumRows };

struct Row {
  RowId id;
  TileRow info;  // name, max_m (the largest M plan.cpp gives it; the last row takes every M), one-line reason
  Kernel kernel;
};

// clang-format off
inline constexpr Row kRows[kNumRows] = {
  {kTok32, {"sm89_32x128x128_w1x4_s4", 32,
      "decode-sized M: a 32-token tile wastes at most 31 rows of MMA and streams the weight once per 32 tokens; "
      "4 warps side by side along N (32x32 each), 4 stages (80 KB) to keep weight bytes in flight"},
   Kernel{32, 128, 1, 4, 4}},
  {kTok64, {"sm89_64x128x128_w2x4_s4", 64,
      "M in (32, 64]: one 64-token tile per weight tile, half the padding of the 128-token row; 8 warps of "
      "32x32, 4 stages (96 KB)"},
   Kernel{64, 128, 2, 4, 4}},
  {kTok128, {"sm89_128x128x128_w2x4_s3", kUnboundedM,
      "M > 64: 128x128 tiles, the most reuse per byte that fits Ada's 99 KB with 3 stages; 8 warps of 64x32 so the "
      "block partial and the accumulator (2 x 64 fp32) stay in registers"},
   Kernel{128, 128, 2, 4, 3}},
};
// clang-format on

static_assert(blockfp8::rows_in_id_order(kRows), "kRows must list the rows in RowId order");
static_assert(kRows[kNumRows - 1].info.max_m == kUnboundedM, "the last row takes every M");

constexpr int kMaxSmemBytes = 99 * 1024;  // opt-in shared memory per CTA on SM89 (and SM86/SM120)
constexpr bool rows_fit() {
  for (const Row& r : kRows)
    if (r.kernel.smem_bytes() > kMaxSmemBytes || r.kernel.bn != 128) return false;
  return true;
}
static_assert(rows_fit(), "every SM89 row fits 99 KB of shared memory and is one weight-scale block wide");

// Launches row `row` (rows.cu). grid.z = K slices: slice s walks K blocks [s*per, (s+1)*per) and writes fp32
// partials [slices][m][n] into `partials`; a second kernel sums them in slice order (deterministic).
struct Launch {
  int row = 0;
  int slices = 1;
  int group_m = 1;  // tile order: groups of group_m token tiles run along N together (L2 reuse of the weight tile)
};
cudaError_t launch_row(const Problem& p, const Launch& l, cudaStream_t s);
}  // namespace blockfp8::gemm::sm89
