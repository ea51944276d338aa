// Instantiates tile-table row sm90_swapab_128x64x128_ovl of sm90.cu (bf16 and fp16 out, split-K capable): the 128x64
// swap-AB row with our consumer loop (sm90_overlap_mainloop.cuh); see sm90_kernel.cuh.
// One row per file so that the build compiles the rows in parallel. sm_90a only.
#include "sm90_kernel.cuh"

namespace blockfp8::gemm::sm90 {

using Row = Config<true, 128, 64, 1, 1, Schedule::kCooperativeStreamK, Consumer::kOverlap, true>;
template cudaError_t launch_config<Row>(const Problem&, cudaStream_t);
template size_t workspace_config<Row>(const Problem&);
template KPlan plan_config<Row>(const Problem&);

}  // namespace blockfp8::gemm::sm90
