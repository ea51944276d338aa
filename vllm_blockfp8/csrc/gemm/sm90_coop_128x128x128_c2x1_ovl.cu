// Instantiates tile-table row sm90_coop_128x128x128_c2x1_ovl of sm90.cu (bf16 and fp16 out); see sm90_kernel.cuh
// and sm90_overlap_mainloop.cuh. One row per file so that the build compiles the rows in parallel. sm_90a only.
#include "sm90_kernel.cuh"

namespace blockfp8::gemm::sm90 {

using Row = Config<false, 128, 128, 2, 1, Schedule::kCooperative, Consumer::kOverlap>;
template cudaError_t launch_config<Row>(const Problem&, cudaStream_t);
template size_t workspace_config<Row>(const Problem&);
template KPlan plan_config<Row>(const Problem&);

}  // namespace blockfp8::gemm::sm90
