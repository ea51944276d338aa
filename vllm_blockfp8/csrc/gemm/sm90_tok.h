// Host entry points of the token-tile SM90 GEMM rows (sm90_tok_kernel.cuh): sm90_tok64_fitn (64-token tiles, one
// math warpgroup; sm90_tok64_fitn.cu) and the candidate sm90_tok128_fitn (128-token tiles, two; sm90_tok128_fitn.cu),
// named by sm90.cu's tile table. Light on purpose (no CUTLASS), like sm90_kernel.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "gemm.h"

namespace blockfp8::gemm::sm90 {

namespace tok64 {
// The weight-tile widths the unit instantiates (the kernel's N tile; tokens are 64 a tile).
inline constexpr int kTileWidths[] = {16, 32, 48, 64, 80, 96, 112, 128};
inline constexpr int kTokenTile = 64;

// The N tile the row runs p with (host logic; one of kTileWidths).
int tile_n(const Problem& p);
int64_t tile_count(const Problem& p, int tile_n);

cudaError_t launch(const Problem& p, cudaStream_t stream);
size_t workspace(const Problem& p);  // always 0: K is walked whole, nothing is shared between CTAs
KPlan plan(const Problem& p);
}  // namespace tok64

namespace tok128 {
// 128-token tiles, two math warpgroups sharing each weight tile: DeepGEMM's mid-M shape at M = 256 (BLOCK_M = 128,
// BLOCK_N 80..192; gemm/NOTES.md fifteenth session). Up to 144 wide: at 160 (two fragments of 80 fp32 a thread)
// ptxas spilled 16 bytes even with 232 registers for the math warpgroups.
inline constexpr int kTileWidths[] = {32, 48, 64, 80, 96, 112, 128, 144};
inline constexpr int kTokenTile = 128;

int tile_n(const Problem& p);
int64_t tile_count(const Problem& p, int tile_n);

cudaError_t launch(const Problem& p, cudaStream_t stream);
size_t workspace(const Problem& p);  // always 0
KPlan plan(const Problem& p);
}  // namespace tok128

}  // namespace blockfp8::gemm::sm90
