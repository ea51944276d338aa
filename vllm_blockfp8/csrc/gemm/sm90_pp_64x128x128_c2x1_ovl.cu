// Instantiates tile-table row sm90_pp_64x128x128_c2x1_ovl of sm90.cu (bf16 and fp16 out): unswapped
// 64x128 tiles, one per consumer warpgroup, on CUTLASS's ping-pong blockwise-FP8 kernel with our
// consumer loop (sm90_overlap_mainloop.cuh), 2x1 cluster; see sm90_kernel.cuh. Forced-only candidate.
// sm_90a only.
#include "sm90_kernel.cuh"

namespace blockfp8::gemm::sm90 {

using Row = Config<false, 64, 128, 2, 1, Schedule::kPingpong, Consumer::kOverlap>;
template cudaError_t launch_config<Row>(const Problem&, cudaStream_t);
template size_t workspace_config<Row>(const Problem&);
template KPlan plan_config<Row>(const Problem&);

}  // namespace blockfp8::gemm::sm90
