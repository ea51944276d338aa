// Instantiates tile-table row sm90_swapab_128x64x128_ovl_persistent of sm90.cu (bf16 and fp16 out): the 128x64
// swap-AB row on CUTLASS's persistent scheduler instead of the stream-K one (data-parallel only, no split-K):
// a smaller kernel with less fixed cost a call (gemm/NOTES.md, fourteenth session); see sm90_kernel.cuh.
// One row per file so that the build compiles the rows in parallel. sm_90a only.
#include "sm90_kernel.cuh"

namespace blockfp8::gemm::sm90 {

using Row = Config<true, 128, 64, 1, 1, Schedule::kCooperative, Consumer::kOverlap>;
template cudaError_t launch_config<Row>(const Problem&, cudaStream_t);
template size_t workspace_config<Row>(const Problem&);
template KPlan plan_config<Row>(const Problem&);

}  // namespace blockfp8::gemm::sm90
