// Host entry points of the 64-token-tile SM90 GEMM (tok64.cu): table.h's `tok64_kernel()` rows (sm90_tok64_fitn,
// sm90_tok64_fitn_narrow). Light on purpose (no CUTLASS), like config.h; plan.cpp picks the width.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "../../gemm.h"

namespace blockfp8::gemm::sm90::tok64 {

// The weight-tile widths the unit instantiates (the kernel's N tile; tokens are 64 a tile). Past 128 only the
// widths whose tiles (at multiples of the width) never touch more than two 128-row weight scale blocks: 176
// would touch three; 256 needs more than the 255 registers a thread has (192: 214, 160: 255, 0 spill).
inline constexpr int kTileWidths[] = {16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 192};
inline constexpr int kTokenTile = 64;

// Launches p with plan.tile_n-wide weight tiles (one of kTileWidths) and plan.pdl; K is walked whole, nothing is
// shared between CTAs, so no workspace.
cudaError_t launch(const Problem& p, const Plan& plan, cudaStream_t stream);

}  // namespace blockfp8::gemm::sm90::tok64
