// Host entry points of the token-tile SM90 GEMM rows (sm90_tok_kernel.cuh), per math-warpgroup count: 1 for
// sm90_tok64_fitn (64-token tiles; sm90_tok64_fitn.cu), 2 for the candidate sm90_tok128_fitn (128-token tiles;
// sm90_tok128_fitn.cu). Each row file explicitly instantiates the templates below for its count, as the CUTLASS rows'
// files do for sm90_kernel.h. Light on purpose (no CUTLASS): sm90.cu's tile table names them through this header.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "gemm.h"

namespace blockfp8::gemm::sm90::tok {

// The weight-tile widths (the kernel's N tile) each row instantiates and its rule picks from.
template <int kWarpgroups>
struct Widths;
template <>
struct Widths<1> {
  static constexpr int kTileN[] = {16, 32, 48, 64, 80, 96, 112, 128};
};
// Two math warpgroups sharing each weight tile: DeepGEMM's mid-M shape at M = 256 (BLOCK_M = 128, BLOCK_N 80..192;
// gemm/NOTES.md fifteenth session). Up to 144 wide: at 160 (two fragments of 80 fp32 a thread) ptxas spilled 16
// bytes even with 232 registers for the math warpgroups.
template <>
struct Widths<2> {
  static constexpr int kTileN[] = {32, 48, 64, 80, 96, 112, 128, 144};
};

template <int kWarpgroups>
inline constexpr int kTokenTile = 64 * kWarpgroups;

// The N tile the row runs p with (host logic; one of Widths<kWarpgroups>::kTileN), and its tile count.
template <int kWarpgroups>
int tile_n(const Problem& p);
template <int kWarpgroups>
int64_t tile_count(const Problem& p, int tile_n);

template <int kWarpgroups>
cudaError_t launch(const Problem& p, cudaStream_t stream);
template <int kWarpgroups>
KPlan plan(const Problem& p);
// K is walked whole and nothing is shared between CTAs: no workspace.
inline size_t workspace(const Problem&) { return 0; }

}  // namespace blockfp8::gemm::sm90::tok
