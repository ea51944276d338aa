// Instantiates tile-table row sm90_swapab_128x32x128 of sm90.cu: bf16 and fp16 out, CUTLASS
// split-K capable, and the fp32-output kernel its K slices run on; see sm90_kernel.cuh.
// One row per file so that the build compiles the rows in parallel. sm_90a only.
#include "sm90_kernel.cuh"

namespace blockfp8::gemm::sm90 {

using Row = Config<true, 128, 32, 1, 1, Schedule::kCooperativeStreamK, Consumer::kCutlass, true, true>;
template cudaError_t launch_config<Row>(const Problem&, cudaStream_t);
template size_t workspace_config<Row>(const Problem&);
template KPlan plan_config<Row>(const Problem&);

}  // namespace blockfp8::gemm::sm90
