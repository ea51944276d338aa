// The SM120 native NVFP4 GEMM units (one per tile shape, each with a bf16 and an fp16 output): what table.cpp
// calls. Defined in the sm_120a units only (BLOCKFP8_HAS_SM120_NVFP4).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "../native.h"

namespace blockfp8::fp4::native::sm120 {

// Each unit: CUTLASS's workspace for p, and the launch (can_implement checked; cudaErrorInvalidValue if not).
#define BLOCKFP8_SM120_NVFP4_DECLARE(TILE)                                  \
  size_t workspace_##TILE(const GemmProblem& p);                           \
  cudaError_t launch_##TILE(const GemmProblem& p, cudaStream_t s);

BLOCKFP8_SM120_NVFP4_DECLARE(128x128x256)
BLOCKFP8_SM120_NVFP4_DECLARE(128x128x128)

#undef BLOCKFP8_SM120_NVFP4_DECLARE

}  // namespace blockfp8::fp4::native::sm120
