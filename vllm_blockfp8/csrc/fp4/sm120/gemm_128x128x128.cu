// SM120 native NVFP4 GEMM, 128 x 128 x 128 tiles (row nvfp4_sm120_128x128x128; why: table.cpp).
#include "cutlass_nvfp4.cuh"

namespace blockfp8::fp4::native::sm120 {
BLOCKFP8_SM120_NVFP4_UNIT(128, 128, 128)
}  // namespace blockfp8::fp4::native::sm120
