// Host entry points of the SM90 NVFP4 W4A16 wgmma GEMM (w4a16_wgmma.cu: compiled for sm_90a only, and only in builds
// with 9.0a, which define BLOCKFP8_HAS_SM90_GEMM): the fp4_wgmma_128x<tok> rows of sm80.cu's table.
// tok is the token tile: 32, 64, 128 or 256 (every tile is 128 weight rows).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "../fp4.h"

namespace blockfp8::fp4::sm90 {

// nullptr if the tile runs p (after sm80.cu's shared checks), else why not: SM90 only, the fragment packing, the
// tile's shared memory, 16-byte aligned x rows.
const char* w4a16_wgmma_rejects(int tok, const Problem& p);

// K splits whose fp32 partials the caller reduces (1: none). Where the output tiles leave SMs idle the launch splits
// K, summing the splits either in a thread-block cluster inside the kernel (then this is 1) or through fp32 partials,
// whichever its cost model rates faster (w4a16_wgmma.cu; BLOCKFP8_SM90_FP4_REDUCTION / _SPLITS override it).
int w4a16_wgmma_partial_splits(int tok, const Problem& p);

// M = 129..511: whether the 128-token tile's cost model (kTok128Costs, with its partials-rule split) rates it faster
// than the 256-token tile's (kTok256Costs, its best reduction and split); false where either has no model (forced
// splits).
bool w4a16_wgmma_tok128_modelled_faster(const Problem& p);

// The launch's K split as its launcher decides it: splits, whether they sum in a cluster, the CTAs that run at once in
// that launch shape (cluster slots for a cluster), the cost model's time (0 where the tile has none). splits == 0:
// no such tile.
struct WgmmaPlan {
  int splits = 0;
  bool cluster = false;
  int64_t at_once = 0;
  double modelled_us = 0;
};
WgmmaPlan w4a16_wgmma_plan(int tok, const Problem& p);

// Bytes of fp32 partials the launch needs in p.workspace (0 without them).
size_t w4a16_wgmma_workspace(int tok, const Problem& p);

// Enqueues the GEMM. With w4a16_wgmma_partial_splits(tok, p) > 1 it writes every fp32 partial [split][m][n] to
// p.workspace instead of out, and the caller runs the reduction (w4a16_reduce_kernel) after it. Does not check
// rejects().
cudaError_t launch_w4a16_wgmma(int tok, const Problem& p, cudaStream_t stream);

}  // namespace blockfp8::fp4::sm90
