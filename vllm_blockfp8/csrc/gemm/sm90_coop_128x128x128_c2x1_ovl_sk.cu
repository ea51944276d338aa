// Instantiates tile-table row sm90_coop_128x128x128_c2x1_ovl_sk of sm90.cu (bf16 and fp16 out): the 128x128 2x1-cluster
// row with our consumer loop on CUTLASS's stream-K scheduler (stream-K where the last wave is partial);
// see sm90_kernel.cuh. One row per file so that the build compiles the rows in parallel. sm_90a only.
#include "sm90_kernel.cuh"

namespace blockfp8::gemm::sm90 {

using Row = Config<false, 128, 128, 2, 1, Schedule::kCooperativeStreamK, Consumer::kOverlap>;
template cudaError_t launch_config<Row>(const Problem&, cudaStream_t);
template size_t workspace_config<Row>(const Problem&);
template KPlan plan_config<Row>(const Problem&);

}  // namespace blockfp8::gemm::sm90
