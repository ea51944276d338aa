// Instantiates the fused-quantizer kernels (bf16 and fp16 x and out) of tile-table row sm90_coop_128x128x128_c2x1_ovl
// of sm90.cu: the row's GEMM with the activation quantizer in its producer warpgroup (sm90_fused_quant.cuh). A file
// of its own so that the build compiles it beside the row's plain kernels. sm_90a only.
#include "sm90_kernel.cuh"

namespace blockfp8::gemm::sm90 {

using Row = Config<false, 128, 128, 2, 1, Schedule::kCooperative, Consumer::kOverlap>;
template cudaError_t launch_fused_config<Row>(const Problem&, cudaStream_t);
template size_t fused_workspace_config<Row>(const Problem&);

}  // namespace blockfp8::gemm::sm90
