// Host entry points of the 64-token-tile SM90 GEMM (sm90_tok64_fitn.cu), named by sm90.cu's tile table.
// Light on purpose (no CUTLASS), like sm90_kernel.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "gemm.h"

namespace blockfp8::gemm::sm90::tok64 {

// The weight-tile widths the unit instantiates (the kernel's N tile; tokens are 64 a tile). Past 128 only the
// widths whose tiles (at multiples of the width) never touch more than two 128-row weight scale blocks: 176
// would touch three; 256 needs more than the 255 registers a thread has (192: 214, 160: 255, 0 spill).
inline constexpr int kTileWidths[] = {16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 192};
inline constexpr int kTokenTile = 64;

// The N tile the row runs p with (host logic; one of kTileWidths).
int tile_n(const Problem& p);
int64_t tile_count(const Problem& p, int tile_n);

cudaError_t launch(const Problem& p, cudaStream_t stream);
size_t workspace(const Problem& p);  // always 0: K is walked whole, nothing is shared between CTAs
KPlan plan(const Problem& p);

}  // namespace blockfp8::gemm::sm90::tok64
